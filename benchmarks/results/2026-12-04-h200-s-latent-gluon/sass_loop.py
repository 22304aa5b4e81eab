"""The latent decode kernel's key loop in SASS (sm_90, Triton's ptxas; no GPU needed): its
instructions a warp a tile by opcode, registers and spills, bf16 and fp8 e4m3 caches with
a sparse pool.

    PYTHONPATH=src python3 sass_loop.py
"""

import collections
import re

import torch

from swattn.verify import asm


def loop_body(sass):
    """The longest loop (a backward branch's body): the key loop."""
    best = []
    for end, ins in enumerate(sass):
        m = re.search(r"BRA (0x[0-9a-f]+)", ins)
        if m and int(m.group(1), 16) // 16 < end:
            body = sass[int(m.group(1), 16) // 16:end + 1]
            best = body if len(body) > len(best) else best
    return best


for kv in (None, torch.float8_e4m3fn):
    compiled, _ = asm.compile_latent_decode(kv_dtype=kv)
    body = loop_body(compiled.sass)
    ops = collections.Counter(re.sub(r"^@!?U?P\w+ ", "", i).split()[0].split(".")[0] for i in body)
    print(f"{'bf16' if kv is None else 'fp8 e4m3'}: {len(compiled.sass)} instructions, "
          f"{compiled.registers} registers, {compiled.stack} B stack; key loop {len(body)} a "
          f"warp a tile: " + ", ".join(f"{k} {v}" for k, v in ops.most_common(16)))
