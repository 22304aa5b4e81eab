"""The one-shot entry points: a plan for the call's tensors, then its run (swattn.plan).

Called eagerly they go straight to the plan (no dispatcher in between: the host time of a
call is the plan's and the launch's); traced by torch.compile they are torch.library
custom ops, opaque to the trace, whose body is the same plan and run. Neither reads the
lengths back to the host: the call waits for nothing and can be captured in a CUDA graph.
"""

import torch

from .ops import cache as _cache
from .ops import merge as _merge
from .ops._validate import FLOAT_DTYPES, check_num_splits, check_scalars, check_sparse, check_tensor
from .plan import run_decode as _run_decode
from .plan import run_extend as _run_extend
from .plan._common import check_new_dtype
from .plan.second import second_keys_plan_for
from .window import check_chunk, check_window


@torch.library.custom_op("swattn::extend_attention", mutates_args=("out", "lse"))
def _extend_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor, block_table: torch.Tensor, cu_seqlens: torch.Tensor,
               prefix_lens: torch.Tensor, sinks: torch.Tensor | None, mask: torch.Tensor | None,
               mask_indptr: torch.Tensor | None, out: torch.Tensor, lse: torch.Tensor | None,
               k_scale: torch.Tensor | None, v_scale: torch.Tensor | None,
               positions: torch.Tensor | None, window_left: int, window_right: int,
               attention_chunk: int, causal: bool, softcap: float, scale: float, keys: str,
               deterministic: bool) -> None:
    # Integers stand for None across the op boundary: -1 = unbounded, scale 0 = default.
    _run_extend(q, k, v, k_cache, v_cache, block_table, cu_seqlens, prefix_lens,
                  positions=positions,
                  attention_chunk=None if attention_chunk < 0 else attention_chunk,
                  k_scale=k_scale, v_scale=v_scale,
                  window_left=None if window_left < 0 else window_left,
                  window_right=None if window_right < 0 else window_right, causal=causal,
                  sinks=sinks, softcap=softcap, scale=None if scale == 0 else scale, mask=mask,
                  mask_indptr=mask_indptr, keys=keys, return_lse=lse is not None,
                  deterministic=deterministic, out=out, lse=lse)


@_extend_op.register_fake
def _(q, k, v, k_cache, v_cache, block_table, cu_seqlens, prefix_lens, sinks, mask, mask_indptr,
      out, lse, k_scale, v_scale, positions, window_left, window_right, attention_chunk, causal,
      softcap, scale, keys, deterministic):
    return None


