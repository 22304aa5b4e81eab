"""Two-stage extend attention over a paged prefix.

For every query block (BLOCK_M new tokens under one query head, or, packed, BLOCK_M /
group tokens under every head of a KV group so each K/V tile is read once for the group),
one program walks stage 1, the cached prefix through the block table, then stage 2, the
new tokens' own keys, into one online-softmax state. Both loops start at the first key
tile that can hold a visible key (``window.first_key_tile``) and end at the last one any
row sees, so a chunk over a long prefix costs what its window costs, whatever prefix the
block table covers; inside, the tiles every row sees whole (``window.full_tile_range``)
run without the mask. ``bounds="skip"`` (every tile, matrix work skipped where fully masked:
SGLang's SKIP_TILE) and ``bounds="none"`` (every tile, all work under the mask) exist so the
claim that the bounds change nothing is checked bit for bit.

With ``key_ranges`` (stage 1 alone, no window or causal rule) each query row sees its own
range of cached keys, ``[key_lo[t], key_hi[t])``: a rank's local keys under context
parallelism (swattn.parallel), where a query's window and causal end fall between local
positions a layout deals out. A block walks from the tile of the lowest key its rows see to
the highest key end, mask-free where every row sees the tile whole
(``window.range_bounds``).
"""

import functools
from collections import namedtuple
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..window import clamp_extent
from ._common import (
    FP32_PRODUCTS,
    KeyRange,
    PagedCache,
    RowPos,
    causal_key_end,
    finish,
    first_key_tile,
    fp8_cached,
    full_tiles_end,
    full_tiles_start,
    launch_extents,
    load_keys,
    load_rows,
    load_whole,
    mask_ok,
    new_lengths,
    position_keep,
    range_bounds,
    range_keep,
    right_key_end,
    row_key_range,
    scores_log2,
    softmax_step,
    table_column,
    valid_page,
    visible,
    visible_key_end,
)
from ._launch import Descriptor, Launch
from ._tma import row_descriptor, tma_rows
from .config import BOUNDS, Config, HopperExtendConfig, dot_side, packs_gqa  # noqa: F401

# The arguments the tile loops share, bundled once by the kernel (a namedtuple compiles to
# its fields: no code of its own). Adding an argument is an edit to its bundle, not to
# every helper's signature.
# The cache travels as _common.PagedCache.
# RANGES: a loop's rows carry their key ranges (_common.KeyRange: key_ranges, or rows'
# ranges under chunked attention and given positions); POSITIONS: given positions, the
# new keys' masks by position (_common.position_keep); UNIFIED: the single-pass kernel.
ExtendFlags = namedtuple("ExtendFlags", "BLOCK_N USE_WINDOW IS_CAUSAL USE_RIGHT USE_MASK "
                         "USE_SOFTCAP TIGHT SKIP EVEN_D EVEN_DV TMA_NEW TMA_CACHE KV "
                         "RANGES USE_CHUNK POSITIONS UNIFIED RING")  # constexprs
# What a row sees; ``positions``: the new tokens' positions (given positions only).
ExtendRule = namedtuple("ExtendRule", "qk_scale softcap window_left window_right mask chunk "
                        "positions")
# A tile's offsets and masks ([BN], [BD], [BDV]) and the head's TMA columns.
ExtendLanes = namedtuple("ExtendLanes", "o_n o_d o_dv m_d m_dv col_k col_v")
# The block's sequence and KV head, where its tokens start, its lengths, its mask rows.
Seq = namedtuple("Seq", "i_seq i_kvh seq_start prefix_len extend_len mask_row")
# The new tokens' k and v; with an fp8 cache they are taken as the cache stores them
# (_common.fp8_cached with the head's k_scale, v_scale).
NewKeys = namedtuple("NewKeys", "k v stride_kt stride_kh stride_vt stride_vh desc_k desc_v k_scale "
                     "v_scale")
# One stage's source of mask-free tiles (_whole_tiles): the head's K and V rows, a row's
# stride and a slot's (cache) or 0 (new tokens), the first row, the block-table row.
Source = namedtuple("Source", "desc_k desc_v k v stride_k stride_ks stride_v stride_vs row0 "
                    "bt_row page_size num_pages k_scale v_scale ring")


@triton.jit
def _position_keep(q_rows, k_idx, k_pos, key_end, rule, flags):
    """_common.position_keep with the launch's window and chunk."""
    return position_keep(q_rows, k_idx, k_pos, key_end, rule.window_left, rule.window_right,
                         rule.chunk, flags.USE_WINDOW, flags.USE_CHUNK, flags.IS_CAUSAL,
                         flags.USE_RIGHT)


@triton.jit
def _stage_bounds(first_q, last_q, range_end, rule, flags):
    """(lo, hi) of one loop, as window.key_bounds: tight, all (skip) or none."""
    lo = 0
    hi = range_end
    if flags.TIGHT:
        if flags.IS_CAUSAL:
            hi = causal_key_end(last_q, range_end)
        elif flags.USE_RIGHT:
            hi = right_key_end(last_q, rule.window_right, range_end)
        if flags.USE_WINDOW:
            lo = first_key_tile(first_q, rule.window_left, flags.BLOCK_N)
            hi = visible_key_end(first_q, rule.window_left, lo, hi)
    elif flags.SKIP:
        if flags.IS_CAUSAL:
            hi = causal_key_end(last_q, range_end)
    return lo, hi


@triton.jit
def _fold_tile(b_q, b_k, b_v, keep, m_i, l_i, acc, rule, flags, MASKED: tl.constexpr):
    """Fold one loaded key tile (b_k: [BN, BD], b_v: [BN, BDV]) into the state; ``keep``
    applies where MASKED. An fp8 cache's tiles are converted to the queries' type for the
    products (exactly)."""
    if flags.KV.is_fp8():
        b_k = b_k.to(b_q.dtype)
        b_v = b_v.to(b_q.dtype)
    if b_q.dtype == tl.float32:  # fp32 products in fp32 (see _common.FP32_PRODUCTS)
        s, scale = scores_log2(tl.dot(b_q, tl.trans(b_k), input_precision=FP32_PRODUCTS),
                               rule.qk_scale, rule.softcap, flags.USE_SOFTCAP)
    else:
        s, scale = scores_log2(tl.dot(b_q, tl.trans(b_k)), rule.qk_scale, rule.softcap,
                               flags.USE_SOFTCAP)  # [BM, BN]
    if MASKED:
        s = tl.where(keep, s, float("-inf"))
    return softmax_step(s, scale, b_v, m_i, l_i, acc)


@triton.jit
def _any_visible(keep, SKIP: tl.constexpr, MASKED: tl.constexpr):
    """Whether a tile's matrix work is done: always, but for a fully masked tile under SKIP
    (the state would come out bit-unchanged anyway)."""
    if SKIP and MASKED:
        return tl.max(tl.max(keep.to(tl.int32), 1), 0) > 0
    else:
        return True


