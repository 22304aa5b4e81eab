"""Inputs of the V4 rows of ``swattn bench`` (a window and a second key source: V4-CSA,
V4-HCA decode, V4-X extend) and their reference check.

A row is a decode sequence's new token (at ``S - 1``, ``S`` keys cached) or an extend's new
token (at ``P + i``, ``P`` keys cached, the chunk's keys in ``k``). Built on the device:

* the sliding cache: only the pages that hold some row's window (the pages below it are -1
  in the block table, as an engine's window cache keeps them), in a random permutation of a
  pool led by a NaN page; its rows nobody wrote (before the window in its first page, past
  the end in its last) NaN;
* the compressed cache: ``held`` entries a sequence (the tokens' count // rate), in pages of
  the same size in a random permutation, every row past ``held`` NaN, the block-table
  columns past the last held page -1;
* CSA's index lists: each row ``topk`` distinct entries drawn at random below its limit
  (``window.second_limit``), -1 where fewer are closed; HCA's rows take every closed entry;
* K = V: the values are the keys (one tensor, passed as both caches), random queries and
  sinks.

The reference (float64, ``swattn.reference``) covers the first :data:`CHECK_ROWS` rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..window import decode_first_key

CHECK_ROWS = 4  # decode: sequences; extend: 8 x this many new tokens of the first sequence


@dataclass
class SecondInputs:
    """One V4 case's tensors (see the module docstring). ``rows`` are decode's sequences or
    the extend's new tokens; ``k`` (extend only) the new tokens' keys ``[rows, Hkv, D]``,
    also their values; ``cu_seqlens``/``prefix_lens`` the extend's lengths (None in
    decode); ``source`` the :class:`swattn.SecondKeys` of the case."""

    case: object
    q: torch.Tensor
    k_cache: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor | None
    cu_seqlens: torch.Tensor | None
    prefix_lens: torch.Tensor | None
    k: torch.Tensor | None
    source: object
    sinks: torch.Tensor | None

    @property
    def extend(self):
        return self.k is not None

    def row_positions(self):
        """``[(cached, pos)]`` of every row (host ints)."""
        case = self.case
        if not self.extend:
            return [(s, s - 1) for s in case.seq_lens]
        return [(p, q) for p, e in case.seqs for q in range(p, p + e)]


def _lengths(case):
    """``(per-sequence (first window key, tokens), rows)`` of a case."""
    if getattr(case, "kind", "") == "decode":
        return [(decode_first_key(s, case.window_left), s) for s in case.seq_lens], case.batch
    return ([(decode_first_key(p + 1, case.window_left), p) for p, _ in case.seqs],
            sum(e for _, e in case.seqs))


def _paged(spans, page_size, rows_per_token, randn, gen_seed):
    """A paged cache holding each sequence's positions ``[lo, hi)`` (``spans``), the rest of
    its pages -1 in the table, page 0 a NaN page: ``(cache, table)``."""
    firsts = [lo // page_size for lo, _ in spans]
    ends = [-(-hi // page_size) for _, hi in spans]
    width = max(max(ends, default=0), 1)
    live = sum(e - f for f, e in zip(firsts, ends))
    order = torch.randperm(live, generator=torch.Generator().manual_seed(gen_seed)) + 1
    table = torch.full((len(spans), width), -1, dtype=torch.int32)
    taken = 0
    for b, (first, end) in enumerate(zip(firsts, ends)):
        table[b, first:end] = order[taken:taken + end - first].to(torch.int32)
        taken += end - first
    cache = randn(1 + live, page_size, *rows_per_token)
    cache[0] = float("nan")
    flat = cache.view(-1, *rows_per_token)
    for b, (lo, hi) in enumerate(spans):
        for pos in list(range(firsts[b] * page_size, lo)) + list(range(hi, ends[b] * page_size)):
            flat[int(table[b, pos // page_size]) * page_size + pos % page_size] = float("nan")
    return cache, table.to(cache.device)


def _index_lists(limits, topk, gen, device):
    """``[rows, topk]`` int32: each row ``topk`` distinct entries below its limit in random
    order, -1 past the row's count."""
    limits = torch.tensor(limits, dtype=torch.int64, device=device)
    width = max(int(limits.max()), topk, 1)
    keys = torch.rand(limits.shape[0], width, generator=gen, device=device)
    columns = torch.arange(width, device=device)
    keys = torch.where(columns[None, :] < limits[:, None], keys, 2.0)  # closed entries first
    picks = keys.argsort(dim=1)[:, :topk]
    return torch.where(picks < limits[:, None], picks, -1).to(torch.int32)


