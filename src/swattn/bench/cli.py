"""``swattn bench``: one run on one GPU, every variant of every case interleaved.

    python -m swattn.bench --workload A,B --out benchmarks/results/DIR [--peers .peers/py]
    python -m swattn.bench --workload C-A,C-B,S --out benchmarks/results/DIR
    python -m swattn.bench --workload L4,C-L4,T --predict
    python -m swattn.bench --parallel --world 2     # swattn.parallel over 2 GPUs (its own options)
    python -m swattn.bench --workload V4-CSA,V4-HCA,V4-X --predict

Extend workloads (A, B, F, M, L4, T, V4-X) and decode workloads (C-A, C-B, C-F, C-L4, S,
V4-CSA, V4-HCA) may be mixed; each kind gets its own tables, and each case the variants of
its family (a window, a chunk: L4 and C-L4, a tree verify: T, a second key source: the V4
rows). Progress goes to stderr, one line per measurement;
the markdown tables are printed last on stdout and written with a CSV and a JSON
(``extend.*``, ``decode.*``) and PNG plots into ``--out``. ``--predict`` prints the tile
model's prediction and the floor of every case, and needs no GPU. ``--parallel`` times the
context-parallel plans instead (:mod:`swattn.bench.context_parallel`, which takes the rest of
the command line).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys

from . import workloads as wl

# How L2 is flushed before each repetition (harness.Flush), as the method line says it.
FLUSHES = {"clean": "a 256 MB read that flushes L2 (leaving it clean)",
           "dirty": "a 256 MB write that flushes L2 (leaving it dirty)"}

METHOD = ("median of repetitions, each one CUDA-graph replay after {flush}; variants "
          "interleaved repetition by repetition (order rotated each repetition and round); a "
          "same-variant control (a second plan of the same batch, timed as its own variant) "
          "gives the noise floor, and a ratio within it reads 'no change'; every output "
          "checked against the float64 reference on the first sequence (poisoned with NaN "
          "first) before timing; FLOPs count visible (query, key) pairs only")

DECODE_METHOD = METHOD.replace("on the first sequence", "on the first 4 sequences").replace(
    "visible (query, key) pairs only",
    "the keys each new token sees only (window, plus S's sparse keys)")

QUICK_CASES = ((4096, 4096), (7168, 1024))


def parse_args(argv=None, prog=None):
    p = argparse.ArgumentParser(prog=prog or "python -m swattn.bench",
                                description="Time swattn's extend and decode kernels against "
                                            "their peers on one GPU.")
    p.add_argument("--workload", default="A,B",
                   help="comma-separated workloads: extend A, B, F, M, L4, T, V4-X; decode C-A, "
                        "C-B, C-F, C-L4, S, V4-CSA, V4-HCA (default A,B)")
    p.add_argument("--out", default=None,
                   help="output folder "
                        "(default benchmarks/results/<extend|decode|bench>-<UTC date>)")
    p.add_argument("--peers", default=None,
                   help="folder with the peers' sources (default $SWATTN_PEERS or .peers/py)")
    p.add_argument("--reps", type=int, default=30,
                   help="repetitions per variant per round (default 30)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--batch", type=int, default=None, help="override every workload's batch size")
    p.add_argument("--cases", default=None,
                   help="override the extend (prefix, new) cases: 'P:E,P:E' "
                        "(every sequence the same)")
    p.add_argument("--context", default=None,
                   help="override the decode contexts (tokens per sequence, the new one included): "
                        "'4096,32768'")
    p.add_argument("--skip", default="",
                   help="variants to leave out, by key: extend triton, hopper, tight-full, skip, "
                        "det, det-skip, sglang, sglang-full, sglang-unified, vllm, flex, "
                        "flashinfer, flash-attn; decode control, skip, split1, same-keys, triton, "
                        "sglang, vllm, flex, flashinfer, flash-attn; V4 rows control, skip, fp8, "
                        "sglang, vllm, flashmla, flex")
    p.add_argument("--flush", choices=tuple(FLUSHES), default="clean",
                   help="how L2 is flushed before each repetition: 'clean' reads a 256 MB buffer "
                        "(default), 'dirty' writes it as triton.testing.do_bench does, leaving "
                        "L2's dirty lines for the timed kernel to write back (the bench's "
                        "old way)")
    p.add_argument("--fp8-config", action="append", default=[], metavar="JSON",
                   help="add a variant: swattn over the fp8 e4m3 cache on the Hopper path "
                        "with this config dict (the decode or extend path's fields, "
                        "e.g. '{\"items\": 1}'); repeatable, keys fp8-config-1, fp8-config-2, ...")
    p.add_argument("--page-size", type=int, default=16, help="paged-cache page size (default 16)")
    p.add_argument("--max-tokens", type=int, default=40960,
                   help="drop cases with more than this many tokens (prefix + new) per sequence "
                        "(default 40960: V4-X's 32k prefix and 8k chunk)")
    p.add_argument("--budget-ms", type=float, default=1500.0,
                   help="per variant per round: fewer reps for slow variants to stay near this")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--replot", default=None, metavar="JSON",
                   help="only draw the PNG plots of an earlier run's extend.json or decode.json "
                        "(no GPU needed)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: workload A, cases 4096:4096 and 7168:1024, 10 reps x 2 rounds")
    p.add_argument("--predict", action="store_true",
                   help="print every case's work, floor (at the H200's anchor ceilings) and the "
                        "tile model's prediction at the tiling the plan takes on an H200, and "
                        "stop (no GPU needed)")
    p.add_argument("--parallel", action="store_true",
                   help="time swattn.parallel's context-parallel decode and extend over "
                        "--world ranks instead (its options: --parallel --help)")
    args = p.parse_args(argv)
    if args.quick:
        args.workload = "A"
        args.cases = args.cases or ",".join(f"{a}:{b}" for a, b in QUICK_CASES)
        args.reps, args.rounds = min(args.reps, 10), min(args.rounds, 2)
    if args.reps < 1 or args.rounds < 1:
        p.error("--reps and --rounds must be >= 1")
    try:
        args.fp8_config = [json.loads(text) for text in args.fp8_config]
    except json.JSONDecodeError as exc:
        p.error(f"--fp8-config: not JSON: {exc}")
    if not all(isinstance(c, dict) for c in args.fp8_config):
        p.error("--fp8-config: each must be a JSON object (a dict of config fields)")
    return args


def config_variants(configs, ours_fp8):
    """The variants ``--fp8-config`` adds to a kind's list: ``ours_fp8`` (that kind's) over
    the fp8 cache on the Hopper path with each config dict, keys fp8-config-1, ...; a config
    the path cannot take fails as that variant's error, the others running on."""
    from .peers import Variant
    return [Variant(f"swattn tight, fp8 e4m3 cache, Hopper path, config {json.dumps(cfg)}",
                    f"fp8-config-{n + 1}", "ours",
                    lambda i, cfg=cfg: ours_fp8(i, hopper=True, config=cfg))
            for n, cfg in enumerate(configs)]


