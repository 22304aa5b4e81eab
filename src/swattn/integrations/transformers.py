"""Hugging Face transformers: ``attn_implementation="swattn"``.

Importing this module registers swattn's attention function and its mask function with
transformers (the attention interface and the mask interface: without the latter, recent
versions build no mask for an unknown implementation and causality would be silently
lost)::

    import swattn.integrations.transformers  # noqa: F401
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="swattn")

What it serves: causal decoder layers, sliding-window (``sliding_window``) and full,
attention sinks (``s_aux``, gpt-oss), soft-capped logits (``softcap``, Gemma 2), GQA,
``scaling`` (Gemma 3's ``query_pre_attn_scalar``), padded batches (a 2D ``attention_mask``
whose ones form one contiguous run per row: left or right padding) and generation with the
model's own dynamic cache. The keys transformers hands over are seen as a paged cache of
one-token pages (no copy of the order; one copy of the layout, token-major), so the kernel
reads only the keys each query's window holds.

What it refuses, with an error instead of a silent wrong answer: masks transformers builds
from extra mask functions (packed sequences, block overlays, images' bidirectional spans),
padding with holes inside a row, static caches of full layers (which hand over their whole
buffer, the queries not at its end; static sliding-window caches are served),
non-causal layers and dropout in training.

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
passes (no host read). transformers 5.17 runs it; 5.24 takes only its own implementations in
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
TESTED = ((5, 17), (5, 24))  # the transformers versions the tests ran on, inclusive

# What a mask tensor told (its window, its layout), keyed by (id, what), with a weak
# reference to tell a new tensor at a reused id.
_LAYOUTS = {}


def _is_sliding_overlay(fn):
    return getattr(fn, "__qualname__", "").startswith("sliding_window_overlay.")


def _overlay_width(fn):
    """The ``sliding_window`` a sliding-window overlay closes over."""
    cells = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__)))
    return int(cells["sliding_window"])


def _check_mask_function(mask_function):
    """The mask functions swattn's kernels apply themselves: causal, or causal with a
    sliding window. Returns the window's width (transformers' ``sliding_window``) or None."""
    if mask_function is causal_mask_function:
        return None
    cells = getattr(mask_function, "__closure__", None) or ()
    parts = [c.cell_contents for c in cells if isinstance(c.cell_contents, tuple)]
    if len(parts) == 1 and all(f is causal_mask_function or _is_sliding_overlay(f)
                               for f in parts[0]):
        widths = [_overlay_width(f) for f in parts[0] if _is_sliding_overlay(f)]
        if len(widths) <= 1:
            return widths[0] if widths else None
    raise NotImplementedError(
        "attn_implementation='swattn' serves causal and sliding-window masks with padding; "
        f"this model asked for another mask ({getattr(mask_function, '__qualname__', mask_function)}): "
        "packed sequences, block overlays and bidirectional spans are not supported")


def swattn_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0,
                mask_function=causal_mask_function, attention_mask=None, **kwargs):
    """The mask transformers hands to each layer: the 2D padding mask cut to the keys the
    layer sees (the kernel applies causality and the window), None for a causal mask without
    padding. A sliding-window mask always comes as a 2D mask (all ones without padding) whose
    window :func:`swattn_attention` reads: some models build one but pass the layer no
    ``sliding_window``."""
    window = _check_mask_function(mask_function)
    if isinstance(q_offset, torch.Tensor) or q_offset + q_length != kv_offset + kv_length:
        raise NotImplementedError(
            "attn_implementation='swattn' needs the queries at the end of the keys (the "
            "dynamic cache); a static cache is not supported")
    if attention_mask is None:
        if window is None:
            return None
        mask, all_valid = torch.ones(batch_size, kv_length, dtype=torch.bool,
                                     device=kwargs.get("device", "cpu")), True
    else:
        mask = attention_mask[:, -kv_length:]
        if mask.shape[1] != kv_length:
            raise NotImplementedError(f"attn_implementation='swattn': a 2D mask of {mask.shape[1]} "
                                      f"keys for {kv_length} keys")
        all_valid = bool(mask.all())
        if all_valid and window is None:
            return None
    _remember(mask, "info", (window, all_valid))
    return mask


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


def _layout(spans, batch, num_keys, num_queries, device):
    """Index tensors of one batch's layout (device): the rows of the packed queries and new
    keys, the offsets and prefix lengths, the block table of one-token pages."""
    q_rows, k_rows, cu, prefix = [], [], [0], []
    width = max([p for _, p, _, _ in spans] + [1])
    table = torch.full((batch, width), -1, dtype=torch.int32)
    for b, (start, p, count, q0) in enumerate(spans):
        q_rows += range(b * num_queries + q0, b * num_queries + q0 + count)
        k_rows += range(b * num_keys + start + p, b * num_keys + start + p + count)
        cu.append(cu[-1] + count)
        prefix.append(p)
        if p:
            table[b, :p] = torch.arange(b * num_keys + start, b * num_keys + start + p,
                                        dtype=torch.int32)
    as_dev = lambda values: torch.tensor(values, dtype=torch.int64).to(device)  # noqa: E731
    return (as_dev(q_rows), as_dev(k_rows), torch.tensor(cu, dtype=torch.int32).to(device),
            torch.tensor(prefix, dtype=torch.int32).to(device), table.to(device))


def _recall(mask, what):
    """What was kept of ``mask`` under ``what`` (None: nothing, or another tensor now
    holds its id)."""
    held = _LAYOUTS.get((id(mask), what))
    return held[1] if held is not None and held[0]() is mask else None


def _remember(mask, what, value):
    if len(_LAYOUTS) > 256:
        for key in [k for k, v in _LAYOUTS.items() if v[0]() is None]:
            del _LAYOUTS[key]
    _LAYOUTS[(id(mask), what)] = (weakref.ref(mask), value)


def _padded_layout(mask, batch, num_keys, num_queries, device):
    """:func:`_layout` of a padded batch, read from its mask by the forward's first layer
    and kept for the others."""
    what = ("layout", num_keys, num_queries)
    layout = _recall(mask, what)
    if layout is None:
        layout = _layout(_spans(mask, num_keys, num_queries), batch, num_keys, num_queries, device)
        _remember(mask, what, layout)
    return layout


def _uniform_layout(batch, num_keys, num_queries, device):
    """``(cu_seqlens, prefix_lens, block_table)`` of a batch without padding, made on the
    device (no host read)."""
    p = num_keys - num_queries
    cu = torch.arange(0, (batch + 1) * num_queries, num_queries, dtype=torch.int32, device=device)
    prefix = torch.full((batch,), p, dtype=torch.int32, device=device)
    table = (torch.arange(batch, dtype=torch.int32, device=device)[:, None] * num_keys
             + torch.arange(max(p, 1), dtype=torch.int32, device=device)[None])
    return cu, prefix, table


def swattn_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                     sliding_window=None, softcap=None, s_aux=None, is_causal=None, **kwargs):
    """transformers' attention function for ``attn_implementation="swattn"``: query
    ``[B, Hq, S, D]``, key/value ``[B, Hkv, L, D]`` (the cache's keys, the new ones last);
    returns ``([B, S, Hq, Dv], None)``."""
    if dropout and module.training:
        raise NotImplementedError("attn_implementation='swattn' runs no attention dropout")
    if is_causal is False or getattr(module, "is_causal", True) is False:
        raise NotImplementedError("attn_implementation='swattn' serves causal layers only")
    batch, num_q_heads, num_queries, head_dim = query.shape
    num_kv_heads, num_keys, head_dim_v = key.shape[1], key.shape[2], value.shape[-1]
    device = query.device
    # Token-major keys: [B * L, 1, Hkv, D], a cache of one-token pages.
    k_cache = key.transpose(1, 2).reshape(batch * num_keys, 1, num_kv_heads, head_dim)
    v_cache = value.transpose(1, 2).reshape(batch * num_keys, 1, num_kv_heads, head_dim_v)
    q = query.transpose(1, 2)
    window, all_valid = None, attention_mask is None
    if attention_mask is not None:
        if attention_mask.dim() != 2 or attention_mask.shape[1] != num_keys:
            raise ValueError("attn_implementation='swattn' takes the 2D padding mask of its own "
                             f"mask function, one column a key ({num_keys}), got shape "
                             f"{tuple(attention_mask.shape)}")
        window, all_valid = _recall(attention_mask, "info") or (None, False)
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
        q_rows, k_rows, cu, prefix, table = _padded_layout(attention_mask, batch, num_keys,
                                                           num_queries, device)
        q_packed = q.reshape(batch * num_queries, num_q_heads, head_dim)[q_rows]
        k_new = k_cache[k_rows, 0]
        v_new = v_cache[k_rows, 0]
    sinks = None if s_aux is None else s_aux.to(torch.float32)
    out = extend_attention(q_packed, k_new, v_new, k_cache, v_cache, table, cu, prefix,
                           window_left=from_hf(sliding_window or None), sinks=sinks,
                           softcap=float(softcap or 0.0), scale=scaling)
    if q_rows is not None:
        full = out.new_zeros(batch * num_queries, num_q_heads, head_dim_v)
        full[q_rows] = out
        out = full
    return out.view(batch, num_queries, num_q_heads, head_dim_v), None


def swattn_paged_attention(module, query, key, value, attention_mask, cache=None,
                           cu_seq_lens_q=None, cu_seq_lens_k=None, max_seqlen_q=None,
                           max_seqlen_k=None, read_index=None, write_index=None,
                           block_table=None, dropout=0.0, scaling=None, sliding_window=None,
                           softcap=None, s_aux=None, **kwargs):
    """``paged|swattn``: transformers' continuous batching. query/key/value ``[1, H, T, D]``
    (the step's packed tokens); returns ``([1, T, Hq, Dv], None)``."""
    if cache is None or read_index is None:
        raise ValueError("attn_implementation='paged|swattn' runs inside transformers' "
                         "continuous batching (its paged cache); use 'swattn' otherwise")
    if dropout and module.training:
        raise NotImplementedError("attn_implementation='swattn' runs no attention dropout")
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
                           window_left=from_hf(sliding_window or None),
                           sinks=None if s_aux is None else s_aux.to(torch.float32),
                           softcap=float(softcap or 0.0), scale=scaling)
    return out[None], None


def tested_version(version=None):
    """Whether ``version`` (default the installed transformers) is in the tested range."""
    major, minor = (int(x) for x in (version or transformers.__version__).split(".")[:2])
    return TESTED[0] <= (major, minor) <= TESTED[1]


AttentionInterface.register(NAME, swattn_attention)
AttentionMaskInterface.register(NAME, swattn_mask)
AttentionInterface.register(f"paged|{NAME}", swattn_paged_attention)
