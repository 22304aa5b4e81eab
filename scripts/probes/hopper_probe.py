"""Probe (not part of the library): A/B of the Hopper path's (ops.extend_hopper) module
switches on workload B (prefixes 0 and 8192, pages of 16), against the Triton kernel and,
at prefix 0, scripts/probes/gluon_probe.py's dense loop with and without the library's
sequence look-up, outputs compared bit for bit.

Timed by the bench's harness.interleave (every variant once a turn, back to back, L2
flushed before each, the order rotated every turn), so a slow drift of the clocks lands on
every variant alike, with a same-variant control for the floor; each variant's ratio to
the first is also taken turn by turn (the median of its per-turn ratios). SWITCH names
the constant of extend_hopper to vary (default HEADS_FIRST), VALUES its values (Python
literals, comma-separated; default: the boolean flipped), ROUNDS, REPS.

    export PYTHONPATH=src; python3 scripts/probes/hopper_probe.py
"""

import ast
import importlib.util
import os
import sys

import numpy as np
import torch

sys.path.insert(0, "scripts/probes")
import gluon_probe  # noqa: E402

from swattn.bench import harness, workloads  # noqa: E402
from swattn.ops import extend, extend_hopper  # noqa: E402


def baseline_module(path):
    """An earlier extend_hopper.py loaded beside the current one (same package)."""
    spec = importlib.util.spec_from_file_location("swattn.ops.extend_hopper_baseline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prepare_with(module, *args, **kw):
    """extend.prepare with ``module`` as the Hopper path (prepare imports it by name)."""
    import swattn.ops
    saved = sys.modules["swattn.ops.extend_hopper"]
    sys.modules["swattn.ops.extend_hopper"] = swattn.ops.extend_hopper = module
    try:
        return extend.prepare(*args, **kw)
    finally:
        sys.modules["swattn.ops.extend_hopper"] = swattn.ops.extend_hopper = saved


def main():
    switch = os.environ.get("SWITCH", "HEADS_FIRST")
    rounds, reps = int(os.environ.get("ROUNDS", 2)), int(os.environ.get("REPS", 20))
    default = getattr(extend_hopper, switch)
    values = [default, not default]
    if os.environ.get("VALUES"):
        values = [default] + [v for v in ast.literal_eval(os.environ["VALUES"] + ",")
                              if v != default]
    flush = harness.Flush()
    for prefix in (0, 8192):
        case = workloads.extend_cases("B", cases=[(prefix, 8192)])[0]
        inputs = harness.build_inputs(case)
        args = (inputs.q, inputs.k, inputs.v, inputs.k_pool, inputs.v_pool,
                inputs.block_table_window, inputs.cu_seqlens, inputs.prefix_lens)
        replays, outs = {}, {}
        for value in values:
            setattr(extend_hopper, switch, value)
            fn, out, _ = extend.prepare(*args, window_left=case.window_left, hopper=True)
            name = f"hopper {switch}={int(value)}"
            replays[name], outs[name] = harness.capture(fn)[0], out
            if value == default:
                replays[name + " (control)"] = harness.capture(fn)[0]
        setattr(extend_hopper, switch, default)
        if os.environ.get("BASELINE"):
            fn, out, _ = prepare_with(baseline_module(os.environ["BASELINE"]), *args,
                                      window_left=case.window_left, hopper=True)
            replays["hopper baseline"], outs["hopper baseline"] = harness.capture(fn)[0], out
        fn, out, _ = extend.prepare(*args, window_left=case.window_left, hopper=False)
        replays["triton kernel"], outs["triton kernel"] = harness.capture(fn)[0], out
        if not prefix:
            B, N, H, HKV, D = 4, 8192, 32, 8, 128
            q, k, v = (t.view(B * N, -1, D) for t in (inputs.q, inputs.k, inputs.v))
            for name, seqlens in (("dense", None), ("dense, sequence look-up", inputs.cu_seqlens)):
                probe_out = torch.empty_like(q)
                call = gluon_probe.gluon_launch(q, k, v, probe_out, N, H, HKV, D, case.window_left,
                                                64, 64, 2, True, False, cu_seqlens=seqlens)
                replays[f"gluon probe {name}"] = harness.capture(call)[0]
                outs[f"gluon probe {name}"] = probe_out
        rounds_us, errors = harness.interleave(replays, reps, rounds, flush)
        times = {name: [t for r in rs for t in r] for name, rs in rounds_us.items()}
        first = f"hopper {switch}={int(default)}"
        floor = harness.noise_floor(rounds_us[first], rounds_us[first + " (control)"])
        print(f"== B P{prefix} E8192 ({rounds} rounds x {reps} repetitions; noise floor "
              f"{100 * floor:.1f}%)")
        for name, us in times.items():
            ratio = (np.median(np.array(us) / np.array(times[first]))
                     if len(us) == len(times[first]) else float("nan"))
            same = torch.equal(outs[name], outs[first]) if name in outs else "-"
            print(f"{name}: median {np.median(us):9.1f} us  p20-p80 {np.percentile(us, 20):.0f}-"
                  f"{np.percentile(us, 80):.0f}  per-turn ratio to {first} {ratio:.3f}  "
                  f"equal: {same}  {errors.get(name, '')}")
        del inputs, replays, outs
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