@triton.jit
def _attend_tile(b_q, p_k, p_v, m_load, keep, m_i, l_i, acc, rule, lanes, flags, new_scales):
    """Load one masked key tile (p_k: [BN, BD] pointers, p_v: [BN, BDV]) where m_load
    allows (other keys read as NaN, _common.load_keys, values as 0) and fold the logits
    ``keep`` leaves visible into the state. ``new_scales``: (k_scale, v_scale) of new
    tokens' tiles over an fp8 cache, which are taken as the cache stores them; else None."""
    if _any_visible(keep, flags.SKIP, True):
        b_k = load_keys(p_k, m_load, lanes.m_d, flags.EVEN_D)  # [BN, BD]
        b_v = load_rows(p_v, m_load, lanes.m_dv, flags.EVEN_DV)  # [BN, BDV]
        if new_scales is not None:
            b_k = fp8_cached(b_k, new_scales[0], flags.KV)
            b_v = fp8_cached(b_v, new_scales[1], flags.KV)
        m_i, l_i, acc = _fold_tile(b_q, b_k, b_v, keep, m_i, l_i, acc, rule, flags, True)
    return m_i, l_i, acc


@triton.jit
def _whole_tile(src, start_n, pages, lanes, flags, FROM_CACHE: tl.constexpr,
                IS_KEY: tl.constexpr, TMA: tl.constexpr):
    """The K (IS_KEY) or V rows of the mask-free tile at ``start_n`` (every row of the
    block sees it whole, so no row predicate from the window): from the paged cache
    (FROM_CACHE: ``pages`` the tile's block-table entries, one a key, or with TMA the
    scalar entry of the page holding the whole tile; the row stride is the page's, the
    slot stride a slot's) or from the new tokens (row ``src.row0 + start_n`` on, the row
    stride a token's). With TMA one copy from the source's descriptor (rows of
    ``[n, heads * dim]``, the head at column col_k/col_v). A cache entry outside
    ``[0, num_pages)`` is not read: its keys come out NaN (the K descriptor pads with NaN;
    _common.load_keys), its values 0."""
    desc = src.desc_k if IS_KEY else src.desc_v
    p_rows = src.k if IS_KEY else src.v
    col = lanes.col_k if IS_KEY else lanes.col_v
    stride_row = src.stride_k if IS_KEY else src.stride_v
    stride_slot = src.stride_ks if IS_KEY else src.stride_vs
    o_c = lanes.o_d if IS_KEY else lanes.o_dv
    m_c = lanes.m_d if IS_KEY else lanes.m_dv
    EVEN: tl.constexpr = flags.EVEN_D if IS_KEY else flags.EVEN_DV
    o_n = lanes.o_n
    page_size = src.page_size
    num_pages = src.num_pages
    if FROM_CACHE:
        if TMA:
            row = tl.where(valid_page(pages, num_pages), pages * page_size + start_n % page_size,
                           num_pages * page_size)
            b_t = desc.load([row, col])
        else:
            m_read = valid_page(pages, num_pages)
            offsets = pages.to(tl.int64) * stride_row + ((start_n + o_n) % page_size) * stride_slot
            if IS_KEY:
                b_t = load_keys(p_rows + offsets[:, None] + o_c[None, :], m_read, m_c, EVEN)
            else:
                b_t = load_rows(p_rows + offsets[:, None] + o_c[None, :], m_read, m_c, EVEN)
    else:
        if TMA:
            b_t = desc.load([src.row0 + start_n, col])
        else:
            offsets = (src.row0 + start_n + o_n).to(tl.int64) * stride_row
            b_t = load_whole(p_rows + offsets[:, None] + o_c[None, :], m_c, EVEN)
        if flags.KV.is_fp8():
            b_t = fp8_cached(b_t, src.k_scale if IS_KEY else src.v_scale, flags.KV)
    return b_t