def case_variants(args, kind):
    """``case -> variants`` of one kind (the module :mod:`.extend` or :mod:`.decode`): its
    family's table for the case (``kind.variants_for``) less ``--skip``, plus the
    ``--fp8-config`` rows; a ``--skip`` key no family of either kind knows is a ValueError."""
    from . import decode, extend, second_variants
    from .peers import select
    skip = [k.strip() for k in args.skip.split(",") if k.strip()]
    tables = (extend.VARIANTS, extend.CHUNK_VARIANTS, extend.TREE_VARIANTS, decode.VARIANTS,
              decode.CHUNK_VARIANTS, second_variants.VARIANTS)
    known = {v.key for table in tables for v in table}
    for table in tables:
        select(table, skip, known)
    extra = config_variants(args.fp8_config, kind.ours_fp8)
    return lambda case: select(kind.variants_for(case), skip, known) + extra


def build_cases(args):
    """Every case of the selected workloads, with the command line's overrides: extend
    :class:`~swattn.bench.workloads.Case` and decode
    :class:`~swattn.bench.workloads.DecodeCase` objects, in the order named."""
    cases = []
    pairs = wl.parse_cases(args.cases) if args.cases else None
    contexts = wl.parse_contexts(args.context) if getattr(args, "context", None) else None
    for name in args.workload.split(","):
        if not name.strip():
            continue
        workload = wl.get(name)
        if workload.kind in wl.DECODE_KINDS:
            cases += wl.decode_cases(workload, batch=args.batch, contexts=contexts,
                                     page_size=args.page_size)
        else:
            cases += wl.extend_cases(workload, batch=args.batch, cases=pairs,
                                     page_size=args.page_size,
                                     max_tokens_per_seq=args.max_tokens)
    if not cases:
        raise ValueError("no case to run (check --workload, --cases and --max-tokens)")
    return cases


def split_cases(cases):
    """``(extend cases, decode cases)``."""
    decode = [c for c in cases if getattr(c, "kind", "") == "decode"]
    return [c for c in cases if getattr(c, "kind", "") != "decode"], decode


