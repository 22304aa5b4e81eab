"""Hopper fast path of the decode kernel, in Gluon: the same results contract as
:mod:`.decode` (window, splits, sinks, soft-cap, lse), with the window's pages brought in
by the copy engine (TMA) into a ring of STAGES shared-memory K/V buffers by a producer
warp while one warpgroup computes (warp-specialized).

Why: the Triton kernel holds one K/V tile in flight a program, so it keeps its rate only
with four programs an SM, and a batch of long windows makes one wave whose end its
slowest SMs set. Here a program keeps STAGES tiles in flight and one thread issues them,
so two programs an SM stream as fast: long windows run whole in two waves, the second's
programs starting wherever the first's end, with no split and no merge (the
decode-split-balance and hopper-decode results). Short windows keep the Triton kernel
(config.HopperDecodeConfig.min_keys).

One program owns (sequence, KV head, split); the query heads of the group are the rows
of a 64-row tile (wgmma's M; rows past the group are zero and not stored). Key tiles are
64 keys on the grid of absolute positions (a page copy cannot start mid-page): tight
walks the tiles from the one holding the window's first key to the one holding the last
key, and only the first and last are masked; a page copy is issued only for a page
holding a key in ``[first key, seq_len)``, so no block-table entry below the window or
past the end is read (a copy left out reads a row past the cache's last: zeros for V, NaN
for K, whose descriptor pads with NaN; those keys are masked). An entry outside
``[0, num_pages)`` is not copied either: its keys read as NaN, so the output comes out NaN. The
boundary tiles' V rows outside ``[first key, seq_len)`` are zeroed in shared memory
before their product (rows past the end are unwritten: NaN in the tests; their weight is
0, but 0 * NaN is not). With splits, split i owns one contiguous run of those tiles and
writes a sink-free partial for :func:`.merge.launch_merge`.

``bounds="skip"``/``"none"``: split 0 walks from tile 0 and skips (no copy, no wait, no
product), or computes under the mask, the tiles below the window (their copies all read
zeros); the tiles and their arithmetic are otherwise the same, so the three are
bit-identical for every split count.

An fp8 cache (e4m3fn or e5m2, value / scale): the ring holds fp8 pages (half the bytes a
stage), and converter warps widen each stage's K and V to fp16 tiles in a second ring
(V's rows outside the keys zeroed there) for the warpgroup, whose products then run in
fp16 (a bf16 query converted once); K's scale joins qk_scale and V's multiplies the output.
A page not copied reads rows of fp8 NaN for K (the copy engine pads fp8 with zeros only).

Runs on sm_90 only, for fp16/bf16 queries over a cache of their dtype or fp8, D = Dv in
(64, 128), groups of at most 64 query heads, page sizes that are multiples of 16 dividing or
divided by 64, no sparse keys; :func:`unsupported` says why a launch cannot take it.
"""

import functools
from collections import namedtuple

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier,
                                                              warpgroup_mma, warpgroup_mma_wait)

from .. import window
from ._common import compile_bound
from ._gluon import (GL_DTYPES, Rule, descriptor, issue, operand_layout, poison_descriptor,
                     tile_pages, uniform, weights, wgmma_layout)
from ._launch import Descriptor, Launch
from ._validate import FP8_DTYPES
from .config import HopperDecodeConfig
from .merge import split_scratch

# The head dims the kernel is written for; its tiling is a frozen config of the plan
# (config.HopperDecodeConfig).
HEAD_DIMS = (64, 128)

decode_first_key = compile_bound(window.decode_first_key, gluon.jit, globals())
aligned_tiles = compile_bound(window.aligned_tiles, gluon.jit, globals())
split_tiles = compile_bound(window.split_tiles, gluon.jit, globals())

# The warpgroup's arguments, bundled once by the kernel (a namedtuple compiles to its
# fields); the scores rule travels as _gluon.Rule. IS_CAUSAL and USE_RIGHT are False (a
# decode query sees every key up to its own), named for _gluon.weights.
DecodeFlags = namedtuple("DecodeFlags", "D GROUP BM BN STAGES USE_WINDOW IS_CAUSAL USE_RIGHT "
                         "HAS_SINKS USE_SOFTCAP WRITE_PARTIAL RETURN_LSE SKIP FP8 "
                         "V_SCALE_STRIDE")  # constexprs