@triton.jit
def _tile_pages(bt_row, start_n, o_n, page_size, ring, TMA: tl.constexpr, RING: tl.constexpr):
    """The block-table entries of the mask-free cache tile at ``start_n``: one a key, or
    with TMA the one entry of the page that holds the whole tile (a ring table's columns:
    _common.table_column)."""
    if TMA:
        pages = tl.load(bt_row + table_column(start_n // page_size, ring, RING))
    else:
        pages = tl.load(bt_row + table_column((start_n + o_n) // page_size, ring, RING))
    return pages


@triton.jit
def _whole_tiles(start, stop, b_q, m_i, l_i, acc, src, rule, lanes, flags,
                 FROM_CACHE: tl.constexpr, TMA: tl.constexpr):
    """The mask-free tiles [start, stop) of one stage (window.full_tile_range), from the
    cache or the new tokens (:func:`_whole_tile`). A cache tile's block-table entries load
    in the iteration whose copies they address (loading them a tile ahead measured slower:
    benchmarks/results/2026-12-01-h200-deterministic-gluon-probe/)."""
    for start_n in range(start, stop, flags.BLOCK_N):
        pages = lanes.o_n
        if FROM_CACHE:
            pages = _tile_pages(src.bt_row, start_n, lanes.o_n, src.page_size, src.ring, TMA,
                                flags.RING)
        b_k = _whole_tile(src, start_n, pages, lanes, flags, FROM_CACHE, True, TMA)  # [BN, BD]
        b_v = _whole_tile(src, start_n, pages, lanes, flags, FROM_CACHE, False, TMA)  # [BN, BDV]
        m_i, l_i, acc = _fold_tile(b_q, b_k, b_v, True, m_i, l_i, acc, rule, flags, False)
    return m_i, l_i, acc


@triton.jit
def _full_range(first_q, last_q, range_end, lo, hi, rule, flags, NO_FULL: tl.constexpr):
    """(mid_lo, mid_hi) of window.full_tile_range: the tiles that need no mask. NO_FULL
    (a custom mask, or a walk kept in one loop) leaves none."""
    if NO_FULL:
        mid_lo = hi
        mid_hi = hi
    else:
        end = range_end
        if flags.IS_CAUSAL:
            end = causal_key_end(first_q, range_end)
        elif flags.USE_RIGHT:
            end = right_key_end(first_q, rule.window_right, range_end)
        mid_lo = lo
        if flags.USE_WINDOW:
            mid_lo = full_tiles_start(last_q, rule.window_left, lo, flags.BLOCK_N)
        mid_lo = tl.minimum(mid_lo, hi)
        mid_hi = tl.maximum(tl.minimum(full_tiles_end(end, lo, flags.BLOCK_N), hi), mid_lo)
    return mid_lo, mid_hi


@triton.jit
def _prefix_tiles(start, stop, b_q, m_i, l_i, acc, q_pos, lowest_key, seq, cache, rule, lanes,
                  flags, MASKED: tl.constexpr):
    """Stage-1 tiles [start, stop): prefix keys at absolute positions, through the block
    table (``q_pos``: the rows' positions, or under key_ranges their KeyRange). No key below
    ``lowest_key`` is read: its page may be freed (-1), and a masked tile's page-index load
    is masked with its keys. Mask-free tiles (MASKED=False) go to
    :func:`_whole_tiles`, by TMA where pages hold whole key tiles (the cache's descriptors:
    rows of [num_pages * page_size, heads * D], a head at column col_k/col_v)."""
    o_n = lanes.o_n
    if not MASKED:
        m_i, l_i, acc = _whole_tiles(
            start, stop, b_q, m_i, l_i, acc,
            Source(cache.desc_k, cache.desc_v, cache.k + seq.i_kvh * cache.stride_kh,
                   cache.v + seq.i_kvh * cache.stride_vh, cache.stride_kp, cache.stride_ks,
                   cache.stride_vp, cache.stride_vs, 0,
                   cache.block_table + seq.i_seq * cache.stride_bt, cache.page_size,
                   cache.num_pages, 1.0, 1.0, cache.ring),
            rule, lanes, flags, True, flags.TMA_CACHE)
    else:
        for start_n in range(start, stop, flags.BLOCK_N):
            k_pos = start_n + o_n
            m_load = (k_pos < seq.prefix_len) & (k_pos >= lowest_key)
            page = tl.load(cache.block_table + seq.i_seq * cache.stride_bt
                           + table_column(k_pos // cache.page_size, cache.ring, flags.RING),
                           mask=m_load, other=-1)
            # Only keys on a page of the cache are read (a visible key on a bad entry: NaN).
            m_load = valid_page(page, cache.num_pages)
            page = page.to(tl.int64)
            slot_k = (page * cache.stride_kp + (k_pos % cache.page_size) * cache.stride_ks
                      + seq.i_kvh * cache.stride_kh)
            slot_v = (page * cache.stride_vp + (k_pos % cache.page_size) * cache.stride_vs
                      + seq.i_kvh * cache.stride_vh)
            if flags.POSITIONS and flags.UNIFIED:
                keep = _position_keep(q_pos, k_pos, k_pos, seq.prefix_len, rule, flags)
            elif flags.RANGES:
                keep = range_keep(q_pos, k_pos, seq.prefix_len)
            else:
                keep = visible(q_pos, k_pos, seq.prefix_len, rule.window_left, rule.window_right,
                               flags.USE_WINDOW, flags.IS_CAUSAL, flags.USE_RIGHT, True)
            if flags.USE_MASK:
                bits = tl.load(rule.mask + seq.mask_row[:, None] + k_pos[None, :], mask=keep,
                               other=0)
                keep = keep & (bits != 0)
            m_i, l_i, acc = _attend_tile(b_q, cache.k + slot_k[:, None] + lanes.o_d[None, :],
                                         cache.v + slot_v[:, None] + lanes.o_dv[None, :], m_load,
                                         keep, m_i, l_i, acc, rule, lanes, flags, None)
    return m_i, l_i, acc


@triton.jit
def _new_tiles(start, stop, b_q, m_i, l_i, acc, q_local, lowest_key, seq, new, rule, lanes,
               flags, MASKED: tl.constexpr):
    """Stage-2 tiles [start, stop): the new tokens' own keys, positions relative to the
    first new token. Mask-free tiles go to :func:`_whole_tiles`, by TMA where the layout
    allows (the descriptors: k and v as rows of [tokens, heads * D], a head at column
    col_k/col_v)."""
    o_n = lanes.o_n
    if not MASKED:
        m_i, l_i, acc = _whole_tiles(
            start, stop, b_q, m_i, l_i, acc,
            Source(new.desc_k, new.desc_v, new.k + seq.i_kvh * new.stride_kh,
                   new.v + seq.i_kvh * new.stride_vh, new.stride_kt, 0, new.stride_vt, 0,
                   seq.seq_start, new.k, 1, 1, new.k_scale, new.v_scale, 1),
            rule, lanes, flags, False, flags.TMA_NEW)
    else:
        for start_n in range(start, stop, flags.BLOCK_N):
            k_pos = start_n + o_n
            m_load = (k_pos < seq.extend_len) & (k_pos >= lowest_key)
            if flags.POSITIONS:
                keep = _position_keep(q_local, k_pos, tl.load(
                    rule.positions + seq.seq_start + k_pos, mask=k_pos < seq.extend_len, other=0),
                    seq.extend_len, rule, flags)
            elif flags.RANGES:
                keep = range_keep(q_local, k_pos, seq.extend_len)
            else:
                keep = visible(q_local, k_pos, seq.extend_len, rule.window_left,
                               rule.window_right, flags.USE_WINDOW, flags.IS_CAUSAL,
                               flags.USE_RIGHT, True)
            if flags.USE_MASK:
                bits = tl.load(rule.mask + seq.mask_row[:, None]
                               + (seq.prefix_len + k_pos)[None, :],
                               mask=keep, other=0)
                keep = keep & (bits != 0)
            tok = (seq.seq_start + k_pos).to(tl.int64)
            m_i, l_i, acc = _attend_tile(
                b_q, new.k + tok[:, None] * new.stride_kt + seq.i_kvh * new.stride_kh
                + lanes.o_d[None, :],
                new.v + tok[:, None] * new.stride_vt + seq.i_kvh * new.stride_vh
                + lanes.o_dv[None, :], m_load, keep, m_i, l_i, acc, rule, lanes, flags,
                (new.k_scale, new.v_scale) if flags.KV.is_fp8() else None)
    return m_i, l_i, acc


@triton.jit
def _unified_tiles(start, stop, b_q, m_i, l_i, acc, q_pos, key_start, key_end, lowest_key, seq,
                   cache, new, rule, lanes, flags, MASKED: tl.constexpr):
    """Deterministic tiles [start, stop) of the single pass that hold both cached and new
    keys (the kernel hands the others to the stage loops, which load from one source):
    absolute key positions in tiles aligned to position 0, whatever the chunking. A
    position below prefix_len comes from the paged cache, one at or above it from the new
    tokens' k/v (the same bits once write_kv has stored them), so each tile holds the same
    keys however the request's prefill was cut into chunks."""
    prefix_len = seq.prefix_len
    i_kvh = seq.i_kvh
    o_d = lanes.o_d
    o_dv = lanes.o_dv
    for start_n in range(start, stop, flags.BLOCK_N):
        k_pos = start_n + lanes.o_n
        m_load = (k_pos < key_end) & (k_pos >= lowest_key)
        in_prefix = k_pos < prefix_len
        m_cached = m_load & in_prefix
        m_new = m_load & (k_pos >= prefix_len)
        page = tl.load(cache.block_table + seq.i_seq * cache.stride_bt
                       + table_column(k_pos // cache.page_size, cache.ring, flags.RING),
                       mask=m_cached, other=-1)
        # Only cached keys on a page of the cache are read (a visible one on a bad entry: NaN).
        m_cached = valid_page(page, cache.num_pages)
        page = page.to(tl.int64)
        offset = k_pos % cache.page_size
        tok = (seq.seq_start + k_pos - prefix_len).to(tl.int64)
        keep = m_load[None, :]
        if MASKED:
            if flags.POSITIONS:
                k_abs = tl.where(in_prefix, k_pos, tl.load(
                    rule.positions + seq.seq_start + k_pos - prefix_len,
                    mask=m_new, other=0))
                keep = _position_keep(q_pos, k_pos, k_abs, key_end, rule, flags)
            elif flags.RANGES:
                keep = range_keep(q_pos, k_pos, key_end)
            else:
                keep = visible(q_pos, k_pos, key_end, rule.window_left, rule.window_right,
                               flags.USE_WINDOW, flags.IS_CAUSAL, flags.USE_RIGHT, True)
            keep = keep & (k_pos >= key_start)[None, :]
            if flags.USE_MASK:
                bits = tl.load(rule.mask + seq.mask_row[:, None] + k_pos[None, :], mask=keep,
                               other=0)
                keep = keep & (bits != 0)
        if _any_visible(keep, flags.SKIP, MASKED):
            slot_k = page * cache.stride_kp + offset * cache.stride_ks + i_kvh * cache.stride_kh
            slot_v = page * cache.stride_vp + offset * cache.stride_vs + i_kvh * cache.stride_vh
            if flags.KV.is_fp8():
                # The new keys as the cache stores them, both parts in the queries' type.
                b_k = tl.where(
                    in_prefix[:, None],
                    load_keys(cache.k + slot_k[:, None] + o_d[None, :], m_cached, lanes.m_d,
                              flags.EVEN_D).to(b_q.dtype),
                    fp8_cached(load_rows(new.k
                                         + (tok * new.stride_kt + i_kvh * new.stride_kh)[:, None]
                                         + o_d[None, :], m_new, lanes.m_d, flags.EVEN_D),
                               new.k_scale, flags.KV).to(b_q.dtype))  # [BN, BD]
                b_v = tl.where(
                    in_prefix[:, None],
                    load_rows(cache.v + slot_v[:, None] + o_dv[None, :], m_cached, lanes.m_dv,
                              flags.EVEN_DV).to(b_q.dtype),
                    fp8_cached(load_rows(new.v
                                         + (tok * new.stride_vt + i_kvh * new.stride_vh)[:, None]
                                         + o_dv[None, :], m_new, lanes.m_dv, flags.EVEN_DV),
                               new.v_scale, flags.KV).to(b_q.dtype))  # [BN, BDV]
            else:
                b_k = tl.where(in_prefix[:, None],
                               load_keys(cache.k + slot_k[:, None] + o_d[None, :], m_cached,
                                         lanes.m_d, flags.EVEN_D),
                               load_rows(new.k
                                         + (tok * new.stride_kt + i_kvh * new.stride_kh)[:, None]
                                         + o_d[None, :], m_new, lanes.m_d,
                                         flags.EVEN_D))  # [BN, BD]
                b_v = tl.where(in_prefix[:, None],
                               load_rows(cache.v + slot_v[:, None] + o_dv[None, :], m_cached,
                                         lanes.m_dv, flags.EVEN_DV),
                               load_rows(new.v
                                         + (tok * new.stride_vt + i_kvh * new.stride_vh)[:, None]
                                         + o_dv[None, :], m_new, lanes.m_dv,
                                         flags.EVEN_DV))  # [BN, BDV]
            m_i, l_i, acc = _fold_tile(b_q, b_k, b_v, keep, m_i, l_i, acc, rule, flags, MASKED)
    return m_i, l_i, acc


@triton.jit
def _launch_lengths(cu_seqlens, prefix_lens, mask_indptr, o_seq, m_seq, num_tokens, prefix_keys,
                    mask_entries, USE_MASK: tl.constexpr):
    """The new tokens of the sequences ``o_seq`` as a launch takes them (_common.new_lengths:
    0 for a sequence whose lengths are not well formed), and with a custom mask 0 too for a
    sequence whose mask rows lie outside the mask's ``mask_entries`` (window.mask_ok)."""
    new_lens = new_lengths(cu_seqlens, prefix_lens, o_seq, m_seq, num_tokens, prefix_keys)
    if USE_MASK:
        mask_starts = tl.load(mask_indptr + o_seq, mask=m_seq, other=0).to(tl.int64)
        prefixes = tl.load(prefix_lens + o_seq, mask=m_seq, other=0).to(tl.int64)
        new_lens = tl.where(mask_ok(mask_starts, new_lens.to(tl.int64), prefixes, mask_entries),
                            new_lens, 0)
    return new_lens


@triton.jit
def _uncovered_rows_kernel(cu_seqlens, prefix_lens, mask_indptr, Out, Lse, num_seqs, num_tokens,
                           prefix_keys, mask_entries, stride_ot, stride_oh, stride_lt,
                           HEADS: tl.constexpr, DV: tl.constexpr, BLOCK_R: tl.constexpr,
                           BLOCK_C: tl.constexpr, SEQS_POW2: tl.constexpr,
                           USE_MASK: tl.constexpr, RETURN_LSE: tl.constexpr):
    """NaN into the rows of ``Out`` [num_tokens, HEADS, DV] (and ``Lse``) that no sequence
    the extend kernel attends owns (window.uncovered_rows): program ``b`` fills the rows
    between the sequences before ``b`` that own rows and sequence ``b``, if it owns any;
    program ``num_seqs`` the rows past the last one. The one-shot calls launch it beside
    the kernel (their lengths were never checked on the host); it writes no row the kernel
    writes."""
    i_seq = tl.program_id(0)
    o_seq = tl.arange(0, SEQS_POW2)
    m_seq = o_seq < num_seqs
    new_lens = _launch_lengths(cu_seqlens, prefix_lens, mask_indptr, o_seq, m_seq, num_tokens,
                               prefix_keys, mask_entries, USE_MASK)
    owns = new_lens > 0
    ends = tl.load(cu_seqlens + 1 + o_seq, mask=m_seq, other=0)
    gap_start = tl.max(tl.where(owns & (o_seq < i_seq), ends, 0), 0)
    gap_end = num_tokens
    if i_seq < num_seqs:
        gap_end = tl.where(tl.sum(tl.where(o_seq == i_seq, new_lens, 0), 0) > 0,
                           tl.load(cu_seqlens + i_seq), gap_start)
    o_r = tl.arange(0, BLOCK_R)
    o_c = tl.arange(0, BLOCK_C)
    nan = tl.full([BLOCK_R, BLOCK_C], float("nan"), tl.float32)
    for row0 in range(gap_start, gap_end, BLOCK_R):
        rows = row0 + o_r
        m_r = rows < gap_end
        p_row = Out + rows.to(tl.int64) * stride_ot
        for col0 in range(0, HEADS * DV, BLOCK_C):
            cols = col0 + o_c
            p_o = p_row[:, None] + ((cols // DV) * stride_oh + cols % DV)[None, :]
            tl.store(p_o, nan.to(Out.dtype.element_ty),
                     mask=m_r[:, None] & (cols < HEADS * DV)[None, :])
        if RETURN_LSE:
            for head0 in range(0, HEADS, BLOCK_C):
                heads = head0 + o_c
                tl.store(Lse + rows.to(tl.int64)[:, None] * stride_lt + heads[None, :], nan,
                         mask=m_r[:, None] & (heads < HEADS)[None, :])


@triton.jit
def _extend_kernel(
    Q, K, V, K_cache, V_cache, block_table, cu_seqlens, prefix_lens,
    sinks, mask, mask_indptr, Out, Lse, desc_k, desc_v, desc_kc, desc_vc, k_scale, v_scale,
    key_lo, key_hi, positions, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcp, stride_kcs, stride_kch, stride_vcp, stride_vcs, stride_vch,
    stride_bt, stride_ot, stride_oh, stride_lt,
    num_seqs, page_size, num_pages, num_tokens, prefix_keys, mask_entries, ring, qk_scale, softcap,
    window_left, window_right, attention_chunk,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    GROUP: tl.constexpr, PACK_GQA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SEQS_POW2: tl.constexpr, USE_WINDOW: tl.constexpr, USE_RIGHT: tl.constexpr,
    IS_CAUSAL: tl.constexpr, HAS_SINKS: tl.constexpr, USE_SOFTCAP: tl.constexpr,
    USE_MASK: tl.constexpr, DO_PREFIX: tl.constexpr, DO_NEW: tl.constexpr,
    RETURN_LSE: tl.constexpr, TIGHT: tl.constexpr, SKIP: tl.constexpr, SPLIT_FULL: tl.constexpr,
    UNIFIED: tl.constexpr, TMA_NEW: tl.constexpr, TMA_CACHE: tl.constexpr,
    K_SCALE_STRIDE: tl.constexpr, V_SCALE_STRIDE: tl.constexpr, RANGES: tl.constexpr,
    USE_CHUNK: tl.constexpr, HAS_POSITIONS: tl.constexpr, RING: tl.constexpr,
):
    # SPLIT_FULL walks each stage as masked edge tiles, mask-free tiles every row sees
    # whole, masked edge tiles; without it one masked loop (small windows have no such tiles,
    # and three pipelined loops cost more than they save there).
    # With PACK_GQA a program owns one KV head and BLOCK_M // GROUP tokens: row r is token
    # r // GROUP of the block under query head r % GROUP of the group, so each K/V tile is
    # loaded once for the whole group. Without it, one query head and BLOCK_M tokens.
    TOKENS: tl.constexpr = BLOCK_M // GROUP if PACK_GQA else BLOCK_M
    EVEN_D: tl.constexpr = D == BLOCK_D
    EVEN_DV: tl.constexpr = DV == BLOCK_DV
    UNIFIED_PARTS: tl.constexpr = 3 if SPLIT_FULL and not USE_MASK and DO_PREFIX else 1
    i_block = tl.program_id(0)
    o_m = tl.arange(0, BLOCK_M)
    if PACK_GQA:
        i_kvh = tl.program_id(1).to(tl.int64)
        head = i_kvh * GROUP + o_m % GROUP  # [BM]
        row_token = o_m // GROUP
    else:
        i_kvh = tl.program_id(1).to(tl.int64) // GROUP
        head = tl.zeros([BLOCK_M], tl.int64) + tl.program_id(1)  # [BM], one head
        row_token = o_m
    # Which sequence this block belongs to, from the lengths themselves (no launch before
    # this one): sequence b owns ceil(E_b / TOKENS) blocks, after those of 0..b-1.
    # A sequence whose lengths are not well formed owns no block (_launch_lengths).
    o_seq = tl.arange(0, SEQS_POW2)
    m_seq = o_seq < num_seqs
    seq_blocks = (_launch_lengths(cu_seqlens, prefix_lens, mask_indptr, o_seq, m_seq, num_tokens,
                                  prefix_keys, mask_entries, USE_MASK) + TOKENS - 1) // TOKENS
    seq_block_ends = tl.where(m_seq, tl.cumsum(seq_blocks, 0), 2147483647)
    i_seq = tl.sum((seq_block_ends <= i_block).to(tl.int32), 0)
    if i_seq >= num_seqs:
        return
    block_start = (i_block - tl.sum(tl.where(o_seq < i_seq, seq_blocks, 0), 0)) * TOKENS
    seq_start = tl.load(cu_seqlens + i_seq)
    extend_len = tl.load(cu_seqlens + i_seq + 1) - seq_start
    prefix_len = tl.load(prefix_lens + i_seq)
    last_row = tl.minimum(block_start + TOKENS, extend_len) - 1

    # A head's columns in the rows of the TMA descriptors (unused without them).
    col_k = (i_kvh * D).to(tl.int32)
    col_v = (i_kvh * DV).to(tl.int32)
    o_n = tl.arange(0, BLOCK_N)
    o_d = tl.arange(0, BLOCK_D)
    o_dv = tl.arange(0, BLOCK_DV)
    m_d = o_d < D
    m_dv = o_dv < DV
    rows = block_start + row_token
    m_rows = rows < extend_len
    # Rows past the sequence get position -1: they see nothing and are not stored.
    q_local = tl.where(m_rows, rows, -1)
    tok_q = (seq_start + rows).to(tl.int64)

    b_q = load_rows(Q + tok_q[:, None] * stride_qt + head[:, None] * stride_qh + o_d[None, :],
                     m_rows, m_d, EVEN_D)  # [BM, BD]
    if K_cache.dtype.element_ty.is_fp8() and b_q.dtype == tl.bfloat16:
        # Over an fp8 cache the products run in fp16 (as ops.decode's): an fp8 tile converts
        # to fp16 in one packed instruction a pair.
        b_q = b_q.to(tl.float16)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)

    if USE_MASK:
        mask_row = (tl.load(mask_indptr + i_seq).to(tl.int64)
                    + rows.to(tl.int64) * (prefix_len + extend_len))
    else:
        mask_row = rows

    # Bundles; the constexpr one is assigned as a constexpr (a plain assignment would turn
    # its values into run-time ones).
    # Under chunked attention or given positions a loop's bounds come from its rows' key
    # ranges (window.row_key_range, range_bounds), as under key_ranges.
    ROW_RANGES: tl.constexpr = RANGES or USE_CHUNK or HAS_POSITIONS
    flags: tl.constexpr = ExtendFlags(BLOCK_N, USE_WINDOW, IS_CAUSAL, USE_RIGHT, USE_MASK,
                                      USE_SOFTCAP, TIGHT, SKIP, EVEN_D, EVEN_DV, TMA_NEW,
                                      TMA_CACHE, K_cache.dtype.element_ty, ROW_RANGES, USE_CHUNK,
                                      HAS_POSITIONS, UNIFIED, RING)
    rule = ExtendRule(qk_scale, softcap, window_left, window_right, mask, attention_chunk,
                      positions)
    new = NewKeys(K, V, stride_kt, stride_kh, stride_vt, stride_vh, desc_k, desc_v, 1.0, 1.0)
    if flags.KV.is_fp8():
        # An fp8 cache holds value / scale (one scale, or one a KV head): K's scale folds into
        # the scores' scale, V's into the output (below); the new keys and values are taken
        # as the cache stores them, so the chunking cannot change a result.
        k_head_scale = tl.load(k_scale + i_kvh * K_SCALE_STRIDE)
        v_head_scale = tl.load(v_scale + i_kvh * V_SCALE_STRIDE)
        rule = ExtendRule(qk_scale * k_head_scale, softcap, window_left, window_right, mask,
                          attention_chunk, positions)
        new = NewKeys(K, V, stride_kt, stride_kh, stride_vt, stride_vh, desc_k, desc_v,
                      k_head_scale, v_head_scale)
    lanes = ExtendLanes(o_n, o_d, o_dv, m_d, m_dv, col_k, col_v)
    seq = Seq(i_seq, i_kvh, seq_start, prefix_len, extend_len, mask_row)
    cache = PagedCache(K_cache, V_cache, stride_kcp, stride_kcs, stride_kch, stride_vcp,
                       stride_vcs, stride_vch, block_table, stride_bt, page_size, num_pages,
                       desc_kc, desc_vc, ring)
    # The rows' absolute positions: given (speculative trees), or after the prefix.
    if HAS_POSITIONS:
        q_abs = tl.load(positions + tok_q, mask=m_rows, other=-1)
    else:
        q_abs = tl.where(m_rows, prefix_len + rows, -1)

    if UNIFIED and ROW_RANGES:
        # (Its own loop, the same as the windowed one below: sharing one loop reorders the
        # windowed kernel's instructions, whose SASS must stay as it is.)
        # The single pass under chunked attention or given positions: in tiles aligned to
        # absolute position 0 as below. Chunked: the rows' ranges over [0, key_end). Given
        # positions: the cached keys' floor from the rows' ranges over the prefix (a cached
        # key's position is its index), the new keys walked whole up to the causal end by
        # index (their positions need not follow their order), every tile masked.
        key_start = 0 if DO_PREFIX else prefix_len
        key_end = prefix_len + extend_len if DO_NEW else prefix_len
        if HAS_POSITIONS:
            a, b = row_key_range(q_abs, 0, prefix_len, window_left, window_right,
                                 attention_chunk, USE_WINDOW, USE_CHUNK, False, USE_RIGHT)
            lo, _, _, _, lowest_key = range_bounds(KeyRange(a, b), m_rows, prefix_len, BLOCK_N,
                                                   TIGHT, SKIP, True)
            hi = key_end
            if IS_CAUSAL and (TIGHT or SKIP):
                hi = causal_key_end(prefix_len + last_row, key_end)
            mid_lo = hi
            mid_hi = hi
            q_pos = RowPos(tl.where(m_rows, prefix_len + rows, -1), q_abs)
            q_new = RowPos(q_local, q_abs)
        else:
            a, b = row_key_range(q_abs, 0, key_end, window_left, window_right, attention_chunk,
                                 USE_WINDOW, USE_CHUNK, IS_CAUSAL, USE_RIGHT)
            q_pos = KeyRange(a, b)
            lo, hi, mid_lo, mid_hi, lowest_key = range_bounds(
                q_pos, m_rows, key_end, BLOCK_N, TIGHT, SKIP,
                USE_MASK or not SPLIT_FULL or not DO_PREFIX)
            q_new = KeyRange(a - prefix_len, b - prefix_len)
        if not DO_PREFIX:
            lo = tl.maximum(lo, key_start // BLOCK_N * BLOCK_N)
        lowest_key = tl.maximum(lowest_key, key_start)
        for part in tl.static_range(UNIFIED_PARTS):
            start = lo if part == 0 else (mid_lo if part == 1 else mid_hi)
            stop = mid_lo if part == 0 else (mid_hi if part == 1 else hi)
            cached_end = tl.minimum(tl.maximum(prefix_len // BLOCK_N * BLOCK_N, start), stop)
            new_start = tl.minimum(tl.maximum((prefix_len + BLOCK_N - 1) // BLOCK_N * BLOCK_N,
                                              start), stop)
            m_i, l_i, acc = _prefix_tiles(start, cached_end, b_q, m_i, l_i, acc, q_pos,
                                          lowest_key, seq, cache, rule, lanes, flags, part != 1)
            m_i, l_i, acc = _unified_tiles(cached_end, new_start, b_q, m_i, l_i, acc, q_pos,
                                           key_start, key_end, lowest_key, seq, cache, new, rule,
                                           lanes, flags, part != 1)
            m_i, l_i, acc = _new_tiles(new_start - prefix_len, stop - prefix_len, b_q, m_i, l_i,
                                       acc, q_new, tl.minimum(lowest_key - prefix_len, 0), seq,
                                       new, rule, lanes, flags, part != 1)
    elif UNIFIED:
        # deterministic=True: one pass over the prefix and the new keys together, in tiles
        # aligned to absolute position 0 (window.key_bounds "unified"); keys="prefix"/"new"
        # keep the alignment and mask the other part out.
        q_pos = tl.where(m_rows, prefix_len + rows, -1)
        first_q = prefix_len + block_start
        key_start = 0 if DO_PREFIX else prefix_len
        key_end = prefix_len + extend_len if DO_NEW else prefix_len
        lo, hi = _stage_bounds(first_q, prefix_len + last_row, key_end, rule, flags)
        if not DO_PREFIX:
            lo = tl.maximum(lo, key_start // BLOCK_N * BLOCK_N)
        mid_lo, mid_hi = _full_range(first_q, prefix_len + last_row, key_end, lo, hi, rule, flags,
                                     USE_MASK or not SPLIT_FULL or not DO_PREFIX)
        lowest_key = tl.maximum(first_q - window_left, key_start) if USE_WINDOW else key_start
        # Without mask-free tiles (a custom mask, keys="new") one part: the code of the two
        # empty ones is left out (nine loops with a mask crashed ptxas 12.x for sm_90a).
        for part in tl.static_range(UNIFIED_PARTS):
            start = lo if part == 0 else (mid_lo if part == 1 else mid_hi)
            stop = mid_lo if part == 0 else (mid_hi if part == 1 else hi)
            # In position order: the tiles wholly in the cache, the one tile holding both
            # (where the prefix ends off the tile grid), the tiles wholly new. Each tile
            # holds the same keys and the same bits whichever of the three loops takes it,
            # so the chunking still cannot change a result; only the one straddling tile
            # loads from both sources.
            cached_end = tl.minimum(tl.maximum(prefix_len // BLOCK_N * BLOCK_N, start), stop)
            new_start = tl.minimum(tl.maximum((prefix_len + BLOCK_N - 1) // BLOCK_N * BLOCK_N,
                                              start), stop)
            m_i, l_i, acc = _prefix_tiles(start, cached_end, b_q, m_i, l_i, acc, q_pos, lowest_key,
                                          seq, cache, rule, lanes, flags, part != 1)
            m_i, l_i, acc = _unified_tiles(cached_end, new_start, b_q, m_i, l_i, acc, q_pos,
                                           key_start, key_end, lowest_key, seq, cache, new, rule,
                                           lanes, flags, part != 1)
            m_i, l_i, acc = _new_tiles(new_start - prefix_len, stop - prefix_len, b_q, m_i, l_i,
                                       acc, q_local, lowest_key - prefix_len, seq, new, rule,
                                       lanes, flags, part != 1)

    if DO_PREFIX and not UNIFIED:
        # Stage 1: prefix keys [0, prefix_len), absolute positions, through the block table:
        # masked edge tiles, then the tiles every row sees whole, then masked again.
        if ROW_RANGES and not RANGES:
            # Chunked attention or given positions: the rows' ranges of the prefix.
            a, b = row_key_range(q_abs, 0, prefix_len, window_left, window_right,
                                 attention_chunk, USE_WINDOW, USE_CHUNK, IS_CAUSAL, USE_RIGHT)
            q_pos = KeyRange(a, b)
            lo, hi, mid_lo, mid_hi, lowest_key = range_bounds(q_pos, m_rows, prefix_len, BLOCK_N,
                                                              TIGHT, SKIP,
                                                              USE_MASK or not SPLIT_FULL)
        elif RANGES:
            # key_ranges: row t sees the cached keys [key_lo[t], key_hi[t]).
            q_pos = KeyRange(tl.load(key_lo + tok_q, mask=m_rows, other=0),
                             tl.load(key_hi + tok_q, mask=m_rows, other=0))
            lo, hi, mid_lo, mid_hi, lowest_key = range_bounds(q_pos, m_rows, prefix_len, BLOCK_N,
                                                              TIGHT, SKIP,
                                                              USE_MASK or not SPLIT_FULL)
        else:
            q_pos = tl.where(m_rows, prefix_len + rows, -1)
            first_q = prefix_len + block_start
            lo, hi = _stage_bounds(first_q, prefix_len + last_row, prefix_len, rule, flags)
            mid_lo, mid_hi = _full_range(first_q, prefix_len + last_row, prefix_len, lo, hi, rule,
                                         flags, USE_MASK or not SPLIT_FULL)
            lowest_key = first_q - window_left if USE_WINDOW else 0
        for part in tl.static_range(3 if SPLIT_FULL else 1):
            start = lo if part == 0 else (mid_lo if part == 1 else mid_hi)
            stop = mid_lo if part == 0 else (mid_hi if part == 1 else hi)
            m_i, l_i, acc = _prefix_tiles(start, stop, b_q, m_i, l_i, acc, q_pos, lowest_key, seq,
                                          cache, rule, lanes, flags, part != 1)

    if DO_NEW and not UNIFIED:
        # Stage 2: new keys [0, extend_len), positions relative to the first new token.
        if HAS_POSITIONS:
            # Given positions: the new keys up to the causal end by index, every tile
            # masked by position (their positions need not follow their order).
            q_new = RowPos(q_local, q_abs)
            lo = 0
            hi = extend_len
            if IS_CAUSAL and (TIGHT or SKIP):
                hi = causal_key_end(last_row, extend_len)
            mid_lo = hi
            mid_hi = hi
            lowest_key = 0
        elif USE_CHUNK:
            a, b = row_key_range(q_local, prefix_len, extend_len, window_left, window_right,
                                 attention_chunk, USE_WINDOW, USE_CHUNK, IS_CAUSAL, USE_RIGHT)
            q_new = KeyRange(a, b)
            lo, hi, mid_lo, mid_hi, lowest_key = range_bounds(q_new, m_rows, extend_len, BLOCK_N,
                                                              TIGHT, SKIP,
                                                              USE_MASK or not SPLIT_FULL)
        else:
            q_new = q_local
            lo, hi = _stage_bounds(block_start, last_row, extend_len, rule, flags)
            mid_lo, mid_hi = _full_range(block_start, last_row, extend_len, lo, hi, rule, flags,
                                         USE_MASK or not SPLIT_FULL)
            lowest_key = block_start - window_left if USE_WINDOW else 0
        for part in tl.static_range(3 if SPLIT_FULL else 1):
            start = lo if part == 0 else (mid_lo if part == 1 else mid_hi)
            stop = mid_lo if part == 0 else (mid_hi if part == 1 else hi)
            m_i, l_i, acc = _new_tiles(start, stop, b_q, m_i, l_i, acc, q_new, lowest_key, seq,
                                       new, rule, lanes, flags, part != 1)

    if flags.KV.is_fp8():
        acc = acc * v_head_scale
    sink_log2 = 0.0
    if HAS_SINKS:
        sink_log2 = tl.load(sinks + head) * 1.4426950408889634
    o, lse = finish(acc, m_i, l_i, sink_log2, HAS_SINKS)
    p_o = Out + tok_q[:, None] * stride_ot + head[:, None] * stride_oh + o_dv[None, :]
    if EVEN_DV:
        tl.store(p_o, o.to(Out.dtype.element_ty), mask=m_rows[:, None])
    else:
        tl.store(p_o, o.to(Out.dtype.element_ty), mask=m_rows[:, None] & m_dv[None, :])
    if RETURN_LSE:
        tl.store(Lse + tok_q * stride_lt + head, lse, mask=m_rows)


# --------------------------------------------------------------------------------------
# Host side: what a plan fixes, and one launch on run-time tensors.
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ExtendSpec:
    """Everything an extend launch fixes at plan time (either kernel: this module's, its
    ``config`` a Config, or the Hopper path's, a HopperExtendConfig); ``has_sinks`` and
    the TMA flags come from the run's arguments."""

    num_seqs: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    head_dim_v: int
    page_size: int
    config: Config | HopperExtendConfig
    window_left: int | None
    window_right: int | None
    causal: bool
    softcap: float
    qk_scale: float
    keys: str
    return_lse: bool
    masked: bool
    deterministic: bool
    bounds: str = "tight"
    has_sinks: bool = False
    tma_new: bool = False
    tma_cache: bool = False
    # The cache's dtype, and the stride between KV heads of an fp8 cache's k_scale and v_scale
    # (1: one a head, 0: one value; from the run).
    kv_dtype: object = None
    scale_strides: tuple = (0, 0)
    # key_ranges: each query row sees its own range of cached keys (keys="prefix", no
    # window or causal rule; either kernel).
    ranges: bool = False
    # Chunked local attention (a query sees its own chunk of this many positions), and
    # the new tokens' positions given (speculative trees; the run's positions tensor).
    attention_chunk: int | None = None
    has_positions: bool = False
    # A ring block table: logical page i at column i % the table's width (window.ring_column).
    ring: bool = False

    @property
    def group(self):
        return self.num_q_heads // self.num_kv_heads


_TENSORS = ("Q", "K", "V", "K_cache", "V_cache", "block_table", "cu_seqlens", "prefix_lens",
            "sinks", "mask", "mask_indptr", "Out", "Lse", "desc_k", "desc_v", "desc_kc",
            "desc_vc", "k_scale", "v_scale", "key_lo", "key_hi", "positions")
_INTS = ("stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_vt", "stride_vh", "stride_kcp",
         "stride_kcs", "stride_kch", "stride_vcp", "stride_vcs", "stride_vch", "stride_bt",
         "stride_ot", "stride_oh", "stride_lt", "num_pages", "num_tokens", "prefix_keys",
         "mask_entries", "ring")


@functools.lru_cache(maxsize=256)
def _launcher(spec: ExtendSpec, dtypes):
    cfg = spec.config
    pack = packs_gqa(cfg, spec.group)
    fixed = dict(
        num_seqs=spec.num_seqs, page_size=spec.page_size, qk_scale=spec.qk_scale,
        softcap=float(spec.softcap), window_left=clamp_extent(spec.window_left or 0),
        window_right=clamp_extent(spec.window_right or 0), D=spec.head_dim, DV=spec.head_dim_v,
        BLOCK_D=dot_side(spec.head_dim), BLOCK_DV=dot_side(spec.head_dim_v), GROUP=spec.group,
        PACK_GQA=pack, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        SEQS_POW2=max(triton.next_power_of_2(spec.num_seqs), 2),
        USE_WINDOW=spec.window_left is not None,
        USE_RIGHT=(not spec.causal) and spec.window_right is not None,
        IS_CAUSAL=spec.causal and not spec.masked, HAS_SINKS=spec.has_sinks,
        USE_SOFTCAP=spec.softcap > 0, USE_MASK=spec.masked,
        DO_PREFIX=spec.keys in ("all", "prefix"), DO_NEW=spec.keys in ("all", "new"),
        RETURN_LSE=spec.return_lse, TIGHT=spec.bounds == "tight", SKIP=spec.bounds == "skip",
        SPLIT_FULL=cfg.split_full, UNIFIED=spec.deterministic, TMA_NEW=spec.tma_new,
        TMA_CACHE=spec.tma_cache, K_SCALE_STRIDE=spec.scale_strides[0],
        V_SCALE_STRIDE=spec.scale_strides[1], RANGES=spec.ranges,
        attention_chunk=clamp_extent(spec.attention_chunk or 1),
        USE_CHUNK=spec.attention_chunk is not None, HAS_POSITIONS=spec.has_positions,
        RING=spec.ring)
    return Launch(_extend_kernel, fixed, {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages},
                  _TENSORS, _INTS, dtypes)


def rows_descriptor(t, block_rows, padding="zero"):
    """A TMA descriptor of ``t`` as rows (:func:`._tma.tma_rows`) read in boxes of
    ``[block_rows, dim]``, made only where a launch needs one (:class:`._launch.Descriptor`);
    None where the copy engine cannot take it (also a head dim off the tile's width)."""
    if t.shape[-1] != dot_side(t.shape[-1]) or tma_rows(t) is None:
        return None
    return Descriptor(t, row_descriptor, block_rows, padding)


def descriptors(cfg, k, v, k_cache, v_cache, masked, new=True):
    """``(desc_k, desc_v, desc_kc, desc_vc)`` for the mask-free tiles: new k/v where the
    launch reads them (``new``) and the copy engine can take them, the cache where a page
    holds whole key tiles (its K padded with NaN: a bad page entry's keys read as NaN). None
    where a pair cannot (those tiles then load through pointers, the same bits)."""
    none = (None, None)
    if not cfg.tma or not cfg.split_full or masked:
        return none + none

    def pair(kt, vt, k_padding):
        dk = rows_descriptor(kt, cfg.block_n, k_padding)
        dv = rows_descriptor(vt, cfg.block_n)
        return (dk, dv) if dk is not None and dv is not None else none

    # (an fp8 cache's tiles load through pointers: the copy engine's NaN padding is for
    # 16- and 32-bit floats)
    whole = k_cache.shape[1] % cfg.block_n == 0 and k_cache.element_size() > 1
    cached = pair(k_cache, v_cache, "nan") if whole else none
    return (pair(k, v, "zero") if new else none) + cached


class ExtendLaunch:
    """The kernel's launch for one spec, what every run shares bound once; a call
    launches on checked arguments: no host sync, no allocation; it returns what
    ``ops._launch.relaunch`` takes, or None. ``scales``: an fp8 cache's (k_scale, v_scale).
    The grid is an upper bound
    of the blocks (each program finds its sequence from ``cu_seqlens`` itself), from the
    rows of ``q``. ``descs``: :func:`descriptors` of this run's tensors; ``dtypes``: the
    tensors' (the queries' and the cache's, the mask offsets'). ``ranges``: key_ranges'
    ``(key_lo, key_hi)`` device tensors, or None."""

    def __init__(self, spec: ExtendSpec, dtypes):
        self.launch = _launcher(spec, dtypes)
        pack = packs_gqa(spec.config, spec.group)
        self.tokens = spec.config.block_m // spec.group if pack else spec.config.block_m
        self.heads = spec.num_kv_heads if pack else spec.num_q_heads
        self.num_seqs = spec.num_seqs
        self.page_size = spec.page_size if spec.keys != "new" else None
        self.ring = spec.ring

    def __call__(self, q, k, v, k_cache, v_cache, block_table, cu_seqlens, prefix_lens, sinks,
                 mask, mask_indptr, out, lse, descs, scales=(None, None), ranges=None,
                 positions=None):
        num_tokens = q.shape[0]
        if num_tokens == 0:
            return None
        lse_t = out if lse is None else lse
        qs, ks, vs, kcs, vcs, os_ = (q.stride(), k.stride(), v.stride(), k_cache.stride(),
                                     v_cache.stride(), out.stride())
        return self.launch((-(-num_tokens // self.tokens) + self.num_seqs, self.heads, 1), (
            q, k, v, k_cache, v_cache, block_table, cu_seqlens, prefix_lens,
            q if sinks is None else sinks, q if mask is None else mask.view(torch.uint8),
            cu_seqlens if mask_indptr is None else mask_indptr, out, lse_t, *descs, *scales,
            *((cu_seqlens, cu_seqlens) if ranges is None else ranges),
            cu_seqlens if positions is None else positions), (
            qs[0], qs[1], ks[0], ks[1], vs[0], vs[1], kcs[0], kcs[1], kcs[2], vcs[0], vcs[1],
            vcs[2], block_table.stride(0), os_[0], os_[1], lse_t.stride(0), k_cache.shape[0],
            *launch_extents(num_tokens, block_table, self.page_size, mask, self.ring),
            # (1 for a linear table: Triton takes a 1 as a constant, no argument at all)
            block_table.shape[1] if self.ring else 1))


class UncoveredRowsLaunch:
    """The launch of :func:`_uncovered_rows_kernel` for one extend spec: NaN into the rows
    of ``out`` (and ``lse``) that no sequence the extend kernel attends owns. The one-shot
    calls run it beside the kernel (their lengths are the caller's, never checked on the
    host); a plan's lengths are checked, and its run does not."""

    def __init__(self, spec, dtypes):
        heads = spec.num_q_heads
        self.num_seqs = spec.num_seqs
        self.page_size = spec.page_size if spec.keys != "new" else None
        block_c = min(triton.next_power_of_2(heads * spec.head_dim_v), 512)
        fixed = dict(num_seqs=spec.num_seqs, HEADS=heads, DV=spec.head_dim_v, BLOCK_R=4,
                     BLOCK_C=block_c, SEQS_POW2=max(triton.next_power_of_2(spec.num_seqs), 2),
                     USE_MASK=spec.masked, RETURN_LSE=spec.return_lse)
        self.launch = Launch(_uncovered_rows_kernel, fixed, {"num_warps": 4},
                             ("cu_seqlens", "prefix_lens", "mask_indptr", "Out", "Lse"),
                             ("num_tokens", "prefix_keys", "mask_entries", "stride_ot",
                              "stride_oh", "stride_lt"), dtypes)

    def __call__(self, block_table, cu_seqlens, prefix_lens, mask, mask_indptr, out, lse):
        num_tokens = out.shape[0]
        if num_tokens == 0:
            return None
        lse_t = out if lse is None else lse
        return self.launch((self.num_seqs + 1, 1, 1), (
            cu_seqlens, prefix_lens, cu_seqlens if mask_indptr is None else mask_indptr, out,
            lse_t), (*launch_extents(num_tokens, block_table, self.page_size, mask),
                     out.stride(0), out.stride(1), lse_t.stride(0)))
