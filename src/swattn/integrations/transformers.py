"""Hugging Face transformers: ``attn_implementation="swattn"``.

Importing this module registers swattn's attention function and its mask function with
transformers (the attention interface and the mask interface: without the latter, recent
versions build no mask for an unknown implementation and causality would be silently
lost)::

    import swattn.integrations.transformers  # noqa: F401
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="swattn")

What it serves: causal decoder layers, sliding-window (``sliding_window``) and full,
attention sinks (``s_aux``: gpt-oss, MiMo-V2-Flash), soft-capped logits (``softcap``, Gemma 2),
GQA, value heads narrower than the keys' (MiMo-V2-Flash), ``scaling`` (Gemma 3's
``query_pre_attn_scalar``), layers that reuse an earlier layer's keys for the last queries only
(Gemma 3n and Gemma 4's KV-shared layers), padded batches (a 2D ``attention_mask`` whose ones
form one contiguous run per row: left or right padding) and generation with the model's own
dynamic cache. The keys transformers hands over are seen as a paged cache of one-token pages
(no copy of the order; one copy of the layout, token-major), so the kernel reads only the keys
each query's window holds.

Nothing is taken without being applied. Every keyword argument a model passes is applied
(``scaling``, ``sliding_window``, ``softcap``, ``s_aux``, ``is_causal``, ``dropout``,
``deterministic``), listed in :data:`HARMLESS` with the reason it changes nothing here, or
refused with an error naming it: :data:`NEUTRAL_ONLY` (``output_attentions``, packed-sequence
lengths, DeepSeek-V3.2's ``indices``) at any value but None or False, and any other name at all.
A mask reaches a layer only if this module's mask function built it for that layer's keys
(:func:`swattn_mask`): a 4D mask of the caller's, or one extended over keys the mask function
never saw (DeepSeek-V4 appends its compressed entries after the window's keys, with a
per-query bias), is refused. Also refused: masks transformers builds from extra mask
functions (packed sequences, block overlays, images' bidirectional spans), the models of
:data:`REFUSED_MODELS`, padding
with holes inside a row, a 2D mask wider or narrower than the tokens, static caches of full
layers (which hand over their whole buffer, the queries not at its end; static
sliding-window caches are served), non-causal layers, layers whose sinks are not passed as
``s_aux``, and dropout in training.

Chunked local attention (Llama 4's ``attention_chunk_size``, its chunked layers' mask) runs as
swattn's ``attention_chunk``: chunks counted, as transformers' mask counts them, from each
row's first token after its left padding. Those layers' cache keeps the last chunk's keys
only: the keys handed over start ``kv_offset`` positions in, and each row's layout is shifted
by that (its first keys' block-table entries -1, below every query's chunk: never read).

Host reads: a batch without padding costs none beyond what transformers' mask code does (a
2D mask handed in is checked for padding once per forward). A padded batch reads its 2D mask
back once per forward and mask (the mask function runs once per forward; every layer reuses
what it read). The window comes from the layer's ``sliding_window``, or from the
sliding-window mask the model built for it (some models pass the layer none).

Continuous batching (``generate_batch``): transformers switches a model to ``paged|<its
implementation>``; ``paged|swattn`` is registered too. Its attention function lets
transformers' paged cache store the new keys and hand back each request's keys (the window's
tail for sliding layers) packed by ``cu_seq_lens_k``, and runs swattn's extend kernel over
them: a block table of one-token pages built on the device from the lengths transformers
passes (no host read). transformers 5.17 runs it; 5.23 takes only its own implementations in
continuous batching and says so.
"""

import weakref

import torch

from ..api import extend_attention
from ..window import from_hf
from ._paged import token_rows

try:
    import transformers
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, causal_mask_function
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ImportError("swattn.integrations.transformers needs transformers: "
                      "pip install 'swattn[transformers]'") from exc

NAME = "swattn"
# The transformers versions the tests ran on, inclusive: 5.17.0 (the GPU image's) and 5.23.0.
TESTED = ((5, 17), (5, 23))

# Models whose attention is more than a window over the layer's keys (each has its own
# issue): refused by their config's model_type, never run as plain window attention.
REFUSED_MODELS = {
    "deepseek_v32": "DeepSeek-V3.2's sparse attention (each query's top-k keys, chosen by its "
                    "indexer)",
    "deepseek_v4": "DeepSeek-V4's compressed attention (compressed entries appended after the "
                   "window's keys, with a per-query bias)",
}

