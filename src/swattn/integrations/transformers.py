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
``deterministic``, DeepSeek-V3.2's ``indices``), listed in :data:`HARMLESS` with the reason it
changes nothing here, or refused with an error naming it: :data:`NEUTRAL_ONLY`
(``output_attentions``, packed-sequence lengths, ``indices`` from any other model) at any value
but None or False, and any other name at all. A mask reaches a layer only if this module's mask
function built it for that layer's keys (:func:`swattn_mask`): a 4D mask of the caller's, or one
extended over keys the mask function never saw, is refused (DeepSeek-V4's extension over its
compressed entries is placed, below). Also refused: masks transformers builds from extra mask
functions (packed sequences, block overlays, images' bidirectional spans), padding with holes
inside a row, a 2D mask wider or narrower than the tokens, static caches of full layers (which
hand over their whole buffer, the queries not at its end; static sliding-window caches are
served), non-causal layers, layers whose sinks are not passed as ``s_aux``, dropout in
training, and in continuous batching the models of :data:`PAGED_REFUSED_MODELS`.

DeepSeek-V4 and DeepSeek-V3.2 run their second key source through swattn's
:class:`swattn.SecondKeys` (``_deepseek``): V4's compressed entries (the keys its CSA and HCA
layers append after the window's, the mask extended over them with the compressor's bias,
which tells the entries each query sees: CSA's index lists, HCA's limit) as a second paged
cache of one page a sequence, with the window and the sinks in one softmax; V3.2's indexer
top-k (``indices``) over the layer's keys, no window. V4's entries are causal by position,
counted from each row's first token as generate's ``position_ids`` count them; a left-padded
batch whose mask shows other entries (a forward without ``position_ids``) is refused. V3.2's
mask is built in full (causal and padding: its indexer reads it).

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
from . import _deepseek
from ._layout import padded_layout, uniform_layout
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

# Models 'paged|swattn' (continuous batching) refuses by their config's model_type: their
# second key source (swattn.SecondKeys) is served by 'swattn' only, never run as plain window
# attention over the paged cache.
PAGED_REFUSED_MODELS = {
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


def _refuse_paged_model(config):
    model_type = getattr(config, "model_type", None)
    if model_type in PAGED_REFUSED_MODELS:
        raise NotImplementedError(
            f"attn_implementation='paged|swattn' does not serve "
            f"{PAGED_REFUSED_MODELS[model_type]} (model_type {model_type!r}): it would run as "
            "plain window attention; use generate() with attn_implementation='swattn'")


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
        "this model asked for another mask "
        f"({getattr(mask_function, '__qualname__', mask_function)}): "
        "packed sequences, block overlays and bidirectional spans are not supported")


class _Padding:
    """What a mask handed out by :func:`swattn_mask` told: the window of the mask function it
    was built for, whether every key is valid, and the layouts read from it. ``ref``: a weak
    reference to the tensor handed out (the 2D padding the layers get views of, or
    DeepSeek-V3.2's dense mask, whose 2D padding ``padding`` then holds)."""

    __slots__ = ("all_valid", "chunk", "layouts", "left_padded", "padding", "ref", "shifts",
                 "window")

    def __init__(self, handed, window, all_valid, chunk=None, shifts=None, left_padded=False,
                 padding=None):
        self.ref = weakref.ref(handed)
        self.window, self.all_valid, self.layouts = window, all_valid, {}
        # Chunked attention and DeepSeek-V4: the chunk, and per row the position (in its
        # chunk, or in its sequence) of the first key handed over (kv_offset less the row's
        # left padding); whether a row is left-padded.
        self.chunk, self.shifts, self.left_padded = chunk, shifts, left_padded
        self.padding = padding


# The masks handed out, by data pointer (the views the layers get share it; a view's
# ``_base`` is not kept under inference mode). The weak reference tells a freed one.
_MASKS = {}
# DeepSeek-V4: the mask handed out for a model's forward, by its config's id (with a weak
# reference to the config): the layers that extend it over compressed entries hand over a
# copy, whose window's keys it tells.
_FORWARDS = {}


