"""S's Triton decode kernel (64 heads on one KV head, 576/512, 16 head rows, 32-key tiles,
4 warps, 2 stages, sparse keys, unreadable rows flagged) compiled for sm_90 by Triton's
ptxas (no GPU needed, ``swattn.verify.asm.compile_decode``), over a bf16 and an fp8 e4m3
cache, with the values loaded apart (copy) and taken from the key tiles (latent, V_IN_K):
SASS instruction counts by kind, registers, shared memory. From this folder:

    PYTHONPATH=../../../src python3 sass_counts.py
"""
import collections

from swattn.verify import asm

KINDS = ("LDS", "LDSM", "STS", "F2FP", "HMMA", "LDGSTS", "PRMT", "LDG", "I2F", "HADD2", "HMUL2",
         "F2F")


def build(kv, latent, maxnreg=None):
    """S's kernel over a ``kv`` ("bf16" or "fp8") cache, latent or not."""
    return asm.compile_decode(
        576, 64, sinks=False, kv_dtype=None if kv == "bf16" else "fp8e4nv", maxnreg=maxnreg,
        DV=512, BLOCK_D=512, BLOCK_D2=64, SPLIT_D=True, BLOCK_DV=512, BLOCK_H=16, HEAD_BLOCKS=4,
        BLOCK_N=32, HAS_SPARSE=True, FLAG_UNREAD=True, V_IN_K=latent)


def opcode(line):
    """An instruction's opcode without its modifiers (past a predicate)."""
    words = line.split()
    return (words[1] if line.startswith("@") else words[0]).split(".")[0]


if __name__ == "__main__":
    for latent in (False, True):
        for kv in ("bf16", "fp8"):
            comp = build(kv, latent)
            ops = collections.Counter(opcode(i) for i in comp.sass if i.split())
            print(kv, "-latent" if latent else "-copy", "instr", len(comp.sass), "regs",
                  comp.registers, "smem", comp.shared, {o: ops[o] for o in KINDS})
