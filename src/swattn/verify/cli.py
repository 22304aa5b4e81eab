"""`swattn verify`: the bit-identity matrix of every kernel family against its bounds
variants and the reference. On the CPU it runs a reduced matrix under the interpreter."""

import argparse
import os
import sys
import time


def add_arguments(parser):
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    parser.add_argument("--out", default=None, help="folder for the markdown tables")
    parser.add_argument("--limit", type=int, default=None, help="first N configurations only")
    parser.add_argument("--asm", action="store_true",
                        help="compile the bounds variants for sm_90 and compare their SASS "
                             "(no GPU needed)")
    parser.add_argument("--fingerprints", nargs="?", const="-", default=None, metavar="FILE",
                        help="with --asm: a digest of every kernel's SASS and its registers, "
                             "printed, or written as JSON to FILE")
    parser.add_argument("--against", default=None, metavar="FILE",
                        help="with --fingerprints: an earlier tree's JSON; exit 1 where a "
                             "kernel's SASS differs (how a refactor shows it changed no code)")
    parser.add_argument("--fp8-accuracy", action="store_true",
                        help="instead of the matrix: how far an fp8 KV cache moves each kernel's "
                             "output, against the reference and the unquantized cache")
    parser.add_argument("--family", default=None,
                        help="kernel families to run, comma-separated (extend, unified, decode, "
                             "extend-fp8, unified-fp8, decode-fp8, decode-latent, extend-chunk, "
                             "unified-chunk, decode-chunk, extend-tree, unified-tree, "
                             "decode-second, extend-second, hopper, "
                             "decode-hopper, hopper-fp8, decode-hopper-fp8, hopper-fp8-products, "
                             "hopper-fp8-prefix-rows, decode-hopper-latent; "
                             "default all, the hopper ones on an sm_90 GPU only)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="processes sharing the matrix (compiles run in parallel; GPU only)")


def run(args):
    import torch
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.asm:
        # Compiles for sm_90 with Triton's own ptxas and cuobjdump: no GPU needed.
        if os.environ.get("TRITON_INTERPRET") == "1":
            print("swattn verify --asm compiles kernels: unset TRITON_INTERPRET")
            return 2
        from . import asm
        if args.fingerprints is not None or args.against:
            return _fingerprints(asm, args)
        report, ok = asm.run(progress=_stderr)
        _emit(report, args.out, "verify_asm.md")
        return 0 if ok else 1
    if args.fingerprints is not None or args.against:
        print("swattn verify: --fingerprints and --against go with --asm", file=sys.stderr)
        return 2
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if args.fp8_accuracy:
        from . import fp8_accuracy
        return fp8_accuracy.run(device)
    from . import identity
    scope = ("GPU matrix" if device == "cuda"
             else "reduced CPU matrix (interpreter, fp16, small shapes)")

    def progress(row):
        print(f"{'ok ' if row.ok else 'BAD'} {row.name}: tight-skip {row.max_abs_tight_skip:.1e} "
              f"tight-none {row.max_abs_tight_none:.1e} err {row.err_tight:.1e} "
              f"({row.seconds:.1f}s)",
              file=sys.stderr, flush=True)

    tables, ok = [], True
    families = args.family
    if families is None:
        hopper = device == "cuda" and torch.cuda.get_device_capability() == (9, 0)
        families = ("extend,unified,decode,extend-fp8,unified-fp8,decode-fp8,decode-latent"
                    + (",hopper,decode-hopper,hopper-fp8,decode-hopper-fp8,hopper-fp8-products,"
                          "hopper-fp8-prefix-rows,decode-hopper-latent"
                       if hopper else ""))
    for family in families.split(","):
        t0 = time.perf_counter()
        rows = _run(identity, device, args, family, progress)
        title = f"{identity.TITLES[family]}: {scope}, {time.perf_counter() - t0:.0f} s"
        tables.append(identity.format_rows(rows, title))
        ok = ok and all(r.ok for r in rows)
        if args.out:  # kept family by family: a run cut short keeps what it finished
            _emit("\n\n".join(tables), args.out, "verify.md", echo=False)
    print("\n\n".join(tables))
    return 0 if ok else 1


def _stderr(line):
    print(line, file=sys.stderr, flush=True)


def _fingerprints(asm, args):
    """Print (``--fingerprints`` alone) or write this tree's fingerprints; ``--against`` an
    earlier tree's, say how many are identical and exit 1 where one differs."""
    import json
    before = None
    if args.against:
        with open(args.against) as f:
            before = json.load(f)
    prints = asm.fingerprints(progress=_stderr)
    if args.fingerprints == "-":
        print(json.dumps(prints, indent=1))
    elif args.fingerprints is not None:
        with open(args.fingerprints, "w") as f:
            json.dump(prints, f, indent=1)
    if before is None:
        return 0
    line, changed = asm.compare_fingerprints(prints, before)
    print(line)
    return 1 if changed else 0


def _emit(report, out_dir, name, echo=True):
    """Print the report, and keep it as ``out_dir/name`` when a folder is given."""
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, name), "w") as f:
            f.write(report + "\n")
    if echo:
        print(report)


def _run(identity, device, args, family, progress):
    if family not in identity.FAMILIES:
        raise SystemExit(f"swattn verify: --family takes {','.join(identity.FAMILIES)}, "
                         f"got {family!r}")
    if args.jobs > 1 and device == "cuda":
        import concurrent.futures
        import multiprocessing
        ctx = multiprocessing.get_context("spawn")
        jobs = [(family, device, args.limit, i, args.jobs) for i in range(args.jobs)]
        with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=ctx) as pool:
            parts = list(pool.map(_shard, jobs))
        order = {row[0]: i for i, row in enumerate(identity.FAMILIES[family][0](True))}
        rows = sorted((r for part in parts for r in part), key=lambda r: order[r.name])
        for row in rows:
            progress(row)
        return rows
    return identity.run(family, device, limit=args.limit, progress=progress)


def _shard(job):
    from . import identity
    family, device, limit, index, count = job
    return identity.run(family, device, limit=limit, shard=(index, count))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="swattn verify", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
