"""Where the Hopper decode path's time goes on a decode workload (GPU only): the kernel
whole ("full"), its ring of copies alone ("ring": the warpgroup replaced by one that only
waits for each stage's copies and releases it, so the time is the producer's and the
memory's), and the cache read from L2 ("l2": every block-table entry mapped onto 32 pages,
so the time is the warpgroup's). Each config is a dict of HopperDecodeConfig fields over the
plan's own; the configs are timed as the bench times its variants (harness.interleave:
graph replays after an L2 flush, turn by turn), in one process a mode. The outputs are
compared to the first config's (in "ring" and "l2" the outputs are not attention: their
difference is not a check).

    PYTHONPATH=src python3 scripts/decode_probe.py --workload C-B --fp8 --modes full,ring,l2 \\
        --configs '{}' '{"items": 2}'
"""

import argparse
import json
import subprocess
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

import swattn
from swattn.bench import harness, workloads
from swattn.bench.decode_inputs import build_inputs
from swattn.bench.peers import fp8_cache
from swattn.ops import decode_hopper
from swattn.ops._gluon import uniform
from swattn.ops.decode_hopper import _has_work

MODES = ("full", "ring", "l2")


@gluon.jit
def _ring_only(q_smem, ring, store, split, rule, flags):
    """The warpgroup of the "ring" mode: each stage waited for and released, nothing
    computed or stored."""
    _ring_only_item(ring, store, None, split, rule, flags, gl.to_tensor(0))


@gluon.jit
def _ring_only_item(ring, store, work, split, rule, flags, i):
    """The fp8 warpgroup's work item in the "ring" mode (and the 16-bit one's whole work):
    each stage waited for and released, nothing computed or stored; the ring's count
    running on across a program's items."""
    for j in range(uniform(split.t_start), uniform(split.t_stop)):
        if _has_work(j * flags.BN, uniform(split.lo), uniform(split.seq_len), flags.BN,
                     flags.SKIP):
            st = i % flags.STAGES
            phase = (i // flags.STAGES) & 1
            mbarrier.wait(ring.bar_k.index(st), phase)
            mbarrier.wait(ring.bar_v.index(st), phase)
            gl.thread_barrier()
            mbarrier.arrive(ring.empty.index(st))
            i += 1
    return i


def probe(workload, fp8, mode, configs, rounds=3, reps=30):
    """Print one line a config: its median and 20th percentile (us) in ``mode``."""
    if mode == "ring":
        # Before anything compiles: the kernel resolves its warpgroup by name.
        decode_hopper._consume = _ring_only
        decode_hopper._consume_item = _ring_only_item
    case = workloads.decode_cases(workload)[0]
    inputs = build_inputs(case)
    k_cache, v_cache, scales = inputs.k_cache, inputs.v_cache, {}
    if fp8:
        k_cache, v_cache, k_scale, v_scale = fp8_cache(k_cache, v_cache, latent=case.latent)
        scales = dict(k_scale=k_scale, v_scale=v_scale)
    table = inputs.block_table_window
    if mode == "l2":
        table = torch.where(table >= 0, table % 32 + 1, table)
    replays, runs = {}, {}
    for n, config in enumerate(configs):
        plan = swattn.plan_decode(
            case.seq_lens, num_q_heads=case.num_q_heads, num_kv_heads=case.num_kv_heads,
            head_dim=case.head_dim, head_dim_v=case.head_dim_v, page_size=case.page_size,
            window_left=case.window_left, kv_dtype=k_cache.dtype, dtype=inputs.q.dtype,
            hopper=True, config=config or None)
        out = torch.empty(*inputs.q.shape[:2], case.head_dim_v, dtype=inputs.q.dtype,
                          device="cuda")

        def run(plan=plan, out=out):
            plan.run(inputs.q, k_cache, v_cache, table, sinks=inputs.sinks, out=out, **scales)

        run()
        torch.cuda.synchronize()
        label = f"{n} {json.dumps(config)}"  # (a config given twice is its own control)
        replays[label] = harness.capture(run)[0]
        runs[label] = (out, plan)
    # Timed as the bench times its variants: turn by turn, the order rotated.
    times, errors = harness.interleave(replays, reps, rounds, harness.Flush(), label=mode)
    first = next(iter(runs.values()))[0].float()
    for label, (out, plan) in runs.items():
        if label in errors:
            print(f"{workload} {mode:4s} {label:28s} failed: {errors[label]}", flush=True)
            continue
        stats = harness.summarize(times[label])
        diff = (out.float() - first).abs().max().item()
        print(f"{workload} {'fp8' if fp8 else 'bf16'} {mode:4s} {label:28s} "
              f"median {stats['median_us']:7.1f} us  p20 {stats['p20_us']:7.1f}  "
              f"diff to first {diff:.1e}  [{plan.config}]", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="C-B", help="a decode workload (C-A, C-B, C-F)")
    parser.add_argument("--fp8", action="store_true", help="an fp8 e4m3 copy of the cache")
    parser.add_argument("--modes", default="full,ring,l2", help=f"of {', '.join(MODES)}")
    parser.add_argument("--configs", nargs="*", default=["{}"],
                        help="JSON dicts of HopperDecodeConfig fields")
    parser.add_argument("--mode", help=argparse.SUPPRESS)  # one mode, in its own process
    args = parser.parse_args(argv)
    configs = [json.loads(c) for c in args.configs]
    if args.mode:
        probe(args.workload, args.fp8, args.mode, configs)
        return 0
    for mode in args.modes.split(","):
        if mode not in MODES:
            parser.error(f"--modes: {mode!r} is not one of {MODES}")
        cmd = [sys.executable, __file__, "--workload", args.workload, "--mode", mode,
               "--configs", *args.configs] + (["--fp8"] if args.fp8 else [])
        if subprocess.run(cmd).returncode:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
