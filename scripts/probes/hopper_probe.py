"""Probe (not part of the library): the Hopper path (ops.extend_hopper) on workload B at
prefix 0 against scripts/probes/gluon_probe.py's dense loop, in one run with a control:
with both stages compiled in (keys="all") or stage 2 only (keys="new", the same result at
prefix 0), and the probe loop with and without the library's sequence look-up (the look-up
variant was added after the session's last device call: compiled for sm_90 on the CPU, not
yet run; benchmarks/results/2026-12-01-h200-session6/hopper-probe-*.log are runs of the
version before it).

    export PYTHONPATH=src; python3 scripts/probes/hopper_probe.py
"""

import sys

import torch

sys.path.insert(0, "scripts/probes")
import gluon_probe  # noqa: E402

from swattn.bench import harness, workloads  # noqa: E402
from swattn.ops import extend, extend_hopper  # noqa: E402


def main():
    case = workloads.extend_cases("B", cases=[(0, 8192)])[0]
    inputs = harness.build_inputs(case)
    args = (inputs.q, inputs.k, inputs.v, inputs.k_pool, inputs.v_pool, inputs.block_table_window,
            inputs.cu_seqlens, inputs.prefix_lens)
    variants, outs = {}, {}
    for heads_first in (True,):
        for keys in ("all", "new"):
            extend_hopper.HEADS_FIRST = heads_first
            fn, out, _ = extend.prepare(*args, window_left=case.window_left, keys=keys, hopper=True)
            fn()
            torch.cuda.synchronize()
            name = f"hopper path keys={keys} heads_first={int(heads_first)}"
            variants[name], outs[name] = harness.capture(fn)[0], out
    extend_hopper.HEADS_FIRST = True
    fn, out, _ = extend.prepare(*args, window_left=case.window_left, hopper=False)
    variants["triton kernel"], outs["triton kernel"] = harness.capture(fn)[0], out
    B, N, H, HKV, D = 4, 8192, 32, 8, 128
    q = inputs.q.view(B * N, H, D)
    k = inputs.k.view(B * N, HKV, D)
    v = inputs.v.view(B * N, HKV, D)
    probe_out = torch.empty_like(q)
    call = gluon_probe.gluon_launch(q, k, v, probe_out, N, H, HKV, D, case.window_left, 64, 64, 2,
                                    True, False)
    variants["gluon probe dense"] = harness.capture(call)[0]
    outs["gluon probe dense"] = probe_out
    # The probe with the library's prologue: the block's sequence looked up from cu_seqlens.
    lookup_out = torch.empty_like(q)
    call = gluon_probe.gluon_launch(q, k, v, lookup_out, N, H, HKV, D, case.window_left, 64, 64, 2,
                                    True, False, cu_seqlens=inputs.cu_seqlens)
    variants["gluon probe dense, sequence look-up"] = harness.capture(call)[0]
    outs["gluon probe dense, sequence look-up"] = lookup_out
    first = next(iter(variants))
    variants[first + " (control)"] = harness.capture(variants[first])[0]
    flush = harness.Flush()
    times = {name: [] for name in variants}
    for _ in range(3):
        for name, replay in variants.items():
            times[name] += harness.measure(replay, 20, flush)
    base = outs[first].float()
    for name in variants:
        diff = (outs[name].float() - base).abs().max().item() if name in outs else 0.0
        print(f"{name}: {float(torch.tensor(times[name]).median()):9.1f} us  max diff {diff:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
