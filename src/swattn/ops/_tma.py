"""Tensors seen as the rows the copy engine (TMA) reads, and the host descriptors of those
rows: one builder for the Triton kernels' tensor descriptors and the Gluon paths'."""

from triton.tools.tensor_descriptor import TensorDescriptor


def tma_rows(t):
    """``(rows, row_stride)`` of ``t`` (``[..., heads, dim]``, each row's heads side by
    side, the leading dims flattening into rows) seen as rows ``[rows, heads * dim]`` for a
    TMA descriptor; None where the copy engine cannot take it (strides or base not 16-byte
    aligned, heads not side by side, rows past int32). Straight-line code: it runs on
    every launch."""
    shape, strides = t.shape, t.stride()
    last = len(shape) - 1
    if strides[last] != 1 or (shape[last - 1] > 1 and strides[last - 1] != shape[last]):
        return None
    rows = 1
    for i in range(last - 1):
        if i and strides[i - 1] != shape[i] * strides[i]:
            return None
        rows *= shape[i]
    row_stride = strides[last - 2]
    if not 0 < rows < 2 ** 31 or (row_stride * t.element_size()) % 16 or t.data_ptr() % 16:
        return None
    return rows, row_stride


def row_descriptor(t, box_rows, padding="zero", layout=None, cls=TensorDescriptor):
    """A host TMA descriptor of ``t`` as rows (:func:`tma_rows`) read in boxes of
    ``[box_rows, dim]``, padded with ``padding`` past its rows; None where the copy engine
    cannot take it. ``cls``: Triton's descriptor class, or Gluon's (which takes the shared
    ``layout`` of the box). Built field by field: :func:`tma_rows` has checked what the
    class's own checks would (they cost more than the launch)."""
    view = tma_rows(t)
    if view is None:
        return None
    rows, row_stride = view
    desc = cls.__new__(cls)
    desc.base, desc.shape, desc.strides = t, [rows, t.shape[-2] * t.shape[-1]], [row_stride, 1]
    desc.block_shape, desc.padding = [box_rows, t.shape[-1]], padding
    if layout is not None:
        desc.layout = layout
    return desc
