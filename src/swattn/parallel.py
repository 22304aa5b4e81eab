"""Context parallelism for decode and extend: each rank of a torch.distributed process group
holds a shard of every sequence's KV cache, attends only to the keys it holds that a query's
window reaches, and the ranks merge their partial states with collectives.

Shard layouts (a token's global position ``p``):

* :class:`Interleaved` ``(size)``: runs of ``size`` tokens dealt round-robin, token ``p`` on
  rank ``(p // size) % world`` (vLLM's decode context parallelism, ``size`` its interleave);
* :class:`Contiguous` ``(chunk)``: rank ``r`` holds positions ``[r * chunk, (r + 1) * chunk)``.

A rank keeps its tokens in order in its own paged cache (local position ``j``, its own block
table). In both layouts the keys a query's window reaches, global ``[lo, p]``, are one run of
local positions on every rank, ``[local(lo), local(p + 1))``: the window decides which ranks
work. A rank attends to each query's run without sinks: decode with the decode kernel, one
query a row (:class:`ParallelPlan` says how the run is split between the kernel's window and
its sparse keys), extend (:func:`plan_extend`, every rank holding the chunk's queries and the
tokens it owns, prefix and new alike, each new token written by its owner) with the extend
kernel, each query row's run as its key range (``key_ranges``), so a key tile is read once for
a block of queries. A rank with no visible key for any query launches nothing and
contributes a neutral state (output 0, lse -inf).

Merging: every rank all-gathers the ranks' lse (``[world, T, Hq]`` float32, small) and weighs
its own output by ``e^{lse_r - lse}``, where ``lse`` joins every rank's and the sinks (applied
once, here). Then the weighted outputs are summed in one of two ways (the plan's ``merge``):

* ``"all-reduce"`` (the default): every rank ends with the whole result, moving
  ``2 (world - 1) / world`` outputs a rank (an all-gather of the outputs would move
  ``world - 1``: as many at two ranks, more from three on);
* ``"reduce-scatter"``: rank ``r`` ends with its share of the query heads,
  ``[r * Hq / world, (r + 1) * Hq / world)``, moving ``(world - 1) / world`` outputs a rank,
  half the all-reduce's: for an engine whose ranks hold the heads apart after attention
  (vLLM's decode context parallelism reduce-scatters so).

The plan carries the layout and the lengths: ``run`` builds the sparse index on the device
(no host sync). An fp8 cache (``kv_dtype``, its scales given to ``run``) is read by the same
kernels as on one GPU; the partial states stay float32 lse and outputs in the queries' dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .ops._validate import expect
from .plan._common import check_common, check_scales, resolve_device
from .plan.extend import check_key_ranges_path
from .window import check_chunk


@dataclass(frozen=True)
class Interleaved:
    """Runs of ``size`` tokens dealt round-robin over the ranks."""

    size: int = 1

    def local_len(self, n, rank, world):
        """How many of the positions ``[0, n)`` rank ``rank`` holds (``n`` a tensor or int)."""
        cycle = self.size * world
        rest = n % cycle - rank * self.size
        if isinstance(rest, torch.Tensor):
            rest = rest.clamp(0, self.size)
        else:
            rest = min(max(rest, 0), self.size)
        return n // cycle * self.size + rest

    def owner(self, p, world):
        return (p // self.size) % world


@dataclass(frozen=True)
class Contiguous:
    """Rank ``r`` holds positions ``[r * chunk, (r + 1) * chunk)``."""

    chunk: int

    def local_len(self, n, rank, world):
        rest = n - rank * self.chunk
        if isinstance(rest, torch.Tensor):
            return rest.clamp(0, self.chunk)
        return min(max(rest, 0), self.chunk)

    def owner(self, p, world):
        return p // self.chunk


def check_layout(layout):
    if isinstance(layout, Interleaved):
        if not isinstance(layout.size, int) or layout.size < 1:
            raise ValueError(f"Interleaved size must be an int >= 1, got {layout.size!r}")
    elif isinstance(layout, Contiguous):
        if not isinstance(layout.chunk, int) or layout.chunk < 1:
            raise ValueError(f"Contiguous chunk must be an int >= 1, got {layout.chunk!r}")
    else:
        raise TypeError(f"layout must be Interleaved or Contiguous, got {type(layout).__name__}")


MERGES = ("all-reduce", "reduce-scatter")


def _merge(part, lse, sinks, out, group, world, deterministic=False, scatter=False):
    """Every rank's partial state ``(part [N, Hq, Dv], lse [N, Hq])`` merged, sinks joining
    the denominator once: the lse all-gathered, each rank's output weighed by
    ``e^{lse_r - lse}`` and all-reduced, the whole output on every rank; or with
    ``scatter`` reduce-scattered, this rank's share of the heads ``[N, Hq / world, Dv]``.
    ``deterministic``: the weighted outputs added in rank order, the same bits whatever the
    collectives' algorithms (all-gathered, or with ``scatter`` each rank's share of them
    sent to it by an all-to-all)."""
    import torch.distributed as dist
    lses = [torch.empty_like(lse) for _ in range(world)]
    dist.all_gather(lses, lse.contiguous(), group=group)
    total = torch.logsumexp(torch.stack(lses), dim=0)  # [N, Hq]
    denom = total if sinks is None else torch.logaddexp(total, sinks.float()[None, :])
    weight = torch.where(lse == float("-inf"), 0.0, torch.exp(lse - denom))
    merged = part.float() * weight[..., None]
    if scatter:
        n, hq, dv = merged.shape
        # [world, N, Hq / world, Dv]: rank r's share of the heads at r.
        shares = merged.reshape(n, world, hq // world, dv).transpose(0, 1).contiguous()
        if deterministic:
            got = torch.empty_like(shares)
            dist.all_to_all_single(got, shares, group=group)
            merged = got[0]
            for other in got[1:]:
                merged = merged + other
        else:
            merged = torch.empty_like(shares[0])
            # (reduce_scatter_single is the name from torch 2.13 on)
            reduce_scatter = (getattr(dist, "reduce_scatter_single", None)
                              or dist.reduce_scatter_tensor)
            reduce_scatter(merged, shares.view(world * n, hq // world, dv), group=group)
    elif deterministic:
        parts = [torch.empty_like(merged) for _ in range(world)]
        dist.all_gather(parts, merged, group=group)
        merged = parts[0]
        for other in parts[1:]:
            merged = merged + other
    else:
        dist.all_reduce(merged, group=group)
    if out is None:
        return merged.to(part.dtype)
    if tuple(out.shape) != tuple(merged.shape):
        raise ValueError(f"out has shape {tuple(out.shape)}, the merge gives "
                         f"{tuple(merged.shape)}" + (" (this rank's share of the heads)"
                                                     if scatter else ""))
    return out.copy_(merged)


def plan_decode(seq_lens, *, group, layout, num_q_heads, num_kv_heads, head_dim,
                head_dim_v=None, page_size, window_left=None, softcap=0.0, scale=None,
                kv_dtype=None, dtype=torch.bfloat16, device=None, deterministic=False,
                merge="all-reduce", attention_chunk=None):
    """A context-parallel decode plan for this rank of ``group`` (a torch.distributed process
    group; every rank makes the same plan with the same global ``seq_lens``, host ints).
    ``layout``: :class:`Interleaved` or :class:`Contiguous`. ``deterministic``, ``merge``:
    see :class:`ParallelPlan`. The rest as :func:`swattn.plan_decode`'s (``kv_dtype``: an fp8
    cache, every rank's shard quantized with the same scales, given to ``run``)."""
    return _plan("decode", (seq_lens,), group=group, layout=layout, num_q_heads=num_q_heads,
                 num_kv_heads=num_kv_heads, head_dim=head_dim, head_dim_v=head_dim_v,
                 page_size=page_size, window_left=window_left, softcap=softcap, scale=scale,
                 kv_dtype=kv_dtype, dtype=dtype, device=device, deterministic=deterministic,
                 merge=merge, attention_chunk=attention_chunk)


