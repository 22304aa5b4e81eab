"""Checks and timing of one case, extend or decode: the method of ``docs/design.md``. Each
kind brings its inputs and reference (:mod:`.extend_inputs`, :mod:`.decode_inputs`) and its
variants (:mod:`.extend`, :mod:`.decode`) to :func:`run_case`.

* Each variant is checked against the float64 reference (output poisoned with NaN first;
  NaN anywhere in the output fails), then captured in a CUDA graph (plain launches if
  capture fails, and the table says so).
* Variants are timed interleaved repetition by repetition, A/B/C, B/C/A, ... within each
  round, each repetition one graph replay after L2 is flushed by reading a 256 MB buffer
  (:class:`Flush`; a write, the older way, leaves L2 dirty and adds its write-back to the
  timed kernel); median and 20th/80th percentiles. swattn's rows are a plan's ``run``
  (what an engine calls per layer); the host time of that call and of the one-shot
  function are measured beside (:func:`host_time`).
* The ceilings (bf16 matmul 8192^3, device-to-device copy) are measured in the same run.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import triton
import triton.language as tl

from .peers import Skip

L2_FLUSH_BYTES = 256 << 20
CHECK_TOLERANCE = 1e-2  # ||out - ref|| / ||ref|| for bf16 (docs/design.md)


class Progress:
    """The measurements done out of those planned (cases x variants x rounds). On a
    terminal a bar is redrawn under the log lines; in a log file each line carries the
    percentage."""

    def __init__(self):
        self.total = 0
        self.done = 0

    def start(self, total):
        self.total, self.done = max(total, 0), 0

    def advance(self):
        self.done += 1
        self.draw()

    def percent(self):
        return 100.0 * min(self.done, self.total) / self.total if self.total else None

    def draw(self):
        if self.total and sys.stderr.isatty():
            filled = int(30 * min(self.done, self.total) / self.total)
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total}")
            sys.stderr.flush()


PROGRESS = Progress()


def log(message):
    """One progress line on stderr."""
    percent = PROGRESS.percent()
    stamp = time.strftime('%H:%M:%S') + (f" {percent:3.0f}%" if percent is not None else "")
    if PROGRESS.total and sys.stderr.isatty():
        sys.stderr.write("\r\033[K")  # clear the bar; draw() puts it back below
    print(f"[bench {stamp}] {message}", file=sys.stderr, flush=True)
    PROGRESS.draw()


# --------------------------------------------------------------------------------------
# Checks against the reference.
# --------------------------------------------------------------------------------------

def relative_error(out, ref):
    """``||out - ref|| / ||ref||`` in float64; NaN if ``out`` holds any NaN/Inf."""
    out = out.to(torch.float64)
    if not torch.isfinite(out).all():
        return float("nan")
    return float(torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref))


# --------------------------------------------------------------------------------------
# Timing.
# --------------------------------------------------------------------------------------

class Flush:
    """Evicts whatever a variant left in L2 before the next is timed, by streaming a 256 MB
    buffer through it, in one of two ways (``kind``):

    * ``"clean"`` (the default) reads the buffer: L2 is left holding clean lines, as a decode
      step finds it after the layer's weight GEMMs, and a variant's own dirty lines (its
      outputs) are written back during the flush, not the next variant's time.
    * ``"dirty"`` writes it (``triton.testing.do_bench``'s flush, and the bench's own before
      this class had a choice): L2 is left full of dirty lines, whose write-back the timed
      kernel then pays as it evicts them; how much depends on how much it evicts and hides
      (benchmarks/results/2026-12-04-h200-flush/)."""

    KINDS = ("clean", "dirty")

    def __init__(self, device="cuda", nbytes=L2_FLUSH_BYTES, kind="clean"):
        if kind not in self.KINDS:
            raise ValueError(f"flush kind must be one of {self.KINDS}, got {kind!r}")
        self.kind = kind
        if kind == "dirty":
            self.buffer = torch.empty(nbytes, dtype=torch.int8, device=device)
        else:
            self.buffer = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
            self.total = torch.empty((), dtype=torch.float32, device=device)

    def __call__(self):
        if self.kind == "dirty":
            self.buffer.zero_()
        else:
            torch.sum(self.buffer, dim=None, out=self.total)


def capture(fn, warmup=2):
    """``(replay, graphed, note)``: ``fn`` captured in a CUDA graph after ``warmup`` eager
    calls on a side stream, or ``fn`` itself when capture fails."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
        graph.replay()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - any capture failure: time plain launches
        reason = f"{type(exc).__name__}: {str(exc)[:80]}"
        try:
            torch.cuda.synchronize()
        except Exception as sync_exc:  # noqa: BLE001 - reported with the capture failure
            reason += f"; then {type(sync_exc).__name__}: {str(sync_exc)[:60]}"
        return fn, False, f"graph capture failed ({reason}): plain launches"

    def replay():
        graph.replay()

    return replay, True, ""


