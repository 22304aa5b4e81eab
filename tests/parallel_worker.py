"""One rank of a context-parallel decode check (tests/test_parallel.py runs 2 or 3 of these
over gloo): builds the global batch from a seed, keeps this rank's shard of the cache, runs
swattn.parallel's plan and prints, as JSON, how far its output is from the single-process
decode over the whole cache."""

import argparse
import json
import os

import torch
import torch.distributed as dist

import swattn
from swattn import parallel
from swattn.verify.cases import DecodeCase, build_decode, rel_err

parser = argparse.ArgumentParser()
parser.add_argument("--rank", type=int, required=True)
parser.add_argument("--world", type=int, required=True)
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--case", required=True)
args = parser.parse_args()

CASES = {
    # (seq_lens, window_left, layout, heads, sinks, page_size)
    "window-interleaved": ([70, 9, 50, 33, 1], 20, parallel.Interleaved(1), (4, 2), True, 16),
    "window-interleaved-4": ([70, 9, 50, 33], 13, parallel.Interleaved(4), (4, 1), True, 4),
    "full-contiguous": ([70, 9, 50, 33], None, parallel.Contiguous(24), (4, 2), False, 16),
    # A window inside one rank's chunk: the other ranks see nothing and launch nothing.
    "window-contiguous-idle": ([30, 20], 5, parallel.Contiguous(40), (2, 1), True, 8),
}
lens, window, layout, (hq, hkv), with_sinks, page = CASES[args.case]

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
dist.init_process_group("gloo", rank=args.rank, world_size=args.world)
case = DecodeCase(lens, num_q_heads=hq, num_kv_heads=hkv, head_dim=16, head_dim_v=16,
                  page_size=page, window_left=window, seed=3)
q, k_cache, v_cache, table, seq_lens = build_decode(case, "cpu")
# build_decode leaves rows below each window NaN (and those pages freed): fill the whole
# sequence for the shards, which must hold every position a layout deals them.
g = torch.Generator().manual_seed(4)
full_k = torch.randn(len(lens), max(lens), hkv, 16, generator=g).to(q.dtype)
full_v = torch.randn(len(lens), max(lens), hkv, 16, generator=g).to(q.dtype)
sinks = torch.randn(hq, generator=g) if with_sinks else None

# The single-process reference layout: every sequence's tokens in its own pages.
pages = [-(-s // page) for s in lens]
ref_k = torch.full((sum(pages) + 1, page, hkv, 16), float("nan"), dtype=q.dtype)
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
want = swattn.decode_attention(q, ref_k, ref_v, ref_table, seq_lens, window_left=window,
                               sinks=sinks)

# This rank's shard: its tokens in order, in its own pages.
mine = [[p for p in range(s) if layout.owner(p, args.world) == args.rank] for s in lens]
lpages = [-(-len(m) // page) for m in mine]
loc_k = torch.full((sum(lpages) + 1, page, hkv, 16), float("nan"), dtype=q.dtype)
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
plan = parallel.plan_decode(lens, group=dist.group.WORLD, layout=layout, num_q_heads=hq,
                            num_kv_heads=hkv, head_dim=16, page_size=page, window_left=window,
                            dtype=q.dtype, device="cpu")
got = plan.run(q, loc_k, loc_v, loc_table, sinks=sinks)
print(json.dumps({"rank": args.rank, "err": rel_err(got, want), "nan": bool(torch.isnan(got).any()),
                  "launched": plan.width > 0}))
dist.destroy_process_group()
