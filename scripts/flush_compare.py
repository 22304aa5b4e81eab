"""How the L2 flush before each repetition moves the decode workloads' times (GPU only):
each workload's plan over bf16 (twice: the second its control) and over an fp8 e4m3 copy of
the cache, timed as the bench times its variants (harness.interleave), once after each
flush: the bench's clean one (a 256 MB read), the dirty one (a 256 MB write, as
triton.testing.do_bench flushes), a write then a read, and the dirty one again.

    PYTHONPATH=src python3 scripts/flush_compare.py --workload C-B,C-F,C-A
"""

import argparse
import sys

import torch

import swattn
from swattn.bench import harness, workloads
from swattn.bench.decode_inputs import build_inputs
from swattn.bench.peers import fp8_cache


class WriteThenRead:
    """A dirty flush, then a clean one: its write-back happens before the timed kernel."""

    def __init__(self):
        self.dirty, self.clean = harness.Flush(kind="dirty"), harness.Flush(kind="clean")

    def __call__(self):
        self.dirty()
        self.clean()


def replays(name):
    """``{label: graph replay}``: the workload's plan over bf16, its control, and fp8."""
    case = workloads.decode_cases(name)[0]
    if case.sparse_keys:
        raise ValueError(f"{name}: sparse workloads are not taken here")
    inputs = build_inputs(case)
    k8, v8, k_scale, v_scale = fp8_cache(inputs.k_cache, inputs.v_cache, latent=case.latent)
    caches = {"bf16": (inputs.k_cache, inputs.v_cache, {}),
              "bf16 control": (inputs.k_cache, inputs.v_cache, {}),
              "fp8": (k8, v8, dict(k_scale=k_scale, v_scale=v_scale))}
    out = {}
    for label, (k_cache, v_cache, scales) in caches.items():
        plan = swattn.plan_decode(
            case.seq_lens, num_q_heads=case.num_q_heads, num_kv_heads=case.num_kv_heads,
            head_dim=case.head_dim, head_dim_v=case.head_dim_v, page_size=case.page_size,
            window_left=case.window_left, kv_dtype=k_cache.dtype, dtype=inputs.q.dtype)
        o = torch.empty(*inputs.q.shape[:2], case.head_dim_v, dtype=inputs.q.dtype,
                        device="cuda")

        def run(plan=plan, o=o, k_cache=k_cache, v_cache=v_cache, scales=scales):
            plan.run(inputs.q, k_cache, v_cache, inputs.block_table_window,
                     sinks=inputs.sinks, out=o, **scales)

        run()
        out[label] = harness.capture(run)[0]
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="C-B,C-F,C-A",
                        help="decode workloads without sparse keys (default C-B,C-F,C-A)")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    flushes = (("clean", harness.Flush(kind="clean")), ("dirty", harness.Flush(kind="dirty")),
               ("write then read", WriteThenRead()), ("dirty again", harness.Flush(kind="dirty")))
    for name in args.workload.split(","):
        runs = replays(name)
        for label, flush in flushes:
            times, errors = harness.interleave(runs, args.reps, args.rounds, flush, label=label)
            if errors:
                print(f"{name} {label}: failed: {errors}", flush=True)
                continue
            med = {k: harness.summarize(v)["median_us"] for k, v in times.items()}
            bf16, control, fp8 = med["bf16"], med["bf16 control"], med["fp8"]
            print(f"{name:4s} flush {label:16s} bf16 {bf16:7.1f}  control {control:7.1f}  "
                  f"fp8 {fp8:7.1f}  bf16/fp8 {bf16 / fp8:.3f}  control/fp8 {control / fp8:.3f}",
                  flush=True)
        del runs
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
