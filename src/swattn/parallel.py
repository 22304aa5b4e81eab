"""Context parallelism for decode: each rank of a torch.distributed process group holds a
shard of every sequence's KV cache, attends only to the keys it holds that the query's
window reaches, and the ranks merge their partial states with collectives.

Shard layouts (a token's global position ``p``):

* :class:`Interleaved` ``(size)``: runs of ``size`` tokens dealt round-robin, token ``p`` on
  rank ``(p // size) % world`` (vLLM's decode context parallelism, ``size`` its interleave);
* :class:`Contiguous` ``(chunk)``: rank ``r`` holds positions ``[r * chunk, (r + 1) * chunk)``.

A rank keeps its tokens in order in its own paged cache (local position ``j``, its own block
table). In both layouts the keys a decode query's window reaches, global ``[lo, S)``, are one
run of local positions on every rank, ``[local(lo), local(S))``: the window decides which
ranks work. A rank attends to that run as the decode kernel's sparse keys (no window keys),
with no sinks; a rank with no visible key for any sequence launches nothing and contributes
a neutral state (output 0, lse -inf).

Merging: every rank all-gathers the ranks' lse (``[world, B, Hq]`` float32, small), weighs
its own output by ``e^{lse_r - lse}`` where ``lse`` joins every rank's and the sinks (applied
once, here), and an all-reduce sums the weighted outputs, so every rank ends with the whole
result. The all-reduce moves ``2 (world - 1) / world`` outputs a rank against ``world - 1``
for an all-gather of the outputs: fewer from three ranks on, the same at two.

The plan carries the layout and the lengths: ``run`` builds the sparse index on the device
(no host sync). Extend (prefill) across ranks is not here yet.
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


class ParallelDecodePlan:
    """One batch's decode across the ranks of ``group``: made by :func:`plan_decode`."""

    def __init__(self, lens, *, group, layout, rank, world, num_q_heads, num_kv_heads, head_dim,
                 head_dim_v, page_size, window_left, softcap, scale, dtype, device):
        self.group, self.layout, self.rank, self.world = group, layout, rank, world
        self.window_left = window_left
        self.num_q_heads, self.head_dim_v, self.page_size = num_q_heads, head_dim_v, page_size
        self.dtype, self.device = dtype, device
        self.kw = dict(softcap=softcap, scale=scale)
        self.batch = len(lens)
        seq = torch.tensor(lens, dtype=torch.int64)
        lo = seq - 1 - window_left if window_left is not None else torch.zeros_like(seq)
        lo = lo.clamp_min(0)
        first = layout.local_len(lo, rank, world)
        count = (layout.local_len(seq, rank, world) - first).clamp_min(0)
        # The sparse index's width: the most keys this rank attends to for one sequence.
        self.width = max(int(count.max()) if len(lens) else 0, 0)
        self.first = first.to(torch.int32).to(device)
        self.count = count.to(torch.int32).to(device)
        self.zero_lens = torch.zeros(self.batch, dtype=torch.int32, device=device)
        self.offsets = torch.arange(max(self.width, 1), dtype=torch.int32, device=device)

    def run(self, q, k_cache, v_cache, block_table, *, sinks=None, out=None):
        """This rank's shard of the batch's decode attention merged with the other ranks':
        every rank returns the whole ``out [B, Hq, Dv]``. ``k_cache``/``v_cache``/
        ``block_table``: this rank's cache (its tokens at local positions, pages contiguous
        in memory). No host sync."""
        import torch.distributed as dist

        from . import api
        b, hq = self.batch, self.num_q_heads
        if self.width:
            # Local position first[b] + i, for i < count[b]; -1 (no key) past it.
            pos = self.first[:, None] + self.offsets[None, :self.width]  # [B, K]
            valid = self.offsets[None, :self.width] < self.count[:, None]
            page = torch.gather(block_table, 1, (pos // self.page_size).clamp_max(
                block_table.shape[1] - 1).to(torch.int64))
            idx = torch.where(valid, page * self.page_size + pos % self.page_size, -1)
            flat_k = k_cache.view(-1, *k_cache.shape[2:])
            flat_v = v_cache.view(-1, *v_cache.shape[2:])
            part, lse = api.decode_attention(
                q, k_cache, v_cache, block_table, self.zero_lens,
                sparse=(flat_k, flat_v, idx.to(torch.int32)), return_lse=True, num_splits=1,
                **self.kw)
        else:  # no key of this rank is visible: no launch, a neutral state
            part = torch.zeros(b, hq, self.head_dim_v, dtype=q.dtype, device=q.device)
            lse = torch.full((b, hq), float("-inf"), dtype=torch.float32, device=q.device)
        lses = [torch.empty_like(lse) for _ in range(self.world)]
        dist.all_gather(lses, lse.contiguous(), group=self.group)
        total = torch.logsumexp(torch.stack(lses), dim=0)  # [B, Hq]
        denom = total if sinks is None else torch.logaddexp(total, sinks.float()[None, :])
        weight = torch.where(lse == float("-inf"), 0.0, torch.exp(lse - denom))
        merged = part.float() * weight[..., None]
        dist.all_reduce(merged, group=self.group)
        if out is None:
            return merged.to(q.dtype)
        return out.copy_(merged)


def plan_decode(seq_lens, *, group, layout, num_q_heads, num_kv_heads, head_dim,
                head_dim_v=None, page_size, window_left=None, softcap=0.0, scale=None,
                dtype=torch.bfloat16, device="cuda"):
    """A context-parallel decode plan for this rank of ``group`` (a torch.distributed process
    group; every rank makes the same plan with the same global ``seq_lens``, host ints).
    ``layout``: :class:`Interleaved` or :class:`Contiguous`. The rest as
    :func:`swattn.plan_decode`'s."""
    import torch.distributed as dist
    _check_layout(layout)
    lens = [int(x) for x in (seq_lens.tolist() if isinstance(seq_lens, torch.Tensor) else seq_lens)]
    if any(x < 0 for x in lens):
        raise ValueError("seq_lens must be >= 0")
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if isinstance(layout, Contiguous) and lens and max(lens) > world * layout.chunk:
        raise ValueError(f"a sequence of {max(lens)} tokens does not fit {world} ranks of "
                         f"{layout.chunk} (Contiguous chunk)")
    if window_left is not None and (not isinstance(window_left, int) or window_left < 0):
        raise ValueError(f"window_left must be an int >= 0 or None, got {window_left!r}")
    return ParallelDecodePlan(lens, group=group, layout=layout, rank=rank, world=world,
                              num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
                              head_dim=head_dim,
                              head_dim_v=head_dim if head_dim_v is None else head_dim_v,
                              page_size=page_size, window_left=window_left, softcap=softcap,
                              scale=scale, dtype=dtype, device=torch.device(device))
