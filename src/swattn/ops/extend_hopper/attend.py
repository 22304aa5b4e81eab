"""The warpgroup's work: a query tile over the program's key tiles, in the overlapped
order (:func:`_overlapped_tiles`, the tight bounds) or the plain one
(:func:`_plain_tiles`, skip and none), and the output and lse stored
(:func:`_store_output`)."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .._common import KeyRange
from .._gluon import operand_layout, tile_pages, uniform, weights, wgmma_layout
from .copies import issue_own
from .fp8 import P_LOG2, fp16_query, quantize_query, v_operand, weights_operand
from .walk import Mids, Walk, keep_mask, nth_tile


@gluon.jit
def _zero_past_end(buf, key0, key_end, BN: gl.constexpr, D: gl.constexpr):
    """Zero the rows of a cache V tile in shared memory at or past the prefix end: the
    unwritten rows of the sequence's last page (NaN in the tests). Their weights are 0,
    but 0 * NaN is not."""
    WARPS: gl.constexpr = gl.num_warps()
    R: gl.constexpr = 4 * WARPS  # rows a slice
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
    for i in gl.static_range(BN // R):
        rows = buf.slice(i * R, R)
        b_v = rows.load(layout)  # [R, D]
        keys = key0 + i * R + gl.arange(0, R, layout=gl.SliceLayout(1, layout))
        rows.store(gl.where((keys < key_end)[:, None], b_v, gl.zeros_like(b_v)))
    fence_async_shared()
    gl.thread_barrier()



@gluon.jit
def _overlap_step(g, q_a, ring, m_i, l_i, acc, p_prev, s_zero, q_pos, o_n, pages_v, valid_v, walk,
                  mids, descs, at, rule, flags, FROM_CACHE: gl.constexpr):
    """Tile g of the overlapped loop (a cache tile if FROM_CACHE, else a new one): its
    scores with tile g - 1's P @ V behind them, its softmax beside that product, and the
    copies of tiles g + STAGES (K) and g - 1 + STAGES (V) into the buffers they free
    (WARP_SPECIALIZED: no copies; the buffers' release signalled on ``empty_k``/``empty_v``
    to the producer warp instead). ``mids``: the mask-free tiles of each stage.
    ``pages_v``/``valid_v``: the block-table entries of tile g - 1 + STAGES, loaded for
    its K copy one step before; returned for the next step, those of tile g + STAGES.

    ``p_prev``, tile g - 1's weights, crosses steps in fp32 and becomes the product's
    16-bit (or with fp8 products e4m3) operand here: carried as bf16, ptxas swaps the
    halves of its registers at every step (the hopper-loop results)."""
    STAGES: gl.constexpr = flags.STAGES
    BN: gl.constexpr = flags.BN
    o_layout: gl.constexpr = acc.type.layout
    p_layout: gl.constexpr = operand_layout(o_layout, 8 if flags.USE_FP8_PRODUCTS else 16)
    WEIGHTS_LOG2: gl.constexpr = P_LOG2 if flags.USE_FP8_PRODUCTS else 0
    mid_lo = mids.lo1 if FROM_CACHE else mids.lo2
    mid_hi = mids.hi1 if FROM_CACHE else mids.hi2
    n, n1, lo1, lo2 = walk.n, walk.n1, walk.lo1, walk.lo2
    prefix_len, extend_len = walk.prefix_len, walk.extend_len
    st = g % STAGES
    prev = (g - 1) % STAGES
    _new, start, key0, key_end = nth_tile(g, n1, lo1, lo2, prefix_len, extend_len, BN)
    k_ok = g + STAGES < n
    v_ok = g - 1 + STAGES < n
    k_new, k_start, _k0, k_end = nth_tile(g + STAGES, n1, lo1, lo2, prefix_len, extend_len, BN)
    v_new, v_start, _v0, _v_end = nth_tile(g - 1 + STAGES, n1, lo1, lo2, prefix_len, extend_len, BN)
    if FROM_CACHE and not flags.WARP_SPECIALIZED:
        # The block-table entries now; the copies that use them after the scores' wait.
        pages_k, valid_k = tile_pages(at.bt_row, k_start, k_end, walk.lowest, k_ok & ~k_new,
                                      at.oob_row, flags.PAGE, flags.COPY_ROWS, flags.TILE_COPIES,
                                      at.ring_width, flags.RING)
    else:
        # Past the cache tiles every later tile is new: no entries to load.
        k_new = True
        v_new = True
        pages_k = (0, 0, 0, 0)
        valid_k = (False, False, False, False)
        pages_v = pages_k
        valid_v = valid_k
    mbarrier.wait(ring.bar_k.index(st), (g // STAGES) & 1)
    s_tok = warpgroup_mma(q_a, ring.k_smem.index(st).permute((1, 0)), s_zero, use_acc=False,
                          is_async=True)
    p_op = weights_operand(p_prev, p_layout, ring.k_smem.dtype, flags.USE_FP8_PRODUCTS)
    mbarrier.wait(ring.bar_v.index(prev), ((g - 1) // STAGES) & 1)
    acc_tok = warpgroup_mma(p_op, v_operand(ring.v_smem.index(prev), flags.USE_FP8_PRODUCTS),
                            acc, is_async=True)
    s = warpgroup_mma_wait(1, deps=(s_tok, ))
    if flags.WARP_SPECIALIZED:
        mbarrier.arrive(ring.empty_k.index(st))
    else:
        issue_own(descs.k, descs.kc, ring.bar_k.index(st), ring.k_smem.index(st), k_ok, k_new,
                  k_start, pages_k, valid_k, at, flags)
    if FROM_CACHE and not flags.USE_FP8_PRODUCTS:
        if key0 + BN > key_end:
            # The prefix's last tile: its V rows past the end zeroed before its product
            # (with fp8 products, by the converter).
            mbarrier.wait(ring.bar_v.index(st), (g // STAGES) & 1)
            _zero_past_end(ring.v_smem.index(st), key0, key_end, BN, flags.D)
    if (start >= mid_lo) & (start < mid_hi):
        m_i, l_i, p, alpha = weights(s, m_i, l_i, q_pos, key0 + o_n, key_end, rule, flags, False,
                                     flags.USE_FP8_PRODUCTS, WEIGHTS_LOG2)
    else:
        m_i, l_i, p, alpha = weights(s, m_i, l_i, q_pos, key0 + o_n, key_end, rule, flags, True,
                                     flags.USE_FP8_PRODUCTS, WEIGHTS_LOG2,
                                     keep_mask(q_pos, key0 + o_n, key_end, rule, flags))
    acc = warpgroup_mma_wait(0, deps=(acc_tok, ))
    if flags.WARP_SPECIALIZED:
        mbarrier.arrive(ring.empty_v.index(prev))
    else:
        issue_own(descs.v, descs.vc, ring.bar_v.index(prev), ring.v_smem.index(prev), v_ok,
                  v_new, v_start, pages_v, valid_v, at, flags)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    return m_i, l_i, acc, p, pages_k, valid_k



@gluon.jit
def attend_tiles(i_h, q_smem, bar_q, ring, descs, at, walk, mids, rule, store, flags):
    """Query head ``i_h`` of the block (its tile in ``q_smem``) over the program's key
    tiles, output and lse stored: the warpgroup's work. Not WARP_SPECIALIZED, it issues the
    copies of the tiles it walks as well (the first STAGES issued before it:
    copies.issue_first); WARP_SPECIALIZED (the tight loop of long windows and full
    attention, and over an fp8 cache every loop but a widened prefix's short or skip/none
    one), a producer warp issues them (copies.produce_copies) and the warpgroup signals each
    buffer's release on ``empty_k``/``empty_v``."""
    D: gl.constexpr = flags.D
    BM: gl.constexpr = flags.BM
    BN: gl.constexpr = flags.BN
    n, n1, lo1, lo2 = walk.n, walk.n1, walk.lo1, walk.lo2
    prefix_len, extend_len, lowest = walk.prefix_len, walk.extend_len, walk.lowest
    mid1_lo, mid1_hi, mid2_lo, mid2_hi = mids.lo1, mids.hi1, mids.lo2, mids.hi2
    if flags.WARP_SPECIALIZED:
        # A worker partition's arguments come through shared memory, per-thread values to
        # ptxas: the loop bounds and branch conditions made warp-uniform again (_gluon.uniform).
        n, n1, lo1, lo2 = uniform(n), uniform(n1), uniform(lo1), uniform(lo2)
        mid1_lo, mid1_hi = uniform(mid1_lo), uniform(mid1_hi)
        mid2_lo, mid2_hi = uniform(mid2_lo), uniform(mid2_hi)
        prefix_len, extend_len = uniform(prefix_len), uniform(extend_len)
    walk = Walk(n, n1, lo1, lo2, prefix_len, extend_len, lowest)
    mids = Mids(mid1_lo, mid1_hi, mid2_lo, mid2_hi)
    WARPS: gl.constexpr = gl.num_warps()  # BM // 16: one warpgroup, or two
    BITS: gl.constexpr = 8 if flags.USE_FP8_PRODUCTS else 16  # the products' operands
    s_layout: gl.constexpr = wgmma_layout(BN, WARPS, BITS)
    o_layout: gl.constexpr = wgmma_layout(D, WARPS, BITS)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)

    mbarrier.wait(bar_q, 0)
    if flags.USE_FP8_PRODUCTS:
        fp8_layout: gl.constexpr = descs.kc.layout
        q_smem, rule = quantize_query(q_smem, rule, fp8_layout, row_s)
    elif flags.FP8:
        q_smem = fp16_query(q_smem)
    q_a = q_smem
    if flags.Q_REGS and D == 128:
        # The query tile in registers for the score products (d128, see Q_REGS): their A
        # operand is then read once, not from shared memory at every product.
        q_a = q_smem.load(operand_layout(s_layout, BITS))

    # Rows past the sequence's end (not stored) keep their positions: what they see is
    # finite, and it spares the masked tiles a term. Under key_ranges they see no key.
    rows = store.block_start + gl.arange(0, BM, layout=row_s)
    q_pos = prefix_len + rows
    if flags.RANGES:
        at_row = store.seq_start + rows
        q_pos = KeyRange(gl.load(store.key_lo + at_row, mask=rows < extend_len, other=0),
                         gl.load(store.key_hi + at_row, mask=rows < extend_len, other=0))
    o_n = gl.arange(0, BN, layout=col_s)
    m_i = gl.full([BM], float("-inf"), gl.float32, layout=row_s)
    l_i = gl.zeros([BM], gl.float32, layout=row_s)
    acc = gl.zeros([BM, D], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BM, BN], gl.float32, layout=s_layout)

    if flags.TIGHT:
        m_i, l_i, acc = _overlapped_tiles(q_a, ring, m_i, l_i, acc, s_zero, q_pos, o_n, walk,
                                          mids, descs, at, rule, flags)
    else:
        m_i, l_i, acc = _plain_tiles(q_a, ring, m_i, l_i, acc, s_zero, q_pos, o_n, walk, descs,
                                     at, rule, flags)
    _store_output(i_h, m_i, l_i, acc, rows, extend_len, store, flags)


