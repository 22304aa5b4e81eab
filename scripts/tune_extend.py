"""Sweep the two-stage kernel's tile configs on the GPU for the anchor workloads' largest
cases; prints one line per config (median us of do_bench, no graph). Used to choose
ops.config.extend_config; the chosen table is recorded in benchmarks/results.

    PYTHONPATH=src python3 scripts/tune_extend.py
"""

import sys

import torch
import triton

from swattn.bench import harness, workloads
from swattn.ops import extend
from swattn.ops.config import Config
from swattn.ops._validate import check_extend

SWEEP = {
    "A": [(128, 64, 4, 2), (128, 64, 4, 3), (128, 64, 8, 2), (64, 64, 4, 2), (64, 64, 4, 3),
          (128, 128, 8, 2), (128, 32, 4, 2), (64, 32, 4, 2), (64, 64, 2, 2)],
    "B": [(128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3), (64, 64, 4, 2),
          (64, 128, 4, 2), (128, 64, 4, 3), (64, 64, 4, 3), (128, 32, 4, 3)],
}


def main():
    for name, configs in SWEEP.items():
        case = workloads.extend_cases(name, cases=[(8192, 8192)])[0]
        inputs = harness.build_inputs(case)
        sinks = inputs.sinks
        args = (inputs.q, inputs.k, inputs.v, inputs.k_pool, inputs.v_pool, inputs.block_table_window,
                inputs.cu_seqlens, inputs.prefix_lens)
        a = check_extend(*args, window_left=case.window_left, window_right=None, causal=True,
                         sinks=sinks, softcap=0.0, scale=None, mask=None, mask_indptr=None,
                         keys="all", out=None)
        out = torch.empty(a.num_tokens, a.num_q_heads, a.head_dim_v, dtype=inputs.q.dtype, device="cuda")
        base = None
        for bm, bn, warps, stages in configs:
            def fn():
                extend._launch(a, *args, sinks, None, None, out, out, case.window_left, None, True,
                               0.0, "all", False, "tight", bm, bn, Config(bm, bn, warps, stages))
            try:
                fn()
                torch.cuda.synchronize()
                if base is None:
                    base = out.clone()
                ok = torch.equal(out, base) or (out.float() - base.float()).abs().max().item() < 2e-2
                us = triton.testing.do_bench(fn, warmup=25, rep=150, return_mode="median") * 1e3
                print(f"tune {name} P8192E8192 BM{bm} BN{bn} warps{warps} stages{stages}: "
                      f"{us:9.1f} us {'ok' if ok else 'MISMATCH'}", flush=True)
            except Exception as exc:  # a config that does not compile is a data point too
                print(f"tune {name} BM{bm} BN{bn} warps{warps} stages{stages}: failed {type(exc).__name__}: "
                      f"{str(exc)[:120]}", flush=True)
        del inputs, out
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
