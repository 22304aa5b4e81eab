"""DeepSeek-V4's and V3.2's attention layers as an engine holds their tensors, on
:class:`swattn.SecondKeys`.

SGLang's Triton backend has no V4 or V3.2 path to take the signature of (its V4 backend calls
FlashMLA, or a Triton decode over FlashMLA's fp8 page layout), so these functions take the
tensors an engine keeps and call :func:`swattn.decode_attention` /
:func:`swattn.extend_attention` once. ``docs/deepseek.md`` gives the contract.

DeepSeek-V4 (:func:`v4_decode`, :func:`v4_extend`): MQA, head dim 512, K = V. Every layer
attends a sliding window of its own cache (``swa_cache`` through ``swa_table``; window 128,
``window_left=127``) with sinks; a ``"csa"`` layer also the indexer's ``topk_indices`` among
the entries of its compressed cache (rate 4), an ``"hca"`` layer every entry its position
has closed (rate 128), a ``"sliding"`` layer nothing more. Compressed entry ``e`` stands for
tokens ``[e * rate, (e + 1) * rate)`` and is visible from position ``(e + 1) * rate - 1`` on.

DeepSeek-V3.2 (:func:`dsa_decode`, :func:`dsa_extend`): DSA, the indexer's top-k tokens of
the latent cache (576 key columns, the values its first 512), no window.

An fp8 cache of either has one ``k_scale`` (a value, or one a KV head) shared by the sliding
and the compressed cache, and by keys and values (they are one tensor).
"""

from __future__ import annotations

import swattn

RATES = {"csa": 4, "hca": 128}
LAYER_KINDS = ("csa", "hca", "sliding")


def v4_source(layer_kind, compressed_cache, compressed_table, compressed_counts, topk_indices,
               rate):
    """The second key source of a V4 layer, or None for a sliding layer; ValueError naming
    what the kind needs and was not given (or was given and does not take)."""
    if layer_kind not in LAYER_KINDS:
        raise ValueError(f"layer_kind must be one of {LAYER_KINDS}, got {layer_kind!r}")
    given = [x is not None for x in (compressed_cache, compressed_table, compressed_counts)]
    if layer_kind == "sliding":
        if any(given) or topk_indices is not None:
            raise ValueError("a sliding layer takes no compressed cache and no topk_indices")
        return None
    if not all(given):
        raise ValueError(f"a {layer_kind} layer needs compressed_cache, compressed_table and "
                         "compressed_counts")
    if (layer_kind == "csa") != (topk_indices is not None):
        raise ValueError("topk_indices: a csa layer needs the indexer's picks, an hca layer "
                         f"takes none (layer_kind={layer_kind!r})")
    return swattn.SecondKeys(compressed_cache, compressed_table, compressed_counts,
                             rate=RATES[layer_kind] if rate is None else rate,
                             indices=topk_indices)


def v4_decode(q, swa_cache, swa_table, seq_lens, compressed_cache=None, compressed_table=None,
              compressed_counts=None, *, layer_kind="csa", topk_indices=None, window_left=127,
              sinks=None, rate=None, k_scale=None, scale=None, return_lse=False, out=None):
    """One V4 decode step of one layer: ``o = softmax([q K_window^T, q K_entries^T, sink])
    [K_window; K_entries]`` (K = V), one softmax over the window and the compressed entries.

    Args:
        q: [B, Hq, 512] the new tokens' queries (bf16 or fp16), one a sequence.
        swa_cache: [pages, page_size, 1, 512] the sliding cache (keys, also the values);
            bf16, or fp8 with ``k_scale``. Only the window's pages are read.
        swa_table: [B, max_pages] int32, each sequence's pages of ``swa_cache`` (-1 where
            freed: below the window).
        seq_lens: [B] int32, tokens per sequence, the new one included (at ``S - 1``).
        compressed_cache: [pages, page_size, 1, 512] the layer's compressed entries (csa,
            hca), the sliding cache's dtype; its page size is its own.
        compressed_table: [B, max_pages] int32, entry ``e`` of sequence b at slot ``e %
            page_size`` of page ``compressed_table[b, e // page_size]``.
        compressed_counts: [B] int32, the entries each sequence's compressed cache holds.
        layer_kind: ``"csa"``, ``"hca"`` or ``"sliding"``.
        topk_indices: [B, K] int32 (csa only), the indexer's entries, -1 = none; an entry
            the position has not closed is no key.
        window_left: the sliding window less one (V4: 127).
        sinks: [Hq] float32 learned sink logits, or None.
        rate: the compression rate (default 4 for csa, 128 for hca).
        k_scale: an fp8 cache's float32 scale(s), shared by both caches and by K and V.
        scale, return_lse, out: as :func:`swattn.decode_attention`'s.
    """
    second = v4_source(layer_kind, compressed_cache, compressed_table, compressed_counts,
                        topk_indices, rate)
    return swattn.decode_attention(q, swa_cache, swa_cache, swa_table, seq_lens,
                                   window_left=window_left, sinks=sinks, scale=scale,
                                   second=second, k_scale=k_scale, v_scale=k_scale,
                                   return_lse=return_lse, out=out)


