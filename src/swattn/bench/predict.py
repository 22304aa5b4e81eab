"""The tile model's prediction of a case, before it runs and beside its measurement: the key
tiles swattn's kernels walk (tight bounds against the skip variant's), from
:mod:`swattn.tiles` and the bounds of :mod:`swattn.window`, at the tiling the plan runs.

* Extend: :func:`tile_prediction`; under a chunk the tile model's chunk bounds, over a tree
  verify the rows' own key ranges from their positions (:func:`position_tiles`, as the
  kernels take a block's bounds under given positions).
* Decode: :func:`decode_tile_prediction`, the keys and tiles of the decode loop (window and
  chunk).
* A second key source (the V4 rows, decode and extend): :func:`second_tile_prediction`, the
  tiles each row's programs walk (window, new keys, the second source's entries) from
  :func:`swattn.tiles.count_second`; every head block of a row walks them (the 64 heads of
  V4's one KV head in blocks of 16: four reads of each tile, the repeats from L2 at best).
* :func:`expected_tiling` / :func:`expected_decode_tiling`: the tiling a plan takes on an
  H200 (sm_90), for a prediction written before any GPU run (``swattn bench --predict``);
  a run's report uses the tiling of the plan that ran.
* :func:`predictions_markdown`: per case the work (visible pairs, FLOPs, bytes), the floor at
  given ceilings and the tiles predicted.

Plain Python: the configs' pure functions, no GPU.
"""

from __future__ import annotations

import io

from ..window import num_tiles, range_bounds, row_key_range

# The H200's ceilings as ANCHORS.md measured them (bf16 matmul 8192^3, device-to-device copy):
# the floor of a prediction written before the run; a run's report measures its own.
ANCHOR_CEILINGS = {"matmul_tflops": 791.0, "copy_gbps": 4266.0}


def position_tiles(prefix, positions, window_left, chunk, tokens_per_block, block_n,
                   bounds="tight"):
    """Key tiles the two-stage kernel walks for one sequence and one head when its new
    tokens sit at ``positions`` under a custom mask (a tree verify): per block of
    ``tokens_per_block`` new tokens, stage 1 from its rows' key ranges over the prefix
    (:func:`swattn.window.row_key_range`, no causal end: the mask replaces causality,
    through :func:`swattn.window.range_bounds`), stage 2 every new key (the mask decides
    which a row sees). ``bounds``: ``"tight"`` or ``"all"`` (the skip variant's)."""
    total = 0
    for start in range(0, len(positions), tokens_per_block):
        rows = [row_key_range(p, 0, prefix, window_left or 0, 0, chunk or 1,
                              window_left is not None, chunk is not None, False, False)
                for p in positions[start:start + tokens_per_block]]
        lo, hi, _, _ = range_bounds([(max(a, 0), b) for a, b in rows], block_n, prefix, bounds)
        total += num_tiles(lo, hi, block_n) + num_tiles(0, len(positions), block_n)
    return total


def tile_prediction(case, block_m=None, block_n=None, tiling=None):
    """Key tiles the two-stage kernel walks, tight vs skip (stage 1 + stage 2, summed over
    query blocks, sequences and heads; swattn.tiles), and their ratio: the predicted
    tight/skip time. ``tiling``: the tiles of the kernel that ran (``ExtendPlan.tiling``:
    where it packs a GQA group into a block's rows, a block holds BLOCK_M / group tokens
    and serves the group); else ``block_m`` x ``block_n`` tiles, one query head a block.
    Under the case's chunk, the tile model's chunk bounds; over a tree verify,
    :func:`position_tiles`.
    """
    from .. import tiles
    if tiling is None:
        tiling = {"block_m": block_m, "block_n": block_n, "tokens_per_block": block_m,
                  "heads": case.num_q_heads}
    if getattr(case, "second", None) is not None:
        return second_tile_prediction(case, tiling)
    block_n, tokens = tiling["block_n"], tiling["tokens_per_block"]
    chunk = getattr(case, "attention_chunk", None)
    if getattr(case, "tree", ()):
        tight = skip = 0
        for prefix, new in case.seqs:
            pos = case.positions(prefix, new)
            tight += position_tiles(prefix, pos, case.window_left, chunk, tokens, block_n)
            skip += position_tiles(prefix, pos, case.window_left, chunk, tokens, block_n, "all")
        tight, skip = tight * tiling["heads"], skip * tiling["heads"]
    masked = None
    if not getattr(case, "tree", ()):
        counts = tiles.count_workload(list(case.seqs), case.window_left, None, True, tokens,
                                      block_n, heads=tiling["heads"], chunk=chunk)
        tight = counts["stage1"]["tight"] + counts["stage2"]["tight"]
        skip = counts["stage1"]["all"] + counts["stage2"]["all"]
        if chunk is not None:
            # A kernel that only masks the chunk: the window's tight bounds alone.
            alone = tiles.count_workload(list(case.seqs), case.window_left, None, True, tokens,
                                         block_n, heads=tiling["heads"])
            masked = alone["stage1"]["tight"] + alone["stage2"]["tight"]
    return {"tight": tight, "skip": skip, "ratio": tight / skip if skip else None,
            "block_m": tiling["block_m"], "block_n": block_n, "tokens_per_block": tokens,
            "chunk_masked_only": masked}


