"""Inputs of the extend rows of ``swattn bench`` and their reference check.

Built once per case: random bf16 (never zeros), one paged K/V pool holding every
sequence's prefix and new tokens in randomly permuted pages, NaN in every cache row nobody
wrote, -1 in every block-table entry no query may read (below the first new token's window
and chunk). A tree verify (T) also gets the new tokens' positions and its custom mask.
Each variant's output is poisoned with NaN, then checked against the float64 reference
(``swattn.reference.extend_attention``, with the case's chunk, positions and mask) on the
first sequence (NaN anywhere in the output fails). The decode rows' inputs mirror this
module (:mod:`.decode_inputs`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# --------------------------------------------------------------------------------------
# Inputs.
# --------------------------------------------------------------------------------------

@dataclass
class ExtendInputs:
    """One case's tensors. ``k_pool``/``v_pool`` ``[num_pages, page_size, Hkv, D|Dv]`` hold
    every sequence's prefix and new tokens; page ``null_page`` (0) holds finite data and
    belongs to nobody; rows nobody wrote are NaN. ``seq_pages[b, n]`` is the physical page
    of sequence b's logical page n over its P + E tokens (-1 past the end).
    ``block_table_full`` maps the prefix pages (-1 past the prefix);
    ``block_table_window`` also holds -1 for pages wholly below the first new token's
    window and chunk. A tree verify's ``positions`` ``[T]`` int32, ``mask`` (flat bool, the
    conventions' layout) and ``mask_indptr`` ``[B + 1]`` int32; None otherwise."""

    case: object
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    k_pool: torch.Tensor
    v_pool: torch.Tensor
    seq_pages: torch.Tensor
    block_table_full: torch.Tensor
    block_table_window: torch.Tensor
    cu_seqlens: torch.Tensor
    prefix_lens: torch.Tensor
    sinks: torch.Tensor | None
    null_page: int = 0
    positions: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    mask_indptr: torch.Tensor | None = None

    def host_positions(self):
        """Every new token's position, a host list (the plan takes it), or None for a chain."""
        if self.positions is None:
            return None
        return [x for p, e in self.case.seqs for x in self.case.positions(p, e)]

    def host_mask_indptr(self):
        """The mask's offsets, a host list (the plan takes it), or None without a mask."""
        return None if self.mask_indptr is None else self.mask_indptr.tolist()

    def slots(self, b, start, stop):
        """Flat token-pool slots (``page * page_size + offset``) of positions
        ``[start, stop)`` of sequence ``b``, int64 on the pool's device."""
        size = self.case.page_size
        pos = torch.arange(start, stop, device=self.seq_pages.device, dtype=torch.int64)
        return self.seq_pages[b].to(torch.int64)[pos // size] * size + pos % size


def build_inputs(case, device="cuda", seed=0, dtype=torch.bfloat16):
    """The tensors of ``case`` on ``device`` (see :class:`ExtendInputs`)."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape, dt=dtype):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dt)

    size, hkv, d, dv = case.page_size, case.num_kv_heads, case.head_dim, case.head_dim_v
    pages = [-(-(p + e) // size) for p, e in case.seqs]
    order = torch.randperm(sum(pages), generator=torch.Generator().manual_seed(seed)) + 1
    seq_pages = torch.full((case.batch, max(1, max(pages))), -1, dtype=torch.int32)
    start = 0
    for b, n in enumerate(pages):
        seq_pages[b, :n] = order[start:start + n].to(torch.int32)
        start += n
    seq_pages = seq_pages.to(device)
    num_pages = 1 + sum(pages)
    k_pool = torch.full((num_pages, size, hkv, d), float("nan"), dtype=dtype, device=device)
    v_pool = torch.full((num_pages, size, hkv, dv), float("nan"), dtype=dtype, device=device)
    k_pool[0] = randn(size, hkv, d)
    v_pool[0] = randn(size, hkv, dv)

    tokens = case.num_tokens
    q = randn(tokens, case.num_q_heads, d)
    k = randn(tokens, hkv, d)
    v = randn(tokens, hkv, dv)
    cu = [0]
    for _, e in case.seqs:
        cu.append(cu[-1] + e)
    inputs = ExtendInputs(
        case, q, k, v, k_pool, v_pool, seq_pages, None, None,
        torch.tensor(cu, dtype=torch.int32, device=device),
        torch.tensor([p for p, _ in case.seqs], dtype=torch.int32, device=device),
        randn(case.num_q_heads, dt=torch.float32) if case.sinks else None)

    k_flat, v_flat = k_pool.view(-1, hkv, d), v_pool.view(-1, hkv, dv)
    for b, (prefix, new) in enumerate(case.seqs):
        prefix_slots = inputs.slots(b, 0, prefix)
        k_flat[prefix_slots] = randn(prefix, hkv, d)
        v_flat[prefix_slots] = randn(prefix, hkv, dv)
        # The engine writes the new tokens' K/V into their pages before attention.
        new_slots = inputs.slots(b, prefix, prefix + new)
        k_flat[new_slots] = k[cu[b]:cu[b + 1]]
        v_flat[new_slots] = v[cu[b]:cu[b + 1]]

    prefix_pages = max(1, max(-(-p // size) for p, _ in case.seqs))
    full = torch.full((case.batch, prefix_pages), -1, dtype=torch.int32, device=device)
    window = full.clone()
    for b, (prefix, _) in enumerate(case.seqs):
        n = -(-prefix // size)
        full[b, :n] = seq_pages[b, :n]
        below = case.lowest_key(prefix) // size  # pages wholly below the window
        window[b, below:n] = seq_pages[b, below:n]
    inputs.block_table_full, inputs.block_table_window = full, window
    if case.tree:
        inputs.positions, inputs.mask, inputs.mask_indptr = tree_inputs(case, device)
    return inputs


def tree_inputs(case, device):
    """A tree verify's ``(positions [T] int32, mask, mask_indptr [B + 1] int32)``: every
    sequence's new tokens the case's tree at ``P + depth``, the mask row-major (new token,
    key) over ``P + E`` keys: every cached key, and a node's ancestors and itself."""
    from .workloads import tree_ancestors
    positions, bits, indptr = [], [], [0]
    for prefix, new in case.seqs:
        positions += case.positions(prefix, new)
        rows = torch.zeros(new, prefix + new, dtype=torch.bool)
        rows[:, :prefix] = True
        for i, seen in enumerate(tree_ancestors(case.tree[:new])):
            rows[i, [prefix + a for a in seen]] = True
        bits.append(rows.flatten())
        indptr.append(indptr[-1] + new * (prefix + new))
    return (torch.tensor(positions, dtype=torch.int32, device=device),
            torch.cat(bits).to(device), torch.tensor(indptr, dtype=torch.int32, device=device))


# --------------------------------------------------------------------------------------
# Checks against the reference.
# --------------------------------------------------------------------------------------

def reference_first(inputs, sinks=True, sparse=True, positions=True):
    """The float64 reference output ``[E0, Hq, Dv]`` of the first sequence (``sparse``:
    for the decode reference's signature; extend has no sparse keys). ``positions=False``:
    a tree's window measured from the row index instead (what a kernel without positions
    computes)."""
    del sparse
    from .. import reference
    case = inputs.case
    new = case.seqs[0][1]
    out = torch.empty(new, case.num_q_heads, case.head_dim_v, dtype=torch.float64,
                      device=inputs.q.device)
    cu = inputs.cu_seqlens[:2]
    tree = {}
    if inputs.mask is not None:
        tree = {"mask": inputs.mask[:int(inputs.mask_indptr[1])],
                "mask_indptr": inputs.mask_indptr[:2],
                "positions": inputs.positions[:new] if positions else None}
    reference.extend_attention(
        inputs.q[:new], inputs.k[:new], inputs.v[:new], inputs.k_pool, inputs.v_pool,
        inputs.block_table_window[:1], cu, inputs.prefix_lens[:1],
        window_left=case.window_left, sinks=inputs.sinks if sinks else None,
        attention_chunk=case.attention_chunk, out=out, **tree)
    return out
