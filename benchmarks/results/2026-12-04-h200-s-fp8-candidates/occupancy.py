"""S over fp8 and bf16 with the Triton decode launch's registers capped (``maxnreg``: more
programs an SM) and a split count, timed as scripts/tune.py times configs, with the
registers and spilled bytes the compiler reports. From the repository root:

    PYTHONPATH=src python3 occupancy.py S-fp8,S
"""
import sys
import torch
sys.path.insert(0, "scripts")
import tune
from swattn import reference
from swattn.bench import decode as decode_bench, harness, workloads
from swattn.bench.peers import fp8_cache
from swattn.ops import decode as ops_decode
from swattn.plan import decode_plan_for
from swattn.plan._common import ONE_SHOT

BaseLaunch = ops_decode.Launch
CAP = {"maxnreg": None}

INFO = []


class KProxy:
    def __init__(self, k):
        self.k, self.arg_names, self.__name__ = k, k.arg_names, k.__name__

    def __getitem__(self, grid):
        f = self.k[grid]

        def call(*a, **kw):
            c = f(*a, **kw)
            INFO.append((getattr(c, "n_regs", None), getattr(c, "n_spills", None)))
            return c
        return call


class CappedLaunch(BaseLaunch):
    def __init__(self, kernel, fixed, options, *a, **k):
        if CAP["maxnreg"]:
            options = dict(options, maxnreg=CAP["maxnreg"])
        super().__init__(KProxy(kernel), fixed, options, *a, **k)

def run(name, flush, variants):
    workload, fp8 = name.removesuffix("-fp8"), name.endswith("-fp8")
    case = workloads.decode_cases(workload)[0]
    inputs = decode_bench.build_inputs(case)
    k_cache, v_cache, sparse, scales = inputs.k_cache, inputs.v_cache, inputs.sparse, {}
    if fp8:
        k_cache, v_cache, k_scale, v_scale = fp8_cache(k_cache, v_cache)
        scales = {"k_scale": k_scale, "v_scale": v_scale}
        sparse = (reference.quantize(sparse[0], k_scale, k_cache.dtype),
                  reference.quantize(sparse[1], v_scale, k_cache.dtype), sparse[2])
    tensors = (inputs.q, k_cache, v_cache, inputs.block_table_window)

    def prepare(variant):
        cap, splits = variant[:2]
        out = torch.empty(*inputs.q.shape[:2], case.head_dim_v, dtype=inputs.q.dtype, device="cuda")
        CAP["maxnreg"] = cap
        ops_decode.Launch = CappedLaunch
        ops_decode._launcher.cache_clear(); ONE_SHOT.clear()
        try:
            plan = decode_plan_for(*tensors, inputs.seq_lens, window_left=case.window_left,
                                   sparse=sparse, hopper=False, num_splits=splits)
            fn = lambda: plan.run(*tensors, sinks=inputs.sinks, sparse=sparse, out=out, **scales)
            fn()
            torch.cuda.synchronize()
        finally:
            ops_decode.Launch = BaseLaunch
            CAP["maxnreg"] = None
            ops_decode._launcher.cache_clear(); ONE_SHOT.clear()
        print(variant, "splits", plan.num_splits, "regs, spills", INFO[-1:], flush=True)
        return fn, out
    print(f"# {name}", flush=True)
    tune.sweep(name, variants, prepare, flush, reps=30, rounds=3)

if __name__ == "__main__":
    flush = harness.Flush()
    V = [(None, None), (168, None), (168, 2), (128, 2), (128, 3), (168, 3), (None, 2), (None, None, "control")]
    for name in sys.argv[1].split(","):
        run(name, flush, V)
        torch.cuda.empty_cache()