def second_rows(case):
    """``(cached, pos, held)`` of every row of a case with a second source
    (:func:`swattn.tiles.count_second`): a decode row per sequence, an extend row per new
    token."""
    if getattr(case, "kind", "") == "decode":
        return [(s, s - 1, case.second.held(s)) for s in case.seq_lens if s > 0]
    return [(p, q, case.second.held(p + e)) for p, e in case.seqs for q in range(p, p + e)]


def second_tile_prediction(case, tiling):
    """The tiles a second-source case's programs walk, tight against the skip variant's
    (``all``), summed over the rows and ``tiling["heads"]`` programs a row, in the keys of
    both :func:`decode_tile_prediction` (``tight``, ``all``, ``keys``) and
    :func:`tile_prediction` (``skip``, ``block_m`` / ``tokens_per_block`` one row)."""
    from .. import tiles
    source = case.second
    counts = tiles.count_second(second_rows(case), case.window_left, source.rate, source.topk,
                                tiling["block_n"], heads=tiling["heads"])
    tight, every = counts["tiles"]["tight"], counts["tiles"]["all"]
    return {"tight": tight, "all": every, "skip": every, "ratio": tight / every if every else None,
            "keys": counts["keys"]["tight"], "block_n": tiling["block_n"], "aligned": False,
            "block_m": 1, "tokens_per_block": 1, "chunk_masked_only": None}


def decode_tile_prediction(case, tiling):
    """Keys and key tiles the decode loop reads (window, chunk; not S's sparse keys), summed
    over the batch and ``tiling["heads"]`` (one program a KV head reads its keys once):
    ``tight`` (on the Hopper path's grid of 0 where ``tiling["aligned"]``) against ``all``
    (the whole cache, the skip variant's), from :func:`swattn.tiles.count_decode`."""
    if getattr(case, "second", None) is not None:
        return second_tile_prediction(case, tiling)
    from .. import tiles
    counts = tiles.count_decode(list(case.seq_lens), case.window_left, tiling["block_n"],
                                heads=tiling["heads"], chunk=getattr(case, "attention_chunk", None))
    walked = "aligned" if tiling.get("aligned") else "tight"
    tight, every = counts["tiles"][walked], counts["tiles"]["all"]
    return {"tight": tight, "all": every, "ratio": tight / every if every else None,
            "keys": counts["keys"]["tight"], "block_n": tiling["block_n"],
            "aligned": bool(tiling.get("aligned"))}


def expected_second_tiling(case):
    """The tiling of the second-source kernel on an H200 (its plans take the decode
    kernel's CUDA config, extend rows too): keys a tile, and the programs a row (KV heads x
    head blocks), each walking the row's tiles."""
    import torch

    from ..ops import config
    group = case.num_q_heads // case.num_kv_heads
    cfg = config.second_keys_config(case.head_dim, case.head_dim_v, group, torch.bfloat16,
                                    "cuda")
    _, blocks = config.head_blocking(cfg, group)
    return {"block_m": 1, "block_n": cfg.block_n, "tokens_per_block": 1, "aligned": False,
            "heads": case.num_kv_heads * blocks, "path": f"second, {blocks} head blocks"}


def expected_tiling(case):
    """The tiling swattn's tight row walks on an H200 (sm_90), as ``ExtendPlan.tiling``
    reports it: the Hopper path's (``hopper_extend_config``) where a plan takes it (head dims
    64 or 128, no custom mask: a tree verify runs on the Triton kernels), else the Triton
    kernel's CUDA config (``extend_config``), a KV group's query heads packed into a block's
    rows where it packs them."""
    import torch

    from ..ops import config
    from ..ops.extend_hopper import takes_shape
    if getattr(case, "second", None) is not None:
        return expected_second_tiling(case)
    group = case.num_q_heads // case.num_kv_heads
    if not getattr(case, "tree", ()) and takes_shape(case.head_dim, case.head_dim_v,
                                                     case.page_size):
        cfg = config.hopper_extend_config(case.head_dim, torch.bfloat16)
        return {"block_m": cfg.block_m, "block_n": cfg.block_n, "tokens_per_block": cfg.block_m,
                "heads": case.num_q_heads, "path": "hopper"}
    cfg = config.extend_config(case.head_dim, case.head_dim_v, group, case.window_left,
                               torch.bfloat16, "cuda", case.page_size)
    packed = config.packs_gqa(cfg, group)
    return {"block_m": cfg.block_m, "block_n": cfg.block_n,
            "tokens_per_block": cfg.block_m // group if packed else cfg.block_m,
            "heads": case.num_kv_heads if packed else case.num_q_heads, "path": "triton"}


