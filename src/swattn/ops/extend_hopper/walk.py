"""A program's key tiles: the bounds of window.py compiled for Gluon, the walk over the
cached prefix's tiles then the new tokens' (:func:`program_walk`, :func:`nth_tile`), a tile's
mask (:func:`keep_mask`), and the bundles the kernel's parts share."""

from collections import namedtuple

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ... import window
from .._common import KeyRange, compile_bound
from .._gluon import range_bounds, range_keep, row_key_range, uniform, visible

# The bounds of window.py, compiled for Gluon as they are written there.
first_key_tile = compile_bound(window.first_key_tile, gluon.jit, globals())
causal_key_end = compile_bound(window.causal_key_end, gluon.jit, globals())
right_key_end = compile_bound(window.right_key_end, gluon.jit, globals())
visible_key_end = compile_bound(window.visible_key_end, gluon.jit, globals())
full_tiles_start = compile_bound(window.full_tiles_start, gluon.jit, globals())
full_tiles_end = compile_bound(window.full_tiles_end, gluon.jit, globals())

# The arguments the warpgroup and the producer share, bundled once by the kernel (a
# namedtuple compiles to its fields); the scores rule travels as _gluon.GluonRule.
HopperFlags = namedtuple("HopperFlags", "D BM BN STAGES PAGE COPY_ROWS TILE_COPIES USE_WINDOW "
                         "USE_RIGHT IS_CAUSAL HAS_SINKS USE_SOFTCAP RETURN_LSE TIGHT SKIP Q_REGS "
                         "WARP_SPECIALIZED FP8 USE_FP8_PRODUCTS PREFIX_ROWS RANGES CHUNK "
                         "RING")  # constexprs
# The K/V ring: two stages of [BN, D] tiles in shared memory, their copies' barriers, and
# the barriers on which the warpgroup releases a stage to the producer (WARP_SPECIALIZED).
# Over an fp8 cache the warpgroup's ring has the converter's barriers in the place of the
# copies', and the producer's ring the stages' fp8 views ([STAGES, 2 BN, D]: a tile's
# copies go to rows BN to 2 BN, the stage's upper half). With fp8 products the stages are
# the copies' fp8 [BN, D] tiles, and the warpgroup's V ring the converter's transposed
# [D, BN] tiles.
Ring = namedtuple("Ring", "k_smem v_smem bar_k bar_v empty_k empty_v")
# TMA descriptors: new k/v, the cache's K/V, an fp8 cache's poison rows (else None).
Descs = namedtuple("Descs", "k v kc vc poison")
# Where copies read: the sequence's block-table row, its first token's row of k/v, the
# head's column, the row past the cache's last (a copy left out reads it), and with the
# prefix's rows widened before the kernel (PREFIX_ROWS) the row holding position 0 of the
# sequence's prefix (else 0), and a ring block table's width (RING).
CopyAt = namedtuple("CopyAt", "bt_row row0 col oob_row prefix_row0 ring_width")
# The program's tile list: n tiles, n1 of them the cache's, each stage's first key, the
# lengths, the lowest visible key.
Walk = namedtuple("Walk", "n n1 lo1 lo2 prefix_len extend_len lowest")
Mids = namedtuple("Mids", "lo1 hi1 lo2 hi2")  # each stage's mask-free tiles
# Where the output goes; ``v_mult``: an fp8 cache's V scale of the head (else None); under
# key_ranges the rows' ranges (``key_lo``, ``key_hi``: [tokens] int32; else None).
Store = namedtuple("Store", "sinks out lse stride_ot stride_oh stride_lt seq_start block_start "
                   "v_mult key_lo key_hi")


