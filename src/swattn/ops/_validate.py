"""Argument checks shared by the launchers: every bad input raises ValueError or
TypeError naming the argument, the expected and the actual value, before any launch."""

import os
from dataclasses import dataclass

import torch

from ..window import check_window

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
KEYS = ("all", "prefix", "new")


@dataclass(frozen=True)
class ExtendArgs:
    """Sizes of one extend launch, read off the validated tensors."""

    num_tokens: int
    num_seqs: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    head_dim_v: int
    scale: float

    @property
    def group(self):
        return self.num_q_heads // self.num_kv_heads


def check_tensor(name, t, *, dim=None, dtype=None, dtypes=None, device=None, shape=None,
                 first=False):
    """Type, rank, dtype, device and shape (None entries match anything) of one tensor.
    ``first``: the tensor every other one must share a device with, so its device must be
    one the kernels run on: CUDA, or the CPU under Triton's interpreter."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if first and t.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"{name} is on {t.device}: swattn's kernels take CUDA tensors "
                         "(CPU tensors only under TRITON_INTERPRET=1)")
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
        raise ValueError(f"{name} must be contiguous in its last dimension, got strides {t.stride()}")


def _fmt(shape):
    return "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"


def check_scalars(softcap, scale):
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or softcap < 0:
        raise ValueError(f"softcap must be a float >= 0 (0 = off), got {softcap!r}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float)) or scale <= 0):
        raise ValueError(f"scale must be a float > 0 or None, got {scale!r}")


def check_paged_cache(k_cache, v_cache, block_table, num_kv_heads, head_dim, head_dim_v, q):
    check_tensor("k_cache", k_cache, dim=4, dtype=q.dtype, device=q.device,
                 shape=(None, None, num_kv_heads, head_dim))
    check_tensor("v_cache", v_cache, dim=4, dtype=q.dtype, device=q.device,
                 shape=(k_cache.shape[0], k_cache.shape[1], num_kv_heads, head_dim_v))
    if k_cache.shape[1] < 1:
        raise ValueError(f"k_cache page_size (dim 1) must be >= 1, got {k_cache.shape[1]}")
    check_tensor("block_table", block_table, dim=2, dtype=torch.int32, device=q.device)


def check_sinks(sinks, num_q_heads, q):
    if sinks is not None:
        check_tensor("sinks", sinks, dim=1, dtype=torch.float32, device=q.device, shape=(num_q_heads,))


def check_extend(q, k, v, k_cache, v_cache, block_table, cu_seqlens, prefix_lens, *,
                 window_left, window_right, causal, sinks, softcap, scale, mask, mask_indptr,
                 keys, out):
    check_tensor("q", q, dim=3, dtypes=FLOAT_DTYPES, first=True)
    num_tokens, num_q_heads, head_dim = q.shape
    check_tensor("k", k, dim=3, dtype=q.dtype, device=q.device, shape=(num_tokens, None, head_dim))
    num_kv_heads = k.shape[1]
    check_tensor("v", v, dim=3, dtype=q.dtype, device=q.device, shape=(num_tokens, num_kv_heads, None))
    head_dim_v = v.shape[2]
    if num_kv_heads < 1 or num_q_heads % num_kv_heads:
        raise ValueError(f"q heads ({num_q_heads}) must be a multiple of k/v heads ({num_kv_heads})")
    check_paged_cache(k_cache, v_cache, block_table, num_kv_heads, head_dim, head_dim_v, q)
    num_seqs = block_table.shape[0]
    check_tensor("cu_seqlens", cu_seqlens, dim=1, dtype=torch.int32, device=q.device, shape=(num_seqs + 1,))
    check_tensor("prefix_lens", prefix_lens, dim=1, dtype=torch.int32, device=q.device, shape=(num_seqs,))
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    check_window(window_left, window_right, causal)
    check_sinks(sinks, num_q_heads, q)
    check_scalars(softcap, scale)
    if keys not in KEYS:
        raise ValueError(f"keys must be one of {KEYS}, got {keys!r}")
    if (mask is None) != (mask_indptr is None):
        raise ValueError("mask and mask_indptr must be given together")
    if mask is not None:
        check_tensor("mask", mask, dim=1, dtype=torch.bool, device=q.device)
        check_tensor("mask_indptr", mask_indptr, dim=1, dtypes=(torch.int32, torch.int64),
                     device=q.device, shape=(num_seqs + 1,))
    if out is not None:
        check_tensor("out", out, dim=3, dtype=q.dtype, device=q.device,
                     shape=(num_tokens, num_q_heads, head_dim_v))
    _check_extend_values(cu_seqlens, prefix_lens, block_table, k_cache.shape[1], num_tokens,
                         mask, mask_indptr)
    return ExtendArgs(num_tokens, num_seqs, num_q_heads, num_kv_heads, head_dim, head_dim_v,
                      head_dim ** -0.5 if scale is None else float(scale))


def _check_pages_cover(name, lengths, block_table, page_size):
    """Every sequence's block-table row holds pages enough for its ``lengths`` tokens."""
    max_pages = block_table.shape[1]
    for b, length in enumerate(lengths):
        if -(-length // page_size) > max_pages:
            raise ValueError(f"block_table has {max_pages} pages per sequence, too few for "
                             f"{name}[{b}] = {length} at page_size {page_size}")


def _check_extend_values(cu_seqlens, prefix_lens, block_table, page_size, num_tokens, mask, mask_indptr):
    """The checks that read lengths: one small copy to the host."""
    cu = cu_seqlens.tolist()
    prefix = prefix_lens.tolist()
    if cu and cu[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {cu[0]}")
    if cu and cu[-1] != num_tokens:
        raise ValueError(f"cu_seqlens must end at the number of tokens in q ({num_tokens}), got {cu[-1]}")
    extend = [b - a for a, b in zip(cu, cu[1:])]
    if any(e < 0 for e in extend):
        raise ValueError(f"cu_seqlens must be non-decreasing, got {cu}")
    if any(p < 0 for p in prefix):
        raise ValueError(f"prefix_lens must be >= 0, got {prefix}")
    _check_pages_cover("prefix_lens", prefix, block_table, page_size)
    if mask is not None:
        indptr = mask_indptr.tolist()
        for b, (p, e) in enumerate(zip(prefix, extend)):
            if indptr[b + 1] - indptr[b] < e * (p + e) or indptr[b] < 0:
                raise ValueError(f"mask_indptr gives sequence {b} {indptr[b + 1] - indptr[b]} mask "
                                 f"entries, it needs E*(P+E) = {e * (p + e)}")
        if indptr and indptr[-1] > mask.numel():
            raise ValueError(f"mask has {mask.numel()} entries, mask_indptr needs {indptr[-1]}")


@dataclass(frozen=True)
class DecodeArgs:
    """Sizes of one decode launch, read off the validated tensors."""

    batch: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    head_dim_v: int
    page_size: int
    sparse_keys: int
    scale: float

    @property
    def group(self):
        return self.num_q_heads // self.num_kv_heads


def check_num_splits(num_splits):
    if num_splits is None:
        return
    if isinstance(num_splits, bool) or not isinstance(num_splits, int):
        raise TypeError(f"num_splits must be an int >= 1 or None, got {type(num_splits).__name__}")
    if num_splits < 1:
        raise ValueError(f"num_splits must be an int >= 1 or None, got {num_splits}")


def check_decode(q, k_cache, v_cache, block_table, seq_lens, *, window_left, sinks, softcap,
                 scale, sparse, num_splits, out):
    check_tensor("q", q, dim=3, dtypes=FLOAT_DTYPES, first=True)
    batch, num_q_heads, head_dim = q.shape
    check_tensor("k_cache", k_cache, dim=4, dtype=q.dtype, device=q.device)
    num_kv_heads = k_cache.shape[2]
    check_tensor("v_cache", v_cache, dim=4, dtype=q.dtype, device=q.device)
    if num_kv_heads < 1 or num_q_heads % num_kv_heads:
        raise ValueError(f"q heads ({num_q_heads}) must be a multiple of k/v heads ({num_kv_heads})")
    head_dim_v = v_cache.shape[3]
    check_paged_cache(k_cache, v_cache, block_table, num_kv_heads, head_dim, head_dim_v, q)
    check_tensor("block_table", block_table, shape=(batch, None))
    check_tensor("seq_lens", seq_lens, dim=1, dtype=torch.int32, device=q.device, shape=(batch,))
    check_window(window_left)
    check_sinks(sinks, num_q_heads, q)
    check_scalars(softcap, scale)
    check_num_splits(num_splits)
    sparse_keys = 0
    if sparse is not None:
        sparse_keys = _check_sparse(sparse, batch, num_kv_heads, head_dim, head_dim_v, q)
    if out is not None:
        check_tensor("out", out, dim=3, dtype=q.dtype, device=q.device,
                     shape=(batch, num_q_heads, head_dim_v))
    _check_decode_values(seq_lens, block_table, k_cache.shape[0], k_cache.shape[1], window_left)
    return DecodeArgs(batch, num_q_heads, num_kv_heads, head_dim, head_dim_v, k_cache.shape[1],
                      sparse_keys, head_dim ** -0.5 if scale is None else float(scale))


def _check_sparse(sparse, batch, num_kv_heads, head_dim, head_dim_v, q):
    """``(k_pool [N, Hkv, D], v_pool [N, Hkv, Dv], idx [B, K] int32)``, idx in [-1, N)."""
    if not isinstance(sparse, (tuple, list)) or len(sparse) != 3:
        raise TypeError("sparse must be a tuple (k_pool, v_pool, idx) or None, got "
                        f"{type(sparse).__name__}" + (f" of length {len(sparse)}"
                                                      if isinstance(sparse, (tuple, list)) else ""))
    k_pool, v_pool, idx = sparse
    check_tensor("sparse k_pool", k_pool, dim=3, dtype=q.dtype, device=q.device,
                 shape=(None, num_kv_heads, head_dim))
    check_tensor("sparse v_pool", v_pool, dim=3, dtype=q.dtype, device=q.device,
                 shape=(k_pool.shape[0], num_kv_heads, head_dim_v))
    check_tensor("sparse idx", idx, dim=2, dtype=torch.int32, device=q.device, shape=(batch, None))
    if idx.numel():
        low, high = int(idx.min()), int(idx.max())
        if low < -1 or high >= k_pool.shape[0]:
            raise ValueError(f"sparse idx entries must lie in [-1, {k_pool.shape[0]}) (pool rows, "
                             f"-1 = none), got [{low}, {high}]")
    return idx.shape[1]


def _check_decode_values(seq_lens, block_table, num_pages, page_size, window_left):
    """The checks that read lengths and the block-table entries the kernel will read: one
    small copy to the host."""
    lens = seq_lens.tolist()
    if any(s < 0 for s in lens):
        raise ValueError(f"seq_lens must be >= 0, got {lens}")
    _check_pages_cover("seq_lens", lens, block_table, page_size)
    max_pages = block_table.shape[1]
    if not lens or max_pages == 0:
        return
    # Pages holding a visible key: from the window's first key's page to the last key's.
    lengths = seq_lens.to(torch.int64)[:, None]
    first = (lengths - 1 - window_left).clamp_min(0) if window_left is not None else torch.zeros_like(lengths)
    logical = torch.arange(max_pages, device=block_table.device)[None, :]
    read = (logical >= first // page_size) & (logical * page_size < lengths)
    bad = read & ((block_table < 0) | (block_table >= num_pages))
    if bool(bad.any()):
        b, i = (int(x) for x in bad.nonzero()[0])
        raise ValueError(f"block_table[{b}, {i}] = {int(block_table[b, i])} is read (it holds keys "
                         f"of seq_lens[{b}] = {lens[b]}'s window) but is not a page of k_cache "
                         f"[0, {num_pages})")
