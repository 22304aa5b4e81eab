"""Jit helpers every kernel family shares: the window bounds, the online-softmax step,
soft-capping and the epilogue. Written once; the kernels only compose them."""

import math
import os
import types
from collections import namedtuple

import triton
import triton.language as tl

from .. import window

LOG2E = math.log2(math.e)

# Under the interpreter (Triton 3.6) a float32 -> fp8 conversion does not carry a rounding
# into the exponent (121.8 becomes 64 in e5m2, not 128): there :func:`fp8_cached` rounds on
# the fp8 grid in float32 first, so the conversion only has exact values to take.
FP8_BY_HAND = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")

# The paged cache as the kernels' tile loops take it, one bundle (a namedtuple compiles to
# its fields): K and V (at page, slot, head strides), the block table and its row stride,
# the page size and count, the TMA descriptors of the Hopper paths (None elsewhere), and a
# ring block table's width (its columns; unused for a linear table).
PagedCache = namedtuple("PagedCache", "k v stride_kp stride_ks stride_kh stride_vp stride_vs "
                        "stride_vh block_table stride_bt page_size num_pages desc_k desc_v "
                        "ring")


def compile_bound(fn, jit=triton.jit, namespace=None):
    """``jit`` (triton.jit, or gluon.jit for the Hopper path) of a window.py primitive,
    same source and code, but resolved in ``namespace`` (this module's globals by
    default): the interpreter wants triton.language visible to a jit function, and
    window.py must not import it."""
    clone = types.FunctionType(fn.__code__, globals() if namespace is None else namespace,
                               fn.__name__, fn.__defaults__)
    clone.__doc__ = fn.__doc__
    return jit(clone)


# The bounds of window.py, compiled as they are written there (see its docstring).
first_key_tile = compile_bound(window.first_key_tile)
causal_key_end = compile_bound(window.causal_key_end)
right_key_end = compile_bound(window.right_key_end)
visible_key_end = compile_bound(window.visible_key_end)
full_tiles_start = compile_bound(window.full_tiles_start)
full_tiles_end = compile_bound(window.full_tiles_end)
decode_first_key = compile_bound(window.decode_first_key)
decode_chunk_first_key = compile_bound(window.decode_chunk_first_key)
split_tiles = compile_bound(window.split_tiles)


# The length guard of window.py (extend_seq_ok, mask_ok, decode_seq_ok), compiled as written
# there; its bound is a constexpr to the kernels.
MAX_POSITION = tl.constexpr(window.MAX_POSITION)
extend_seq_ok = compile_bound(window.extend_seq_ok)
mask_ok = compile_bound(window.mask_ok)
decode_seq_ok = compile_bound(window.decode_seq_ok)
ring_column = compile_bound(window.ring_column)
# The second key source's limit and guards (window.second_limit, second_entries_ok, rows_ok).
second_limit = compile_bound(window.second_limit)
segment_tiles = compile_bound(window.segment_tiles)
second_entries_ok = compile_bound(window.second_entries_ok)
rows_ok = compile_bound(window.rows_ok)


def table_column_source(logical_page, ring, RING: tl.constexpr):
    """The block-table column of a logical page: the page itself, or in a ring block table
    (RING) of ``ring`` columns window.ring_column's. Both dialects, as :func:`tanh_source`."""
    if RING:
        logical_page = ring_column(logical_page, ring)
    return logical_page


table_column = compile_bound(table_column_source)


def larger_source(a, b):
    """The combine of a running maximum (associative_scan)."""
    return tl.maximum(a, b)


larger = compile_bound(larger_source)


def new_lengths_source(cu_seqlens, prefix_lens, o_seq, m_seq, num_tokens, prefix_keys):
    """The new tokens of the batch's sequences ``o_seq`` (a vector; lanes where ``m_seq`` is
    false hold 0) as a launch takes them: ``cu_seqlens[b + 1] - cu_seqlens[b]`` for a
    well-formed sequence (window.extend_seq_ok), 0 for any other, which then owns no query
    block, so no program reads a row, a page or a position its lengths would put out of
    bounds. Both dialects, as :func:`tanh_source`."""
    starts = tl.load(cu_seqlens + o_seq, mask=m_seq, other=0)
    ends = tl.load(cu_seqlens + 1 + o_seq, mask=m_seq, other=0)
    prefixes = tl.load(prefix_lens + o_seq, mask=m_seq, other=0)
    earlier = tl.associative_scan(starts, 0, larger)
    ok = extend_seq_ok(starts, ends, earlier, prefixes, num_tokens, prefix_keys)
    return tl.where(ok, ends - starts, 0)


new_lengths = compile_bound(new_lengths_source)


