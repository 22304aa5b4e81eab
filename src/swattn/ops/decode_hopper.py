"""Hopper fast path of the decode kernel, in Gluon: the same results contract as
:mod:`.decode` (window, splits, sinks, soft-cap, lse), with the window's pages brought in
by the copy engine (TMA) into a ring of STAGES shared-memory K/V buffers by a producer
warp while one warpgroup computes (warp-specialized).
 Why: the Triton kernel holds one K/V tile in flight a program, so it keeps its rate only with
four programs an SM, and a batch of long windows makes one wave whose end its slowest SMs set.
Here a program keeps STAGES tiles in flight and one thread issues them, so two programs an SM
stream as fast: long windows run whole in two waves, the second's programs starting wherever the
first's end, with no split and no merge
(benchmarks/results/2026-12-01-h200-decode-split-balance/, 2026-12-01-h200-hopper-decode/).
Short windows keep the Triton kernel (config.HopperDecodeConfig.min_keys).

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

An fp8 cache (e4m3fn or e5m2, value / scale): the ring holds fp8 pages (half the bytes a stage),
and the four warps read them straight into registers, widen them there to fp16 (exactly, one
packed conversion a pair) and take the products by mma.sync, so no widened tile is written to
shared memory (writing one cost most of fp8's gain:
benchmarks/results/2026-12-02-h200-fp8-hopper-decode/). A stage holds a tile of 128 keys
(config.hopper_decode_config): two 64-key sub-tiles in key order, whose scores are taken
together and folded into the softmax once a tile (:func:`_tile_weights`), the stage released
after the second's V reads. Each warp owns a quarter of every sub-tile, 16 keys, and keeps its
own softmax state over its keys (the scores batched by warp: :func:`_fp8_layout`); the four
states merge once at the end. A program's rows are 16 query heads of the group (the scores'
mma.sync M), a larger group taking several programs a KV head (head blocks, side by side on the
grid); a group of up to 8 runs the softmax over its 8 live rows only (:func:`_live_rows`). The
output's product is taken transposed, O^T += V^T P^T, with the head dim as M and the live rows
as N: for a group of up to 8, half the products of P @ V and half its registers, and P^T's
operand is the scores' own registers. K's fragment reads its head dim in another order than the
query's natural one (both the same order: the scores' sum is the same), and V's head dim comes
out of the product permuted and is put back before the store (:func:`_k_operand`,
:func:`_v_operand`): each thread then reads 16 or 32 contiguous bytes of a K row, 8 or 16 of a V
row; V's bytes are paired by key before they widen (:func:`_widen_pairs`). Why:
benchmarks/results/2026-12-03-h200-fp8-decode-consumer/, 2026-12-03-h200-fp8-decode-products/. A
program may take several work items (sequence, KV head, head block) one after another (config
``items``), its producer running on into the next item's copies while the warpgroup finishes the
current one: two where the grid is past a wave (HopperDecodeConfig.items_for;
benchmarks/results/2026-12-03-h200-fp8-decode-items/). K's scale joins qk_scale and V's
multiplies the output. A page not copied reads rows of fp8 NaN for K (the copy engine pads fp8
with zeros only).

Runs on sm_90 only, for fp16/bf16 queries over a cache of their dtype or fp8, D = Dv in
(64, 128), groups of at most 64 query heads, page sizes that are multiples of 16 dividing or
divided by the tile (64 keys, over fp8 128), no sparse keys; :func:`unsupported` says why a
launch cannot take it.
"""

import functools
from collections import namedtuple

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .. import window
from ..window import clamp_extent
from ._common import compile_bound, table_keys
from ._gluon import (
    GL_DTYPES,
    GluonRule,
    decode_seq_ok,
    descriptor,
    device_problem,
    issue,
    operand_layout,
    poison_descriptor,
    tile_pages,
    uniform,
    weights,
    wgmma_layout,
)
from ._launch import Descriptor, Launch
from ._validate import FP8_DTYPES
from .config import HopperDecodeConfig, hopper_decode_config
from .merge import split_scratch

# The head dims the kernel is written for; its tiling is a frozen config of the plan
# (config.HopperDecodeConfig).
HEAD_DIMS = (64, 128)

decode_first_key = compile_bound(window.decode_first_key, gluon.jit, globals())
decode_chunk_first_key = compile_bound(window.decode_chunk_first_key, gluon.jit, globals())
aligned_tiles = compile_bound(window.aligned_tiles, gluon.jit, globals())
split_tiles = compile_bound(window.split_tiles, gluon.jit, globals())

# The warpgroup's arguments, bundled once by the kernel (a namedtuple compiles to its
# fields); the scores rule travels as _gluon.GluonRule. IS_CAUSAL and USE_RIGHT are False
# (a decode query sees every key up to its own), named for _gluon.weights.
HopperDecodeFlags = namedtuple("HopperDecodeFlags", "D GROUP BM BN STAGES USE_WINDOW IS_CAUSAL "
                               "USE_RIGHT HAS_SINKS USE_SOFTCAP WRITE_PARTIAL RETURN_LSE SKIP FP8 "
                               "K_SCALE_STRIDE V_SCALE_STRIDE HEAD_BLOCKS ITEMS TIGHT "
                               "USE_CHUNK RING")  # constexprs
# The K/V ring: STAGES [BN, D] tiles each in shared memory, their copies' barriers, the
# barriers on which a stage is released to the producer.
DecodeRing = namedtuple("DecodeRing", "k_smem v_smem bar_k bar_v empty")
# Where the output goes: out and lse, or with split-KV the split's partial state; an fp8
# cache's V scale (None over a 16-bit one).
DecodeStore = namedtuple("DecodeStore", "sinks out lse part_o part_lse stride_ob stride_oh "
                         "stride_lb stride_pb stride_ph stride_ps stride_plb stride_plh v_scale")
