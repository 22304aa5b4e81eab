"""Argument checks: every bad input raises ValueError or TypeError naming the argument, the
expected and the actual value, before any launch.

Two kinds. The checks of a plan's metadata (lengths, block-table entries) read values on
the host, once, when the plan is made; the checks of a run (:func:`expect`) look only at
what a tensor carries on the host (its type, dtype, device, shape, strides), so a run never
reads device memory and never waits for the GPU."""

import os

import torch

from ..window import (
    MAX_POSITION,
    check_window,  # noqa: F401  (re-exported for the launchers)
)

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Cache dtypes beside the queries': the cache holds value / scale (k_scale, v_scale).
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
KEYS = ("all", "prefix", "new")


def _fmt(shape):
    return "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"


def check_tensor(name, t, *, dim=None, dtype=None, dtypes=None, device=None, shape=None,
                 first=False):
    """Type, rank, dtype, device and shape (None entries match anything) of one tensor.
    ``first``: the tensor every other one must share a device with, so its device must be
    one the kernels run on: CUDA, or the CPU under Triton's interpreter."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if first:
        check_device(name, t.device)
    if dim is not None and t.dim() != dim:
        raise ValueError(f"{name} must have {dim} dimensions, got shape {tuple(t.shape)}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {t.dtype}")
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{name} must be one of {dtypes}, got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} must be on {device} (as q), got {t.device}")
    if shape is not None:
        for i, want in enumerate(shape):
            if want is not None and t.shape[i] != want:
                raise ValueError(f"{name} must have shape {_fmt(shape)}, got {tuple(t.shape)}")
    if t.dim() and t.stride(-1) != 1 and t.shape[-1] > 1:
        raise ValueError(f"{name} must be contiguous in its last dimension, "
                         f"got strides {t.stride()}")


def check_device(name, device):
    """A device the kernels run on: CUDA, or the CPU under Triton's interpreter."""
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"{name} is on {device}: swattn's kernels take CUDA tensors "
                         "(CPU tensors only under TRITON_INTERPRET=1)")


