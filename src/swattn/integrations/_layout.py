"""A batch of transformers' keys (``[B, Hkv, L, D]``, padded or not) as swattn's packed rows
and block table of one-token pages: the layouts the transformers integration hands to
swattn's extend kernel."""

from typing import NamedTuple

import torch


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


class _Layout(NamedTuple):
    """One batch's layout (device tensors): the rows of the packed queries and new keys (None
    without padding: every row), ``cu_seqlens``, ``prefix_lens``, the block table of one-token
    pages, and per sequence its first valid key among those handed over and its valid keys."""

    q_rows: torch.Tensor | None
    k_rows: torch.Tensor | None
    cu: torch.Tensor
    prefix: torch.Tensor
    table: torch.Tensor
    first_key: torch.Tensor
    keys: torch.Tensor


def _layout(spans, batch, num_keys, num_queries, device, shifts=None):
    """The :class:`_Layout` of a padded batch, from its spans. ``shifts`` (chunked attention,
    DeepSeek-V4): per row, where its first valid key stands in its positions' count, less its
    place among the keys (the row's prefix begins with that many entries -1)."""
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
    as_dev = lambda values, dtype=torch.int32: torch.tensor(values, dtype=dtype).to(device)  # noqa: E731
    return _Layout(as_dev(q_rows, torch.int64), as_dev(k_rows, torch.int64), as_dev(cu),
                   as_dev(prefix), table.to(device), as_dev([s[0] for s in spans]),
                   as_dev([s[1] + s[2] for s in spans]))


def padded_layout(padding, entry, num_keys, num_queries, device):
    """:func:`_layout` of a padded batch, read from its mask by the forward's first layer
    and kept in ``entry.layouts`` for the others (per query count: KV-shared layers take the
    last queries only); ``entry.shifts``: as :func:`_layout`'s."""
    key = (num_keys, num_queries)
    if key not in entry.layouts:
        entry.layouts[key] = _layout(_spans(padding, num_keys, num_queries), padding.shape[0],
                                     num_keys, num_queries, device, entry.shifts)
    return entry.layouts[key]


def uniform_layout(batch, num_keys, num_queries, device):
    """The :class:`_Layout` of a batch without padding, made on the device (no host read)."""
    p = num_keys - num_queries
    cu = torch.arange(0, (batch + 1) * num_queries, num_queries, dtype=torch.int32, device=device)
    prefix = torch.full((batch,), p, dtype=torch.int32, device=device)
    table = (torch.arange(batch, dtype=torch.int32, device=device)[:, None] * num_keys
             + torch.arange(max(p, 1), dtype=torch.int32, device=device)[None])
    return _Layout(None, None, cu, prefix, table, torch.zeros_like(prefix),
                   torch.full_like(prefix, num_keys))
