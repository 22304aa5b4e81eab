"""One rank of a context-parallel decode or extend check (tests/test_parallel.py runs 2 or 3
of these over gloo, or 2 over NCCL on two GPUs): builds the global batch from a seed, keeps
this rank's shard of the cache (for extend: the prefix and the chunk's new tokens, as their
owners write them), runs swattn.parallel's plan and prints, as JSON, how far its output is
from the single-process call over the whole cache. A case named with ``-fp8`` (e4m3fn, a
scale a KV head) or ``-e5m2`` (one scale) quantizes both caches, the shards and the whole
one, with the same scales."""

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

import swattn
from swattn import parallel, reference
from swattn.verify.cases import DecodeCase, build_decode, rel_err

parser = argparse.ArgumentParser()
parser.add_argument("--rank", type=int, required=True)
parser.add_argument("--world", type=int, required=True)
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--case", required=True)
parser.add_argument("--device", default="cpu")
parser.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
args = parser.parse_args()
dev = torch.device(args.device)
if args.backend == "nccl":
    dev = torch.device("cuda", args.rank)  # a GPU a rank
    torch.cuda.set_device(dev)
elif dev.type == "cuda":
    torch.cuda.set_device(0)  # every rank on the one GPU (gloo moves the partial states)


def on(t):
    """``t`` (the inputs are built on the CPU from the seeds) on the run's device."""
    return None if t is None else t.to(dev)


CASES = {
    # (seq_lens, window_left, layout, heads, sinks, page_size)
    "window-interleaved": ([70, 9, 50, 33, 1], 20, parallel.Interleaved(1), (4, 2), True, 16),
    # (Six query heads: three ranks share them under merge="reduce-scatter".)
    "window-interleaved-4": ([70, 9, 50, 33], 13, parallel.Interleaved(4), (6, 1), True, 4),
    "full-contiguous": ([70, 9, 50, 33], None, parallel.Contiguous(24), (4, 2), False, 16),
    # A window inside one rank's chunk: the other ranks see nothing and launch nothing.
    "window-contiguous-idle": ([30, 20], 5, parallel.Contiguous(40), (2, 1), True, 8),
    # Chunked attention (CHUNKED below): every run as sparse keys.
    "chunk-interleaved": ([70, 9, 50, 33, 1], 20, parallel.Interleaved(2), (4, 2), True, 8),
}
# Extend: (prefix_lens, extend_lens, window_left, layout, heads, sinks, page_size).
EXTEND_CASES = {
    "extend-window-interleaved": ([40, 0, 25, 3], [13, 30, 1, 22], 20, parallel.Interleaved(1),
                                  (4, 2), True, 16),
    "extend-window-interleaved-4": ([50, 9], [20, 7], 13, parallel.Interleaved(4), (4, 1), True,
                                    4),
    "extend-full-interleaved": ([33, 0], [17, 40], None, parallel.Interleaved(2), (4, 2), True, 8),
    "extend-full-contiguous": ([30, 0], [25, 40], None, parallel.Contiguous(24), (4, 2), False,
                               16),
    # The window crosses the chunks' edges: runs of every length on the middle rank.
    "extend-window-contiguous": ([30, 4], [26, 20], 12, parallel.Contiguous(20), (4, 2), True, 8),
    # Every window inside rank 0's chunk: the other ranks launch nothing.
    "extend-window-contiguous-idle": ([10, 5], [8, 6], 5, parallel.Contiguous(40), (2, 1), True,
                                      8),
    # Heads of 64 (the GPU runs them on its Hopper path where it has one).
    "extend-window-interleaved-d64": ([300, 40], [70, 130], 100, parallel.Interleaved(2),
                                      (4, 2), True, 16),
    "extend-full-contiguous-d64": ([200, 0], [90, 150], None, parallel.Contiguous(160),
                                   (4, 2), True, 16),
    "extend-chunk-interleaved": ([40, 0, 25], [13, 30, 22], None, parallel.Interleaved(1),
                                 (4, 2), True, 8),
}
# Chunked local attention's chunk of a case (attention_chunk), None elsewhere.
CHUNKED = {"chunk-interleaved": 16, "extend-chunk-interleaved": 12}
FP8 = {"fp8": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}.get(args.case.rsplit("-", 1)[-1])
name = args.case.rsplit("-", 1)[0] if FP8 else args.case
D = 64 if name.endswith("-d64") else 16
EXTEND = name in EXTEND_CASES
if EXTEND:
    prefix, new, window, layout, (hq, hkv), with_sinks, page = EXTEND_CASES[name]
    lens = [a + b for a, b in zip(prefix, new)]
else:
    lens, window, layout, (hq, hkv), with_sinks, page = CASES[name]
chunk = CHUNKED.get(name)

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
dist.init_process_group(args.backend, rank=args.rank, world_size=args.world)
case = DecodeCase(lens, num_q_heads=hq, num_kv_heads=hkv, head_dim=D, head_dim_v=D,
                  page_size=page, window_left=window, seed=3)