def tanh_source(x):
    """tanh(x) = 1 - 2 / (e^{2x} + 1): exact limits at +-inf, no libdevice needed (the
    interpreter has none). Written once for both dialects: compiled here with
    ``triton.jit`` and in ``_gluon`` with ``gluon.jit`` (``tl`` bound to Gluon's language)."""
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


tanh = compile_bound(tanh_source)


def visible_source(q_pos, k_pos, key_end, window_left, window_right, USE_WINDOW: tl.constexpr,
                   IS_CAUSAL: tl.constexpr, USE_RIGHT: tl.constexpr, ROWS_FROM_0: tl.constexpr):
    """The mask predicate of window.visible on a [BM, BN] tile (``q_pos`` [BM], ``k_pos``
    [BN]), keys at and past ``key_end`` dropped, and with ROWS_FROM_0 rows at negative
    positions too. Written once for both dialects, as :func:`tanh_source`."""
    keep = (k_pos < key_end)[None, :]
    if ROWS_FROM_0:
        keep = keep & (q_pos[:, None] >= 0)
    if USE_WINDOW:
        keep = keep & (k_pos[None, :] >= q_pos[:, None] - window_left)
    if IS_CAUSAL:
        keep = keep & (k_pos[None, :] <= q_pos[:, None])
    elif USE_RIGHT:
        keep = keep & (k_pos[None, :] <= q_pos[:, None] + window_right)
    return keep


visible = compile_bound(visible_source)

# Under key_ranges (extend's stage 1 on a rank's local keys, swattn.parallel) a row sees its
# own keys [lo, hi) ([BM] each): it stands for the rows' positions (namedtuple: its fields).
KeyRange = namedtuple("KeyRange", "lo hi")


def range_keep_source(rng, k_pos, key_end):
    """The mask under key_ranges on a [BM, BN] tile: row ``t`` keeps the keys
    ``[rng.lo[t], rng.hi[t])``, none at or past ``key_end``. Both dialects, as
    :func:`visible_source`."""
    return ((k_pos[None, :] >= rng.lo[:, None]) & (k_pos[None, :] < rng.hi[:, None])
            & (k_pos < key_end)[None, :])


def range_bounds_source(rng, m_rows, range_end, BN: tl.constexpr, TIGHT: tl.constexpr,
                        SKIP: tl.constexpr, NO_FULL: tl.constexpr):
    """``(lo, hi, mid_lo, mid_hi, lowest key)`` of stage 1 under key_ranges, as
    window.range_bounds: ``rng`` the rows' KeyRange, ``m_rows`` the rows that hold a query;
    the tight bounds, skip's (from 0) or none's (the whole range). The lowest key a row
    sees is the masked loads' floor whatever the variant. Both dialects, as
    :func:`visible_source` (the window primitives resolved in each one's namespace)."""
    seen = m_rows & (rng.lo < rng.hi)
    start = tl.min(tl.where(seen, rng.lo, range_end), 0)
    end = tl.minimum(tl.max(tl.where(seen, rng.hi, 0), 0), range_end)
    if TIGHT:
        lo = first_key_tile(start, 0, BN)
        hi = tl.maximum(end, lo)
    elif SKIP:
        lo = 0
        hi = end
    else:
        lo = 0
        hi = range_end
    if NO_FULL:
        mid_lo = hi
        mid_hi = hi
    else:
        mid_lo = tl.minimum(full_tiles_start(tl.max(tl.where(m_rows, rng.lo, 0), 0), 0, lo, BN),
                            hi)
        row_end = tl.minimum(tl.min(tl.where(m_rows, rng.hi, range_end), 0), range_end)
        mid_hi = tl.maximum(tl.minimum(full_tiles_end(row_end, lo, BN), hi), mid_lo)
    return lo, hi, mid_lo, mid_hi, start


range_keep = compile_bound(range_keep_source)
range_bounds = compile_bound(range_bounds_source)


def maximum_source(a, b):
    """``max`` of window.py's bounds compiled for vectors: elementwise."""
    return tl.maximum(a, b)


def minimum_source(a, b):
    """``min`` of window.py's bounds compiled for vectors: elementwise."""
    return tl.minimum(a, b)


# window.row_key_range compiled for a vector of rows: its max and min elementwise.
_ROW_NAMES = {**globals(), "max": compile_bound(maximum_source),
              "min": compile_bound(minimum_source)}
row_key_range = compile_bound(window.row_key_range, namespace=_ROW_NAMES)

# Under given positions (speculative trees), what a block's rows are: their index in the
# loop's coordinates (causality and the custom mask are by index) and their absolute
# position (the window and the chunk are measured between positions).
RowPos = namedtuple("RowPos", "idx pos")


