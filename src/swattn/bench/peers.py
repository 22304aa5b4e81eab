"""What every peer adapter shares, extend and decode alike: :class:`Prepared` (a variant
ready to time), :class:`Skip`, loading the peers, the output buffers, the table's
:class:`Variant` and :func:`select`, and the helpers two adapters share (FlexAttention
compiled once, FlashInfer's page lists).

Peers are called as their engines call them (``docs/peers.md``) and loaded from the folder
named by ``--peers`` / ``SWATTN_PEERS`` (default ``.peers/py``), put first on ``sys.path``.
The adapters are in :mod:`.extend_peers` and :mod:`.decode_peers`; swattn's own variants
in :mod:`.extend` and :mod:`.decode`. Layout decisions (what is fair) are in each adapter's
docstring and in the README of the results.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

DEFAULT_PEERS = os.path.join(".peers", "py")


class Skip(Exception):
    """This variant cannot run here; the message says why (it goes into the table)."""


@dataclass
class Prepared:
    """A variant ready to time: ``fn()`` launches it, ``result()`` reads the last output
    as ``[T, Hq, Dv]``, ``poison()`` fills the output with NaN (None where the variant
    allocates its own output). ``applies_sinks=False`` marks a variant that drops the
    case's sinks: it computes a different function and is checked against a sink-less
    reference; ``applies_sparse=False`` likewise one that leaves out a decode case's sparse
    keys (checked against a window-only reference)."""

    fn: Callable[[], object]
    result: Callable[[], torch.Tensor]
    note: str = ""
    applies_sinks: bool = True
    poison: Callable[[], None] | None = None
    keep: list = field(default_factory=list)
    applies_sparse: bool = True
    # Calls whose host time is measured (name -> zero-argument callable), and the tiles
    # the plan's kernel walks (ExtendPlan.tiling) for the tile model's prediction.
    host: dict = field(default_factory=dict)
    tiling: dict | None = None
    # The float64 reference of what the variant computes, where its inputs are not the
    # case's (an fp8 copy of the cache); None: the case's reference.
    reference: Callable[[], torch.Tensor] | None = None
    # Bytes an element of the K/V cache the variant reads (1: an fp8 copy): its GB/s and
    # roofline count those bytes.
    kv_bytes: int = 2
    # The relative error against the reference it is held to (None: CHECK_TOLERANCE), for
    # a variant whose products are coarser by design (fp8 products).
    tolerance: float | None = None
    # What it computes instead of the case's function, where it differs otherwise than by
    # leaving out sinks or sparse keys (SGLang's window from the row index on a tree): its
    # ``reference`` is then that function's, and the report marks it and never calls it
    # the fastest peer.
    computes: str = ""


def fp8_cache(k_cache, v_cache, dtype=torch.float8_e4m3fn, per_head=True, latent=False):
    """An fp8 copy of a paged cache ``[pages, page_size, Hkv, D]`` under one scale a KV head
    (or one for the tensor), calibrated as engines do (the largest finite magnitude maps to
    the format's largest value): ``(k8, v8, k_scale, v_scale)``; NaN rows stay NaN. With
    ``latent`` (the values are the keys' first columns) ``v8`` is ``k8``'s first columns
    and ``v_scale`` is ``k_scale``."""
    from .. import reference
    limit = torch.finfo(dtype).max

    def one(x):
        amax = x.float().nan_to_num(0.0).abs()
        amax = (amax.amax(dim=(0, 1, 3)) if per_head else amax.amax().reshape(1)).clamp_min(1e-6)
        scale = (amax / limit).to(torch.float32)
        return reference.quantize(x, scale, dtype), scale

    k8, k_scale = one(k_cache)
    if latent:
        return k8, k8[..., :v_cache.shape[-1]], k_scale, k_scale
    v8, v_scale = one(v_cache)
    return k8, v8, k_scale, v_scale


def fp8_pool(sparse, k_scale, v_scale, dtype, latent=False):
    """A sparse pool ``(k_pool, v_pool, idx)`` quantized under the cache's scales (from
    :func:`fp8_cache`); with ``latent`` the values are the quantized keys' first columns."""
    from .. import reference
    k_pool, v_pool, idx = sparse
    k8 = reference.quantize(k_pool, k_scale, dtype)
    v8 = k8[..., :v_pool.shape[-1]] if latent else reference.quantize(v_pool, v_scale, dtype)
    return k8, v8, idx


def peers_dir(path=None):
    """The peers folder: ``path``, else ``$SWATTN_PEERS``, else ``.peers/py``."""
    return path or os.environ.get("SWATTN_PEERS") or DEFAULT_PEERS


def use_peers(path=None):
    """Put the peers folder first on ``sys.path``; returns a note for the report."""
    path = os.path.abspath(peers_dir(path))
    if not os.path.isdir(path):
        return f"peers folder {path} not found: SGLang and vLLM rows will be skipped"
    if path in sys.path:
        sys.path.remove(path)
    sys.path.insert(0, path)
    return f"peers loaded from {path}"


def import_peer(module_name):
    """Import one peer module, or raise Skip naming the import error."""
    try:
        return importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure means "skip this peer"
        raise Skip(f"import {module_name} failed: {type(exc).__name__}: {exc}") from None


def need_cuda(inputs):
    if not inputs.q.is_cuda:
        raise Skip("needs a CUDA device")


def empty_out(inputs):
    case = inputs.case
    return torch.empty(inputs.q.shape[0], case.num_q_heads, case.head_dim_v,
                       dtype=inputs.q.dtype, device=inputs.q.device)


def poisoner(out):
    return lambda: out.fill_(float("nan"))


def softmax_scale(case):
    return case.head_dim ** -0.5



# --------------------------------------------------------------------------------------
# Shared by the extend and decode adapters.
# --------------------------------------------------------------------------------------

_FLEX = {}


def causal_mask_mod(offset, window_left, chunk):
    """FlexAttention's ``mask_mod`` of queries at positions ``q_idx + offset`` over keys at
    ``kv_idx``: causal, ``q - k <= window_left`` (None: no window) and under ``chunk`` the
    query's chunk (``k // C == q // C``)."""
    def mask_mod(b, h, q_idx, kv_idx):
        pos = q_idx + offset
        keep = kv_idx <= pos
        if window_left is not None:
            keep = keep & (pos - kv_idx <= window_left)
        if chunk is not None:
            keep = keep & (kv_idx // chunk == pos // chunk)
        return keep
    return mask_mod


def compiled_flex():
    if "fn" not in _FLEX:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        except Exception as exc:  # noqa: BLE001
            raise Skip(f"FlexAttention unavailable: {exc}") from None
        import torch._dynamo
        for name in ("cache_size_limit", "recompile_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 64)
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
        _FLEX["block_mask"] = create_block_mask
    return _FLEX["fn"], _FLEX["block_mask"]


def flashinfer_page_lists(seq_pages, first_pages, end_pages, lengths, page_size):
    """FlashInfer's paged-KV lists, int32 on the host: ``(indptr, indices, last)`` for
    sequence b's pages ``first_pages[b]`` to ``end_pages[b]`` of its block-table row
    ``seq_pages[b]``, ``lengths[b]`` keys long (``last``: the keys in its last page)."""
    seq_pages = seq_pages.cpu()
    indices = torch.cat([seq_pages[b, f:e] for b, (f, e) in enumerate(zip(first_pages, end_pages))])
    indptr = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor([e - f for f, e in zip(first_pages, end_pages)]), 0)
    last = torch.tensor([(n - 1) % page_size + 1 for n in lengths], dtype=torch.int32)
    return indptr, indices.to(torch.int32), last


# --------------------------------------------------------------------------------------
# A row of the table.
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Variant:
    """``key`` selects it on the command line (``--skip``); ``role`` is ``tight``,
    ``control``, ``ours`` or ``peer``."""

    name: str
    key: str
    role: str
    build: Callable



def select(variants, skip=(), known=None):
    """``variants`` minus those whose key is in ``skip``; ValueError on a key that is in
    neither ``variants`` nor ``known``."""
    keys = {v.key for v in variants} | set(known or ())
    unknown = set(skip) - keys
    if unknown:
        raise ValueError(f"unknown variant(s) {sorted(unknown)}; known: {sorted(keys)}")
    return [v for v in variants if v.key not in set(skip)]