def extend_attention(q, k, v, k_cache, v_cache, block_table, cu_seqlens, prefix_lens, *,
                     window_left=None, window_right=None, causal=True, sinks=None, softcap=0.0,
                     scale=None, mask=None, mask_indptr=None, attention_chunk=None,
                     positions=None, keys="all", return_lse=False, deterministic=False,
                     k_scale=None, v_scale=None, out=None, second=None):
    """Attention of a chunk of new tokens over their paged, cached prefix and each other.

    ``o_i = sum_j softmax_j(s_ij) v_j`` over the keys ``j`` that query ``i`` sees
    (``p_i - window_left <= j <= p_i`` when causal), ``s_ij = scale * q_i . k_j``, soft-capped
    when ``softcap > 0``, with ``sinks`` joining the denominator.

    Args:
        q: [T, Hq, D] queries of the new tokens of all sequences, packed.
        k, v: [T, Hkv, D], [T, Hkv, Dv] the new tokens' keys and values.
        k_cache, v_cache: [num_pages, page_size, Hkv, D | Dv] the paged cache holding the
            prefixes, of q's dtype or fp8 (``torch.float8_e4m3fn``, ``torch.float8_e5m2``:
            the cache holds value / scale, see ``k_scale``).
        block_table: [B, max_pages] int32, logical page -> physical page; entries of pages
            no query can see are never read (they may be -1); an entry a query must read
            that is not a page of the cache is not read either, and the rows that needed
            it come out NaN.
        cu_seqlens: [B + 1] int32 offsets of each sequence's new tokens in q/k/v.
        prefix_lens: [B] int32 cached tokens before the new ones. Both stay on the device
            and are not read back (no host sync): keep them consistent with q and the
            block table, or make a plan (swattn.plan_extend), which checks them.
        window_left, window_right, causal: the window (swattn.window); None = unbounded.
        sinks: [Hq] float32 sink logits (gpt-oss) or None.
        softcap: Gemma-2 logit cap, 0 = off. scale: default D ** -0.5.
        mask, mask_indptr: custom mask (flat bool, E_b * (P_b + E_b) entries from
            mask_indptr[b], row-major); replaces causality, the window still applies.
        attention_chunk: chunked local attention (Llama 4): a query at position p sees the
            key at j only when ``j // attention_chunk == p // attention_chunk``, on top of
            causality and the window; None = off.
        positions: [T] int32, each new token's absolute position (speculative trees:
            siblings share one); default ``prefix_lens[b] + i``. The window and the chunk
            are measured between positions, for cached and new keys alike; causality among
            the new tokens (or the custom mask) is by their order. Read by the kernels only,
            as the lengths.
        keys: "all", "prefix" or "new" (partial results for context parallelism).
        return_lse: also return lse [T, Hq] float32 (natural log, sinks excluded).
        deterministic: the single-pass kernel: one loop over the prefix and the new keys in
            tiles aligned to absolute positions, fixed configs, no split reductions, so a
            request's outputs are bit-identical whatever else is in the batch and however
            its prefill is chunked (given the cache holds the bits write_kv stored).
        k_scale, v_scale: an fp8 cache's float32 scales, [] or [1] (per tensor) or [Hkv]
            (per KV head, contiguous); None = 1. A cached key is its stored value times
            k_scale (folded into the scores' scale), a value times v_scale (folded into the
            output). The new tokens' k and v are taken as the cache stores them (write_kv's
            rounding), so a chunk's result does not depend on where its keys came from. The
            products run on the stored values converted to fp16 (q too, if bf16; fp32
            queries keep fp32 products); over an fp8 cache the plan's path as over a 16-bit
            one (on sm_90 the Hopper path at its head dims, else the Triton kernels).
        out: [T, Hq, Dv] output buffer.
        second: a :class:`swattn.SecondKeys`: each new token also attends the entries of a
            second paged cache in the same softmax (DeepSeek-V3.2 and V4; the index list a
            row a new token). With it the call takes causal attention at the default
            positions, no custom mask, no ``window_right``, ``keys="all"`` and not
            ``deterministic``.

    Returns:
        out, or (out, lse) with return_lse.

    An engine that runs many layers on one batch plans once (:func:`swattn.plan_extend`)
    and runs the plan per layer; this function is that plan and run for one call.
    """
    if second is not None:
        for name, taken in (("mask", mask is None), ("positions", positions is None),
                            ("window_right", window_right is None), ("causal", causal is True),
                            ("keys", keys == "all"), ("deterministic", deterministic is False)):
            if not taken:
                raise ValueError(f"{name} is not taken with second= (leave it at its default)")
        return _run_second(q, k_cache, v_cache, block_table, second, k=k, v=v,
                           cu_seqlens=cu_seqlens, prefix_lens=prefix_lens,
                           window_left=window_left, attention_chunk=attention_chunk, sinks=sinks,
                           softcap=softcap, scale=scale, return_lse=return_lse,
                           k_scale=k_scale, v_scale=v_scale, out=out)
    if not torch.compiler.is_compiling():
        return _run_extend(q, k, v, k_cache, v_cache, block_table, cu_seqlens, prefix_lens,
                             window_left=window_left, window_right=window_right, causal=causal,
                             sinks=sinks, softcap=softcap, scale=scale, mask=mask,
                             mask_indptr=mask_indptr, attention_chunk=attention_chunk,
                             positions=positions, keys=keys, return_lse=return_lse,
                             deterministic=deterministic, k_scale=k_scale, v_scale=v_scale,
                             out=out)
    # Traced by torch.compile: the custom op, whose arguments cannot carry None for the
    # integers (encoded as -1) and which checks what it can before the trace records it.
    for name, flag in (("causal", causal), ("deterministic", deterministic),
                       ("return_lse", return_lse)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    check_window(window_left, window_right, causal)
    check_chunk(attention_chunk)
    check_scalars(softcap, scale)
    check_tensor("q", q, dim=3, dtypes=FLOAT_DTYPES)
    check_new_dtype(q, k, v)
    check_tensor("v", v, dim=3, dtype=q.dtype, device=q.device)
    if out is None:
        out = torch.empty(*q.shape[:2], v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device) if return_lse else None
    _extend_op(q, k, v, k_cache, v_cache, block_table, cu_seqlens, prefix_lens, sinks, mask,
               mask_indptr, out, lse, k_scale, v_scale, positions,
               -1 if window_left is None else window_left,
               -1 if window_right is None else window_right,
               -1 if attention_chunk is None else attention_chunk, causal, float(softcap),
               0.0 if scale is None else float(scale), keys, deterministic)
    return (out, lse) if return_lse else out


def _run_second(q, k_cache, v_cache, block_table, second, *, k=None, v=None, sinks=None,
                k_scale=None, v_scale=None, out=None, seq_lens=None, cu_seqlens=None,
                prefix_lens=None, **options):
    """A one-shot call with a second key source: its plan (plan.second) and run. Eager
    only: under torch.compile the call is a graph break (the plan's run is not a custom op
    yet)."""
    plan = second_keys_plan_for(q, k_cache, v_cache, block_table, second, seq_lens=seq_lens,
                                cu_seqlens=cu_seqlens, prefix_lens=prefix_lens, **options)
    return plan.run(q, k_cache, v_cache, block_table, second, k=k, v=v, sinks=sinks,
                    k_scale=k_scale, v_scale=v_scale, out=out)


@torch.library.custom_op("swattn::write_kv", mutates_args=("k_cache", "v_cache"))
def _write_kv_op(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor, k_scale: torch.Tensor | None,
                 v_scale: torch.Tensor | None) -> None:
    _cache.write_kv(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)


@_write_kv_op.register_fake
def _(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale):
    return None


def write_kv(k, v, k_cache, v_cache, slot_mapping, *, k_scale=None, v_scale=None):
    """Store the new tokens' keys and values into their pages: ``k_cache[s // P, s % P] = k[t]``
    (and v) for ``s = slot_mapping[t] >= 0``; -1 skips the token, and so does a slot outside
    the cache (never written; the slots are not read back to the host).

    Args:
        k, v: [T, Hkv, D], [T, Hkv, Dv].
        k_cache, v_cache: [num_pages, page_size, Hkv, D | Dv], written in place: of k's dtype
            (a copy, bit for bit) or fp8 (``torch.float8_e4m3fn``/``float8_e5m2``).
        slot_mapping: [T] int64 flat slots ``page * page_size + offset``, or -1.
        k_scale, v_scale: an fp8 cache's float32 scales, [] or [1] or [Hkv]; None = 1. The
            cache stores ``value / scale`` computed in float32, saturated to the format's
            largest finite value (448 for e4m3fn, 57344 for e5m2; NaN stays NaN), rounded
            to the nearest fp8 value, ties to even (``tensor.to(fp8_dtype)``'s rounding;
            ``tensor.to`` does not saturate).
    """
    if torch.compiler.is_compiling():
        _write_kv_op(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    else:
        _cache.write_kv(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)


@torch.library.custom_op("swattn::decode_attention", mutates_args=("out", "lse"))
def _decode_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               block_table: torch.Tensor, seq_lens: torch.Tensor, sinks: torch.Tensor | None,
               k_pool: torch.Tensor | None, v_pool: torch.Tensor | None,
               sparse_idx: torch.Tensor | None, out: torch.Tensor, lse: torch.Tensor | None,
               k_scale: torch.Tensor | None, v_scale: torch.Tensor | None,
               window_left: int, attention_chunk: int, softcap: float, scale: float,
               num_splits: int) -> None:
    # Integers stand for None across the op boundary: -1 = unbounded / library's choice,
    # scale 0 = default; sparse travels as its three tensors (all None = off).
    _run_decode(q, k_cache, v_cache, block_table, seq_lens, k_scale=k_scale, v_scale=v_scale,
                  window_left=None if window_left < 0 else window_left, sinks=sinks,
                  attention_chunk=None if attention_chunk < 0 else attention_chunk,
                  softcap=softcap, scale=None if scale == 0 else scale,
                  sparse=None if sparse_idx is None else (k_pool, v_pool, sparse_idx),
                  num_splits=None if num_splits < 0 else num_splits, return_lse=lse is not None,
                  out=out, lse=lse)


@_decode_op.register_fake
def _(q, k_cache, v_cache, block_table, seq_lens, sinks, k_pool, v_pool, sparse_idx, out, lse,
      k_scale, v_scale, window_left, attention_chunk, softcap, scale, num_splits):
    return None


def decode_attention(q, k_cache, v_cache, block_table, seq_lens, *, window_left=None, sinks=None,
                     softcap=0.0, scale=None, sparse=None, num_splits=None, return_lse=False,
                     k_scale=None, v_scale=None, out=None, attention_chunk=None, second=None):
    """Attention of one new token per sequence over its window of the paged cache.

    ``o_b = sum_j e^{s_j - m} v_j / (sum_j e^{s_j - m} + e^{sink - m})`` over the keys
    ``j`` in ``[S - 1 - window_left, S)`` (``S = seq_lens[b]``, the query at ``S - 1``, already
    in the cache): exactly ``window_left + 1`` keys once ``S`` is long enough, together with
    the sparse keys if any. ``s_j = scale * q . k_j``, soft-capped when ``softcap > 0``.

    Args:
        q: [B, Hq, D] the new token of each sequence.
        k_cache, v_cache: [num_pages, page_size, Hkv, D | Dv] the paged cache, of q's dtype
            or fp8 (``torch.float8_e4m3fn``, ``torch.float8_e5m2``: the cache holds
            value / scale, see ``k_scale``).
        block_table: [B, max_pages] int32, logical page -> physical page; entries of pages
            below the window or past the end are never read (they may be -1); an entry a
            query must read that is not a page of the cache is not read either, and the
            query's output comes out NaN.
        seq_lens: [B] int32 tokens in the cache, the new one included (0: output 0); not
            read back to the host (see extend_attention's cu_seqlens).
        window_left: keys the query sees below itself (swattn.window); None = all.
        attention_chunk: chunked local attention (Llama 4): the query at position p sees
            only the keys of its chunk, ``j // attention_chunk == p // attention_chunk``;
            None = off.
        sinks: [Hq] float32 sink logits (gpt-oss) or None.
        softcap: Gemma-2 logit cap, 0 = off. scale: default D ** -0.5.
        sparse: (k_pool [N, Hkv, D], v_pool [N, Hkv, Dv], idx [B, K] int32): pool rows
            ``idx[b, i] >= 0`` (-1 = none; a row named twice counts twice) join sequence b's
            window keys in one softmax (DeepSeek-style sparse attention plus a window); an
            index outside ``[-1, N)`` is not read, and the output comes out NaN.
        num_splits: split-KV chunks per (sequence, KV head), merged in a second pass;
            None = chosen from the shape and the GPU's SM count.
        return_lse: also return lse [B, Hq] float32 (natural log, sinks excluded).
        k_scale, v_scale: an fp8 cache's float32 scales, [] or [1] (per tensor) or [Hkv]
            (per KV head, contiguous); None = 1. A key is its stored value times k_scale
            (folded into the scores' scale), a value times v_scale (folded into the output);
            the products run on the stored values converted to fp16 (q too, if bf16; fp32
            queries keep fp32 products). The sparse pool shares the cache's dtype and scales.
        out: [B, Hq, Dv] output buffer.
        second: a :class:`swattn.SecondKeys`: the query also attends the entries of a second
            paged cache in the same softmax (DeepSeek-V3.2 and V4: an indexer's top-k, or
            every entry closed at a compression rate); not with ``sparse``.

    Returns:
        out, or (out, lse) with return_lse.

    An engine plans once per batch (:func:`swattn.plan_decode`: checked lengths, and
    ``replan`` for CUDA graphs) and runs the plan per layer; this function is that plan and
    run for one call.
    """
    if second is not None:
        if sparse is not None:
            raise ValueError("sparse and second cannot be given together: put the sparse keys "
                             "in the second source")
        return _run_second(q, k_cache, v_cache, block_table, second, seq_lens=seq_lens,
                           window_left=window_left, attention_chunk=attention_chunk, sinks=sinks,
                           softcap=softcap, scale=scale, num_splits=num_splits,
                           return_lse=return_lse, k_scale=k_scale, v_scale=v_scale, out=out)
    if not torch.compiler.is_compiling():
        return _run_decode(q, k_cache, v_cache, block_table, seq_lens, window_left=window_left,
                           attention_chunk=attention_chunk, sinks=sinks, softcap=softcap,
                           scale=scale, sparse=sparse, num_splits=num_splits,
                           return_lse=return_lse, k_scale=k_scale, v_scale=v_scale, out=out)
    # Traced by torch.compile: the custom op (see extend_attention).
    check_window(window_left)
    check_chunk(attention_chunk)
    check_scalars(softcap, scale)
    check_num_splits(num_splits)
    check_tensor("q", q, dim=3, dtypes=FLOAT_DTYPES)
    check_tensor("v_cache", v_cache, dim=4, dtype=k_cache.dtype, device=q.device)
    check_sparse(sparse)
    k_pool, v_pool, sparse_idx = sparse if sparse is not None else (None, None, None)
    if sparse is not None and sparse_idx is None:
        raise TypeError("sparse idx must be a torch.Tensor, got NoneType")
    if out is None:
        out = torch.empty(*q.shape[:2], v_cache.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device) if return_lse else None
    _decode_op(q, k_cache, v_cache, block_table, seq_lens, sinks, k_pool, v_pool, sparse_idx, out,
               lse, k_scale, v_scale, -1 if window_left is None else window_left,
               -1 if attention_chunk is None else attention_chunk, float(softcap),
               0.0 if scale is None else float(scale), -1 if num_splits is None else num_splits)
    return (out, lse) if return_lse else out


@torch.library.custom_op("swattn::merge_states", mutates_args=("out", "lse"))
def _merge_op(outs: list[torch.Tensor], lses: list[torch.Tensor], sinks: torch.Tensor | None,
              out: torch.Tensor, lse: torch.Tensor) -> None:
    _merge.merge_states(outs, lses, sinks, out=out, lse=lse)


@_merge_op.register_fake
def _(outs, lses, sinks, out, lse):
    return None


def merge_states(outs, lses, sinks=None):
    """Merge partial attention states over disjoint key sets (context-parallel shards,
    split-KV chunks): ``lse = log sum_i e^{lse_i}``,
    ``o = sum_i e^{lse_i} o_i / (sum_i e^{lse_i} + e^{sink})``.

    Args:
        outs: list of [N, H, Dv] partial outputs (one float dtype), carrying no sink.
        lses: list of [N, H] float32 natural-log LSEs; a part with -inf saw no key and
            contributes nothing (its output is not read).
        sinks: [H] float32 sink logits, applied once here, or None.

    Returns:
        (out [N, H, Dv] in the parts' dtype, lse [N, H] float32 without the sink); all
        parts -inf give 0 and -inf.
    """
    if not torch.compiler.is_compiling():
        return _merge.merge_states(outs, lses, sinks)
    _merge.check_merge(outs, lses, sinks, None, None)
    first = outs[0]
    out = torch.empty(first.shape, dtype=first.dtype, device=first.device)
    lse = torch.empty(first.shape[:2], dtype=torch.float32, device=first.device)
    _merge_op(list(outs), list(lses), sinks, out, lse)
    return out, lse
