"""Hopper path of decode over a latent cache (DeepSeek's MLA), in Gluon: the same results
contract as :mod:`.decode` (window, sparse keys, splits, sinks, soft-cap, lse, an fp8
cache), for one layout: keys of 576 columns whose first 512 are the values
(``v_cache = k_cache[..., :512]``, :func:`.decode.values_in_keys`), the query heads of a
KV head many (16 or more, in head blocks of 64: MQA).

Why: the Triton kernel takes a group as blocks of 16 head rows, each its own program of
mma.sync products, so every key tile is read and converted once a block (four times for
64 heads) and a program's tiles run one after another behind a chain of small products
(the key loop's latency, not the bytes, sets its time on S:
benchmarks/results/2026-12-04-h200-s-latent-gluon/). Here one program
holds 64 head rows, the M of warpgroup products (``wgmma``) read from shared memory: the
scores ``Q K^T`` over the 512 + 64 columns, the output ``P V`` over the 512 value columns,
split between two warpgroups (each holds a [64, 256] fp32 output, the scores' keys split
the same way); each key tile is read once for the 64 heads.

One program owns (sequence, KV head, block of 64 query heads, split). Its tiles are the
Triton kernel's: the window's keys from its first key ``lo`` in tiles of BN (unaligned:
keys are gathered row by row through the block table), then the sparse keys' tiles; split
``i`` owns one contiguous run of them. A tile's rows are loaded into registers one tile
ahead (its block-table or index entries two tiles ahead), then written to one of two
shared-memory buffers (over fp8 widened to fp16 on the way, exactly) for the products:
the loads of the next tile are in flight while this one's products run. Only rows of
visible keys are loaded; a visible key whose page (or pool row) is outside the cache is not
read: its row reads as zeros and its logit is NaN, so the query heads whose window holds one
come out NaN (output and lse). Every tile is computed under its mask (keys not visible get
logit -inf and rows of zeros).

``bounds="skip"``/``"none"``: split 0 starts at the tile holding position 0 on the grid of
``lo`` and skips, or computes under the mask, the tiles below the window; the tiles and
their arithmetic are otherwise the same, so the three are bit-identical for every split
count.

Runs on sm_90 only, for fp16/bf16 queries over a cache of their dtype or fp8 (e4m3fn,
e5m2: the products in fp16, K's scale in qk_scale and V's on the output);
:func:`unsupported` says why a plan cannot take it.
"""

import functools
from collections import namedtuple

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ..window import clamp_extent
from ._common import table_keys
from ._gluon import GluonRule, decode_seq_ok, device_problem, table_column, uniform, weights
from ._launch import Launch
from .config import LatentDecodeConfig
from .decode_hopper import (
    DecodeStore,
    HopperDecodeFlags,
    Split,
    decode_chunk_first_key,
    decode_first_key,
    finish_hopper_decode,
    split_tiles,
)
from .merge import split_scratch

# The paged cache as the tile rows are found in it (the sequence's block-table row, the
# keys' strides: page, slot, KV head), and the sparse pool (the sequence's index row, its
# entries, the pool's rows, its strides: row, KV head).
Cache = namedtuple("Cache", "k bt_row page_size num_pages stride_p stride_s stride_h ring_width")
LatentPool = namedtuple("LatentPool", "k idx num_sparse rows stride_n stride_h")

# The one layout the kernel is written for: keys of DV + DT columns, the values their first
# DV; the rows of a program (wgmma's M).
HEAD_DIM, HEAD_DIM_V = 576, 512
BLOCK_H = 64


