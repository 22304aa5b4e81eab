"""S's kernel over a latent cache (sass_counts.py's build) compiled for sm_90 with the
launch's registers capped (``maxnreg``): registers and the bytes a thread spills to its
stack, bf16 and fp8 e4m3. From this folder:

    PYTHONPATH=../../../src python3 sass_caps.py
"""
from sass_counts import build

for cap in (None, 168, 128):
    for kv in ("bf16", "fp8"):
        comp = build(kv, True, cap)
        print("maxnreg", cap, kv, "registers", comp.registers, "stack bytes", comp.stack)