def measure(replay, reps, flush):
    """Microseconds of ``reps`` repetitions, each after an L2 flush, timed with events."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends):
        flush()
        start.record()
        replay()
        end.record()
    torch.cuda.synchronize()
    return [1000.0 * s.elapsed_time(e) for s, e in zip(starts, ends)]


def reps_for(estimate_us, reps, budget_ms, min_reps=5):
    """Repetitions per round: ``reps``, fewer for a slow variant so one round of it stays
    near ``budget_ms``, never under ``min_reps``."""
    if estimate_us <= 0 or not math.isfinite(estimate_us):
        return reps
    return int(max(min(min_reps, reps), min(reps, budget_ms * 1000.0 / estimate_us)))


def interleave(replays, reps, rounds, flush, budget_ms=1500.0, label="", warm_ms=500.0):
    """``({name: [[us, ...] per round]}, {name: error})``: every variant timed in every
    round, repetition by repetition: a round's i-th turn times each variant once (those
    with an i-th repetition to do, :func:`reps_for`), back to back, the order rotated by
    one every turn and every round (A/B/C, B/C/A, ...) so no variant always follows the
    same one. Workload B draws enough power to move the clocks within a second: timed in
    blocks of a variant's repetitions, the same kernel differed from its own control by far
    more than turn by turn (benchmarks/results/2026-12-01-h200-hopper-loop/). Before the
    first round the variants run in turn, untimed, for ``warm_ms`` (on a GPU): on a GPU just
    started, the first round ran slow in every variant
    (benchmarks/results/2026-12-03-h200-fp8-decode-items/). A variant that raises is dropped
    from that round on."""
    names = list(replays)
    counts, errors = {}, {}
    times = {name: [] for name in names}

    def attempt(name, what):
        try:
            return what()
        except Exception as exc:  # noqa: BLE001 - recorded; the others go on
            errors[name] = _short(exc)
            log(f"{label} | {name}: timing failed: {errors[name]}")
            return None

    for name in names:
        first = attempt(name, lambda replay=replays[name]: (replay(), measure(replay, 1, flush))[1])
        if first is not None:
            counts[name] = reps_for(first[0], reps, budget_ms)
    deadline = time.perf_counter() + warm_ms / 1000.0
    while counts and torch.cuda.is_available() and time.perf_counter() < deadline:
        for name in counts:
            if name not in errors:
                attempt(name, replays[name])
        torch.cuda.synchronize()
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)] if names else []
        samples = {name: [] for name in order}
        for name in order:
            if name not in errors:
                attempt(name, replays[name])
        for i in range(max((counts.get(name, 0) for name in order), default=0)):
            for name in order[i % len(order):] + order[:i % len(order)]:
                if name in errors or i >= counts[name]:
                    continue
                got = attempt(name, lambda replay=replays[name]: measure(replay, 1, flush))
                if got is not None:
                    samples[name] += got
        for name in order:
            if name in errors or not samples[name]:
                continue
            times[name].append(samples[name])
            PROGRESS.advance()
            log(f"{label} | {name} | round {r + 1}/{rounds}: "
                f"median {np.median(samples[name]):.1f} us over {len(samples[name])} reps")
    return times, errors


def summarize(rounds_times):
    """Median, 20th and 80th percentiles over all repetitions, and each round's median."""
    flat = [t for sample in rounds_times for t in sample]
    if not flat:
        return {"median_us": None, "p20_us": None, "p80_us": None, "round_medians_us": []}
    return {"median_us": float(np.median(flat)), "p20_us": float(np.percentile(flat, 20)),
            "p80_us": float(np.percentile(flat, 80)),
            "round_medians_us": [float(np.median(s)) for s in rounds_times], "reps": len(flat)}


def noise_floor(tight_rounds, control_rounds):
    """Relative spread between the tight kernel and its control: the largest of the
    difference of their overall medians and of their per-round medians, over tight."""
    tight, control = summarize(tight_rounds), summarize(control_rounds)
    if not tight["median_us"] or not control["median_us"]:
        return None
    spreads = [abs(tight["median_us"] - control["median_us"]) / tight["median_us"]]
    for a, b in zip(tight["round_medians_us"], control["round_medians_us"]):
        spreads.append(abs(a - b) / a)
    return max(spreads)


def _median_us(fn, flush, reps):
    replay, _, _ = capture(fn)
    return float(np.median(measure(replay, reps, flush)))


