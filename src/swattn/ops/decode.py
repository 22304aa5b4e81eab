"""Decode attention: one new token per sequence over its window of the paged cache.

The query of sequence b sits at ``seq_lens[b] - 1`` and sees the keys
``[window.decode_first_key(S, L), S)``: exactly ``L + 1`` once the sequence is long enough.
Keys are gathered row by row through the block table, so the tiles start at the window's
first key, unaligned: a window of L + 1 keys costs ``ceil((L + 1) / BLOCK_N)`` tiles, and
no block-table entry below the window or past the end is loaded (the page-index load is
masked with the keys).

One program owns (sequence, KV head, split) and every query head of the KV group: the
q block is [BLOCK_H, D] (rows past the group masked), so each K/V tile is read once for
the group and both products are tensor-core dots with the group as M. With split-KV
(flash-decoding) the program's key tiles are one contiguous chunk of the sequence's tiles,
the chunking computed in the kernel from ``seq_lens`` (no host sync, CUDA-graph safe): each
split writes a sink-free partial (out, lse) to scratch and ``merge.launch_merge`` combines
them, applying the sinks once; on sm_90 the merge is launched as a programmatic dependent
(PDL) of this kernel, so it can start as soon as every program of this one has.
``sparse=(k_pool, v_pool, idx)`` adds up to K pool rows per sequence to the same softmax as
extra key tiles after the window's, chunked over the splits with them. Where the values are
the keys' first columns (a latent cache, :func:`values_in_keys`), each tile is loaded (and
over fp8 converted) once for both products.

``bounds="skip"``/``"none"`` let the chunk of split 0 start at position 0 (on the grid of
the window's first key) and skip, or compute under the mask, the tiles below the window;
the chunking is the same in all three, so they are bit-identical for every split count.

A block-table entry outside ``[0, num_pages)`` is never
dereferenced: the keys on it read as NaN, so the query heads whose window holds one come out
NaN (``_common.load_keys``); a sparse index outside the pool likewise. With the config's
``flag_unread`` such a row is read as zeros instead and the state's ``l`` is made NaN (the
same outputs, bit for bit; see :class:`.config.DecodeConfig`).

On sm_90 the plan (``swattn.plan``) hands long windows and full attention to the Gluon path
(:mod:`.decode_hopper`: the pages by TMA, a producer warp, two programs an SM); this module
launches what the plan chose (:func:`launch`, a :class:`DecodeSpec`).
"""

import functools
from collections import namedtuple
from dataclasses import dataclass

import triton
import triton.language as tl
from triton.language.extra import cuda as tl_cuda

from ..window import clamp_extent
from ._common import (
    FP32_PRODUCTS,
    PagedCache,
    decode_chunk_first_key,
    decode_first_key,
    decode_seq_ok,
    finish,
    fp8_cached,
    load_keys,
    load_rows,
    rows_ok,
    scores_log2,
    second_entries_ok,
    second_limit,
    segment_tiles,
    softmax_step,
    split_tiles,
    table_column,
    table_keys,
    valid_page,
)
from ._launch import Launch
from .config import BOUNDS, DecodeConfig, HopperDecodeConfig, dot_side, head_blocking, split_width  # noqa: F401
from .merge import split_scratch

# The arguments the tile loops share, bundled once by the kernel (a namedtuple compiles to
# its fields: no code of its own); the cache travels as _common.PagedCache.
TritonDecodeFlags = namedtuple("TritonDecodeFlags",
                               "BLOCK_N USE_SOFTCAP SKIP EVEN_D EVEN_D2 EVEN_DV "
                               "SPLIT_D CARRY FLAG_UNREAD V_IN_K RING")  # constexprs
# A tile's offsets and masks: keys [BN], the head's main columns [BD], its tail [BD2] (with
# SPLIT_D), the value columns [BDV].
DecodeLanes = namedtuple("DecodeLanes", "o_n o_d o_d2 o_dv m_d m_d2 m_dv")
Scores = namedtuple("Scores", "qk_scale softcap")
# The sparse keys: pool rows of K and V (row, head strides), the index rows and their
# stride, how many entries a row has, the pool's row count.
SparsePool = namedtuple("SparsePool", "k v stride_kn stride_kh stride_vn stride_vh idx stride_ib "
                        "num_sparse rows")


@triton.jit
def _attend(b_q, b_q2, b_k, b_k2, b_v, m_key, m_read, m_i, l_i, acc, scores, flags):
    """Fold one key tile into the state; keys outside ``m_key`` get logit -inf whatever
    their rows hold (unwritten cache rows never reach the row max). With FLAG_UNREAD a
    visible key outside ``m_read`` (its row not read: zeros) makes ``l`` NaN, as the NaN row
    of :func:`_load_key` otherwise does through its logit. With SPLIT_D the head's tail
    columns (b_q2, b_k2) add a second product. With V_IN_K ``b_v`` is the key tile itself
    (a latent cache: the values are the keys' first columns), converted once."""
    if b_v.dtype != b_q.dtype:  # an fp8 cache (keys may come as fp16: _common.load_keys)
        b_k = b_k.to(b_q.dtype)
        b_k2 = b_k2.to(b_q.dtype)
        b_v = b_v.to(b_q.dtype)
    if flags.V_IN_K:
        b_v = b_k
    if b_q.dtype == tl.float32:  # fp32 products in fp32 (see _common.FP32_PRODUCTS)
        qk = tl.dot(b_q, tl.trans(b_k), input_precision=FP32_PRODUCTS)  # [BH, BN]
        if flags.SPLIT_D:
            qk = tl.dot(b_q2, tl.trans(b_k2), qk, input_precision=FP32_PRODUCTS)
    else:
        qk = tl.dot(b_q, tl.trans(b_k))
        if flags.SPLIT_D:
            qk = tl.dot(b_q2, tl.trans(b_k2), qk)
    s, scale = scores_log2(qk, scores.qk_scale, scores.softcap, flags.USE_SOFTCAP)
    s = tl.where(m_key[None, :], s, float("-inf"))
    m_i, l_i, acc = softmax_step(s, scale, b_v, m_i, l_i, acc)
    if flags.FLAG_UNREAD:
        # + 0.0 where every visible key was read: l keeps its bits (the bounds variants'
        # identity); NaN reaches o and lse through l (finish) where one was not.
        unread = tl.max((m_key & (m_read == 0)).to(tl.int32), 0)
        l_i = l_i + tl.where(unread > 0, float("nan"), 0.0)
    return m_i, l_i, acc


