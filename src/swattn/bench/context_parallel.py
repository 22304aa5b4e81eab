"""``swattn bench --parallel``: context-parallel decode and extend (swattn.parallel) timed on
1 or more GPUs: each rank's kernel time (``plan.partial``) and merge time (``plan.merge``: the
collectives) apart, the keys each rank attends to against those of a single GPU, and which
ranks launch nothing.

It starts ``--world`` processes itself (one a GPU, NCCL; or gloo on the CPU under the
interpreter for a smoke run) and prints one markdown row a rank and workload. Each rank
builds only its own shard of a synthetic cache (random keys and values, seeded by rank),
so a long context costs each GPU its share of the memory. ``--same-gpu`` puts every rank on
GPU 0 over gloo: the ranks time their kernels in turns (each rank's kernel at its real share,
on a machine with one GPU), and the merge times are gloo's through the host, not NCCL's.
At world 1 on a GPU the plain single-GPU call (``swattn.plan_decode``/``plan_extend`` on the
whole cache, the plan's own kernel choice) is timed beside it, turn by turn. On a GPU the
kernel and the single-GPU call are CUDA-graph replays, each after an L2 flush, after half a
second of untimed replays (``swattn.bench.harness.interleave``); merge and run are eager calls.

    swattn bench --parallel --world 2                       # 128k, every workload
    swattn bench --parallel --world 1                       # the single-GPU baseline
    swattn bench --parallel --world 2 --same-gpu            # the ranks' kernels, one GPU
    swattn bench --parallel --world 2 --device cpu --context 96 --batch 2 --chunk 8 \\
        --reps 1                                            # a CPU smoke run (gloo)

Workloads: decode and extend (a chunk of ``--chunk`` new tokens ending at the context), with
gpt-oss heads (64 query heads, 8 KV heads of 64, sinks) and Mistral heads (32 / 8 of 128),
full attention and a 4096-key window, the tokens interleaved one by one across the ranks
(``--layout contiguous``: each rank a range, where the window leaves ranks idle); ``--fp8``
keeps every cache in e4m3fn with a scale a KV head (the queries in bf16), ``--fp8-products``
with extend's opt-in fp8 products (the parallel plan and the single-GPU call alike);
``--merge reduce-scatter`` merges each rank's share of the heads instead of the whole output.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import torch

HEADS = {"gpt-oss": (64, 8, 64, True), "mistral": (32, 8, 128, False)}


def parse(argv, prog):
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--context", type=int, default=131072, help="tokens a sequence")
    p.add_argument("--batch", type=int, default=8, help="decode sequences")
    p.add_argument("--chunk", type=int, default=4096, help="extend: new tokens (one sequence)")
    p.add_argument("--window", type=int, default=4096, help="the window's keys (0: none)")
    p.add_argument("--page", type=int, default=16)
    p.add_argument("--layout", default="interleaved", choices=("interleaved", "contiguous"),
                   help="tokens dealt one by one, or each rank a contiguous range")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--kinds", default="decode,extend")
    p.add_argument("--same-gpu", action="store_true",
                   help="every rank on GPU 0 over gloo, the kernels timed in turns")
    p.add_argument("--heads", default="gpt-oss,mistral")
    p.add_argument("--fp8", action="store_true", help="the caches in float8_e4m3fn")
    p.add_argument("--merge", default="all-reduce", choices=("all-reduce", "reduce-scatter"),
                   help="the plans' merge: the whole output on every rank, or each rank's "
                        "share of the heads")
    p.add_argument("--fp8-products", action="store_true",
                   help="with --fp8, extend's products in fp8 (plan_extend(fp8_products=True))")
    p.add_argument("--pages", default="shuffled", choices=("shuffled", "in-order"),
                   help="each rank's pages in a seeded random order (as an engine's pool "
                        "hands them out), or sequence after sequence in address order")
    p.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.fp8_products and not args.fp8:
        p.error("--fp8-products needs --fp8")
    return args


# An fp8 cache's scale of every KV head (random normal keys and values, stored times 32).
FP8_SCALE = 1 / 32


def shard(layout, rank, world, lengths, hkv, d, page, dtype, device, seed, shuffled=True):
    """This rank's cache of the sequences' ``lengths``: its tokens at local positions, random,
    its pages in a seeded random order (``shuffled``) or sequence after sequence;
    ``(k_cache, v_cache, block_table)``; an fp8 ``dtype`` holds them divided by FP8_SCALE."""
    local = [int(layout.local_len(n, rank, world)) for n in lengths]
    pages = [-(-n // page) for n in local]
    total = max(sum(pages), 1)
    g = torch.Generator(device=device).manual_seed(seed + rank)
    unit = FP8_SCALE if dtype.itemsize == 1 else 1.0
    k = (torch.randn(total, page, hkv, d, generator=g, device=device) / unit).to(dtype)
    v = (torch.randn(total, page, hkv, d, generator=g, device=device) / unit).to(dtype)
    table = torch.full((len(lengths), max(pages + [1])), -1, dtype=torch.int32)
    order = torch.arange(total, dtype=torch.int32)
    if shuffled:
        order = torch.randperm(total, generator=torch.Generator().manual_seed(seed + rank)).int()
    start = 0
    for b, n in enumerate(pages):
        table[b, :n] = order[start:start + n]
        start += n
    return k, v, table.to(device)


def graph_times(fns, reps, device):
    """``{name: median microseconds}`` of each of ``fns`` (``{name: fn}``) captured in a CUDA
    graph, each replay timed after an L2 flush, the variants turn by turn after half a second of
    untimed replays (swattn.bench.harness.interleave: the clocks settle first and no
    variant always runs first), two rounds; so a short kernel's time is not its host's."""
    from swattn.bench import harness
    replays = {}
    for name, fn in fns.items():
        replays[name], _, note = harness.capture(fn)
        if note:
            print(note, file=sys.stderr)
    times, errors = harness.interleave(replays, reps, 2, harness.Flush(device))
    if errors:
        raise RuntimeError(f"timing failed: {errors}")
    return {name: statistics.median(sum(rounds, [])) for name, rounds in times.items()}


def timed(fn, reps, device, graphed=False):
    """Median microseconds of ``fn()`` over ``reps`` calls (CUDA events on the GPU);
    ``graphed``: on the GPU as :func:`graph_times` times it."""
    if graphed and device.type == "cuda":
        return graph_times({"fn": fn}, reps, device)["fn"]
    times = []
    for _ in range(reps + 1):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) * 1000)
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
    times = sorted(times[1:])  # the first call compiles
    return times[len(times) // 2]


def in_turns(args, group, fn):
    """``fn()`` on each rank in turn (``--same-gpu``: one rank's kernels on the GPU at a
    time), else at once; its value on this rank."""
    if not args.same_gpu:
        return fn()
    import torch.distributed as dist
    value = None
    for r in range(args.world):
        dist.barrier(group=group)
        if r == args.rank:
            value = fn()
    dist.barrier(group=group)
    return value


def plain(q, k, v, table, lengths, args, hq, hkv, d, w, sinks, kind, dtype, device, g, scales):
    """The single-GPU call on this (whole) cache, the plan's own kernel, as a function."""
    import swattn
    sizes = dict(num_q_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=args.page,
                 window_left=None if w is None else w - 1, kv_dtype=k.dtype, dtype=dtype,
                 device=device)
    if kind == "decode":
        plan = swattn.plan_decode(lengths, **sizes)
        return lambda: plan.run(q, k, v, table, sinks=sinks, **scales)
    plan = swattn.plan_extend([0, args.chunk], [args.context - args.chunk],
                              fp8_products=args.fp8_products, **sizes)
    new_k = torch.randn(args.chunk, hkv, d, generator=g, device=device).to(dtype)
    new_v = torch.randn(args.chunk, hkv, d, generator=g, device=device).to(dtype)
    return lambda: plan.run(q, new_k, new_v, k, v, table, sinks=sinks, **scales)