# Keyword arguments models pass to their attention function (5.17 and 5.23) that change
# nothing here, each with the reason.
HARMLESS = {
    "position_ids": "rotary positions, applied to q and k before the call; the window counts "
                    "keys in cache order, as eager's mask does",
    "use_cache": "the model's cache has handed over the keys already",
    "output_hidden_states": "recorded outside attention",
    "output_router_logits": "the experts' router, outside attention",
    "num_items_in_batch": "the loss's normalisation",
}
# Continuous batching's extra inputs, read by the model's sampling, not by attention.
PAGED_HARMLESS = dict(HARMLESS, logits_indices="the rows the sampler reads",
                      logits_processor_args="the sampler's per-request arguments")

_PACKED = ("packed sequences (flash-attention's varlen inputs); give each sequence its own "
           "row and a 2D attention_mask")
_PAGED = "a paged cache's decode inputs; 'paged|swattn' serves transformers' paged cache"
# Keyword arguments served at None or False only, with what any other value asks for.
NEUTRAL_ONLY = {
    "output_attentions": "the attention weights, which swattn never forms (use "
                         "attn_implementation='eager' to get them)",
    "cu_seq_lens_q": _PACKED, "cu_seq_lens_k": _PACKED, "max_length_q": _PACKED,
    "max_length_k": _PACKED, "seq_idx": _PACKED,
    "block_table": _PAGED, "cache_seqlens": _PAGED,
    "indices": "sparse attention over selected keys (an indexer's top-k, DeepSeek-V3.2 style)",
}
# What transformers' mask creation passes to a mask function besides the sizes, the mask
# function and the 2D mask: hints for other implementations' masks (skipping a causal one,
# the float dtype, vmap) and the window or chunk size the mask function itself closes over.
MASK_HARMLESS = frozenset({"allow_is_causal_skip", "allow_is_bidirectional_skip", "dtype",
                           "use_vmap", "local_size", "device", "config"})


def _refuse_model(config):
    model_type = getattr(config, "model_type", None)
    if model_type in REFUSED_MODELS:
        raise NotImplementedError(
            f"attn_implementation='swattn' does not serve {REFUSED_MODELS[model_type]} yet "
            f"(model_type {model_type!r}): it would run as plain window attention; use "
            "attn_implementation='eager'")


def _refuse_unapplied(kwargs, where, harmless=HARMLESS):
    """A NotImplementedError naming the first keyword argument that is neither harmless nor
    at its neutral value: nothing a model passes is dropped unread."""
    for name, value in kwargs.items():
        if name in harmless:
            continue
        if name in NEUTRAL_ONLY:
            if value is None or value is False:
                continue
            raise NotImplementedError(f"{where}: {name}= asks for {NEUTRAL_ONLY[name]}, which "
                                      "swattn does not apply")
        raise NotImplementedError(
            f"{where} got {name}=, which it does not apply; it applies scaling, "
            "sliding_window, softcap, s_aux, is_causal, dropout and deterministic and takes "
            f"{', '.join(sorted(harmless))} as changing nothing")


def _is_overlay(fn, name):
    return getattr(fn, "__qualname__", "").startswith(name + ".")


def _overlay_width(fn):
    """The ``sliding_window`` a sliding-window overlay closes over."""
    return int(_closure(fn)["sliding_window"])


def _closure(fn):
    """The variables a mask function closes over, by name."""
    return dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__)))


def _check_mask_function(mask_function):
    """The mask functions swattn's kernels apply themselves: causal, with a sliding window or
    a chunk (Llama 4). Returns ``(window, chunk)``: the window's width (transformers'
    ``sliding_window``) or None, and None or ``(chunk size, left padding [B] tensor)``."""
    if mask_function is causal_mask_function:
        return None, None
    cells = getattr(mask_function, "__closure__", None) or ()
    parts = [c.cell_contents for c in cells if isinstance(c.cell_contents, tuple)]
    parts = parts[0] if len(parts) == 1 else (mask_function,)
    windows = [f for f in parts if _is_overlay(f, "sliding_window_overlay")]
    chunks = [f for f in parts if _is_overlay(f, "chunked_overlay")]
    if (causal_mask_function in parts and len(windows) + len(chunks) <= 1
            and all(f is causal_mask_function or f in windows or f in chunks for f in parts)):
        if chunks:
            cells = _closure(chunks[0])
            return None, (int(cells["chunk_size"]), cells["left_padding"])
        return (_overlay_width(windows[0]) if windows else None), None
    raise NotImplementedError(
        "attn_implementation='swattn' serves causal and sliding-window masks with padding; "
        f"this model asked for another mask ({getattr(mask_function, '__qualname__', mask_function)}): "
        "packed sequences, block overlays and bidirectional spans are not supported")


