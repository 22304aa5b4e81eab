"""What the drop-ins share: a token pool or a paged cache seen as swattn's block table."""

import torch

from ..ops._validate import FP8_DTYPES


def table_from_indices(kv_indptr, kv_indices, width=None):
    """The block table ``[B, width]`` (int32, -1 past each row's length) of ragged token
    lists: row b holds ``kv_indices[kv_indptr[b]:kv_indptr[b + 1]]``. ``width`` defaults to
    the longest list, read back from the device (one sync)."""
    lens = kv_indptr[1:] - kv_indptr[:-1]
    if width is None:
        width = int(lens.max()) if lens.numel() else 0
    width = max(width, 1)
    cols = torch.arange(width, device=kv_indptr.device)
    index = kv_indptr[:-1, None].to(torch.int64) + cols[None]
    valid = cols[None] < lens[:, None]
    if kv_indices.numel() == 0:
        return torch.full(index.shape, -1, dtype=torch.int32, device=kv_indptr.device), lens
    values = kv_indices[index.clamp(max=kv_indices.numel() - 1)].to(torch.int32)
    return torch.where(valid, values, torch.full_like(values, -1)), lens


def token_rows(cu_seqlens, num_tokens):
    """Per packed token: its sequence and its index within that sequence's new tokens (on
    the device; tokens past ``cu_seqlens[-1]`` count as the last sequence's)."""
    t = torch.arange(num_tokens, device=cu_seqlens.device)
    seq = torch.searchsorted(cu_seqlens[1:].to(torch.int64), t, right=True)
    seq = seq.clamp(max=cu_seqlens.shape[0] - 2)
    return seq, t - cu_seqlens[:-1].to(torch.int64)[seq]


def require(condition, message):
    if not condition:
        raise NotImplementedError(message)


def unit_scale(name, value):
    """A k/v scale over a fp16/bf16 cache: None or 1.0 (a tensor is taken as given, as the
    peers' kernels ignore it there)."""
    if value is None or isinstance(value, torch.Tensor):
        return
    require(float(value) == 1.0, f"{name}={value}: scales apply to fp8 caches")


def cache_scale(name, value, cache):
    """A drop-in's k/v scale as swattn takes it: over an fp8 cache (``value / scale`` stored)
    a float32 tensor of the one value on the cache's device (None: 1), over a fp16/bf16 cache
    None (:func:`unit_scale`)."""
    if cache.dtype not in FP8_DTYPES:
        unit_scale(name, value)
        return None
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        require(value.numel() == 1, f"{name} of {value.numel()} values (one for the cache)")
        return value.reshape(()).to(device=cache.device, dtype=torch.float32)
    return torch.full((), float(value), dtype=torch.float32, device=cache.device)
