"""Argument checks shared by the launchers: every bad input raises ValueError or
TypeError naming the argument, the expected and the actual value, before any launch."""

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


def check_tensor(name, t, *, dim=None, dtype=None, dtypes=None, device=None, shape=None):
    """Type, rank, dtype, device and shape (None entries match anything) of one tensor."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
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
    check_tensor("q", q, dim=3, dtypes=FLOAT_DTYPES)
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
    max_pages = block_table.shape[1]
    for b, p in enumerate(prefix):
        if -(-p // page_size) > max_pages:
            raise ValueError(f"block_table has {max_pages} pages per sequence, too few for "
                             f"prefix_lens[{b}] = {p} at page_size {page_size}")
    if mask is not None:
        indptr = mask_indptr.tolist()
        for b, (p, e) in enumerate(zip(prefix, extend)):
            if indptr[b + 1] - indptr[b] < e * (p + e) or indptr[b] < 0:
                raise ValueError(f"mask_indptr gives sequence {b} {indptr[b + 1] - indptr[b]} mask "
                                 f"entries, it needs E*(P+E) = {e * (p + e)}")
        if indptr and indptr[-1] > mask.numel():
            raise ValueError(f"mask has {mask.numel()} entries, mask_indptr needs {indptr[-1]}")