def _plan(kind, lengths, *, group, layout, head_dim, head_dim_v, window_left, device,
          merge="all-reduce", attention_chunk=None, **rest):
    totals, seq, pos = _queries(*lengths)
    rank, world = _check(group, layout, totals, window_left)
    check_chunk(attention_chunk)
    device = resolve_device(device)
    if merge not in MERGES:
        raise ValueError(f"merge must be one of {MERGES}, got {merge!r}")
    if merge == "reduce-scatter" and rest["num_q_heads"] % world:
        raise ValueError(f"merge='reduce-scatter' deals the query heads over the ranks: "
                         f"{rest['num_q_heads']} heads do not divide among {world}")
    # Checked on every rank: a rank that launches nothing must refuse what the others do,
    # or it would wait in the merge's collectives for ranks that raised.
    kv_dtype = rest.get("kv_dtype")
    check_common(rest["num_q_heads"], rest["num_kv_heads"], head_dim,
                 head_dim if head_dim_v is None else head_dim_v, rest["page_size"],
                 rest["softcap"], rest["scale"], rest["dtype"], kv_dtype, None, "tight")
    if kind == "extend":
        check_key_ranges_path(rest["num_q_heads"], rest["num_kv_heads"], head_dim, head_dim_v,
                              rest["page_size"], kv_dtype, rest["dtype"], device,
                              rest["fp8_products"])
    return ParallelPlan(seq, pos, totals, group=group, layout=layout, rank=rank, world=world,
                        head_dim=head_dim,
                        head_dim_v=head_dim if head_dim_v is None else head_dim_v,
                        window_left=window_left, device=device, kind=kind,
                        scatter=merge == "reduce-scatter", attention_chunk=attention_chunk,
                        **rest)


