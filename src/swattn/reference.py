"""The float reference every kernel is checked against: dense masks, float64 by default.

``o_i = sum_j e^{s_ij - m} v_j / (sum_j e^{s_ij - m} [+ e^{sink - m}])`` over the keys ``j``
that query ``i`` sees, with ``s_ij = scale * q_i . k_j`` (soft-capped when ``softcap > 0``).

This module imports only torch. It builds its masks from the convention of docs/api.md
section 2 written out here once more (never from ``swattn.window`` or the kernels), so a
wrong bound in the kernels shows up as a difference instead of being shared:

* a query at absolute position ``p`` sees the key at ``j`` iff ``p - window_left <= j``
  (``window_left`` not None) and ``j <= p`` (causal) or ``j <= p + window_right``
  (not causal, ``window_right`` not None): a causal window keeps ``window_left + 1`` keys;
* a custom mask replaces causality; the window still applies on top of it;
* sinks join the softmax denominator and carry no value; the LSE excludes them;
* a query that sees no key gets output 0 and LSE ``-inf``;
* an fp8 cache (``torch.float8_e4m3fn``/``float8_e5m2``) holds ``value / scale``: a cached
  key is its stored value times ``k_scale`` (one value, or one per KV head), a value times
  ``v_scale``; a new token's key and value are taken as the cache stores them (divided by
  the scale in float32, saturated to the format's largest finite value, rounded to the
  nearest fp8 value, ties to even), so a chunk's result does not depend on whether a key
  came from ``k`` or from the cache.

It reads the paged cache only at positions some query can see: from the lowest
position in any query's window up to the sequence end. Block-table entries below that
(or past the end) and cache rows outside it are never touched, so they may hold -1 or NaN.
"""

from __future__ import annotations

import math

import torch

KEYS = ("all", "prefix", "new")

# Scores held at once per query chunk (elements); keeps long-prefix checks in memory.
_SCORE_BUDGET = 1 << 24


def visible_mask(q_pos, k_pos, window_left, window_right, causal, chunk=None):
    """``visible[i, j] = (k_j >= q_i - window_left) & (k_j <= q_i if causal)
    & (k_j <= q_i + window_right)``, and with ``chunk`` (chunked local attention)
    ``k_j // chunk == q_i // chunk``.

    ``q_pos`` [n] and ``k_pos`` [m] are absolute positions (integer tensors); the result is
    a dense bool [n, m]. ``None`` leaves a side unbounded. ``window_right`` bounds the
    future also when ``causal`` (where, being >= 0, it changes nothing).
    """
    q = q_pos.reshape(-1, 1).to(torch.int64)
    j = k_pos.reshape(1, -1).to(torch.int64)
    visible = torch.ones(q.shape[0], j.shape[1], dtype=torch.bool, device=q_pos.device)
    if chunk is not None:
        visible &= torch.div(j, chunk, rounding_mode="floor") == torch.div(
            q, chunk, rounding_mode="floor")
    if window_left is not None:
        visible &= j >= q - window_left
    if causal:
        visible &= j <= q
    if window_right is not None:
        visible &= j <= q + window_right
    return visible


