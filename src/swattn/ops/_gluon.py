"""The Gluon layer both Hopper paths (:mod:`.extend_hopper`, :mod:`.decode_hopper`) stand on:
the warpgroup product layouts, warp-uniform scalars, the softmax half of a tile, the
block-table entries of a cache tile and the TMA copies that fill a ring stage from the new
tokens or the paged cache, the host TMA descriptor of a tensor's rows, and over an fp8 cache
the poison rows a page not copied reads and the widening of a stage to fp16."""

import functools
from collections import namedtuple

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .. import window
from ._common import (
    MAX_POSITION,  # noqa: F401  (read through globals() by extend_seq_ok, decode_seq_ok below)
    compile_bound,
    larger_source,
    maximum_source,
    minimum_source,
    new_lengths_source,
    range_bounds_source,
    range_keep_source,
    table_column_source,
    tanh_source,
    visible_source,
)
from ._tma import row_descriptor
from ._validate import FP8_DTYPES


@gluon.constexpr_function
def wgmma_layout(columns, warps=4, bits=16):
    """The registers of a [16 ``warps``, ``columns``] fp32 product (16-row instructions,
    16 rows a warp: one warpgroup's 64 rows, or two warpgroups' 128) of ``bits``-bit
    operands: the scores' (``columns`` = BN) and the output's (D)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1],
                                     instr_shape=[16, columns, 256 // bits])


@gluon.constexpr_function
def operand_layout(parent, bits=16):
    """The registers of a ``bits``-bit A operand of a product whose result is laid out as
    ``parent`` (the query tile for the scores, the weights for P @ V)."""
    return gl.DotOperandLayout(operand_index=0, parent=parent, k_width=32 // bits)


@gluon.jit
def uniform(x):
    """``x`` (an int32 scalar every thread holds the same value of) broadcast from lane 0,
    which tells ptxas it is warp-uniform: the loop bounds and branch conditions derived
    from it then live in uniform registers, and the warpgroup products and copies under
    them need no divergence handling (without it, a value from a load or a reduction is
    per-thread to ptxas, and workload B ran slower:
    benchmarks/results/2026-12-01-h200-hopper-extend/)."""
    return gl.inline_asm_elementwise("shfl.sync.idx.b32 $0, $1, 0, 0x1f, 0xffffffff;", "=r,r",
                                     [x], dtype=gl.int32, is_pure=True, pack=1)


# Written once for both dialects (_common): Gluon's language in the place of Triton's.
_GLUON_NAMES = {**globals(), "tl": gl}
for _name in ("first_key_tile", "full_tiles_start", "full_tiles_end"):
    _GLUON_NAMES[_name] = compile_bound(getattr(window, _name), gluon.jit, _GLUON_NAMES)
tanh = compile_bound(tanh_source, gluon.jit, _GLUON_NAMES)
visible = compile_bound(visible_source, gluon.jit, _GLUON_NAMES)
range_keep = compile_bound(range_keep_source, gluon.jit, _GLUON_NAMES)
range_bounds = compile_bound(range_bounds_source, gluon.jit, _GLUON_NAMES)
for _name in ("extend_seq_ok", "decode_seq_ok"):
    _GLUON_NAMES[_name] = compile_bound(getattr(window, _name), gluon.jit, _GLUON_NAMES)
_GLUON_NAMES["larger"] = compile_bound(larger_source, gluon.jit, _GLUON_NAMES)
new_lengths = compile_bound(new_lengths_source, gluon.jit, _GLUON_NAMES)
_GLUON_NAMES["ring_column"] = compile_bound(window.ring_column, gluon.jit, _GLUON_NAMES)
table_column = compile_bound(table_column_source, gluon.jit, _GLUON_NAMES)
# window.row_key_range for a vector of rows (as _common's): max and min elementwise.
_ROW_NAMES = {**_GLUON_NAMES, "max": compile_bound(maximum_source, gluon.jit, _GLUON_NAMES),
              "min": compile_bound(minimum_source, gluon.jit, _GLUON_NAMES)}
row_key_range = compile_bound(window.row_key_range, gluon.jit, _ROW_NAMES)
decode_seq_ok = _GLUON_NAMES["decode_seq_ok"]


# What a row sees and how its scores are formed (one bundle: a namedtuple compiles to its
# fields); a kernel's constexpr flags bundle names USE_WINDOW, IS_CAUSAL, USE_RIGHT and
# USE_SOFTCAP.
GluonRule = namedtuple("GluonRule", "qk_scale softcap window_left window_right")


@gluon.jit
def weights(s, m_i, l_i, q_pos, k_pos, key_end, rule, flags, MASKED: gl.constexpr,
            ROWS: gl.constexpr = False, P_LOG2: gl.constexpr = 0, keep=None,
            AXIS: gl.constexpr = 1):
    """The softmax half of one tile (_common.scores_log2, extend.visible, the first half
    of _common.softmax_step): (m, l, p, alpha). A fully masked tile leaves m and l
    bit-unchanged and p 0. ``ROWS``: ``rule.qk_scale`` holds a scale a row (the query
    rows' quantization scales joined to it); ``P_LOG2``: the weights (p and l alike) come
    out times 2^P_LOG2, the row max staying the scores'. ``keep``: the mask itself, in the
    place of window.visible's (q_pos and k_pos then unused); ``AXIS``: the keys' axis, the
    last (2: scores batched by warp, as the fp8 decode path's)."""
    qk_scale, softcap = rule.qk_scale, rule.softcap
    # The mask goes on before the scale in both paths, so the multiply and the subtraction
    # of the row max compile to the same arithmetic (contracted or not) with and without it.
    scale = qk_scale
    if flags.USE_SOFTCAP:
        if ROWS:
            s = tanh(s * gl.expand_dims(qk_scale, AXIS))
        else:
            s = tanh(s * qk_scale)
        scale = softcap * 1.4426950408889634
    if MASKED:
        if keep is None:
            keep = visible(q_pos, k_pos, key_end, rule.window_left, rule.window_right,
                           flags.USE_WINDOW, flags.IS_CAUSAL, flags.USE_RIGHT, False)
        s = gl.where(keep, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, AXIS) * scale)
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_safe)
    if ROWS and not flags.USE_SOFTCAP:
        p = gl.exp2(s * gl.expand_dims(scale, AXIS) - gl.expand_dims(m_safe - P_LOG2, AXIS))
    elif P_LOG2 != 0:
        p = gl.exp2(s * scale - gl.expand_dims(m_safe - P_LOG2, AXIS))
    else:
        p = gl.exp2(s * scale - gl.expand_dims(m_safe, AXIS))
    l_i = l_i * alpha + gl.sum(p, AXIS)
    return m_new, l_i, p, alpha