@gluon.jit
def _stage_bounds(first_q, last_q, range_end, window_left, window_right, BN: gl.constexpr,
                  USE_WINDOW: gl.constexpr, IS_CAUSAL: gl.constexpr, USE_RIGHT: gl.constexpr,
                  TIGHT: gl.constexpr, SKIP: gl.constexpr):
    """(lo, hi) of one stage, as window.key_bounds and extend._stage_bounds."""
    lo = 0
    hi = range_end
    if TIGHT:
        if IS_CAUSAL:
            hi = causal_key_end(last_q, range_end)
        elif USE_RIGHT:
            hi = right_key_end(last_q, window_right, range_end)
        if USE_WINDOW:
            lo = first_key_tile(first_q, window_left, BN)
            hi = visible_key_end(first_q, window_left, lo, hi)
    elif SKIP:
        if IS_CAUSAL:
            hi = causal_key_end(last_q, range_end)
    return lo, gl.maximum(hi, lo)


@gluon.jit
def _full_range(first_q, last_q, range_end, lo, hi, window_left, window_right, BN: gl.constexpr,
                USE_WINDOW: gl.constexpr, IS_CAUSAL: gl.constexpr, USE_RIGHT: gl.constexpr):
    """(mid_lo, mid_hi) of window.full_tile_range: the tiles no row needs a mask in."""
    end = range_end
    if IS_CAUSAL:
        end = causal_key_end(first_q, range_end)
    elif USE_RIGHT:
        end = right_key_end(first_q, window_right, range_end)
    mid_lo = lo
    if USE_WINDOW:
        mid_lo = full_tiles_start(last_q, window_left, lo, BN)
    mid_lo = gl.minimum(mid_lo, hi)
    mid_hi = gl.maximum(gl.minimum(full_tiles_end(end, lo, BN), hi), mid_lo)
    return mid_lo, mid_hi

