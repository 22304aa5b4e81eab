"""S's Triton decode kernel (64 heads on one KV head, 576/512, 16 head rows, 32-key tiles,
4 warps, 2 stages, sparse keys, unreadable rows flagged) compiled for sm_90 by Triton's
ptxas (no GPU needed), over a bf16 and an fp8 e4m3 cache, with the values loaded apart
(copy) and taken from the key tiles (latent, V_IN_K): SASS instruction counts by kind,
registers, shared memory; the TTGIR is written beside. From this folder:

    PYTHONPATH=../../../src python3 sass_counts.py
"""
import collections, re, sys
from triton.compiler import ASTSource
from swattn.verify import asm
from swattn.ops import decode as D

LATENT = False
def build(kv, fn=D._decode_kernel, tag=""):
    c = dict(D=576, DV=512, BLOCK_D=512, BLOCK_D2=64, SPLIT_D=True, BLOCK_DV=512, GROUP=64,
             BLOCK_H=16, HEAD_BLOCKS=4, BLOCK_N=32, USE_WINDOW=True, HAS_SINKS=False,
             USE_SOFTCAP=False, HAS_SPARSE=True, WRITE_PARTIAL=False, RETURN_LSE=False,
             TIGHT=True, SKIP=False, CARRY=False, FLAG_UNREAD=True, V_IN_K=LATENT, HEADS_FIRST=False, PDL=False,
             K_SCALE_STRIDE=1, V_SCALE_STRIDE=1)
    if kv == "bf16":
        c.update(k_scale=None, v_scale=None, K_SCALE_STRIDE=0, V_SCALE_STRIDE=0)
    ptr = {n: "*bf16" for n in ("Q", "Out")}
    ptr.update({n: "*" + ("bf16" if kv == "bf16" else "fp8e4nv") for n in ("K_cache", "V_cache", "K_pool", "V_pool")})
    ptr.update({"block_table": "*i32", "seq_lens": "*i32", "Idx": "*i32", "sinks": "*fp32", "Lse": "*fp32",
                "Part_o": "*fp32", "Part_lse": "*fp32", "k_scale": "*fp32", "v_scale": "*fp32"})
    comp, k = asm._compile(ASTSource, fn, c, lambda n: ptr.get(n, "fp32" if n in asm._FLOATS else "i32"),
                           ptr, {"num_warps": 4, "num_stages": 2})
    ops = collections.Counter(i.split()[0].split(".")[0] for i in comp.sass if i.split() and not i.startswith("@")) + collections.Counter(i.split()[1].split(".")[0] for i in comp.sass if i.startswith("@"))
    print(kv, tag, "instr", len(comp.sass), "regs", comp.registers, "smem", comp.shared,
          {o: ops[o] for o in ("LDS", "LDSM", "STS", "F2FP", "HMMA", "LDGSTS", "PRMT", "LDG", "I2F", "HADD2", "HMUL2", "F2F")})
    open(f"s_{kv}{tag}.ttgir", "w").write(k.asm["ttgir"])
    return comp

if __name__ == "__main__":
    for LATENT in (False, True):
        for kv in ("bf16", "fp8"):
            build(kv, tag="-latent" if LATENT else "-copy")

def lds_kinds(comp):
    c = collections.Counter()
    for i in comp.sass:
        w = i.split()
        op = w[1] if i.startswith("@") else w[0]
        if op.startswith(("LDS", "STS", "LDSM", "PRMT", "F2FP")):
            c[op] += 1
    return c