def workload(args, group, layout, heads, kind, w, dtype, device):
    """One workload on this rank: its plan timed (kernel, merge, the whole run) and its
    keys against one GPU's."""
    from swattn import parallel
    hq, hkv, d, with_sinks = HEADS[heads]
    g = torch.Generator(device=device).manual_seed(7)
    sinks = torch.randn(hq, generator=g, device=device) if with_sinks else None
    lengths = [args.context] * (args.batch if kind == "decode" else 1)
    kv_dtype = torch.float8_e4m3fn if args.fp8 else dtype
    k, v, table = shard(layout, args.rank, args.world, lengths, hkv, d, args.page, kv_dtype,
                        device, 11, args.pages == "shuffled")
    scales = {}
    if args.fp8:
        unit = torch.full((hkv,), FP8_SCALE, dtype=torch.float32, device=device)
        scales = dict(k_scale=unit, v_scale=unit)
    sizes = dict(group=group, layout=layout, num_q_heads=hq, num_kv_heads=hkv, head_dim=d,
                 page_size=args.page, window_left=None if w is None else w - 1,
                 kv_dtype=kv_dtype, dtype=dtype, device=device, merge=args.merge)
    if kind == "decode":
        plan = parallel.plan_decode(lengths, **sizes)
    else:
        plan = parallel.plan_extend([args.context - args.chunk], [args.chunk],
                                    fp8_products=args.fp8_products, **sizes)
    q = torch.randn(plan.capacity, hq, d, generator=g, device=device).to(dtype)
    state = {}

    def compute():
        state["part"] = plan.partial(q, k, v, table, **scales)

    def merge():
        plan.merge(*state["part"], sinks=sinks)

    plain_us = None
    if args.world == 1 and device.type == "cuda":
        # The kernel and the single-GPU call timed turn by turn.
        got = graph_times({"kernel": compute, "plain": plain(
            q, k, v, table, lengths, args, hq, hkv, d, w, sinks, kind, dtype, device, g,
            scales)}, args.reps, device)
        compute_us, plain_us = got["kernel"], got["plain"]
    else:
        compute_us = in_turns(args, group,
                              lambda: timed(compute, args.reps, device, graphed=True))
    merge_us = timed(merge, args.reps, device)
    total_us = timed(lambda: plan.run(q, k, v, table, sinks=sinks, **scales), args.reps, device)
    # The (query, key) pairs of one GPU holding every token, for the share.
    if kind == "decode":
        whole = sum(min(n, w or n) for n in lengths)
    else:
        whole = sum(min(args.context - args.chunk + i + 1, w or args.context)
                    for i in range(args.chunk))
    return {"rank": args.rank, "world": args.world, "kind": kind, "heads": heads, "window": w,
            "compute_us": compute_us, "merge_us": merge_us, "total_us": total_us,
            "keys": plan.keys, "keys_one_gpu": whole, "launched": plan.launched,
            "sparse_keys": plan.sparse_keys, "plain_us": plain_us}


