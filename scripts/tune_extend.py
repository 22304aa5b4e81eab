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

# (BLOCK_M, BLOCK_N, warps, stages, pack_gqa, split_full)
SWEEP = {
    "A": [(128, 32, 4, 2, True, False), (128, 32, 4, 2, True, True), (64, 32, 4, 2, True, False),
          (128, 64, 4, 2, True, False), (64, 32, 4, 2, False, False), (256, 32, 8, 2, True, False)],
    "B": [(128, 64, 8, 3, True, True), (128, 64, 8, 3, True, False), (128, 128, 8, 3, True, True),
          (128, 64, 8, 4, True, True)],
}


def main():
    for name, configs in SWEEP.items():
        case = workloads.extend_cases(name, cases=[(8192, 8192)])[0]
        inputs = harness.build_inputs(case)
        sinks = inputs.sinks
        args = (inputs.q, inputs.k, inputs.v, inputs.k_pool, inputs.v_pool, inputs.block_table_window,
                inputs.cu_seqlens, inputs.prefix_lens)
        base = None
        for bm, bn, warps, stages, pack, split in configs:
            label = (f"tune {name} P8192E8192 BM{bm} BN{bn} warps{warps} stages{stages} pack{int(pack)} "
                     f"split{int(split)}")
            try:
                fn, out, _ = extend.prepare(*args, window_left=case.window_left, sinks=sinks,
                                            config=Config(bm, bn, warps, stages, pack, split))
                fn()
                torch.cuda.synchronize()
                if base is None:
                    base = out.clone()
                err = (out.float() - base.float()).abs().max().item()
                us = triton.testing.do_bench(fn, warmup=25, rep=150, return_mode="median") * 1e3
                print(f"{label}: {us:9.1f} us  max diff to first {err:.1e}", flush=True)
            except Exception as exc:  # a config that does not compile is a data point too
                print(f"{label}: failed {type(exc).__name__}: {str(exc)[:160]}", flush=True)
        del inputs, out
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
