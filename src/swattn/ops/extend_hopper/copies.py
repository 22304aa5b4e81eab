"""The K/V copies: the producer warp's (:func:`produce_copies`, a warp-specialized program's) and
the warpgroup's own (:func:`issue_own`, :func:`issue_first`), from the new rows, the paged
cache or the widened prefix's rows (PREFIX_ROWS, :func:`prefix_rows_start`)."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from .._gluon import issue, tile_pages, uniform
from .walk import nth_tile


@gluon.jit
def prefix_rows_start(prefix_lens, seq_blocks, o_seq, m_seq, i_seq, window_left,
                      BN: gl.constexpr):
    """With PREFIX_ROWS, the row of the widened prefixes' rows that holds position 0 of
    sequence ``i_seq``'s prefix: the sequences' widened prefixes lie one after another, each
    from its first new token's lowest visible tile (ops.cache.prefix_rows_base); a sequence
    with no new tokens (``seq_blocks`` 0) has none."""
    p_all = gl.where(seq_blocks > 0, gl.load(prefix_lens + o_seq, mask=m_seq, other=0), 0)
    base = gl.maximum(p_all - window_left, 0) // BN * BN
    return uniform(gl.sum(gl.where(o_seq < i_seq, p_all - base, 0), 0)
                   - gl.sum(gl.where(o_seq == i_seq, base, 0), 0))


@gluon.jit
def _stage(bufs, st, flags):
    """Ring stage ``st`` where the producer's copies land: the stage, or over an fp8 cache
    widened by the converter its upper half (``bufs``: the stages' fp8 views)."""
    dst = bufs.index(st)
    if flags.FP8 and not flags.USE_FP8_PRODUCTS:
        dst = dst.slice(flags.BN, flags.BN)
    return dst


@gluon.jit
def produce_copies(descs, ring, walk, at, flags, wide):
    """The producer warp of a warp-specialized program (WARP_SPECIALIZED): the copies of every
    key tile of the program's list, tile j's K and V into stage j % STAGES once the
    warpgroup has released that stage's tile j - STAGES (``empty_k``/``empty_v``; the
    first round passes at once), its block-table entries loaded just before. Over an fp8
    cache ``ring`` holds the stages' fp8 views, and with the default products a new
    tokens' tile (fp16 rows holding fp8 values) is copied whole into the 16-bit stage
    of ``wide`` (else ``ring`` itself). The arguments come through shared memory: made
    warp-uniform again (_gluon.uniform)."""
    STAGES: gl.constexpr = flags.STAGES
    BN: gl.constexpr = flags.BN
    n, n1, lo1, lo2 = uniform(walk.n), uniform(walk.n1), uniform(walk.lo1), uniform(walk.lo2)
    prefix_len, extend_len = uniform(walk.prefix_len), uniform(walk.extend_len)
    lowest = uniform(walk.lowest)
    for j in range(n):
        st = j % STAGES
        free = ((j // STAGES) & 1) ^ 1
        is_new, start, _key0, key_end = nth_tile(j, n1, lo1, lo2, prefix_len, extend_len, BN)
        pages, valid = tile_pages(at.bt_row, start, key_end, lowest, ~is_new, at.oob_row,
                                  flags.PAGE, flags.COPY_ROWS, flags.TILE_COPIES, at.ring_width,
                                  flags.RING)
        # Over an fp8 cache K's pages not copied read the poison rows (else None).
        mbarrier.wait(ring.empty_k.index(st), free)
        _copy_tile(descs.k, descs.kc, ring.bar_k.index(st), ring.k_smem, wide.k_smem, st, is_new,
                   start, pages, valid, at, flags, descs.poison)
        mbarrier.wait(ring.empty_v.index(st), free)
        _copy_tile(descs.v, descs.vc, ring.bar_v.index(st), ring.v_smem, wide.v_smem, st, is_new,
                   start, pages, valid, at, flags, None)


@gluon.jit
def issue_own(new_desc, cache_desc, bar, dest, ok, is_new, start, pages, valid, at, flags):
    """A tile's K or V copies into ``dest`` issued by the warpgroup itself (not
    WARP_SPECIALIZED; _gluon.issue), nothing when not ``ok``; with the window's prefix
    widened before the kernel (PREFIX_ROWS) a cache tile's rows whole from the sequence's
    first row there, as :func:`_copy_tile` copies them for the producer warp."""
    if flags.PREFIX_ROWS:
        if is_new:
            issue(new_desc, new_desc, bar, dest, ok, True, start, at.row0, at.col, pages, valid,
                  at.oob_row, flags.PAGE, flags.COPY_ROWS, flags.TILE_COPIES, flags.BN, flags.D)
        else:
            issue(cache_desc, cache_desc, bar, dest, ok, True, start, at.prefix_row0, at.col,
                  pages, valid, at.oob_row, flags.PAGE, flags.COPY_ROWS, flags.TILE_COPIES,
                  flags.BN, flags.D)
    else:
        issue(new_desc, cache_desc, bar, dest, ok, is_new, start, at.row0, at.col, pages, valid,
              at.oob_row, flags.PAGE, flags.COPY_ROWS, flags.TILE_COPIES, flags.BN, flags.D)


@gluon.jit
def issue_first(descs, ring, walk, at, flags):
    """Not WARP_SPECIALIZED: the copies of the program's first STAGES tiles, issued before
    its loop (attend.attend_tiles issues the rest as it frees their buffers)."""
    for i in gl.static_range(flags.STAGES):
        ok = i < walk.n
        is_new, start, _key0, key_end = nth_tile(i, walk.n1, walk.lo1, walk.lo2, walk.prefix_len,
                                                 walk.extend_len, flags.BN)
        pages, valid = tile_pages(at.bt_row, start, key_end, walk.lowest, ok & ~is_new,
                                  at.oob_row, flags.PAGE, flags.COPY_ROWS, flags.TILE_COPIES,
                                  at.ring_width, flags.RING)
        issue_own(descs.k, descs.kc, ring.bar_k.index(i), ring.k_smem.index(i), ok, is_new,
                  start, pages, valid, at, flags)
        issue_own(descs.v, descs.vc, ring.bar_v.index(i), ring.v_smem.index(i), ok, is_new,
                  start, pages, valid, at, flags)


@gluon.jit
def _copy_tile(new_desc, cache_desc, bar, bufs, wide, st, is_new, start, pages, valid, at, flags,
               poison):
    """Tile j's K or V copies into ring stage ``st`` (_gluon.issue; ``bufs``: the producer's
    stages, ``wide``: the 16-bit ones). Over an fp8 cache with the default products a new
    tokens' tile goes whole into the 16-bit stage, and a cache tile's pages into the fp8
    view of its upper half or, with the prefix widened before the kernel (PREFIX_ROWS), its
    rows whole into the 16-bit stage."""
    if flags.FP8 and not flags.USE_FP8_PRODUCTS:  # PREFIX_ROWS among them
        if is_new:
            issue(new_desc, new_desc, bar, wide.index(st), True, True, start, at.row0, at.col,
                  pages, valid, at.oob_row, flags.PAGE, flags.COPY_ROWS, flags.TILE_COPIES,
                  flags.BN, flags.D)
        elif flags.PREFIX_ROWS:
            # The widened prefix's rows (ops.cache.PrefixRowsLaunch) whole into the 16-bit
            # stage too, from the sequence's first row there.
            issue(cache_desc, cache_desc, bar, wide.index(st), True, True, start,
                  at.prefix_row0, at.col, pages, valid, at.oob_row, flags.PAGE, flags.COPY_ROWS,
                  flags.TILE_COPIES, flags.BN, flags.D)
        else:
            # The cache's descriptor in the new rows' place too: the copies of a branch not
            # taken still compile against the stage's type.
            issue(cache_desc, cache_desc, bar, _stage(bufs, st, flags), True, False, start,
                  at.row0, at.col, pages, valid, at.oob_row, flags.PAGE, flags.COPY_ROWS,
                  flags.TILE_COPIES, flags.BN, flags.D, poison)
    else:
        issue(new_desc, cache_desc, bar, _stage(bufs, st, flags), True, is_new, start, at.row0,
              at.col, pages, valid, at.oob_row, flags.PAGE, flags.COPY_ROWS, flags.TILE_COPIES,
              flags.BN, flags.D, poison)
