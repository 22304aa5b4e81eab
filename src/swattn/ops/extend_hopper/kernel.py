"""The kernel: a program's block of query rows under one query head, its tile list, its
shared memory, and the program it runs: over a 16-bit cache the warpgroup alone or beside a
producer warp; over an fp8 cache one of three (:func:`_fp8_program`): the widened prefix's
16-bit loop (:func:`_prefix_rows_program`), the converter's (:func:`_converter_program`),
or with fp8 products the transposing converter's (:func:`_fp8_products_program`)."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from .._gluon import GluonRule, new_lengths, uniform
from .attend import attend_tiles
from .copies import issue_first, prefix_rows_start, produce_copies
from .fp8 import convert_tiles, transpose_tiles
from .walk import CopyAt, Descs, HopperFlags, Ring, Store, add, program_walk


@gluon.jit
def hopper_extend_kernel(
    q_desc, k_desc, v_desc, kc_desc, vc_desc, poison, block_table, cu_seqlens, prefix_lens, sinks,
    Out, Lse, k_scale, v_scale, key_lo, key_hi, stride_bt, stride_ot, stride_oh, stride_lt,
    num_seqs, oob_row, num_tokens, prefix_keys, ring_width,
    qk_scale, softcap, window_left, window_right,
    D: gl.constexpr, GROUP: gl.constexpr, PAGE: gl.constexpr, BM: gl.constexpr,
    BN: gl.constexpr, STAGES: gl.constexpr, SEQS_POW2: gl.constexpr,
    USE_WINDOW: gl.constexpr, USE_RIGHT: gl.constexpr, IS_CAUSAL: gl.constexpr,
    HAS_SINKS: gl.constexpr, USE_SOFTCAP: gl.constexpr, DO_PREFIX: gl.constexpr,
    DO_NEW: gl.constexpr, RETURN_LSE: gl.constexpr, TIGHT: gl.constexpr, SKIP: gl.constexpr,
    HEADS_FIRST: gl.constexpr, Q_REGS: gl.constexpr, WARP_SPECIALIZED: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, K_SCALE_STRIDE: gl.constexpr, V_SCALE_STRIDE: gl.constexpr,
    CONVERT_WARPS: gl.constexpr, CONVERT_REGS: gl.constexpr, FP8_PRODUCTS: gl.constexpr,
    PREFIX_ROWS: gl.constexpr, RANGES: gl.constexpr, CHUNK: gl.constexpr, RING: gl.constexpr,
):
    COPY_ROWS: gl.constexpr = PAGE if PAGE < BN else BN
    TILE_COPIES: gl.constexpr = BN // COPY_ROWS
    # Over an fp8 cache the stages hold fp16 tiles: the converter's, or with PREFIX_ROWS the
    # window's prefix widened before the kernel (ops.cache.PrefixRowsLaunch), which
    # kc_desc/vc_desc copy. With fp8 products the products read fp8 operands.
    FP8: gl.constexpr = PREFIX_ROWS or kc_desc.dtype.is_fp8()
    USE_FP8_PRODUCTS: gl.constexpr = FP8 and FP8_PRODUCTS
    # Bundles; the constexpr one is assigned as a constexpr (a plain assignment would turn
    # its values into run-time ones).
    flags: gl.constexpr = HopperFlags(D, BM, BN, STAGES, PAGE, COPY_ROWS, TILE_COPIES, USE_WINDOW,
                                      USE_RIGHT, IS_CAUSAL, HAS_SINKS, USE_SOFTCAP, RETURN_LSE,
                                      TIGHT, SKIP, Q_REGS, WARP_SPECIALIZED, FP8, USE_FP8_PRODUCTS,
                                      PREFIX_ROWS, RANGES, CHUNK, RING)
    # HEADS_FIRST: the heads are the grid's fastest dimension, so the query heads of a KV
    # group run the same block side by side and share its K/V tiles in L2.
    i_block = gl.program_id(1) if HEADS_FIRST else gl.program_id(0)
    i_h = gl.program_id(0) if HEADS_FIRST else gl.program_id(1)
    i_kvh = i_h // GROUP

    # Which sequence this block belongs to, from the lengths (as extend._extend_kernel).
    seq_layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    o_seq = gl.arange(0, SEQS_POW2, layout=seq_layout)
    m_seq = o_seq < num_seqs
    # A sequence whose lengths are not well formed owns no block (_common.new_lengths).
    seq_blocks = (new_lengths(cu_seqlens, prefix_lens, o_seq, m_seq, num_tokens, prefix_keys)
                  + BM - 1) // BM
    seq_block_ends = gl.where(m_seq, gl.associative_scan(seq_blocks, 0, add), 2147483647)
    i_seq = gl.sum((seq_block_ends <= i_block).to(gl.int32), 0)
    if i_seq >= num_seqs:
        return
    i_seq = uniform(i_seq)
    block_start = uniform((i_block - gl.sum(gl.where(o_seq < i_seq, seq_blocks, 0), 0)) * BM)
    seq_start = uniform(gl.load(cu_seqlens + i_seq))
    extend_len = uniform(gl.load(cu_seqlens + i_seq + 1)) - seq_start
    prefix_len = uniform(gl.load(prefix_lens + i_seq))
    last_row = gl.minimum(block_start + BM, extend_len) - 1
    first_q = prefix_len + block_start
    bt_row = block_table + i_seq.to(gl.int64) * stride_bt
    col = i_kvh * D

    # Stage 1 over [0, prefix_len), stage 2 over [0, extend_len) in its own coordinates.
    walk, mids = program_walk(first_q, last_row, block_start, seq_start, prefix_len, extend_len,
                              key_lo, key_hi, window_left, window_right, DO_PREFIX, DO_NEW, flags)

    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [BM, D], q_desc.layout)
    if USE_FP8_PRODUCTS:
        k_smem = gl.allocate_shared_memory(kc_desc.dtype, [STAGES, BN, D], kc_desc.layout)
        v_smem = gl.allocate_shared_memory(vc_desc.dtype, [STAGES, BN, D], vc_desc.layout)
        vt_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([D, BN], vc_desc.dtype)
        vt_smem = gl.allocate_shared_memory(vc_desc.dtype, [STAGES, D, BN], vt_layout)
    elif FP8:
        # (the query tile's 16-bit layout swizzles as a 16-bit [BN, D] tile's: it depends on
        # D and the element size only)
        k_smem = gl.allocate_shared_memory(gl.float16, [STAGES, BN, D], q_desc.layout)
        v_smem = gl.allocate_shared_memory(gl.float16, [STAGES, BN, D], q_desc.layout)
    else:
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, BN, D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BN, D], v_desc.layout)
    bar_q = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    bar_k = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    bar_v = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty_k = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty_v = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ring = Ring(k_smem, v_smem, bar_k, bar_v, empty_k, empty_v)
    mbarrier.init(bar_q, count=1)
    _ring_barriers(ring, STAGES, True)

    row0 = seq_start
    descs = Descs(k_desc, v_desc, kc_desc, vc_desc, poison)
    prefix_row0 = 0
    if PREFIX_ROWS:
        prefix_row0 = prefix_rows_start(prefix_lens, seq_blocks, o_seq, m_seq, i_seq, window_left,
                                        BN)
    at = CopyAt(bt_row, row0, col, oob_row, prefix_row0, ring_width)
    rule = GluonRule(qk_scale, softcap, window_left, window_right)
    store = Store(sinks, Out, Lse, stride_ot, stride_oh, stride_lt, seq_start, block_start, None,
                  key_lo, key_hi)
    mbarrier.expect(bar_q, BM * D * 2)
    tma.async_copy_global_to_shared(q_desc, [row0 + block_start, i_h * D], bar_q, q_smem)
    if FP8:
        _fp8_program(i_h, i_kvh, q_smem, vt_smem if USE_FP8_PRODUCTS else None, bar_q, ring, descs,
                     at, walk, mids, qk_scale, softcap, window_left, window_right, k_scale, v_scale,
                     store, flags, K_SCALE_STRIDE, V_SCALE_STRIDE, PRODUCER_REGS, CONVERT_WARPS,
                     CONVERT_REGS)
    elif WARP_SPECIALIZED:
        # The partitions' arguments in the call itself: a tuple held in a variable loses its
        # constexprs on the way into a partition (Triton 3.6).
        gl.warp_specialize([
            (attend_tiles, (i_h, q_smem, bar_q, ring, descs, at, walk, mids, rule, store, flags)),
            (produce_copies, (descs, ring, walk, at, flags, ring)),
        ], [1], [PRODUCER_REGS])
    else:
        issue_first(descs, ring, walk, at, flags)
        attend_tiles(i_h, q_smem, bar_q, ring, descs, at, walk, mids, rule, store, flags)

    _ring_barriers(ring, STAGES, False)
    mbarrier.invalidate(bar_q)


@gluon.jit
def _ring_barriers(ring, STAGES: gl.constexpr, INIT: gl.constexpr):
    """The ring's barriers, stage by stage: initialized (INIT) or invalidated."""
    for i in gl.static_range(STAGES):
        if INIT:
            mbarrier.init(ring.bar_k.index(i), count=1)
            mbarrier.init(ring.bar_v.index(i), count=1)
            mbarrier.init(ring.empty_k.index(i), count=1)
            mbarrier.init(ring.empty_v.index(i), count=1)
        else:
            mbarrier.invalidate(ring.bar_k.index(i))
            mbarrier.invalidate(ring.bar_v.index(i))
            mbarrier.invalidate(ring.empty_k.index(i))
            mbarrier.invalidate(ring.empty_v.index(i))