def rank_main(args):
    import torch.distributed as dist

    from swattn import parallel
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", 0 if args.same_gpu else args.rank)
        torch.cuda.set_device(device)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    nccl = device.type == "cuda" and not args.same_gpu
    dist.init_process_group("nccl" if nccl else "gloo", rank=args.rank, world_size=args.world)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float16
    layout = (parallel.Interleaved(1) if args.layout == "interleaved"
              else parallel.Contiguous(-(-args.context // args.world)))
    window = args.window or None
    for heads in args.heads.split(","):
        for kind in args.kinds.split(","):
            for w in dict.fromkeys((None, window)):
                row = workload(args, dist.group.WORLD, layout, heads, kind, w, dtype, device)
                print(json.dumps(row), flush=True)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # no teardown of the group's threads at exit (see tests/parallel_worker.py)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None, prog=None):
    """Start ``--world`` ranks (this module, each with ``--rank``), print their rows as one
    markdown table; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv, prog or "swattn bench --parallel")
    if args.rank is not None:
        return rank_main(args)
    port = free_port()
    env = dict(os.environ)
    if args.device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    # The ranks import the swattn this process runs, installed or not.
    import swattn
    root = os.path.dirname(os.path.dirname(os.path.abspath(swattn.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    procs = [subprocess.Popen([sys.executable, "-m", "swattn.bench.context_parallel", *argv,
                               "--rank", str(r),
                               "--port", str(port)], stdout=subprocess.PIPE, text=True, env=env)
             for r in range(args.world)]
    rows = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode:
            print(f"a rank failed (exit {p.returncode})", file=sys.stderr)
            return 1
        rows += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    where = ("every rank on GPU 0, gloo (merge through the host)" if args.same_gpu
             else args.device)
    print(f"context {args.context}, {args.world} rank(s), {where}, {args.layout} layout, "
          f"{args.pages} pages" + (", float8_e4m3fn caches" if args.fp8 else "")
          + (", extend's fp8 products" if args.fp8_products else "")
          + (", reduce-scatter merge" if args.merge == "reduce-scatter" else "")
          + ("; kernel and single-GPU call: CUDA-graph replays after an L2 flush"
             if args.device == "cuda" else ""))
    print("| kind | heads | window | rank | kernel us | merge us | run us | keys | "
          "share of one GPU's keys | launched | sparse width | single-GPU call us |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["kind"], r["heads"], r["window"] or 0, r["rank"])):
        share = r["keys"] / r["keys_one_gpu"] if r["keys_one_gpu"] else 0.0
        single = "" if r["plain_us"] is None else f"{r['plain_us']:.1f}"
        print(f"| {r['kind']} | {r['heads']} | {r['window'] or 'full'} | {r['rank']} | "
              f"{r['compute_us']:.1f} | {r['merge_us']:.1f} | {r['total_us']:.1f} | "
              f"{r['keys']} | {share:.3f} | {r['launched']} | {r['sparse_keys']} | "
              f"{single} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
