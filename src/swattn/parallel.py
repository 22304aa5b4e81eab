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
work. A rank attends to each query's run with the decode kernel, one query a row, without
sinks (:class:`ParallelPlan` says how the run is split between the kernel's window and its
sparse keys); a rank with no visible key for any query launches nothing and contributes a
neutral state (output 0, lse -inf). Decode is one query a sequence at its last position;
extend (:func:`plan_extend`) has every rank hold the chunk's queries and the tokens it owns,
prefix and new alike (each new token written by its owner).

Merging: every rank all-gathers the ranks' lse (``[world, T, Hq]`` float32, small), weighs
its own output by ``e^{lse_r - lse}`` where ``lse`` joins every rank's and the sinks (applied
once, here), and an all-reduce sums the weighted outputs, so every rank ends with the whole
result. The all-reduce moves ``2 (world - 1) / world`` outputs a rank against ``world - 1``
for an all-gather of the outputs: fewer from three ranks on, the same at two.

The plan carries the layout and the lengths: ``run`` builds the sparse index on the device
(no host sync).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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


def _check_layout(layout):
    if isinstance(layout, Interleaved):
        if not isinstance(layout.size, int) or layout.size < 1:
            raise ValueError(f"Interleaved size must be an int >= 1, got {layout.size!r}")
    elif isinstance(layout, Contiguous):
        if not isinstance(layout.chunk, int) or layout.chunk < 1:
            raise ValueError(f"Contiguous chunk must be an int >= 1, got {layout.chunk!r}")
    else:
        raise TypeError(f"layout must be Interleaved or Contiguous, got {type(layout).__name__}")


def _merge(part, lse, sinks, out, group, world, deterministic=False):
    """Every rank's partial state ``(part [N, Hq, Dv], lse [N, Hq])`` merged, sinks joining
    the denominator once: the lse all-gathered, each rank's output weighed by
    ``e^{lse_r - lse}`` and all-reduced (``deterministic``: all-gathered and added in rank
    order, the same bits whatever the collective's algorithm). Returns the whole output on
    every rank."""
    import torch.distributed as dist
    lses = [torch.empty_like(lse) for _ in range(world)]
    dist.all_gather(lses, lse.contiguous(), group=group)
    total = torch.logsumexp(torch.stack(lses), dim=0)  # [N, Hq]
    denom = total if sinks is None else torch.logaddexp(total, sinks.float()[None, :])
    weight = torch.where(lse == float("-inf"), 0.0, torch.exp(lse - denom))
    merged = part.float() * weight[..., None]
    if deterministic:
        parts = [torch.empty_like(merged) for _ in range(world)]
        dist.all_gather(parts, merged, group=group)
        merged = parts[0]
        for other in parts[1:]:
            merged = merged + other
    else:
        dist.all_reduce(merged, group=group)
    if out is None:
        return merged.to(part.dtype)
    return out.copy_(merged)


def plan_decode(seq_lens, *, group, layout, num_q_heads, num_kv_heads, head_dim,
                head_dim_v=None, page_size, window_left=None, softcap=0.0, scale=None,
                dtype=torch.bfloat16, device="cuda", deterministic=False):
    """A context-parallel decode plan for this rank of ``group`` (a torch.distributed process
    group; every rank makes the same plan with the same global ``seq_lens``, host ints).
    ``layout``: :class:`Interleaved` or :class:`Contiguous`. ``deterministic``: see
    :class:`ParallelPlan`. The rest as :func:`swattn.plan_decode`'s."""
    lens = _host_lens("seq_lens", seq_lens)
    rank, world = _check(group, layout, lens, window_left)
    # One query a sequence, at its last position (-1 for an empty sequence: no key).
    return ParallelPlan(list(range(len(lens))), [n - 1 for n in lens], group=group,
                        layout=layout, rank=rank, world=world, num_q_heads=num_q_heads,
                        num_kv_heads=num_kv_heads, head_dim=head_dim,
                        head_dim_v=head_dim if head_dim_v is None else head_dim_v,
                        page_size=page_size, window_left=window_left, softcap=softcap,
                        scale=scale, dtype=dtype, device=torch.device(device),
                        deterministic=deterministic)

def _host_lens(name, values):
    lens = [int(x) for x in (values.tolist() if isinstance(values, torch.Tensor) else values)]
    if any(x < 0 for x in lens):
        raise ValueError(f"{name} must be >= 0")
    return lens


def _check(group, layout, total_lens, window_left):
    """``(rank, world)`` of ``group`` once the layout, the sequences' total lengths and the
    window are checked."""
    import torch.distributed as dist
    _check_layout(layout)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if isinstance(layout, Contiguous) and total_lens and max(total_lens) > world * layout.chunk:
        raise ValueError(f"a sequence of {max(total_lens)} tokens does not fit {world} ranks of "
                         f"{layout.chunk} (Contiguous chunk)")
    if window_left is not None and (not isinstance(window_left, int) or window_left < 0):
        raise ValueError(f"window_left must be an int >= 0 or None, got {window_left!r}")
    return rank, world