@gluon.jit
def keep_mask(q_pos, k_pos, key_end, rule, flags):
    """The mask of a tile: window.visible of the rows' positions, or under key_ranges
    (RANGES) each row's own range (``q_pos`` then the rows' KeyRange)."""
    if flags.RANGES:
        keep = range_keep(q_pos, k_pos, key_end)
    else:
        keep = visible(q_pos, k_pos, key_end, rule.window_left, rule.window_right,
                       flags.USE_WINDOW, flags.IS_CAUSAL, flags.USE_RIGHT, False)
    if flags.CHUNK > 0:
        # Chunked attention: the query's own chunk (window.visible's chunk).
        keep = keep & ((k_pos // flags.CHUNK)[None, :] == (q_pos // flags.CHUNK)[:, None])
    return keep


@gluon.jit
def add(a, b):
    return a + b


@gluon.jit
def nth_tile(j, n1, lo1, lo2, prefix_len, extend_len, BN: gl.constexpr):
    """Tile j of the program's list: (is_new, start in its stage's coordinates, absolute
    position of its first key, absolute end of its stage's keys)."""
    is_new = j >= n1
    new = is_new.to(gl.int32)
    start = lo1 + j * BN + new * (lo2 - lo1 - n1 * BN)
    return is_new, start, start + new * prefix_len, prefix_len + new * extend_len




@gluon.jit
def program_walk(first_q, last_row, block_start, seq_start, prefix_len, extend_len, key_lo,
                 key_hi, window_left, window_right, DO_PREFIX: gl.constexpr,
                 DO_NEW: gl.constexpr, flags):
    """The block's tile list, ``(Walk, Mids)``: stage 1's tiles of the cached prefix, then
    stage 2's of the new tokens (``DO_PREFIX``/``DO_NEW``: the stages walked), each with its
    mask-free tiles; ``first_q``: the block's first query position, ``last_row``: its last
    row."""
    BM: gl.constexpr = flags.BM
    BN: gl.constexpr = flags.BN
    USE_WINDOW: gl.constexpr = flags.USE_WINDOW
    IS_CAUSAL: gl.constexpr = flags.IS_CAUSAL
    USE_RIGHT: gl.constexpr = flags.USE_RIGHT
    TIGHT: gl.constexpr = flags.TIGHT
    SKIP: gl.constexpr = flags.SKIP
    RANGES: gl.constexpr = flags.RANGES
    CHUNK: gl.constexpr = flags.CHUNK
    # Stage 1 over [0, prefix_len), stage 2 over [0, extend_len) in its own coordinates. No
    # key below the block's lowest visible one is read (absolute position; its page may be
    # freed).
    if RANGES:
        # key_ranges (stage 1 alone): row t sees the cached keys [key_lo[t], key_hi[t]).
        r_layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
        rows = block_start + gl.arange(0, BM, layout=r_layout)
        m_rows = rows < extend_len
        rng = KeyRange(gl.load(key_lo + seq_start + rows, mask=m_rows, other=0),
                       gl.load(key_hi + seq_start + rows, mask=m_rows, other=0))
        lo1, hi1, mid1_lo, mid1_hi, lowest = range_bounds(rng, m_rows, prefix_len, BN, TIGHT,
                                                          SKIP, False)
        lo1, hi1, lowest = uniform(lo1), uniform(hi1), uniform(lowest)
        mid1_lo, mid1_hi = uniform(mid1_lo), uniform(mid1_hi)
    elif CHUNK > 0:
        # Chunked attention: each stage's bounds from its rows' key runs (window.row_key_range
        # reduced by range_bounds, as the Triton kernel's), so a block straddling a chunk
        # boundary walks the tiles of both chunks and nothing else.
        r_layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
        rows = block_start + gl.arange(0, BM, layout=r_layout)
        m_rows = rows < extend_len
        a, b = row_key_range(prefix_len + rows, 0, prefix_len, window_left, window_right, CHUNK,
                             USE_WINDOW, True, IS_CAUSAL, USE_RIGHT)
        lo1, hi1, mid1_lo, mid1_hi, lowest = range_bounds(KeyRange(a, b), m_rows, prefix_len,
                                                          BN, TIGHT, SKIP, False)
        lo1, hi1, lowest = uniform(lo1), uniform(hi1), uniform(lowest)
        mid1_lo, mid1_hi = uniform(mid1_lo), uniform(mid1_hi)
    else:
        lo1, hi1 = _stage_bounds(first_q, prefix_len + last_row, prefix_len, window_left,
                                 window_right, BN, USE_WINDOW, IS_CAUSAL, USE_RIGHT, TIGHT, SKIP)
        mid1_lo, mid1_hi = _full_range(first_q, prefix_len + last_row, prefix_len, lo1, hi1,
                                       window_left, window_right, BN, USE_WINDOW, IS_CAUSAL,
                                       USE_RIGHT)
        lowest = 0
        if USE_WINDOW:
            lowest = first_q - window_left
    if CHUNK > 0 and not RANGES:
        a, b = row_key_range(rows, prefix_len, extend_len, window_left, window_right, CHUNK,
                             USE_WINDOW, True, IS_CAUSAL, USE_RIGHT)
        lo2, hi2, mid2_lo, mid2_hi, _ = range_bounds(KeyRange(a, b), m_rows, extend_len, BN,
                                                     TIGHT, SKIP, False)
        lo2, hi2 = uniform(lo2), uniform(hi2)
        mid2_lo, mid2_hi = uniform(mid2_lo), uniform(mid2_hi)
    else:
        lo2, hi2 = _stage_bounds(block_start, last_row, extend_len, window_left, window_right,
                                 BN, USE_WINDOW, IS_CAUSAL, USE_RIGHT, TIGHT, SKIP)
        mid2_lo, mid2_hi = _full_range(block_start, last_row, extend_len, lo2, hi2, window_left,
                                       window_right, BN, USE_WINDOW, IS_CAUSAL, USE_RIGHT)
    n1 = (hi1 - lo1 + BN - 1) // BN
    n2 = (hi2 - lo2 + BN - 1) // BN
    if not DO_PREFIX:
        n1 = 0
    if not DO_NEW:
        n2 = 0
    n = n1 + n2
    return (Walk(n, n1, lo1, lo2, prefix_len, extend_len, lowest),
            Mids(mid1_lo, mid1_hi, mid2_lo, mid2_hi))