def _register(handed, entry):
    if len(_MASKS) > 256:
        for key in [k for k, v in _MASKS.items() if v.ref() is None]:
            del _MASKS[key]
    _MASKS[handed.data_ptr()] = entry


def _view(padding, q_length):
    return padding[:, None, None, :].expand(padding.shape[0], 1, q_length, padding.shape[1])


def _hand_out(padding, window, all_valid, q_length, chunk=None, shifts=None, config=None,
              left_padded=False):
    """The mask a layer gets: ``padding`` [B, K] seen as [B, 1, Q, K] (one padding row for
    every query), so transformers may slice it as the 4D mask it expects (Gemma 4 keeps the
    last queries for its KV-shared layers) while :func:`_own_padding` still knows it."""
    entry = _Padding(padding, window, all_valid, chunk, shifts, left_padded)
    _register(padding, entry)
    if config is not None:
        _FORWARDS[id(config)] = (weakref.ref(config), entry)
    return _view(padding, q_length)


def _dense_causal(padding, q_length):
    """DeepSeek-V3.2's mask: causal and padding, [B, 1, Q, K] bool, built in full (its indexer
    masks its scores with it before choosing each query's top-k keys)."""
    num_keys = padding.shape[1]
    keys = torch.arange(num_keys, device=padding.device)
    queries = torch.arange(num_keys - q_length, num_keys, device=padding.device)
    dense = padding[:, None, None, :] & (keys[None] <= queries[:, None])[None, None]
    _register(dense, _Padding(dense, None, bool(padding.all()), padding=padding))
    return dense


def _own_padding(mask, batch, num_queries, num_keys):
    """The padding mask behind ``mask`` and what it told, when ``mask`` is a view of one
    handed out by :func:`swattn_mask` that reads, for each of the layer's queries, the whole
    padding row of every one of its keys, or DeepSeek-V3.2's dense mask as handed out; a
    ValueError otherwise."""
    entry = _MASKS.get(mask.data_ptr()) if isinstance(mask, torch.Tensor) else None
    handed = entry.ref() if entry is not None else None
    if handed is not None and entry.padding is not None:
        if (mask.data_ptr() == handed.data_ptr() and mask.shape == handed.shape
                and mask.stride() == handed.stride()
                and tuple(mask.shape) == (batch, 1, num_queries, num_keys)):
            return entry.padding, entry
    elif (handed is not None and handed.data_ptr() == mask.data_ptr()
            and mask.dtype == torch.bool and mask.dim() == 4
            and tuple(mask.shape) == (batch, 1, num_queries, num_keys)
            and tuple(handed.shape) == (batch, num_keys)
            and (batch == 1 or mask.stride(0) == handed.stride(0))
            and (num_keys == 1 or mask.stride(3) == handed.stride(1))
            and (num_queries == 1 or mask.stride(2) == 0)):
        return handed, entry
    shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
    raise ValueError(
        "attn_implementation='swattn' applies only the masks its own mask function built for "
        f"the layer's keys ({batch} x {num_keys}); got a mask {shape} it did not build: a mask "
        "extended over keys the mask function never saw, a 4D mask of the caller's, or one cut "
        "to other keys")


