"""S's kernel over a latent cache (sass_counts.py's build) compiled for sm_90 with the
launch's registers capped (``maxnreg``): registers and the bytes a thread spills to its
stack, bf16 and fp8 e4m3. From this folder:

    PYTHONPATH=../../../src python3 sass_caps.py
"""
import sass_counts as S
from swattn.verify import asm

compile_once = asm._compile
S.LATENT = True
for cap in (None, 168, 128):
    for kv in ("bf16", "fp8"):
        def capped(source, fn, constexprs, arg_type, pointers, options, cap=cap, kv=kv):
            if cap:
                options = dict(options, maxnreg=cap)
            compiled = compile_once(source, fn, constexprs, arg_type, pointers, options)
            print("maxnreg", cap, kv, "registers", compiled[0].registers, "stack bytes",
                  compiled[0].stack, flush=True)
            return compiled
        asm._compile = capped
        S.build(kv, tag=f"-cap{cap}")
