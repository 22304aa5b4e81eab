"""How the L2 flush before each repetition moves the decode workloads' times (GPU only):
the bench's variants of each workload over bf16 (twice: the second its control) and over an
fp8 e4m3 copy of the cache, timed as the bench times them (harness.interleave), once after each
flush: the bench's clean one (a 256 MB read), the dirty one (a 256 MB write, as
triton.testing.do_bench flushes), a write then a read, and the dirty one again.

    PYTHONPATH=src python3 scripts/flush_compare.py --workload C-B,C-F,C-A
"""

import argparse
import sys

import torch

from swattn.bench import harness, workloads
from swattn.bench.decode import ours, ours_fp8
from swattn.bench.decode_inputs import build_inputs


class WriteThenRead:
    """A dirty flush, then a clean one: its write-back happens before the timed kernel."""

    def __init__(self):
        self.dirty, self.clean = harness.Flush(kind="dirty"), harness.Flush(kind="clean")

    def __call__(self):
        self.dirty()
        self.clean()


def replays(name):
    """``{label: (graph replay, the variant)}``: the bench's own variants of the workload
    (bench.decode: ``plan.run`` over bf16, its control, and over an fp8 e4m3 copy of the
    cache), each kept beside its replay so the tensors the graph reads stay alive."""
    inputs = build_inputs(workloads.decode_cases(name)[0])
    out = {}
    for label, variant in (("bf16", ours(inputs)), ("bf16 control", ours(inputs, control=True)),
                           ("fp8", ours_fp8(inputs))):
        variant.fn()
        out[label] = (harness.capture(variant.fn)[0], variant)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="C-B,C-F,C-A",
                        help="decode workloads (default C-B,C-F,C-A)")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    flushes = (("clean", harness.Flush(kind="clean")), ("dirty", harness.Flush(kind="dirty")),
               ("write then read", WriteThenRead()), ("dirty again", harness.Flush(kind="dirty")))
    for name in args.workload.split(","):
        runs = replays(name)
        timed = {label: replay for label, (replay, _variant) in runs.items()}
        for label, flush in flushes:
            times, errors = harness.interleave(timed, args.reps, args.rounds, flush, label=label)
            if errors:
                print(f"{name} {label}: failed: {errors}", flush=True)
                continue
            med = {k: harness.summarize(v)["median_us"] for k, v in times.items()}
            bf16, control, fp8 = med["bf16"], med["bf16 control"], med["fp8"]
            print(f"{name:4s} flush {label:16s} bf16 {bf16:7.1f}  control {control:7.1f}  "
                  f"fp8 {fp8:7.1f}  bf16/fp8 {bf16 / fp8:.3f}  control/fp8 {control / fp8:.3f}",
                  flush=True)
        del runs, timed
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
