"""What the drop-ins share: a token pool or a paged cache seen as swattn's block table."""

import torch


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
    """A k/v scale the drop-ins accept before fp8 caches exist: None or 1.0 (a tensor is
    taken as given for a fp16/bf16 cache, as the peers' kernels ignore it there)."""
    if value is None or isinstance(value, torch.Tensor):
        return
    require(float(value) == 1.0, f"{name}={value}: scales apply to fp8 caches, not supported yet")
