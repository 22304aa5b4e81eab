"""Probe (not part of the library): A/B of decode kernel configs on one decode workload
(WORKLOAD, default C-B: batch 64 at 32k, window 4096, Mistral heads, pages of 16) against
the library's default, an earlier decode.py (BASELINE) and FlashInfer, outputs compared bit
for bit with the default's.

Each variant is (BLOCK_N, warps, stages, splits[, carry, pdl]) of ops.decode (VARIANTS, a
Python list of tuples; splits None is the library's count; carry sets
ops.decode.CARRY_PAGES, the block-table entries carried a tile ahead or loaded in the
iteration that uses them; pdl ops.decode.MERGE_PDL, False for the merge launched without
PDL);
the head-first grid order is the config function's. BASELINE=path loads that file as a second
decode module (its imports resolve to the current package) and times it with
BASELINE_CONFIG (a tuple, default the current config function's). For each of ours, the
compiled kernel's registers, spills and shared memory and the programs an SM holds (from
those, for sm_90's 64K registers and 228 KB of shared memory) say how many waves the grid
takes. Each variant first runs once in its own process on a small batch against the
default (an illegal address there cannot end the probe). Timed by harness.interleave
(every variant once a turn, L2 flushed before each, the order rotated), with a same-variant
control for the floor and the median of per-turn ratios to the default. READ=1 adds a
read-only Triton stream over the workload's bytes: the read ceiling beside the copy one.

    export PYTHONPATH=src; python3 scripts/probes/decode_probe.py
"""

import ast
import dataclasses
import importlib.util
import os
import subprocess
import sys

import numpy as np
import torch
import triton
import triton.language as tl

from swattn.bench import decode as decode_bench
from swattn.bench import harness, workloads
from swattn.ops import decode

VARIANTS = [(64, 4, 2, None), (32, 4, 4, None), (64, 2, 3, None)]
SMEM_PER_SM, REGS_PER_SM, MAX_THREADS = 233472, 65536, 2048


def compiled():
    """The decode kernel's compiled variants so far (every device)."""
    found = []
    for cache in decode._decode_kernel.device_caches.values():
        found.extend(cache[0].values())
    return found


