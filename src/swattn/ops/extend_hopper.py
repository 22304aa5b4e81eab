"""Hopper fast path of the two-stage extend kernel, in Gluon (Triton's lower-level
language): the same stages, bounds and results contract as :mod:`.extend`, with the
scores of key tile j and the P @ V product of tile j - 1 in flight on the tensor cores
together while the softmax of tile j runs beside them (FlashAttention-3's intra-warpgroup
overlap, which Triton 3.6 cannot express: it waits for every score product right after
issuing it). K/V tiles arrive by TMA into two shared-memory stages on mbarriers; from the
paged cache one copy per page into row slices of the tile (pages of 16 to 64 rows; 64 rows
of a larger page), each tile's block-table entries loaded once, a step before its K copy
is issued, and kept for its V copy. At d128 the score products read the query tile from
registers (``q_regs``); tile g - 1's weights cross a step in fp32 (see _overlap_step).

The tiling is config.HopperExtendConfig's. One program owns 64 new tokens under one
query head (4 warps, one warpgroup; or 128 under two, a config; for long
windows and full attention, warp-specialized, with a producer warp that loads the block
table and issues every copy while the warpgroup computes) and walks one list of key
tiles: stage 1's (the cached prefix, absolute positions, through the block table) then
stage 2's (the new tokens' own k/v), with the bounds of window.py compiled from the same
source as the Triton kernel's (``_stage_bounds``, ``_full_range``). Tiles every row sees
whole skip the mask.

What the copy engine reads that no query may see is kept out of the sums: a page copy is
issued only for a page holding a key in ``[lowest visible key, stage end)``, so no
block-table entry below the block's window or past the sequence end is read (the copy
of a page left out reads past the cache's last row, no memory touched: zeros for V and
NaN for K, whose cache descriptor pads with NaN, and those keys are masked). An entry
outside ``[0, num_pages)`` is not copied either: its keys read as NaN and the rows that
see them come out NaN. The last
cache tile's V rows at and past the prefix end (unwritten rows of the last page, NaN in
the tests) are zeroed in shared memory before its product, and its K rows there are
masked out of the scores.

Under ``key_ranges`` (stage 1 alone: swattn.parallel's extend over a rank's local keys) each
query row sees its own range of cached keys: the block's tiles run from the lowest key a row
sees to the highest end, the mask is each row's range, and the lowest key is the floor of the
pages copied (``_common.range_bounds``, ``range_keep``, written once for both kernels).

``bounds="skip"`` and ``"none"`` walk every tile of each stage from 0 in the plain order
(scores, wait, softmax, product, wait: the same operations, tile for tile, as the
overlapped loop, so the same bits), skip fully masked tiles' matrix work (skip) or
compute them under the mask (none).

An fp8 cache (e4m3fn or e5m2, value / scale) runs warp-specialized with converter warps
beside the producer (but for a prefix widened before the kernel, below). The new keys and
values come quantized as the cache stores them, as fp16 rows holding those values (the
launch before, ops.cache.NewRowsLaunch: once, not once a query head and block), so a new
tokens' tile is copied into its stage as over a 16-bit cache and the converter hands it
over as it lands. A cache tile's copies land as
fp8 in the upper half of its stage (a stage keeps its 16-bit size), and the converter
widens it (exactly) in place to the fp16 tile the warpgroup reads, handing the stage over
on its own barriers. Widening costs the SM's shared-memory port the fp8 tile's write and
read beside the fp16 tile's write, and B's tiles are bound by that port: a tile widened
takes about 1.5x a 16-bit tile's time, a copied fp16 tile a 16-bit tile's (B at P0, all new
tiles, within 0.6% of bf16; at P8192, a quarter of its tiles the prefix's, 1.12x: the
fp8-extend-new-rows results). Under a window a plan may widen the visible prefix before
the kernel too (config ``prefix_rows``, ops.cache.PrefixRowsLaunch: the rows from each
sequence's first visible tile to its prefix end, sequence after sequence, K NaN and V 0
where a page is not read), and every tile is then copied as a 16-bit one, with no converter
(``PREFIX_ROWS``), by a producer warp or by the warpgroup itself where a 16-bit launch would
be (short windows, the skip/none bounds: config.HopperExtendConfig.warp_specialized; A over
fp8 1.15x to 1.21x bf16's time that way, 1.42x to 1.45x with a producer warp: the
fp8-extend-short-windows results). The products run in fp16 (a bf16 query tile converted
once), K's scale joins qk_scale and V's multiplies the output. The copy engine pads fp8
with zeros only, so a page not copied reads rows of fp8 NaN for K
(``_gluon.poison_descriptor``). Shared memory and the warpgroup's loop are the 16-bit
kernel's.

With fp8 products (opt-in: ``plan_extend(fp8_products=True)``, config ``fp8_products``) the
products read fp8 operands instead: the score products the copied K tiles as they are, the
query tile quantized to e4m3 once, a row at a time (its largest element on 448, its scale
joining the row's scores' scale); P @ V the weights, times 256 in e4m3 (:data:`P_LOG2`), in
their own registers (:func:`_key_order`), against V tiles the converter transposes
(:func:`_transpose`: fp8 products read B with the keys contiguous). Relative error a few
1e-2 against the reference over the same cache, within 1% to 8% of bf16's time on B where the
default fp8 path then took 1.5x it (the fp8-extend-products results). Its new rows stay fp8
(the products read them as they are).

A program of 128 rows (config.HOPPER_EXTEND_128_ROWS: two warpgroups sharing each K/V tile,
one program an SM) is a config of the plan, not the default: on B it ran 1.21x slower than 64
rows over bf16, 1.11x faster over fp8 with the default products (still 1.37x bf16's time), and
about as fast with fp8 products (the fp8-extend-products results).

Runs on sm_90 only, for fp16/bf16 queries over a cache of their dtype or fp8, D = Dv in
(64, 128), page sizes that are multiples of 16, no custom mask, the two-stage kernel (not
``deterministic``); :func:`unsupported` says why a launch cannot take it. Gluon does not run under the interpreter: the CPU suite
compiles it for sm_90 (tests/test_extend_hopper.py), the GPU suite runs it.
"""

import functools
from collections import namedtuple

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                              warpgroup_mma, warpgroup_mma_wait)

from .. import window
from ..window import clamp_extent
from ._common import KeyRange, compile_bound, launch_extents
from ._gluon import (GL_DTYPES, GluonRule, descriptor, issue, new_lengths, operand_layout,
                     poison_descriptor, range_bounds, range_keep, row_key_range, tile_pages,
                     uniform, visible, weights, wgmma_layout, widen_in_place)