def expect(name, t, dtype, device_index, shape, lead=0):
    """The run-time check of one tensor, host attributes only: a tensor of ``dtype`` on the
    device of index ``device_index`` (-1: the CPU) whose shape from dimension ``lead`` on
    is ``shape`` (a tuple; rank ``lead + len(shape)``), last dimension contiguous."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {t.dtype}")
    got = t.shape
    if len(got) != lead + len(shape) or got[lead:] != shape:
        want = ("*",) * lead + tuple(shape)
        raise ValueError(f"{name} must have shape [{', '.join(map(str, want))}], got {tuple(got)}")
    if t.get_device() != device_index:
        raise ValueError(f"{name} must be on the plan's device, got {t.device}")
    if got and got[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension, "
                         f"got strides {t.stride()}")


def check_sparse(sparse):
    """The option ``sparse``: None or a tuple (or list) ``(k_pool, v_pool, idx)`` (a
    TypeError saying what it got)."""
    if sparse is not None and (not isinstance(sparse, (tuple, list)) or len(sparse) != 3):
        raise TypeError("sparse must be a tuple (k_pool, v_pool, idx) or None, got "
                        f"{type(sparse).__name__}" + (f" of length {len(sparse)}"
                                                      if isinstance(sparse, (tuple, list)) else ""))


def check_scalars(softcap, scale):
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or softcap < 0:
        raise ValueError(f"softcap must be a float >= 0 (0 = off), got {softcap!r}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or scale <= 0):
        raise ValueError(f"scale must be a float > 0 or None, got {scale!r}")


def check_int(name, value, low):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")


def check_num_splits(num_splits):
    if num_splits is None:
        return
    if isinstance(num_splits, bool) or not isinstance(num_splits, int):
        raise TypeError(f"num_splits must be an int >= 1 or None, got {type(num_splits).__name__}")
    if num_splits < 1:
        raise ValueError(f"num_splits must be an int >= 1 or None, got {num_splits}")


def check_sinks(sinks, num_q_heads, q):
    if sinks is not None:
        check_tensor("sinks", sinks, dim=1, dtype=torch.float32, device=q.device,
                     shape=(num_q_heads,))


def host_ints(name, values):
    """``values`` (a list or tuple of ints, or a 1-D integer tensor; one on a GPU is read
    back, which waits for the GPU once) as a list of ints."""
    if isinstance(values, torch.Tensor):
        if values.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(values.shape)}")
        if values.is_floating_point() or values.is_complex() or values.dtype == torch.bool:
            raise TypeError(f"{name} must hold integers, got {values.dtype}")
        return values.tolist()
    if isinstance(values, (list, tuple)):
        for v in values:
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{name} must hold ints, got {type(v).__name__}")
        return list(values)
    raise TypeError(f"{name} must be a list of ints or a 1-D integer tensor, "
                    f"got {type(values).__name__}")


def check_extend_lengths(cu, prefix, mask_indptr=None):
    """Host lists: cu_seqlens from 0, non-decreasing, one longer than prefix_lens >= 0;
    mask_indptr giving each sequence its E * (P + E) entries."""
    if len(cu) != len(prefix) + 1:
        raise ValueError(f"cu_seqlens must have len(prefix_lens) + 1 = {len(prefix) + 1} entries, "
                         f"got {len(cu)}")
    if cu[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {cu[0]}")
    if any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"cu_seqlens must be non-decreasing, got {cu}")
    if any(p < 0 for p in prefix):
        raise ValueError(f"prefix_lens must be >= 0, got {prefix}")
    for b, p in enumerate(prefix):
        if p + cu[b + 1] - cu[b] > MAX_POSITION:
            raise ValueError(f"sequence {b} ends at position {p + cu[b + 1] - cu[b]}: positions "
                             f"stop at {MAX_POSITION} (prefix_lens + new tokens)")
    if mask_indptr is not None:
        if len(mask_indptr) != len(cu):
            raise ValueError(f"mask_indptr must have {len(cu)} entries (as cu_seqlens), got "
                             f"{len(mask_indptr)}")
        for b, p in enumerate(prefix):
            e = cu[b + 1] - cu[b]
            if mask_indptr[b] < 0 or mask_indptr[b + 1] - mask_indptr[b] < e * (p + e):
                raise ValueError(f"mask_indptr gives sequence {b} "
                                 f"{mask_indptr[b + 1] - mask_indptr[b]} mask entries, "
                                 f"it needs E*(P+E) = {e * (p + e)}")


def check_positions(positions, cu):
    """The new tokens' positions (a host list or tensor, one a new token of ``cu``'s
    batch), each in ``[0, MAX_POSITION)``; returned as a list of ints."""
    pos = host_ints("positions", positions)
    if len(pos) != cu[-1]:
        raise ValueError(f"positions must have one entry a new token ({cu[-1]}), got {len(pos)}")
    bad = [p for p in pos if not 0 <= p < MAX_POSITION]
    if bad:
        raise ValueError(f"positions must lie in [0, {MAX_POSITION}), got {bad[0]}")
    return pos


def check_lengths(name, lengths):
    if any(s < 0 for s in lengths):
        raise ValueError(f"{name} must be >= 0, got {lengths}")
    if any(s > MAX_POSITION for s in lengths):
        raise ValueError(f"{name} must be at most {MAX_POSITION} (positions stop there), got "
                         f"{max(lengths)}")


def check_pages_read(block_table, num_pages, reads, ring=False):
    """Every block-table entry a query will read names a page of the cache. ``reads``:
    per sequence b, the logical pages ``[first, end)`` its queries read; ``block_table``
    on the host ([B, max_pages] integers); ``ring``: a ring table (logical page ``i`` at
    column ``i % max_pages``), whose row must hold the pages a step reads at once."""
    if isinstance(block_table, torch.Tensor):
        if block_table.dim() != 2:
            raise ValueError(f"block_table must be 2-D, got shape {tuple(block_table.shape)}")
        table = block_table.to("cpu", torch.int64)
    else:
        table = torch.tensor(block_table, dtype=torch.int64)
    if table.shape[0] < len(reads):
        raise ValueError(f"block_table has {table.shape[0]} rows, "
                         f"the batch has {len(reads)} sequences")
    width = table.shape[1]
    for b, (first, end) in enumerate(reads):
        if ring and end - first > width:
            raise ValueError(f"block_table is a ring of {width} columns; sequence {b} reads "
                             f"{end - first} pages at once")
        if not ring and end > width:
            raise ValueError(f"block_table has {width} pages per sequence; sequence {b} "
                             f"reads logical page {end - 1}")
        columns = [i % width for i in range(first, end)] if ring else list(range(first, end))
        bad = ((table[b, columns] < 0) | (table[b, columns] >= num_pages)).nonzero()
        if len(bad):
            i = columns[int(bad[0])]
            where = f", logical page {first + int(bad[0])} of a ring" if ring else ""
            raise ValueError(f"block_table[{b}, {i}] = {int(table[b, i])} is read (it holds keys "
                             f"a query of sequence {b} sees{where}) but is not a page of the "
                             f"cache [0, {num_pages})")