class ParallelPlan:
    """One batch's decode, or one chunk's extend (prefill), across the ranks of ``group``:
    made by :func:`plan_decode` (a query a sequence, at its last position) or
    :func:`plan_extend` (a query a new token).

    Query ``t`` (global position ``p``) sees the global keys ``[lo, p]`` (``lo = p -
    window_left``, or 0), one run of local positions ``[first_t, end_t)`` on this rank. The
    run is attended to by the decode kernel, a query a row: its last ``m`` keys as the
    kernel's window (``seq_len = end_t``, ``window_left = m - 1``, ``m`` the shortest
    non-empty run of the chunk on this rank), the rest ``[first_t, end_t - m)`` as sparse
    keys (at most twice the interleave size wide in an interleaved layout; without a
    window every run starts at 0 and the window holds it whole). Queries with no key here
    get ``seq_len`` 0 and no sparse key; a rank with none for any query launches nothing.

    ``deterministic``: the outputs merged in rank order (all-gathered, ``world - 1`` outputs
    a rank instead of the all-reduce's ``2 (world - 1) / world``), so a fixed group size
    gives the same bits run after run whatever the collectives' algorithms.

    Attributes: ``launched`` (whether this rank runs the kernel), ``keys`` (the (query, key)
    pairs it attends to), ``sparse_keys`` (the sparse index's width)."""

    def __init__(self, seq, pos, *, group, layout, rank, world, num_q_heads, num_kv_heads,
                 head_dim, head_dim_v, page_size, window_left, softcap, scale, dtype, device,
                 deterministic=False):
        """``seq``, ``pos``: each query's sequence and global position (host ints)."""
        import swattn
        self.group, self.world, self.deterministic = group, world, deterministic
        self.num_q_heads, self.head_dim_v, self.page_size = num_q_heads, head_dim_v, page_size
        self.tokens = len(pos)
        p = torch.tensor(pos, dtype=torch.int64)
        lo = (p - window_left).clamp_min(0) if window_left is not None else torch.zeros_like(p)
        first = layout.local_len(lo, rank, world)
        end = layout.local_len(p + 1, rank, world)
        run = (end - first).clamp_min(0)
        has = run > 0
        self.keys = int(run.sum())
        self.launched = bool(has.any())
        self.sparse_keys = 0
        self.inner = None
        if not self.launched:
            return
        if window_left is None:
            inner_window, m = None, 0  # every run is [0, end_t): the window part holds it
        else:
            m = int(run[has].min())
            inner_window = m - 1
        rest = torch.where(has, run - m, 0) if window_left is not None else torch.zeros_like(run)
        self.sparse_keys = int(rest.max())
        lens = torch.where(has, end, 0).tolist()
        self.inner = swattn.plan_decode(
            lens, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
            head_dim_v=head_dim_v, page_size=page_size, window_left=inner_window,
            softcap=softcap, scale=scale, return_lse=True, sparse_keys=self.sparse_keys,
            dtype=dtype, device=device)
        self.seq = torch.tensor(seq, dtype=torch.int64).to(device)
        self.first = first.to(torch.int32).to(device)
        self.rest = rest.to(torch.int32).to(device)
        self.offsets = torch.arange(max(self.sparse_keys, 1), dtype=torch.int32, device=device)

    def run(self, q, k_cache, v_cache, block_table, *, sinks=None, out=None):
        """This rank's part of the attention merged with the other ranks': every rank returns
        the whole ``out [T, Hq, Dv]`` (decode: T = B). ``q``: the queries (the same on every
        rank); ``k_cache``/``v_cache``/``block_table``: this rank's cache, holding every
        token of the sequences this rank owns (decode's new one, and extend's prefix and new
        tokens, written by their owners) at local positions. No host sync."""
        part, lse = self.partial(q, k_cache, v_cache, block_table)
        return _merge(part, lse, sinks, out, self.group, self.world, self.deterministic)

    def partial(self, q, k_cache, v_cache, block_table):
        """This rank's partial state alone, ``(out [T, Hq, Dv], lse [T, Hq])`` without sinks
        (output 0 and lse -inf where it holds no visible key), for a caller's own merge
        (``swattn.merge_states``' rule)."""
        if self.launched:
            rows = block_table.index_select(0, self.seq)  # each query's sequence's pages
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
            part, lse = self.inner.run(q, k_cache, v_cache, rows, sparse=sparse)
        else:  # no key of this rank is visible to any query: no launch, a neutral state
            part = torch.zeros(self.tokens, self.num_q_heads, self.head_dim_v, dtype=q.dtype,
                               device=q.device)
            lse = torch.full((self.tokens, self.num_q_heads), float("-inf"), dtype=torch.float32,
                             device=q.device)
        return part, lse


def plan_extend(prefix_lens, extend_lens, *, group, layout, num_q_heads, num_kv_heads, head_dim,
                head_dim_v=None, page_size, window_left=None, softcap=0.0, scale=None,
                dtype=torch.bfloat16, device="cuda", deterministic=False):
    """A context-parallel extend plan for this rank of ``group``: one chunk of
    ``extend_lens[b]`` new tokens after ``prefix_lens[b]`` cached ones a sequence (host ints,
    the same on every rank). ``layout``: :class:`Interleaved` or :class:`Contiguous`, dealing
    the prefix and the new tokens alike. ``deterministic``: see :class:`ParallelPlan`. The
    rest as :func:`swattn.plan_extend`'s (causal)."""
    prefix = _host_lens("prefix_lens", prefix_lens)
    new = _host_lens("extend_lens", extend_lens)
    if len(prefix) != len(new):
        raise ValueError(f"prefix_lens and extend_lens differ in length ({len(prefix)} and "
                         f"{len(new)})")
    rank, world = _check(group, layout, [a + b for a, b in zip(prefix, new)], window_left)
    seq, pos = [], []
    for b, (a, n) in enumerate(zip(prefix, new)):
        seq += [b] * n
        pos += range(a, a + n)
    return ParallelPlan(seq, pos, group=group, layout=layout, rank=rank, world=world,
                        num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                        head_dim_v=head_dim if head_dim_v is None else head_dim_v,
                        page_size=page_size, window_left=window_left, softcap=softcap,
                        scale=scale, dtype=dtype, device=torch.device(device),
                        deterministic=deterministic)