# The program's sequence, KV head, head block (over an fp8 cache, and in the latent path:
# ops.decode_latent; 0 otherwise) and split, the sequence's length and first visible key,
# the split's tiles [t_start, t_stop).
# ``ok``: whether the length is well formed (window.decode_seq_ok); one that is not is
# walked as 0 keys, its output NaN.
Split = namedtuple("Split", "i_seq i_kvh i_hb i_split seq_len lo t_start t_stop ok")
# Over an fp8 cache a program takes up to ITEMS work items (sequence, KV head, head block)
# one after another, its ring running on across them: items first, first + stride, ... of
# num_items (the programs running at once take consecutive items, as with one item a
# program); what each item's Split is found from; the query's tensor and strides and the K
# scales (each item loads its own query rows).
Work = namedtuple("Work", "first stride num_items num_kv_heads i_split num_splits window_left "
                  "seq_lens block_table stride_bt Q stride_qb stride_qh k_scale cached_keys "
                  "chunk ring_width")


@gluon.jit
def _tile_range(seq_len, window_left, chunk, i_split, num_splits, BN: gl.constexpr,
                USE_WINDOW: gl.constexpr, USE_CHUNK: gl.constexpr, TIGHT: gl.constexpr):
    """(first visible key, first tile, end tile) of split ``i_split``: the tight tiles
    ``[lo // BN, cdiv(seq_len, BN))`` cut into ``num_splits`` contiguous runs; not TIGHT,
    split 0's run starts at tile 0."""
    lo = 0
    if USE_WINDOW:
        lo = decode_first_key(seq_len, window_left)
    if USE_CHUNK:
        lo = gl.maximum(lo, decode_chunk_first_key(seq_len, chunk))
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
def _item_split(work, w, flags):
    """Work item ``w``'s Split (heads fastest: a sequence's KV heads, and a KV head's head
    blocks, are consecutive items), its bounds warp-uniform."""
    i_hb = w % flags.HEAD_BLOCKS
    i_kvh = w // flags.HEAD_BLOCKS % work.num_kv_heads
    i_seq = w // flags.HEAD_BLOCKS // work.num_kv_heads
    seq_len = uniform(gl.load(work.seq_lens + i_seq))
    ok = decode_seq_ok(seq_len, work.cached_keys)
    seq_len = gl.where(ok, seq_len, 0)
    lo, t_start, t_stop = _tile_range(seq_len, work.window_left, work.chunk, work.i_split,
                                      work.num_splits, flags.BN, flags.USE_WINDOW,
                                      flags.USE_CHUNK, flags.TIGHT)
    return Split(i_seq.to(gl.int64), i_kvh, i_hb, work.i_split, seq_len, uniform(lo),
                 uniform(t_start), uniform(t_stop), ok)


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
def _consume(q_smem, ring, store, split, rule, flags):
    """The warpgroup over a 16-bit cache: tile j's scores, softmax and P @ V once its K/V
    copies have landed, then its stage released to the producer; the output (or the
    split's partial) stored."""
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
            mbarrier.wait(ring.bar_k.index(st), phase)
            mbarrier.wait(ring.bar_v.index(st), phase)
            s_tok = warpgroup_mma(q_smem, k_smem.index(st).permute((1, 0)), s_zero,
                                  use_acc=False, is_async=True)
            s = warpgroup_mma_wait(0, deps=(s_tok, ))
            if (key0 >= lo) & (key0 + BN <= seq_len):
                m_i, l_i, p, alpha = weights(s, m_i, l_i, q_pos, key0 + o_n, seq_len, rule, flags,
                                             False)
            elif flags.USE_CHUNK:
                # (the chunk's first key lo is the mask's floor: the window's predicate
                # does not know the chunk)
                keys = key0 + o_n
                m_i, l_i, p, alpha = weights(s, m_i, l_i, None, None, seq_len, rule, flags,
                                             True, keep=((keys >= lo) & (keys < seq_len))[None, :])
                _zero_outside(v_smem.index(st), key0, lo, seq_len, BN, D)
            else:
                m_i, l_i, p, alpha = weights(s, m_i, l_i, q_pos, key0 + o_n, seq_len, rule, flags,
                                             True)
                _zero_outside(v_smem.index(st), key0, lo, seq_len, BN, D)
            acc = acc * gl.convert_layout(alpha, row_o)[:, None]
            p_op = gl.convert_layout(p.to(dtype), p_layout)
            acc_tok = warpgroup_mma(p_op, v_smem.index(st), acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=(acc_tok, ))
            mbarrier.arrive(ring.empty.index(st))
            i += 1
    finish_hopper_decode(m_i, l_i, acc, store, split, flags, o_layout)


@gluon.constexpr_function
def _fp8_layout():
    """The registers of the fp8 path's products (mma.sync, 16 x 8 x 16 instructions): the
    scores [4, BM, 16] and the output transposed [4, D, live rows] batched by warp, warp w
    holding batch entry w (its 16 keys of each sub-tile, and its own softmax state over
    them)."""
    return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1, 1],
                                     instr_shape=[1, 16, 8])