def occupancy(kernel, warps):
    regs, shared = kernel.n_regs, kernel.metadata.shared
    by_regs = REGS_PER_SM // max(1, regs * 32 * warps)
    by_smem = SMEM_PER_SM // (shared + 1024) if shared else 32
    return regs, kernel.n_spills, shared, min(by_regs, by_smem, MAX_THREADS // (32 * warps))


def setup(small=False):
    """(case, inputs, the config function's config) of WORKLOAD (BATCH sequences, default
    the workload's); ``small``: 6 sequences of 4133 keys (a window starting mid-page). The
    config keeps the Triton kernel (``hopper`` off): the probes compare its configs."""
    name = os.environ.get("WORKLOAD", "C-B")
    batch = int(os.environ["BATCH"]) if os.environ.get("BATCH") else None
    case = workloads.decode_cases(name, batch=6 if small else batch,
                                  contexts=(4133,) if small else None)[0]
    inputs = decode_bench.build_inputs(case)
    config = decode.decode_config(case.head_dim, case.head_dim_v,
                                  case.num_q_heads // case.num_kv_heads, torch.bfloat16,
                                  inputs.q.device)
    return case, inputs, dataclasses.replace(config, hopper=False)


def prepare(module, inputs, case, config, splits):
    """``(launch, out)`` of ``module``'s decode on ``inputs``."""
    launch, out, _ = module.prepare(
        inputs.q, inputs.k_cache, inputs.v_cache, inputs.block_table_window, inputs.seq_lens,
        window_left=case.window_left, sinks=inputs.sinks, sparse=inputs.sparse,
        num_splits=splits, config=config)
    return launch, out


def with_config(config, variant):
    """``config`` with the variant's tile, warps and stages; the module switches set from
    its optional fifth and sixth entries (carry, merge by PDL; None: the library's rule).
    CARRY_PAGES is read at launch, MERGE_PDL by prepare()."""
    block_n, warps, stages = variant[:3]
    extra = tuple(variant[4:]) + (None,) * (6 - max(len(variant), 4))
    decode.CARRY_PAGES, decode.MERGE_PDL = extra
    return dataclasses.replace(config, block_n=block_n, num_warps=warps, num_stages=stages)


def check(variant):
    """Exit status 0 when ``variant`` matches the default within 1e-2 on a small batch."""
    case, inputs, config = setup(small=True)
    outs = []
    for cfg, splits in ((config, None), (with_config(config, variant), variant[3])):
        launch, out = prepare(decode, inputs, case, cfg, splits)
        out.fill_(float("nan"))
        launch()
        decode.CARRY_PAGES = None
        torch.cuda.synchronize()
        outs.append(out.float())
    diff = (outs[0] - outs[1]).abs().max().item()
    print(f"check {variant}: max diff to the default {diff:.1e}")
    return 0 if diff < 1e-2 else 1


@triton.jit
def _read(X, Out, per_program, BLOCK: tl.constexpr):
    """Sum of one contiguous chunk of X: a read-only stream."""
    base = tl.program_id(0).to(tl.int64) * per_program
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(0, per_program, BLOCK):
        acc += tl.load(X + base + i + tl.arange(0, BLOCK)).to(tl.float32)
    tl.store(Out + tl.program_id(0), tl.sum(acc))


def read_ceiling(nbytes, flush):
    """GB/s of the fastest of a few read-only streams over ``nbytes``."""
    x = torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16)
    best = 0.0
    for programs, block, warps in ((528, 4096, 4), (1056, 4096, 4), (2112, 4096, 8),
                                   (4224, 2048, 4), (1056, 8192, 8)):
        per = x.numel() // programs // block * block
        out = torch.empty(programs, device="cuda")

        def call(x=x, out=out, programs=programs, per=per, block=block, warps=warps):
            _read[(programs,)](x, out, per, BLOCK=block, num_warps=warps)

        replay = harness.capture(call)[0]
        us = float(np.median(harness.measure(replay, 10, flush)))
        gbs = programs * per * 2 / us / 1e3
        print(f"read {programs} programs x {per * 2 >> 10} KB, block {block}, {warps} warps: "
              f"{us:.1f} us, {gbs:.0f} GB/s")
        best = max(best, gbs)
    return best


def add_flashinfer(inputs, replays, outs, keep):
    """FlashInfer's decode of ``inputs`` captured beside ours, where it runs."""
    try:
        prepared = decode_bench.flashinfer_decode(inputs)
        replays["FlashInfer"], outs["FlashInfer"] = harness.capture(prepared.fn)[0], prepared.result()
        keep.append(prepared)
    except Exception as exc:  # noqa: BLE001 - a probe without the peer still measures ours
        print(f"FlashInfer not run: {type(exc).__name__}: {exc}")


def time_all(replays, reps, rounds, first):
    """``(times, errors, noise floor, flush)``: every replay interleaved; ``first`` and
    its control give the floor."""
    flush = harness.Flush()
    rounds_us, errors = harness.interleave(replays, reps, rounds, flush)
    times = {name: [t for r in rs for t in r] for name, rs in rounds_us.items()}
    floor = harness.noise_floor(rounds_us[first], rounds_us[first + " (control)"])
    return times, errors, floor, flush


def print_times(case, rounds, reps, floor, times, errors, first):
    """The table of :func:`time_all`'s times: each variant's median, p20-p80 and median
    per-turn ratio to ``first``."""
    print(f"== {case.name} ({rounds} rounds x {reps} repetitions; noise floor {100 * floor:.1f}%)")
    for name, us in times.items():
        ratio = (np.median(np.array(us) / np.array(times[first]))
                 if len(us) == len(times[first]) else float("nan"))
        print(f"{name}: median {np.median(us):8.1f} us  p20-p80 {np.percentile(us, 20):.1f}-"
              f"{np.percentile(us, 80):.1f}  per-turn ratio {ratio:.3f}  {errors.get(name, '')}",
              flush=True)