def _run_kind(kind, cases, variants, run, args, out_dir, meta, ceilings, flush):
    """Run every case of one kind (``variants(case)``: its variants) and write its tables
    after each case (a crash later leaves what was measured); returns the markdown."""
    from . import harness, report
    results, text = [], ""
    for case in cases:
        try:
            results.append(run(case, variants(case), reps=args.reps, rounds=args.rounds,
                               flush=flush, seed=args.seed, budget_ms=args.budget_ms))
        except Exception as exc:  # noqa: BLE001 - a case that cannot even be built is reported
            harness.log(f"{case.name}: failed: {type(exc).__name__}: {exc}")
            results.append(harness.CaseResult(case, [harness.VariantResult(
                "(case)", "case", "case", "error", f"{type(exc).__name__}: {exc}")]))
        text = report.write(out_dir, meta, ceilings, results, kind=kind)
    return text


def main(argv=None, prog=None):
    """Run the benchmark; returns the exit status (0 ok, 2 bad arguments, no GPU, or for
    ``--replot`` no matplotlib)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--parallel" in argv:
        from . import context_parallel
        rest = [a for a in argv if a != "--parallel"]
        return context_parallel.main(rest, f"{prog or 'python -m swattn.bench'} --parallel")
    args = parse_args(argv, prog)
    if args.replot:
        from .plots import plot
        written = plot(args.replot, args.out)
        if isinstance(written, str):
            # A note why nothing was drawn (matplotlib missing): a timing run goes on
            # without its plots, but plots are all --replot makes.
            print(f"{prog or 'python -m swattn.bench'}: error: --replot draws with matplotlib, "
                  "which is not installed: pip install 'swattn[bench]'", file=sys.stderr)
            return 2
        print(written)
        return 0
    try:
        cases = build_cases(args)
        extend_cases, decode_cases = split_cases(cases)
        from . import decode as decode_bench
        from . import extend as extend_bench
        from .peers import use_peers
        variants = case_variants(args, extend_bench)
        decode_variants = case_variants(args, decode_bench)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.predict:
        from .predict import predictions_markdown
        print(predictions_markdown(cases))
        return 0
    import torch
    if not torch.cuda.is_available():
        print("error: swattn bench needs a CUDA GPU", file=sys.stderr)
        return 2
    from . import harness, report
    free = None
    if decode_cases:
        # The decode inputs are large (C-B: 8.6 GB of cache, and a dense copy for flex).
        try:
            free, _ = torch.cuda.mem_get_info()
        except Exception as exc:  # noqa: BLE001 - no usable device
            print(f"error: swattn bench needs a CUDA GPU (cannot query its memory: "
                  f"{type(exc).__name__}: {exc})", file=sys.stderr)
            return 2
    stem = "extend" if not decode_cases else ("decode" if not extend_cases else "bench")
    out_dir = args.out or os.path.join(
        "benchmarks", "results",
        f"{stem}-" + datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M"))
    method = METHOD.format(flush=FLUSHES[args.flush])
    meta = report.collect_meta(f"{prog or 'python -m swattn.bench'} {shlex.join(argv)}".strip(),
                               method)
    meta["peers"] = use_peers(args.peers)
    planned = (sum(len(variants(c)) for c in extend_cases)
               + sum(len(decode_variants(c)) for c in decode_cases))
    harness.log(f"{len(extend_cases)} extend and {len(decode_cases)} decode cases, {planned} "
                f"variants in all, {args.rounds} rounds x <= {args.reps} reps; "
                f"{meta.get('gpu')}; output in {out_dir}")
    for case in decode_cases:
        need = decode_bench.footprint(case)
        if free is not None and need > free:
            harness.log(f"{case.name}: inputs take about {need / 1e9:.1f} GB, "
                        f"{free / 1e9:.1f} GB free: it may not fit")
    harness.PROGRESS.start(planned * args.rounds)
    flush = harness.Flush(kind=args.flush)
    ceilings = harness.measure_ceilings(flush)
    harness.log(f"ceilings: matmul {ceilings['matmul_tflops']:.0f} TFLOP/s, "
                f"copy {ceilings['copy_gbps']:.0f} GB/s {ceilings.get('copy_gbps_by_method', '')}")
    from .plots import plot
    texts = []
    if extend_cases:
        texts.append(_run_kind("extend", extend_cases, variants, extend_bench.run_case, args,
                               out_dir, meta, ceilings, flush))
        harness.log(f"plots: {plot(os.path.join(out_dir, 'extend.json'))}")
    if decode_cases:
        decode_meta = dict(meta, method=DECODE_METHOD.format(flush=FLUSHES[args.flush]))
        texts.append(_run_kind("decode", decode_cases, decode_variants, decode_bench.run_case, args,
                               out_dir, decode_meta, ceilings, flush))
        harness.log(f"plots: {plot(os.path.join(out_dir, 'decode.json'))}")
    print("\n\n".join(texts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
