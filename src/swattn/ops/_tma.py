"""Tensors seen as the rows the copy engine (TMA) reads: shared by the Triton kernels'
tensor descriptors and the Gluon paths'."""

import math


def tma_rows(t):
    """``(rows, row_stride)`` of ``t`` (``[..., heads, dim]``, each row's heads side by
    side, the leading dims flattening into rows) seen as rows ``[rows, heads * dim]`` for a
    TMA descriptor; None where the copy engine cannot take it (strides or base not 16-byte
    aligned, heads not side by side, rows past int32)."""
    shape, strides = t.shape, t.stride()
    lead = len(shape) - 2
    if strides[-1] != 1 or (shape[-2] > 1 and strides[-2] != shape[-1]):
        return None
    if any(strides[i] != shape[i + 1] * strides[i + 1] for i in range(lead - 1)):
        return None
    rows, row_stride = math.prod(shape[:lead]), strides[lead - 1]
    if not 0 < rows < 2 ** 31 or (row_stride * t.element_size()) % 16 or t.data_ptr() % 16:
        return None
    return rows, row_stride
