"""DeepSeek-V4's compressed entries and DeepSeek-V3.2's selected keys as swattn's second key
source (:class:`swattn.SecondKeys`), for the transformers integration.

DeepSeek-V4 (``deepseek_v4``): every layer attends a window of its own keys (K = V, one KV head,
sinks); a CSA or HCA layer's compressor appends its compressed entries after the window's keys
and extends the layer's mask over them with a per-query bias (CSA: the indexer's top-k; HCA:
entry ``e`` visible to the query at ``p`` iff ``e < (p + 1) // rate``; no bias in decode, where
HCA shows every entry). The entries become a second paged cache of one page a sequence: CSA at
its rate with index lists (the bias's selected entries), HCA at its rate without (prefill) or at
rate 1 (decode: every entry, as ``e < T <= p + 1``).

DeepSeek-V3.2 (``deepseek_v32``): each query attends its indexer's top-k keys among all the
layer's keys (``indices=``, ``[B, S, k]``), within causality and padding. The keys themselves
are the second source (rate 1, no window), indexed from each row's first valid key.
"""

import torch

from ..plan.second import SecondKeys
from ._paged import token_rows

V4 = "deepseek_v4"
V32 = "deepseek_v32"


def model_type(module):
    return getattr(getattr(module, "config", None), "model_type", None)


def _row_view(x, batch, num_queries, q_rows):
    """``x`` [B, S, ...] as the packed rows [rows, ...] (a padded batch's valid queries)."""
    flat = x.reshape(batch * num_queries, *x.shape[2:])
    return flat if q_rows is None else flat[q_rows]


def _row_positions(layout, rows):
    """Each packed row's position (its sequence's prefix plus its place among the new
    tokens) and its sequence, on the device."""
    seq, i = token_rows(layout.cu, rows)
    return layout.prefix.to(torch.int64)[seq] + i, seq


def selected_keys(indices, layout, k_cache, v_cache, num_queries):
    """DeepSeek-V3.2: the rows attend their indexer's picks among the layer's keys.
    ``indices`` [B, S, k] index the keys handed over (a padded row's padding included);
    they are moved to the row's valid keys (``first_key`` on), padding picks becoming -1, and
    the limit ``e < p + 1`` (rate 1) drops the picks past the query (the indexer fills k
    with masked keys where a query sees fewer)."""
    batch = layout.first_key.shape[0]
    num_keys = k_cache.shape[0] // batch
    rows = _row_view(indices, batch, num_queries, layout.q_rows).to(torch.int64)
    _, seq = _row_positions(layout, rows.shape[0])
    first = layout.first_key.to(torch.int64)
    picks = rows - first[seq][:, None]
    picks = torch.where((rows >= 0) & (picks >= 0), picks, -1).to(torch.int32)
    cols = torch.arange(num_keys, device=first.device)
    table = torch.arange(batch, device=first.device)[:, None] * num_keys + first[:, None] + cols
    table = torch.where(cols[None] < layout.keys[:, None], table, -1).to(torch.int32)
    return SecondKeys(k_cache, table, layout.keys, rate=1, indices=picks, values=v_cache,
                      window=False)


def compressed_entries(module, entries, visible, layout, num_queries, left_padded):
    """DeepSeek-V4: a CSA or HCA layer's compressed entries ``entries`` [B, T, D] as a second
    source of one page a sequence, ``visible`` [B, S, T] (bool) the entries the model's mask
    shows each query. Where a row is left-padded, the entries swattn's positions (counted
    from the row's first token, as generate's ``position_ids``) show each query are checked
    to be those (one host read); a NotImplementedError where they are not."""
    compressor = module.compressor
    batch, count, head_dim = entries.shape
    device = entries.device
    vis = _row_view(visible, batch, num_queries, layout.q_rows)
    indices = None
    if hasattr(compressor, "indexer"):
        rate = compressor.compress_rate
        k = min(compressor.indexer.index_topk, count)
        # The selected entries first (a stable sort keeps them in order), then -1s.
        flags, order = torch.sort(vis.to(torch.uint8), dim=-1, descending=True, stable=True)
        indices = torch.where(flags[:, :k] > 0, order[:, :k], -1).to(torch.int32)
    else:
        # HCA: the compressor's causal bias in prefill; in decode (one query) every entry.
        rate = compressor.compress_rate if num_queries > 1 else 1
    if left_padded:
        positions, _ = _row_positions(layout, vis.shape[0])
        shown = (torch.arange(count, device=device)[None]
                 < torch.div(positions + 1, rate, rounding_mode="floor")[:, None])
        if indices is not None:
            shown &= vis
        if not torch.equal(shown, vis):
            raise NotImplementedError(
                "DeepSeek-V4 under attn_implementation='swattn': the compressed entries the "
                "model's mask shows a left-padded row are not those of its positions counted "
                "from its first token (generate's position_ids): a forward without "
                "position_ids counts the padding, and a decode step shows every entry, also "
                "those of a row's padding; pass position_ids=attention_mask.cumsum(-1) - 1, or "
                "use attn_implementation='eager'")
    cache = entries.reshape(batch, count, 1, head_dim)
    table = torch.arange(batch, dtype=torch.int32, device=device)[:, None]
    held = torch.full((batch,), count, dtype=torch.int32, device=device)
    return SecondKeys(cache, table, held, rate=rate, indices=indices)
