"""Inputs of the decode rows of ``swattn bench`` and their reference check.

Inputs (:func:`build_inputs`), built with tensor operations on the device (C-B's cache is
64 x 32768 x 8 x 128 x 2 bytes x 2 = 8.6 GB):

* a paged cache (page 16) of random values, each sequence's pages in a random permutation of
  the pool; page 0 is a null page of finite data that belongs to nobody;
* NaN in every row no kernel may read: rows past each sequence's end in its last page,
  every page wholly below its window and chunk (an engine has freed them), one NaN page just before
  the cache (what a -1 page id would address) and one NaN row just after it;
* ``block_table_window``: -1 for pages wholly below the window (or chunk) and past the end (a spare
  column past every sequence's end); ``block_table_full`` maps every page of the sequence;
* sinks where the workload has them;
* for S, a sparse pool of ``2 K`` rows per sequence (K = 512 index entries) and
  ``idx [B, K]`` of distinct random rows of the sequence's share, ``K / 16`` entries -1 at
  random places; pool rows no index names are NaN, and so is the row just before the pool
  (what -1 would address).

The cache, the rows between and the sparse pool are views of one flat allocation per K and V
(``k_rows``/``v_rows`` ``[rows, Hkv, D]``): swattn gets the paged cache and a separate pool,
SGLang's token-pool kernel the flat rows with its index list over both. Over a latent cache
(S) ``v_rows`` is ``k_rows[..., :Dv]``: the values are the keys' first columns.

Each variant's output is poisoned with NaN, then checked against the float64 reference
(``swattn.reference.decode_attention``) on the first :data:`CHECK_SEQS` sequences (NaN
anywhere in the output fails).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .peers import Skip

CHECK_SEQS = 4  # sequences checked against the reference


# --------------------------------------------------------------------------------------
# Inputs.
# --------------------------------------------------------------------------------------

@dataclass
class DecodeInputs:
    """One decode case's tensors (see the module docstring).

    ``k_cache``/``v_cache`` ``[num_pages, page_size, Hkv, D|Dv]`` are views of
    ``k_rows``/``v_rows`` starting at row ``cache_row0``; the sparse pool (S only) starts at
    row ``sparse_row0``. ``seq_pages[b, n]`` is the physical page of sequence b's logical
    page n (-1 past the end)."""

    case: object
    q: torch.Tensor
    k_rows: torch.Tensor
    v_rows: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    cache_row0: int
    seq_pages: torch.Tensor
    block_table_window: torch.Tensor
    block_table_full: torch.Tensor
    seq_lens: torch.Tensor
    sinks: torch.Tensor | None
    sparse: tuple | None = None
    sparse_row0: int = 0
    null_page: int = 0

    def slots(self, b, start, stop):
        """Cache slots (``page * page_size + offset``, relative to ``k_cache``) of positions
        ``[start, stop)`` of sequence ``b``, int64 on the device."""
        size = self.case.page_size
        pos = torch.arange(start, stop, device=self.seq_pages.device, dtype=torch.int64)
        return self.seq_pages[b].to(torch.int64)[pos // size] * size + pos % size

    def window_starts(self):
        """``[B]`` int64 (device): each sequence's first visible cached position."""
        case = self.case
        return torch.tensor([case.lowest_key(s) for s in case.seq_lens], dtype=torch.int64,
                            device=self.q.device)