class _Padding:
    """What a 2D padding mask handed out by :func:`swattn_mask` told: the window of the mask
    function it was built for, whether every key is valid, and the layouts read from it."""

    __slots__ = ("all_valid", "chunk", "layouts", "ref", "shifts", "window")

    def __init__(self, padding, window, all_valid, chunk=None, shifts=None):
        self.ref = weakref.ref(padding)
        self.window, self.all_valid, self.layouts = window, all_valid, {}
        # Chunked attention: the chunk, and per row the position in its chunk counting of
        # the first key handed over (kv_offset less the row's left padding).
        self.chunk, self.shifts = chunk, shifts


# The padding masks handed out, by data pointer (the views the layers get share it; a view's
# ``_base`` is not kept under inference mode). The weak reference tells a freed one.
_MASKS = {}


def _hand_out(padding, window, all_valid, q_length, chunk=None, shifts=None):
    """The mask a layer gets: ``padding`` [B, K] seen as [B, 1, Q, K] (one padding row for
    every query), so transformers may slice it as the 4D mask it expects (Gemma 4 keeps the
    last queries for its KV-shared layers) while :func:`_own_padding` still knows it."""
    if len(_MASKS) > 256:
        for key in [k for k, v in _MASKS.items() if v.ref() is None]:
            del _MASKS[key]
    _MASKS[padding.data_ptr()] = _Padding(padding, window, all_valid, chunk, shifts)
    return padding[:, None, None, :].expand(padding.shape[0], 1, q_length, padding.shape[1])


def _own_padding(mask, batch, num_queries, num_keys):
    """The padding mask behind ``mask`` and what it told, when ``mask`` is a view of one
    handed out by :func:`swattn_mask` that reads, for each of the layer's queries, the whole
    padding row of every one of its keys; a ValueError otherwise."""
    entry = _MASKS.get(mask.data_ptr()) if isinstance(mask, torch.Tensor) else None
    padding = entry.ref() if entry is not None else None
    if (padding is not None and padding.data_ptr() == mask.data_ptr()
            and mask.dtype == torch.bool and mask.dim() == 4
            and tuple(mask.shape) == (batch, 1, num_queries, num_keys)
            and tuple(padding.shape) == (batch, num_keys)
            and (batch == 1 or mask.stride(0) == padding.stride(0))
            and (num_keys == 1 or mask.stride(3) == padding.stride(1))
            and (num_queries == 1 or mask.stride(2) == 0)):
        return padding, entry
    shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
    raise ValueError(
        "attn_implementation='swattn' applies only the masks its own mask function built for "
        f"the layer's keys ({batch} x {num_keys}); got a mask {shape} it did not build: a mask "
        "extended over keys the mask function never saw (e.g. DeepSeek-V4's compressed "
        "entries), a 4D mask of the caller's, or one cut to other keys")