@gluon.jit
def _fp8_program(i_h, i_kvh, q_smem, vt_smem, bar_q, ring, descs, at, walk, mids, qk_scale,
                 softcap, window_left, window_right, k_scale, v_scale, store, flags,
                 K_SCALE_STRIDE: gl.constexpr, V_SCALE_STRIDE: gl.constexpr,
                 PRODUCER_REGS: gl.constexpr, CONVERT_WARPS: gl.constexpr,
                 CONVERT_REGS: gl.constexpr):
    """A program over an fp8 cache (the cache holds value / scale: K's scale joins qk_scale,
    V's the output's), its converter's barriers around it: the widened prefix's, the fp8
    products', or the converter's. ``vt_smem``: the transposed V tiles of fp8 products
    (else None)."""
    STAGES: gl.constexpr = flags.STAGES
    k_mult = gl.load(k_scale + i_kvh * K_SCALE_STRIDE)
    v_mult = gl.load(v_scale + i_kvh * V_SCALE_STRIDE)
    full_k = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    full_v = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(full_k.index(i), count=1)
        mbarrier.init(full_v.index(i), count=1)
    store = Store(store.sinks, store.out, store.lse, store.stride_ot, store.stride_oh,
                  store.stride_lt, store.seq_start, store.block_start, v_mult, store.key_lo,
                  store.key_hi)
    if flags.PREFIX_ROWS:
        _prefix_rows_program(i_h, q_smem, bar_q, ring, descs, at, walk, mids, qk_scale, k_mult,
                             softcap, window_left, window_right, store, flags, PRODUCER_REGS)
    elif flags.USE_FP8_PRODUCTS:
        _fp8_products_program(i_h, q_smem, vt_smem, bar_q, ring, full_v, descs, at, walk, mids,
                              qk_scale, k_mult, softcap, window_left, window_right, store, flags,
                              PRODUCER_REGS, CONVERT_WARPS, CONVERT_REGS)
    else:
        _converter_program(i_h, q_smem, bar_q, ring, full_k, full_v, descs, at, walk, mids,
                           qk_scale, k_mult, softcap, window_left, window_right, store, flags,
                           PRODUCER_REGS, CONVERT_WARPS, CONVERT_REGS)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(full_k.index(i))
        mbarrier.invalidate(full_v.index(i))


