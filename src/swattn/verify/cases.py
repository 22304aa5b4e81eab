"""Test inputs for the kernels: random values (never zeros), a scrambled paged cache whose
unwritten rows hold NaN, and -1 in every block-table entry no query may read."""

import random
from dataclasses import dataclass, field

import torch


@dataclass(kw_only=True)
class _Shape:
    """What both case kinds share: heads, head dims, page size, window, dtype, seed and the
    extra keyword arguments of the call (keyword-only, after each kind's own lengths)."""
    num_q_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    head_dim_v: int = 16
    page_size: int = 4
    window_left: int | None = None
    dtype: torch.dtype = torch.float16
    seed: int = 0
    kwargs: dict = field(default_factory=dict)

    def _shape_id(self):
        return (f"-h{self.num_q_heads}/{self.num_kv_heads}-d{self.head_dim}/{self.head_dim_v}"
                f"-ps{self.page_size}-L{self.window_left}")


@dataclass
class ExtendCase(_Shape):
    prefix_lens: list
    extend_lens: list

    def id(self):
        return f"P{self.prefix_lens}-E{self.extend_lens}" + self._shape_id()


def lowest_readable(prefix_len, extend_len, window_left):
    """Lowest prefix position any new token of the sequence may see (the test's own
    statement of the convention: the first new token at P sees P - L)."""
    if extend_len == 0:
        return prefix_len
    if window_left is None:
        return 0
    return max(prefix_len - window_left, 0)