def swattn_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0,
                mask_function=causal_mask_function, attention_mask=None, **kwargs):
    """The mask transformers hands to each layer: the 2D padding mask cut to the keys the
    layer sees, as a [B, 1, Q, K] view (the kernel applies causality and the window); None for
    a causal mask without padding. A sliding-window mask always comes (all ones without
    padding): :func:`swattn_attention` reads its window, as some models build one but pass
    the layer no ``sliding_window``."""
    unknown = sorted(set(kwargs) - MASK_HARMLESS)
    if unknown:
        raise NotImplementedError(f"swattn's mask function got {', '.join(unknown)}, which it "
                                  "does not apply")
    _refuse_model(kwargs.get("config"))
    window, chunked = _check_mask_function(mask_function)
    if isinstance(q_offset, torch.Tensor) or q_offset + q_length != kv_offset + kv_length:
        raise NotImplementedError(
            "attn_implementation='swattn' needs the queries at the end of the keys (the "
            "dynamic cache); a static cache is not supported")
    chunk = shifts = None
    if chunked is not None:
        # Each row's chunks count from its first token after the left padding; the keys
        # handed over start kv_offset positions in (the chunked layers' cache keeps the last
        # chunk's): a row's first handed key is at kv_offset - left padding in its count.
        chunk, left_padding = chunked
        shifts = [kv_offset - int(n) for n in left_padding.tolist()]
    if attention_mask is None:
        if window is None and chunk is None:
            return None
        padding, all_valid = torch.ones(batch_size, kv_length, dtype=torch.bool,
                                        device=kwargs.get("device") or "cpu"), True
    else:
        # Eager reads a wider mask's first columns and pads a narrower one with zeros (its
        # own new tokens masked): neither is padding of these keys, so neither is guessed at.
        tokens = kv_offset + kv_length
        if attention_mask.dim() != 2 or tuple(attention_mask.shape) != (batch_size, tokens):
            raise ValueError(
                f"attn_implementation='swattn' takes a 2D attention_mask of one column a "
                f"token, ({batch_size}, {tokens}) here; got shape {tuple(attention_mask.shape)}")
        # A tensor of its own: the views handed out are known by its data pointer.
        padding = attention_mask[:, kv_offset:].to(torch.bool).clone()
        all_valid = bool(padding.all())
        if all_valid and window is None and chunk is None:
            return None
    return _hand_out(padding, window, all_valid, q_length, chunk, shifts)


def _spans(mask, num_keys, num_queries):
    """Per row of a 2D padding mask: (first key, prefix keys, new queries, first new query)
    in the keys' and queries' own coordinates; a ValueError where a row's ones are not one
    contiguous run."""
    rows = mask.to(device="cpu", dtype=torch.bool)
    spans = []
    for b, row in enumerate(rows):
        ones = torch.nonzero(row).flatten().tolist()
        if not ones:
            spans.append((0, 0, 0, 0))
            continue
        start, end = ones[0], ones[-1] + 1
        if len(ones) != end - start:
            raise ValueError(f"attention_mask row {b} has padding inside the sequence; "
                             "swattn takes left or right padding only")
        first_query = num_keys - num_queries
        lo = max(first_query, start)
        count = max(0, end - lo)
        spans.append((start, lo - start if count else 0, count, lo - first_query))
    return spans


def _layout(spans, batch, num_keys, num_queries, device, shifts=None):
    """Index tensors of one batch's layout (device): the rows of the packed queries and new
    keys, the offsets and prefix lengths, the block table of one-token pages. ``shifts``
    (chunked attention): per row, where its first valid key stands in its chunks' count,
    less its place among the keys (the row's prefix begins with that many entries -1)."""
    q_rows, k_rows, cu, prefix = [], [], [0], []
    lead = [0] * batch if shifts is None else [s + start for s, (start, *_) in zip(shifts, spans)]
    width = max([p + n for (_, p, _, _), n in zip(spans, lead)] + [1])
    table = torch.full((batch, width), -1, dtype=torch.int32)
    for b, (start, p, count, q0) in enumerate(spans):
        q_rows += range(b * num_queries + q0, b * num_queries + q0 + count)
        k_rows += range(b * num_keys + start + p, b * num_keys + start + p + count)
        cu.append(cu[-1] + count)
        prefix.append(p + lead[b] if count else 0)
        if p:
            table[b, lead[b]:lead[b] + p] = torch.arange(b * num_keys + start,
                                                         b * num_keys + start + p,
                                                         dtype=torch.int32)
    as_dev = lambda values: torch.tensor(values, dtype=torch.int64).to(device)  # noqa: E731
    return (as_dev(q_rows), as_dev(k_rows), torch.tensor(cu, dtype=torch.int32).to(device),
            torch.tensor(prefix, dtype=torch.int32).to(device), table.to(device))


def _padded_layout(padding, entry, num_keys, num_queries, device):
    """:func:`_layout` of a padded batch, read from its mask by the forward's first layer
    and kept for the others (per query count: KV-shared layers take the last queries only)."""
    key = (num_keys, num_queries)
    if key not in entry.layouts:
        entry.layouts[key] = _layout(_spans(padding, num_keys, num_queries), padding.shape[0],
                                     num_keys, num_queries, device, entry.shifts)
    return entry.layouts[key]