@gluon.constexpr_function
def _k_read(D):
    """How the four warps read an fp8 [64, D] K tile: warp w its rows 16w.., lane 4g + t
    rows g and g + 8 of them (mma.sync's B columns) and the D / 4 contiguous bytes from
    column t * D / 4 (two or four 16-byte reads a row)."""
    regs = [[0, 1 << b] for b in range((D // 4).bit_length() - 1)] + [[8, 0]]
    lanes = [[0, D // 4], [0, D // 2], [1, 0], [2, 0], [4, 0]]
    return gl.DistributedLinearLayout(regs, lanes, [[16, 0], [32, 0]], [], [64, D])


@gluon.constexpr_function
def _v_read(D):
    """How the four warps read an fp8 [64, D] V tile: warp w its rows 16w.., lane 4g + t
    rows 2t, 2t + 1, 2t + 8 and 2t + 9 of them (keys: the A fragment's columns of V^T) and the
    D / 8 contiguous bytes from column g * D / 8 (its rows g and g + 8 of every 16-row block,
    relabelled: :func:`_v_operand`), one 16- or 8-byte read a row."""
    regs = [[0, 1 << b] for b in range((D // 8).bit_length() - 1)] + [[1, 0], [8, 0]]
    lanes = [[2, 0], [4, 0], [0, D // 8], [0, D // 4], [0, D // 2]]
    return gl.DistributedLinearLayout(regs, lanes, [[16, 0], [32, 0]], [], [64, D])


@gluon.jit
def _head_dim_order(x):
    """``x`` [A, B, D] with its last axis in the order the K fragment reads the head dim:
    column 8u + 2t + e of the result is column (D / 4) t + 2u + e of ``x`` (a relabelling of
    the registers each thread holds, no data moved). Applied to the query and to K alike."""
    A: gl.constexpr = x.shape[0]
    B: gl.constexpr = x.shape[1]
    D: gl.constexpr = x.shape[2]
    x = gl.permute(gl.reshape(x, [A, B, 4, D // 8, 2]), (0, 1, 3, 2, 4))
    return gl.reshape(x, [A, B, D])


@gluon.jit
def _k_operand(tile, D: gl.constexpr, b_layout: gl.constexpr):
    """An fp8 K tile of the ring as the scores' B operand, [4, D, 16] fp16 (warp w's keys
    16w..16w + 15, the head dim in :func:`_head_dim_order`'s order): read, widened and
    relabelled in registers."""
    k = tile.load(_k_read(D)).to(gl.float16)  # [64, D]
    k = _head_dim_order(gl.reshape(k, [4, 16, D]))
    return gl.convert_layout(gl.permute(k, (0, 2, 1)), b_layout)


@gluon.jit
def _widen_pairs(a, b):
    """fp8 tensors ``a`` and ``b`` (the same shape and layout: two keys' bytes of the same
    columns) widened to fp16 with each key pair in one register, as mma.sync's A fragment
    holds consecutive keys of a row of V^T: (wide_0, wide_1). From the 4 bytes a thread's
    register of ``a`` holds and the 4 of ``b``'s, wide_0's two registers hold (a0, b0) and
    (a1, b1), wide_1's (a2, b2) and (a3, b3): a byte permutation of the two registers for
    each two pairs, then one packed conversion a pair (widened first, the pairs took two
    permutations of 16-bit halves each). The results are labelled as ``a``'s elements:
    :func:`_v_operand` relabels them."""
    e5m2: gl.constexpr = a.dtype == gl.float8e5
    kind: gl.constexpr = "e5m2x2" if e5m2 else "e4m3x2"
    return gl.inline_asm_elementwise(
        "{ .reg .b32 lo, hi; .reg .b16 l0, l1, h0, h1;\n"
        "prmt.b32 lo, $4, $5, 0x5140; prmt.b32 hi, $4, $5, 0x7362;\n"
        "mov.b32 {l0, l1}, lo; mov.b32 {h0, h1}, hi;\n"
        f"cvt.rn.f16x2.{kind} $0, l0; cvt.rn.f16x2.{kind} $1, l1;\n"
        f"cvt.rn.f16x2.{kind} $2, h0; cvt.rn.f16x2.{kind} $3, h1; }}",
        "=r,=r,=r,=r,r,r", [a.to(gl.int8, bitcast=True), b.to(gl.int8, bitcast=True)],
        dtype=(gl.float16, gl.float16), is_pure=True, pack=4)


@gluon.jit
def _v_operand(tile, D: gl.constexpr, a_layout: gl.constexpr):
    """An fp8 V tile of the ring, transposed, as the A operand of the output's product taken
    transposed (O^T = V^T P^T): [4, D, 16] fp16, warp w's keys as the last axis. Read into
    registers, widened a key pair at a time (:func:`_widen_pairs`, on the pairs of rows
    2i, 2i + 1 a thread reads) and relabelled: its row 16i + 8h + g is the tile's column
    (D / 8) g + 2i + h, the D / 8 contiguous columns a thread reads (the output comes out so:
    :func:`_output_order` puts it back)."""
    v = tile.load(_v_read(D))  # [64, D] fp8
    a, b = gl.split(gl.permute(gl.reshape(v, [32, 2, D]), (0, 2, 1)))  # rows 2i and 2i + 1
    w_0, w_1 = _widen_pairs(a, b)
    # w_o's element (i, 4c + 2p + e) holds row 2i + e, column 4c + 2o + p.
    w = gl.reshape(gl.join(w_0, w_1), [32, D // 4, 2, 2, 2])  # (i, c, p, e, o)
    w = gl.reshape(gl.permute(w, (0, 3, 1, 4, 2)), [4, 16, D])  # the tile, by warp
    w = gl.reshape(gl.permute(w, (0, 2, 1)), [4, 8, D // 16, 2, 16])  # (w, g, i, h, key)
    w = gl.reshape(gl.permute(w, (0, 2, 3, 1, 4)), [4, D, 16])
    return gl.convert_layout(w, a_layout)


@gluon.jit
def _output_order(o, D: gl.constexpr):
    """The transposed output [D, R] of :func:`_v_operand`'s rows as [R, D] in the head
    dim's order."""
    R: gl.constexpr = o.shape[1]
    o = gl.permute(gl.reshape(o, [D // 16, 2, 8, R]), (3, 2, 0, 1))  # (r, g, i, h)
    return gl.reshape(o, [R, D])


@gluon.jit
def _live_rows(x, LIVE: gl.constexpr):
    """The first ``LIVE`` rows of ``x`` [4, 16, N] in the fp8 path's product layout (all 16,
    or the 8 that hold a group of up to 8: a thread holds rows g and g + 8, so this only
    relabels its registers)."""
    if LIVE == 8:
        A: gl.constexpr = x.shape[0]
        N: gl.constexpr = x.shape[2]
        x, _ = gl.split(gl.permute(gl.reshape(x, [A, 2, 8, N]), (0, 2, 3, 1)))
    return x


@gluon.jit
def _tile_weights(q, tile, key0, m_i, l_i, s_zero, s_keys, seq_len, lo, rule, flags,
                  b_layout: gl.constexpr):
    """The scores of a ring stage's K tile (``tile``, [BN, D], its first key ``key0``),
    both 64-key sub-tiles' products first, then folded into the warps' softmax state over
    the live rows (``m_i``'s, of :func:`_live_rows`) at once: (m, l, p_0, p_1, alpha), as
    _gluon.weights' with each sub-tile's weights apart (p_1 is p_0 where the tile is one
    sub-tile). A tile holding a key outside ``[lo, seq_len)`` is computed under the mask
    (``s_keys``: the keys' offsets, live rows, the sub-tiles' joined as the scores are)."""
    SUB: gl.constexpr = 64
    BN: gl.constexpr = tile.shape[0]
    LIVE: gl.constexpr = m_i.shape[1]
    s = mma_v2(q, _k_operand(tile.slice(0, SUB), flags.D, b_layout), s_zero)
    if BN == 2 * SUB:
        s_1 = mma_v2(q, _k_operand(tile.slice(SUB, SUB), flags.D, b_layout), s_zero)
        s = gl.reshape(gl.join(_live_rows(s, LIVE), _live_rows(s_1, LIVE)),
                       [s.shape[0], LIVE, 2 * s.shape[2]])
    else:
        s = _live_rows(s, LIVE)
    if (key0 >= lo) & (key0 + BN <= seq_len):
        m, l, p, alpha = weights(s, m_i, l_i, None, None, seq_len, rule, flags, False, AXIS=2)
    else:
        keys = key0 + s_keys
        m, l, p, alpha = weights(s, m_i, l_i, None, None, seq_len, rule, flags, True,
                                 keep=(keys >= lo) & (keys < seq_len), AXIS=2)
    if BN == 2 * SUB:
        p_0, p_1 = gl.split(gl.reshape(p, [p.shape[0], LIVE, p.shape[2] // 2, 2]))
    else:
        p_0 = p
        p_1 = p
    return m, l, p_0, p_1, alpha


@gluon.jit
def _consume_fp8(ring, store, work, rule, flags):
    """The four warps over an fp8 cache, each over its 16 keys of every 64-key sub-tile,
    for each of the program's work items in turn (:func:`_consume_item`), the ring's
    count running on across them."""
    i = gl.to_tensor(0)  # tiles taken from the ring so far
    # Unrolled: in a loop over the items, ptxas moved the query's registers every tile.
    for u in gl.static_range(flags.ITEMS):
        w = work.first + u * work.stride
        if w < work.num_items:
            i = _consume_item(ring, store, work, _item_split(work, w, flags), rule, flags, i)


@gluon.jit
def _consume_item(ring, store, work, split, rule, flags, i):
    """One work item over an fp8 cache, its first tile the ring's ``i``-th: each stage's K
    read from the ring into registers and widened there once its copies have landed, the
    scores of both sub-tiles and one softmax a tile, the output rescaled once a tile, then V
    the same way and the output's product a sub-tile at a time, taken transposed (O^T +=
    V^T P^T: the head dim as mma.sync's M, the live rows as its N, so a group of up to 8
    takes half the products of P @ V; P^T's B fragment is the scores' own registers), the
    stage released to the producer after the last V reads; at the end the warps' states
    merged and the output (or the split's partial) stored. Returns the ring's count."""
    D: gl.constexpr = flags.D
    BM: gl.constexpr = flags.BM
    BN: gl.constexpr = flags.BN
    STAGES: gl.constexpr = flags.STAGES
    SUB: gl.constexpr = 64  # keys a sub-tile: what the read layouts take
    KW: gl.constexpr = SUB // 4  # keys a warp a sub-tile
    # The read layouts (_k_read, _v_read) are written for 64-key sub-tiles, 16 keys and 16
    # query rows a warp; a ring tile holds one or two sub-tiles.
    gl.static_assert((BN == SUB or BN == 2 * SUB) and BM == 16,
                     "the fp8 decode path takes tiles of one or two 64-key sub-tiles, 16 rows")
    seq_len, lo = split.seq_len, split.lo
    t_start, t_stop = split.t_start, split.t_stop
    mma: gl.constexpr = _fp8_layout()
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_layout: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    rows3: gl.constexpr = gl.SliceLayout(2, mma)

    # The item's query rows (the head block's, zero past the group), in fp16 (a bf16 query
    # within fp16's range is an fp16 value) and in the K fragment's head-dim order, the same
    # for every warp; K's scale joins qk_scale (the cache holds value / scale).
    q_read: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    q_rows = split.i_hb * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, q_read))
    q_cols = gl.arange(0, D, layout=gl.SliceLayout(0, q_read))
    p_q = (work.Q + split.i_seq * work.stride_qb
           + (split.i_kvh * flags.GROUP + q_rows)[:, None] * work.stride_qh + q_cols[None, :])
    q = gl.load(p_q, mask=(q_rows < flags.GROUP)[:, None], other=0.0).to(gl.float16)
    q = _head_dim_order(gl.reshape(q, [1, BM, D]))
    q, _ = gl.broadcast(gl.convert_layout(q, a_layout), gl.zeros([4, BM, D], gl.float16, a_layout))
    rule = GluonRule(rule.qk_scale * gl.load(work.k_scale + split.i_kvh * flags.K_SCALE_STRIDE),
                     rule.softcap, rule.window_left, rule.window_right)
    # Warp w's keys of a sub-tile, from its first: w * KW + column (of the scores, and of
    # V^T's last axis).
    s_keys = (KW * gl.arange(0, 4, layout=gl.SliceLayout(1, rows3))[:, None, None]
              + gl.arange(0, KW, layout=gl.SliceLayout(0, gl.SliceLayout(1, mma)))[None, None, :])
    # The softmax and the output run over the live rows only: for a group of up to 8, rows
    # 8 to 15 of the scores (zero queries, never stored) are not computed past the products.
    LIVE: gl.constexpr = 8 if flags.GROUP <= 8 else BM
    s_zero = gl.zeros([4, BM, KW], gl.float32, layout=mma)
    s_keys = _live_rows(s_keys + gl.zeros([4, BM, KW], gl.int32, layout=mma), LIVE)
    if BN == 2 * SUB:
        s_keys = gl.reshape(gl.join(s_keys, s_keys + SUB), [4, LIVE, 2 * KW])
    v_cols: gl.constexpr = gl.SliceLayout(1, a_layout)
    v_keys = gl.expand_dims(KW * gl.arange(0, 4, layout=gl.SliceLayout(1, v_cols))[:, None]
                            + gl.arange(0, KW, layout=gl.SliceLayout(0, v_cols))[None, :], 1)
    l_i = gl.sum(gl.zeros_like(s_keys).to(gl.float32), 2)  # laid out as the scores
    m_i = l_i + float("-inf")
    acc = gl.zeros([4, D, LIVE], gl.float32, layout=mma)  # the output transposed
    cols3: gl.constexpr = gl.SliceLayout(1, mma)  # a row's value over acc's columns
    for j in range(t_start, t_stop):
        if _has_work(j * BN, lo, seq_len, BN, flags.SKIP):
            st = i % STAGES
            phase = (i // STAGES) & 1
            # The tile's scores, both sub-tiles', folded into the softmax state at once (a
            # tile with no visible key is computed under the mask: no weight, the same bits
            # as leaving it out), then the output rescaled.
            mbarrier.wait(ring.bar_k.index(st), phase)
            m_i, l_i, p_0, p_1, alpha = _tile_weights(
                q, ring.k_smem.index(st), j * BN, m_i, l_i, s_zero, s_keys, seq_len, lo, rule,
                flags, b_layout)
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, cols3), 1)
            mbarrier.wait(ring.bar_v.index(st), phase)
            for h in gl.static_range(BN // SUB):
                v = _v_operand(ring.v_smem.index(st).slice(h * SUB, SUB), D, a_layout)
                if h == BN // SUB - 1:
                    # The reads ordered before the copy engine's next writes to the stage
                    # (another proxy), then the stage released once every warp has read it.
                    fence_async_shared()
                    gl.thread_barrier()
                    mbarrier.arrive(ring.empty.index(st))
                key0 = j * BN + h * SUB
                if (key0 < lo) | (key0 + SUB > seq_len):
                    # V's rows outside the keys 0 (unwritten rows: NaN times a weight of 0).
                    keys = key0 + v_keys
                    v = gl.where((keys >= lo) & (keys < seq_len), v, gl.zeros_like(v))
                p = gl.permute((p_0 if h == 0 else p_1).to(gl.float16), (0, 2, 1))
                acc = mma_v2(v, gl.convert_layout(p, b_layout), acc)
            i += 1

    # The warps' states merged over the live rows (a warp that saw no key holds m = -inf,
    # l = 0, acc = 0).
    m = gl.max(m_i, 0)
    shift = gl.exp2(m_i - gl.expand_dims(gl.where(m == float("-inf"), 0.0, m), 0))
    o_layout: gl.constexpr = gl.BlockedLayout([1, D // 16], [2, 16], [4, 1], [1, 0])
    l_o = gl.sum(l_i * shift, 0)
    acc = gl.sum(acc * gl.expand_dims(gl.convert_layout(shift, cols3), 1), 0)
    acc = gl.convert_layout(_output_order(acc, D), o_layout)
    finish_hopper_decode(m, l_o, acc, store, split, flags, o_layout)
    return i


@gluon.jit
def finish_hopper_decode(m_i, l_i, acc, store, split, flags, o_layout: gl.constexpr):
    """_common.finish: o = acc / (l + e^{sink - m}), 0 and lse -inf where no key is
    visible, NaN where a visible key's page was bad; stored as the output (and lse) or the
    split's partial. ``acc`` [R, D] in ``o_layout``, ``m_i`` and ``l_i`` [R]: the program's
    first R rows (BM, or over fp8 the live rows of :func:`_live_rows`)."""
    D: gl.constexpr = flags.D
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    col_o: gl.constexpr = gl.SliceLayout(0, o_layout)
    rows = gl.arange(0, acc.shape[0], layout=row_o)
    if flags.HEAD_BLOCKS > 1:
        rows = rows + split.i_hb * flags.BM  # the head block's rows of the group
    head = split.i_kvh * flags.GROUP + rows
    m_row = rows < flags.GROUP
    m_safe = gl.convert_layout(gl.where(m_i == float("-inf"), 0.0, m_i), row_o)
    # (NaN for a length that is not well formed: window.decode_seq_ok)
    l_o = gl.where(split.ok, gl.convert_layout(l_i, row_o), float("nan"))
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
def _produce_tiles(kc_desc, vc_desc, poison, k_smem, v_smem, bar_k, bar_v, empty, bt_row,
                   seq_len, lo, t_start, t_stop, col, oob_row, i, PAGE: gl.constexpr,
                   COPY_ROWS: gl.constexpr, TILE_COPIES: gl.constexpr, BN: gl.constexpr,
                   D: gl.constexpr, STAGES: gl.constexpr, SKIP: gl.constexpr, ring_width,
                   RING: gl.constexpr):
    """The producer warp over one work item's tiles, the ring's ``i``-th first: for the
    i-th tile with work (:func:`_has_work`), its block-table entries, then its K and V page
    copies into stage i % STAGES once the warpgroup has released that stage's previous tile
    (the first round passes at once). ``poison``: an fp8 cache's NaN rows, read for K in
    the place of a page not copied (None: K's descriptor pads with NaN). Returns the ring's
    count."""
    for j in range(t_start, t_stop):
        start = j * BN
        if _has_work(start, lo, seq_len, BN, SKIP):
            st = i % STAGES
            free = ((i // STAGES) & 1) ^ 1
            pages, valid = tile_pages(bt_row, start, seq_len, lo, True, oob_row, PAGE, COPY_ROWS,
                                      TILE_COPIES, ring_width, RING)
            mbarrier.wait(empty.index(st), free)
            issue(kc_desc, kc_desc, bar_k.index(st), k_smem.index(st), True, False, start, 0,
                   col, pages, valid, oob_row, PAGE, COPY_ROWS, TILE_COPIES, BN, D, poison)
            issue(vc_desc, vc_desc, bar_v.index(st), v_smem.index(st), True, False, start, 0,
                   col, pages, valid, oob_row, PAGE, COPY_ROWS, TILE_COPIES, BN, D)
            i += 1
    return i


@gluon.jit
def _produce(kc_desc, vc_desc, poison, k_smem, v_smem, bar_k, bar_v, empty, bt_row, seq_len,
             lo, t_start, t_stop, col, oob_row, PAGE: gl.constexpr, COPY_ROWS: gl.constexpr,
             TILE_COPIES: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
             SKIP: gl.constexpr, ring_width, RING: gl.constexpr):
    """The producer warp over a 16-bit cache: the program's one work item
    (:func:`_produce_tiles`)."""
    _produce_tiles(kc_desc, vc_desc, poison, k_smem, v_smem, bar_k, bar_v, empty, bt_row,
                   uniform(seq_len), uniform(lo), uniform(t_start), uniform(t_stop), col,
                   oob_row, gl.to_tensor(0), PAGE, COPY_ROWS, TILE_COPIES, BN, D, STAGES, SKIP,
                   ring_width, RING)


@gluon.jit
def _produce_items(kc_desc, vc_desc, poison, k_smem, v_smem, bar_k, bar_v, empty, work,
                   oob_row, flags, PAGE: gl.constexpr, COPY_ROWS: gl.constexpr,
                   TILE_COPIES: gl.constexpr):
    """The producer warp over an fp8 cache: the program's work items one after another
    (:func:`_produce_tiles`), the ring running on across them, so the next item's first
    copies are in flight while the warpgroup finishes the current one."""
    i = gl.to_tensor(0)  # tiles put in the ring so far
    for u in gl.static_range(flags.ITEMS):
        w = work.first + u * work.stride
        if w < work.num_items:
            split = _item_split(work, w, flags)
            bt_row = work.block_table + split.i_seq * work.stride_bt
            i = _produce_tiles(kc_desc, vc_desc, poison, k_smem, v_smem, bar_k, bar_v, empty,
                               bt_row, split.seq_len, split.lo, split.t_start, split.t_stop,
                               split.i_kvh * flags.D, oob_row, i, PAGE, COPY_ROWS, TILE_COPIES,
                               flags.BN, flags.D, flags.STAGES, flags.SKIP, work.ring_width,
                               flags.RING)


@gluon.jit
def _hopper_decode_kernel(
    kc_desc, vc_desc, poison, Q, block_table, seq_lens, sinks, Out, Lse, Part_o, Part_lse,
    k_scale, v_scale, stride_qb, stride_qh, stride_bt, stride_ob, stride_oh, stride_lb,
    stride_pb, stride_ph, stride_ps, stride_plb, stride_plh, num_kv_heads, num_splits, oob_row,
    qk_scale, softcap, window_left, num_items, cached_keys, attention_chunk, ring_width,
    D: gl.constexpr, GROUP: gl.constexpr, PAGE: gl.constexpr, BM: gl.constexpr,
    BN: gl.constexpr, STAGES: gl.constexpr, Q_LAYOUT: gl.constexpr, USE_WINDOW: gl.constexpr,
    HAS_SINKS: gl.constexpr, USE_SOFTCAP: gl.constexpr, WRITE_PARTIAL: gl.constexpr,
    RETURN_LSE: gl.constexpr, TIGHT: gl.constexpr, SKIP: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, PDL: gl.constexpr, HEAD_BLOCKS: gl.constexpr,
    K_SCALE_STRIDE: gl.constexpr, V_SCALE_STRIDE: gl.constexpr, ITEMS: gl.constexpr,
    USE_CHUNK: gl.constexpr, RING: gl.constexpr,
):
    if PDL:
        # The split merge, launched as this kernel's programmatic dependent, may start once
        # every program has (it waits for this kernel's end before reading the parts).
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [],
                                  dtype=gl.int32, is_pure=False, pack=1)
    COPY_ROWS: gl.constexpr = PAGE if PAGE < BN else BN
    TILE_COPIES: gl.constexpr = BN // COPY_ROWS
    # Axis 0 runs over (sequence, KV head, head block), the heads fastest: a sequence's
    # programs start side by side and read its pages' rows (every KV head of a token, one
    # run) together, a KV head's head blocks (over an fp8 cache) the same tiles. Over an
    # fp8 cache a program takes up to ITEMS such work items, one after another (Work).
    FP8: gl.constexpr = kc_desc.dtype.is_fp8()
    gl.static_assert(FP8 or (HEAD_BLOCKS == 1 and ITEMS == 1),
                     "head blocks and several work items a program are the fp8 path's")
    i_split = gl.program_id(1)
    # Bundles; the constexpr one is assigned as a constexpr (a plain assignment would turn
    # its values into run-time ones), and the rule is built in the call, keeping its 0 a
    # constexpr (see extend_hopper).
    flags: gl.constexpr = HopperDecodeFlags(D, GROUP, BM, BN, STAGES, USE_WINDOW, False, False,
                                            HAS_SINKS, USE_SOFTCAP, WRITE_PARTIAL, RETURN_LSE,
                                            SKIP, FP8, K_SCALE_STRIDE, V_SCALE_STRIDE,
                                            HEAD_BLOCKS, ITEMS, TIGHT, USE_CHUNK, RING)
    # What each work item is found from (over an fp8 cache each partition finds each of its
    # items' sequence, bounds and query rows).
    work = Work(gl.program_id(0), gl.num_programs(0), num_items, num_kv_heads, i_split,
                num_splits, window_left, seq_lens, block_table, stride_bt, Q, stride_qb,
                stride_qh, k_scale, cached_keys, attention_chunk, ring_width)
    if not FP8:
        # The program's one work item, and its query rows (zero past the group) in shared
        # memory for the products.
        split = _item_split(work, gl.program_id(0), flags)
        bt_row = block_table + split.i_seq * stride_bt
        q_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        rows = gl.arange(0, BM, layout=gl.SliceLayout(1, q_layout))
        cols = gl.arange(0, D, layout=gl.SliceLayout(0, q_layout))
        p_q = (Q + split.i_seq * stride_qb + (split.i_kvh * GROUP + rows)[:, None] * stride_qh
               + cols[None, :])
        b_q = gl.load(p_q, mask=(rows < GROUP)[:, None], other=0.0)
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

    ring = DecodeRing(k_smem, v_smem, bar_k, bar_v, empty)
    store = DecodeStore(sinks, Out, Lse, Part_o, Part_lse, stride_ob, stride_oh, stride_lb,
                        stride_pb, stride_ph, stride_ps, stride_plb, stride_plh, v_scale)
    # (one call a case: Gluon takes a partition's function only inside the call)
    if FP8:
        gl.warp_specialize([
            (_consume_fp8, (ring, store, work, GluonRule(qk_scale, softcap, window_left, 0),
                            flags)),
            (_produce_items, (kc_desc, vc_desc, poison, k_smem, v_smem, bar_k, bar_v, empty,
                              work, oob_row, flags, PAGE, COPY_ROWS, TILE_COPIES)),
        ], [1], [PRODUCER_REGS])
    else:
        gl.warp_specialize([
            (_consume, (q_smem, ring, store, split, GluonRule(qk_scale, softcap, window_left, 0),
                        flags)),
            (_produce, (kc_desc, vc_desc, poison, k_smem, v_smem, bar_k, bar_v, empty, bt_row,
                        split.seq_len, split.lo, split.t_start, split.t_stop, split.i_kvh * D,
                        oob_row, PAGE, COPY_ROWS, TILE_COPIES, BN, D, STAGES, SKIP, ring_width,
                        RING)),
        ], [1], [PRODUCER_REGS])

    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bar_k.index(i))
        mbarrier.invalidate(bar_v.index(i))
        mbarrier.invalidate(empty.index(i))


# --------------------------------------------------------------------------------------
# Host side.
# --------------------------------------------------------------------------------------

def takes_shape(head_dim, head_dim_v, group, page_size, block_n=HopperDecodeConfig.block_n,
                kv_dtype=None):
    """Whether the path takes these sizes with tiles of ``block_n`` keys (a pure function:
    the plan asks it too); over an fp8 cache (``kv_dtype``) a tile is one or two 64-key
    sub-tiles (:func:`_consume_fp8`)."""
    rows = HopperDecodeConfig.block_h  # every head dim's (over fp8 the group in head blocks)
    if head_dim not in HEAD_DIMS or head_dim_v != head_dim or group > rows or page_size % 16:
        return False
    if kv_dtype in FP8_DTYPES and block_n not in (64, 128):
        return False
    if page_size < block_n:
        return block_n % page_size == 0
    return page_size % block_n == 0


def config_problem(cfg, head_dim, head_dim_v, group, page_size, kv_dtype=None):
    """What is wrong with a HopperDecodeConfig for these sizes (a phrase), or None (a pure
    function: the plan raises its ValueError with it)."""
    if not takes_shape(head_dim, head_dim_v, group, page_size, cfg.block_n, kv_dtype):
        return (f"block_n={cfg.block_n} does not fit pages of {page_size} (one divides the "
                "other) or, over an fp8 cache, is not 64 or 128")
    fp8 = kv_dtype in FP8_DTYPES
    if not isinstance(cfg.items, int) or cfg.items < 1 or (cfg.items > 1 and not fp8):
        return (f"items={cfg.items!r} must be an int >= 1, and 1 over a 16-bit cache "
                "(several work items a program are the fp8 path's)")
    return None


def unsupported(device, dtype, head_dim, head_dim_v, group, page_size, kv_dtype=None):
    """Why a plan cannot take the Hopper path (a sentence), or None when it can; the
    tensors' strides are checked at run time (:func:`descriptors`). ``kv_dtype``: the
    cache's, where it is fp8."""
    problem = device_problem(device, dtype, kv_dtype)
    if problem is not None:
        return problem
    block_n = hopper_decode_config(head_dim, dtype, kv_dtype).block_n
    if not takes_shape(head_dim, head_dim_v, group, page_size, block_n, kv_dtype):
        return (f"it needs D = Dv in {HEAD_DIMS}, at most {HopperDecodeConfig.block_h} query "
                f"heads a KV head and page_size a multiple of 16 that divides or is divided by "
                f"{block_n} (its tile{', over fp8' if kv_dtype in FP8_DTYPES else ''})")
    return None


@functools.lru_cache(maxsize=64)
def shared_layouts(dtype, head_dim, page_size, block_h, block_n, kv_dtype=None):
    """(cache tile layout, query tile layout) of one shape: over an fp8 cache
    (``kv_dtype``) the query tile is fp16."""
    kv_dtype = dtype if kv_dtype is None else kv_dtype
    page_rows = min(page_size, block_n)
    cache = gl.NVMMASharedLayout.get_default_for([page_rows, head_dim], GL_DTYPES[kv_dtype])
    q_dtype = GL_DTYPES[dtype] if kv_dtype == dtype else gl.float16
    return cache, gl.NVMMASharedLayout.get_default_for([block_h, head_dim], q_dtype)


def descriptors(cfg, q, k_cache, v_cache):
    """(k_cache, v_cache, poison or None) descriptors of one launch (K's pads with NaN, or
    over an fp8 cache reads the poison rows: see the module docstring), or a sentence
    saying why the copy engine cannot take the tensors."""
    if q.stride(-1) != 1:
        return "the query's head dim must be contiguous"
    kc, vc, poison = lazy_descriptors(cfg, q, k_cache, v_cache)
    kc, vc = kc.attempt(), vc.attempt()
    if kc is None or vc is None:
        return ("the copy engine cannot take the cache's strides "
                "(rows of heads * dim, 16-byte aligned)")
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
         "stride_ph", "stride_ps", "stride_plb", "stride_plh", "oob_row", "num_items",
         "cached_keys", "ring_width")


@functools.lru_cache(maxsize=64)
def _launcher(spec, dtype):
    cfg = spec.config  # a config.HopperDecodeConfig
    kv_dtype = spec.kv_dtype or dtype
    block_h, head_blocks = spec.head_blocking
    _, q_layout = shared_layouts(dtype, spec.head_dim, spec.page_size, block_h, cfg.block_n,
                                 kv_dtype)
    fixed = dict(
        num_kv_heads=spec.num_kv_heads, num_splits=spec.num_splits, qk_scale=spec.qk_scale,
        softcap=float(spec.softcap), window_left=clamp_extent(spec.window_left or 0),
        D=spec.head_dim, GROUP=spec.group, PAGE=spec.page_size, BM=block_h, BN=cfg.block_n,
        STAGES=cfg.num_stages, Q_LAYOUT=q_layout, USE_WINDOW=spec.window_left is not None,
        HAS_SINKS=spec.has_sinks, USE_SOFTCAP=spec.softcap > 0,
        WRITE_PARTIAL=spec.num_splits > 1, RETURN_LSE=spec.return_lse,
        TIGHT=spec.bounds == "tight", SKIP=spec.bounds == "skip",
        PRODUCER_REGS=cfg.producer_regs, PDL=spec.pdl, HEAD_BLOCKS=head_blocks,
        K_SCALE_STRIDE=spec.scale_strides[0], V_SCALE_STRIDE=spec.scale_strides[1],
        ITEMS=cfg.items, attention_chunk=clamp_extent(spec.attention_chunk or 1),
        USE_CHUNK=spec.attention_chunk is not None, RING=spec.ring)
    return Launch(_hopper_decode_kernel, fixed,
                  {"num_warps": cfg.num_warps, "maxnreg": cfg.maxnreg},
                  _TENSORS, _INTS, (dtype, kv_dtype))


class HopperDecodeLaunch:
    """The Gluon decode kernel's launch for one spec, bound once; a call launches on
    checked arguments (decode.DecodeLaunch's contract): no host sync, no allocation; it
    returns what ``ops._launch.relaunch`` takes, or None. ``parts``: the split scratch
    (splits > 1), merged by the caller; ``descs``: :func:`lazy_descriptors` of this run's
    cache; ``scales``: an fp8 cache's ``(k_scale, v_scale)``."""

    def __init__(self, spec, dtype):
        self.launch = _launcher(spec, dtype)
        self.head_programs = spec.num_kv_heads * spec.head_blocking[1]
        self.num_splits = spec.num_splits
        self.items = spec.config.items
        self.ring = spec.ring

    def __call__(self, batch, q, k_cache, block_table, seq_lens, sinks, out, lse, parts, descs,
                 scales=(None, None)):
        part_o, part_lse, ps = split_scratch(parts, out)
        lse_t = out if lse is None else lse
        qs, os_ = q.stride(), out.stride()
        num_items = batch * self.head_programs
        return self.launch(
            (-(-num_items // self.items), self.num_splits, 1),
            (descs[0], descs[1], descs[2], q, block_table, seq_lens,
             lse_t if sinks is None else sinks, out, lse_t, part_o, part_lse, *scales),
            (qs[0], qs[1], block_table.stride(0), os_[0], os_[1],
             0 if lse is None else lse.stride(0), *ps, k_cache.shape[0] * k_cache.shape[1],
             num_items, table_keys(block_table, k_cache.shape[1], self.ring),
             block_table.shape[1] if self.ring else 1))
