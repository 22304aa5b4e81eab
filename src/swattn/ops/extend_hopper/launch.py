"""The host side: which plans the path takes (:func:`unsupported`, :func:`takes_shape`), the
launch's TMA descriptors (:func:`descriptors`) and the kernel's launch for one ExtendSpec
(:class:`HopperExtendLaunch`)."""

import functools

import torch
from triton.experimental.gluon import language as gl

from ...window import clamp_extent
from .._common import launch_extents
from .._gluon import GL_DTYPES, descriptor, poison_descriptor
from .._launch import Descriptor, Launch
from .._validate import FP8_DTYPES
from ..config import HopperExtendConfig
from .kernel import hopper_extend_kernel

# The head dims the kernel is written for; its tiling is a frozen config of the plan
# (config.HopperExtendConfig).
HEAD_DIMS = (64, 128)


def takes_shape(head_dim, head_dim_v, page_size):
    """Whether the path takes these head dims and this page size (a pure function: the
    plan and the tile model ask it too)."""
    if head_dim not in HEAD_DIMS or head_dim_v != head_dim or page_size % 16:
        return False
    block_n = HopperExtendConfig.block_n  # the key tile of every head dim
    if page_size < block_n:
        return block_n % page_size == 0
    return page_size % block_n == 0


def unsupported(device, dtype, head_dim, head_dim_v, page_size, masked, deterministic,
                kv_dtype=None):
    """Why a plan cannot take the Hopper path (a sentence), or None when it can; the
    tensors' strides are checked at run time (:func:`descriptors`). ``kv_dtype``: the
    cache's, where it is fp8."""
    if device.type != "cuda":
        return "it runs on CUDA devices only (not under the interpreter)"
    if torch.cuda.get_device_capability(device) != (9, 0):
        return "it needs an sm_90 GPU (Hopper)"
    if deterministic:
        return "deterministic=True runs the single-pass kernel"
    if masked:
        return "it takes no custom mask"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"it takes fp16 or bf16, got {dtype}"
    if kv_dtype not in (None, dtype) + FP8_DTYPES:
        return f"it takes a cache of the queries' dtype or fp8, got {kv_dtype}"
    if head_dim not in HEAD_DIMS or head_dim_v != head_dim:
        return f"it needs D = Dv in {HEAD_DIMS}, got {head_dim} and {head_dim_v}"
    if not takes_shape(head_dim, head_dim_v, page_size):
        return (f"it needs page_size a multiple of 16 that divides or is divided by "
                f"{HopperExtendConfig.block_n}, "
                f"got {page_size}")
    return None


@functools.lru_cache(maxsize=64)
def _layout(dtype, rows, head_dim):
    """The shared layout of a [rows, head_dim] tile of ``dtype`` (a torch dtype)."""
    return gl.NVMMASharedLayout.get_default_for([rows, head_dim], GL_DTYPES[dtype])


def descriptors(cfg, q, k, v, k_cache, v_cache, prefix=None):
    """(q, k, v, k_cache, v_cache, poison or None) descriptors of one launch under the
    tiling ``cfg`` (the cache's K pads with NaN, or over an fp8 cache reads the poison
    rows: see swattn.ops.extend_hopper), or a sentence saying why the copy engine cannot take
    them. Over an fp8 cache ``k``/``v`` are the new rows as the cache stores them
    (ops.cache.NewRowsLaunch)."""
    *lazy, poison = lazy_descriptors(cfg, q, k, v, k_cache, v_cache, prefix)
    descs = tuple(d.attempt() for d in lazy)
    if any(d is None for d in descs):
        return "the copy engine cannot take these strides (rows of heads * dim, 16-byte aligned)"
    return (*descs, poison)


def lazy_descriptors(cfg, q, k, v, k_cache, v_cache, prefix=None):
    """:func:`descriptors` made only where a launch needs them (ops._launch.Descriptor):
    a layout whose tensor maps were encoded before costs no descriptor; one the copy
    engine cannot take raises a ValueError at the launch. ``prefix``: with
    ``cfg.prefix_rows`` the (K, V) fp16 rows of the widened prefixes, whose descriptors
    stand in the cache's."""
    bm, bn, d = cfg.block_m, cfg.block_n, q.shape[-1]
    if cfg.prefix_rows:
        rows = (Descriptor(t, descriptor, bn, _layout(t.dtype, bn, d)) for t in (k, v, *prefix))
        return (Descriptor(q, descriptor, bm, _layout(q.dtype, bm, d)), *rows, None)
    rows = min(k_cache.shape[1], bn)
    page = _layout(k_cache.dtype, rows, d)
    new = (Descriptor(q, descriptor, bm, _layout(q.dtype, bm, d)),
           Descriptor(k, descriptor, bn, _layout(k.dtype, bn, d)),
           Descriptor(v, descriptor, bn, _layout(v.dtype, bn, d)))
    if k_cache.dtype in FP8_DTYPES:
        return (*new, Descriptor(k_cache, descriptor, rows, page),
                Descriptor(v_cache, descriptor, rows, page),
                poison_descriptor(k_cache.device, k_cache.dtype, rows, q.shape[-1], page))
    return (*new, Descriptor(k_cache, descriptor, rows, page, "nan"),
            Descriptor(v_cache, descriptor, rows, page), None)