q, k_cache, v_cache, table, seq_lens = build_decode(case, "cpu")
# build_decode leaves rows below each window NaN (and those pages freed): fill the whole
# sequence for the shards, which must hold every position a layout deals them.
g = torch.Generator().manual_seed(4)
full_k = torch.randn(len(lens), max(lens), hkv, D, generator=g).to(q.dtype)
full_v = torch.randn(len(lens), max(lens), hkv, D, generator=g).to(q.dtype)
sinks = torch.randn(hq, generator=g) if with_sinks else None

# The single-process reference layout: every sequence's tokens in its own pages.
pages = [-(-s // page) for s in lens]
ref_k = torch.full((sum(pages) + 1, page, hkv, D), float("nan"), dtype=q.dtype)
ref_v = ref_k.clone()
ref_table = torch.full((len(lens), max(pages) + 1), -1, dtype=torch.int32)
nxt = 1
for b, s in enumerate(lens):
    for i in range(pages[b]):
        ref_table[b, i] = nxt
        rows = slice(i * page, min((i + 1) * page, s))
        ref_k[nxt, :rows.stop - rows.start] = full_k[b, rows]
        ref_v[nxt, :rows.stop - rows.start] = full_v[b, rows]
        nxt += 1
if EXTEND:
    # The prefixes in the cache (the new tokens' rows left NaN), the new tokens as k and v.
    for b, (a, n) in enumerate(zip(prefix, new)):
        for j in range(a, a + n):
            ref_k[ref_table[b, j // page], j % page] = float("nan")
            ref_v[ref_table[b, j // page], j % page] = float("nan")
    q = torch.randn(sum(new), hq, D, generator=g).to(full_k.dtype)
    k = torch.cat([full_k[b, a:a + n] for b, (a, n) in enumerate(zip(prefix, new))])
    v = torch.cat([full_v[b, a:a + n] for b, (a, n) in enumerate(zip(prefix, new))])
    cu = torch.tensor([0] + list(torch.tensor(new).cumsum(0)), dtype=torch.int32)

# This rank's shard: its tokens in order, in its own pages.
mine = [[p for p in range(s) if layout.owner(p, args.world) == args.rank] for s in lens]
lpages = [-(-len(m) // page) for m in mine]
loc_k = torch.full((sum(lpages) + 1, page, hkv, D), float("nan"), dtype=q.dtype)
loc_v = loc_k.clone()
loc_table = torch.full((len(lens), max(lpages + [0]) + 1), -1, dtype=torch.int32)
nxt = 1
for b, m in enumerate(mine):
    for j, p in enumerate(m):
        if j % page == 0:
            loc_table[b, j // page] = nxt
            nxt += 1
        loc_k[loc_table[b, j // page], j % page] = full_k[b, p]
        loc_v[loc_table[b, j // page], j % page] = full_v[b, p]
if window is not None:
    # Pages wholly below every query's window freed: their entries -1, their rows NaN (the
    # replanned decode below reads 7 keys lower).
    for b, s in enumerate(lens):
        lowest = max((prefix[b] if EXTEND else s - 8) - window, 0)
        for i in range(layout.local_len(lowest, args.rank, args.world) // page):
            loc_k[loc_table[b, i]] = float("nan")
            loc_v[loc_table[b, i]] = float("nan")
            loc_table[b, i] = -1
scales = {}
if FP8:
    # The caches as fp8 (NaN rows stay NaN); the single-process call quantizes the new
    # tokens with the same scales, so both see the same values.
    per_head = FP8 is torch.float8_e4m3fn
    k_scale = torch.tensor([1 / 64, 1 / 32][:hkv] if per_head else [1 / 20])
    v_scale = torch.tensor([1 / 48, 1 / 24][:hkv] if per_head else [1 / 16])
    ref_k, ref_v, loc_k, loc_v = (reference.quantize(x, s, FP8) for x, s in (
        (ref_k, k_scale), (ref_v, v_scale), (loc_k, k_scale), (loc_v, v_scale)))
    scales = dict(k_scale=on(k_scale), v_scale=on(v_scale))
if EXTEND:
    want = swattn.extend_attention(on(q), on(k), on(v), on(ref_k), on(ref_v), on(ref_table),
                                   on(cu), on(torch.tensor(prefix, dtype=torch.int32)),
                                   window_left=window, attention_chunk=chunk, sinks=on(sinks),
                                   **scales)
else:
    want = swattn.decode_attention(on(q), on(ref_k), on(ref_v), on(ref_table), on(seq_lens),
                                   window_left=window, attention_chunk=chunk, sinks=on(sinks),
                                   **scales)
sizes = dict(group=dist.group.WORLD, layout=layout, num_q_heads=hq, num_kv_heads=hkv,
             head_dim=D, page_size=page, window_left=window, dtype=q.dtype, device=dev,
             kv_dtype=FP8, attention_chunk=chunk)


def make(**kw):
    return (parallel.plan_extend(prefix, new, **sizes, **kw) if EXTEND
            else parallel.plan_decode(lens, **sizes, **kw))


plan = make()
shard = (on(q), on(loc_k), on(loc_v), on(loc_table))
got = plan.run(*shard, sinks=on(sinks), **scales)
# The deterministic merge: the weighted parts added in rank order, which this rank redoes
# from every rank's partial state (gathered here) and must match bit for bit.
det = make(deterministic=True).run(*shard, sinks=on(sinks), **scales)
part, lse = plan.partial(*shard, **scales)
parts = [torch.empty_like(part) for _ in range(args.world)]
lses = [torch.empty_like(lse) for _ in range(args.world)]
dist.all_gather(parts, part)
dist.all_gather(lses, lse)
denom = torch.logsumexp(torch.stack(lses), dim=0)
if sinks is not None:
    denom = torch.logaddexp(denom, on(sinks).float()[None, :])
ordered = None
for p_r, l_r in zip(parts, lses):
    term = p_r.float() * torch.where(l_r == float("-inf"), 0.0, torch.exp(l_r - denom))[..., None]
    ordered = term if ordered is None else ordered + term
if hq % args.world == 0:
    # merge="reduce-scatter": this rank's share of the heads, from the same partial states;
    # deterministic, the same bits as the rank-order sum's share.
    share = slice(args.rank * hq // args.world, (args.rank + 1) * hq // args.world)
    rs = make(merge="reduce-scatter").merge(part, lse, sinks=on(sinks))
    rs_det = make(merge="reduce-scatter", deterministic=True).merge(part, lse, sinks=on(sinks))
    into = make(merge="reduce-scatter").merge(part, lse, sinks=on(sinks),
                                              out=torch.empty_like(rs))
    scattered = {"rs_err": rel_err(rs, want[:, share]),
                 "rs_shape": list(rs.shape) == [want.shape[0], hq // args.world, D],
                 "rs_det_in_rank_order": bool(torch.equal(rs_det,
                                                          ordered[:, share].to(rs_det.dtype))),
                 "rs_out": bool(torch.equal(into, rs))}
result = {"rank": args.rank, "err": rel_err(got, want), "nan": bool(torch.isnan(got).any()),
          "launched": plan.launched, "sparse": plan.sparse_keys,
          "path": plan.inner.path if plan.inner is not None else None,
          "det_err": rel_err(det, want),
          "det_in_rank_order": bool(torch.equal(det, ordered.to(det.dtype)))}
if hq % args.world == 0:
    result.update(scattered)
if EXTEND:
    # The plan replanned in place for a shorter chunk, one sequence dropped (fewer than the
    # plan's sequences and tokens: the rest padded), against the single process on those.
    new2 = [max(n - 5, 1) for n in new][:-1] if len(new) > 2 else [max(n - 5, 1) for n in new]
    prefix2 = prefix[:len(new2)]
    plan.replan(prefix2, new2)
    starts = [0] + list(torch.tensor(new).cumsum(0))
    rows = torch.cat([torch.arange(a, a + n) for a, n in zip(starts, new2)])
    q2 = torch.zeros_like(q)
    q2[:len(rows)] = q[rows]
    again = plan.run(on(q2), *shard[1:], sinks=on(sinks), **scales)
    cu2 = torch.tensor([0] + list(torch.tensor(new2).cumsum(0)), dtype=torch.int32)
    want2 = swattn.extend_attention(on(q[rows]), on(k[rows]), on(v[rows]), on(ref_k), on(ref_v),
                                    on(ref_table[:len(new2)]), on(cu2),
                                    on(torch.tensor(prefix2, dtype=torch.int32)),
                                    window_left=window, attention_chunk=chunk, sinks=on(sinks),
                                   **scales)
    result.update(replan_err=rel_err(again[:len(rows)], want2),
                  replan_nan=bool(torch.isnan(again).any()),
                  pad_zero=bool((again[len(rows):] == 0).all()))
else:
    # The plan replanned in place for shorter sequences, one emptied (fewer than the plan's
    # sequences: the rest padded), against the single process on those lengths.
    short = [max(n - 7, 0) for n in lens]
    short[0] = 0
    short = short[:-1] if len(short) > 2 else short
    plan.replan(short)  # (shorter: a rank that launched nothing still has no work)
    again = plan.run(*shard, sinks=on(sinks), **scales)[:len(short)]
    want2 = swattn.decode_attention(on(q[:len(short)]), on(ref_k), on(ref_v),
                                    on(ref_table[:len(short)]),
                                    on(torch.tensor(short, dtype=torch.int32)),
                                    window_left=window, attention_chunk=chunk, sinks=on(sinks),
                                   **scales)
    result.update(replan_err=rel_err(again, want2), replan_nan=bool(torch.isnan(again).any()))
print(json.dumps(result), flush=True)
# Every rank done with the group before any leaves, and no teardown of gloo's threads at
# exit: a rank whose peer closed the connections first could abort in it ("terminate called
# without an active exception"), seen once in about twenty runs.
dist.barrier()
sys.stdout.flush()
os._exit(0)