@gluon.jit
def _page_entry(bt_row, start, key_end, lowest, ok, num_pages, K: gl.constexpr,
                PAGE: gl.constexpr, COPY_ROWS: gl.constexpr, TILE_COPIES: gl.constexpr, ring,
                RING: gl.constexpr):
    """Copy ``K`` of a cache tile (:func:`tile_pages`): its block-table entry (-1 where not
    loaded) and whether it is issued."""
    v = (ok & (start + K * COPY_ROWS < key_end) & (start + (K + 1) * COPY_ROWS > lowest)
         & (TILE_COPIES > K))
    page = gl.load(bt_row + table_column((start + K * COPY_ROWS) // PAGE, ring, RING), mask=v,
                   other=-1)
    return page, (page >= 0) & (page < num_pages)


@gluon.jit
def tile_pages(bt_row, start, key_end, lowest, ok, oob_row, PAGE: gl.constexpr,
               COPY_ROWS: gl.constexpr, TILE_COPIES: gl.constexpr, ring=1,
               RING: gl.constexpr = False):
    """The block-table entries of a cache tile's TILE_COPIES copies of COPY_ROWS rows (one
    page, or COPY_ROWS rows of a page larger than the tile; TILE_COPIES at most 8) and which
    copies are issued: those holding a key in [lowest, key_end) whose entry is a page of the
    cache (``[0, oob_row / PAGE)``; a bad entry's copy is left out, so its keys read as the K
    descriptor's NaN padding). ``ok``: the tile is a cache tile that will be loaded. Entries
    past TILE_COPIES are never loaded (their masks fold to false). ``RING``: a ring block
    table of ``ring`` columns (_common.table_column)."""
    gl.static_assert(TILE_COPIES <= 8, "a tile takes at most 8 page copies")
    n = oob_row // PAGE
    p0, g0 = _page_entry(bt_row, start, key_end, lowest, ok, n, 0, PAGE, COPY_ROWS,
                          TILE_COPIES, ring, RING)
    p1, g1 = _page_entry(bt_row, start, key_end, lowest, ok, n, 1, PAGE, COPY_ROWS,
                          TILE_COPIES, ring, RING)
    p2, g2 = _page_entry(bt_row, start, key_end, lowest, ok, n, 2, PAGE, COPY_ROWS,
                          TILE_COPIES, ring, RING)
    p3, g3 = _page_entry(bt_row, start, key_end, lowest, ok, n, 3, PAGE, COPY_ROWS,
                          TILE_COPIES, ring, RING)
    p4, g4 = _page_entry(bt_row, start, key_end, lowest, ok, n, 4, PAGE, COPY_ROWS,
                          TILE_COPIES, ring, RING)
    p5, g5 = _page_entry(bt_row, start, key_end, lowest, ok, n, 5, PAGE, COPY_ROWS,
                          TILE_COPIES, ring, RING)
    p6, g6 = _page_entry(bt_row, start, key_end, lowest, ok, n, 6, PAGE, COPY_ROWS,
                          TILE_COPIES, ring, RING)
    p7, g7 = _page_entry(bt_row, start, key_end, lowest, ok, n, 7, PAGE, COPY_ROWS,
                          TILE_COPIES, ring, RING)
    return (p0, p1, p2, p3, p4, p5, p6, p7), (g0, g1, g2, g3, g4, g5, g6, g7)


@gluon.jit
def issue(new_desc, cache_desc, bar, dest, ok, is_new, start, row0, col, pages, valid, oob_row,
          PAGE: gl.constexpr, COPY_ROWS: gl.constexpr, TILE_COPIES: gl.constexpr,
          BN: gl.constexpr, D: gl.constexpr, poison=None):
    """The copies of one K or V tile into ``dest``, completing on ``bar`` (nothing when
    not ``ok``): BN rows of the new tokens from row ``row0 + start``, or a cache tile's
    page copies (:func:`tile_pages`); a copy not issued for its page reads row
    ``oob_row`` (past the cache's last) instead, which the copy engine fills with zeros
    (or NaN, as the descriptor pads) without touching memory, so every tile completes the
    same bytes. ``poison``: a descriptor of COPY_ROWS rows of NaN read in the place of a
    page not issued (an fp8 cache, whose descriptor cannot pad with NaN)."""
    mbarrier.expect(bar, BN * D * (dest.dtype.primitive_bitwidth // 8), pred=ok)
    if is_new:
        tma.async_copy_global_to_shared(new_desc, [row0 + start, col], bar, dest, pred=ok)
    else:
        for i in gl.static_range(TILE_COPIES):
            if poison is None:
                row = gl.where(valid[i], pages[i] * PAGE + (start + i * COPY_ROWS) % PAGE, oob_row)
                tma.async_copy_global_to_shared(cache_desc, [row, col], bar,
                                                dest.slice(i * COPY_ROWS, COPY_ROWS), pred=ok)
            else:
                row = pages[i] * PAGE + (start + i * COPY_ROWS) % PAGE
                tma.async_copy_global_to_shared(cache_desc, [row, col], bar,
                                                dest.slice(i * COPY_ROWS, COPY_ROWS),
                                                pred=ok & valid[i])
                tma.async_copy_global_to_shared(poison, [0, 0], bar,
                                                dest.slice(i * COPY_ROWS, COPY_ROWS),
                                                pred=ok & (valid[i] == 0))


def descriptor(t, box_rows, layout, padding="zero"):
    """A Gluon TMA descriptor of ``t`` as rows read in boxes of [box_rows, dim] in the
    shared ``layout``, padded with ``padding`` past its rows; None where the copy engine
    cannot take it (:func:`._tma.row_descriptor`)."""
    return row_descriptor(t, box_rows, padding, layout, TensorDescriptor)


def device_problem(device, dtype, kv_dtype):
    """Why a Gluon decode path cannot run for ``device`` and the queries' ``dtype`` over a
    cache of ``kv_dtype`` (None: the queries'), a sentence, or None: sm_90 only, fp16/bf16
    queries over a cache of their dtype or fp8."""
    if device.type != "cuda":
        return "it runs on CUDA devices only (not under the interpreter)"
    if torch.cuda.get_device_capability(device) != (9, 0):
        return "it needs an sm_90 GPU (Hopper)"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"it takes fp16 or bf16, got {dtype}"
    if kv_dtype not in (None, dtype) + FP8_DTYPES:
        return f"it takes a cache of the queries' dtype or fp8, got {kv_dtype}"
    return None


# Gluon's element types of the torch dtypes the Hopper paths take.
GL_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16,
             torch.float8_e4m3fn: gl.float8e4nv, torch.float8_e5m2: gl.float8e5}


@functools.lru_cache(maxsize=16)
def poison_descriptor(device, kv_dtype, rows, head_dim, layout):
    """The descriptor of ``rows`` rows of fp8 NaN (the byte 0x7f in both formats) that an fp8
    cache's K copies read for a page not copied (a copy engine cannot pad fp8 with NaN)."""
    nan = torch.full((rows, 1, head_dim), 0x7F, dtype=torch.uint8, device=device).view(kv_dtype)
    return descriptor(nan, rows, layout)


@gluon.jit
def widen_in_place(stage8, wide, BN: gl.constexpr, D: gl.constexpr, WARPS: gl.constexpr):
    """An fp8 [BN, D] K or V tile in the upper half of a ring stage (``stage8``) widened
    exactly to the fp16 tile the products read, in the stage itself (``wide``, its fp16
    view): the fp8 tile is read whole before any fp16 row is written over it."""
    layout: gl.constexpr = gl.BlockedLayout([1, 16], [32 // (D // 16), D // 16], [WARPS, 1],
                                            [1, 0])
    b = stage8.load(layout)  # [BN, D] fp8
    gl.thread_barrier()
    wide.store(b.to(gl.float16))