def gather_keys(k_cache, v_cache, block_table_row, positions):
    """``K[i] = k_cache[block_table_row[p_i // page_size], p_i % page_size]`` (same for V).

    ``positions`` [m] are absolute positions of one sequence. Only the block-table entries
    of those positions' pages are read, and only those cache rows.
    """
    page_size = k_cache.shape[1]
    positions = positions.to(torch.int64)
    pages = block_table_row.to(torch.int64)[positions // page_size]
    # A negative id would wrap around to the last page and be read silently.
    if pages.numel() and int(pages.min()) < 0:
        first = int(positions[pages < 0][0])
        raise ValueError(f"block_table holds a negative page id for visible position {first} "
                         f"(logical page {first // page_size})")
    offsets = positions % page_size
    return k_cache[pages, offsets], v_cache[pages, offsets]


def attend(q, k, v, visible, *, scale, softcap=0.0, sinks=None, dtype=torch.float64):
    """``o = sum_j e^{s_j - m} v_j / (sum_j e^{s_j - m} + e^{sink - m})``,
    ``lse = log sum_j e^{s_j}``.

    Dense attention of queries ``q`` [n, Hq, D] to keys ``k`` [m, Hkv, D] / values ``v``
    [m, Hkv, Dv] where ``visible`` [n, m] (bool) or [n, Hq, m] holds; query head ``h``
    reads kv head ``h // (Hq // Hkv)``. Returns ``(out [n, Hq, Dv], lse [n, Hq])`` in
    ``dtype``. Masked scores never reach the output through arithmetic (``torch.where``
    selects), and keys no query sees are zeroed first, so NaN in them cannot leak.
    """
    n, num_q_heads, _ = q.shape
    m, num_kv_heads, dv = v.shape
    group = num_q_heads // num_kv_heads
    if visible.dim() == 2:
        visible = visible[:, None, :].expand(n, num_q_heads, m)
    seen = visible.any(dim=1).any(dim=0)
    k = torch.where(seen[:, None, None], k.to(dtype), 0.0)
    v = torch.where(seen[:, None, None], v.to(dtype), 0.0)
    q = q.to(dtype).reshape(n, num_kv_heads, group, -1)
    # scores [n, Hkv, G, m] -> [n, Hq, m]
    s = torch.einsum("nhgd,mhd->nhgm", q, k).reshape(n, num_q_heads, m) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    s = torch.where(visible, s, -math.inf)
    lse = torch.logsumexp(s, dim=-1) if m > 0 else torch.full((n, num_q_heads), -math.inf,
                                                              dtype=dtype, device=q.device)
    denominator = lse
    if sinks is not None:
        denominator = torch.logaddexp(lse, sinks.to(dtype).reshape(1, num_q_heads))
    finite = torch.isfinite(denominator)
    safe = torch.where(finite, denominator, 0.0)
    p = torch.where(visible & finite[..., None], torch.exp(s - safe[..., None]), 0.0)
    out = torch.einsum("nhgm,mhe->nhge", p.reshape(n, num_kv_heads, group, m), v)
    return out.reshape(n, num_q_heads, dv), lse


FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def quantize(x, scale, dtype):
    """``x`` as an fp8 cache of ``dtype`` stores it: ``x / scale`` in float32 (``scale``: one
    value, or one per KV head for ``x [..., Hkv, D]``), saturated, rounded to nearest even."""
    limit = torch.finfo(dtype).max
    return (x.to(torch.float32) / _per_head(scale, x)).clamp(-limit, limit).to(dtype)


def dequantize(x, scale):
    """The values an fp8 tensor ``x [..., Hkv, D]`` stands for, in float64: ``x * scale``."""
    return x.to(torch.float64) * _per_head(scale, x).to(torch.float64)


def _per_head(scale, x):
    scale = torch.as_tensor(1.0 if scale is None else scale, dtype=torch.float32,
                            device=x.device).reshape(-1)
    return scale.reshape(-1, 1) if scale.numel() > 1 else scale


def _as_cached(x, cache_dtype, scale):
    """New keys or values as an fp8 cache of ``cache_dtype`` would hand them back (float64),
    else ``x`` itself."""
    if cache_dtype not in FP8:
        return x
    return dequantize(quantize(x, scale, cache_dtype), scale)


def _chunks(count, keys, heads):
    """Query ranges whose scores [rows, heads, keys] fit in the budget."""
    step = max(1, _SCORE_BUDGET // max(1, keys * heads))
    return [(i, min(i + step, count)) for i in range(0, count, step)]


def _finish(result, lse, q_dtype, out, return_lse):
    if out is not None:
        out.copy_(result)
        result = out
    else:
        result = result.to(q_dtype)
    return (result, lse.to(torch.float32)) if return_lse else result


def extend_attention(q, k, v, k_cache, v_cache, block_table, cu_seqlens, prefix_lens, *,
                     window_left=None, window_right=None, causal=True, sinks=None, softcap=0.0,
                     scale=None, mask=None, mask_indptr=None, keys="all", return_lse=False,
                     deterministic=False, k_scale=None, v_scale=None, out=None,
                     attention_chunk=None, positions=None, second=None, dtype=torch.float64):
    """``o_i = sum_j e^{s_ij - m} v_j / (sum_j e^{s_ij - m} + e^{sink - m})`` for every new token.

    Sequence ``b`` has ``P = prefix_lens[b]`` cached tokens (positions ``0..P-1``, position
    ``j`` at ``k_cache[block_table[b, j // page_size], j % page_size]``) and
    ``E = cu_seqlens[b+1] - cu_seqlens[b]`` new tokens at positions ``P..P+E-1`` whose rows
    are ``q/k/v[cu_seqlens[b]:cu_seqlens[b+1]]``. A new token sees the prefix keys and the
    new keys under the window (and causality, or ``mask`` instead of it).

    Args:
        q: [T, Hq, D]; k: [T, Hkv, D]; v: [T, Hkv, Dv] (the new tokens).
        k_cache, v_cache: [num_pages, page_size, Hkv, D | Dv].
        block_table: [B, max_pages] int; cu_seqlens: [B+1] int; prefix_lens: [B] int.
        window_left, window_right, causal: the window (docs/api.md, conventions). With ``mask``,
            causality is replaced and ``window_right`` applies only when ``causal=False``.
        sinks: [Hq] float32 logits in the denominator, or None.
        softcap: ``s = softcap * tanh(s / softcap)`` when > 0. scale: default ``D ** -0.5``.
        mask, mask_indptr: flat bool mask; sequence ``b`` owns ``E * (P + E)`` entries from
            ``mask_indptr[b]``, row-major (new token, key: cached keys by position, then the
            new tokens in their order).
        attention_chunk: chunked local attention: a query at position ``p`` sees the key at
            ``j`` only when ``j // attention_chunk == p // attention_chunk``.
        positions: [T] each new token's absolute position (default ``P + i``): the window
            and the chunk compare positions (a cached key's is its index, a new key's its
            token's), causality compares the order (cached keys, then the new tokens).
        keys: "all", "prefix" (cached keys only) or "new" (new keys only). Sinks, if given,
            join this call's softmax whatever ``keys`` is; partials meant for
            :func:`merge_states` are computed with ``sinks=None``.
        return_lse: also return ``lse`` [T, Hq] float32 (sinks excluded).
        deterministic: accepted and ignored (the reference is one dense pass).
        k_scale, v_scale: an fp8 cache's scales ([] or [1]: per tensor; [Hkv]: per KV head;
            None: 1); new keys and values are taken as the cache stores them.
        out: [T, Hq, Dv] written and returned, else a new tensor of ``q.dtype``.
        second: a second key source (:func:`second_keys`); row ``i`` is new token ``i``.
        dtype: compute precision, float64 (default) or float32.

    Returns:
        ``out`` or ``(out, lse)``; a token that sees no key gets 0 and lse ``-inf``.
    """
    del deterministic
    if keys not in KEYS:
        raise ValueError(f"keys must be one of {KEYS}, got {keys!r}")
    if window_left is not None and window_left < 0:
        raise ValueError(f"window_left must be >= 0 or None, got {window_left}")
    if window_right is not None and window_right < 0:
        raise ValueError(f"window_right must be >= 0 or None, got {window_right}")
    if (mask is None) != (mask_indptr is None):
        raise ValueError("mask and mask_indptr must be given together")
    num_tokens, num_q_heads, head_dim = q.shape
    if num_q_heads % k.shape[1] != 0:
        raise ValueError(f"Hq={num_q_heads} must be a multiple of Hkv={k.shape[1]}")
    scale = head_dim ** -0.5 if scale is None else scale
    right = None if causal else window_right
    device = q.device
    result = torch.zeros(num_tokens, num_q_heads, v.shape[-1], dtype=dtype, device=device)
    lse = torch.full((num_tokens, num_q_heads), -math.inf, dtype=dtype, device=device)
    starts = cu_seqlens.tolist()
    prefixes = prefix_lens.tolist()
    mask_starts = mask_indptr.tolist() if mask is not None else None

    for b, prefix in enumerate(prefixes):
        start, end = starts[b], starts[b + 1]
        new = end - start
        if new <= 0:
            continue
        # Each new token's order (cached keys come first) and its absolute position.
        q_idx = torch.arange(prefix, prefix + new, device=device)
        q_pos = q_idx if positions is None else positions[start:end].to(device, torch.int64)
        # Lowest key position any query of this sequence can see (the lowest query's window
        # and chunk).
        first_q = int(q_pos.min())
        lowest = 0 if window_left is None else max(0, first_q - window_left)
        if attention_chunk is not None:
            lowest = max(lowest, first_q // attention_chunk * attention_chunk)
        key_parts, value_parts, pos_parts, idx_parts = [], [], [], []
        if keys in ("all", "prefix") and lowest < prefix:
            prefix_pos = torch.arange(lowest, prefix, device=device)
            prefix_k, prefix_v = gather_keys(k_cache, v_cache, block_table[b], prefix_pos)
            if k_cache.dtype in FP8:
                prefix_k, prefix_v = dequantize(prefix_k, k_scale), dequantize(prefix_v, v_scale)
            key_parts.append(prefix_k)
            value_parts.append(prefix_v)
            pos_parts.append(prefix_pos)
            idx_parts.append(prefix_pos)
        if keys in ("all", "new"):
            key_parts.append(_as_cached(k[start:end], k_cache.dtype, k_scale))
            value_parts.append(_as_cached(v[start:end], v_cache.dtype, v_scale))
            pos_parts.append(q_pos)
            idx_parts.append(q_idx)
        if not pos_parts:
            continue
        k_pos = torch.cat(pos_parts)
        k_idx = torch.cat(idx_parts)
        seq_k = torch.cat([part.to(dtype) for part in key_parts])
        seq_v = torch.cat([part.to(dtype) for part in value_parts])
        # The window and the chunk between positions; causality, or the mask, by order.
        visible = visible_mask(q_pos, k_pos, window_left, right, False, attention_chunk)
        if mask is None:
            if causal:
                visible &= k_idx[None, :] <= q_idx[:, None]
        else:
            # Row-major [new token, key] bits of this sequence.
            bits = mask[mask_starts[b]: mask_starts[b] + new * (prefix + new)].reshape(
                new, prefix + new)
            visible &= bits.to(device)[:, k_idx]
        if second is not None:
            _second_rows(result, lse, q, start, b, q_pos, seq_k, seq_v, visible, second,
                         v.shape[-1], k_cache.dtype, k_scale, v_scale, scale=scale,
                         softcap=softcap, sinks=sinks, dtype=dtype)
            continue
        for lo, hi in _chunks(new, k_pos.numel(), num_q_heads):
            part_out, part_lse = attend(q[start + lo: start + hi], seq_k, seq_v, visible[lo:hi],
                                        scale=scale, softcap=softcap, sinks=sinks, dtype=dtype)
            result[start + lo: start + hi] = part_out
            lse[start + lo: start + hi] = part_lse
    return _finish(result, lse, q.dtype, out, return_lse)


def _second_rows(result, lse, q, start, seq, q_pos, seq_k, seq_v, visible, second, head_dim_v,
                 cache_dtype, k_scale, v_scale, **options):
    """An extend sequence's rows with a second key source, one at a time (each row its own
    index list and limit): its window's keys ``seq_k``/``seq_v`` where ``visible`` (none when
    ``second.window`` is False), then :func:`second_keys`; into ``result`` and ``lse``."""
    for i in range(len(q_pos)):
        row_k, row_v, row_visible = seq_k, seq_v, visible[i: i + 1]
        if not second.window:
            row_k, row_v, row_visible = seq_k[:0], seq_v[:0], row_visible[:, :0]
        extra_k, extra_v = second_keys(second, seq, start + i, int(q_pos[i]), head_dim_v)
        if cache_dtype in FP8:
            extra_k, extra_v = dequantize(extra_k, k_scale), dequantize(extra_v, v_scale)
        row_k = torch.cat([row_k, extra_k.to(seq_k.dtype)])
        row_v = torch.cat([row_v, extra_v.to(seq_v.dtype)])
        row_visible = torch.cat([row_visible, torch.ones(1, extra_k.shape[0], dtype=torch.bool,
                                                         device=q.device)], 1)
        out, row_lse = attend(q[start + i: start + i + 1], row_k, row_v, row_visible, **options)
        result[start + i] = out[0]
        lse[start + i] = row_lse[0]


def decode_attention(q, k_cache, v_cache, block_table, seq_lens, *, window_left=None, sinks=None,
                     softcap=0.0, scale=None, sparse=None, num_splits=None, return_lse=False,
                     k_scale=None, v_scale=None, out=None, attention_chunk=None, second=None,
                     dtype=torch.float64):
    """``o_b = sum_j e^{s_j - m} v_j / (sum_j e^{s_j - m} + e^{sink - m})`` for one token per
    sequence.

    The query of sequence ``b`` is at position ``S - 1`` (``S = seq_lens[b]``; it is already
    in the cache) and sees the cached keys at ``max(0, S - 1 - window_left) .. S - 1``
    (all ``S`` when ``window_left`` is None): ``window_left + 1`` keys once ``S`` is long
    enough. Nothing below or past that range is read.

    Args:
        q: [B, Hq, D]; k_cache, v_cache: [num_pages, page_size, Hkv, D | Dv].
        block_table: [B, max_pages] int; seq_lens: [B] int.
        window_left, sinks, softcap, scale, attention_chunk: as in :func:`extend_attention`.
        sparse: ``(k_pool [N, Hkv, D], v_pool [N, Hkv, Dv], idx [B, K] int)``: the pool rows
            ``idx[b, i] >= 0`` (-1 = none) join sequence ``b``'s window keys in one softmax;
            a row named twice counts twice. With an fp8 cache the pool is fp8 too, under the
            same scales.
        num_splits: accepted and ignored.
        k_scale, v_scale: as in :func:`extend_attention`.
        second: a second key source (:func:`second_keys`); row ``b`` is sequence ``b``.
        return_lse, out, dtype: as in :func:`extend_attention`.

    Returns:
        ``out`` [B, Hq, Dv] or ``(out, lse [B, Hq] float32)``; no key gives 0 and ``-inf``.
    """
    del num_splits
    if window_left is not None and window_left < 0:
        raise ValueError(f"window_left must be >= 0 or None, got {window_left}")
    batch, num_q_heads, head_dim = q.shape
    if num_q_heads % k_cache.shape[2] != 0:
        raise ValueError(f"Hq={num_q_heads} must be a multiple of Hkv={k_cache.shape[2]}")
    scale = head_dim ** -0.5 if scale is None else scale
    device = q.device
    result = torch.zeros(batch, num_q_heads, v_cache.shape[-1], dtype=dtype, device=device)
    lse = torch.full((batch, num_q_heads), -math.inf, dtype=dtype, device=device)

    for b, seq_len in enumerate(seq_lens.tolist()):
        query_pos = seq_len - 1
        lowest = 0 if window_left is None else max(0, query_pos - window_left)
        if attention_chunk is not None and query_pos >= 0:
            lowest = max(lowest, query_pos // attention_chunk * attention_chunk)
        k_pos = torch.arange(lowest, max(lowest, seq_len), device=device)
        seq_k, seq_v = gather_keys(k_cache, v_cache, block_table[b], k_pos)
        visible = visible_mask(torch.tensor([query_pos], device=device), k_pos, window_left, None,
                               True, attention_chunk)
        if sparse is not None:
            k_pool, v_pool, idx = sparse
            chosen = idx[b][idx[b] >= 0].to(torch.int64)
            seq_k = torch.cat([seq_k, k_pool[chosen]])
            seq_v = torch.cat([seq_v, v_pool[chosen]])
            visible = torch.cat([visible, torch.ones(1, chosen.numel(), dtype=torch.bool,
                                                     device=device)], 1)
        if second is not None:
            if not second.window:
                visible = visible[:, :0]
                seq_k, seq_v = seq_k[:0], seq_v[:0]
            extra_k, extra_v = second_keys(second, b, b, query_pos, v_cache.shape[-1])
            seq_k = torch.cat([seq_k, extra_k])
            seq_v = torch.cat([seq_v, extra_v])
            visible = torch.cat([visible, torch.ones(1, extra_k.shape[0], dtype=torch.bool,
                                                     device=device)], 1)
        if k_cache.dtype in FP8:
            seq_k, seq_v = dequantize(seq_k, k_scale), dequantize(seq_v, v_scale)
        part_out, part_lse = attend(q[b: b + 1], seq_k, seq_v, visible, scale=scale,
                                    softcap=softcap, sinks=sinks, dtype=dtype)
        result[b] = part_out[0]
        lse[b] = part_lse[0]
    return _finish(result, lse, q.dtype, out, return_lse)


def second_keys(second, seq, row, query_pos, head_dim_v):
    """The keys and values [n, Hkv, D | Dv] a row attends in a second key source (any object
    with the fields of ``swattn.SecondKeys``: ``cache``, ``values``, ``block_table``,
    ``entries``, ``rate``, ``indices``, ``window``): entry ``e`` of sequence ``seq`` at
    compression rate ``r`` is closed once ``(e + 1) * r - 1 <= query_pos`` and is held when
    ``e < entries[seq]``; the row's index list (``indices[row]``, -1 = none) picks among
    those, an index at or past them being none, an index below -1 an error. Values are
    ``values``' rows, or the keys' first ``head_dim_v`` columns."""
    held = int(second.entries[seq])
    closed = [e for e in range(held) if (e + 1) * second.rate - 1 <= query_pos]
    if second.indices is not None:
        picks = [int(e) for e in second.indices[row].tolist()]
        if any(e < -1 for e in picks):
            raise ValueError(f"second.indices[{row}] holds an index below -1: {picks}")
        held_closed = set(closed)
        closed = [e for e in picks if e in held_closed]
    device = second.cache.device
    ids = torch.tensor(closed, dtype=torch.int64, device=device)
    values = second.cache[..., :head_dim_v] if second.values is None else second.values
    return gather_keys(second.cache, values, second.block_table[seq], ids)


def merge_states(outs, lses, sinks=None, *, dtype=torch.float64):
    """``lse = log sum_i e^{lse_i}``, ``o = sum_i e^{lse_i} o_i / (sum_i e^{lse_i} [+ e^{sink}])``.

    Combines partial attention states over disjoint key sets (each partial carries no
    sink). ``outs``: list of [N, H, Dv]; ``lses``: list of [N, H] (natural log, float32);
    ``sinks``: [H] or None, applied once here. A part with lse ``-inf`` contributes nothing
    (its output is not read); all parts ``-inf`` give output 0 and lse ``-inf``.

    Returns ``(out, lse)``: ``out`` in ``outs[0].dtype``, ``lse`` float32 without the sink.
    """
    if len(outs) == 0 or len(outs) != len(lses):
        raise ValueError(f"need as many outs as lses (at least one), "
                         f"got {len(outs)} and {len(lses)}")
    part_out = torch.stack([o.to(dtype) for o in outs])
    part_lse = torch.stack([s.to(dtype) for s in lses])
    lse = torch.logsumexp(part_lse, dim=0)
    denominator = lse
    if sinks is not None:
        denominator = torch.logaddexp(lse, sinks.to(dtype).reshape(1, -1))
    safe = torch.where(torch.isfinite(denominator), denominator, 0.0)
    present = torch.isfinite(part_lse) & torch.isfinite(denominator)
    weight = torch.where(present, torch.exp(part_lse - safe), 0.0)
    terms = torch.where(present[..., None], weight[..., None] * part_out, 0.0)
    return terms.sum(dim=0).to(outs[0].dtype), lse.to(torch.float32)
