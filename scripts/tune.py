"""Sweep the kernels' tile configs on the GPU for the anchor workloads: the two-stage
extend kernel on A and B at prefix 8192 (A also a 1024-token chunk over a 7168-token prefix,
where the fixed cost of a launch shows; B at prefix 0, the new tokens alone; B at
prefix 8192 also over pages of 64, whole key tiles the cache loads by TMA), the decode
kernel on C-A, C-B and S (tile width, warps, stages, split count, head rows, unreadable
rows flagged, grid order), S and C-A also over an fp8 e4m3 copy of the cache (S-fp8,
C-A-fp8); S's latent cache also with its values as their own copy (``{"copy": True}``: the
kernel then loads them apart from the keys). One line per config: median us over CUDA-graph
replays, each after an L2 flush, a workload's configs timed turn by turn
(harness.interleave), and the largest difference to the first config's output. Used to
choose ops.config; the chosen table is recorded in benchmarks/results.

    PYTHONPATH=src python3 scripts/tune.py [A,B,B-prefix,C-A,C-B,S,C-A-fp8,S-fp8]
"""

import sys
from dataclasses import replace

import torch

from swattn.bench import decode as decode_bench
from swattn.bench import extend_inputs, harness, workloads
from swattn.bench.peers import fp8_cache, fp8_pool
from swattn.ops.config import Config, decode_config
from swattn.plan import decode_plan_for, extend_plan_for

# Extend: (BLOCK_M, BLOCK_N, warps, stages, pack_gqa, split_full, tma), over (prefix,
# extend, page size).
EXTEND_SWEEP = {
    "A": [(64, 32, 4, 2, True, False), (64, 32, 4, 2, True, True), (64, 32, 4, 3, True, True),
          (64, 64, 4, 2, True, True), (128, 64, 8, 2, True, True)],
    "B": [(128, 64, 8, 3, True, True, True), (128, 64, 8, 3, True, True, False),
          (128, 64, 8, 2, True, True, True), (128, 64, 8, 4, True, True, True),
          (128, 128, 8, 2, True, True, True), (128, 128, 8, 3, True, True, True),
          (64, 64, 4, 3, True, True, True), (64, 64, 4, 2, True, True, True),
          (64, 64, 4, 4, True, True, True)],
    # Stage 1 alone (keys="prefix"): the paged loop, by TMA where pages hold whole tiles.
    "B-prefix": [(128, 64, 8, 3, True, True, True), (128, 64, 8, 3, True, True, False),
                 (64, 64, 4, 3, True, True, True), (64, 64, 4, 3, True, True, False),
                 (64, 64, 4, 2, True, True, True), (64, 64, 4, 4, True, True, True)],
}
EXTEND_FIELDS = ("block_m", "block_n", "num_warps", "num_stages", "pack_gqa", "split_full", "tma")
EXTEND_CASES = {"A": [(8192, 8192, 16), (7168, 1024, 16)],
                "B": [(8192, 8192, 16), (8192, 8192, 64), (0, 8192, 16)],
                "B-prefix": [(8192, 8192, 16), (8192, 8192, 64)]}
# Decode: (BLOCK_N, warps, stages, num_splits[, fields]); num_splits None is the library's
# choice, ``fields`` other DecodeConfig fields (block_h, flag_unread, heads_first), the
# config function's where not given, and ``copy`` (the values as their own copy).
_H16, _H32, _H64 = {"block_h": 16}, {"block_h": 32}, {"block_h": 64}
_S = [(32, 4, 2, None), (32, 4, 2, None, {"copy": True}), (16, 4, 2, 1), (16, 8, 2, 1),
      (32, 8, 2, 1, _H32), (16, 8, 2, 1, _H32),
      (32, 4, 3, 1), (32, 4, 1, 1), (32, 4, 2, 2), (64, 8, 2, 1, _H16),
      (32, 4, 2, 1, {"flag_unread": False}), (32, 4, 2, 1, {"flag_unread": True}),
      (32, 4, 2, 1, {"heads_first": True}), (32, 4, 2, 1, {"heads_first": False})]
_C_A = [(128, 4, 2, None), (64, 4, 2, 1), (64, 4, 2, 2), (128, 8, 2, 1), (128, 2, 2, 1),
        (128, 4, 1, 1), (128, 4, 2, 1, {"flag_unread": False}),
        (128, 4, 2, 1, {"flag_unread": True})]
DECODE_SWEEP = {
    "S": _S, "S-fp8": _S, "C-A": _C_A, "C-A-fp8": _C_A,
    "C-B": [(64, 4, 2, None), (32, 4, 3, 1), (64, 4, 2, 2), (32, 4, 4, 1), (64, 2, 3, 1),
            (64, 4, 3, 1), (128, 4, 2, 1), (16, 4, 6, 1)],
}