@gluon.jit
def _overlapped_tiles(q_a, ring, m_i, l_i, acc, s_zero, q_pos, o_n, walk, mids, descs, at, rule,
                      flags):
    """The tight bounds' loop over the program's tiles (:func:`_overlap_step`): returns
    ``(m_i, l_i, acc)``."""
    STAGES: gl.constexpr = flags.STAGES
    BN: gl.constexpr = flags.BN
    D: gl.constexpr = flags.D
    n, n1, lo1, lo2 = walk.n, walk.n1, walk.lo1, walk.lo2
    prefix_len, extend_len, lowest = walk.prefix_len, walk.extend_len, walk.lowest
    k_smem, v_smem, bar_k, bar_v = ring.k_smem, ring.v_smem, ring.bar_k, ring.bar_v
    WEIGHTS_LOG2: gl.constexpr = P_LOG2 if flags.USE_FP8_PRODUCTS else 0
    bt_row, oob_row = at.bt_row, at.oob_row
    PAGE: gl.constexpr = flags.PAGE
    COPY_ROWS: gl.constexpr = flags.COPY_ROWS
    TILE_COPIES: gl.constexpr = flags.TILE_COPIES
    p_layout: gl.constexpr = operand_layout(acc.type.layout, 8 if flags.USE_FP8_PRODUCTS else 16)
    dtype: gl.constexpr = k_smem.dtype
    if n > 0:
        # Tile 0's scores and softmax; then for tile g: its scores, tile g - 1's
        # product issued behind them, wait for the scores only, g's softmax beside
        # the product, then wait for it (_overlap_step). The cache tiles and the new
        # tiles run in two loops, each with only its own loads, as one pipeline.
        is_new, start, key0, key_end = nth_tile(0, n1, lo1, lo2, prefix_len, extend_len, BN)
        mbarrier.wait(bar_k.index(0), 0)
        s_tok = warpgroup_mma(q_a, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False,
                              is_async=True)
        s = warpgroup_mma_wait(0, deps=(s_tok, ))
        if flags.WARP_SPECIALIZED:
            mbarrier.arrive(ring.empty_k.index(0))
            pages = (0, 0, 0, 0)
            valid = (False, False, False, False)
        else:
            nxt_new, nxt_start, _k0, nxt_end = nth_tile(STAGES, n1, lo1, lo2, prefix_len,
                                                        extend_len, BN)
            nxt_ok = STAGES < n
            pages, valid = tile_pages(bt_row, nxt_start, nxt_end, lowest, nxt_ok & ~nxt_new,
                                      oob_row, PAGE, COPY_ROWS, TILE_COPIES, at.ring_width,
                                      flags.RING)
            issue_own(descs.k, descs.kc, bar_k.index(0), k_smem.index(0), nxt_ok, nxt_new,
                      nxt_start, pages, valid, at, flags)
        if not flags.USE_FP8_PRODUCTS:  # with fp8 products the converter zeroes them
            if (~is_new) & (key0 + BN > key_end):
                mbarrier.wait(bar_v.index(0), 0)
                _zero_past_end(v_smem.index(0), key0, key_end, BN, D)
        m_i, l_i, p, alpha = weights(s, m_i, l_i, q_pos, key0 + o_n, key_end, rule, flags,
                                     True, flags.USE_FP8_PRODUCTS, WEIGHTS_LOG2,
                                     keep_mask(q_pos, key0 + o_n, key_end, rule, flags))
        for g in range(1, n1):
            m_i, l_i, acc, p, pages, valid = _overlap_step(
                g, q_a, ring, m_i, l_i, acc, p, s_zero, q_pos, o_n, pages, valid, walk, mids,
                descs, at, rule, flags, True)
        for g in range(gl.maximum(n1, 1), n):
            m_i, l_i, acc, p, _pages, _valid = _overlap_step(
                g, q_a, ring, m_i, l_i, acc, p, s_zero, q_pos, o_n, pages, valid, walk, mids,
                descs, at, rule, flags, False)
        last = (n - 1) % STAGES
        mbarrier.wait(bar_v.index(last), ((n - 1) // STAGES) & 1)
        p_op = weights_operand(p, p_layout, dtype, flags.USE_FP8_PRODUCTS)
        acc_tok = warpgroup_mma(p_op, v_operand(v_smem.index(last), flags.USE_FP8_PRODUCTS),
                                acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc_tok, ))
    return m_i, l_i, acc


@gluon.jit
def _plain_tiles(q_a, ring, m_i, l_i, acc, s_zero, q_pos, o_n, walk, descs, at, rule, flags):
    """The skip and none bounds' loop: every tile of each stage from 0 in the plain order
    (scores, wait, softmax, product, wait: the overlapped loop's operations, tile for tile),
    fully masked tiles' matrix work skipped (skip) or computed under the mask (none).
    Returns ``(m_i, l_i, acc)``."""
    STAGES: gl.constexpr = flags.STAGES
    BN: gl.constexpr = flags.BN
    D: gl.constexpr = flags.D
    n, n1, lo1, lo2 = walk.n, walk.n1, walk.lo1, walk.lo2
    prefix_len, extend_len, lowest = walk.prefix_len, walk.extend_len, walk.lowest
    k_smem, v_smem, bar_k, bar_v = ring.k_smem, ring.v_smem, ring.bar_k, ring.bar_v
    WEIGHTS_LOG2: gl.constexpr = P_LOG2 if flags.USE_FP8_PRODUCTS else 0
    row_o: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
    p_layout: gl.constexpr = operand_layout(acc.type.layout, 8 if flags.USE_FP8_PRODUCTS else 16)
    dtype: gl.constexpr = k_smem.dtype
    # skip / none: every tile of each stage from 0, in the plain order, all masked.
    for j in range(0, n):
        st = j % STAGES
        is_new, start, key0, key_end = nth_tile(j, n1, lo1, lo2, prefix_len, extend_len, BN)
        if not flags.WARP_SPECIALIZED:
            nxt_new, nxt_start, _k0, nxt_end = nth_tile(j + STAGES, n1, lo1, lo2, prefix_len,
                                                        extend_len, BN)
            nxt_ok = j + STAGES < n
            pages, valid = tile_pages(at.bt_row, nxt_start, nxt_end, lowest, nxt_ok & ~nxt_new,
                                      at.oob_row, flags.PAGE, flags.COPY_ROWS, flags.TILE_COPIES,
                                      at.ring_width, flags.RING)
        mbarrier.wait(bar_k.index(st), (j // STAGES) & 1)
        mbarrier.wait(bar_v.index(st), (j // STAGES) & 1)
        k_pos = key0 + o_n
        keep = keep_mask(q_pos, k_pos, key_end, rule, flags)
        work = True
        if flags.SKIP:
            work = gl.max(gl.max(keep.to(gl.int32), 1), 0) > 0
        if work:
            s_tok = warpgroup_mma(q_a, k_smem.index(st).permute((1, 0)), s_zero,
                                  use_acc=False, is_async=True)
            s = warpgroup_mma_wait(0, deps=(s_tok, ))
            m_i, l_i, p, alpha = weights(s, m_i, l_i, q_pos, k_pos, key_end, rule, flags,
                                         True, flags.USE_FP8_PRODUCTS, WEIGHTS_LOG2,
                                         keep_mask(q_pos, k_pos, key_end, rule, flags))
            acc = acc * gl.convert_layout(alpha, row_o)[:, None]
            p_op = weights_operand(p, p_layout, dtype, flags.USE_FP8_PRODUCTS)
            if not flags.USE_FP8_PRODUCTS:
                if (~is_new) & (key0 + BN > key_end):
                    _zero_past_end(v_smem.index(st), key0, key_end, BN, D)
            acc_tok = warpgroup_mma(p_op, v_operand(v_smem.index(st), flags.USE_FP8_PRODUCTS), acc,
                                    is_async=True)
            acc = warpgroup_mma_wait(0, deps=(acc_tok, ))
        if flags.WARP_SPECIALIZED:
            mbarrier.arrive(ring.empty_k.index(st))
            mbarrier.arrive(ring.empty_v.index(st))
        else:
            # Both stages' buffers are free again (their products waited for above).
            gl.thread_barrier()
            issue_own(descs.k, descs.kc, bar_k.index(st), k_smem.index(st), nxt_ok, nxt_new,
                      nxt_start, pages, valid, at, flags)
            issue_own(descs.v, descs.vc, bar_v.index(st), v_smem.index(st), nxt_ok, nxt_new,
                      nxt_start, pages, valid, at, flags)
    return m_i, l_i, acc


@gluon.jit
def _store_output(i_h, m_i, l_i, acc, rows, extend_len, store, flags):
    """The epilogue: the output of query head ``i_h`` (and its lse) stored for the block's
    ``rows`` before ``extend_len``."""
    BM: gl.constexpr = flags.BM
    D: gl.constexpr = flags.D
    o_layout: gl.constexpr = acc.type.layout
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    col_o: gl.constexpr = gl.SliceLayout(0, o_layout)
    # The epilogue of _common.finish: o = acc / (l + e^{sink - m}), 0 and lse -inf where
    # no key is visible, NaN where a visible key's page was bad.
    if flags.FP8:
        # The cache holds value / scale: V's scale multiplies the output (K's is in qk_scale).
        acc = acc * store.v_mult
    m_safe = gl.where(m_i == float("-inf"), 0.0, m_i)
    denom = l_i
    # With fp8 products l holds the weights times 2^P_LOG2, as acc does: the sink joins
    # it so, and the lse takes it out.
    L_LOG2: gl.constexpr = P_LOG2 if flags.USE_FP8_PRODUCTS else 0
    if flags.HAS_SINKS:
        if flags.USE_FP8_PRODUCTS:
            denom = l_i + gl.exp2(gl.load(store.sinks + i_h) * 1.4426950408889634
                                  - (m_safe - L_LOG2))
        else:
            denom = l_i + gl.exp2(gl.load(store.sinks + i_h) * 1.4426950408889634 - m_safe)
    o = gl.where(gl.convert_layout(l_i == 0.0, row_o)[:, None], 0.0,
                 acc / gl.convert_layout(denom, row_o)[:, None])
    rows_o = store.block_start + gl.arange(0, BM, layout=row_o)
    tok = (store.seq_start + rows_o).to(gl.int64)
    cols = gl.arange(0, D, layout=col_o)
    p_o = store.out + tok[:, None] * store.stride_ot + i_h * store.stride_oh + cols[None, :]
    gl.store(p_o, o.to(store.out.dtype.element_ty), mask=(rows_o < extend_len)[:, None])
    if flags.RETURN_LSE:
        if flags.USE_FP8_PRODUCTS:
            lse = gl.where(l_i == 0.0, float("-inf"),
                           (m_safe + (gl.log2(l_i) - L_LOG2)) * 0.6931471805599453)
        else:
            lse = gl.where(l_i == 0.0, float("-inf"), (m_safe + gl.log2(l_i)) * 0.6931471805599453)
        gl.store(store.lse + (store.seq_start + rows).to(gl.int64) * store.stride_lt + i_h, lse,
                 mask=rows < extend_len)