from ._launch import Descriptor, Launch
from ._validate import FP8_DTYPES
from .config import HopperExtendConfig

# The head dims the kernel is written for; its tiling is a frozen config of the plan
# (config.HopperExtendConfig).
HEAD_DIMS = (64, 128)


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
# the barriers on which the warpgroup releases a stage to the producer (WARP_SPECIALIZED). Over an fp8
# cache the warpgroup's ring has the converter's barriers in the place of the copies', and
# the producer's ring the stages' fp8 views ([STAGES, 2 BN, D]: a tile's copies go to rows
# BN to 2 BN, the stage's upper half). With fp8 products the stages are the copies' fp8
# [BN, D] tiles, and the warpgroup's V ring the converter's transposed [D, BN] tiles.
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
def _keep(q_pos, k_pos, key_end, rule, flags):
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
def _add(a, b):
    return a + b


# With fp8 products the weights come out of the softmax times 2^P_LOG2 = 256 (weights.P_LOG2;
# the largest, 1, lands on 256 of e4m3's 448, the smallest kept above its subnormals), and
# the row sums with them, so the output's division undoes it.
P_LOG2 = gl.constexpr(8)


@gluon.jit
def _key_order(x):
    """``x`` [R, C] with its columns (keys) reordered, ``c = 32a + 16b + 8e + 2q + f`` to
    ``32a + 16b + 4q + 2e + f``: the order in which a thread of the score product holds its
    columns (pairs 8 apart) is then the order the fp8 P @ V product reads its A operand in
    (4 in a row), so the weights become that operand in their own registers, no shuffles.
    The transposed V tiles take the same order, and the product is unchanged."""
    R: gl.constexpr = x.shape[0]
    C: gl.constexpr = x.shape[1]
    y = x.reshape([R, C // 32, 2, 2, 4, 2]).permute((0, 1, 2, 4, 3, 5))
    return y.reshape([R, C])


@gluon.constexpr_function
def _transpose_layout(BN, D, warps):
    """The registers the converter reads a [BN, D] fp8 V tile into (BN = 64): each thread 16
    channels (one 16-byte read) of each of the 4 keys :func:`_key_order` puts side by side
    (2q, 2q + 1, 2q + 8, 2q + 9 of 16); a warp's lanes span the 64 keys and 32 channels,
    the warps (and past them the registers) the rest of the channels."""
    regs = [[0, 1], [0, 2], [0, 4], [0, 8], [1, 0], [8, 0]]
    lanes = [[2, 0], [4, 0], [16, 0], [32, 0], [0, 16]]
    warp_bases, d = [], 32
    for _ in range(int(warps).bit_length() - 1):
        warp_bases.append([0, d])
        d *= 2
    while d < D:
        regs.append([0, d])
        d *= 2
    return gl.DistributedLinearLayout(regs, lanes, warp_bases, [], [BN, D])


# Four words of 4 bytes (4 keys' channels c..c+3) into four of 4 bytes (channel c + i's 4
# keys): the 4 x 4 byte transpose in 8 byte permutes.
_TRANSPOSE_4X4 = gl.constexpr("""{
.reg .b32 t0, t1, t2, t3;
prmt.b32 t0, $4, $5, 0x5140;
prmt.b32 t1, $4, $5, 0x7362;
prmt.b32 t2, $6, $7, 0x5140;
prmt.b32 t3, $6, $7, 0x7362;
prmt.b32 $0, t0, t2, 0x5410;
prmt.b32 $1, t0, t2, 0x7632;
prmt.b32 $2, t1, t3, 0x5410;
prmt.b32 $3, t1, t3, 0x7632;
}""")


@gluon.jit
def _transposed(x):
    """``x`` [BN, D] (fp8, in :func:`_transpose_layout`) as [D, BN] with its keys in
    :func:`_key_order`, moved within each thread by :data:`_TRANSPOSE_4X4` (8 byte
    permutes a 16 bytes, where the compiler's own transposition took about 40). The
    reshapes, splits and joins only name registers: with the keys
    ``c = 32a + 16b + 8e + 2q + f`` the thread's 4 keys of one (a, b, q) are the 4 (e, f)."""
    BN: gl.constexpr = x.shape[0]
    D: gl.constexpr = x.shape[1]
    y = x.reshape([BN // 32, 2, 2, 4, 2, D]).permute((0, 1, 3, 5, 2, 4))  # a b q d e f
    f0, f1 = gl.split(y)
    k00, k10 = gl.split(f0)  # (e, f) = (0, 0), (1, 0)
    k01, k11 = gl.split(f1)
    # Output i: channel 4 c_hi + i of the keys (e, f) in the order 2e + f.
    o0, o1, o2, o3 = gl.inline_asm_elementwise(_TRANSPOSE_4X4, "=r,=r,=r,=r,r,r,r,r",
                                               [k00, k01, k10, k11],
                                               dtype=(x.dtype, x.dtype, x.dtype, x.dtype),
                                               is_pure=True, pack=4)
    j = gl.join(gl.join(o0, o1), gl.join(o2, o3))  # a b q d i0 i1 (channel = 4 c_hi + 2 i1 + i0)
    j = j.reshape([BN // 32, 2, 4, D // 4, 4, 2, 2])  # a b q c_hi (2e + f) i0 i1
    return j.permute((3, 6, 5, 0, 1, 2, 4)).reshape([D, BN])


@gluon.jit
def _weights_operand(p, p_layout: gl.constexpr, dtype: gl.constexpr, USE_FP8_PRODUCTS: gl.constexpr):
    """A tile's weights as the A operand of P @ V: in the products' type, or with fp8
    products (already times 2^P_LOG2) in e4m3, in :func:`_key_order`."""
    if USE_FP8_PRODUCTS:
        op = gl.convert_layout(_key_order(p.to(gl.float8e4nv)), p_layout)
    else:
        op = gl.convert_layout(p.to(dtype), p_layout)
    return op


@gluon.jit
def _v_operand(tile, USE_FP8_PRODUCTS: gl.constexpr):
    """A ring stage's V as the B operand of P @ V: the [BN, D] tile, or with fp8 products
    the converter's transposed [D, BN] tile seen as [BN, D] (fp8 products read B with
    the keys contiguous)."""
    if USE_FP8_PRODUCTS:
        tile = tile.permute((1, 0))
    return tile


@gluon.jit
def _tile(j, n1, lo1, lo2, prefix_len, extend_len, BN: gl.constexpr):
    """Tile j of the program's list: (is_new, start in its stage's coordinates, absolute
    position of its first key, absolute end of its stage's keys)."""
    is_new = j >= n1
    new = is_new.to(gl.int32)
    start = lo1 + j * BN + new * (lo2 - lo1 - n1 * BN)
    return is_new, start, start + new * prefix_len, prefix_len + new * extend_len


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
    (WARP_SPECIALIZED: no copies; the buffers' release signalled on ``empty_k``/``empty_v`` to the
    producer warp instead). ``mids``: the mask-free tiles of each stage.
    ``pages_v``/``valid_v``: the block-table entries of tile g - 1 + STAGES, loaded for
    its K copy one step before; returned for the next step, those of tile g + STAGES.

    ``p_prev``, tile g - 1's weights, crosses steps in fp32 and becomes the product's
    16-bit (or with fp8 products e4m3) operand here: carried as bf16, ptxas swaps the
    halves of its registers at every step (the hopper-loop results)."""
    STAGES: gl.constexpr = flags.STAGES
    BN: gl.constexpr = flags.BN
    o_layout: gl.constexpr = acc.type.layout
    p_layout: gl.constexpr = operand_layout(o_layout, 8 if flags.USE_FP8_PRODUCTS else 16)
    mid_lo = mids.lo1 if FROM_CACHE else mids.lo2
    mid_hi = mids.hi1 if FROM_CACHE else mids.hi2
    n, n1, lo1, lo2 = walk.n, walk.n1, walk.lo1, walk.lo2
    prefix_len, extend_len = walk.prefix_len, walk.extend_len
    st = g % STAGES
    prev = (g - 1) % STAGES
    _new, start, key0, key_end = _tile(g, n1, lo1, lo2, prefix_len, extend_len, BN)
    k_ok = g + STAGES < n
    v_ok = g - 1 + STAGES < n
    k_new, k_start, _k0, k_end = _tile(g + STAGES, n1, lo1, lo2, prefix_len, extend_len, BN)
    v_new, v_start, _v0, _v_end = _tile(g - 1 + STAGES, n1, lo1, lo2, prefix_len, extend_len, BN)
    if FROM_CACHE and not flags.WARP_SPECIALIZED:
        # The block-table entries now; the copies that use them after the scores' wait.
        pages_k, valid_k = tile_pages(at.bt_row, k_start, k_end, walk.lowest, k_ok & ~k_new,
                                      at.oob_row, flags.PAGE, flags.COPY_ROWS, flags.TILE_COPIES, at.ring_width,
                                      flags.RING)
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
    p_op = _weights_operand(p_prev, p_layout, ring.k_smem.dtype, flags.USE_FP8_PRODUCTS)
    mbarrier.wait(ring.bar_v.index(prev), ((g - 1) // STAGES) & 1)
    acc_tok = warpgroup_mma(p_op, _v_operand(ring.v_smem.index(prev), flags.USE_FP8_PRODUCTS), acc,
                            is_async=True)
    s = warpgroup_mma_wait(1, deps=(s_tok, ))
    if flags.WARP_SPECIALIZED:
        mbarrier.arrive(ring.empty_k.index(st))
    else:
        _issue_own(descs.k, descs.kc, ring.bar_k.index(st), ring.k_smem.index(st), k_ok, k_new,
                   k_start, pages_k, valid_k, at, flags)
    if FROM_CACHE and not flags.USE_FP8_PRODUCTS:
        if key0 + BN > key_end:
            # The prefix's last tile: its V rows past the end zeroed before its product
            # (with fp8 products, by the converter).
            mbarrier.wait(ring.bar_v.index(st), (g // STAGES) & 1)
            _zero_past_end(ring.v_smem.index(st), key0, key_end, BN, flags.D)
    if (start >= mid_lo) & (start < mid_hi):
        m_i, l_i, p, alpha = weights(s, m_i, l_i, q_pos, key0 + o_n, key_end, rule, flags, False,
                                     flags.USE_FP8_PRODUCTS, P_LOG2 if flags.USE_FP8_PRODUCTS else 0)
    else:
        m_i, l_i, p, alpha = weights(s, m_i, l_i, q_pos, key0 + o_n, key_end, rule, flags, True,
                                     flags.USE_FP8_PRODUCTS, P_LOG2 if flags.USE_FP8_PRODUCTS else 0,
                                     _keep(q_pos, key0 + o_n, key_end, rule, flags))
    acc = warpgroup_mma_wait(0, deps=(acc_tok, ))
    if flags.WARP_SPECIALIZED:
        mbarrier.arrive(ring.empty_v.index(prev))
    else:
        _issue_own(descs.v, descs.vc, ring.bar_v.index(prev), ring.v_smem.index(prev), v_ok,
                   v_new, v_start, pages_v, valid_v, at, flags)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    return m_i, l_i, acc, p, pages_k, valid_k


@gluon.jit
def _attend(i_h, q_smem, bar_q, ring, descs, at, walk, mids, rule, store, flags):
    """Query head ``i_h`` of the block (its tile in ``q_smem``) over the program's key
    tiles, output and lse stored: the warpgroup's work. Not WARP_SPECIALIZED, it issues the copies of
    the tiles it walks as well (the first STAGES issued before it: :func:`_issue_first`);
    WARP_SPECIALIZED (the tight loop of long windows and full attention, and over an fp8 cache every
    loop but a widened prefix's short or skip/none one), a producer warp issues them
    (:func:`_produce`) and the warpgroup signals each buffer's release on
    ``empty_k``/``empty_v``."""
    D: gl.constexpr = flags.D
    BM: gl.constexpr = flags.BM
    BN: gl.constexpr = flags.BN
    STAGES: gl.constexpr = flags.STAGES
    PAGE: gl.constexpr = flags.PAGE
    COPY_ROWS: gl.constexpr = flags.COPY_ROWS
    TILE_COPIES: gl.constexpr = flags.TILE_COPIES
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
    k_smem, v_smem, bar_k, bar_v = ring.k_smem, ring.v_smem, ring.bar_k, ring.bar_v
    bt_row, oob_row = at.bt_row, at.oob_row
    WARPS: gl.constexpr = gl.num_warps()  # BM // 16: one warpgroup, or two
    BITS: gl.constexpr = 8 if flags.USE_FP8_PRODUCTS else 16  # the products' operands
    s_layout: gl.constexpr = wgmma_layout(BN, WARPS, BITS)
    o_layout: gl.constexpr = wgmma_layout(D, WARPS, BITS)
    p_layout: gl.constexpr = operand_layout(o_layout, BITS)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    col_o: gl.constexpr = gl.SliceLayout(0, o_layout)
    dtype: gl.constexpr = k_smem.dtype

    mbarrier.wait(bar_q, 0)
    if flags.USE_FP8_PRODUCTS:
        # Each query row quantized to e4m3 in place (the tile read whole first), scaled so
        # its largest element lands on 448; the scale joins the row's scores' scale. A row of
        # zeros keeps the scale 1 (its scores are 0 either way; a scale of 0 would make a
        # masked score's -inf NaN).
        q_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
        b_q = q_smem.load(q_layout).to(gl.float32)
        amax = gl.max(gl.abs(b_q), 1)
        inv = gl.where(amax > 0.0, 448.0 / amax, 0.0)
        row_scale = gl.where(amax > 0.0, amax * (1.0 / 448.0), 1.0)
        rule = GluonRule(rule.qk_scale * gl.convert_layout(row_scale, row_s), rule.softcap,
                         rule.window_left, rule.window_right)
        gl.thread_barrier()
        q_smem = q_smem._reinterpret(gl.float8e4nv, [BM, D], descs.kc.layout)
        q_smem.store((b_q * inv[:, None]).to(gl.float8e4nv))
        fence_async_shared()
        gl.thread_barrier()
    elif flags.FP8:
        if q_smem.dtype == gl.bfloat16:
            # The products run in fp16: the bf16 query tile converted in place, once (each
            # thread rewrites the elements it read).
            q_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
            b_q = q_smem.load(q_layout)
            q_smem = q_smem._reinterpret(gl.float16, [BM, D], q_smem.layout)
            q_smem.store(b_q.to(gl.float16))
            fence_async_shared()
            gl.thread_barrier()
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
        if n > 0:
            # Tile 0's scores and softmax; then for tile g: its scores, tile g - 1's
            # product issued behind them, wait for the scores only, g's softmax beside
            # the product, then wait for it (_overlap_step). The cache tiles and the new
            # tiles run in two loops, each with only its own loads, as one pipeline.
            is_new, start, key0, key_end = _tile(0, n1, lo1, lo2, prefix_len, extend_len, BN)
            mbarrier.wait(bar_k.index(0), 0)
            s_tok = warpgroup_mma(q_a, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False,
                                  is_async=True)
            s = warpgroup_mma_wait(0, deps=(s_tok, ))
            if flags.WARP_SPECIALIZED:
                mbarrier.arrive(ring.empty_k.index(0))
                pages = (0, 0, 0, 0)
                valid = (False, False, False, False)
            else:
                nxt_new, nxt_start, _k0, nxt_end = _tile(STAGES, n1, lo1, lo2, prefix_len,
                                                         extend_len, BN)
                nxt_ok = STAGES < n
                pages, valid = tile_pages(bt_row, nxt_start, nxt_end, lowest, nxt_ok & ~nxt_new,
                                          oob_row, PAGE, COPY_ROWS, TILE_COPIES, at.ring_width, flags.RING)
                _issue_own(descs.k, descs.kc, bar_k.index(0), k_smem.index(0), nxt_ok, nxt_new,
                           nxt_start, pages, valid, at, flags)
            if not flags.USE_FP8_PRODUCTS:  # with fp8 products the converter zeroes them
                if (~is_new) & (key0 + BN > key_end):
                    mbarrier.wait(bar_v.index(0), 0)
                    _zero_past_end(v_smem.index(0), key0, key_end, BN, D)
            m_i, l_i, p, alpha = weights(s, m_i, l_i, q_pos, key0 + o_n, key_end, rule, flags,
                                         True, flags.USE_FP8_PRODUCTS, P_LOG2 if flags.USE_FP8_PRODUCTS else 0,
                                         _keep(q_pos, key0 + o_n, key_end, rule, flags))
            mids = Mids(mid1_lo, mid1_hi, mid2_lo, mid2_hi)
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
            p_op = _weights_operand(p, p_layout, dtype, flags.USE_FP8_PRODUCTS)
            acc_tok = warpgroup_mma(p_op, _v_operand(v_smem.index(last), flags.USE_FP8_PRODUCTS), acc,
                                    is_async=True)
            acc = warpgroup_mma_wait(0, deps=(acc_tok, ))
    else:
        # skip / none: every tile of each stage from 0, in the plain order, all masked.
        for j in range(0, n):
            st = j % STAGES
            is_new, start, key0, key_end = _tile(j, n1, lo1, lo2, prefix_len, extend_len, BN)
            if not flags.WARP_SPECIALIZED:
                nxt_new, nxt_start, _k0, nxt_end = _tile(j + STAGES, n1, lo1, lo2, prefix_len,
                                                         extend_len, BN)
                nxt_ok = j + STAGES < n
                pages, valid = tile_pages(bt_row, nxt_start, nxt_end, lowest, nxt_ok & ~nxt_new,
                                          oob_row, PAGE, COPY_ROWS, TILE_COPIES, at.ring_width, flags.RING)
            mbarrier.wait(bar_k.index(st), (j // STAGES) & 1)
            mbarrier.wait(bar_v.index(st), (j // STAGES) & 1)
            k_pos = key0 + o_n
            keep = _keep(q_pos, k_pos, key_end, rule, flags)
            work = True
            if flags.SKIP:
                work = gl.max(gl.max(keep.to(gl.int32), 1), 0) > 0
            if work:
                s_tok = warpgroup_mma(q_a, k_smem.index(st).permute((1, 0)), s_zero,
                                      use_acc=False, is_async=True)
                s = warpgroup_mma_wait(0, deps=(s_tok, ))
                m_i, l_i, p, alpha = weights(s, m_i, l_i, q_pos, k_pos, key_end, rule, flags,
                                             True, flags.USE_FP8_PRODUCTS, P_LOG2 if flags.USE_FP8_PRODUCTS else 0,
                                             _keep(q_pos, k_pos, key_end, rule, flags))
                acc = acc * gl.convert_layout(alpha, row_o)[:, None]
                p_op = _weights_operand(p, p_layout, dtype, flags.USE_FP8_PRODUCTS)
                if not flags.USE_FP8_PRODUCTS:
                    if (~is_new) & (key0 + BN > key_end):
                        _zero_past_end(v_smem.index(st), key0, key_end, BN, D)
                acc_tok = warpgroup_mma(p_op, _v_operand(v_smem.index(st), flags.USE_FP8_PRODUCTS), acc,
                                        is_async=True)
                acc = warpgroup_mma_wait(0, deps=(acc_tok, ))
            if flags.WARP_SPECIALIZED:
                mbarrier.arrive(ring.empty_k.index(st))
                mbarrier.arrive(ring.empty_v.index(st))
            else:
                # Both stages' buffers are free again (their products waited for above).
                gl.thread_barrier()
                _issue_own(descs.k, descs.kc, bar_k.index(st), k_smem.index(st), nxt_ok, nxt_new,
                           nxt_start, pages, valid, at, flags)
                _issue_own(descs.v, descs.vc, bar_v.index(st), v_smem.index(st), nxt_ok, nxt_new,
                           nxt_start, pages, valid, at, flags)

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


@gluon.jit
def _stage(bufs, st, flags):
    """Ring stage ``st`` where the producer's copies land: the stage, or over an fp8 cache
    widened by the converter its upper half (``bufs``: the stages' fp8 views)."""
    dst = bufs.index(st)
    if flags.FP8 and not flags.USE_FP8_PRODUCTS:
        dst = dst.slice(flags.BN, flags.BN)
    return dst


@gluon.jit
def _produce(descs, ring, walk, at, flags, wide):
    """The producer warp of a warp-specialized program (WARP_SPECIALIZED): the copies of every key
    tile of the program's list, tile j's K and V into stage j % STAGES once the
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
        is_new, start, _key0, key_end = _tile(j, n1, lo1, lo2, prefix_len, extend_len, BN)
        pages, valid = tile_pages(at.bt_row, start, key_end, lowest, ~is_new, at.oob_row,
                                  flags.PAGE, flags.COPY_ROWS, flags.TILE_COPIES, at.ring_width, flags.RING)
        # Over an fp8 cache K's pages not copied read the poison rows (else None).
        mbarrier.wait(ring.empty_k.index(st), free)
        _copy_tile(descs.k, descs.kc, ring.bar_k.index(st), ring.k_smem, wide.k_smem, st, is_new,
                   start, pages, valid, at, flags, descs.poison)
        mbarrier.wait(ring.empty_v.index(st), free)
        _copy_tile(descs.v, descs.vc, ring.bar_v.index(st), ring.v_smem, wide.v_smem, st, is_new,
                   start, pages, valid, at, flags, None)


@gluon.jit
def _issue_own(new_desc, cache_desc, bar, dest, ok, is_new, start, pages, valid, at, flags):
    """A tile's K or V copies into ``dest`` issued by the warpgroup itself (not WARP_SPECIALIZED;
    _gluon.issue), nothing when not ``ok``; with the window's prefix widened before the
    kernel (PREFIX_ROWS) a cache tile's rows whole from the sequence's first row there, as
    :func:`_copy_tile` copies them for the producer warp."""
    if flags.PREFIX_ROWS:
        if is_new:
            issue(new_desc, new_desc, bar, dest, ok, True, start, at.row0, at.col, pages, valid,
                  at.oob_row, flags.PAGE, flags.COPY_ROWS, flags.TILE_COPIES, flags.BN, flags.D)
        else:
            issue(cache_desc, cache_desc, bar, dest, ok, True, start, at.prefix_row0, at.col,
                  pages, valid, at.oob_row, flags.PAGE, flags.COPY_ROWS, flags.TILE_COPIES, flags.BN, flags.D)
    else:
        issue(new_desc, cache_desc, bar, dest, ok, is_new, start, at.row0, at.col, pages, valid,
              at.oob_row, flags.PAGE, flags.COPY_ROWS, flags.TILE_COPIES, flags.BN, flags.D)


@gluon.jit
def _issue_first(descs, ring, walk, at, flags):
    """Not WARP_SPECIALIZED: the copies of the program's first STAGES tiles, issued before its loop
    (:func:`_attend` issues the rest as it frees their buffers)."""
    for i in gl.static_range(flags.STAGES):
        ok = i < walk.n
        is_new, start, _key0, key_end = _tile(i, walk.n1, walk.lo1, walk.lo2, walk.prefix_len,
                                              walk.extend_len, flags.BN)
        pages, valid = tile_pages(at.bt_row, start, key_end, walk.lowest, ok & ~is_new,
                                  at.oob_row, flags.PAGE, flags.COPY_ROWS, flags.TILE_COPIES, at.ring_width, flags.RING)
        _issue_own(descs.k, descs.kc, ring.bar_k.index(i), ring.k_smem.index(i), ok, is_new,
                   start, pages, valid, at, flags)
        _issue_own(descs.v, descs.vc, ring.bar_v.index(i), ring.v_smem.index(i), ok, is_new,
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
                  pages, valid, at.oob_row, flags.PAGE, flags.COPY_ROWS, flags.TILE_COPIES, flags.BN, flags.D)
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
                  at.row0, at.col, pages, valid, at.oob_row, flags.PAGE, flags.COPY_ROWS, flags.TILE_COPIES,
                  flags.BN, flags.D, poison)
    else:
        issue(new_desc, cache_desc, bar, _stage(bufs, st, flags), True, is_new, start, at.row0,
              at.col, pages, valid, at.oob_row, flags.PAGE, flags.COPY_ROWS, flags.TILE_COPIES, flags.BN, flags.D,
              poison)


@gluon.jit
def _convert(ring, wide, walk, flags):
    """The converter warps (over an fp8 cache): a cache tile's K, then its V, widened in
    place to the fp16 tile the warpgroup reads once its copy has landed (``ring``: the
    producer's barriers and fp8 views; ``wide``: the fp16 views and the barriers that hand
    a tile over; _gluon.widen_in_place); a new tokens' tile, copied as fp16, handed over
    as it landed. The warpgroup releases a stage to the producer as over a 16-bit cache: a
    stage is refilled only after its tiles were widened and used."""
    STAGES: gl.constexpr = flags.STAGES
    BN: gl.constexpr = flags.BN
    D: gl.constexpr = flags.D
    WARPS: gl.constexpr = gl.num_warps()
    n1 = uniform(walk.n1)
    for j in range(uniform(walk.n)):
        st = j % STAGES
        phase = (j // STAGES) & 1
        mbarrier.wait(ring.bar_k.index(st), phase)
        if j < n1:
            widen_in_place(ring.k_smem.index(st).slice(BN, BN), wide.k_smem.index(st), BN, D,
                           WARPS)
            fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(wide.bar_k.index(st))
        mbarrier.wait(ring.bar_v.index(st), phase)
        if j < n1:
            widen_in_place(ring.v_smem.index(st).slice(BN, BN), wide.v_smem.index(st), BN, D,
                           WARPS)
            fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(wide.bar_v.index(st))


@gluon.jit
def _transpose(ring, vt_smem, full_v, walk, flags):
    """The converter warps with fp8 products: tile j's V copy (``ring``: the producer's
    barriers and stages) written transposed, its keys in :func:`_key_order`, to ``vt_smem``
    (the [D, BN] tiles P @ V reads) and handed over on ``full_v``. The rows of the prefix's
    last tile past its end (unwritten, NaN in the tests) are written as 0: their weights
    are 0, but 0 * NaN is not. K needs no conversion: the score products read its copies.

    Each thread moves 4 keys x 16 channels (:func:`_transpose_layout`, :func:`_transposed`):
    16-byte reads of the [BN, D] tile, 4 adjacent bytes into each of 16 rows of the [D, BN]
    one (stmatrix). A warp's lanes span the 64 keys, so a write fills whole 64-byte rows; a
    warp across the channels instead (32 rows of the transposed tile an instruction) met
    eight to sixteen ways of bank conflict, and B ran 2.4x bf16's time (the
    fp8-extend-products results)."""
    STAGES: gl.constexpr = flags.STAGES
    BN: gl.constexpr = flags.BN
    gl.static_assert(BN == 64, "the transpose's layout spans 64 keys")
    gl.static_assert(32 * gl.num_warps() <= flags.D, "the transpose's warps split 32 channels each")
    layout: gl.constexpr = _transpose_layout(BN, flags.D, gl.num_warps())
    n, n1, lo1, lo2 = uniform(walk.n), uniform(walk.n1), uniform(walk.lo1), uniform(walk.lo2)
    prefix_len, extend_len = uniform(walk.prefix_len), uniform(walk.extend_len)
    for j in range(n):
        st = j % STAGES
        _new, _start, key0, key_end = _tile(j, n1, lo1, lo2, prefix_len, extend_len, BN)
        mbarrier.wait(ring.bar_v.index(st), (j // STAGES) & 1)
        b = ring.v_smem.index(st).load(layout)  # [BN, D]
        if key0 + BN > key_end:
            keys = key0 + gl.arange(0, BN, layout=gl.SliceLayout(1, layout))
            b = gl.where((keys < key_end)[:, None], b, gl.zeros_like(b))
        vt_smem.index(st).store(_transposed(b))
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(full_v.index(st))


@gluon.jit
def _hopper_extend_kernel(
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
    seq_block_ends = gl.where(m_seq, gl.associative_scan(seq_blocks, 0, _add), 2147483647)
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

    dtype: gl.constexpr = q_desc.dtype
    # Over an fp8 cache the stages hold the fp16 tiles the converter makes (the products
    # run in fp16; the query tile's layout, a 16-bit [BM, D] one, swizzles as a 16-bit
    # [BN, D] tile's: it depends on D and the element size only), and the copies land in
    # their fp8 views.
    # PREFIX_ROWS (over an fp8 cache, a window, the default products): the window's visible
    # prefix was widened before the kernel into fp16 rows (ops.cache.PrefixRowsLaunch), which
    # kc_desc/vc_desc then copy, as the new rows' descriptors do.
    FP8: gl.constexpr = PREFIX_ROWS or kc_desc.dtype.is_fp8()
    # With fp8 products (FP8_PRODUCTS, over an fp8 cache): the products read the copies'
    # fp8 K tiles and the converter's transposed fp8 V tiles, and the query tile and the
    # weights are quantized to e4m3.
    USE_FP8_PRODUCTS: gl.constexpr = FP8 and FP8_PRODUCTS
    q_smem = gl.allocate_shared_memory(dtype, [BM, D], q_desc.layout)
    if USE_FP8_PRODUCTS:
        k_smem = gl.allocate_shared_memory(kc_desc.dtype, [STAGES, BN, D], kc_desc.layout)
        v_smem = gl.allocate_shared_memory(vc_desc.dtype, [STAGES, BN, D], vc_desc.layout)
        vt_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([D, BN], vc_desc.dtype)
        vt_smem = gl.allocate_shared_memory(vc_desc.dtype, [STAGES, D, BN], vt_layout)
    elif FP8:
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
    mbarrier.init(bar_q, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(bar_k.index(i), count=1)
        mbarrier.init(bar_v.index(i), count=1)
        mbarrier.init(empty_k.index(i), count=1)
        mbarrier.init(empty_v.index(i), count=1)

    row0 = seq_start
    # Bundles; the constexpr one is assigned as a constexpr (a plain assignment would turn
    # its values into run-time ones).
    flags: gl.constexpr = HopperFlags(D, BM, BN, STAGES, PAGE, COPY_ROWS, TILE_COPIES, USE_WINDOW,
                                      USE_RIGHT, IS_CAUSAL, HAS_SINKS, USE_SOFTCAP, RETURN_LSE,
                                      TIGHT, SKIP, Q_REGS, WARP_SPECIALIZED, FP8, USE_FP8_PRODUCTS,
                                      PREFIX_ROWS, RANGES, CHUNK, RING)
    ring = Ring(k_smem, v_smem, bar_k, bar_v, empty_k, empty_v)
    descs = Descs(k_desc, v_desc, kc_desc, vc_desc, poison)
    prefix_row0 = 0
    if PREFIX_ROWS:
        # The sequences' widened prefixes lie one after another, each from its first
        # new token's lowest visible tile (ops.cache.prefix_rows_base); a sequence with no
        # new tokens has none.
        p_all = gl.where(seq_blocks > 0, gl.load(prefix_lens + o_seq, mask=m_seq, other=0), 0)
        base = gl.maximum(p_all - window_left, 0) // BN * BN
        prefix_row0 = uniform(gl.sum(gl.where(o_seq < i_seq, p_all - base, 0), 0)
                              - gl.sum(gl.where(o_seq == i_seq, base, 0), 0))
    at = CopyAt(bt_row, row0, col, oob_row, prefix_row0, ring_width)
    walk = Walk(n, n1, lo1, lo2, prefix_len, extend_len, lowest)
    mids = Mids(mid1_lo, mid1_hi, mid2_lo, mid2_hi)
    rule = GluonRule(qk_scale, softcap, window_left, window_right)
    store = Store(sinks, Out, Lse, stride_ot, stride_oh, stride_lt, seq_start, block_start, None,
                  key_lo, key_hi)
    mbarrier.expect(bar_q, BM * D * 2)
    tma.async_copy_global_to_shared(q_desc, [row0 + block_start, i_h * D], bar_q, q_smem)
    if FP8:
        # The cache holds value / scale: K's scale joins qk_scale, V's the output's.
        k_mult = gl.load(k_scale + i_kvh * K_SCALE_STRIDE)
        v_mult = gl.load(v_scale + i_kvh * V_SCALE_STRIDE)
        full_k = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        full_v = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(full_k.index(i), count=1)
            mbarrier.init(full_v.index(i), count=1)
        store = Store(sinks, Out, Lse, stride_ot, stride_oh, stride_lt, seq_start, block_start,
                      v_mult, key_lo, key_hi)
        if PREFIX_ROWS and not WARP_SPECIALIZED:
            # Every tile copied as fp16 rows, the warpgroup issuing the copies itself where a
            # 16-bit launch would (short windows, the skip/none bounds): the 16-bit loop.
            _issue_first(descs, ring, walk, at, flags)
            _attend(i_h, q_smem, bar_q, ring, descs, at, walk, mids,
                    GluonRule(qk_scale * k_mult, softcap, window_left, window_right), store, flags)
        elif PREFIX_ROWS:
            # Every tile copied as fp16 rows by the producer warp: the 16-bit loop, no
            # converter.
            gl.warp_specialize([
                (_attend, (i_h, q_smem, bar_q, ring, descs, at, walk, mids,
                           GluonRule(qk_scale * k_mult, softcap, window_left, window_right), store,
                           flags)),
                (_produce, (descs, ring, walk, at, flags, ring)),
            ], [1], [PRODUCER_REGS])
        elif USE_FP8_PRODUCTS:
            copies = Ring(k_smem, v_smem, bar_k, bar_v, empty_k, empty_v)
            gl.warp_specialize([
                (_attend, (i_h, q_smem, bar_q, Ring(k_smem, vt_smem, bar_k, full_v, empty_k,
                                                    empty_v), descs, at, walk, mids,
                           GluonRule(qk_scale * k_mult, softcap, window_left, window_right), store,
                           flags)),
                (_produce, (descs, copies, walk, at, flags, copies)),
                (_transpose, (copies, vt_smem, full_v, walk, flags)),
            ], [1, CONVERT_WARPS], [PRODUCER_REGS, CONVERT_REGS])
        else:
            copies = Ring(k_smem._reinterpret(kc_desc.dtype, [STAGES, 2 * BN, D], kc_desc.layout),
                          v_smem._reinterpret(vc_desc.dtype, [STAGES, 2 * BN, D], vc_desc.layout),
                          bar_k, bar_v, empty_k, empty_v)
            wide = Ring(k_smem, v_smem, full_k, full_v, empty_k, empty_v)
            gl.warp_specialize([
                (_attend, (i_h, q_smem, bar_q, wide, descs, at, walk, mids,
                           GluonRule(qk_scale * k_mult, softcap, window_left, window_right), store,
                           flags)),
                (_produce, (descs, copies, walk, at, flags, wide)),
                (_convert, (copies, wide, walk, flags)),
            ], [1, CONVERT_WARPS], [PRODUCER_REGS, CONVERT_REGS])
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(full_k.index(i))
            mbarrier.invalidate(full_v.index(i))
    elif WARP_SPECIALIZED:
        # The partitions' arguments in the call itself: a tuple held in a variable loses its
        # constexprs on the way into a partition (Triton 3.6).
        gl.warp_specialize([
            (_attend, (i_h, q_smem, bar_q, ring, descs, at, walk, mids, rule, store, flags)),
            (_produce, (descs, ring, walk, at, flags, ring)),
        ], [1], [PRODUCER_REGS])
    else:
        _issue_first(descs, ring, walk, at, flags)
        _attend(i_h, q_smem, bar_q, ring, descs, at, walk, mids, rule, store, flags)

    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bar_k.index(i))
        mbarrier.invalidate(bar_v.index(i))
        mbarrier.invalidate(empty_k.index(i))
        mbarrier.invalidate(empty_v.index(i))
    mbarrier.invalidate(bar_q)


# --------------------------------------------------------------------------------------
# Host side.
# --------------------------------------------------------------------------------------

def takes_shape(head_dim, head_dim_v, page_size):
    """Whether the path takes these head dims and this page size (a pure function: the
    plan and the tile model ask it too)."""
    if head_dim not in HEAD_DIMS or head_dim_v != head_dim or page_size % 16:
        return False
    block_n = HopperExtendConfig.block_n  # the key tile of every head dim
    if page_size < block_n:
        return block_n % page_size == 0
    return page_size % block_n == 0


def unsupported(device, dtype, head_dim, head_dim_v, page_size, masked, deterministic,
                kv_dtype=None):
    """Why a plan cannot take the Hopper path (a sentence), or None when it can; the
    tensors' strides are checked at run time (:func:`descriptors`). ``kv_dtype``: the
    cache's, where it is fp8."""
    if device.type != "cuda":
        return "it runs on CUDA devices only (not under the interpreter)"
    if torch.cuda.get_device_capability(device) != (9, 0):
        return "it needs an sm_90 GPU (Hopper)"
    if deterministic:
        return "deterministic=True runs the single-pass kernel"
    if masked:
        return "it takes no custom mask"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"it takes fp16 or bf16, got {dtype}"
    if kv_dtype not in (None, dtype) + FP8_DTYPES:
        return f"it takes a cache of the queries' dtype or fp8, got {kv_dtype}"
    if head_dim not in HEAD_DIMS or head_dim_v != head_dim:
        return f"it needs D = Dv in {HEAD_DIMS}, got {head_dim} and {head_dim_v}"
    if not takes_shape(head_dim, head_dim_v, page_size):
        return (f"it needs page_size a multiple of 16 that divides or is divided by "
                f"{HopperExtendConfig.block_n}, "
                f"got {page_size}")
    return None


@functools.lru_cache(maxsize=64)
def _layout(dtype, rows, head_dim):
    """The shared layout of a [rows, head_dim] tile of ``dtype`` (a torch dtype)."""
    return gl.NVMMASharedLayout.get_default_for([rows, head_dim], GL_DTYPES[dtype])


def descriptors(cfg, q, k, v, k_cache, v_cache, prefix=None):
    """(q, k, v, k_cache, v_cache, poison or None) descriptors of one launch under the
    tiling ``cfg`` (the cache's K pads with NaN, or over an fp8 cache reads the poison
    rows: see the module docstring), or a sentence saying why the copy engine cannot take
    them. Over an fp8 cache ``k``/``v`` are the new rows as the cache stores them
    (ops.cache.NewRowsLaunch)."""
    *lazy, poison = lazy_descriptors(cfg, q, k, v, k_cache, v_cache, prefix)
    descs = tuple(d.attempt() for d in lazy)
    if any(d is None for d in descs):
        return "the copy engine cannot take these strides (rows of heads * dim, 16-byte aligned)"
    return (*descs, poison)


def lazy_descriptors(cfg, q, k, v, k_cache, v_cache, prefix=None):
    """:func:`descriptors` made only where a launch needs them (ops._launch.Descriptor):
    a layout whose tensor maps were encoded before costs no descriptor; one the copy
    engine cannot take raises a ValueError at the launch. ``prefix``: with
    ``cfg.prefix_rows`` the (K, V) fp16 rows of the widened prefixes, whose descriptors
    stand in the cache's."""
    bm, bn, d = cfg.block_m, cfg.block_n, q.shape[-1]
    if cfg.prefix_rows:
        rows = (Descriptor(t, descriptor, bn, _layout(t.dtype, bn, d)) for t in (k, v, *prefix))
        return (Descriptor(q, descriptor, bm, _layout(q.dtype, bm, d)), *rows, None)
    rows = min(k_cache.shape[1], bn)
    page = _layout(k_cache.dtype, rows, d)
    new = (Descriptor(q, descriptor, bm, _layout(q.dtype, bm, d)),
           Descriptor(k, descriptor, bn, _layout(k.dtype, bn, d)),
           Descriptor(v, descriptor, bn, _layout(v.dtype, bn, d)))
    if k_cache.dtype in FP8_DTYPES:
        return (*new, Descriptor(k_cache, descriptor, rows, page),
                Descriptor(v_cache, descriptor, rows, page),
                poison_descriptor(k_cache.device, k_cache.dtype, rows, q.shape[-1], page))
    return (*new, Descriptor(k_cache, descriptor, rows, page, "nan"),
            Descriptor(v_cache, descriptor, rows, page), None)


_TENSORS = ("q_desc", "k_desc", "v_desc", "kc_desc", "vc_desc", "poison", "block_table",
            "cu_seqlens", "prefix_lens", "sinks", "Out", "Lse", "k_scale", "v_scale", "key_lo",
            "key_hi")
_INTS = ("stride_bt", "stride_ot", "stride_oh", "stride_lt", "oob_row", "num_tokens",
         "prefix_keys", "ring_width")


@functools.lru_cache(maxsize=64)
def _launcher(spec, dtypes):
    """The kernel's launch for one ExtendSpec (see ops.extend), its config a
    config.HopperExtendConfig."""
    cfg = spec.config
    ws = cfg.warp_specialized(spec.bounds, spec.window_left, spec.kv_dtype in FP8_DTYPES)
    fixed = dict(
        num_seqs=spec.num_seqs, qk_scale=spec.qk_scale, softcap=float(spec.softcap),
        window_left=clamp_extent(spec.window_left or 0),
        window_right=clamp_extent(spec.window_right or 0), D=spec.head_dim, GROUP=spec.group,
        PAGE=spec.page_size, BM=cfg.block_m, BN=cfg.block_n,
        STAGES=cfg.stages, SEQS_POW2=max(1 << max(spec.num_seqs - 1, 0).bit_length(), 2),
        USE_WINDOW=spec.window_left is not None,
        USE_RIGHT=(not spec.causal) and spec.window_right is not None, IS_CAUSAL=spec.causal,
        HAS_SINKS=spec.has_sinks, USE_SOFTCAP=spec.softcap > 0,
        DO_PREFIX=spec.keys in ("all", "prefix"), DO_NEW=spec.keys in ("all", "new"),
        RETURN_LSE=spec.return_lse, TIGHT=spec.bounds == "tight", SKIP=spec.bounds == "skip",
        HEADS_FIRST=cfg.heads_first, Q_REGS=cfg.q_regs, WARP_SPECIALIZED=ws, PRODUCER_REGS=cfg.producer_regs,
        K_SCALE_STRIDE=spec.scale_strides[0], V_SCALE_STRIDE=spec.scale_strides[1],
        CONVERT_WARPS=cfg.convert_warps, CONVERT_REGS=cfg.convert_regs,
        FP8_PRODUCTS=cfg.fp8_products, PREFIX_ROWS=cfg.prefix_rows, RANGES=spec.ranges,
        CHUNK=spec.attention_chunk or 0, RING=spec.ring)
    return Launch(_hopper_extend_kernel, fixed, cfg.launch_options(ws), _TENSORS, _INTS, dtypes)


class HopperExtendLaunch:
    """The Gluon kernel's launch for one ExtendSpec, bound once; a call launches on
    checked arguments (extend.ExtendLaunch's contract): no host sync, no allocation; it
    returns what ``ops._launch.relaunch`` takes, or None. ``descs``: :func:`lazy_descriptors`
    of this run's tensors; ``scales``: an fp8 cache's ``(k_scale, v_scale)``; ``ranges``:
    key_ranges' ``(key_lo, key_hi)``, or None."""

    def __init__(self, spec, dtypes):
        self.launch = _launcher(spec, dtypes)
        self.num_seqs, self.num_q_heads = spec.num_seqs, spec.num_q_heads
        self.block_m, self.heads_first = spec.config.block_m, spec.config.heads_first
        self.page_size = spec.page_size if spec.keys != "new" else None
        self.ring = spec.ring

    def __call__(self, q, block_table, cu_seqlens, prefix_lens, sinks, out, lse, descs, k_cache,
                 scales=(None, None), ranges=None):
        num_tokens = q.shape[0]
        if num_tokens == 0:
            return None
        blocks = -(-num_tokens // self.block_m) + self.num_seqs
        grid = (self.num_q_heads, blocks, 1) if self.heads_first else (blocks, self.num_q_heads, 1)
        lse_t = out if lse is None else lse
        os_ = out.stride()
        return self.launch(grid, (*descs, block_table, cu_seqlens, prefix_lens,
                           lse_t if sinks is None else sinks, out, lse_t, *scales,
                           *((cu_seqlens, cu_seqlens) if ranges is None else ranges)),
                    (block_table.stride(0), os_[0], os_[1], lse_t.stride(0),
                     k_cache.shape[0] * k_cache.shape[1],
                     *launch_extents(num_tokens, block_table, self.page_size,
                                     ring=self.ring)[:2],
                     block_table.shape[1] if self.ring else 1))