@gluon.jit
def _prefix_rows_program(i_h, q_smem, bar_q, ring, descs, at, walk, mids, qk_scale, k_mult,
                         softcap, window_left, window_right, store, flags,
                         PRODUCER_REGS: gl.constexpr):
    """PREFIX_ROWS: every tile copied as fp16 rows, the 16-bit loop with no converter: the
    warpgroup issuing the copies itself where a 16-bit launch would (short windows, the
    skip/none bounds), else a producer warp."""
    if not flags.WARP_SPECIALIZED:
        issue_first(descs, ring, walk, at, flags)
        attend_tiles(i_h, q_smem, bar_q, ring, descs, at, walk, mids,
                     GluonRule(qk_scale * k_mult, softcap, window_left, window_right), store, flags)
    else:
        gl.warp_specialize([
            (attend_tiles, (i_h, q_smem, bar_q, ring, descs, at, walk, mids,
                       GluonRule(qk_scale * k_mult, softcap, window_left, window_right), store,
                       flags)),
            (produce_copies, (descs, ring, walk, at, flags, ring)),
        ], [1], [PRODUCER_REGS])


@gluon.jit
def _fp8_products_program(i_h, q_smem, vt_smem, bar_q, ring, full_v, descs, at, walk, mids,
                          qk_scale, k_mult, softcap, window_left, window_right, store, flags,
                          PRODUCER_REGS: gl.constexpr, CONVERT_WARPS: gl.constexpr,
                          CONVERT_REGS: gl.constexpr):
    """fp8 products: the score products read the copies' fp8 K tiles, P @ V the converter's
    transposed fp8 V tiles (``vt_smem``, handed over on ``full_v``)."""
    gl.warp_specialize([
        (attend_tiles, (i_h, q_smem, bar_q, Ring(ring.k_smem, vt_smem, ring.bar_k, full_v,
                                            ring.empty_k, ring.empty_v), descs, at, walk, mids,
                   GluonRule(qk_scale * k_mult, softcap, window_left, window_right), store,
                   flags)),
        (produce_copies, (descs, ring, walk, at, flags, ring)),
        (transpose_tiles, (ring, vt_smem, full_v, walk, flags)),
    ], [1, CONVERT_WARPS], [PRODUCER_REGS, CONVERT_REGS])