@triton.jit
def _load_key(p, rows, lanes, flags):
    """A key tile's rows (``p``: [BN] row pointers) as its main columns and, with SPLIT_D,
    its tail columns (else the main part again, unused); rows outside ``rows`` NaN
    (_common.load_keys), or with FLAG_UNREAD zeros (_attend flags them)."""
    # (One return: the compiler takes every return's types as one, dead branches too.)
    if flags.FLAG_UNREAD:
        b_k = load_rows(p[:, None] + lanes.o_d[None, :], rows, lanes.m_d, flags.EVEN_D)
    else:
        b_k = load_keys(p[:, None] + lanes.o_d[None, :], rows, lanes.m_d, flags.EVEN_D)  # [BN, BD]
    if flags.SPLIT_D:
        if flags.FLAG_UNREAD:
            b_k2 = load_rows(p[:, None] + lanes.o_d2[None, :], rows, lanes.m_d2, flags.EVEN_D2)
        else:
            b_k2 = load_keys(p[:, None] + lanes.o_d2[None, :], rows, lanes.m_d2,
                             flags.EVEN_D2)  # [BN, BD2]
    else:
        b_k2 = b_k
    return b_k, b_k2


@triton.jit
def _pages(p_table, k_pos, lo, seq_len, page_size, ring, RING: tl.constexpr):
    """The block-table entries of the keys at ``k_pos``; only those of visible keys
    ``[lo, seq_len)`` are loaded (-1 for the others); a ring table's columns
    (_common.table_column)."""
    return tl.load(p_table + table_column(k_pos // page_size, ring, RING),
                   mask=(k_pos >= lo) & (k_pos < seq_len), other=-1)


@triton.jit
def _window_tiles(start, stop, b_q, b_q2, m_i, l_i, acc, i_seq, i_kvh, lo, seq_len, cache, scores,
                  lanes, flags):
    """Window tiles [start, stop): cached keys at absolute positions, the visible ones
    ``[lo, seq_len)`` loaded through the block table.

    With CARRY each iteration loads the block-table entries of the next tile and carries
    them: the K/V row addresses then come from the loop's own state, not from a load in
    the same iteration, so with ``num_stages`` s the pipeliner gives the K/V copies s - 1
    shared buffers and issues them s - 1 tiles ahead (entries loaded in the iteration
    that uses them hold each copy to one buffer, waited on before its tile's products).
    Either way only the entries of visible keys are loaded (the masks are the keys'), and
    only entries in ``[0, num_pages)`` are dereferenced.
    """
    o_n = lanes.o_n
    page_size = cache.page_size
    p_table = cache.block_table + i_seq * cache.stride_bt
    # (a linear table's calls take no run-time width: an argument the call leaves unread,
    # defined outside the loop, fails to compile inside its branch)
    ring = 1
    if flags.RING:
        ring = cache.ring
    if flags.CARRY:
        page = _pages(p_table, start + o_n, lo, seq_len, page_size, ring, flags.RING)
    for start_n in range(start, stop, flags.BLOCK_N):
        k_pos = start_n + o_n
        m_key = (k_pos >= lo) & (k_pos < seq_len)
        if flags.CARRY:
            page_next = _pages(p_table, k_pos + flags.BLOCK_N, lo, seq_len, page_size, ring,
                               flags.RING)
        if flags.SKIP:
            needed = tl.max(m_key.to(tl.int32), 0) > 0
        else:
            needed = True
        if needed:
            if not flags.CARRY:
                page = _pages(p_table, k_pos, lo, seq_len, page_size, ring, flags.RING)
            # Only keys on a page of the cache are read; a visible key on a bad entry
            # gives a NaN logit (load_keys), or with FLAG_UNREAD a NaN l (_attend).
            m_read = valid_page(page, cache.num_pages)
            row = page.to(tl.int64)
            offset = k_pos % page_size
            slot_k = row * cache.stride_kp + offset * cache.stride_ks + i_kvh * cache.stride_kh
            if not flags.V_IN_K:
                slot_v = row * cache.stride_vp + offset * cache.stride_vs + i_kvh * cache.stride_vh
            b_k, b_k2 = _load_key(cache.k + slot_k, m_read, lanes, flags)
            if flags.V_IN_K:
                b_v = b_k  # (the key tile's first columns: _attend)
            else:
                b_v = load_rows(cache.v + slot_v[:, None] + lanes.o_dv[None, :], m_read,
                                lanes.m_dv, flags.EVEN_DV)  # [BN, BDV]
            m_i, l_i, acc = _attend(b_q, b_q2, b_k, b_k2, b_v, m_key, m_read, m_i, l_i, acc,
                                    scores, flags)
        if flags.CARRY:
            page = page_next
    return m_i, l_i, acc


@triton.jit
def _sparse_tiles(start, stop, b_q, b_q2, m_i, l_i, acc, i_seq, i_kvh, pool, scores, lanes, flags):
    """Sparse tiles [start, stop) of ``idx[i_seq]``: pool rows ``0 <= idx < pool.rows``;
    -1 (and the entries past K) are no key, and no entry outside the pool is dereferenced
    (any other value is a visible key that cannot be read: NaN, _common.load_keys)."""
    for start_n in range(start, stop, flags.BLOCK_N):
        o_i = start_n + lanes.o_n
        row = tl.load(pool.idx + i_seq * pool.stride_ib + o_i, mask=o_i < pool.num_sparse, other=-1)
        m_key = row != -1
        m_read = (row >= 0) & (row < pool.rows)
        row = row.to(tl.int64)
        b_k, b_k2 = _load_key(pool.k + row * pool.stride_kn + i_kvh * pool.stride_kh, m_read, lanes,
                              flags)
        if flags.V_IN_K:
            b_v = b_k
        else:
            b_v = load_rows(pool.v + (row * pool.stride_vn + i_kvh * pool.stride_vh)[:, None]
                            + lanes.o_dv[None, :], m_read, lanes.m_dv, flags.EVEN_DV)  # [BN, BDV]
        m_i, l_i, acc = _attend(b_q, b_q2, b_k, b_k2, b_v, m_key, m_read, m_i, l_i, acc, scores,
                                flags)
    return m_i, l_i, acc


@triton.jit
def _queries(p_q, m_h, lanes, FP8: tl.constexpr, flags):
    """A program's query block ([BH, BD], and with SPLIT_D its tail [BH, BD2]; else the main
    part again) from ``p_q`` (the rows' pointers). Over an fp8 cache the products run in
    fp16: an fp8 tile converts to fp16 in one packed instruction a pair (to bf16 it goes
    through fp32), and a bf16 query within fp16's range is an fp16 value."""
    b_q = load_rows(p_q + lanes.o_d[None, :], m_h, lanes.m_d, flags.EVEN_D)
    b_q2 = b_q
    if flags.SPLIT_D:
        b_q2 = load_rows(p_q + lanes.o_d2[None, :], m_h, lanes.m_d2, flags.EVEN_D2)
    if FP8 and b_q.dtype == tl.bfloat16:
        b_q = b_q.to(tl.float16)
        b_q2 = b_q2.to(tl.float16)
    return b_q, b_q2


# Where a program's state goes: the output and lse (one row a sequence or row), or the split
# scratch (partial states, [rows, Hq, splits, ...]), with their strides.
Outputs = namedtuple("Outputs", "out lse part_o part_lse stride_ob stride_oh stride_lb "
                     "stride_pb stride_ph stride_ps stride_plb stride_plh")


@triton.jit
def _store(acc, m_i, l_i, i_row, i_split, head, m_h, o_dv, m_dv, sinks, outputs,
           HAS_SINKS: tl.constexpr, WRITE_PARTIAL: tl.constexpr, RETURN_LSE: tl.constexpr):
    """Normalise a program's state and store it: a sink-free partial state into the split
    scratch (the merge applies the sinks once), or the output (and lse) with the sinks."""
    if WRITE_PARTIAL:
        o, lse = finish(acc, m_i, l_i, 0.0, False)
        p_o = (outputs.part_o + i_row * outputs.stride_pb + head[:, None] * outputs.stride_ph
               + i_split * outputs.stride_ps + o_dv[None, :])
        tl.store(p_o, o, mask=m_h[:, None] & m_dv[None, :])
        tl.store(outputs.part_lse + i_row * outputs.stride_plb + head * outputs.stride_plh
                 + i_split, lse, mask=m_h)
    else:
        sink_log2 = 0.0
        if HAS_SINKS:
            sink_log2 = tl.load(sinks + head, mask=m_h, other=0.0) * 1.4426950408889634
        o, lse = finish(acc, m_i, l_i, sink_log2, HAS_SINKS)
        p_o = (outputs.out + i_row * outputs.stride_ob + head[:, None] * outputs.stride_oh
               + o_dv[None, :])
        tl.store(p_o, o.to(outputs.out.dtype.element_ty), mask=m_h[:, None] & m_dv[None, :])
        if RETURN_LSE:
            tl.store(outputs.lse + i_row * outputs.stride_lb + head, lse, mask=m_h)


@triton.jit
def _decode_kernel(
    Q, K_cache, V_cache, block_table, seq_lens, sinks, K_pool, V_pool, Idx, Out, Lse,
    Part_o, Part_lse, k_scale, v_scale,
    stride_qb, stride_qh, stride_kcp, stride_kcs, stride_kch, stride_vcp, stride_vcs, stride_vch,
    stride_bt, stride_kpn, stride_kph, stride_vpn, stride_vph, stride_ib,
    stride_ob, stride_oh, stride_lb, stride_pb, stride_ph, stride_ps, stride_plb, stride_plh,
    page_size, num_pages, pool_rows, num_sparse, cached_keys, ring, num_splits, head_programs,
    qk_scale,
    softcap,
    window_left, attention_chunk, D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_D2: tl.constexpr, SPLIT_D: tl.constexpr, BLOCK_DV: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr, HEAD_BLOCKS: tl.constexpr, BLOCK_N: tl.constexpr,
    USE_WINDOW: tl.constexpr, HAS_SINKS: tl.constexpr, USE_SOFTCAP: tl.constexpr,
    HAS_SPARSE: tl.constexpr, WRITE_PARTIAL: tl.constexpr, RETURN_LSE: tl.constexpr,
    TIGHT: tl.constexpr, SKIP: tl.constexpr, CARRY: tl.constexpr, FLAG_UNREAD: tl.constexpr,
    V_IN_K: tl.constexpr, HEADS_FIRST: tl.constexpr,
    PDL: tl.constexpr, K_SCALE_STRIDE: tl.constexpr, V_SCALE_STRIDE: tl.constexpr,
    USE_CHUNK: tl.constexpr, RING: tl.constexpr,
):
    if PDL:
        # The merge, launched as this kernel's programmatic dependent, may start once every
        # program has: its programs wait for this kernel's end before reading the parts.
        tl_cuda.gdc_launch_dependents()
    # SPLIT_D: the head is BLOCK_D columns and a tail of at most BLOCK_D2 (576 = 512 + 64),
    # two products instead of one padded to the next power of two.
    EVEN_D: tl.constexpr = BLOCK_D <= D
    EVEN_D2: tl.constexpr = BLOCK_D + BLOCK_D2 == D
    EVEN_DV: tl.constexpr = DV == BLOCK_DV
    # An fp8 cache (and sparse pool): its tiles are converted to fp16 for the products
    # (exactly: every fp8 value is an fp16 value), a bf16 query too (below).
    FP8: tl.constexpr = K_cache.dtype.element_ty.is_fp8()
    # HEADS_FIRST: axis 0 runs over (sequence, head block), the head block fastest, so a
    # sequence's programs start side by side and read its pages' rows (every KV head of a
    # token is one contiguous run) together; else the sequence is axis 0. A group wider
    # than BLOCK_H (a wide head: q and the K/V tiles would not fit in shared memory) is cut
    # into HEAD_BLOCKS blocks of query heads, each its own program.
    if HEADS_FIRST:
        i_seq = (tl.program_id(0) // head_programs).to(tl.int64)
        i_head = tl.program_id(0) % head_programs
        i_split = tl.program_id(1)
    else:
        i_seq = tl.program_id(0).to(tl.int64)
        i_head = tl.program_id(1)
        i_split = tl.program_id(2)
    i_kvh = i_head.to(tl.int64) // HEAD_BLOCKS
    i_hb = i_head % HEAD_BLOCKS
    o_h = i_hb * BLOCK_H + tl.arange(0, BLOCK_H)  # rows: query heads within the group
    o_n = tl.arange(0, BLOCK_N)
    o_d = tl.arange(0, BLOCK_D)
    o_d2 = BLOCK_D + tl.arange(0, BLOCK_D2)
    o_dv = tl.arange(0, BLOCK_DV)
    m_h = o_h < GROUP
    m_d = o_d < D
    m_d2 = o_d2 < D
    m_dv = o_dv < DV
    head = i_kvh * GROUP + o_h  # [BH]

    seq_len = tl.load(seq_lens + i_seq)
    # A length that is not well formed (negative, past the keys the block-table row maps)
    # walks no key, and its output is NaN (below).
    seq_ok = decode_seq_ok(seq_len, cached_keys)
    seq_len = tl.where(seq_ok, seq_len, 0)
    lo = 0
    if USE_WINDOW:
        lo = decode_first_key(seq_len, window_left)
    if USE_CHUNK:
        # Chunked attention: nothing below the query's chunk (window.decode_bounds).
        lo = tl.maximum(lo, decode_chunk_first_key(seq_len, attention_chunk))
    # The sequence's key tiles: the window's, then the sparse keys'; split i_split owns
    # the contiguous run [t_start, t_stop) of them.
    window_tiles = (seq_len - lo + BLOCK_N - 1) // BLOCK_N
    total_tiles = window_tiles
    if HAS_SPARSE:
        total_tiles = window_tiles + (num_sparse + BLOCK_N - 1) // BLOCK_N
    t_start, t_stop = split_tiles(0, total_tiles, num_splits, i_split)

    # (_queries is not called here: written inline, this kernel's code is as it was.)
    p_q = Q + i_seq * stride_qb + head[:, None] * stride_qh
    b_q = load_rows(p_q + o_d[None, :], m_h, m_d, EVEN_D)  # [BH, BD]
    b_q2 = b_q
    if SPLIT_D:
        b_q2 = load_rows(p_q + o_d2[None, :], m_h, m_d2, EVEN_D2)  # [BH, BD2]
    if FP8 and b_q.dtype == tl.bfloat16:
        # Over an fp8 cache the products run in fp16 (_queries).
        b_q = b_q.to(tl.float16)
        b_q2 = b_q2.to(tl.float16)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], tl.float32)

    # Bundles; the constexpr one is assigned as a constexpr (a plain assignment would turn
    # its values into run-time ones).
    flags: tl.constexpr = TritonDecodeFlags(BLOCK_N, USE_SOFTCAP, SKIP, EVEN_D, EVEN_D2, EVEN_DV,
                                            SPLIT_D, CARRY, FLAG_UNREAD, V_IN_K, RING)
    lanes = DecodeLanes(o_n, o_d, o_d2, o_dv, m_d, m_d2, m_dv)
    scores = Scores(qk_scale, softcap)
    if FP8:
        # The cache holds value / scale (one scale, or one a KV head): K's scale folds into
        # the scores' scale, V's into the output (below).
        scores = Scores(qk_scale * tl.load(k_scale + i_kvh * K_SCALE_STRIDE), softcap)
    cache = PagedCache(K_cache, V_cache, stride_kcp, stride_kcs, stride_kch, stride_vcp,
                       stride_vcs, stride_vch, block_table, stride_bt, page_size, num_pages,
                       None, None, ring)
    start = lo + tl.minimum(t_start, window_tiles) * BLOCK_N
    stop = lo + tl.minimum(t_stop, window_tiles) * BLOCK_N
    if not TIGHT:
        # Split 0 walks from the tile holding position 0 on the grid of lo (nothing
        # below lo is visible: those tiles are skipped or computed fully masked).
        if t_start == 0:
            start = lo - (lo + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    m_i, l_i, acc = _window_tiles(start, stop, b_q, b_q2, m_i, l_i, acc, i_seq, i_kvh, lo, seq_len,
                                  cache, scores, lanes, flags)
    if HAS_SPARSE:
        sparse_start = (tl.maximum(t_start, window_tiles) - window_tiles) * BLOCK_N
        sparse_stop = (tl.maximum(t_stop, window_tiles) - window_tiles) * BLOCK_N
        pool = SparsePool(K_pool, V_pool, stride_kpn, stride_kph, stride_vpn, stride_vph, Idx,
                          stride_ib, num_sparse, pool_rows)
        m_i, l_i, acc = _sparse_tiles(sparse_start, sparse_stop, b_q, b_q2, m_i, l_i, acc, i_seq,
                                      i_kvh, pool, scores, lanes, flags)
    if FP8:
        acc = acc * tl.load(v_scale + i_kvh * V_SCALE_STRIDE)
    l_i = tl.where(seq_ok, l_i, float("nan"))

    outputs = Outputs(Out, Lse, Part_o, Part_lse, stride_ob, stride_oh, stride_lb, stride_pb,
                      stride_ph, stride_ps, stride_plb, stride_plh)
    _store(acc, m_i, l_i, i_seq, i_split, head, m_h, o_dv, m_dv, sinks, outputs, HAS_SINKS,
           WRITE_PARTIAL, RETURN_LSE)


# --------------------------------------------------------------------------------------
# A second key source (DeepSeek-V3.2 / V4): rows that attend their window and the entries of
# a second paged cache in one softmax.
# --------------------------------------------------------------------------------------

# The second source as the tile loop takes it: its paged cache (K, V; V may be K) and block
# table, the compression rate, the index rows (INDEXED) and their stride and width.
Second = namedtuple("Second", "cache rate idx stride_ir num_idx")
# A row's keys: its sequence, its position, the keys its cache holds before the new ones
# (the prefix; a decode row's whole sequence), the first of its window, where its
# sequence's new tokens start in k/v, the second source's limit (window.second_limit) and
# the entries its second cache holds.
RowKeys = namedtuple("RowKeys", "seq pos cached lo new_row limit entries")


@triton.jit
def _new_tiles(start, stop, b_q, b_q2, m_i, l_i, acc, row_keys, i_kvh, new, scores, lanes, flags,
               new_scales, KV: tl.constexpr):
    """The new tokens' key tiles at positions [start, stop): position ``j`` (at least the
    prefix ``row_keys.cached``) is row ``new_row + j - cached`` of k and v, visible from the
    window's first key to the row's own position. Over an fp8 cache (``KV``) they are taken
    as the cache stores them (_common.fp8_cached with ``new_scales``: k's and v's scale), as
    the extend kernels take them: the scales folded into the scores and the output apply
    to them too."""
    for start_n in range(start, stop, flags.BLOCK_N):
        k_pos = start_n + lanes.o_n
        m_key = (k_pos >= row_keys.lo) & (k_pos >= row_keys.cached) & (k_pos <= row_keys.pos)
        row = (row_keys.new_row + k_pos - row_keys.cached).to(tl.int64)
        b_k, b_k2 = _load_key(new.k + row * new.stride_kn + i_kvh * new.stride_kh, m_key, lanes,
                              flags)
        if flags.V_IN_K:
            b_v = b_k
        else:
            b_v = load_rows(new.v + (row * new.stride_vn + i_kvh * new.stride_vh)[:, None]
                            + lanes.o_dv[None, :], m_key, lanes.m_dv, flags.EVEN_DV)
        if KV.is_fp8():
            b_k = fp8_cached(b_k, new_scales[0], KV)
            b_k2 = fp8_cached(b_k2, new_scales[0], KV)
            b_v = fp8_cached(b_v, new_scales[1], KV)
        m_i, l_i, acc = _attend(b_q, b_q2, b_k, b_k2, b_v, m_key, m_key, m_i, l_i, acc, scores,
                                flags)
    return m_i, l_i, acc


@triton.jit
def _second_tiles(start, stop, b_q, b_q2, m_i, l_i, acc, row_keys, i_row, i_kvh, src, scores,
                  lanes, flags, INDEXED: tl.constexpr):
    """Second-source tiles [start, stop): with INDEXED slots of the row's index list, else
    the entries themselves. An entry ``0 <= e < limit`` is a key; -1 and entries at or past
    the limit are none, and are not read; any other value is a key that cannot be read
    (NaN, as a bad page). Only entries on a page of the second cache are read."""
    cache = src.cache
    p_table = cache.block_table + row_keys.seq * cache.stride_bt
    for start_n in range(start, stop, flags.BLOCK_N):
        o_i = start_n + lanes.o_n
        if INDEXED:
            e = tl.load(src.idx + i_row * src.stride_ir + o_i, mask=o_i < src.num_idx, other=-1)
            m_key = (e != -1) & (e < row_keys.limit)
        else:
            e = o_i
            m_key = e < row_keys.limit
        if flags.SKIP:
            needed = tl.max(m_key.to(tl.int32), 0) > 0
        else:
            needed = True
        if needed:
            page = tl.load(p_table + e // cache.page_size, mask=m_key & (e >= 0), other=-1)
            m_read = valid_page(page, cache.num_pages)
            row = page.to(tl.int64)
            offset = e % cache.page_size
            slot_k = row * cache.stride_kp + offset * cache.stride_ks + i_kvh * cache.stride_kh
            b_k, b_k2 = _load_key(cache.k + slot_k, m_read, lanes, flags)
            if flags.V_IN_K:
                b_v = b_k
            else:
                slot_v = row * cache.stride_vp + offset * cache.stride_vs + i_kvh * cache.stride_vh
                b_v = load_rows(cache.v + slot_v[:, None] + lanes.o_dv[None, :], m_read,
                                lanes.m_dv, flags.EVEN_DV)
            m_i, l_i, acc = _attend(b_q, b_q2, b_k, b_k2, b_v, m_key, m_read, m_i, l_i, acc,
                                    scores, flags)
    return m_i, l_i, acc


@triton.jit
def _row_keys(i_row, row_seq, seq_lens, cu_seqlens, prefix_lens, entries, num_tokens,
              cached_keys, second_keys, window_left, attention_chunk, rate, ROWS: tl.constexpr,
              USE_WINDOW: tl.constexpr, USE_CHUNK: tl.constexpr):
    """A row's keys (:data:`RowKeys`) and whether the row is well formed. A decode row
    (not ROWS) is sequence ``i_row``, its query at ``seq_lens - 1`` with every key in the
    cache; an extend row (ROWS) is a new token of sequence ``row_seq[i_row]``, at position
    ``prefix + i_row - cu_seqlens[seq]``, its window's keys in the cache below the prefix
    and in k/v from it (window.rows_ok, window.decode_seq_ok, window.second_entries_ok)."""
    if ROWS:
        i_seq = tl.load(row_seq + i_row).to(tl.int64)
        seq_start = tl.load(cu_seqlens + i_seq)
        cached = tl.load(prefix_lens + i_seq)
        ok = rows_ok(i_row, seq_start, tl.load(cu_seqlens + i_seq + 1), cached, num_tokens,
                     cached_keys)
    else:
        i_seq = i_row
        seq_start = i_row + 1  # (the query is the cache's last key: at cached - 1)
        cached = tl.load(seq_lens + i_seq)
        ok = decode_seq_ok(cached, cached_keys)
    n_entries = tl.load(entries + i_seq)
    ok = ok & second_entries_ok(n_entries, second_keys)
    # A row that is not well formed sees nothing (at position -1, no key cached or new).
    n_entries = tl.where(ok, n_entries, 0)
    cached = tl.where(ok, cached, 0)
    new_row = tl.where(ok, seq_start, i_row + 1)
    pos = cached + i_row - new_row
    lo = 0
    if USE_WINDOW:
        lo = decode_first_key(pos + 1, window_left)
    if USE_CHUNK:
        lo = tl.maximum(lo, decode_chunk_first_key(pos + 1, attention_chunk))
    limit = second_limit(pos, rate, n_entries)
    return RowKeys(i_seq, pos, cached, lo, new_row, limit, n_entries), ok


@triton.jit
def _second_keys_kernel(
    Q, K_cache, V_cache, block_table, seq_lens, row_seq, cu_seqlens, prefix_lens, K_new, V_new,
    X_cache, X_values, X_table, X_entries, X_idx, sinks, Out, Lse, Part_o, Part_lse, k_scale,
    v_scale,
    stride_qb, stride_qh, stride_kcp, stride_kcs, stride_kch, stride_vcp, stride_vcs, stride_vch,
    stride_bt, stride_kn, stride_kh, stride_vn, stride_vh, stride_xp, stride_xs, stride_xh,
    stride_xvp, stride_xvs, stride_xvh, stride_xt, stride_ir,
    stride_ob, stride_oh, stride_lb, stride_pb, stride_ph, stride_ps, stride_plb, stride_plh,
    page_size, num_pages, x_page_size, x_pages, num_idx, num_tokens, cached_keys, second_keys,
    num_splits, head_programs, qk_scale, softcap, window_left, attention_chunk, rate,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr,
    SPLIT_D: tl.constexpr, BLOCK_DV: tl.constexpr, GROUP: tl.constexpr, BLOCK_H: tl.constexpr,
    HEAD_BLOCKS: tl.constexpr, BLOCK_N: tl.constexpr, USE_WINDOW: tl.constexpr,
    WINDOW_KEYS: tl.constexpr, HAS_SINKS: tl.constexpr, USE_SOFTCAP: tl.constexpr,
    INDEXED: tl.constexpr, ROWS: tl.constexpr, WRITE_PARTIAL: tl.constexpr,
    RETURN_LSE: tl.constexpr, TIGHT: tl.constexpr, SKIP: tl.constexpr,
    FLAG_UNREAD: tl.constexpr, V_IN_K: tl.constexpr, K_SCALE_STRIDE: tl.constexpr,
    V_SCALE_STRIDE: tl.constexpr, USE_CHUNK: tl.constexpr,
):
    """Rows (decode: one a sequence; extend with ROWS: one a new token) over their window
    of the paged cache (and, extending, of the new tokens' k/v) and the second source's
    entries, one softmax with the sinks. One program owns (row, head block, split), as
    :func:`_decode_kernel`'s sequences: a row's tiles are its cached window's, its new
    keys', then the second source's, cut into contiguous runs by the splits."""
    i_row = tl.program_id(0).to(tl.int64)
    i_head = tl.program_id(1)
    i_split = tl.program_id(2)
    i_kvh = i_head.to(tl.int64) // HEAD_BLOCKS
    o_h = (i_head % HEAD_BLOCKS) * BLOCK_H + tl.arange(0, BLOCK_H)
    o_n = tl.arange(0, BLOCK_N)
    o_d = tl.arange(0, BLOCK_D)
    o_d2 = BLOCK_D + tl.arange(0, BLOCK_D2)
    o_dv = tl.arange(0, BLOCK_DV)
    m_h = o_h < GROUP
    m_d = o_d < D
    m_d2 = o_d2 < D
    m_dv = o_dv < DV
    head = i_kvh * GROUP + o_h
    EVEN_D: tl.constexpr = BLOCK_D <= D
    EVEN_D2: tl.constexpr = BLOCK_D + BLOCK_D2 == D
    EVEN_DV: tl.constexpr = DV == BLOCK_DV
    FP8: tl.constexpr = K_cache.dtype.element_ty.is_fp8()

    row_keys, row_ok = _row_keys(i_row, row_seq, seq_lens, cu_seqlens, prefix_lens, X_entries,
                                 num_tokens, cached_keys, second_keys, window_left,
                                 attention_chunk, rate, ROWS, USE_WINDOW, USE_CHUNK)
    # The row's tiles: its cached window's [lo, min(cached, pos + 1)), its new keys' [max(lo,
    # cached), pos + 1), the second source's; split i_split owns [t_start, t_stop) of them.
    cache_tiles = 0
    new_tiles = 0
    new_lo = tl.maximum(row_keys.lo, row_keys.cached)
    if WINDOW_KEYS:
        cache_tiles = (tl.minimum(row_keys.cached, row_keys.pos + 1) - row_keys.lo + BLOCK_N
                       - 1) // BLOCK_N
        cache_tiles = tl.maximum(cache_tiles, 0)
        if ROWS:
            new_tiles = tl.maximum(row_keys.pos + 1 - new_lo + BLOCK_N - 1, 0) // BLOCK_N
    if INDEXED:
        second_tiles = (num_idx + BLOCK_N - 1) // BLOCK_N
    else:
        second_tiles = (row_keys.limit + BLOCK_N - 1) // BLOCK_N
    total_tiles = cache_tiles + new_tiles + second_tiles
    t_start, t_stop = split_tiles(0, total_tiles, num_splits, i_split)

    flags: tl.constexpr = TritonDecodeFlags(BLOCK_N, USE_SOFTCAP, SKIP, EVEN_D, EVEN_D2,
                                            EVEN_DV, SPLIT_D, False, FLAG_UNREAD, V_IN_K, False)
    lanes = DecodeLanes(o_n, o_d, o_d2, o_dv, m_d, m_d2, m_dv)
    b_q, b_q2 = _queries(Q + i_row * stride_qb + head[:, None] * stride_qh, m_h, lanes, FP8,
                         flags)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], tl.float32)
    scores = Scores(qk_scale, softcap)
    new_scales = (1.0, 1.0)
    if FP8:
        new_scales = (tl.load(k_scale + i_kvh * K_SCALE_STRIDE),
                      tl.load(v_scale + i_kvh * V_SCALE_STRIDE))
        scores = Scores(qk_scale * new_scales[0], softcap)

    if WINDOW_KEYS:
        cache = PagedCache(K_cache, V_cache, stride_kcp, stride_kcs, stride_kch, stride_vcp,
                           stride_vcs, stride_vch, block_table, stride_bt, page_size, num_pages,
                           None, None, 1)
        a, b = segment_tiles(t_start, t_stop, 0, cache_tiles)
        start = row_keys.lo + a * BLOCK_N
        stop = row_keys.lo + b * BLOCK_N
        if not TIGHT:
            if t_start == 0:  # (as _decode_kernel's: from the tile holding 0 on lo's grid)
                start = row_keys.lo - (row_keys.lo + BLOCK_N - 1) // BLOCK_N * BLOCK_N
        m_i, l_i, acc = _window_tiles(start, stop, b_q, b_q2, m_i, l_i, acc, row_keys.seq,
                                      i_kvh, row_keys.lo,
                                      tl.minimum(row_keys.cached, row_keys.pos + 1), cache,
                                      scores, lanes, flags)
        if ROWS:
            new = SparsePool(K_new, V_new, stride_kn, stride_kh, stride_vn, stride_vh, None, 0,
                             0, num_tokens)
            a, b = segment_tiles(t_start, t_stop, cache_tiles, new_tiles)
            m_i, l_i, acc = _new_tiles(new_lo + a * BLOCK_N, new_lo + b * BLOCK_N, b_q, b_q2,
                                       m_i, l_i, acc, row_keys, i_kvh, new, scores, lanes, flags,
                                       new_scales, K_cache.dtype.element_ty)
    src = Second(PagedCache(X_cache, X_values, stride_xp, stride_xs, stride_xh, stride_xvp,
                            stride_xvs, stride_xvh, X_table, stride_xt, x_page_size, x_pages,
                            None, None, 1), rate, X_idx, stride_ir, num_idx)
    a, b = segment_tiles(t_start, t_stop, cache_tiles + new_tiles, second_tiles)
    stop = b * BLOCK_N
    if not TIGHT and not INDEXED:
        if t_stop == total_tiles:  # the last split walks every entry held (masked past limit)
            stop = tl.maximum(stop, (row_keys.entries + BLOCK_N - 1) // BLOCK_N * BLOCK_N)
    m_i, l_i, acc = _second_tiles(a * BLOCK_N, stop, b_q, b_q2, m_i, l_i, acc, row_keys, i_row,
                                  i_kvh, src, scores, lanes, flags, INDEXED)
    if FP8:
        acc = acc * new_scales[1]
    l_i = tl.where(row_ok, l_i, float("nan"))
    outputs = Outputs(Out, Lse, Part_o, Part_lse, stride_ob, stride_oh, stride_lb, stride_pb,
                      stride_ph, stride_ps, stride_plb, stride_plh)
    _store(acc, m_i, l_i, i_row, i_split, head, m_h, o_dv, m_dv, sinks, outputs, HAS_SINKS,
           WRITE_PARTIAL, RETURN_LSE)


# --------------------------------------------------------------------------------------
# Host side: what a plan fixes, and one launch on run-time tensors.
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DecodeSpec:
    """Everything a decode launch fixes at plan time: the sizes, the window and scalars,
    the config, the split count and the loop-bound variant. ``has_sinks``/``has_sparse``
    come from the run's arguments."""

    head_dim: int
    head_dim_v: int
    group: int
    num_kv_heads: int
    page_size: int
    config: DecodeConfig | HopperDecodeConfig
    window_left: int | None
    softcap: float
    qk_scale: float
    num_splits: int
    return_lse: bool
    pdl: bool = False
    bounds: str = "tight"
    has_sinks: bool = False
    has_sparse: bool = False
    # The cache's dtype (an fp8 cache holds value / scale), and the stride between KV heads
    # of its k_scale and v_scale (1: one a head, 0: one value; from the run).
    kv_dtype: object = None
    scale_strides: tuple = (0, 0)
    # The run's values are its keys' first head_dim_v columns (:func:`values_in_keys`).
    v_in_k: bool = False
    # The Gluon latent-cache path's tiling (config.LatentDecodeConfig) where the plan
    # chose it: a run whose values are its keys' first columns takes that kernel
    # (ops.decode_latent), any other the Triton kernel of ``config``.
    latent_config: object = None
    # Chunked local attention: the query sees only its own chunk of this many positions.
    attention_chunk: int | None = None
    # A ring block table: logical page i at column i % the table's width (window.ring_column).
    ring: bool = False
    # A second key source (:class:`SecondKeysLaunch`): ``"indexed"`` (an index list a row)
    # or ``"causal"`` (every entry up to the limit at ``second_rate``), None without one;
    # ``rows``: the rows are an extend's new tokens, not decode's sequences;
    # ``window_keys``: whether the rows attend their window beside the second source.
    second: str | None = None
    second_rate: int = 1
    rows: bool = False
    window_keys: bool = True

    @property
    def head_blocking(self):
        """``(BLOCK_H, head blocks)``: the group's query heads in programs."""
        return head_blocking(self.config, self.group)


def latent_widths(head_dim, head_dim_v):
    """Whether a value block of ``head_dim_v`` columns is a key tile's main part: the
    kernel can then take a latent cache's values from its key tiles."""
    block_d, _ = split_width(head_dim)
    return dot_side(head_dim_v) == block_d and head_dim_v == min(head_dim, block_d)


def values_in_keys(spec, k_cache, v_cache, sparse):
    """Whether a run may read its values as its keys' first columns, one load a tile: the
    values (and the sparse pool's) are the keys' first ``head_dim_v`` columns, at the same
    address with the same strides, as a latent cache holds them (DeepSeek's MLA: 512 of 576
    columns, ``v_cache = k_cache[..., :512]``), and :func:`latent_widths` holds. Tensor
    metadata only: no host sync."""
    if not latent_widths(spec.head_dim, spec.head_dim_v):
        return False
    pairs = ((k_cache, v_cache),) if sparse is None else ((k_cache, v_cache), sparse[:2])
    return all(k.data_ptr() == v.data_ptr() and same_steps(k, v) for k, v in pairs)


def same_steps(k, v):
    """Whether ``k`` and ``v`` (of one rank) step through memory alike on every axis that
    has more than one element: a single KV head's stride is arbitrary (``view`` gives a
    sliced tensor another one than the tensor it was sliced from)."""
    return k.dim() == v.dim() and all(a == b or n == 1 for a, b, n in
                                      zip(k.stride(), v.stride(), v.shape))


_TENSORS = ("Q", "K_cache", "V_cache", "block_table", "seq_lens", "sinks", "K_pool", "V_pool",
            "Idx", "Out", "Lse", "Part_o", "Part_lse", "k_scale", "v_scale")
_INTS = ("stride_qb", "stride_qh", "stride_kcp", "stride_kcs", "stride_kch", "stride_vcp",
         "stride_vcs", "stride_vch", "stride_bt", "stride_kpn", "stride_kph", "stride_vpn",
         "stride_vph", "stride_ib", "stride_ob", "stride_oh", "stride_lb", "stride_pb", "stride_ph",
         "stride_ps", "stride_plb", "stride_plh", "num_pages", "pool_rows", "num_sparse",
         "cached_keys", "ring")


def _fixed(spec: DecodeSpec):
    """The fixed arguments both decode-shaped kernels take (:func:`_decode_kernel`,
    :func:`_second_keys_kernel`): sizes, tiling, window, chunk, scalars and the flags of the
    spec they share."""
    cfg = spec.config
    block_h, head_blocks = spec.head_blocking
    block_d, block_d2 = split_width(spec.head_dim)
    return dict(
        page_size=spec.page_size, num_splits=spec.num_splits,
        head_programs=spec.num_kv_heads * head_blocks, qk_scale=spec.qk_scale,
        softcap=float(spec.softcap), window_left=clamp_extent(spec.window_left or 0),
        attention_chunk=clamp_extent(spec.attention_chunk or 1),
        D=spec.head_dim, DV=spec.head_dim_v, BLOCK_D=block_d, BLOCK_D2=block_d2 or 16,
        SPLIT_D=block_d2 > 0, BLOCK_DV=dot_side(spec.head_dim_v), GROUP=spec.group,
        BLOCK_H=block_h, HEAD_BLOCKS=head_blocks, BLOCK_N=cfg.block_n,
        USE_WINDOW=spec.window_left is not None, HAS_SINKS=spec.has_sinks,
        USE_SOFTCAP=spec.softcap > 0, WRITE_PARTIAL=spec.num_splits > 1,
        RETURN_LSE=spec.return_lse, TIGHT=spec.bounds == "tight", SKIP=spec.bounds == "skip",
        FLAG_UNREAD=cfg.flag_unread or spec.v_in_k, V_IN_K=spec.v_in_k,
        K_SCALE_STRIDE=spec.scale_strides[0], V_SCALE_STRIDE=spec.scale_strides[1],
        USE_CHUNK=spec.attention_chunk is not None)


@functools.lru_cache(maxsize=256)
def _launcher(spec: DecodeSpec, dtypes):
    cfg = spec.config
    fixed = dict(_fixed(spec), HAS_SPARSE=spec.has_sparse, CARRY=cfg.carry,
                 HEADS_FIRST=cfg.heads_first, PDL=spec.pdl, RING=spec.ring)
    return Launch(_decode_kernel, fixed, {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages},
                  _TENSORS, _INTS, dtypes)


class DecodeLaunch:
    """The Triton kernel's launch for one spec, what every run shares bound once; a call
    launches on checked arguments, batch > 0 (the caller launches the split merge): no
    host sync, no allocation; it returns what ``ops._launch.relaunch`` takes, or None.
    ``sparse``: (k_pool, v_pool, idx) or None; ``parts``: the
    split scratch ``(part_o [B, Hq, S, Dv], part_lse [B, Hq, S])`` or None; ``scales``: an
    fp8 cache's ``(k_scale, v_scale)``, else ``(None, None)``. ``dtypes``: the queries' and
    the cache's."""

    def __init__(self, spec: DecodeSpec, dtypes):
        self.launch = _launcher(spec, dtypes)
        self.head_programs = spec.num_kv_heads * spec.head_blocking[1]
        self.heads_first = spec.config.heads_first
        self.num_splits = spec.num_splits
        self.has_sparse = spec.has_sparse
        self.ring = spec.ring

    def __call__(self, batch, q, k_cache, v_cache, block_table, seq_lens, sinks, sparse, out, lse,
                 parts, scales):
        grid = ((batch * self.head_programs, self.num_splits, 1) if self.heads_first
                else (batch, self.head_programs, self.num_splits))
        if self.has_sparse:
            k_pool, v_pool, idx = sparse
            kps, vps, num_sparse = k_pool.stride(), v_pool.stride(), idx.shape[1]
            pool = (kps[0], kps[1], vps[0], vps[1], idx.stride(0), k_pool.shape[0], num_sparse)
        else:
            k_pool = v_pool = idx = q  # not read
            pool = (0, 0, 0, 0, 0, 0, 0)
        part_o, part_lse, ps = split_scratch(parts, out)
        qs, kcs, vcs, os_ = q.stride(), k_cache.stride(), v_cache.stride(), out.stride()
        return self.launch(grid, (
            q, k_cache, v_cache, block_table, seq_lens, q if sinks is None else sinks, k_pool,
            v_pool, idx, out, out if lse is None else lse, part_o, part_lse, *scales), (
            qs[0], qs[1], kcs[0], kcs[1], kcs[2], vcs[0], vcs[1], vcs[2], block_table.stride(0),
            pool[0], pool[1], pool[2], pool[3], pool[4], os_[0], os_[1],
            0 if lse is None else lse.stride(0), ps[0], ps[1], ps[2], ps[3], ps[4],
            k_cache.shape[0], pool[5], pool[6],
            table_keys(block_table, k_cache.shape[1], self.ring),
            # (1 for a linear table: Triton takes a 1 as a constant, no argument at all)
            block_table.shape[1] if self.ring else 1))


_SECOND_TENSORS = ("Q", "K_cache", "V_cache", "block_table", "seq_lens", "row_seq", "cu_seqlens",
                   "prefix_lens", "K_new", "V_new", "X_cache", "X_values", "X_table",
                   "X_entries", "X_idx", "sinks", "Out", "Lse", "Part_o", "Part_lse", "k_scale",
                   "v_scale")
_SECOND_INTS = ("stride_qb", "stride_qh", "stride_kcp", "stride_kcs", "stride_kch", "stride_vcp",
                "stride_vcs", "stride_vch", "stride_bt", "stride_kn", "stride_kh", "stride_vn",
                "stride_vh", "stride_xp", "stride_xs", "stride_xh", "stride_xvp", "stride_xvs",
                "stride_xvh", "stride_xt", "stride_ir", "stride_ob", "stride_oh", "stride_lb",
                "stride_pb", "stride_ph", "stride_ps", "stride_plb", "stride_plh", "num_pages",
                "x_page_size", "x_pages", "num_idx", "num_tokens", "cached_keys", "second_keys")


@functools.lru_cache(maxsize=256)
def _second_launcher(spec: DecodeSpec, dtypes):
    cfg = spec.config
    fixed = dict(_fixed(spec), rate=spec.second_rate, WINDOW_KEYS=spec.window_keys,
                 INDEXED=spec.second == "indexed", ROWS=spec.rows)
    return Launch(_second_keys_kernel, fixed, {"num_warps": cfg.num_warps,
                                               "num_stages": cfg.num_stages},
                  _SECOND_TENSORS, _SECOND_INTS, dtypes)


class SecondKeysLaunch:
    """The launch of :func:`_second_keys_kernel` for one spec (``spec.second`` set): as
    :class:`DecodeLaunch`'s, over ``rows`` rows (decode's sequences, or an extend's new
    tokens). ``lengths``: decode's ``(seq_lens,)`` or an extend's ``(row_seq, cu_seqlens,
    prefix_lens)``; ``new``: an extend's ``(k, v)``, else None; ``second``: ``(cache, values,
    block_table, entries, indices)`` (indices None in causal mode)."""

    def __init__(self, spec: DecodeSpec, dtypes):
        self.launch = _second_launcher(spec, dtypes)
        self.head_programs = spec.num_kv_heads * spec.head_blocking[1]
        self.num_splits = spec.num_splits

    def __call__(self, rows, q, k_cache, v_cache, block_table, lengths, new, second, sinks, out,
                 lse, parts, scales):
        grid = (rows, self.head_programs, self.num_splits)
        if len(lengths) == 1:
            seq_lens, = lengths
            row_seq = cu_seqlens = prefix_lens = seq_lens  # not read
        else:
            row_seq, cu_seqlens, prefix_lens = lengths
            seq_lens = prefix_lens  # not read
        k_new, v_new = (q, q) if new is None else new
        x_cache, x_values, x_table, x_entries, idx = second
        part_o, part_lse, ps = split_scratch(parts, out)
        qs, kcs, vcs, os_ = q.stride(), k_cache.stride(), v_cache.stride(), out.stride()
        kns, vns = k_new.stride(), v_new.stride()
        xs, xvs = x_cache.stride(), x_values.stride()
        return self.launch(grid, (
            q, k_cache, v_cache, block_table, seq_lens, row_seq, cu_seqlens, prefix_lens, k_new,
            v_new, x_cache, x_values, x_table, x_entries, q if idx is None else idx,
            q if sinks is None else sinks, out, out if lse is None else lse, part_o, part_lse,
            *scales), (
            qs[0], qs[1], kcs[0], kcs[1], kcs[2], vcs[0], vcs[1], vcs[2], block_table.stride(0),
            kns[0], kns[1], vns[0], vns[1], xs[0], xs[1], xs[2], xvs[0], xvs[1], xvs[2],
            x_table.stride(0), 0 if idx is None else idx.stride(0), os_[0], os_[1],
            0 if lse is None else lse.stride(0), ps[0], ps[1], ps[2], ps[3], ps[4],
            k_cache.shape[0], x_cache.shape[1], x_cache.shape[0],
            0 if idx is None else idx.shape[1], q.shape[0],
            table_keys(block_table, k_cache.shape[1]), table_keys(x_table, x_cache.shape[1])))