def _uniform_layout(batch, num_keys, num_queries, device):
    """``(cu_seqlens, prefix_lens, block_table)`` of a batch without padding, made on the
    device (no host read)."""
    p = num_keys - num_queries
    cu = torch.arange(0, (batch + 1) * num_queries, num_queries, dtype=torch.int32, device=device)
    prefix = torch.full((batch,), p, dtype=torch.int32, device=device)
    table = (torch.arange(batch, dtype=torch.int32, device=device)[:, None] * num_keys
             + torch.arange(max(p, 1), dtype=torch.int32, device=device)[None])
    return cu, prefix, table


def _check_layer(module, dropout, is_causal, s_aux):
    """Refusals every call shares: the model, training dropout, non-causal layers, and sinks
    the layer holds but does not pass (eager reads ``module.sinks`` itself)."""
    _refuse_model(getattr(module, "config", None))
    if dropout and module.training:
        raise NotImplementedError("attn_implementation='swattn' runs no attention dropout")
    if is_causal is False or getattr(module, "is_causal", True) is False:
        raise NotImplementedError("attn_implementation='swattn' serves causal layers only")
    if s_aux is None and isinstance(getattr(module, "sinks", None), torch.Tensor):
        raise NotImplementedError("the layer holds attention sinks (module.sinks) but passed "
                                  "no s_aux: attn_implementation='swattn' applies only s_aux")
    return None if s_aux is None else s_aux.to(torch.float32)


def swattn_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                     sliding_window=None, softcap=None, s_aux=None, is_causal=None,
                     deterministic=None, **kwargs):
    """transformers' attention function for ``attn_implementation="swattn"``: query
    ``[B, Hq, S, D]``, key/value ``[B, Hkv, L, D]`` (the cache's keys, the new ones last);
    returns ``([B, S, Hq, Dv], None)``."""
    _refuse_unapplied(kwargs, "attn_implementation='swattn'")
    sinks = _check_layer(module, dropout, is_causal, s_aux)
    batch, num_q_heads, num_queries, head_dim = query.shape
    num_kv_heads, num_keys, head_dim_v = key.shape[1], key.shape[2], value.shape[-1]
    device = query.device
    # Token-major keys: [B * L, 1, Hkv, D], a cache of one-token pages.
    k_cache = key.transpose(1, 2).reshape(batch * num_keys, 1, num_kv_heads, head_dim)
    v_cache = value.transpose(1, 2).reshape(batch * num_keys, 1, num_kv_heads, head_dim_v)
    q = query.transpose(1, 2)
    window, all_valid, chunk = None, True, None
    if attention_mask is not None:
        padding, entry = _own_padding(attention_mask, batch, num_queries, num_keys)
        window, all_valid, chunk = entry.window, entry.all_valid, entry.chunk
        if chunk is not None and any(entry.shifts):
            # The chunks' count does not start at the first key handed over: the padded
            # layout, which places each row's keys in it (host lists, read once a forward).
            all_valid = False
    if window is not None and sliding_window and sliding_window != window:
        raise ValueError(f"the layer's sliding_window {sliding_window} is not its mask's {window}")
    sliding_window = window or sliding_window
    if all_valid:
        cu, prefix, table = _uniform_layout(batch, num_keys, num_queries, device)
        q_packed = q.reshape(batch * num_queries, num_q_heads, head_dim)
        new = slice(num_keys - num_queries, num_keys)
        k_new = k_cache.view(batch, num_keys, num_kv_heads, head_dim)[:, new]
        v_new = v_cache.view(batch, num_keys, num_kv_heads, head_dim_v)[:, new]
        k_new = k_new.reshape(batch * num_queries, num_kv_heads, head_dim)
        v_new = v_new.reshape(batch * num_queries, num_kv_heads, head_dim_v)
        q_rows = None
    else:
        q_rows, k_rows, cu, prefix, table = _padded_layout(padding, entry, num_keys,
                                                           num_queries, device)
        q_packed = q.reshape(batch * num_queries, num_q_heads, head_dim)[q_rows]
        k_new = k_cache[k_rows, 0]
        v_new = v_cache[k_rows, 0]
    out = extend_attention(q_packed, k_new, v_new, k_cache, v_cache, table, cu, prefix,
                           window_left=from_hf(sliding_window or None), sinks=sinks,
                           softcap=float(softcap or 0.0), scale=scaling,
                           deterministic=bool(deterministic), attention_chunk=chunk)
    if q_rows is not None:
        full = out.new_zeros(batch * num_queries, num_q_heads, head_dim_v)
        full[q_rows] = out
        out = full
    return out.view(batch, num_queries, num_q_heads, head_dim_v), None