# The K/V ring: STAGES [BN, D] tiles each in shared memory, their copies' barriers, the
# barriers on which a stage is released to the producer; over an fp8 cache, the ring of
# WIDE_STAGES fp16 K/V tiles the converter widens the stages into, and its barriers: full
# (for the warpgroup) and empty (for the converter). None over a 16-bit cache.
DecodeRing = namedtuple("DecodeRing", "k_smem v_smem bar_k bar_v empty k_wide v_wide wide_full "
                        "wide_empty")
# Shared memory stages of the widened ring (config.HopperDecodeConfig's fp8 budget).
WIDE_STAGES = gl.constexpr(2)
# Where the output goes: out and lse, or with split-KV the split's partial state; an fp8
# cache's V scale (None over a 16-bit one).
DecodeStore = namedtuple("DecodeStore", "sinks out lse part_o part_lse stride_ob stride_oh "
                         "stride_lb stride_pb stride_ph stride_ps stride_plb stride_plh v_scale")
# The program's sequence, KV head and split, the sequence's length and first visible key,
# the split's tiles [t_start, t_stop).
Split = namedtuple("Split", "i_seq i_kvh i_split seq_len lo t_start t_stop")


@gluon.jit
def _tile_range(seq_len, window_left, i_split, num_splits, BN: gl.constexpr,
                USE_WINDOW: gl.constexpr, TIGHT: gl.constexpr):
    """(first visible key, first tile, end tile) of split ``i_split``: the tight tiles
    ``[lo // BN, cdiv(seq_len, BN))`` cut into ``num_splits`` contiguous runs; not TIGHT,
    split 0's run starts at tile 0."""
    lo = 0
    if USE_WINDOW:
        lo = decode_first_key(seq_len, window_left)
    t_lo, t_end = aligned_tiles(lo, seq_len, BN)
    t_start, t_stop = split_tiles(t_lo, t_end, num_splits, i_split)
    if not TIGHT:
        if i_split == 0:
            t_start = 0
    return lo, t_start, t_stop


@gluon.jit
def _has_work(key0, lo, seq_len, BN: gl.constexpr, SKIP: gl.constexpr):
    """Whether the tile at key ``key0`` is loaded and computed: always, except under SKIP
    where a tile holding no key of ``[lo, seq_len)`` takes no stage of the ring, no copy
    and no product (the producer and the warpgroup ask the same question)."""
    work = True
    if SKIP:
        work = (key0 + BN > lo) & (key0 < seq_len)
    return work