def _queries(*lengths):
    """``(total lengths, seq, pos)``: every query's sequence and global position, from
    ``(seq_lens,)`` (decode: one query a sequence at its last position, -1 for an empty
    one) or ``(prefix_lens, extend_lens)`` (extend: one a new token)."""
    if len(lengths) == 1:
        lens = _host_lens("seq_lens", lengths[0])
        return lens, list(range(len(lens))), [n - 1 for n in lens]
    prefix = _host_lens("prefix_lens", lengths[0])
    new = _host_lens("extend_lens", lengths[1])
    if len(prefix) != len(new):
        raise ValueError(f"prefix_lens and extend_lens differ in length ({len(prefix)} and "
                         f"{len(new)})")
    seq, pos = [], []
    for b, (a, n) in enumerate(zip(prefix, new)):
        seq += [b] * n
        pos += range(a, a + n)
    return [a + n for a, n in zip(prefix, new)], seq, pos


def _host_lens(name, values):
    lens = [int(x) for x in (values.tolist() if isinstance(values, torch.Tensor) else values)]
    if any(x < 0 for x in lens):
        raise ValueError(f"{name} must be >= 0")
    return lens


def _check(group, layout, total_lens, window_left):
    """``(rank, world)`` of ``group`` once the layout, the sequences' total lengths and the
    window are checked."""
    import torch.distributed as dist
    check_layout(layout)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if isinstance(layout, Contiguous) and total_lens and max(total_lens) > world * layout.chunk:
        raise ValueError(f"a sequence of {max(total_lens)} tokens does not fit {world} ranks of "
                         f"{layout.chunk} (Contiguous chunk)")
    if window_left is not None and (not isinstance(window_left, int) or window_left < 0):
        raise ValueError(f"window_left must be an int >= 0 or None, got {window_left!r}")
    return rank, world


def run_bounds(layout, n, rank, world):
    """``(fewest, most)`` positions rank ``rank`` holds among any ``n`` consecutive ones (a
    full window of ``n`` keys): over one period of an interleaved layout; for contiguous
    chunks ``(0, min(n, chunk))`` (a window can miss a chunk)."""
    if isinstance(layout, Contiguous):
        return 0, min(n, layout.chunk)
    counts = [layout.local_len(a + n, rank, world) - layout.local_len(a, rank, world)
              for a in range(layout.size * world)]
    return min(counts), max(counts)