def build_inputs(case, device="cuda", seed=0, dtype=torch.bfloat16):
    """The tensors of a V4 ``case`` on ``device`` (see :class:`SecondInputs`)."""
    import swattn

    from ..window import second_limit
    gen = torch.Generator(device=device).manual_seed(seed)
    hkv, d, source = case.num_kv_heads, case.head_dim, case.second

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=dtype)

    windows, rows = _lengths(case)
    extend = getattr(case, "kind", "") != "decode"
    k_cache, table = _paged(windows, case.page_size, (hkv, d), randn, seed)
    tokens = list(case.seq_lens) if not extend else [p + e for p, e in case.seqs]
    held = [source.held(n) for n in tokens]
    x_cache, x_table = _paged([(0, h) for h in held], case.page_size, (hkv, d), randn, seed + 1)
    if extend:
        positions = [(b, q) for b, (p, e) in enumerate(case.seqs) for q in range(p, p + e)]
    else:
        positions = [(b, s - 1) for b, s in enumerate(case.seq_lens)]
    limits = [second_limit(q, source.rate, held[b]) for b, q in positions]
    indices = _index_lists(limits, source.topk, gen, device) if source.topk else None
    entries = torch.tensor(held, dtype=torch.int32, device=device)
    second = swattn.SecondKeys(x_cache, x_table, entries, rate=source.rate, indices=indices)
    q = randn(rows, case.num_q_heads, d)
    sinks = (torch.randn(case.num_q_heads, generator=gen, device=device, dtype=torch.float32)
             if case.sinks else None)
    if not extend:
        seq_lens = torch.tensor(case.seq_lens, dtype=torch.int32, device=device)
        return SecondInputs(case, q, k_cache, table, seq_lens, None, None, None, second, sinks)
    cu = [0]
    for _, e in case.seqs:
        cu.append(cu[-1] + e)
    prefix = torch.tensor([p for p, _ in case.seqs], dtype=torch.int32, device=device)
    return SecondInputs(case, q, k_cache, table, None,
                        torch.tensor(cu, dtype=torch.int32, device=device), prefix,
                        randn(rows, hkv, d), second, sinks)


def quantized(inputs, fp8=torch.float8_e4m3fn):
    """An fp8 copy of both caches under one scale a KV head, calibrated over both (the
    largest magnitude maps to the format's largest value) and shared, as the engine's main
    and compressed caches share it: ``(k8, second8, scale)``."""
    import swattn

    from .. import reference
    source = inputs.source
    amax = torch.stack([x.float().nan_to_num(0.0).abs().amax(dim=(0, 1, 3))
                        for x in (inputs.k_cache, source.cache)]).amax(0)
    scale = (amax.clamp_min(1e-6) / torch.finfo(fp8).max).to(torch.float32)
    second8 = swattn.SecondKeys(reference.quantize(source.cache, scale, fp8),
                                source.block_table, source.entries, rate=source.rate,
                                indices=source.indices)
    return reference.quantize(inputs.k_cache, scale, fp8), second8, scale


def reference_rows(inputs, *, sinks=True, k_cache=None, second=None, scale=None):
    """The float64 reference of the first rows (decode: :data:`CHECK_ROWS` sequences;
    extend: the first ``8 * CHECK_ROWS`` new tokens of the first sequence, whose keys are
    the cache's and those new tokens'), over ``k_cache`` and ``second`` (default the
    case's; an fp8 copy with its ``scale``). ``sinks=False`` drops the sinks."""
    import swattn

    from .. import reference
    k_cache = inputs.k_cache if k_cache is None else k_cache
    second = inputs.source if second is None else second
    sink = inputs.sinks if sinks else None
    if not inputs.extend:
        seqs = rows = slice(0, min(CHECK_ROWS, inputs.case.batch))
    else:
        n = min(8 * CHECK_ROWS, inputs.case.seqs[0][1])
        seqs, rows = slice(0, 1), slice(0, n)
    part = swattn.SecondKeys(second.cache, second.block_table[seqs], second.entries[seqs],
                             rate=second.rate,
                             indices=None if second.indices is None else second.indices[rows])
    common = dict(window_left=inputs.case.window_left, sinks=sink, second=part, k_scale=scale,
                  v_scale=scale)
    if not inputs.extend:
        return reference.decode_attention(inputs.q[rows], k_cache, k_cache,
                                          inputs.block_table[seqs], inputs.seq_lens[seqs],
                                          **common)
    cu = torch.tensor([0, rows.stop], dtype=torch.int32, device=inputs.q.device)
    k = inputs.k[rows]
    return reference.extend_attention(inputs.q[rows], k, k, k_cache, k_cache,
                                      inputs.block_table[seqs], cu, inputs.prefix_lens[seqs],
                                      **common)


def reference_first(inputs, sinks=True, sparse=True):
    """The harness's reference (``sparse`` has no meaning here: the second source is the
    case's function, and every variant that runs applies it)."""
    del sparse
    return reference_rows(inputs, sinks=sinks)