def main():
    rounds, reps = int(os.environ.get("ROUNDS", "2")), int(os.environ.get("REPS", "15"))
    variants = ast.literal_eval(os.environ["VARIANTS"]) if os.environ.get("VARIANTS") else VARIANTS
    case, inputs, config = setup()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    default = (config.block_n, config.num_warps, config.num_stages, None)
    # Each launch closure owns its split scratch, which a captured graph does not keep
    # alive: dropped, the scratch went back to the allocator and the graph's replays wrote
    # partials into whatever took the memory next (FlashInfer's page lists: the illegal
    # addresses of session 9, always reported by FlashInfer's replay first).
    replays, outs, info, keep = {}, {}, {}, []
    for variant in [default] + [tuple(v) for v in variants if tuple(v) != default]:
        if variant != default:
            result = subprocess.run([sys.executable, __file__, "--check", repr(variant)],
                                    capture_output=True, text=True, check=False)
            print(result.stdout.strip() or result.stderr.strip()[-300:], flush=True)
            if result.returncode:
                print(f"{variant}: left out (failed its check)")
                continue
        before = {id(k) for k in compiled()}
        launch, out = prepare(decode, inputs, case, with_config(config, variant), variant[3])
        name = str(variant) + (" default" if variant == default else "")
        replays[name], outs[name] = harness.capture(launch)[0], out
        keep.append(launch)
        decode.CARRY_PAGES = None
        new = [k for k in compiled() if id(k) not in before]
        if new:
            info[name] = occupancy(new[-1], variant[1])
        if variant == default:
            first = name
            replays[name + " (control)"] = harness.capture(launch)[0]
    if os.environ.get("BASELINE"):
        spec = importlib.util.spec_from_file_location("swattn.ops.decode_baseline",
                                                      os.environ["BASELINE"])
        baseline = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(baseline)
        cfg = config
        if os.environ.get("BASELINE_CONFIG"):
            cfg = with_config(config, (*ast.literal_eval(os.environ["BASELINE_CONFIG"]), None))
        launch, out = prepare(baseline, inputs, case, cfg, None)
        keep.append(launch)
        name = (f"baseline {os.environ['BASELINE']} "
                f"({cfg.block_n}, {cfg.num_warps}, {cfg.num_stages}, None)")
        replays[name], outs[name] = harness.capture(launch)[0], out
    add_flashinfer(inputs, replays, outs, keep)
    times, errors, floor, flush = time_all(replays, reps, rounds, first)
    programs = case.batch * case.num_kv_heads
    print(f"== {case.name}: {programs} programs a split, {sms} SMs ({rounds} rounds x {reps} "
          f"repetitions; noise floor {100 * floor:.1f}%)")
    print("variant (BLOCK_N, warps, stages, splits): regs spills shared/B programs/SM waves")
    for name, us in times.items():
        ratio = (np.median(np.array(us) / np.array(times[first]))
                 if len(us) == len(times[first]) else float("nan"))
        same = torch.equal(outs[name], outs[first]) if name in outs else "-"
        occ = ""
        if name in info:
            regs, spills, shared, per_sm = info[name]
            occ = (f"regs {regs} spills {spills} shared {shared} {per_sm}/SM "
                   f"waves {programs / max(1, per_sm * sms):.2f} (1 split)")
        print(f"{name}: median {np.median(us):8.1f} us  p20-p80 {np.percentile(us, 20):.1f}-"
              f"{np.percentile(us, 80):.1f}  per-turn ratio {ratio:.3f}  equal: {same}  {occ}  "
              f"{errors.get(name, '')}", flush=True)
    if os.environ.get("READ"):
        nbytes = 2 * case.batch * (case.window_left + 1) * case.num_kv_heads * case.head_dim * 2
        del replays, outs, inputs
        torch.cuda.empty_cache()
        ceiling = read_ceiling(nbytes, flush)
        print(f"read ceiling {ceiling:.0f} GB/s: the window's {nbytes / 1e6:.1f} MB in "
              f"{nbytes / ceiling / 1e3:.1f} us")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--check"]:
        sys.exit(check(ast.literal_eval(sys.argv[2])))
    sys.exit(main())