@gluon.jit
def _zero_outside(buf, key0, lo, key_end, BN: gl.constexpr, D: gl.constexpr):
    """Zero the rows of a V tile in shared memory outside ``[lo, key_end)``: the boundary
    tiles' rows below the window and past the end (unwritten: NaN in the tests)."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    for i in gl.static_range(BN // 16):
        rows = buf.slice(i * 16, 16)
        b_v = rows.load(layout)  # [16, D]
        keys = key0 + i * 16 + gl.arange(0, 16, layout=gl.SliceLayout(1, layout))
        rows.store(gl.where(((keys >= lo) & (keys < key_end))[:, None], b_v, gl.zeros_like(b_v)))
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def _widen(src, dst, key0, lo, key_end, MASKED: gl.constexpr, BN: gl.constexpr, D: gl.constexpr,
           WARPS: gl.constexpr):
    """An fp8 tile of the ring (``src``, [BN, D]) converted to fp16 into ``dst`` for the
    products (exactly: every fp8 value is an fp16 value; one packed conversion a pair), 16
    rows at a time. MASKED (a V tile at the window's edges): rows outside
    ``[lo, key_end)`` are written as 0, as :func:`_zero_outside` does for a 16-bit tile."""
    layout: gl.constexpr = gl.BlockedLayout([1, 16], [32 // (D // 16), D // 16], [WARPS, 1],
                                            [1, 0])
    rows: gl.constexpr = (32 // (D // 16)) * WARPS
    for r in gl.static_range(BN // rows):
        b = src.slice(r * rows, rows).load(layout).to(gl.float16)  # [rows, D]
        if MASKED:
            keys = key0 + r * rows + gl.arange(0, rows, layout=gl.SliceLayout(1, layout))
            b = gl.where(((keys >= lo) & (keys < key_end))[:, None], b, gl.zeros_like(b))
        dst.slice(r * rows, rows).store(b)


@gluon.jit
def _convert(ring, split, flags):
    """The converter warps (over an fp8 cache): for the i-th tile with work, once the
    producer's copies have landed and the warpgroup has released widened stage i %
    WIDE_STAGES, its K and V widened into that stage (V's rows outside the keys zeroed in
    an edge tile), then the fp8 stage released to the producer and the widened one handed
    to the warpgroup. Off the warpgroup's path, so the conversion runs beside the products."""
    BN: gl.constexpr = flags.BN
    D: gl.constexpr = flags.D
    STAGES: gl.constexpr = flags.STAGES
    WARPS: gl.constexpr = gl.num_warps()
    seq_len, lo = uniform(split.seq_len), uniform(split.lo)
    t_start, t_stop = uniform(split.t_start), uniform(split.t_stop)
    i = 0  # tiles widened so far
    for j in range(t_start, t_stop):
        key0 = j * BN
        if _has_work(key0, lo, seq_len, BN, flags.SKIP):
            st = i % STAGES
            w = i % WIDE_STAGES
            mbarrier.wait(ring.wide_empty.index(w), ((i // WIDE_STAGES) & 1) ^ 1)
            mbarrier.wait(ring.bar_k.index(st), (i // STAGES) & 1)
            _widen(ring.k_smem.index(st), ring.k_wide.index(w), key0, lo, seq_len, False, BN, D,
                   WARPS)
            mbarrier.wait(ring.bar_v.index(st), (i // STAGES) & 1)
            if (key0 >= lo) & (key0 + BN <= seq_len):
                _widen(ring.v_smem.index(st), ring.v_wide.index(w), key0, lo, seq_len, False, BN,
                       D, WARPS)
            else:
                _widen(ring.v_smem.index(st), ring.v_wide.index(w), key0, lo, seq_len, True, BN,
                       D, WARPS)
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(ring.empty.index(st))
            mbarrier.arrive(ring.wide_full.index(w))
            i += 1


@gluon.jit
def _consume(q_smem, ring, store, split, rule, flags):
    """The warpgroup: tile j's scores, softmax and P @ V once its K/V copies have landed
    (over an fp8 cache: once the converter has widened them), then its stage released to
    the producer (or the widened one to the converter); the output (or the split's
    partial) stored."""
    D: gl.constexpr = flags.D
    BM: gl.constexpr = flags.BM
    BN: gl.constexpr = flags.BN
    STAGES: gl.constexpr = flags.STAGES
    k_smem, v_smem = ring.k_smem, ring.v_smem
    # A partition's arguments come through shared memory: per-thread values to ptxas,
    # made warp-uniform again for the loop and its branches.
    seq_len, lo = uniform(split.seq_len), uniform(split.lo)
    t_start, t_stop = uniform(split.t_start), uniform(split.t_stop)
    s_layout: gl.constexpr = wgmma_layout(BN)
    o_layout: gl.constexpr = wgmma_layout(D)
    p_layout: gl.constexpr = operand_layout(o_layout)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    col_o: gl.constexpr = gl.SliceLayout(0, o_layout)
    dtype: gl.constexpr = q_smem.dtype

    # Every row is the query at seq_len - 1: window.visible's predicate with the key end.
    q_pos = gl.full([BM], seq_len - 1, gl.int32, layout=row_s)
    o_n = gl.arange(0, BN, layout=col_s)
    m_i = gl.full([BM], float("-inf"), gl.float32, layout=row_s)
    l_i = gl.zeros([BM], gl.float32, layout=row_s)
    acc = gl.zeros([BM, D], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BM, BN], gl.float32, layout=s_layout)
    i = 0  # tiles taken from the ring so far
    for j in range(t_start, t_stop):
        key0 = j * BN
        if _has_work(key0, lo, seq_len, BN, flags.SKIP):
            st = i % STAGES
            phase = (i // STAGES) & 1
            if flags.FP8:
                # The converter's widened stage (fp16 K and V, V's rows outside the keys 0).
                w = i % WIDE_STAGES
                mbarrier.wait(ring.wide_full.index(w), (i // WIDE_STAGES) & 1)
                s_tok = warpgroup_mma(q_smem, ring.k_wide.index(w).permute((1, 0)), s_zero,
                                      use_acc=False, is_async=True)
            else:
                mbarrier.wait(ring.bar_k.index(st), phase)
                mbarrier.wait(ring.bar_v.index(st), phase)
                s_tok = warpgroup_mma(q_smem, k_smem.index(st).permute((1, 0)), s_zero,
                                      use_acc=False, is_async=True)
            s = warpgroup_mma_wait(0, deps=(s_tok, ))
            if (key0 >= lo) & (key0 + BN <= seq_len):
                m_i, l_i, p, alpha = weights(s, m_i, l_i, q_pos, key0 + o_n, seq_len, rule, flags,
                                             False)
            else:
                m_i, l_i, p, alpha = weights(s, m_i, l_i, q_pos, key0 + o_n, seq_len, rule, flags,
                                             True)
                if not flags.FP8:
                    _zero_outside(v_smem.index(st), key0, lo, seq_len, BN, D)
            acc = acc * gl.convert_layout(alpha, row_o)[:, None]
            p_op = gl.convert_layout(p.to(dtype), p_layout)
            if flags.FP8:
                acc_tok = warpgroup_mma(p_op, ring.v_wide.index(w), acc, is_async=True)
                acc = warpgroup_mma_wait(0, deps=(acc_tok, ))
                mbarrier.arrive(ring.wide_empty.index(w))
            else:
                acc_tok = warpgroup_mma(p_op, v_smem.index(st), acc, is_async=True)
                acc = warpgroup_mma_wait(0, deps=(acc_tok, ))
                mbarrier.arrive(ring.empty.index(st))
            i += 1

    # _common.finish: o = acc / (l + e^{sink - m}), 0 and lse -inf where no key is visible,
    # NaN where a visible key's page was bad.
    rows = gl.arange(0, BM, layout=row_o)
    head = split.i_kvh * flags.GROUP + rows
    m_row = rows < flags.GROUP
    m_safe = gl.convert_layout(gl.where(m_i == float("-inf"), 0.0, m_i), row_o)
    l_o = gl.convert_layout(l_i, row_o)
    if flags.FP8:
        # The cache holds value / scale: V's scale multiplies the output (K's is in qk_scale).
        acc = acc * gl.load(store.v_scale + split.i_kvh * flags.V_SCALE_STRIDE)
    denom = l_o
    if flags.HAS_SINKS and not flags.WRITE_PARTIAL:
        sink = gl.load(store.sinks + head, mask=m_row, other=0.0)
        denom = l_o + gl.exp2(sink * 1.4426950408889634 - m_safe)
    o = gl.where((l_o == 0.0)[:, None], 0.0, acc / denom[:, None])
    lse = gl.where(l_o == 0.0, float("-inf"), (m_safe + gl.log2(l_o)) * 0.6931471805599453)
    cols = gl.arange(0, D, layout=col_o)
    i_seq, i_split = split.i_seq, split.i_split
    if flags.WRITE_PARTIAL:
        p_o = (store.part_o + i_seq * store.stride_pb + head[:, None] * store.stride_ph
               + i_split * store.stride_ps)
        gl.store(p_o + cols[None, :], o, mask=m_row[:, None])
        gl.store(store.part_lse + i_seq * store.stride_plb + head * store.stride_plh + i_split,
                 lse, mask=m_row)
    else:
        p_o = store.out + i_seq * store.stride_ob + head[:, None] * store.stride_oh + cols[None, :]
        gl.store(p_o, o.to(store.out.dtype.element_ty), mask=m_row[:, None])
        if flags.RETURN_LSE:
            gl.store(store.lse + i_seq * store.stride_lb + head, lse, mask=m_row)


@gluon.jit
def _produce(kc_desc, vc_desc, poison, k_smem, v_smem, bar_k, bar_v, empty, bt_row, seq_len,
             lo, t_start, t_stop, col, oob_row, PAGE: gl.constexpr, PR: gl.constexpr,
             NP: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
             SKIP: gl.constexpr):
    """The producer warp: for the i-th tile with work (:func:`_has_work`), its block-table
    entries, then its K and V page copies into stage i % STAGES once the warpgroup has
    released that stage's previous tile (the first round passes at once). ``poison``: an
    fp8 cache's NaN rows, read for K in the place of a page not copied (None: K's
    descriptor pads with NaN)."""
    seq_len, lo = uniform(seq_len), uniform(lo)
    t_start, t_stop = uniform(t_start), uniform(t_stop)
    i = 0  # tiles put in the ring so far
    for j in range(t_start, t_stop):
        start = j * BN
        if _has_work(start, lo, seq_len, BN, SKIP):
            st = i % STAGES
            free = ((i // STAGES) & 1) ^ 1
            pages, valid = tile_pages(bt_row, start, seq_len, lo, True, oob_row, PAGE, PR, NP)
            mbarrier.wait(empty.index(st), free)
            issue(kc_desc, kc_desc, bar_k.index(st), k_smem.index(st), True, False, start, 0,
                   col, pages, valid, oob_row, PAGE, PR, NP, BN, D, poison)
            issue(vc_desc, vc_desc, bar_v.index(st), v_smem.index(st), True, False, start, 0,
                   col, pages, valid, oob_row, PAGE, PR, NP, BN, D)
            i += 1


@gluon.jit
def _hopper_decode_kernel(
    kc_desc, vc_desc, poison, Q, block_table, seq_lens, sinks, Out, Lse, Part_o, Part_lse,
    k_scale, v_scale, stride_qb, stride_qh, stride_bt, stride_ob, stride_oh, stride_lb,
    stride_pb, stride_ph, stride_ps, stride_plb, stride_plh, num_kv_heads, num_splits, oob_row,
    qk_scale, softcap, window_left,
    D: gl.constexpr, GROUP: gl.constexpr, PAGE: gl.constexpr, BM: gl.constexpr,
    BN: gl.constexpr, STAGES: gl.constexpr, Q_LAYOUT: gl.constexpr, USE_WINDOW: gl.constexpr,
    HAS_SINKS: gl.constexpr, USE_SOFTCAP: gl.constexpr, WRITE_PARTIAL: gl.constexpr,
    RETURN_LSE: gl.constexpr, TIGHT: gl.constexpr, SKIP: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, PDL: gl.constexpr, WIDE_LAYOUT: gl.constexpr,
    K_SCALE_STRIDE: gl.constexpr, V_SCALE_STRIDE: gl.constexpr, CONVERT_WARPS: gl.constexpr,
    CONVERT_REGS: gl.constexpr,
):
    if PDL:
        # The split merge, launched as this kernel's programmatic dependent, may start once
        # every program has (it waits for this kernel's end before reading the parts).
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [],
                                  dtype=gl.int32, is_pure=False, pack=1)
    PR: gl.constexpr = PAGE if PAGE < BN else BN
    NP: gl.constexpr = BN // PR
    # Axis 0 runs over (sequence, KV head), the heads fastest: a sequence's programs start
    # side by side and read its pages' rows (every KV head of a token, one run) together.
    i_seq = gl.program_id(0) // num_kv_heads
    i_kvh = gl.program_id(0) % num_kv_heads
    i_split = gl.program_id(1)
    seq_len = gl.load(seq_lens + i_seq)
    lo, t_start, t_stop = _tile_range(seq_len, window_left, i_split, num_splits, BN, USE_WINDOW,
                                      TIGHT)
    i_seq = i_seq.to(gl.int64)
    bt_row = block_table + i_seq * stride_bt

    # The group's query rows, zero past the group, into shared memory for the products.
    # Over an fp8 cache (value / scale in the ring) the products run in fp16: the tiles
    # widen to fp16 in one packed conversion a pair (to bf16 they would go through fp32),
    # and a bf16 query within fp16's range is an fp16 value; K's scale joins qk_scale.
    FP8: gl.constexpr = kc_desc.dtype.is_fp8()
    q_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    rows = gl.arange(0, BM, layout=gl.SliceLayout(1, q_layout))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, q_layout))
    p_q = Q + i_seq * stride_qb + (i_kvh * GROUP + rows)[:, None] * stride_qh + cols[None, :]
    b_q = gl.load(p_q, mask=(rows < GROUP)[:, None], other=0.0)
    k_wide = None
    v_wide = None
    wide_full = None
    wide_empty = None
    if FP8:
        b_q = b_q.to(gl.float16)
        qk_scale = qk_scale * gl.load(k_scale + i_kvh * K_SCALE_STRIDE)
        k_wide = gl.allocate_shared_memory(gl.float16, [WIDE_STAGES, BN, D], WIDE_LAYOUT)
        v_wide = gl.allocate_shared_memory(gl.float16, [WIDE_STAGES, BN, D], WIDE_LAYOUT)
        wide_full = gl.allocate_shared_memory(gl.int64, [WIDE_STAGES, 1],
                                              mbarrier.MBarrierLayout())
        wide_empty = gl.allocate_shared_memory(gl.int64, [WIDE_STAGES, 1],
                                               mbarrier.MBarrierLayout())
        for i in gl.static_range(WIDE_STAGES):
            mbarrier.init(wide_full.index(i), count=1)
            mbarrier.init(wide_empty.index(i), count=1)
    q_smem = gl.allocate_shared_memory(b_q.dtype, [BM, D], Q_LAYOUT, b_q)
    k_smem = gl.allocate_shared_memory(kc_desc.dtype, [STAGES, BN, D], kc_desc.layout)
    v_smem = gl.allocate_shared_memory(vc_desc.dtype, [STAGES, BN, D], vc_desc.layout)
    bar_k = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    bar_v = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bar_k.index(i), count=1)
        mbarrier.init(bar_v.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    fence_async_shared()

    # Bundles; the constexpr one is assigned as a constexpr (a plain assignment would turn
    # its values into run-time ones), and the rule is built in the call, keeping its 0 a
    # constexpr (see extend_hopper).
    flags: gl.constexpr = DecodeFlags(D, GROUP, BM, BN, STAGES, USE_WINDOW, False, False,
                                      HAS_SINKS, USE_SOFTCAP, WRITE_PARTIAL, RETURN_LSE, SKIP,
                                      FP8, V_SCALE_STRIDE)
    ring = DecodeRing(k_smem, v_smem, bar_k, bar_v, empty, k_wide, v_wide, wide_full, wide_empty)
    store = DecodeStore(sinks, Out, Lse, Part_o, Part_lse, stride_ob, stride_oh, stride_lb,
                        stride_pb, stride_ph, stride_ps, stride_plb, stride_plh, v_scale)
    split = Split(i_seq, i_kvh, i_split, seq_len, lo, t_start, t_stop)
    # (one call a case: Gluon takes a partition's function only inside the call)
    if FP8:
        gl.warp_specialize([
            (_consume, (q_smem, ring, store, split, Rule(qk_scale, softcap, window_left, 0),
                        flags)),
            (_produce, (kc_desc, vc_desc, poison, k_smem, v_smem, bar_k, bar_v, empty, bt_row,
                        seq_len, lo, t_start, t_stop, i_kvh * D, oob_row, PAGE, PR, NP, BN, D,
                        STAGES, SKIP)),
            (_convert, (ring, split, flags)),
        ], [1, CONVERT_WARPS], [PRODUCER_REGS, CONVERT_REGS])
        for i in gl.static_range(WIDE_STAGES):
            mbarrier.invalidate(wide_full.index(i))
            mbarrier.invalidate(wide_empty.index(i))
    else:
        gl.warp_specialize([
            (_consume, (q_smem, ring, store, split, Rule(qk_scale, softcap, window_left, 0),
                        flags)),
            (_produce, (kc_desc, vc_desc, poison, k_smem, v_smem, bar_k, bar_v, empty, bt_row,
                        seq_len, lo, t_start, t_stop, i_kvh * D, oob_row, PAGE, PR, NP, BN, D,
                        STAGES, SKIP)),
        ], [1], [PRODUCER_REGS])

    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bar_k.index(i))
        mbarrier.invalidate(bar_v.index(i))
        mbarrier.invalidate(empty.index(i))


# --------------------------------------------------------------------------------------
# Host side.
# --------------------------------------------------------------------------------------

def takes_shape(head_dim, head_dim_v, group, page_size):
    """Whether the path takes these sizes (a pure function: the plan asks it too)."""
    rows, block_n = HopperDecodeConfig.block_h, HopperDecodeConfig.block_n  # every head dim's
    if head_dim not in HEAD_DIMS or head_dim_v != head_dim or group > rows or page_size % 16:
        return False
    if page_size < block_n:
        return block_n % page_size == 0
    return page_size % block_n == 0


def unsupported(device, dtype, head_dim, head_dim_v, group, page_size, kv_dtype=None):
    """Why a plan cannot take the Hopper path (a sentence), or None when it can; the
    tensors' strides are checked at run time (:func:`descriptors`). ``kv_dtype``: the
    cache's, where it is fp8."""
    if device.type != "cuda":
        return "it runs on CUDA devices only (not under the interpreter)"
    if torch.cuda.get_device_capability(device) != (9, 0):
        return "it needs an sm_90 GPU (Hopper)"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"it takes fp16 or bf16, got {dtype}"
    if kv_dtype not in (None, dtype) + FP8_DTYPES:
        return f"it takes a cache of the queries' dtype or fp8, got {kv_dtype}"
    if not takes_shape(head_dim, head_dim_v, group, page_size):
        return (f"it needs D = Dv in {HEAD_DIMS}, at most {HopperDecodeConfig.block_h} query "
                f"heads a KV head and page_size a multiple of 16 that divides or is divided by "
                f"{HopperDecodeConfig.block_n}")
    return None


@functools.lru_cache(maxsize=64)
def shared_layouts(dtype, head_dim, page_size, block_h, block_n, kv_dtype=None):
    """(cache tile layout, query tile layout, widened tile layout or None) of one shape:
    over an fp8 cache (``kv_dtype``) the query tile and the widened K/V tiles are fp16."""
    kv_dtype = dtype if kv_dtype is None else kv_dtype
    page_rows = min(page_size, block_n)
    cache = gl.NVMMASharedLayout.get_default_for([page_rows, head_dim], GL_DTYPES[kv_dtype])
    if kv_dtype == dtype:
        query = gl.NVMMASharedLayout.get_default_for([block_h, head_dim], GL_DTYPES[dtype])
        return cache, query, None
    return (cache, gl.NVMMASharedLayout.get_default_for([block_h, head_dim], gl.float16),
            gl.NVMMASharedLayout.get_default_for([block_n, head_dim], gl.float16))


def descriptors(cfg, q, k_cache, v_cache):
    """(k_cache, v_cache, poison or None) descriptors of one launch (K's pads with NaN, or
    over an fp8 cache reads the poison rows: see the module docstring), or a sentence
    saying why the copy engine cannot take the tensors."""
    if q.stride(-1) != 1:
        return "the query's head dim must be contiguous"
    kc, vc, poison = lazy_descriptors(cfg, q, k_cache, v_cache)
    kc, vc = kc.attempt(), vc.attempt()
    if kc is None or vc is None:
        return "the copy engine cannot take the cache's strides (rows of heads * dim, 16-byte aligned)"
    return kc, vc, poison


def lazy_descriptors(cfg, q, k_cache, v_cache):
    """:func:`descriptors` made only where a launch needs them (ops._launch.Descriptor)."""
    if q.stride(-1) != 1:
        raise ValueError("the query's head dim must be contiguous")
    kv_dtype = k_cache.dtype
    cache_layout = shared_layouts(q.dtype, q.shape[-1], k_cache.shape[1], cfg.block_h,
                                  cfg.block_n, kv_dtype)[0]
    rows = min(k_cache.shape[1], cfg.block_n)
    if kv_dtype in FP8_DTYPES:
        return (Descriptor(k_cache, descriptor, rows, cache_layout),
                Descriptor(v_cache, descriptor, rows, cache_layout),
                poison_descriptor(k_cache.device, kv_dtype, rows, q.shape[-1], cache_layout))
    return (Descriptor(k_cache, descriptor, rows, cache_layout, "nan"),
            Descriptor(v_cache, descriptor, rows, cache_layout), None)


_TENSORS = ("kc_desc", "vc_desc", "poison", "Q", "block_table", "seq_lens", "sinks", "Out", "Lse",
            "Part_o", "Part_lse", "k_scale", "v_scale")
_INTS = ("stride_qb", "stride_qh", "stride_bt", "stride_ob", "stride_oh", "stride_lb", "stride_pb",
         "stride_ph", "stride_ps", "stride_plb", "stride_plh", "oob_row")


@functools.lru_cache(maxsize=64)
def _launcher(spec, dtype):
    cfg = spec.config  # a config.HopperDecodeConfig
    kv_dtype = spec.kv_dtype or dtype
    _, q_layout, wide = shared_layouts(dtype, spec.head_dim, spec.page_size, cfg.block_h,
                                       cfg.block_n, kv_dtype)
    fixed = dict(
        num_kv_heads=spec.num_kv_heads, num_splits=spec.num_splits, qk_scale=spec.qk_scale,
        softcap=float(spec.softcap), window_left=spec.window_left or 0,
        D=spec.head_dim, GROUP=spec.group, PAGE=spec.page_size, BM=cfg.block_h, BN=cfg.block_n,
        STAGES=cfg.num_stages, Q_LAYOUT=q_layout, USE_WINDOW=spec.window_left is not None,
        HAS_SINKS=spec.has_sinks, USE_SOFTCAP=spec.softcap > 0,
        WRITE_PARTIAL=spec.num_splits > 1, RETURN_LSE=spec.return_lse,
        TIGHT=spec.bounds == "tight", SKIP=spec.bounds == "skip",
        PRODUCER_REGS=cfg.producer_regs, PDL=spec.pdl, WIDE_LAYOUT=wide,
        K_SCALE_STRIDE=spec.scale_strides[0], V_SCALE_STRIDE=spec.scale_strides[1],
        CONVERT_WARPS=cfg.convert_warps, CONVERT_REGS=cfg.convert_regs)
    return Launch(_hopper_decode_kernel, fixed, {"num_warps": cfg.num_warps, "maxnreg": cfg.maxnreg},
                  _TENSORS, _INTS, (dtype, kv_dtype))


class HopperDecodeLaunch:
    """The Gluon decode kernel's launch for one spec, bound once; a call launches on
    checked arguments (decode.DecodeLaunch's contract): no host sync, no allocation; it
    returns what ``ops._launch.relaunch`` takes, or None. ``parts``: the split scratch
    (splits > 1), merged by the caller; ``descs``: :func:`lazy_descriptors` of this run's
    cache; ``scales``: an fp8 cache's ``(k_scale, v_scale)``."""

    def __init__(self, spec, dtype):
        self.launch = _launcher(spec, dtype)
        self.num_kv_heads = spec.num_kv_heads
        self.num_splits = spec.num_splits

    def __call__(self, batch, q, k_cache, block_table, seq_lens, sinks, out, lse, parts, descs,
                 scales=(None, None)):
        part_o, part_lse, ps = split_scratch(parts, out)
        lse_t = out if lse is None else lse
        qs, os_ = q.stride(), out.stride()
        return self.launch(
            (batch * self.num_kv_heads, self.num_splits, 1),
            (descs[0], descs[1], descs[2], q, block_table, seq_lens,
             lse_t if sinks is None else sinks, out, lse_t, part_o, part_lse, *scales),
            (qs[0], qs[1], block_table.stride(0), os_[0], os_[1], 0 if lse is None else lse.stride(0),
             *ps, k_cache.shape[0] * k_cache.shape[1]))