def position_keep_source(q_rows, k_idx, k_pos, key_end, window_left, window_right, chunk,
                         USE_WINDOW: tl.constexpr, USE_CHUNK: tl.constexpr,
                         IS_CAUSAL: tl.constexpr, USE_RIGHT: tl.constexpr):
    """The mask of a [BM, BN] tile under given positions (``q_rows`` a RowPos of [BM],
    ``k_idx``/``k_pos`` [BN] the keys' index and absolute position): keys at and past
    ``key_end`` dropped, rows at negative index too; causality by index, window and chunk
    (window.visible) by position."""
    keep = (k_idx < key_end)[None, :] & (q_rows.idx >= 0)[:, None]
    if IS_CAUSAL:
        keep = keep & (k_idx[None, :] <= q_rows.idx[:, None])
    elif USE_RIGHT:
        keep = keep & (k_pos[None, :] <= q_rows.pos[:, None] + window_right)
    if USE_WINDOW:
        keep = keep & (k_pos[None, :] >= q_rows.pos[:, None] - window_left)
    if USE_CHUNK:
        keep = keep & (k_pos[None, :] // chunk == q_rows.pos[:, None] // chunk)
    return keep


position_keep = compile_bound(position_keep_source)


def launch_extents(num_tokens, block_table, page_size, mask=None, ring=False):
    """``(num_tokens, prefix_keys, mask_entries)``, the extents an extend launch checks its
    lengths against (window.extend_seq_ok, window.mask_ok), from the tensors' shapes: the
    rows of q, the keys a block-table row maps (``page_size`` None: a launch that reads no
    prefix) and the entries of the custom mask."""
    prefix_keys = window.MAX_POSITION if page_size is None else table_keys(block_table,
                                                                            page_size, ring)
    return num_tokens, prefix_keys, 0 if mask is None else mask.shape[0]


def table_keys(block_table, page_size, ring=False):
    """The keys a row of ``block_table`` maps, at most window.MAX_POSITION: no sequence a
    launch attends is longer (window.extend_seq_ok, window.decode_seq_ok). A ring table's
    row maps any position (its columns are reused as the window slides)."""
    if ring:
        return window.MAX_POSITION
    return window.clamp_extent(block_table.shape[1] * page_size)


def kernel_scale(scale, softcap):
    """The ``qk_scale`` a launcher hands the kernels (see :func:`scores_log2`): ``scale /
    softcap`` with a cap, ``scale * log2 e`` without."""
    return scale / softcap if softcap > 0 else scale * LOG2E


# Triton's tl.dot rounds fp32 operands to TF32 (10 mantissa bits) unless told otherwise; an
# fp32 caller asks for fp32. Each product of the Triton kernels branches on its operands'
# dtype at compile time, written out at the product (a helper function, or the product
# taken out of its expression, reorders the 16-bit kernels' code and changes their SASS).
FP32_PRODUCTS = tl.constexpr("ieee")


@triton.jit
def scores_log2(qk, qk_scale, softcap, USE_SOFTCAP: tl.constexpr):
    """``(s, scale)``: the logits in log2 units are ``s * scale``.

    Without a cap ``s`` is the raw product and ``scale = scale * log2 e``, left for
    :func:`softmax_step` to fold into its subtraction (one FMA an element); with one
    ``qk_scale = scale / softcap``, ``s = softcap * log2 e * tanh(qk * scale / softcap)``
    and the scale is 1. Masking ``s`` with -inf masks the logits (the scale is > 0).
    """
    if USE_SOFTCAP:
        return tanh(qk * qk_scale) * (softcap * 1.4426950408889634), 1.0
    else:
        return qk, qk_scale


@triton.jit
def softmax_step(s, scale, v, m_i, l_i, acc):
    """One online-softmax step over a key tile of logits ``s * scale`` (log2 units, ``s``
    -inf where invisible, ``scale`` > 0). The row max is taken on ``s`` and scaled once
    (the same value, rounding being monotonic), and ``s * scale - m`` is one FMA. A tile
    with every logit -inf leaves ``m_i``, ``l_i`` and ``acc`` bit-unchanged (alpha is
    exactly 1, or 0 on a still-empty state, and p is 0), which is what makes the bounds
    variants bit-identical."""
    m_new = tl.maximum(m_i, tl.max(s, 1) * scale)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s * scale - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if v.dtype == tl.float32:  # fp32 products in fp32, not TF32 (see FP32_PRODUCTS)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=FP32_PRODUCTS)
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def finish(acc, m_i, l_i, sink_log2, HAS_SINKS: tl.constexpr):
    """Normalise the state: ``o = acc / (l + e^{sink - m})``; 0 where no key is visible.
    Returns (o, lse) with lse the natural log-sum-exp of the keys alone (no sink), -inf
    where none is visible, NaN in both where a visible key could not be read."""
    m_safe = tl.where(m_i == float("-inf"), 0.0, m_i)
    denom = l_i
    if HAS_SINKS:
        denom = l_i + tl.exp2(sink_log2 - m_safe)
    # l is 0 exactly where no key is visible, >= 1 elsewhere, NaN where a visible key's
    # page was bad (load_keys): the NaN reaches o and lse.
    o = tl.where(l_i[:, None] == 0.0, 0.0, acc / denom[:, None])
    lse = tl.where(l_i == 0.0, float("-inf"), (m_safe + tl.log2(l_i)) * 0.6931471805599453)
    return o, lse


@triton.jit
def load_whole(p, m_cols, EVEN_COLS: tl.constexpr):
    """A [rows, cols] tile whose rows are all in bounds (a mask-free tile, proved whole by
    ``swattn prove``): no row predicate, the column mask only where the head dim needs it."""
    if EVEN_COLS:
        return tl.load(p)
    else:
        return tl.load(p, mask=m_cols[None, :], other=0.0)


@triton.jit
def load_keys(p, m_rows, m_cols, EVEN_COLS: tl.constexpr):
    """A [rows, cols] key tile whose rows outside ``m_rows`` read as NaN (padded columns as
    0): a key whose block-table entry is not a page of the cache is not read, and its
    logit comes out NaN, so the rows that see it come out NaN; every key a row does not see
    has its logit masked to -inf after the product, whatever its row holds."""
    if EVEN_COLS:
        return tl.load(p, mask=m_rows[:, None], other=float("nan"))
    else:
        b_k = tl.load(p, mask=m_rows[:, None] & m_cols[None, :], other=0.0)
        if b_k.dtype.is_fp8():
            # fp16 holds every fp8 value (the interpreter makes no fp8 constant but 0).
            b_k = b_k.to(tl.float16)
        return tl.where(m_rows[:, None], b_k, float("nan"))


@triton.jit
def valid_page(page, num_pages):
    """Whether a block-table entry names a page of the cache: ``0 <= page < num_pages``
    (an entry the kernel did not load reads as -1)."""
    return (page >= 0) & (page < num_pages)


@triton.jit
def load_rows(p, m_rows, m_cols, EVEN_COLS: tl.constexpr):
    """A [rows, cols] tile, rows masked; the column mask only where the head dim is not a
    power of two, so full-width rows keep their 16-byte vector loads."""
    if EVEN_COLS:
        return tl.load(p, mask=m_rows[:, None], other=0.0)
    else:
        return tl.load(p, mask=m_rows[:, None] & m_cols[None, :], other=0.0)


@triton.jit
def _fp8_grid(y, MANT: tl.constexpr, EMIN: tl.constexpr):
    """``y`` (float32, finite, within the format's range) rounded to the nearest value of an
    fp8 format with MANT mantissa bits and smallest normal exponent EMIN, ties to even."""
    a = tl.abs(y)
    step = tl.exp2(tl.maximum(tl.floor(tl.log2(tl.maximum(a, 1e-30))), EMIN) - MANT)
    r = a / step  # exact: step is a power of two
    f = tl.floor(r)
    d = r - f
    up = (d > 0.5) | ((d == 0.5) & ((f - 2.0 * tl.floor(f * 0.5)) != 0.0))
    g = tl.where(up, f + 1.0, f) * step
    return tl.where(y < 0, -g, tl.where(y > 0, g, y))


@triton.jit
def fp8_cached(x, scale, FP8: tl.constexpr):
    """``x`` as an fp8 cache of type FP8 (tl.float8e4nv or tl.float8e5) stores it, in that
    type: ``x / scale`` in float32, saturated to the largest finite value, rounded to the
    nearest fp8 value, ties to even (what ``ops.cache.write_kv`` stores, and what the
    extend kernels take a new key or value as)."""
    if FP8 == tl.float8e4nv:
        y = tl.clamp(x.to(tl.float32) / scale, -448.0, 448.0, propagate_nan=tl.PropagateNan.ALL)
        if FP8_BY_HAND:
            y = _fp8_grid(y, 3, -6)
    else:
        y = tl.clamp(x.to(tl.float32) / scale, -57344.0, 57344.0,
                     propagate_nan=tl.PropagateNan.ALL)
        if FP8_BY_HAND:
            y = _fp8_grid(y, 2, -14)
    return y.to(FP8)
