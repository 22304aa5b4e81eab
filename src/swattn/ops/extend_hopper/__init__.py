"""Hopper fast path of the two-stage extend kernel, in Gluon (Triton's lower-level
language): the same stages, bounds and results contract as :mod:`swattn.ops.extend`, for
sm_90.

One program owns a block of 64 new tokens (128 under two warpgroups, a config) under one
query head and walks one list of key tiles: stage 1's (the cached prefix, through the block
table) then stage 2's (the new tokens' own k/v), with the bounds of window.py compiled from
the same source as the Triton kernel's (:mod:`.walk`). Under the tight bounds the scores of
tile j and the P @ V product of tile j - 1 are in flight on the tensor cores together while
the softmax of tile j runs beside them (FlashAttention-3's intra-warpgroup overlap,
:mod:`.attend`); ``bounds="skip"`` and ``"none"`` walk every tile of each stage in the plain
order, with the same operations tile for tile, so the same bits. K/V tiles arrive by TMA
into shared-memory stages on mbarriers; from the paged cache one copy per page (or per
64 rows of a larger page) into row slices of the tile, issued by a producer warp for long
windows and full attention (warp-specialized) or by the warpgroup itself (:mod:`.copies`).
The tiling is config.HopperExtendConfig's.

What no query may see is kept out of the sums: a page copy is issued only for a page
holding a key in ``[lowest visible key, stage end)``; a copy left out reads past the cache's
last row (zeros for V, NaN for K, whose descriptor pads with NaN; those keys are masked),
and a block-table entry outside ``[0, num_pages)`` is not copied, so the rows that need it
come out NaN. The last cache tile's V rows past the prefix end are zeroed before its
product. Under ``key_ranges`` (swattn.parallel) each row sees its own range of cached keys.

An fp8 cache (e4m3fn or e5m2, value / scale) adds converter warps (:mod:`.fp8`) that widen
each cache tile in place to the fp16 tile the warpgroup reads; the new rows come quantized
as fp16 rows (ops.cache.NewRowsLaunch), K's scale joins qk_scale and V's multiplies the
output. Two variants are plan options, each a program of its own (:mod:`.kernel`): the
window's visible prefix widened to fp16 rows before the kernel (config ``prefix_rows``,
ops.cache.PrefixRowsLaunch: every tile then copied as a 16-bit one, no converter), and fp8
products (config ``fp8_products``: the score products read the fp8 K tiles, the query and
the weights quantized to e4m3, P @ V against V tiles the converter transposes). Their
measurements are in benchmarks/README.md and the results folders
``benchmarks/results/2026-12-01-h200-hopper-loop/``,
``benchmarks/results/2026-12-02-h200-fp8-extend-products/``,
``benchmarks/results/2026-12-03-h200-fp8-extend-new-rows/``,
``benchmarks/results/2026-12-03-h200-fp8-extend-prefix-rows/`` and
``benchmarks/results/2026-12-04-h200-fp8-extend-short-windows/``.

Takes fp16/bf16 queries over a cache of their dtype or fp8, D = Dv in (64, 128), page sizes
that are multiples of 16 dividing or divided by the key tile, no custom mask, not
``deterministic``; :func:`unsupported` says why a plan cannot take it. Gluon does not run
under the interpreter: the CPU suite compiles it for sm_90 (tests/test_extend_hopper.py),
the GPU suite runs it.
"""

from .kernel import hopper_extend_kernel
from .launch import (
                     HEAD_DIMS,
                     HopperExtendLaunch,
                     descriptors,
                     lazy_descriptors,
                     takes_shape,
                     unsupported,
)

__all__ = [
                     "HEAD_DIMS",
                     "HopperExtendLaunch",
                     "descriptors",
                     "hopper_extend_kernel",
                     "lazy_descriptors",
                     "takes_shape",
                     "unsupported",
]
