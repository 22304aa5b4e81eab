"""Probe (not part of the library): the Gluon decode path (ops.decode_hopper) against the
Triton kernel's default and FlashInfer on WORKLOAD (default C-B), timed as decode_probe.py
times them (interleaved, L2 flushed, same-variant control), outputs compared with the
Triton kernel's. Variants (VARIANTS, a list of (stages, splits); splits None is the
library's count) set ops.decode_hopper.STAGES for the workload's head dim before capture.
Then one profiled replay of each: the kernels' grids, registers, shared memory, durations.

    export PYTHONPATH=src; source scripts/peers_path.sh
    python3 scripts/probes/decode_hopper_probe.py
"""

import ast
import os

import decode_probe  # scripts/probes, on sys.path as the script's folder
import decode_timeline
import torch

from swattn.bench import harness
from swattn.ops import decode, decode_hopper

VARIANTS = [(2, None), (3, None), (4, None), (6, None), (3, 2)]


def main():
    rounds, reps = int(os.environ.get("ROUNDS", "2")), int(os.environ.get("REPS", "15"))
    variants = ast.literal_eval(os.environ["VARIANTS"]) if os.environ.get("VARIANTS") else VARIANTS
    case, inputs, config = decode_probe.setup()
    d = case.head_dim
    replays, outs, keep = {}, {}, []
    launch, out = decode_probe.prepare(decode, inputs, case, config, None)
    replays["triton"], outs["triton"] = harness.capture(launch)[0], out
    replays["triton (control)"] = harness.capture(launch)[0]
    keep.append(launch)
    default_stages = decode_hopper.STAGES[d]
    for stages, splits in variants:
        decode_hopper.STAGES[d] = stages
        launch, out, _ = decode.prepare(
            inputs.q, inputs.k_cache, inputs.v_cache, inputs.block_table_window, inputs.seq_lens,
            window_left=case.window_left, sinks=inputs.sinks, num_splits=splits, hopper=True)
        name = f"hopper stages {stages} splits {splits}"
        out.fill_(float("nan"))
        launch()
        torch.cuda.synchronize()
        diff = (out.float() - outs["triton"].float()).abs().max().item()
        print(f"{name}: max diff to the Triton kernel {diff:.1e}, NaN {out.isnan().any().item()}",
              flush=True)
        replays[name], outs[name] = harness.capture(launch)[0], out
        keep.append(launch)
    decode_hopper.STAGES[d] = default_stages
    decode_probe.add_flashinfer(inputs, replays, outs, keep)
    times, errors, floor, _ = decode_probe.time_all(replays, reps, rounds, "triton")
    decode_probe.print_times(case, rounds, reps, floor, times, errors, "triton")
    # The graphs hold each variant's compiled kernel (STAGES is read at launch).
    decode_timeline.profile({name: replay for name, replay in replays.items()
                            if "control" not in name})


if __name__ == "__main__":
    main()