class ParallelPlan:
    """One batch's decode, or one chunk's extend (prefill), across the ranks of ``group``:
    made by :func:`plan_decode` (a query a sequence, at its last position) or
    :func:`plan_extend` (a query a new token).

    Query ``t`` (global position ``p``) sees the global keys ``[lo, p]`` (``lo = p -
    window_left``, or 0, raised to its chunk's first position under ``attention_chunk``),
    one run of local positions ``[first_t, end_t)`` on this rank.

    Extend: the extend kernel over this rank's cache (``keys="prefix"``, its local keys of
    each sequence, prefix and new), each query row seeing its own run (``key_ranges``). The
    query rows are the plan's ``capacity``: the last sequence's rows run on to it, seeing no
    key, so a replanned batch of fewer tokens needs no other launch.

    Decode: the run is attended to by the decode kernel, a query a row: its last ``m`` keys
    as the kernel's window (``seq_len = end_t``, ``window_left = m - 1``) and the rest
    ``[first_t, end_t - m)`` as sparse keys. ``m`` is the fewest keys this rank holds in any
    full window (:func:`run_bounds`), so every run is at least that long (a window reaching
    position 0 is cut there by the kernel too), and the sparse width is bounded by the layout
    alone: at most about twice the interleave size in an interleaved layout; contiguous
    chunks (``m`` = 0) take the run whole as sparse keys. Without a window every run starts
    at 0 and the kernel's window holds it whole. Queries with no key here get ``seq_len`` 0
    and no sparse key; a rank with none for any query launches nothing.

    The widths depend on the layout and the window only, so :meth:`replan` writes the next
    batch's lengths into the plan's buffers in place and a CUDA graph of :meth:`run` (NCCL)
    replays with them.

    ``deterministic``: the outputs merged in rank order (all-gathered, ``world - 1`` outputs
    a rank instead of the all-reduce's ``2 (world - 1) / world``), so a fixed group size
    gives the same bits run after run whatever the collectives' algorithms.

    ``merge="reduce-scatter"`` (``scatter``): :meth:`run` returns this rank's share of the
    query heads, ``[T, Hq / world, Dv]``, heads ``[rank * Hq / world, (rank + 1) * Hq /
    world)``, moving half the all-reduce's bytes. With ``deterministic=True`` the shares
    are exchanged by an all-to-all (the same ``(world - 1) / world`` outputs a rank) and
    added in rank order.

    Attributes: ``launched`` (whether this rank runs the kernel), ``keys`` (the (query, key)
    pairs it attends to), ``sparse_keys`` (the sparse index's width), ``capacity`` (the
    query rows: sequences for decode, new tokens for extend)."""

    def __init__(self, seq, pos, totals, *, group, layout, rank, world, num_q_heads,
                 num_kv_heads, head_dim, head_dim_v, page_size, window_left, softcap, scale,
                 dtype, device, kv_dtype=None, deterministic=False, kind="decode",
                 fp8_products=False, scatter=False, attention_chunk=None):
        """``seq``, ``pos``: each query's sequence and global position (host ints; -1: a
        query with no key); ``totals``: each sequence's global length; ``kind``: "decode"
        or "extend" (what :meth:`replan` takes)."""
        import swattn
        self.group, self.world, self.deterministic = group, world, deterministic
        self.scatter = scatter
        self.dtype, self.kv_dtype = dtype, dtype if kv_dtype is None else kv_dtype
        self.kind = kind
        self.layout, self.rank, self.window_left = layout, rank, window_left
        self.attention_chunk = attention_chunk
        self.num_q_heads, self.head_dim_v, self.page_size = num_q_heads, head_dim_v, page_size
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        index = resolve_device(device)
        self._index = index.index if index.type == "cuda" else -1  # as the plans' (expect)
        self.capacity = self.tokens = len(pos)
        self.totals = totals
        self.inner = None
        if kind == "extend":
            self.m, self.sparse_keys = None, 0
            ranges, self.keys = self._ranges(pos)
            self.launched = bool(self.keys)
            if self.launched:
                self._plan_extend(seq, ranges, num_q_heads=num_q_heads,
                                  num_kv_heads=num_kv_heads, head_dim=head_dim,
                                  head_dim_v=head_dim_v, page_size=page_size, softcap=softcap,
                                  scale=scale, kv_dtype=kv_dtype, dtype=dtype, device=device,
                                  fp8_products=fp8_products)
            return
        # The most keys a query sees: its window's, cut by its chunk.
        span = None if window_left is None else window_left + 1
        if attention_chunk is not None:
            span = attention_chunk if span is None else min(span, attention_chunk)
        if span is None:
            self.m, self.sparse_keys = None, 0  # the kernel's window holds every run
        else:
            fewest, most = run_bounds(layout, span, rank, world)
            if attention_chunk is not None:
                # A chunk's first position cuts a run anywhere: every run as sparse keys.
                fewest = 0
            self.m, self.sparse_keys = fewest, most - fewest
        lens, first, rest, has, self.keys = self._runs(seq, pos)
        self.launched = bool(has.any())
        if not self.launched:
            return
        self.inner = swattn.plan_decode(
            lens, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
            head_dim_v=head_dim_v, page_size=page_size,
            window_left=None if not self.m else self.m - 1, softcap=softcap, scale=scale,
            return_lse=True, sparse_keys=self.sparse_keys, kv_dtype=kv_dtype, dtype=dtype,
            device=device)
        self.first = first.to(torch.int32).to(device)
        self.rest = rest.to(torch.int32).to(device)
        self.offsets = torch.arange(max(self.sparse_keys, 1), dtype=torch.int32, device=device)

    def _plan_extend(self, seq, ranges, *, num_kv_heads, head_dim, dtype, device, **sizes):
        """The extend kernel's plan over this rank's cache: a sequence's keys are its local
        ones, each query row's the run ``ranges`` gives (``[2, capacity]``, host)."""
        from .plan.extend import plan_key_ranges
        cu, local = self._extend_lengths(seq)
        self.key_ranges = ranges.to(torch.int32).to(device)
        self.inner = plan_key_ranges(cu, local, tuple(self.key_ranges),
                                     num_kv_heads=num_kv_heads, head_dim=head_dim,
                                     max_tokens=self.capacity, dtype=dtype, device=device,
                                     **sizes)
        # The extend kernel reads no new keys (keys="prefix"): its k and v are one row seen
        # at every token.
        self.no_keys = tuple(torch.empty(1, num_kv_heads, d, dtype=dtype, device=device)
                             .expand(self.capacity, num_kv_heads, d)
                             for d in (head_dim, self.head_dim_v))

    def _extend_lengths(self, seq):
        """``(cu_seqlens, local key counts)`` of the extend kernel: each sequence's queries
        (the last one's running on to ``capacity``) and the keys this rank holds of it."""
        counts = [0] * len(self.totals)
        for b in seq:
            counts[b] += 1
        cu = [0]
        for n in counts:
            cu.append(cu[-1] + n)
        cu[-1] = self.capacity
        local = [int(self.layout.local_len(n, self.rank, self.world)) for n in self.totals]
        return cu, local

    def _ranges(self, pos):
        """``([2, capacity] host tensor, keys)``: each query's run of local positions
        ``[first, end)`` (``[0, 0)`` where it holds none here, and for the rows past the
        batch) and the (query, key) pairs this rank attends to."""
        first, end, has = self._spans(pos)
        ranges = torch.zeros(2, self.capacity, dtype=torch.int64)
        ranges[0, :len(pos)] = torch.where(has, first, 0)
        ranges[1, :len(pos)] = torch.where(has, end, 0)
        return ranges, int((ranges[1] - ranges[0]).sum())

    def _spans(self, pos):
        """Each query's run of local positions ``[first, end)`` (host tensors) and whether
        it holds a key."""
        p = torch.tensor(pos, dtype=torch.int64)
        w, chunk = self.window_left, self.attention_chunk
        lo = (p - w).clamp_min(0) if w is not None else torch.zeros_like(p)
        if chunk is not None:
            lo = torch.maximum(lo, p.clamp_min(0) // chunk * chunk)
        first = self.layout.local_len(lo, self.rank, self.world)
        end = self.layout.local_len(p + 1, self.rank, self.world)
        return first, end, end > first

    def _runs(self, seq, pos):
        """Decode's host tensors of the queries ``(seq, pos)``: the kernel's lengths (a
        list), the sparse keys' first local position and count, which queries have keys
        here, and the (query, key) pairs."""
        first, end, has = self._spans(pos)
        run = (end - first).clamp_min(0)
        if self.m is None:  # no window: [0, end) through the kernel's window
            rest, lens = torch.zeros_like(run), torch.where(has, end, 0)
        else:
            rest = torch.where(has, (run - self.m).clamp_min(0), 0)
            lens = torch.where(has, end, 0) if self.m else torch.zeros_like(end)
        assert (int(rest.max()) if rest.numel() else 0) <= self.sparse_keys  # run_bounds
        return lens.tolist(), first, rest, has, int(run.sum())

    def replan(self, *lengths):
        """The next batch's lengths, written into the plan's buffers in place (no host sync):
        ``replan(seq_lens)`` for a decode plan, ``replan(prefix_lens, extend_lens)`` for an
        extend plan; at most ``capacity`` query rows, the rest padded with queries that see
        no key (output 0): :meth:`run` keeps taking ``capacity`` rows of queries. A CUDA
        graph captured from :meth:`run` then replays with them."""
        if len(lengths) != (1 if self.kind == "decode" else 2):
            raise TypeError(f"a {self.kind} plan replans with "
                            + ("(seq_lens)" if self.kind == "decode" else
                               "(prefix_lens, extend_lens)"))
        totals, seq, pos = _queries(*lengths)
        _check(self.group, self.layout, totals, self.window_left)
        if len(pos) > self.capacity:
            raise ValueError(f"replan with {len(pos)} queries: the plan holds {self.capacity}")
        if self.kind == "extend":
            ranges, keys = self._ranges(pos)
            if not self.launched:
                if keys:
                    raise ValueError(self._IDLE)
                return
            self.totals, self.keys = totals, keys
            self.inner.replan(*self._extend_lengths(seq))
            self.key_ranges.copy_(ranges.to(torch.int32), non_blocking=True)
            return
        self._replan(seq, pos)

    _IDLE = ("this rank held no visible key when the plan was made, so it launches nothing: "
             "make a new plan for these lengths")

    def _replan(self, seq, pos):
        pad = self.capacity - len(pos)
        seq, pos = list(seq) + [0] * pad, list(pos) + [-1] * pad  # padded rows see no key
        lens, first, rest, has, self.keys = self._runs(seq, pos)
        if not self.launched:
            if has.any():
                raise ValueError(self._IDLE)
            return
        self.inner.replan(lens)
        self.first.copy_(first.to(torch.int32), non_blocking=True)
        self.rest.copy_(rest.to(torch.int32), non_blocking=True)

    def run(self, q, k_cache, v_cache, block_table, *, sinks=None, k_scale=None, v_scale=None,
            out=None):
        """This rank's part of the attention merged with the other ranks': every rank returns
        the whole ``out [T, Hq, Dv]`` (decode: T = B), or under ``merge="reduce-scatter"``
        its share of the heads ``[T, Hq / world, Dv]`` (``out``, if given, of that shape).
        ``q``: the queries (the same on every rank); ``k_cache``/``v_cache``/``block_table``:
        this rank's cache, holding every token of the sequences this rank owns (decode's new
        one, and extend's prefix and new tokens, written by their owners) at local
        positions; ``k_scale``/``v_scale``: an fp8 cache's scales (as
        :func:`swattn.decode_attention`'s, the same on every rank). No host sync."""
        part, lse = self.partial(q, k_cache, v_cache, block_table, k_scale=k_scale,
                                 v_scale=v_scale)
        return self.merge(part, lse, sinks=sinks, out=out)

    def merge(self, part, lse, *, sinks=None, out=None):
        """Every rank's :meth:`partial` state merged (the collectives of :meth:`run`), sinks
        (all ``Hq`` of them) applied once: the whole output on every rank, or under
        ``merge="reduce-scatter"`` this rank's share of the heads (``out``, if given, of the
        shape :meth:`run` returns)."""
        return _merge(part, lse, sinks, out, self.group, self.world, self.deterministic,
                      self.scatter)

    def partial(self, q, k_cache, v_cache, block_table, *, k_scale=None, v_scale=None):
        """This rank's partial state alone, ``(out [T, Hq, Dv], lse [T, Hq])`` without sinks
        (output 0 and lse -inf where it holds no visible key), for a caller's own merge
        (``swattn.merge_states``' rule)."""
        if self.launched and self.kind == "extend":
            part, lse = self.inner.run(q, *self.no_keys, k_cache, v_cache, block_table,
                                       k_scale=k_scale, v_scale=v_scale)
        elif self.launched:
            rows = block_table  # (a padded query reads no page)
            sparse = None
            if self.sparse_keys:
                k = self.offsets[None, :self.sparse_keys]
                local = self.first[:, None] + k  # [T, K]
                page = torch.gather(rows, 1, (local // self.page_size).clamp_max(
                    rows.shape[1] - 1).to(torch.int64))
                idx = torch.where(k < self.rest[:, None], page * self.page_size
                                  + local % self.page_size, -1).to(torch.int32)
                sparse = (k_cache.view(-1, *k_cache.shape[2:]),
                          v_cache.view(-1, *v_cache.shape[2:]), idx)
            part, lse = self.inner.run(q, k_cache, v_cache, rows, sparse=sparse, k_scale=k_scale,
                                       v_scale=v_scale)
        else:  # no key of this rank is visible to any query: no launch, a neutral state
            self._check_idle(q, k_cache, v_cache, k_scale, v_scale)
            part = torch.zeros(self.tokens, self.num_q_heads, self.head_dim_v, dtype=q.dtype,
                               device=q.device)
            lse = torch.full((self.tokens, self.num_q_heads), float("-inf"), dtype=torch.float32,
                             device=q.device)
        return part, lse

    def _check_idle(self, q, k_cache, v_cache, k_scale, v_scale):
        """A rank that launches nothing checks a run's tensors with the plans' own checks
        (ops._validate.expect, plan._common.check_scales), so it refuses what the launching
        ranks' plans refuse (before the merge's collectives, where it would wait for them)."""
        expect("q", q, self.dtype, self._index, (self.num_q_heads, self.head_dim), 1)
        expect("k_cache", k_cache, self.kv_dtype, self._index,
               (self.page_size, self.num_kv_heads, self.head_dim), 1)
        expect("v_cache", v_cache, self.kv_dtype, self._index,
               (k_cache.shape[0], self.page_size, self.num_kv_heads, self.head_dim_v))
        check_scales(k_scale, v_scale, self.kv_dtype, self.num_kv_heads, self._index)


def plan_extend(prefix_lens, extend_lens, *, group, layout, num_q_heads, num_kv_heads, head_dim,
                head_dim_v=None, page_size, window_left=None, softcap=0.0, scale=None,
                kv_dtype=None, dtype=torch.bfloat16, device=None, deterministic=False,
                fp8_products=False, merge="all-reduce", attention_chunk=None):
    """A context-parallel extend plan for this rank of ``group``: one chunk of
    ``extend_lens[b]`` new tokens after ``prefix_lens[b]`` cached ones a sequence (host ints,
    the same on every rank). ``layout``: :class:`Interleaved` or :class:`Contiguous`, dealing
    the prefix and the new tokens alike. ``deterministic``, ``merge``: see
    :class:`ParallelPlan`. The rest as :func:`swattn.plan_extend`'s (causal; ``kv_dtype`` as
    :func:`plan_decode`'s; ``fp8_products``: over an fp8 cache, the opt-in fp8 products of
    the Hopper path)."""
    return _plan("extend", (prefix_lens, extend_lens), group=group, layout=layout,
                 num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                 head_dim_v=head_dim_v, page_size=page_size, window_left=window_left,
                 softcap=softcap, scale=scale, kv_dtype=kv_dtype, dtype=dtype, device=device,
                 deterministic=deterministic, fp8_products=fp8_products, merge=merge,
                 attention_chunk=attention_chunk)
