"""Times S's decode (the bench's inputs, bf16 and fp8 e4m3 caches) on variants of the
latent path's tiling and split count beside the Triton kernel: each a CUDA-graph replay
after a 256 MB write that flushes L2, the median of 30. ``groups`` times S's sizes at
16 to 128 query heads. ``ncu``: three launches of S over bf16, for Nsight Compute.

    PYTHONPATH=src python3 time_latent.py [time|groups|ncu]
"""

import dataclasses
import sys

import torch

from swattn.bench import decode_inputs, workloads
from swattn.bench.decode import ours, ours_fp8
from swattn.ops import config as C

case = workloads.decode_cases("S")[0]
inputs = decode_inputs.build_inputs(case, "cuda")
flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")


def timeit(run, reps=30):
    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    times = []
    for _ in range(reps):
        flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1000)
    return sorted(times)[len(times) // 2]


def variant(name, prepare):
    try:
        p = prepare()
        print(f"{name:40s} {timeit(p.fn):8.1f} us  ({p.note})", flush=True)
    except Exception as exc:  # a variant that cannot run is reported, the rest go on
        print(f"{name:40s} failed: {type(exc).__name__}: {str(exc)[:300]}", flush=True)


def tiling(**fields):
    """The plan's LatentDecodeConfig with ``fields`` as its defaults (set, then restored)."""
    base = C.LatentDecodeConfig
    changed = dataclasses.make_dataclass(
        "Tiling", [(k, type(v), dataclasses.field(default=v)) for k, v in fields.items()],
        bases=(base,), frozen=True)
    return base, changed


def with_tiling(fields, runs):
    base, changed = tiling(**fields)
    C.LatentDecodeConfig = changed
    try:
        for name, prepare in runs:
            variant(name, prepare)
    finally:
        C.LatentDecodeConfig = base


mode = sys.argv[1] if len(sys.argv) > 1 else "time"
if mode == "time":
    for s in (None, 1, 2, 4, 8):
        variant(f"bf16 latent splits {s}", lambda s=s: ours(inputs, num_splits=s))
    variant("bf16 triton", lambda: ours(inputs, hopper=False))
    variant("fp8 latent", lambda: ours_fp8(inputs))
    variant("fp8 triton", lambda: ours_fp8(inputs, hopper=False))
    for pps, msk in ((2, 128), (1, 4096), (4, 64)):
        with_tiling({"programs_per_sm": pps, "min_split_keys": msk},
                    [(f"bf16 latent pps{pps} msk{msk}", lambda: ours(inputs)),
                     (f"fp8 latent pps{pps} msk{msk}", lambda: ours_fp8(inputs))])
    with_tiling({"block_n": 16}, [("bf16 latent BN16", lambda: ours(inputs)),
                                  ("fp8 latent BN16", lambda: ours_fp8(inputs))])
    window = dataclasses.replace(inputs, sparse=None)
    variant("bf16 latent window only", lambda: ours(window))
    variant("bf16 triton window only", lambda: ours(window, hopper=False))
elif mode == "groups":
    for hq in (16, 32, 64, 128):
        heads = decode_inputs.build_inputs(dataclasses.replace(case, num_q_heads=hq), "cuda")
        for hopper in (None, False):
            kind = "triton" if hopper is False else "default"
            variant(f"S heads {hq} bf16 {kind}", lambda: ours(heads, hopper=hopper))
            variant(f"S heads {hq} fp8 {kind}", lambda: ours_fp8(heads, hopper=hopper))
        if hq < C.LatentDecodeConfig.min_group:
            with_tiling({"min_group": 1}, [(f"S heads {hq} bf16 latent forced", lambda: ours(heads)),
                                           (f"S heads {hq} fp8 latent forced",
                                            lambda: ours_fp8(heads))])
else:
    prepared = ours(inputs)
    for _ in range(3):
        prepared.fn()
    torch.cuda.synchronize()