def _split_compressed(module, key, mask, batch, num_queries):
    """DeepSeek-V4: ``(mask, None)`` where the layer's mask covers its window's keys only (a
    sliding layer, or no entry closed yet); where its compressor appended entries and
    extended the mask over them (a copy), ``(the mask handed out for the window's keys,
    the entries each query sees [B, S, T])``: the extension's columns are the compressor's
    bias, true where an entry is hidden."""
    entry = _MASKS.get(mask.data_ptr()) if isinstance(mask, torch.Tensor) else None
    if getattr(module, "compressor", None) is None or (
            entry is not None and entry.ref() is not None
            and entry.ref().data_ptr() == mask.data_ptr()):
        return mask, None
    config_ref, entry = _FORWARDS.get(id(module.config), (lambda: None, None))
    padding = entry.ref() if entry is not None and config_ref() is module.config else None
    total = key.shape[2]
    if (padding is None or padding.shape[0] != batch or not 0 < padding.shape[1] < total
            or mask.dtype != torch.bool
            or tuple(mask.shape) != (batch, 1, num_queries, total)):
        shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(
            "attn_implementation='swattn' serves DeepSeek-V4's compressed entries through the "
            f"mask its mask function built for this forward, extended by the layer over them; "
            f"got a mask {shape} for {total} keys it cannot place")
    return _view(padding, num_queries), ~mask[:, 0, :, padding.shape[1]:]


def swattn_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0,
                mask_function=causal_mask_function, attention_mask=None, **kwargs):
    """The mask transformers hands to each layer: the 2D padding mask cut to the keys the
    layer sees, as a [B, 1, Q, K] view (the kernel applies causality and the window); None for
    a causal mask without padding. A sliding-window mask always comes (all ones without
    padding): :func:`swattn_attention` reads its window, as some models build one but pass
    the layer no ``sliding_window``. DeepSeek-V3.2 gets its causal mask in full (its indexer
    reads it); DeepSeek-V4's rows count their positions from their first token."""
    unknown = sorted(set(kwargs) - MASK_HARMLESS)
    if unknown:
        raise NotImplementedError(f"swattn's mask function got {', '.join(unknown)}, which it "
                                  "does not apply")
    config = kwargs.get("config")
    kind = getattr(config, "model_type", None)
    window, chunked = _check_mask_function(mask_function)
    if isinstance(q_offset, torch.Tensor) or q_offset + q_length != kv_offset + kv_length:
        raise NotImplementedError(
            "attn_implementation='swattn' needs the queries at the end of the keys (the "
            "dynamic cache); a static cache is not supported")
    chunk = shifts = None
    left_padding = [0] * batch_size
    if chunked is not None:
        # Each row's chunks count from its first token after the left padding; the keys
        # handed over start kv_offset positions in (the chunked layers' cache keeps the last
        # chunk's): a row's first handed key is at kv_offset - left padding in its count.
        chunk, counted = chunked
        left_padding = [int(n) for n in counted.tolist()]
    elif kind == _deepseek.V4 and attention_mask is not None:
        # The compressed entries' causality is by position, counted (as generate's
        # position_ids) from each row's first token.
        left_padding = (attention_mask.cumsum(-1) == 0).sum(-1).tolist()
    if chunk is not None or kind == _deepseek.V4:
        shifts = [kv_offset - n for n in left_padding]
    if attention_mask is None:
        if window is None and chunk is None and kind != _deepseek.V32:
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
        if all_valid and window is None and chunk is None and kind != _deepseek.V32:
            return None
    if kind == _deepseek.V32:
        return _dense_causal(padding, q_length)
    return _hand_out(padding, window, all_valid, q_length, chunk, shifts,
                     config if kind == _deepseek.V4 else None, any(left_padding))