def _matmul_us(flush, reps, n):
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    return _median_us(lambda: torch.matmul(a, b, out=c), flush, reps)


def _copy_us(flush, reps, numel, copy):
    src = torch.randn(numel, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    us = _median_us(lambda: copy(src, dst), flush, reps)
    src = dst = None
    torch.cuda.empty_cache()
    return us


def _torch_copy(src, dst):
    dst.copy_(src)


@triton.jit
def _copy_kernel(Src, Dst, n, BLOCK: tl.constexpr):
    """``Dst[:n] = Src[:n]``, BLOCK elements a program: the rate at which the SMs alone
    move bytes."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    keep = offs < n
    tl.store(Dst + offs, tl.load(Src + offs, mask=keep), mask=keep)


def _triton_copy(src, dst, block=8192):
    _copy_kernel[(triton.cdiv(src.numel(), block),)](src, dst, src.numel(), BLOCK=block,
                                                      num_warps=8)


# How the copy ceiling is measured: torch's copy_ (which the first runs found below what the
# decode kernel itself read: benchmarks/results/2026-12-01-h200-baseline/) and a plain Triton
# load/store kernel run by the SMs; the fastest is the ceiling, each is reported.
COPY_METHODS = (("torch copy_ 1 GiB", _torch_copy, 1 << 29),
                ("torch copy_ 4 GiB", _torch_copy, 1 << 31),
                ("Triton copy 4 GiB", _triton_copy, 1 << 31))


def measure_ceilings(flush, reps=20):
    """``{"matmul_tflops", "copy_gbps"}``: bf16 matmul 8192^3 on random data, and the best
    device-to-device copy of ``COPY_METHODS`` counting bytes read and written, medians
    over graph replays (each method's rate is kept under ``copy_gbps_by_method``)."""
    n = 8192
    matmul_us = _matmul_us(flush, reps, n)
    rates = {name: 2 * 2 * numel / _copy_us(flush, reps, numel, copy) / 1e3
             for name, copy, numel in COPY_METHODS}
    best = max(rates, key=rates.get)
    torch.cuda.empty_cache()
    return {"matmul_tflops": 2.0 * n ** 3 / matmul_us / 1e6, "copy_gbps": rates[best],
            "matmul_us": matmul_us, "copy_method": best, "copy_gbps_by_method": rates}


# --------------------------------------------------------------------------------------
# One case, every variant.
# --------------------------------------------------------------------------------------

@dataclass
class VariantResult:
    name: str
    key: str
    role: str
    status: str = "ok"  # ok | WRONG | skipped | error
    note: str = ""
    rel_err: float | None = None
    applies_sinks: bool = True
    applies_sparse: bool = True
    graphed: bool = False
    rounds_us: list = field(default_factory=list)
    # Microseconds of host time a call (name -> us; Prepared.host) and the tiles the
    # variant's kernel walks (Prepared.tiling).
    host_us: dict = field(default_factory=dict)
    tiling: dict | None = None
    kv_bytes: int = 2  # Prepared.kv_bytes
    computes: str = ""  # Prepared.computes: another function than the case's


@dataclass
class CaseResult:
    case: object
    variants: list
    noise: float | None = None
    seconds: float = 0.0


def _sync():
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _short(exc):
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"


def same_function(applies_sinks, applies_sparse, case):
    """``(sinks kept, sparse keys kept)``: what a variant computes of the case's function
    (a case without sinks or sparse keys loses nothing by dropping them)."""
    return (applies_sinks or not case.sinks,
            applies_sparse or not getattr(case, "sparse_keys", 0))


def _prepare(variant, inputs, refs, label, reference):
    """Build, check and capture one variant; returns (result, replay or None, prepared).
    ``reference(inputs, sinks=, sparse=)`` gives the float64 output of the first
    sequence(s)."""
    res = VariantResult(variant.name, variant.key, variant.role)
    try:
        prepared = variant.build(inputs)
    except Skip as skip:
        res.status, res.note = "skipped", str(skip)
        log(f"{label} | {variant.name}: skipped ({skip})")
        return res, None, None
    except Exception as exc:  # noqa: BLE001 - one failing variant must not stop the run
        res.status, res.note = "error", "build: " + _short(exc)
        log(f"{label} | {variant.name}: build failed: {_short(exc)}")
        return res, None, None
    res.note, res.applies_sinks = prepared.note, prepared.applies_sinks
    res.applies_sparse = getattr(prepared, "applies_sparse", True)
    res.computes = getattr(prepared, "computes", "")
    try:
        if prepared.poison is not None:
            prepared.poison()
        prepared.fn()
        _sync()
        out = prepared.result()
        same_sinks, same_sparse = same_function(res.applies_sinks, res.applies_sparse, inputs.case)
        same = same_sinks
        key = (same_sinks, same_sparse)
        if prepared.reference is not None:
            ref = prepared.reference()  # a variant computing over other inputs (an fp8 cache)
        else:
            if key not in refs:
                refs[key] = reference(inputs, sinks=same_sinks, sparse=same_sparse)
            ref = refs[key]
        eager = out.clone()
        res.rel_err = relative_error(out[:ref.shape[0]], ref)
        if not torch.isfinite(out).all():
            res.rel_err = float("nan")
        if not (res.rel_err <= (getattr(prepared, "tolerance", None) or CHECK_TOLERANCE)):
            res.status = "WRONG"
        if not same:
            res.note += "; no sinks: a different function (checked against a sink-less reference)"
        if not same_sparse:
            res.note += ("; no sparse keys: a different function (checked against a window-only "
                         "reference)")
        if res.computes:
            res.note += f"; {res.computes}: a different function (checked against its reference)"
        log(f"{label} | {variant.name}: rel err {res.rel_err:.2e} ({res.status})")
    except Exception as exc:  # noqa: BLE001
        res.status, res.note = "error", "run/check: " + _short(exc)
        log(f"{label} | {variant.name}: run/check failed: {_short(exc)}")
        return res, None, None
    try:
        replay, res.graphed, note = capture(prepared.fn)
        if note:
            res.note += "; " + note
        if res.graphed and prepared.poison is not None:
            # The replay must write what the eager launch wrote, into the same buffer.
            prepared.poison()
            replay()
            _sync()
            if not torch.equal(prepared.result(), eager):
                res.status = "WRONG"
                res.note += "; graph replay output differs from the eager launch"
    except Exception as exc:  # noqa: BLE001
        res.status, res.note = "error", "warm-up: " + _short(exc)
        return res, None, None
    res.tiling = getattr(prepared, "tiling", None)
    res.kv_bytes = getattr(prepared, "kv_bytes", 2)
    try:
        # Host time means the GPU's launches (the interpreter's calls are the kernels).
        host_calls = getattr(prepared, "host", {}) if inputs.q.is_cuda else {}
        for name, call in host_calls.items():
            res.host_us[name], res.host_us[name + " (eager)"] = host_time(call)
            log(f"{label} | {variant.name}: {name} host {res.host_us[name]:.1f} us a call")
    except Exception as exc:  # noqa: BLE001
        res.note += "; host time: " + _short(exc)
    return res, replay, prepared


def host_time(call, calls=100):
    """``(host us, eager us)`` a call of ``call`` run ``calls`` times back to back from an
    idle GPU: the host's time to issue one (what it costs an engine's or a model's CPU;
    100 calls stay well inside the launch queue, so no call waits for the GPU), and the
    time a call until the GPU has finished them all (what an eager caller sees)."""
    for _ in range(3):
        call()
    _sync()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    issued = time.perf_counter()
    _sync()
    done = time.perf_counter()
    return 1e6 * (issued - start) / calls, 1e6 * (done - start) / calls


def run_case(case, variants, *, build, reference, reps, rounds, flush, seed=0, budget_ms=1500.0,
             device="cuda"):
    """Build the inputs of ``case`` (``build(case, device, seed)``), check every variant
    against ``reference(inputs, sinks=, sparse=)``, capture them, time them interleaved,
    and return a :class:`CaseResult` (errors recorded, never raised)."""
    started = time.time()
    label = case.name
    shape = case.seqs[0] if hasattr(case, "seqs") else f"S{max(case.seq_lens)}"
    log(f"{label}: building inputs ({case.batch} x {shape})")
    inputs = build(case, device, seed)
    refs, results, replays, held = {}, [], {}, []
    for variant in variants:
        res, replay, prepared = _prepare(variant, inputs, refs, label, reference)
        results.append(res)
        if replay is not None:
            replays[variant.name] = replay
            held.append(prepared)
    times, errors = interleave(replays, reps, rounds, flush, budget_ms, label)
    for res in results:
        res.rounds_us = times.get(res.name, [])
        if res.name in errors:
            res.status, res.note = "error", res.note + "; timing: " + errors[res.name]
    by_role = {r.role: r for r in results if r.rounds_us}
    noise = None
    if "tight" in by_role and "control" in by_role:
        noise = noise_floor(by_role["tight"].rounds_us, by_role["control"].rounds_us)
    replay = prepared = None
    del replays, held, refs, inputs
    _sync()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return CaseResult(case, results, noise, time.time() - started)