def v4_extend(q, k, swa_cache, swa_table, cu_seqlens, prefix_lens, compressed_cache=None,
              compressed_table=None, compressed_counts=None, *, layer_kind="csa",
              topk_indices=None, window_left=127, sinks=None, rate=None, k_scale=None,
              scale=None, return_lse=False, out=None):
    """A V4 prefill chunk of one layer: each new token over its window (the cached prefix
    and the chunk's keys before it) and its compressed entries, one softmax with the sinks.

    Args:
        q: [T, Hq, 512] the chunk's queries, packed by ``cu_seqlens``.
        k: [T, 1, 512] the chunk's keys (also its values), as the sliding cache will store
            them (over an fp8 cache they are rounded as stored).
        swa_cache, swa_table: the sliding cache and its pages holding the prefix (the
            chunk's keys come from ``k``).
        cu_seqlens: [B + 1] int32 offsets of each sequence's new tokens in ``q``/``k``.
        prefix_lens: [B] int32 tokens cached before the chunk (the chunk's first position).
        compressed_cache, compressed_table, compressed_counts: as :func:`v4_decode`'s; the
            counts may include entries the chunk closed (each row sees only those its
            position has closed).
        topk_indices: [T, K] int32 (csa only), each new token's picks.
        layer_kind, window_left, sinks, rate, k_scale, scale, return_lse, out: as
            :func:`v4_decode`'s.
    """
    second = v4_source(layer_kind, compressed_cache, compressed_table, compressed_counts,
                        topk_indices, rate)
    return swattn.extend_attention(q, k, k, swa_cache, swa_cache, swa_table, cu_seqlens,
                                   prefix_lens, window_left=window_left, sinks=sinks,
                                   scale=scale, second=second, k_scale=k_scale,
                                   v_scale=k_scale, return_lse=return_lse, out=out)


def dsa_source(kv_cache, block_table, tokens, topk_indices):
    return swattn.SecondKeys(kv_cache, block_table, tokens, rate=1, indices=topk_indices,
                             window=False)


def dsa_decode(q, kv_cache, block_table, seq_lens, topk_indices, *, head_dim_v=512, sinks=None,
               k_scale=None, scale=None, return_lse=False, out=None):
    """One V3.2 decode step of one layer: each new token over the indexer's top-k tokens of
    its latent cache, nothing else (no window).

    Args:
        q: [B, Hq, D] queries in the latent space (D = 576: 512 latent + 64 rope columns).
        kv_cache: [pages, page_size, 1, D] the latent cache; the values are each token's
            first ``head_dim_v`` columns. bf16, or fp8 with ``k_scale``.
        block_table: [B, max_pages] int32, each sequence's pages.
        seq_lens: [B] int32, tokens cached, the new one included (the tokens its top-k may
            name: at most its position).
        topk_indices: [B, K] int32 token positions the indexer picked, -1 = none.
        head_dim_v: the values' width (V3.2: 512).
        sinks, k_scale, scale, return_lse, out: as :func:`v4_decode`'s.
    """
    second = dsa_source(kv_cache, block_table, seq_lens, topk_indices)
    return swattn.decode_attention(q, kv_cache, kv_cache[..., :head_dim_v], block_table,
                                   seq_lens, sinks=sinks, scale=scale, second=second,
                                   k_scale=k_scale, v_scale=k_scale, return_lse=return_lse,
                                   out=out)


def dsa_extend(q, k, kv_cache, block_table, cu_seqlens, prefix_lens, topk_indices, *,
               head_dim_v=512, sinks=None, k_scale=None, scale=None, return_lse=False,
               out=None):
    """A V3.2 prefill chunk of one layer: each new token over its top-k tokens of the latent
    cache, which already holds the chunk (the engine writes it before attention).

    Args:
        q: [T, Hq, D] the chunk's queries, packed by ``cu_seqlens``.
        k: [T, 1, D] the chunk's latent keys (not attended here: the top-k name cache
            positions; the shapes of the call).
        kv_cache, block_table: the latent cache holding prefix and chunk, and its pages.
        cu_seqlens: [B + 1] int32; prefix_lens: [B] int32 tokens cached before the chunk.
        topk_indices: [T, K] int32, each new token's picks (positions up to its own).
        head_dim_v, sinks, k_scale, scale, return_lse, out: as :func:`dsa_decode`'s.
    """
    tokens = prefix_lens + (cu_seqlens[1:] - cu_seqlens[:-1])
    second = dsa_source(kv_cache, block_table, tokens.to(prefix_lens.dtype), topk_indices)
    return swattn.extend_attention(q, k, k[..., :head_dim_v], kv_cache,
                                   kv_cache[..., :head_dim_v], block_table, cu_seqlens,
                                   prefix_lens, sinks=sinks, scale=scale, second=second,
                                   k_scale=k_scale, v_scale=k_scale, return_lse=return_lse,
                                   out=out)