def swattn_paged_attention(module, query, key, value, attention_mask, cache=None,
                           cu_seq_lens_q=None, cu_seq_lens_k=None, max_seqlen_q=None,
                           max_seqlen_k=None, read_index=None, write_index=None,
                           block_table=None, dropout=0.0, scaling=None, sliding_window=None,
                           softcap=None, s_aux=None, is_causal=None, deterministic=None,
                           **kwargs):
    """``paged|swattn``: transformers' continuous batching. query/key/value ``[1, H, T, D]``
    (the step's packed tokens); returns ``([1, T, Hq, Dv], None)``."""
    _refuse_unapplied(kwargs, "attn_implementation='paged|swattn'", PAGED_HARMLESS)
    if cache is None or read_index is None:
        raise ValueError("attn_implementation='paged|swattn' runs inside transformers' "
                         "continuous batching (its paged cache); use 'swattn' otherwise")
    sinks = _check_layer(module, dropout, is_causal, s_aux)
    if attention_mask is not None:
        # transformers builds one only for paged|eager and paged|sdpa; its meaning here
        # would be a guess, and cu_seq_lens_q/k already say what it would.
        raise ValueError("paged|swattn takes the batch's layout from cu_seq_lens_q/k; got an "
                         "attention_mask it would not apply")
    if block_table is not None:
        raise NotImplementedError("paged|swattn takes the paged cache's read and write indices, "
                                  "not its fused-decode block table")
    sliding_window = sliding_window or getattr(module, "sliding_window", None)
    # The cache stores the new keys and returns each request's keys, packed, the new last.
    k, v = cache.update(key_states=key, value_states=value, layer_idx=module.layer_idx,
                        read_index=read_index, write_index=write_index)
    kind = "sliding_attention" if sliding_window else "full_attention"
    if isinstance(cu_seq_lens_k, dict):
        if kind not in cu_seq_lens_k:
            raise NotImplementedError(f"paged|swattn: a {kind} layer, but the paged cache holds "
                                      f"{sorted(cu_seq_lens_k)}")
        cu_seq_lens_k, max_seqlen_k = cu_seq_lens_k[kind], max_seqlen_k[kind]
    num_tokens = query.shape[2]
    q = query[0].transpose(0, 1).contiguous()
    cu_q, cu_k = cu_seq_lens_q.to(torch.int64), cu_seq_lens_k.to(torch.int64)
    prefix = (cu_k[1:] - cu_k[:-1]) - (cu_q[1:] - cu_q[:-1])
    seq, i = token_rows(cu_q, num_tokens)
    rows = cu_k[:-1][seq] + prefix[seq] + i
    k, v = k.contiguous(), v.contiguous()
    table = (cu_k[:-1, None] + torch.arange(max(int(max_seqlen_k), 1), device=k.device)[None])
    out = extend_attention(q, k[rows], v[rows], k.unsqueeze(1), v.unsqueeze(1),
                           table.to(torch.int32), cu_q.to(torch.int32), prefix.to(torch.int32),
                           window_left=from_hf(sliding_window or None), sinks=sinks,
                           softcap=float(softcap or 0.0), scale=scaling,
                           deterministic=bool(deterministic))
    return out[None], None


def tested_version(version=None):
    """Whether ``version`` (default the installed transformers) is in the tested range."""
    major, minor = (int(x) for x in (version or transformers.__version__).split(".")[:2])
    return TESTED[0] <= (major, minor) <= TESTED[1]


AttentionInterface.register(NAME, swattn_attention)
AttentionMaskInterface.register(NAME, swattn_mask)
AttentionInterface.register(f"paged|{NAME}", swattn_paged_attention)
