"""A/B of Triton decode kernel variants on S and C-A over bf16 and fp8, timed as
scripts/tune.py times configs (CUDA-graph replays after an L2 flush, turn by turn), each
plan bound to one variant's kernel. The variants are copies of ops/decode.py under probe/:
decode_base.py (the file at 4658b77), decode_v.py and decode_kv.py (with
pair-loads-v.patch and pair-loads-kv.patch applied). From the repository root:

    PYTHONPATH=src python3 ab_variants.py S-fp8,S,C-A-fp8,C-A
"""
import importlib.util, sys
import torch
sys.path.insert(0, "scripts")
import tune
from swattn import reference
from swattn.bench import decode as decode_bench, harness, workloads
from swattn.bench.peers import fp8_cache
from swattn.ops import decode as ops_decode
from swattn.plan import decode_plan_for
from swattn.plan._common import ONE_SHOT

def load(name):
    spec = importlib.util.spec_from_file_location(f"swattn.ops._probe_{name}", f"probe/decode_{name}.py")
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod); return mod

VARIANTS = {n: load(n) for n in ("base", "v", "kv")}
ORIG = ops_decode._decode_kernel

def run(name, flush, variants):
    workload, fp8 = name.removesuffix("-fp8"), name.endswith("-fp8")
    case = workloads.decode_cases(workload)[0]
    inputs = decode_bench.build_inputs(case)
    k_cache, v_cache, sparse, scales = inputs.k_cache, inputs.v_cache, inputs.sparse, {}
    if fp8:
        k_cache, v_cache, k_scale, v_scale = fp8_cache(k_cache, v_cache)
        scales = {"k_scale": k_scale, "v_scale": v_scale}
        if sparse is not None:
            sparse = (reference.quantize(sparse[0], k_scale, k_cache.dtype),
                      reference.quantize(sparse[1], v_scale, k_cache.dtype), sparse[2])
    tensors = (inputs.q, k_cache, v_cache, inputs.block_table_window)

    def prepare(variant):
        out = torch.empty(*inputs.q.shape[:2], case.head_dim_v, dtype=inputs.q.dtype, device="cuda")
        ops_decode._decode_kernel = VARIANTS[variant.rstrip("2")]._decode_kernel
        ops_decode._launcher.cache_clear()
        ONE_SHOT.clear()
        try:
            plan = decode_plan_for(*tensors, inputs.seq_lens, window_left=case.window_left,
                                   sparse=sparse, hopper=False)
            fn = lambda: plan.run(*tensors, sinks=inputs.sinks, sparse=sparse, out=out, **scales)
            fn()  # binds the launch (at the first run) to the variant's kernel
            torch.cuda.synchronize()
        finally:
            ops_decode._decode_kernel = ORIG
            ops_decode._launcher.cache_clear()
            ONE_SHOT.clear()
        print(variant, [b[0].launch.kernel.fn.__module__ for b in plan._launches.values()], flush=True)
        return fn, out
    print(f"# {name}", flush=True)
    tune.sweep(name, variants, prepare, flush, reps=30, rounds=3)

if __name__ == "__main__":
    flush = harness.Flush()
    for name in sys.argv[1].split(","):
        run(name, flush, ["base", "v", "kv", "base2"])
        torch.cuda.empty_cache()