@gluon.jit
def _converter_program(i_h, q_smem, bar_q, ring, full_k, full_v, descs, at, walk, mids, qk_scale,
                       k_mult, softcap, window_left, window_right, store, flags,
                       PRODUCER_REGS: gl.constexpr, CONVERT_WARPS: gl.constexpr,
                       CONVERT_REGS: gl.constexpr):
    """The default products over an fp8 cache: a cache tile's copies land as fp8 in the
    upper half of its stage, and the converter widens it in place to the fp16 tile the
    warpgroup reads, handing the stage over on ``full_k``/``full_v``."""
    STAGES: gl.constexpr = flags.STAGES
    BN: gl.constexpr = flags.BN
    D: gl.constexpr = flags.D
    copies = Ring(ring.k_smem._reinterpret(descs.kc.dtype, [STAGES, 2 * BN, D], descs.kc.layout),
                  ring.v_smem._reinterpret(descs.vc.dtype, [STAGES, 2 * BN, D], descs.vc.layout),
                  ring.bar_k, ring.bar_v, ring.empty_k, ring.empty_v)
    wide = Ring(ring.k_smem, ring.v_smem, full_k, full_v, ring.empty_k, ring.empty_v)
    gl.warp_specialize([
        (attend_tiles, (i_h, q_smem, bar_q, wide, descs, at, walk, mids,
                   GluonRule(qk_scale * k_mult, softcap, window_left, window_right), store,
                   flags)),
        (produce_copies, (descs, copies, walk, at, flags, wide)),
        (convert_tiles, (copies, wide, walk, flags)),
    ], [1, CONVERT_WARPS], [PRODUCER_REGS, CONVERT_REGS])