@gluon.constexpr_function
def _product_layout(columns):
    """The registers of a [64, ``columns``] fp32 product of the two warpgroups: each
    holds the 64 rows and half the columns (16-bit operands)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                     instr_shape=[16, columns // 2, 16])


@gluon.constexpr_function
def _row_layout(columns, bits):
    """How the 8 warps read a tile's rows of ``columns`` ``bits``-bit elements: 16 bytes a
    lane where the row is that wide, a row a warp at a time."""
    vec = min(128 // bits, columns // 32)
    return gl.BlockedLayout([1, vec], [1, 32], [8, 1], [1, 0])


@gluon.jit
def _opaque_zero():
    """0, from an instruction the compiler does not evaluate or move out of a loop."""
    return gl.inline_asm_elementwise("mov.u32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False,
                                     pack=1)


@gluon.jit
def _tile_rows(t, tiles, cache, pool, i_kvh, lo, seq_len, BN: gl.constexpr,
               layout: gl.constexpr, HAS_SPARSE: gl.constexpr, RING: gl.constexpr = False):
    """Tile ``t``'s rows (``tiles``: (window tiles, the split's end)): pointers to each
    key's first column in KV head ``i_kvh``, which keys are visible and which of those can
    be read. Window tile t holds keys ``lo + t * BN + [0, BN)``, the sparse tiles follow;
    a tile at or past the split's end holds none. Only entries of keys that could be
    visible are loaded."""
    window_tiles, t_stop = tiles
    o_n = gl.arange(0, BN, layout=layout)
    live = t < t_stop
    k_pos = lo + t * BN + o_n
    m_key = live & (k_pos >= lo) & (k_pos < seq_len) & (t < window_tiles)
    page = gl.load(cache.bt_row + table_column(k_pos // cache.page_size, cache.ring_width, RING),
                   mask=m_key, other=-1)
    m_read = (page >= 0) & (page < cache.num_pages)
    ptrs = cache.k + (page.to(gl.int64) * cache.stride_p + (k_pos % cache.page_size)
                      * cache.stride_s + i_kvh * cache.stride_h)
    if HAS_SPARSE:
        if t >= window_tiles:
            o_i = (t - window_tiles) * BN + o_n
            row = gl.load(pool.idx + o_i, mask=live & (o_i < pool.num_sparse), other=-1)
            m_key = row != -1
            m_read = (row >= 0) & (row < pool.rows)
            ptrs = pool.k + (row.to(gl.int64) * pool.stride_n + i_kvh * pool.stride_h)
    return ptrs, m_key, m_key & m_read


@gluon.jit
def _load_rows(ptrs, m_read, COLS: gl.constexpr, OFFSET: gl.constexpr, layout: gl.constexpr):
    """Columns ``[OFFSET, OFFSET + COLS)`` of the rows at ``ptrs`` (zeros where not
    ``m_read``), in ``layout``."""
    rows: gl.constexpr = gl.SliceLayout(1, layout)
    cols = OFFSET + gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
    p = gl.convert_layout(ptrs, rows)
    m = gl.convert_layout(m_read, rows)
    return gl.load(p[:, None] + cols[None, :], mask=m[:, None], other=0.0)


@gluon.jit
def _latent_decode_kernel(
    Q, K_cache, block_table, seq_lens, sinks, K_pool, Idx, Out, Lse, Part_o, Part_lse,
    k_scale, v_scale, stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_bt,
    stride_pn, stride_ph, stride_ib, stride_ob, stride_oh, stride_lb, stride_pb, stride_psh,
    stride_ps, stride_plb, stride_plh, num_pages, pool_rows, num_sparse, cached_keys, ring_width,
    num_kv_heads, num_splits, qk_scale, softcap, window_left, attention_chunk, PAGE: gl.constexpr,
    DV: gl.constexpr, DT: gl.constexpr, GROUP: gl.constexpr, HEAD_BLOCKS: gl.constexpr,
    BN: gl.constexpr, USE_WINDOW: gl.constexpr, HAS_SINKS: gl.constexpr,
    USE_SOFTCAP: gl.constexpr, HAS_SPARSE: gl.constexpr, WRITE_PARTIAL: gl.constexpr,
    RETURN_LSE: gl.constexpr, TIGHT: gl.constexpr, SKIP: gl.constexpr, PDL: gl.constexpr,
    K_SCALE_STRIDE: gl.constexpr, V_SCALE_STRIDE: gl.constexpr, USE_CHUNK: gl.constexpr,
    RING: gl.constexpr,
):
    if PDL:
        # The split merge, launched as this kernel's programmatic dependent, may start once
        # every program has (it waits for this kernel's end before reading the parts).
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [],
                                  dtype=gl.int32, is_pure=False, pack=1)
    BM: gl.constexpr = 64
    FP8: gl.constexpr = K_cache.dtype.element_ty.is_fp8()
    # The products' operand type: the query's, or over an fp8 cache fp16 (every fp8 value
    # is an fp16 value; a bf16 query within fp16's range is one too).
    dtype: gl.constexpr = gl.float16 if FP8 else Q.dtype.element_ty
    flags: gl.constexpr = HopperDecodeFlags(DV, GROUP, BM, BN, 2, USE_WINDOW, False, False,
                                            HAS_SINKS, USE_SOFTCAP, WRITE_PARTIAL, RETURN_LSE,
                                            SKIP, FP8, K_SCALE_STRIDE, V_SCALE_STRIDE,
                                            HEAD_BLOCKS, 1, TIGHT, USE_CHUNK, RING)

    # Axis 0: (sequence, KV head, head block), the heads fastest.
    item = gl.program_id(0)
    i_split = gl.program_id(1)
    i_hb = item % HEAD_BLOCKS
    i_kvh = item // HEAD_BLOCKS % num_kv_heads
    i_seq = (item // HEAD_BLOCKS // num_kv_heads).to(gl.int64)
    seq_len = uniform(gl.load(seq_lens + i_seq))
    # A length that is not well formed walks no key of the window; its output is NaN
    # (finish_hopper_decode: Split.ok).
    ok = decode_seq_ok(seq_len, cached_keys)
    seq_len = gl.where(ok, seq_len, 0)
    lo = 0
    if USE_WINDOW:
        lo = uniform(decode_first_key(seq_len, window_left))
    if USE_CHUNK:
        # Chunked attention: nothing below the query's chunk (the keys' mask is [lo, end)).
        lo = uniform(gl.maximum(lo, decode_chunk_first_key(seq_len, attention_chunk)))
    # The sequence's tiles: the window's from lo, then the sparse keys'; split i_split owns
    # [t_start, t_stop) of them (not tight, split 0 from the tile holding position 0).
    window_tiles = (seq_len - lo + BN - 1) // BN
    total_tiles = window_tiles
    if HAS_SPARSE:
        total_tiles = window_tiles + (num_sparse + BN - 1) // BN
    t_start, t_stop = split_tiles(0, total_tiles, num_splits, i_split)
    t_start = uniform(t_start)
    t_stop = uniform(t_stop)
    if not TIGHT:
        if t_start == 0:
            t_start = -((lo + BN - 1) // BN)

    # The head block's query rows (zero past the group) in shared memory, in the products'
    # type: the value columns and the tail apart.
    q_read: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
    rows = i_hb * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, q_read))
    p_q = Q + i_seq * stride_qb + (i_kvh * GROUP + rows)[:, None] * stride_qh
    m_q = (rows < GROUP)[:, None]
    cols = gl.arange(0, DV, layout=gl.SliceLayout(0, q_read))
    b_q = gl.load(p_q + cols[None, :], mask=m_q, other=0.0).to(dtype)
    q_main = gl.allocate_shared_memory(dtype, [1, BM, DV],
                                       gl.NVMMASharedLayout.get_default_for([BM, DV], dtype))
    q_main.index(0).store(b_q)
    cols_t = DV + gl.arange(0, DT, layout=gl.SliceLayout(0, q_read))
    b_qt = gl.load(p_q + cols_t[None, :], mask=m_q, other=0.0).to(dtype)
    q_tail = gl.allocate_shared_memory(dtype, [1, BM, DT],
                                       gl.NVMMASharedLayout.get_default_for([BM, DT], dtype))
    q_tail.index(0).store(b_qt)
    # Two buffers of a key tile (its value columns and its tail): one is written while
    # the other's products run.
    k_main = gl.allocate_shared_memory(dtype, [2, BN, DV],
                                       gl.NVMMASharedLayout.get_default_for([BN, DV], dtype))
    k_tail = gl.allocate_shared_memory(dtype, [2, BN, DT],
                                       gl.NVMMASharedLayout.get_default_for([BN, DT], dtype))

    s_layout: gl.constexpr = _product_layout(BN)
    o_layout: gl.constexpr = _product_layout(DV)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    bits: gl.constexpr = K_cache.dtype.element_ty.primitive_bitwidth
    main_read: gl.constexpr = _row_layout(DV, bits)
    tail_read: gl.constexpr = _row_layout(DT, bits)
    entry: gl.constexpr = gl.SliceLayout(1, main_read)
    keys_s: gl.constexpr = gl.SliceLayout(0, s_layout)

    # (the page size a constexpr: a key's page and slot are a shift and a mask where it is a
    # power of two, not an integer division; a tenth of the loop's instructions at BN 32)
    cache = Cache(K_cache, block_table + i_seq * stride_bt, PAGE, num_pages, stride_kp,
                  stride_ks, stride_kh, ring_width)
    pool = None
    if HAS_SPARSE:
        pool = LatentPool(K_pool, Idx + i_seq * stride_ib, num_sparse, pool_rows, stride_pn,
                          stride_ph)
    tiles = (window_tiles, t_stop)
    scale = qk_scale
    if FP8:
        # The cache holds value / scale: K's scale joins the scores' (V's:
        # finish_hopper_decode).
        scale = qk_scale * gl.load(k_scale + i_kvh * K_SCALE_STRIDE)
    rule = GluonRule(scale, softcap, window_left, 0)

    m_i = gl.full([BM], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BM], gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BM, DV], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BM, BN], gl.float32, layout=s_layout)

    # The pipeline: tile t's rows in registers, tile t + 1's entries.
    ptrs, _key, m_read = _tile_rows(t_start, tiles, cache, pool, i_kvh, lo, seq_len, BN,
                                    entry, HAS_SPARSE, RING)
    r_main = _load_rows(ptrs, m_read, DV, 0, main_read)
    r_tail = _load_rows(ptrs, m_read, DT, DV, tail_read)
    n_ptrs, _key, n_read = _tile_rows(t_start + 1, tiles, cache, pool, i_kvh, lo, seq_len, BN,
                                      entry, HAS_SPARSE, RING)
    for t in range(t_start, t_stop):
        buf = (t - t_start) % 2
        k_m = k_main.index(buf)
        k_t = k_tail.index(buf)
        k_m.store(r_main.to(dtype))
        k_t.store(r_tail.to(dtype))
        fence_async_shared()
        gl.thread_barrier()
        # The next tile's rows, and the one after's entries, in flight during this one's
        # products.
        r_main = _load_rows(n_ptrs, n_read, DV, 0, main_read)
        r_tail = _load_rows(n_ptrs, n_read, DT, DV, tail_read)
        n_ptrs, _key, n_read = _tile_rows(t + 2, tiles, cache, pool, i_kvh, lo, seq_len, BN,
                                          entry, HAS_SPARSE, RING)
        # Under SKIP the tiles below the window (t < 0) take no product.
        if (not SKIP) or (t >= 0):
            # (the query's buffers indexed by a zero the compiler cannot see through: else
            # it keeps the 36 products' shared-memory descriptors in registers across the
            # loop, which spills)
            z = _opaque_zero()
            s_tok = warpgroup_mma(q_main.index(z), k_m.permute((1, 0)), s_zero, use_acc=False,
                                  is_async=True)
            s_tok = warpgroup_mma(q_tail.index(z), k_t.permute((1, 0)), s_tok, is_async=True)
            # The tile's keys again, as the scores hold them (their entries are in L1).
            _ptrs, key, read = _tile_rows(t, tiles, cache, pool, i_kvh, lo, seq_len, BN,
                                          keys_s, HAS_SPARSE, RING)
            s = warpgroup_mma_wait(0, deps=(s_tok, ))
            # A visible key not read (its row zeros) gets logit NaN: its query rows' l and
            # output come out NaN.
            s = gl.where((key & (read == 0))[None, :], float("nan"), s)
            m_i, l_i, p, alpha = weights(s, m_i, l_i, None, None, seq_len, rule, flags, True,
                                         keep=key[None, :])
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            p_op = gl.convert_layout(p.to(dtype), p_layout)
            acc_tok = warpgroup_mma(p_op, k_m, acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=(acc_tok, ))
    split = Split(i_seq, i_kvh, i_hb, i_split, seq_len, lo, t_start, t_stop, ok)
    store = DecodeStore(sinks, Out, Lse, Part_o, Part_lse, stride_ob, stride_oh, stride_lb,
                        stride_pb, stride_psh, stride_ps, stride_plb, stride_plh, v_scale)
    finish_hopper_decode(m_i, l_i, acc, store, split, flags, o_layout)


# --------------------------------------------------------------------------------------
# Host side.
# --------------------------------------------------------------------------------------

def unsupported(device, dtype, head_dim, head_dim_v, group, kv_dtype=None,
                config=LatentDecodeConfig()):
    """Why a plan cannot take this path (a sentence), or None when it can; whether a run's
    values are its keys' first columns is asked at run time (:func:`.decode.values_in_keys`:
    a run whose are not takes the Triton kernel). ``kv_dtype``: the cache's, where it is
    fp8."""
    problem = device_problem(device, dtype, kv_dtype)
    if problem is not None:
        return problem
    if (head_dim, head_dim_v) != (HEAD_DIM, HEAD_DIM_V):
        return (f"it takes keys of {HEAD_DIM} columns whose first {HEAD_DIM_V} are the values "
                f"(a latent cache), got D={head_dim}, Dv={head_dim_v}")
    if group < config.min_group:
        return (f"it takes groups of at least {config.min_group} query heads a KV head, got "
                f"{group}")
    return None


_TENSORS = ("Q", "K_cache", "block_table", "seq_lens", "sinks", "K_pool", "Idx", "Out", "Lse",
            "Part_o", "Part_lse", "k_scale", "v_scale")
_INTS = ("stride_qb", "stride_qh", "stride_kp", "stride_ks", "stride_kh", "stride_bt",
         "stride_pn", "stride_ph", "stride_ib", "stride_ob", "stride_oh", "stride_lb",
         "stride_pb", "stride_psh", "stride_ps", "stride_plb", "stride_plh", "num_pages",
         "pool_rows", "num_sparse", "cached_keys", "ring_width")


@functools.lru_cache(maxsize=64)
def _launcher(spec, dtypes):
    cfg = spec.latent_config
    if (cfg.block_h, cfg.num_warps) != (BLOCK_H, 8):
        raise ValueError(f"the latent decode kernel is written for {BLOCK_H} head rows and 8 "
                         f"warps, got block_h={cfg.block_h}, num_warps={cfg.num_warps}")
    fixed = dict(
        PAGE=spec.page_size, num_kv_heads=spec.num_kv_heads, num_splits=spec.num_splits,
        qk_scale=spec.qk_scale, softcap=float(spec.softcap),
        window_left=clamp_extent(spec.window_left or 0),
        DV=HEAD_DIM_V, DT=HEAD_DIM - HEAD_DIM_V, GROUP=spec.group,
        HEAD_BLOCKS=-(-spec.group // BLOCK_H), BN=cfg.block_n,
        USE_WINDOW=spec.window_left is not None, HAS_SINKS=spec.has_sinks,
        USE_SOFTCAP=spec.softcap > 0, HAS_SPARSE=spec.has_sparse,
        WRITE_PARTIAL=spec.num_splits > 1, RETURN_LSE=spec.return_lse,
        TIGHT=spec.bounds == "tight", SKIP=spec.bounds == "skip", PDL=spec.pdl,
        K_SCALE_STRIDE=spec.scale_strides[0], V_SCALE_STRIDE=spec.scale_strides[1],
        attention_chunk=clamp_extent(spec.attention_chunk or 1),
        USE_CHUNK=spec.attention_chunk is not None, RING=spec.ring)
    return Launch(_latent_decode_kernel, fixed, {"num_warps": cfg.num_warps}, _TENSORS, _INTS,
                  dtypes)


class LatentDecodeLaunch:
    """This kernel's launch for one spec (its ``latent_config`` set), bound once; a call
    takes :class:`.decode.DecodeLaunch`'s arguments (``v_cache`` and the pool's values
    are the keys' first columns: not read apart) and returns what
    ``ops._launch.relaunch`` takes, or None."""

    def __init__(self, spec, dtypes):
        self.launch = _launcher(spec, dtypes)
        self.programs = spec.num_kv_heads * -(-spec.group // BLOCK_H)
        self.num_splits = spec.num_splits
        self.has_sparse = spec.has_sparse
        self.ring = spec.ring

    def __call__(self, batch, q, k_cache, v_cache, block_table, seq_lens, sinks, sparse, out, lse,
                 parts, scales):
        if self.has_sparse:
            k_pool, _, idx = sparse
            kps = k_pool.stride()
            pool = (kps[0], kps[1], idx.stride(0), k_pool.shape[0], idx.shape[1])
        else:
            k_pool = idx = q  # not read
            pool = (0, 0, 0, 0, 0)
        part_o, part_lse, ps = split_scratch(parts, out)
        qs, kcs, os_ = q.stride(), k_cache.stride(), out.stride()
        return self.launch((batch * self.programs, self.num_splits, 1), (
            q, k_cache, block_table, seq_lens, q if sinks is None else sinks, k_pool, idx, out,
            out if lse is None else lse, part_o, part_lse, *scales), (
            qs[0], qs[1], kcs[0], kcs[1], kcs[2], block_table.stride(0), pool[0], pool[1],
            pool[2], os_[0], os_[1], 0 if lse is None else lse.stride(0), *ps,
            k_cache.shape[0], pool[3], pool[4],
            table_keys(block_table, k_cache.shape[1], self.ring),
            block_table.shape[1] if self.ring else 1))
