"""Probe (not part of the library): when each decode program starts and ends, on which SM.

Loads a copy of ``ops/decode.py`` with the kernel's first and last statements reading the
SM's global timer (and its SM id) into a buffer, runs WORKLOAD (default C-B) with each
config of VARIANTS ((BLOCK_N, warps, stages, splits), as decode_probe.py) and prints, for
the last of a few runs: the kernel's span, how late programs start (a second wave shows
here), the spread of their ends, programs an SM and their mean duration by how many shared
the SM, and how a program's duration in one run predicts its next (by program, by SM). Then one profiled call each of ours and FlashInfer's: every kernel's grid, block,
registers, shared memory and duration from the profiler's trace.

    export PYTHONPATH=src; python3 scripts/probes/decode_timeline.py
"""

import ast
import importlib.util
import json
import os
import tempfile

import decode_probe  # scripts/probes, on sys.path as the script's folder
import numpy as np
import torch

from swattn.bench import decode as decode_bench
from swattn.ops import decode

VARIANTS = [(32, 4, 3, 2), (16, 4, 3, 2)]


def timed_module():
    """``ops/decode.py`` with the timer stores, loaded as ``swattn.ops.decode_timed``."""
    with open(decode.__file__) as f:
        src = f.read()
    edits = [
        ("import triton.language as tl\n",
         "import triton.language as tl\nfrom triton.language.extra import cuda as _tlc\n"),
        ("    Part_o, Part_lse,\n    stride_qb", "    Part_o, Part_lse, Timer,\n    stride_qb"),
        ("    EVEN_DV: tl.constexpr = DV == BLOCK_DV\n",
         "    EVEN_DV: tl.constexpr = DV == BLOCK_DV\n    t_begin = _tlc.globaltimer()\n"),
        ("            tl.store(Lse + i_seq * stride_lb + head, lse, mask=m_h)\n",
         ("            tl.store(Lse + i_seq * stride_lb + head, lse, mask=m_h)\n"
          "    t_end = _tlc.globaltimer()\n"
          "    pid = tl.program_id(0) + tl.num_programs(0) * (tl.program_id(1) + tl.num_programs(1)"
          " * tl.program_id(2))\n"
          "    tl.store(Timer + pid * 3, t_begin)\n"
          "    tl.store(Timer + pid * 3 + 1, t_end)\n"
          "    tl.store(Timer + pid * 3 + 2, _tlc.smid().to(tl.int64))\n")),
        ("Part_o=part_o, Part_lse=part_lse,", "Part_o=part_o, Part_lse=part_lse, Timer=TIMER,"),
    ]
    for old, new in edits:
        assert src.count(old) == 1, old
        src = src.replace(old, new)
    path = os.path.join(tempfile.mkdtemp(), "decode_timed.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location("swattn.ops.decode_timed", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def timeline(module, inputs, case, config, variant):
    cfg = decode_probe.with_config(config, variant)
    module.CARRY_PAGES = decode.CARRY_PAGES
    decode.CARRY_PAGES = None
    splits = variant[3] or 1
    programs = case.batch * case.num_kv_heads * splits
    module.TIMER = torch.zeros(programs, 3, dtype=torch.int64, device="cuda")
    launch, _ = decode_probe.prepare(module, inputs, case, cfg, variant[3])
    runs = []
    for _ in range(3):
        for _ in range(3):
            launch()
        torch.cuda.synchronize()
        runs.append(module.TIMER.cpu().numpy().copy())
    t = runs[-1]
    begin, end, sm = (t[:, 0] - t[:, 0].min()) / 1e3, (t[:, 1] - t[:, 0].min()) / 1e3, t[:, 2]
    dur = end - begin
    per_sm = np.bincount(sm, minlength=132)
    load = per_sm[sm]
    pct = lambda x: " ".join(f"{np.percentile(x, q):.1f}" for q in (0, 10, 50, 90, 99, 100))
    print(f"== {variant}: {programs} programs, span {end.max():.1f} us")
    print(f"   begin p0/10/50/90/99/100: {pct(begin)}")
    print(f"   end   p0/10/50/90/99/100: {pct(end)}")
    print(f"   duration p0/10/50/90/99/100: {pct(dur)}")
    counts = {int(k): int(v) for k, v in zip(*np.unique(per_sm, return_counts=True))}
    print(f"   SMs by programs run: {counts}")
    for k in sorted(set(load.tolist())):
        sel = load == k
        print(f"   on SMs with {k}: {sel.sum()} programs, mean duration {dur[sel].mean():.1f} us, "
              f"mean end {end[sel].mean():.1f}, last end {end[sel].max():.1f}")
    # Programs running at ten points of the span, and when 50/90/99% had ended.
    points = np.linspace(0, end.max(), 11)[1:-1]
    live = [int(((begin <= p) & (end > p)).sum()) for p in points]
    print(f"   running at 10%..90% of the span: {live}")
    # Is a slow program slow again in the next run (the same pid: its sequence's pages), or
    # is a slow SM slow again (whatever runs on it)?
    durs = [r[:, 1] - r[:, 0] for r in runs]
    by_pid = np.corrcoef(durs[0], durs[1])[0, 1], np.corrcoef(durs[1], durs[2])[0, 1]
    sm_mean = [np.bincount(r[:, 2], weights=d, minlength=132) / np.maximum(
        np.bincount(r[:, 2], minlength=132), 1) for r, d in zip(runs, durs)]
    by_sm = np.corrcoef(sm_mean[0], sm_mean[1])[0, 1], np.corrcoef(sm_mean[1], sm_mean[2])[0, 1]
    print(f"   run-to-run correlation of durations: by program {by_pid[0]:.2f} {by_pid[1]:.2f}, "
          f"by SM (mean) {by_sm[0]:.2f} {by_sm[1]:.2f}")


def profile(fns):
    """Kernel events of one call of each ``fns`` value (name -> callable)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    for name, fn in fns.items():
        fn()
        torch.cuda.synchronize()
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        path = os.path.join(tempfile.mkdtemp(), "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
        for e in events:
            if e.get("cat") == "kernel":
                a = e.get("args", {})
                print(f"{name}: {e['name'][:90]} dur {e['dur']:.1f} us grid {a.get('grid')} "
                      f"block {a.get('block')} regs {a.get('registers per thread')} "
                      f"smem {a.get('shared memory')} blocks/SM {a.get('blocks per SM')} "
                      f"occupancy {a.get('est. achieved occupancy %')}", flush=True)


def main():
    variants = ast.literal_eval(os.environ["VARIANTS"]) if os.environ.get("VARIANTS") else VARIANTS
    case, inputs, config = decode_probe.setup()
    module = timed_module()
    default = (config.block_n, config.num_warps, config.num_stages, None)
    for variant in [default] + [tuple(v) for v in variants]:
        timeline(module, inputs, case, config, variant)
    ours, _ = decode_probe.prepare(decode, inputs, case, config, None)
    fns = {"swattn": ours}
    for variant in variants:
        fns[f"swattn {variant}"] = decode_probe.prepare(
            decode, inputs, case, decode_probe.with_config(config, variant), variant[3])[0]
        decode.CARRY_PAGES = None
    try:
        fi = decode_bench.flashinfer_decode(inputs)
        fns["FlashInfer"] = fi.fn
        plan = getattr(fi.keep[1] if hasattr(fi, "keep") else None, "_plan_info", None)
        print(f"FlashInfer plan info: {plan}")
    except Exception as exc:  # noqa: BLE001 - the probe still profiles ours
        print(f"FlashInfer not run: {type(exc).__name__}: {exc}")
    profile(fns)


if __name__ == "__main__":
    main()
