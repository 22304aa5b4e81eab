"""The product the Triton interpreter runs for ``tl.dot``, made exact in its order.

Triton's interpreter (``TRITON_INTERPRET=1``, how the kernels run on a CPU) computes
``tl.dot`` with NumPy's ``matmul``, that is the BLAS's ``sgemm``, whose rounding of an
element depends on where its row sits in the matrix (the kernel's edge rows take other
code than its body): the same query row, one place lower in its block of rows, can come out
one bit apart. On a GPU each element of a tensor-core product is summed in one fixed order
wherever it sits. That difference is what broke ``deterministic=True`` under the
interpreter: a chunk plan moves a request's rows to other places of their blocks, and 6 to
9 of 16 chunk and batch plans changed some bits. The interpreter also reads bf16 operands
as the integers that hold their bits, so its bf16 products were garbage.

:func:`install` replaces the interpreter's product by one that multiplies in float64 (the
product of two values of at most 24 significant bits is exact there) and sums over the
inner dimension in index order, then rounds once to the accumulator's type: every element
gets the same bits wherever its row and column sit, and bf16 and fp8 operands read as the
numbers they hold. It applies to every kernel the interpreter runs in the process, and it is
installed when ``swattn.ops`` is imported under ``TRITON_INTERPRET=1``.
"""

import os

import numpy as np


def _as_float64(handle):
    """The float64 values of an interpreter tensor: bf16 (held as uint16 bit patterns) and
    the 8-bit floats converted as the interpreter converts them, everything else cast."""
    from triton.runtime import interpreter
    import triton.language as tl

    data, dtype = handle.data, handle.dtype.scalar
    if dtype == tl.bfloat16:
        return (data.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if dtype.primitive_bitwidth == 8 and dtype.is_floating():
        data = interpreter._convert_float(data, dtype, tl.float16, None).view(np.float16)
    return data.astype(np.float64)


def _dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    from triton.runtime.interpreter import TensorHandle

    products = _as_float64(a)[..., :, :, None] * _as_float64(b)[..., None, :, :]  # [.., M, K, N]
    total = np.add.reduce(products, axis=-2)  # [.., M, N], summed over K in index order
    return TensorHandle(total.astype(d.data.dtype) + d.data, d.dtype.scalar)


def install():
    """Put :func:`_dot` in the interpreter's builder (once; a no-op off the interpreter)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    from triton.runtime import interpreter

    if interpreter.InterpreterBuilder.create_dot is not _dot:
        interpreter.InterpreterBuilder.create_dot = _dot