def expected_decode_tiling(case):
    """The decode tiling swattn's tight row takes on an H200 (sm_90): the Hopper path's
    64-key tiles on the grid of 0 where a plan takes it (windows or chunks of at least
    ``min_keys`` keys, head dims 64 or 128, no sparse keys), the latent path's over a latent
    cache, else the Triton kernel's CUDA config; one program's keys a KV head."""
    import torch

    from ..ops import config
    from ..ops.decode_hopper import takes_shape
    if getattr(case, "second", None) is not None:
        return expected_second_tiling(case)
    group = case.num_q_heads // case.num_kv_heads
    if case.latent:
        return {"block_n": config.LatentDecodeConfig().block_n, "heads": case.num_kv_heads,
                "aligned": False, "path": "latent"}
    cfg = config.decode_config(case.head_dim, case.head_dim_v, group, torch.bfloat16, "cuda")
    hopper = config.hopper_decode_config(case.head_dim, torch.bfloat16)
    keys = max(case.window_keys(s) for s in case.seq_lens)
    if (cfg.hopper and keys >= hopper.min_keys and not case.sparse_keys
            and takes_shape(case.head_dim, case.head_dim_v, group, case.page_size,
                            hopper.block_n)):
        return {"block_n": hopper.block_n, "heads": case.num_kv_heads, "aligned": True,
                "path": "hopper"}
    return {"block_n": cfg.block_n, "heads": case.num_kv_heads, "aligned": False,
            "path": "triton"}


def floor_us(flops, nbytes, ceilings):
    """``max(FLOPs / matmul ceiling, bytes / copy ceiling)`` in microseconds."""
    compute = flops / (ceilings["matmul_tflops"] * 1e12)
    memory = nbytes / (ceilings["copy_gbps"] * 1e9)
    return 1e6 * max(compute, memory)


def predictions_markdown(cases, ceilings=ANCHOR_CEILINGS):
    """Per case, before it runs: its work (visible pairs over the query heads, GFLOP, MB),
    the floor at ``ceilings`` and the tiles predicted at the tiling the plan takes on an H200
    (:func:`expected_tiling`, :func:`expected_decode_tiling`)."""
    out = io.StringIO()
    w = out.write
    w(f"# Predictions (tile model; floor at {ceilings['matmul_tflops']:.0f} TFLOP/s and "
      f"{ceilings['copy_gbps']:.0f} GB/s)\n\n")
    w("| case | batch | visible pairs | GFLOP | MB | floor us | tiling | tiles tight / skip "
      "(ratio) | fp8 KV: MB, floor us |\n|---|---|---|---|---|---|---|---|---|\n")
    for case in cases:
        floor = floor_us(case.flops(), case.bytes_moved(), ceilings)
        fp8_bytes = case.bytes_moved(kv_element_size=1)
        fp8 = f"{fp8_bytes / 1e6:.1f}, {floor_us(case.flops(), fp8_bytes, ceilings):.1f}"
        if getattr(case, "kind", "") == "decode":
            tiling = expected_decode_tiling(case)
            pred = decode_tile_prediction(case, tiling)
            how = (f"{tiling['path']} BN{tiling['block_n']}"
                   + (", aligned" if pred["aligned"] else ""))
            walked = f"{pred['tight']:,} / {pred['all']:,} ({pred['ratio']:.3f})"
        else:
            tiling = expected_tiling(case)
            pred = tile_prediction(case, tiling=tiling)
            how = (f"{tiling['path']} {tiling['block_m']}x{tiling['block_n']}, "
                   f"{tiling['tokens_per_block']} tokens a block")
            if getattr(case, "second", None) is not None:
                how = f"{tiling['path']} BN{tiling['block_n']}, a row a program"
            walked = f"{pred['tight']:,} / {pred['skip']:,} ({pred['ratio']:.3f})"
            if pred["chunk_masked_only"] is not None:
                walked += f"; the chunk masked only: {pred['chunk_masked_only']:,}"
        w(f"| {case.name} | {case.batch} | {case.visible_pairs() * case.num_q_heads / 1e6:.1f}M "
          f"| {case.flops() / 1e9:.1f} | {case.bytes_moved() / 1e6:.1f} | {floor:.1f} | {how} "
          f"| {walked} | {fp8} |\n")
    return out.getvalue()