_TENSORS = ("q_desc", "k_desc", "v_desc", "kc_desc", "vc_desc", "poison", "block_table",
            "cu_seqlens", "prefix_lens", "sinks", "Out", "Lse", "k_scale", "v_scale", "key_lo",
            "key_hi")
_INTS = ("stride_bt", "stride_ot", "stride_oh", "stride_lt", "oob_row", "num_tokens",
         "prefix_keys", "ring_width")


@functools.lru_cache(maxsize=64)
def _launcher(spec, dtypes):
    """The kernel's launch for one ExtendSpec (see ops.extend), its config a
    config.HopperExtendConfig."""
    cfg = spec.config
    ws = cfg.warp_specialized(spec.bounds, spec.window_left, spec.kv_dtype in FP8_DTYPES)
    fixed = dict(
        num_seqs=spec.num_seqs, qk_scale=spec.qk_scale, softcap=float(spec.softcap),
        window_left=clamp_extent(spec.window_left or 0),
        window_right=clamp_extent(spec.window_right or 0), D=spec.head_dim, GROUP=spec.group,
        PAGE=spec.page_size, BM=cfg.block_m, BN=cfg.block_n,
        STAGES=cfg.stages, SEQS_POW2=max(1 << max(spec.num_seqs - 1, 0).bit_length(), 2),
        USE_WINDOW=spec.window_left is not None,
        USE_RIGHT=(not spec.causal) and spec.window_right is not None, IS_CAUSAL=spec.causal,
        HAS_SINKS=spec.has_sinks, USE_SOFTCAP=spec.softcap > 0,
        DO_PREFIX=spec.keys in ("all", "prefix"), DO_NEW=spec.keys in ("all", "new"),
        RETURN_LSE=spec.return_lse, TIGHT=spec.bounds == "tight", SKIP=spec.bounds == "skip",
        HEADS_FIRST=cfg.heads_first, Q_REGS=cfg.q_regs, WARP_SPECIALIZED=ws,
        PRODUCER_REGS=cfg.producer_regs,
        K_SCALE_STRIDE=spec.scale_strides[0], V_SCALE_STRIDE=spec.scale_strides[1],
        CONVERT_WARPS=cfg.convert_warps, CONVERT_REGS=cfg.convert_regs,
        FP8_PRODUCTS=cfg.fp8_products, PREFIX_ROWS=cfg.prefix_rows, RANGES=spec.ranges,
        CHUNK=spec.attention_chunk or 0, RING=spec.ring)
    return Launch(hopper_extend_kernel, fixed, cfg.launch_options(ws), _TENSORS, _INTS, dtypes)


class HopperExtendLaunch:
    """The Gluon kernel's launch for one ExtendSpec, bound once; a call launches on
    checked arguments (extend.ExtendLaunch's contract): no host sync, no allocation; it
    returns what ``ops._launch.relaunch`` takes, or None. ``descs``: :func:`lazy_descriptors`
    of this run's tensors; ``scales``: an fp8 cache's ``(k_scale, v_scale)``; ``ranges``:
    key_ranges' ``(key_lo, key_hi)``, or None."""

    def __init__(self, spec, dtypes):
        self.launch = _launcher(spec, dtypes)
        self.num_seqs, self.num_q_heads = spec.num_seqs, spec.num_q_heads
        self.block_m, self.heads_first = spec.config.block_m, spec.config.heads_first
        self.page_size = spec.page_size if spec.keys != "new" else None
        self.ring = spec.ring

    def __call__(self, q, block_table, cu_seqlens, prefix_lens, sinks, out, lse, descs, k_cache,
                 scales=(None, None), ranges=None):
        num_tokens = q.shape[0]
        if num_tokens == 0:
            return None
        blocks = -(-num_tokens // self.block_m) + self.num_seqs
        grid = (self.num_q_heads, blocks, 1) if self.heads_first else (blocks, self.num_q_heads, 1)
        lse_t = out if lse is None else lse
        os_ = out.stride()
        return self.launch(grid, (*descs, block_table, cu_seqlens, prefix_lens,
                           lse_t if sinks is None else sinks, out, lse_t, *scales,
                           *((cu_seqlens, cu_seqlens) if ranges is None else ranges)),
                    (block_table.stride(0), os_[0], os_[1], lse_t.stride(0),
                     k_cache.shape[0] * k_cache.shape[1],
                     *launch_extents(num_tokens, block_table, self.page_size,
                                     ring=self.ring)[:2],
                     block_table.shape[1] if self.ring else 1))
