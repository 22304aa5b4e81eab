"""Probe (not part of the library): one launch of each of the Hopper path (Q_REGS off and
on), and FlashInfer where it is on the path, on workload B at the prefixes in PREFIXES
(default "0,8192"), for Nsight Compute to read the counters of (where the cycles go: tensor
pipe, issue slots, shared-memory bandwidth, stall reasons).

    export PYTHONPATH=src; source scripts/peers_path.sh
    ncu --clock-control none --kernel-name regex:'hopper_extend|Prefill' \\
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \\
        python3 scripts/probes/ncu_probe.py
"""

import os

import torch

from swattn.bench import harness, peers, workloads
from swattn.ops import extend, extend_hopper


def main():
    for prefix in (int(p) for p in os.environ.get("PREFIXES", "0,8192").split(",")):
        case = workloads.extend_cases("B", cases=[(prefix, 8192)])[0]
        inputs = harness.build_inputs(case)
        args = (inputs.q, inputs.k, inputs.v, inputs.k_pool, inputs.v_pool,
                inputs.block_table_window, inputs.cu_seqlens, inputs.prefix_lens)
        for q_regs in (False, True):
            extend_hopper.Q_REGS = q_regs
            fn, _, _ = extend.prepare(*args, window_left=case.window_left, hopper=True)
            print(f"P{prefix} hopper Q_REGS={int(q_regs)}", flush=True)
            fn()
            torch.cuda.synchronize()
        extend_hopper.Q_REGS = False
        if prefix and os.environ.get("FLASHINFER", "1") == "1":
            try:
                fi = peers.flashinfer(inputs)
                print(f"P{prefix} flashinfer", flush=True)
                fi.fn()
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - a peer that does not run is reported
                print(f"flashinfer not run: {type(exc).__name__}: {str(exc)[:200]}")
        del inputs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
