"""What an fp8 cache adds to the warpgroup's loop: the converter warps that widen the
cache's tiles to fp16 in place (:func:`convert_tiles`), and with fp8 products the query tile and
the weights quantized to e4m3 (:func:`quantize_query`, :func:`weights_operand`) against V
tiles the converter transposes (:func:`transpose_tiles`); with the default products a bf16 query
tile converted to fp16 (:func:`fp16_query`)."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
)

from .._gluon import GluonRule, uniform, widen_in_place
from .walk import nth_tile

# With fp8 products the weights come out of the softmax times 2^P_LOG2 = 256 (weights.P_LOG2;
# the largest, 1, lands on 256 of e4m3's 448, the smallest kept above its subnormals), and
# the row sums with them, so the output's division undoes it.
P_LOG2 = gl.constexpr(8)


@gluon.jit
def quantize_query(q_smem, rule, fp8_layout: gl.constexpr, row_s: gl.constexpr):
    """With fp8 products: each query row quantized to e4m3 in place (the tile read whole
    first), scaled so its largest element lands on 448; the scale joins the row's scores'
    scale. A row of zeros keeps the scale 1 (its scores are 0 either way; a scale of 0 would
    make a masked score's -inf NaN). Returns the tile's fp8 view (``fp8_layout``, the
    cache tiles') and the rule with the rows' scales (``row_s``: the scores' rows)."""
    BM: gl.constexpr = q_smem.shape[0]
    D: gl.constexpr = q_smem.shape[1]
    q_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
    b_q = q_smem.load(q_layout).to(gl.float32)
    amax = gl.max(gl.abs(b_q), 1)
    inv = gl.where(amax > 0.0, 448.0 / amax, 0.0)
    row_scale = gl.where(amax > 0.0, amax * (1.0 / 448.0), 1.0)
    rule = GluonRule(rule.qk_scale * gl.convert_layout(row_scale, row_s), rule.softcap,
                     rule.window_left, rule.window_right)
    gl.thread_barrier()
    q_smem = q_smem._reinterpret(gl.float8e4nv, [BM, D], fp8_layout)
    q_smem.store((b_q * inv[:, None]).to(gl.float8e4nv))
    fence_async_shared()
    gl.thread_barrier()
    return q_smem, rule


@gluon.jit
def fp16_query(q_smem):
    """Over an fp8 cache with the default products, which run in fp16: a bf16 query tile
    converted in place, once (each thread rewrites the elements it read); returns the
    tile's fp16 view (a fp16 tile as it is)."""
    if q_smem.dtype == gl.bfloat16:
        BM: gl.constexpr = q_smem.shape[0]
        D: gl.constexpr = q_smem.shape[1]
        q_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
        b_q = q_smem.load(q_layout)
        q_smem = q_smem._reinterpret(gl.float16, [BM, D], q_smem.layout)
        q_smem.store(b_q.to(gl.float16))
        fence_async_shared()
        gl.thread_barrier()
    return q_smem


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
def weights_operand(p, p_layout: gl.constexpr, dtype: gl.constexpr,
                    USE_FP8_PRODUCTS: gl.constexpr):
    """A tile's weights as the A operand of P @ V: in the products' type, or with fp8
    products (already times 2^P_LOG2) in e4m3, in :func:`_key_order`."""
    if USE_FP8_PRODUCTS:
        op = gl.convert_layout(_key_order(p.to(gl.float8e4nv)), p_layout)
    else:
        op = gl.convert_layout(p.to(dtype), p_layout)
    return op


@gluon.jit
def v_operand(tile, USE_FP8_PRODUCTS: gl.constexpr):
    """A ring stage's V as the B operand of P @ V: the [BN, D] tile, or with fp8 products
    the converter's transposed [D, BN] tile seen as [BN, D] (fp8 products read B with
    the keys contiguous)."""
    if USE_FP8_PRODUCTS:
        tile = tile.permute((1, 0))
    return tile


@gluon.jit
def convert_tiles(ring, wide, walk, flags):
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
def transpose_tiles(ring, vt_smem, full_v, walk, flags):
    """The converter warps with fp8 products: tile j's V copy (``ring``: the producer's
    barriers and stages) written transposed, its keys in :func:`_key_order`, to ``vt_smem``
    (the [D, BN] tiles P @ V reads) and handed over on ``full_v``. The rows of the prefix's
    last tile past its end (unwritten, NaN in the tests) are written as 0: their weights
    are 0, but 0 * NaN is not. K needs no conversion: the score products read its copies.

    Each thread moves 4 keys x 16 channels (:func:`_transpose_layout`, :func:`_transposed`):
    16-byte reads of the [BN, D] tile, 4 adjacent bytes into each of 16 rows of the [D, BN]
    one (stmatrix). A warp's lanes span the 64 keys, so a write fills whole 64-byte rows; a
    warp across the channels instead (32 rows of the transposed tile an instruction) met
    eight to sixteen ways of bank conflict
    (``benchmarks/results/2026-12-02-h200-fp8-extend-products/``)."""
    STAGES: gl.constexpr = flags.STAGES
    BN: gl.constexpr = flags.BN
    gl.static_assert(BN == 64, "the transpose's layout spans 64 keys")
    gl.static_assert(32 * gl.num_warps() <= flags.D,
                     "the transpose's warps split 32 channels each")
    layout: gl.constexpr = _transpose_layout(BN, flags.D, gl.num_warps())
    n, n1, lo1, lo2 = uniform(walk.n), uniform(walk.n1), uniform(walk.lo1), uniform(walk.lo2)
    prefix_len, extend_len = uniform(walk.prefix_len), uniform(walk.extend_len)
    for j in range(n):
        st = j % STAGES
        _new, _start, key0, key_end = nth_tile(j, n1, lo1, lo2, prefix_len, extend_len, BN)
        mbarrier.wait(ring.bar_v.index(st), (j // STAGES) & 1)
        b = ring.v_smem.index(st).load(layout)  # [BN, D]
        if key0 + BN > key_end:
            keys = key0 + gl.arange(0, BN, layout=gl.SliceLayout(1, layout))
            b = gl.where((keys < key_end)[:, None], b, gl.zeros_like(b))
        vt_smem.index(st).store(_transposed(b))
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(full_v.index(st))