def build_inputs(case, device="cuda", seed=0, dtype=torch.bfloat16):
    """The tensors of ``case`` on ``device`` (see :class:`DecodeInputs`)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    size, hkv, d, dv = case.page_size, case.num_kv_heads, case.head_dim, case.head_dim_v
    batch, nan = case.batch, float("nan")

    def randn(*shape, dt=dtype):
        return torch.randn(*shape, generator=gen, device=device, dtype=dt)

    lens = torch.tensor(case.seq_lens, dtype=torch.int64)
    pages = (lens + size - 1) // size
    width = int(pages.max()) + 1  # a spare column: every sequence has an entry past its end
    total = int(pages.sum())
    num_pages = 1 + total  # page 0: the null page
    order = torch.randperm(total, generator=torch.Generator().manual_seed(seed)) + 1
    logical = torch.arange(width)
    seq_pages = torch.full((batch, width), -1, dtype=torch.int32)
    seq_pages[logical[None, :] < pages[:, None]] = order.to(torch.int32)  # row-major: b's run
    seq_pages = seq_pages.to(device)

    guard = size  # a NaN page before the cache: page id -1 addresses it
    sparse_rows = batch * 2 * case.sparse_keys
    cache_end = guard + num_pages * size
    sparse_row0 = cache_end + 1  # one NaN row between: pool row -1 addresses it
    rows = sparse_row0 + sparse_rows
    k_rows = randn(rows, hkv, d)
    v_rows = k_rows[..., :dv] if case.latent else randn(rows, hkv, dv)
    for flat in (k_rows, v_rows):
        flat[:guard] = nan
        flat[cache_end] = nan
    k_cache = k_rows[guard:cache_end].view(num_pages, size, hkv, d)
    v_cache = v_rows[guard:cache_end].view(num_pages, size, hkv, dv)

    dev_lens = lens.to(device)
    dev_pages = pages.to(device)
    dev_logical = logical.to(device)
    # Rows past each sequence's end in its last page: never written.
    last = (dev_pages - 1).clamp_min(0)
    offsets = torch.arange(size, device=device)
    tail_pos = last[:, None] * size + offsets[None, :]
    tail = (tail_pos >= dev_lens[:, None]) & (dev_pages[:, None] > 0)
    tail_slots = seq_pages.to(torch.int64).gather(1, last[:, None]) * size + offsets[None, :]
    # Pages wholly below each window: freed by the engine.
    starts = torch.tensor([case.lowest_key(s) for s in case.seq_lens], dtype=torch.int64,
                          device=device)
    below = dev_logical[None, :] < (starts // size)[:, None]
    below_pages = seq_pages[below].to(torch.int64)
    for cache, flat in ((k_cache, k_cache.view(-1, hkv, d)), (v_cache, v_cache.view(-1, hkv, dv))):
        flat[tail_slots[tail]] = nan
        cache[below_pages] = nan
    k_cache[0] = randn(size, hkv, d)  # the null page stays finite
    if not case.latent:
        v_cache[0] = randn(size, hkv, dv)

    table_full = seq_pages.clone()
    table_window = seq_pages.clone()
    table_window[below] = -1

    sparse = None
    if case.sparse_keys:
        k_pool = k_rows[sparse_row0:]
        v_pool = v_rows[sparse_row0:]
        share = 2 * case.sparse_keys
        base = torch.arange(batch, device=device)[:, None] * share
        chosen = (torch.rand(batch, share, generator=gen, device=device).argsort(1)
                  [:, :case.sparse_keys] + base)
        holes = torch.rand(batch, case.sparse_keys, generator=gen, device=device).argsort(1)
        invalid = case.sparse_keys - case.sparse_valid
        idx = chosen.scatter(1, holes[:, :invalid], -1).to(torch.int32)
        named = torch.zeros(k_pool.shape[0], dtype=torch.bool, device=device)
        named[idx[idx >= 0].to(torch.int64)] = True
        k_pool[~named] = nan
        v_pool[~named] = nan
        k_rows[sparse_row0 - 1] = nan
        v_rows[sparse_row0 - 1] = nan
        sparse = (k_pool, v_pool, idx)

    return DecodeInputs(
        case, randn(batch, case.num_q_heads, d), k_rows, v_rows, k_cache, v_cache, guard,
        seq_pages, table_window, table_full, lens.to(device=device, dtype=torch.int32),
        randn(case.num_q_heads, dt=torch.float32) if case.sinks else None, sparse, sparse_row0)


def footprint(case, element_size=2):
    """Bytes the inputs take on the device, and a dense copy for FlexAttention (an estimate
    for the run's log)."""
    pages = sum(-(-s // case.page_size) for s in case.seq_lens) + 2
    rows = pages * case.page_size + 2 * case.batch * case.sparse_keys
    per_row = case.num_kv_heads * (case.head_dim + case.head_dim_v) * element_size
    dense = sum(case.seq_lens) * per_row
    return rows * per_row + dense


# --------------------------------------------------------------------------------------
# Reference.
# --------------------------------------------------------------------------------------

def reference_first(inputs, sinks=True, sparse=True, count=CHECK_SEQS):
    """The float64 reference ``[n, Hq, Dv]`` of the first ``n = min(count, B)`` sequences,
    read through the window block table (-1 below the window). ``sinks=False`` drops the
    sinks, ``sparse=False`` the sparse keys (what a variant that cannot apply them
    computes)."""
    from .. import reference
    case = inputs.case
    n = min(count, case.batch)
    out = torch.empty(n, case.num_q_heads, case.head_dim_v, dtype=torch.float64,
                      device=inputs.q.device)
    extra = None
    if sparse and inputs.sparse is not None:
        k_pool, v_pool, idx = inputs.sparse
        extra = (k_pool, v_pool, idx[:n])
    reference.decode_attention(
        inputs.q[:n], inputs.k_cache, inputs.v_cache, inputs.block_table_window[:n],
        inputs.seq_lens[:n], window_left=case.window_left,
        sinks=inputs.sinks if sinks else None, sparse=extra,
        attention_chunk=case.attention_chunk, out=out)
    return out


# --------------------------------------------------------------------------------------
# Adapters.
# --------------------------------------------------------------------------------------

def need_device(inputs):
    """Triton kernels run on CUDA, or on the CPU under the interpreter (tests)."""
    if inputs.q.is_cuda or os.environ.get("TRITON_INTERPRET") == "1":
        return
    raise Skip("needs a CUDA device (or TRITON_INTERPRET=1 on the CPU)")