def sweep(label, configs, prepare, flush, reps=30, rounds=2):
    """Time ``prepare(config) -> (launch, out)`` for each config, replayed from CUDA graphs
    turn by turn (harness.interleave: no config always runs first or on hotter clocks);
    print one line each. The launches stay referenced until the timing ends (a graph
    replays into their plans' buffers and outputs)."""
    base, replays, diffs, launches = None, {}, {}, {}
    for config in configs:
        name = f"tune {label} {config}"
        try:
            fn, out = launches[name] = prepare(config)
            fn()
            torch.cuda.synchronize()
            if base is None:
                base = out.clone()
            diffs[name] = (out.float() - base.float()).abs().max().item()
            replays[name], _, _ = harness.capture(fn)
        except Exception as exc:  # a config that does not compile is a data point too
            print(f"{name}: failed {type(exc).__name__}: {str(exc)[:160]}", flush=True)
    times, errors = harness.interleave(replays, reps, rounds, flush, label=label)
    for name in replays:
        if name in errors:
            print(f"{name}: failed {errors[name]}", flush=True)
            continue
        us = float(torch.tensor(sum(times[name], [])).median())
        print(f"{name}: {us:9.1f} us  max diff to first {diffs[name]:.1e}", flush=True)


def tune_extend(name, configs, prefix, extend_len, page_size, flush):
    workload, _, part = name.partition("-")
    case = workloads.extend_cases(workload, cases=[(prefix, extend_len)], page_size=page_size)[0]
    inputs = extend_inputs.build_inputs(case)
    args = (inputs.q, inputs.k, inputs.v, inputs.k_pool, inputs.v_pool, inputs.block_table_window,
            inputs.cu_seqlens, inputs.prefix_lens)

    def prepare(config):
        plan = extend_plan_for(*args, window_left=case.window_left, keys=part or "all",
                               return_lse=bool(part),
                               config=Config(**dict(zip(EXTEND_FIELDS, config))), hopper=False)
        out = torch.empty(*inputs.q.shape[:2], case.head_dim_v, dtype=inputs.q.dtype, device="cuda")
        lse = torch.empty(*inputs.q.shape[:2], device="cuda") if part else None
        return (lambda: plan.run(*args[:6], sinks=inputs.sinks, out=out, lse=lse)), out

    print(f"# {name} P{prefix} E{extend_len} page {page_size}: (BLOCK_M, BLOCK_N, warps, stages, "
          "pack_gqa, split_full, tma)")
    sweep(f"{name} P{prefix}E{extend_len}p{page_size}", configs, prepare, flush)


def tune_decode(name, configs, flush):
    workload, fp8 = name.removesuffix("-fp8"), name.endswith("-fp8")
    case = workloads.decode_cases(workload)[0]
    inputs = decode_bench.build_inputs(case)
    k_cache, v_cache, sparse, scales = inputs.k_cache, inputs.v_cache, inputs.sparse, {}
    if fp8:  # an fp8 e4m3 copy, one scale a KV head (as the bench's fp8 variants)
        k_cache, v_cache, k_scale, v_scale = fp8_cache(k_cache, v_cache, latent=case.latent)
        scales = {"k_scale": k_scale, "v_scale": v_scale}
        if sparse is not None:
            sparse = fp8_pool(sparse, k_scale, v_scale, k_cache.dtype, case.latent)
    # The values as their own copy: the same numbers, loaded apart from the keys.
    copied = (v_cache.clone(),
              None if sparse is None else (sparse[0], sparse[1].clone(), sparse[2]))
    chosen = decode_config(case.head_dim, case.head_dim_v, case.num_q_heads // case.num_kv_heads,
                           torch.bfloat16, inputs.q.device, k_cache.dtype)

    def prepare(config):
        block_n, warps, stages, splits = config[:4]
        fields = dict(config[4]) if len(config) > 4 else {}
        values, pool = copied if fields.pop("copy", False) else (v_cache, sparse)
        tensors = (inputs.q, k_cache, values, inputs.block_table_window)
        plan = decode_plan_for(*tensors, inputs.seq_lens, window_left=case.window_left,
                               sparse=pool, num_splits=splits, hopper=False,
                               config=replace(chosen, block_n=block_n, num_warps=warps,
                                              num_stages=stages, hopper=False, **fields))
        out = torch.empty(*inputs.q.shape[:2], case.head_dim_v, dtype=inputs.q.dtype, device="cuda")
        return (lambda: plan.run(*tensors, sinks=inputs.sinks, sparse=pool, out=out,
                                 **scales)), out

    print(f"# {name} batch {len(case.seq_lens)} context {case.seq_lens[0]}: "
          "(BLOCK_N, warps, stages, num_splits[, fields])")
    sweep(name, configs, prepare, flush)


def main(names):
    flush = harness.Flush()
    for name, configs in EXTEND_SWEEP.items():
        for prefix, extend_len, page_size in EXTEND_CASES[name] if name in names else ():
            tune_extend(name, configs, prefix, extend_len, page_size, flush)
            torch.cuda.empty_cache()
    for name, configs in DECODE_SWEEP.items():
        if name in names:
            tune_decode(name, configs, flush)
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1].split(",") if len(sys.argv) > 1 else ["A", "B", "C-A", "C-B", "S"]))