def build_extend(case: ExtendCase, device="cpu"):
    """Tensors for one case: (q, k, v, k_cache, v_cache, block_table, cu_seqlens, prefix_lens)."""
    g = torch.Generator().manual_seed(case.seed)
    ps, hkv = case.page_size, case.num_kv_heads
    num_tokens = sum(case.extend_lens)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(case.dtype)

    q = rand(num_tokens, case.num_q_heads, case.head_dim)
    k = rand(num_tokens, hkv, case.head_dim)
    v = rand(num_tokens, hkv, case.head_dim_v)
    # Each sequence owns pages for its prefix and its new tokens (as an engine allocates
    # them); pages are scattered over the pool and spare pages are left in between.
    pages_per_seq = [-(-(p + e) // ps) for p, e in zip(case.prefix_lens, case.extend_lens)]
    max_pages = max(pages_per_seq + [1]) + 1
    num_pages = sum(pages_per_seq) * 2 + 3
    perm = torch.randperm(num_pages, generator=g)
    k_cache = torch.full((num_pages, ps, hkv, case.head_dim), float("nan"), dtype=case.dtype)
    v_cache = torch.full((num_pages, ps, hkv, case.head_dim_v), float("nan"), dtype=case.dtype)
    block_table = torch.full((len(case.prefix_lens), max_pages), -1, dtype=torch.int32)
    used = 0
    for b, (p, e) in enumerate(zip(case.prefix_lens, case.extend_lens)):
        low = lowest_readable(p, e, case.window_left)
        for i in range(pages_per_seq[b]):
            page = int(perm[used])
            used += 1
            if (i + 1) * ps <= low:
                continue  # wholly below every window: freed, never to be read
            block_table[b, i] = page
            rows = min(max(p - i * ps, 0), ps)  # written prefix rows in this page
            if rows:
                k_cache[page, :rows] = rand(rows, hkv, case.head_dim)
                v_cache[page, :rows] = rand(rows, hkv, case.head_dim_v)
    cu = [0]
    for e in case.extend_lens:
        cu.append(cu[-1] + e)
    tensors = (q, k, v, k_cache, v_cache, block_table,
               torch.tensor(cu, dtype=torch.int32),
               torch.tensor(case.prefix_lens, dtype=torch.int32))
    return tuple(t.to(device) for t in tensors)


def random_mask(prefix_lens, extend_lens, seed, density=0.7):
    """A random custom mask and its indptr (row-major per sequence: new token x key)."""
    g = torch.Generator().manual_seed(seed)
    sizes = [e * (p + e) for p, e in zip(prefix_lens, extend_lens)]
    indptr = [0]
    for s in sizes:
        indptr.append(indptr[-1] + s)
    mask = torch.rand(indptr[-1], generator=g) < density
    return mask, torch.tensor(indptr, dtype=torch.int32)


def random_tree(prefix_lens, extend_lens, seed):
    """A batch of random draft trees as a speculative verify hands them over: each
    sequence's new tokens a tree in an order where every node follows its parent, at
    positions ``P + depth`` (siblings share one), and the custom mask (every cached key; a
    node sees its ancestors and itself). Returns ``(positions [T] int32, mask, indptr)``."""
    rng = random.Random(seed)
    positions, bits, indptr = [], [], [0]
    for p, n in zip(prefix_lens, extend_lens):
        parents, depths = [], []
        for i in range(n):
            parent = rng.randrange(i) if i else -1
            parents.append(parent)
            depths.append(depths[parent] + 1 if i else 0)
        positions += [p + d for d in depths]
        rows = torch.zeros(n, p + n, dtype=torch.bool)
        rows[:, :p] = True
        for i in range(n):
            j = i
            while j >= 0:
                rows[i, p + j] = True
                j = parents[j]
        bits.append(rows.flatten())
        indptr.append(indptr[-1] + n * (p + n))
    return (torch.tensor(positions, dtype=torch.int32),
            torch.cat(bits) if bits else torch.zeros(0, dtype=torch.bool),
            torch.tensor(indptr, dtype=torch.int32))


def rel_err(out, ref):
    """||out - ref|| / ||ref|| in float64, NaN if out has any."""
    out, ref = out.double().cpu(), ref.double().cpu()
    if torch.isnan(out).any():
        return float("nan")
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


@dataclass
class DecodeCase(_Shape):
    seq_lens: list
    sparse_keys: int = 0
    pool_rows: int = 23

    def id(self):
        return (f"S{self.seq_lens}" + self._shape_id()
                + (f"-K{self.sparse_keys}" if self.sparse_keys else ""))


def decode_lowest_readable(seq_len, window_left):
    """Lowest position the decode query (at seq_len - 1) may see: the test's own statement
    of the convention."""
    if window_left is None:
        return 0
    return max(seq_len - 1 - window_left, 0)


def build_decode(case: DecodeCase, device="cpu"):
    """Tensors for one decode case: (q, k_cache, v_cache, block_table, seq_lens).

    Only the rows of the query's window hold values: rows below it (also in the page the
    window starts in) and past the sequence end are NaN, pages wholly below the window
    are freed (-1 in the block table, NaN in the pool), and the entry past the last page is
    -1 too."""
    g = torch.Generator().manual_seed(case.seed)
    ps, hkv = case.page_size, case.num_kv_heads

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(case.dtype)

    q = rand(len(case.seq_lens), case.num_q_heads, case.head_dim)
    pages_per_seq = [-(-s // ps) for s in case.seq_lens]
    max_pages = max(pages_per_seq + [0]) + 1
    num_pages = sum(pages_per_seq) * 2 + 3
    perm = torch.randperm(num_pages, generator=g)
    k_cache = torch.full((num_pages, ps, hkv, case.head_dim), float("nan"), dtype=case.dtype)
    v_cache = torch.full((num_pages, ps, hkv, case.head_dim_v), float("nan"), dtype=case.dtype)
    block_table = torch.full((len(case.seq_lens), max_pages), -1, dtype=torch.int32)
    used = 0
    for b, s in enumerate(case.seq_lens):
        low = decode_lowest_readable(s, case.window_left)
        for i in range(pages_per_seq[b]):
            page = int(perm[used])
            used += 1
            if (i + 1) * ps <= low:
                continue  # wholly below the window: freed, never to be read
            block_table[b, i] = page
            first, last = max(low - i * ps, 0), min(s - i * ps, ps)  # window rows in this page
            k_cache[page, first:last] = rand(last - first, hkv, case.head_dim)
            v_cache[page, first:last] = rand(last - first, hkv, case.head_dim_v)
    tensors = (q, k_cache, v_cache, block_table, torch.tensor(case.seq_lens, dtype=torch.int32))
    return tuple(t.to(device) for t in tensors)


def build_sparse(case: DecodeCase, device="cpu"):
    """``(k_pool, v_pool, idx)`` for ``case.sparse_keys`` extra keys a sequence: random
    pool rows, about a quarter of the entries -1, and some rows named twice."""
    g = torch.Generator().manual_seed(case.seed + 7)
    rows, hkv = case.pool_rows, case.num_kv_heads
    k_pool = torch.randn(rows, hkv, case.head_dim, generator=g).to(case.dtype)
    v_pool = torch.randn(rows, hkv, case.head_dim_v, generator=g).to(case.dtype)
    idx = torch.randint(0, rows, (len(case.seq_lens), case.sparse_keys), generator=g)
    idx[torch.rand(idx.shape, generator=g) < 0.25] = -1
    if case.sparse_keys >= 2:
        idx[:, -1] = idx[:, 0]  # a duplicate (or a second -1)
    return k_pool.to(device), v_pool.to(device), idx.to(torch.int32).to(device)


def build_second(seqs, positions, rate, num_indices, *, entries, page_size, num_kv_heads,
                 head_dim, dtype, seed, window=True, head_dim_v=None, device="cpu"):
    """A second key source for ``seqs`` sequences of ``entries`` entries each (a
    ``swattn.SecondKeys``): a second paged cache whose slots past a sequence's entries are
    NaN, its block table with the columns past them -1, and with ``num_indices`` an index
    list a row (``positions``: each row's ``(sequence, query position)``) of entries below
    the row's limit, -1s, and entries past it (an indexer's picks among too few)."""
    from ..plan.second import SecondKeys

    g = torch.Generator().manual_seed(seed + 11)
    pages_each = max(-(-max(entries, default=1) // page_size), 1) + 1
    num_pages = seqs * pages_each + 2
    cache = torch.randn(num_pages, page_size, num_kv_heads, head_dim, generator=g)
    values = None
    if head_dim_v is not None and head_dim_v > head_dim:
        values = torch.randn(num_pages, page_size, num_kv_heads, head_dim_v, generator=g)
    table = torch.randperm(num_pages, generator=g)[:seqs * pages_each]
    table = table.reshape(seqs, pages_each).to(torch.int32)
    for b, held in enumerate(entries):
        for e in range(held, pages_each * page_size):
            for t in (cache, values) if values is not None else (cache,):
                t[table[b, e // page_size], e % page_size] = float("nan")
        table[b, -(-held // page_size):] = -1
    indices = None
    if num_indices:
        rows = []
        for seq, pos in positions:
            limit = min((pos + 1) // rate, entries[seq])
            picks = torch.randint(-1, limit + 2, (num_indices,), generator=g)
            rows.append(picks)
        indices = torch.stack(rows).to(torch.int32).to(device)
    return SecondKeys(cache.to(dtype).to(device), table.to(device),
                      torch.tensor(entries, dtype=torch.int32, device=device), rate=rate,
                      indices=indices, window=window,
                      values=None if values is None else values.to(dtype).to(device))
