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

It also patches the language once per launch instead of once per call: the interpreter
re-patches ``triton.language`` (walking every builtin) at each call of a ``@triton.jit``
helper, which took two fifths of a launch's time in our kernels (many small helpers, called
per key tile); within a launch that patch is already in place, so a helper call whose module
sees only the language modules the launch patched skips it. Numbers are unchanged: the
patches are the same objects either way. Within our kernels' launches NumPy's floating-point
warnings are off: the kernels take exp2(-inf) and log2(0) on purpose.
"""

import inspect
import os

import numpy as np


def _as_float64(handle):
    """The float64 values of an interpreter tensor: bf16 (held as uint16 bit patterns) and
    the 8-bit floats converted as the interpreter converts them, everything else cast."""
    import triton.language as tl
    from triton.runtime import interpreter

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


_PATCHED = []  # per running launch: the language modules its patch covers
_LANGS = {}  # a helper's function -> the language modules its globals see


def _langs(fn):
    import triton.language as tl

    got = _LANGS.get(fn)
    if got is None:
        got = _LANGS[fn] = frozenset(id(v) for v in fn.__globals__.values()
                                     if inspect.ismodule(v) and v in (tl, tl.core))
    return got


def _patch_once(interpreter):
    """The interpreter's ``_patch_lang`` wrapped: a launch (GridExecutor) patches, its
    helper calls reuse that patch."""
    patch = interpreter._patch_lang
    run = interpreter.GridExecutor.__call__

    def patch_lang(fn):
        langs = _langs(fn)
        if _PATCHED and langs <= _PATCHED[-1]:
            return interpreter._LangPatchScope()  # in place for this launch
        scope = patch(fn)
        if _PATCHED:
            _PATCHED[-1] = _PATCHED[-1] | langs
        return scope

    def grid_call(self, *args, **kwargs):
        _PATCHED.append(frozenset())
        try:
            if getattr(self.fn, "__module__", "").startswith("swattn."):
                # Our kernels take exp2(-inf) and log2(0) on purpose (masked keys, empty
                # rows); NumPy's warnings about them are not the user's concern.
                with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
                    return run(self, *args, **kwargs)
            return run(self, *args, **kwargs)
        finally:
            _PATCHED.pop()

    patch_lang.swattn = grid_call.swattn = True
    patch_lang.original, grid_call.original = patch, run  # (the tests compare both)
    interpreter._patch_lang = patch_lang
    interpreter.GridExecutor.__call__ = grid_call


def install():
    """Put :func:`_dot` in the interpreter's builder and patch the language once per launch
    (once; a no-op off the interpreter)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    from triton.runtime import interpreter

    if interpreter.InterpreterBuilder.create_dot is not _dot:
        interpreter.InterpreterBuilder.create_dot = _dot
    if not getattr(interpreter._patch_lang, "swattn", False):
        _patch_once(interpreter)