def _check_layer(module, dropout, is_causal, s_aux):
    """Refusals every call shares: training dropout, non-causal layers, and sinks the layer
    holds but does not pass (eager reads ``module.sinks`` itself)."""
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
                     deterministic=None, indices=None, **kwargs):
    """transformers' attention function for ``attn_implementation="swattn"``: query
    ``[B, Hq, S, D]``, key/value ``[B, Hkv, L, D]`` (the cache's keys, the new ones last;
    DeepSeek-V4's compressed entries after them); ``indices`` ``[B, S, k]``: DeepSeek-V3.2's
    top-k keys of each query. Returns ``([B, S, Hq, Dv], None)``."""
    _refuse_unapplied(kwargs, "attn_implementation='swattn'")
    sinks = _check_layer(module, dropout, is_causal, s_aux)
    kind = _deepseek.model_type(module)
    if indices is not None and kind != _deepseek.V32:
        raise NotImplementedError("attn_implementation='swattn': indices= asks for "
                                  f"{NEUTRAL_ONLY['indices']}, which swattn applies to "
                                  "DeepSeek-V3.2 only")
    batch, num_q_heads, num_queries, head_dim = query.shape
    visible = None
    if kind == _deepseek.V4 and attention_mask is not None and attention_mask.shape[-1] > 0:
        attention_mask, visible = _split_compressed(module, key, attention_mask, batch,
                                                    num_queries)
    num_kv_heads, head_dim_v = key.shape[1], value.shape[-1]
    num_keys = key.shape[2] if visible is None else key.shape[2] - visible.shape[-1]
    device = query.device
    # Token-major keys: [B * L, 1, Hkv, D], a cache of one-token pages.
    k_cache = key[:, :, :num_keys].transpose(1, 2).reshape(batch * num_keys, 1, num_kv_heads,
                                                          head_dim)
    v_cache = value[:, :, :num_keys].transpose(1, 2).reshape(batch * num_keys, 1, num_kv_heads,
                                                            head_dim_v)
    q = query.transpose(1, 2)
    window, all_valid, chunk, entry = None, True, None, None
    if attention_mask is not None:
        padding, entry = _own_padding(attention_mask, batch, num_queries, num_keys)
        window, all_valid, chunk = entry.window, entry.all_valid, entry.chunk
        if entry.shifts is not None and any(entry.shifts):
            # Positions that do not start at the first key handed over (chunks, DeepSeek-V4's
            # compressed entries): the padded layout, which places each row's keys in them
            # (host lists, read once a forward).
            all_valid = False
    if window is not None and sliding_window and sliding_window != window:
        raise ValueError(f"the layer's sliding_window {sliding_window} is not its mask's {window}")
    sliding_window = window or sliding_window
    if all_valid:
        layout = uniform_layout(batch, num_keys, num_queries, device)
        q_packed = q.reshape(batch * num_queries, num_q_heads, head_dim)
        new = slice(num_keys - num_queries, num_keys)
        k_new = k_cache.view(batch, num_keys, num_kv_heads, head_dim)[:, new]
        v_new = v_cache.view(batch, num_keys, num_kv_heads, head_dim_v)[:, new]
        k_new = k_new.reshape(batch * num_queries, num_kv_heads, head_dim)
        v_new = v_new.reshape(batch * num_queries, num_kv_heads, head_dim_v)
    else:
        layout = padded_layout(padding, entry, num_keys, num_queries, device)
        q_packed = q.reshape(batch * num_queries, num_q_heads, head_dim)[layout.q_rows]
        k_new = k_cache[layout.k_rows, 0]
        v_new = v_cache[layout.k_rows, 0]
    second = None
    if indices is not None:
        second = _deepseek.selected_keys(indices, layout, k_cache, v_cache, num_queries)
    elif visible is not None:
        entries = key[:, 0, num_keys:]
        second = _deepseek.compressed_entries(module, entries, visible, layout, num_queries,
                                              entry.left_padded)
    options = {"second": second}
    if second is None:
        options = {"deterministic": bool(deterministic), "attention_chunk": chunk}
    elif deterministic:
        raise NotImplementedError("attn_implementation='swattn': deterministic=True with a "
                                  "second key source (DeepSeek), which has no single-pass kernel")
    out = extend_attention(q_packed, k_new, v_new, k_cache, v_cache, layout.table, layout.cu,
                           layout.prefix, window_left=from_hf(sliding_window or None),
                           sinks=sinks, softcap=float(softcap or 0.0), scale=scaling, **options)
    if layout.q_rows is not None:
        full = out.new_zeros(batch * num_queries, num_q_heads, head_dim_v)
        full[layout.q_rows] = out
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
    _refuse_paged_model(getattr(module, "config", None))
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
