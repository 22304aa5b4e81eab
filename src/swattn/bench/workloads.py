"""The named workloads (``docs/design.md`` tabulates them), in one place, and the work each case
does.

A :class:`Workload` is one row of that table (model shape, window, chunk, sinks, batch and
its (prefix, new) cases or decode contexts, a draft tree). :func:`extend_cases` turns an
extend workload into :class:`Case` objects, one per (prefix, new) pair, with the sizes
overridable from the command line (``--batch``, ``--cases``); :func:`decode_cases` turns a
decode workload (C-A, C-B, C-F, C-L4, S, V4-CSA, V4-HCA) into :class:`DecodeCase` objects
(``--batch``, ``--context``). A case knows the work it asks for: the visible (query, key)
pairs, counted exactly per query from the window, the chunk (L4, C-L4) and a tree verify's
mask (T) (plus the sparse keys of S and the second source's entries of the V4 rows), the
FLOPs over them and the bytes a kernel cannot avoid (Q, O, and the K, V within reach, each
once).

DeepSeek-V4's layers (V4-CSA, V4-HCA, V4-X) attend a window of the sliding cache and a
:class:`SecondSource` beside it (``swattn.SecondKeys``): compressed entries of ``rate``
tokens each, every closed one (HCA) or each row's ``topk`` (CSA's indexer), K = V.

A tree verify (T) hands each sequence's new tokens as a draft tree, level by level (a node
after its parent), at positions ``P + depth`` (siblings share one), with the custom mask of
``docs/design.md``'s conventions: every cached key, and among the new tokens a node's
ancestors and itself; the window is measured between positions.

Windows here are Hugging Face ``sliding_window`` values W (as model configs give them); the
kernels take ``window_left = W - 1`` (:func:`swattn.window.from_hf`).

Plain Python: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..window import decode_bounds, from_hf, row_key_range, second_limit

EXTEND_KINDS = ("extend", "mix", "second_extend")
DECODE_KINDS = ("decode", "sparse_decode", "second_decode")


@dataclass(frozen=True)
class SecondSource:
    """A second key source beside the window, as DeepSeek-V4's compressed caches: entry
    ``e`` stands for the tokens ``[e * rate, (e + 1) * rate)`` and closes at the last of
    them (:func:`swattn.window.second_limit`); a row sees either each closed entry
    (``topk`` 0: HCA) or the ``topk`` an indexer picks among them (CSA). The entries' values
    are their keys (K = V). ``layer`` names it in a case ("csa", "hca")."""

    layer: str
    rate: int
    topk: int = 0

    def held(self, tokens):
        """Entries a sequence of ``tokens`` tokens has closed (its second cache holds)."""
        return tokens // self.rate

    def visible(self, q_pos):
        """Entries the query at ``q_pos`` attends: those its position has closed, at most
        ``topk`` of them under an index list (the bench's lists name distinct entries)."""
        closed = second_limit(q_pos, self.rate, self.held(q_pos + 1))
        return min(closed, self.topk) if self.topk else closed


@dataclass(frozen=True)
class Workload:
    """One named workload (the table of docs/design.md).

    ``cases`` are (prefix, new tokens) per sequence for extend workloads; ``context`` is
    the decode context (tokens in cache, the new one included). ``full_layers`` and
    ``window_layers`` split a prefill mix (M) into the layers that run each kind.
    """

    name: str
    title: str
    kind: str  # "extend" | "decode" | "mix" | "sparse_decode"
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    head_dim_v: int
    sliding_window: int | None  # Hugging Face W; None = full attention
    sinks: bool
    batch: int
    cases: tuple[tuple[int, int], ...] = ()
    context: int | None = None
    sparse_keys: int = 0
    window_layers: int = 0
    full_layers: int = 0
    note: str = ""
    # The values are the keys' first head_dim_v columns (a latent cache, as DeepSeek's MLA).
    latent: bool = False
    # Chunked local attention (Llama 4's attention_chunk_size): a query sees only the keys
    # of its own chunk of this many positions, on top of any window (None: off).
    attention_chunk: int | None = None
    # A decode workload's contexts, one case each (default: (context,)).
    contexts: tuple[int, ...] = ()
    # A tree verify's draft tree: the nodes at each depth, the root's level first
    # (tree_parents gives each node's parent); () for a chain of new tokens.
    tree_levels: tuple[int, ...] = ()
    # A decode workload's batch sizes, each context at each (default: (batch,)).
    batches: tuple[int, ...] = ()
    # Second key sources beside the window (DeepSeek-V4): one case per source and shape,
    # named by its layer where there are several.
    second: tuple[SecondSource, ...] = ()

    @property
    def window_left(self):
        return from_hf(self.sliding_window)


WORKLOADS = {
    w.name: w
    for w in (
        Workload("A", "gpt-oss-120b at TP4, extend", "extend", 16, 2, 64, 64, 128, True, 8,
                 cases=((0, 8192), (128, 8192), (4096, 4096), (8192, 8192), (7168, 1024))),
        Workload("B", "Mistral-style, extend", "extend", 32, 8, 128, 128, 4096, False, 4,
                 cases=((0, 8192), (8192, 8192))),
        Workload("F", "gpt-oss-120b at TP4, full-attention layer, extend", "extend", 16, 2, 64, 64,
                 None, True, 8, cases=((0, 4096), (4096, 4096)),
                 note="the full layers of M as their own row: window_left=None"),
        Workload("C-A", "gpt-oss decode", "decode", 16, 2, 64, 64, 128, True, 64, context=32768),
        Workload("C-B", "Mistral-style decode", "decode", 32, 8, 128, 128, 4096, False, 64,
                 context=32768),
        Workload("C-F", "gpt-oss-120b at TP4, full-attention layer, decode", "decode", 16, 2, 64,
                 64, None, True, 64, context=32768,
                 note="the full layers beside C-A's window layers: window_left=None"),
        Workload("M", "gpt-oss-120b TP4 prefill mix", "mix", 16, 2, 64, 64, 128, True, 8,
                 cases=((0, 4096), (4096, 4096)), window_layers=18, full_layers=18,
                 note="input 8192 in chunks of 4096; window 128 on 18 layers, full on 18"),
        Workload("S", "DeepSeek-style sparse + window decode", "sparse_decode", 64, 1, 576, 512,
                 128, True, 64, context=32768, sparse_keys=512,
                 note="MQA over a latent cache (values the keys' first 512 columns); 512 "
                      "sparse keys from a separate pool", latent=True),
        Workload("L4", "Llama 4 Scout, chunked local attention layer, extend", "extend", 40, 8,
                 128, 128, None, False, 4,
                 cases=((0, 8192), (8192, 8192), (16384, 8192), (24576, 8192)),
                 attention_chunk=8192,
                 note="a 32k-token prefill in steps of 8192, the steps before as the cached "
                      "prefix; chunk 8192, no window: each step is one chunk and sees none of "
                      "its prefix"),
        Workload("C-L4", "Llama 4 Scout, chunked local attention layer, decode", "decode", 40, 8,
                 128, 128, None, False, 64, context=32768, contexts=(32768, 131072),
                 attention_chunk=8192,
                 note="the new token sees the 8192 keys of its chunk at both contexts"),
        Workload("T", "gpt-oss-120b window layer, tree verify", "extend", 64, 8, 64, 64, 128,
                 True, 32, cases=((4096, 64),), tree_levels=(1, 3, 6, 9, 9, 12, 12, 12),
                 note="a draft tree of 64 tokens over 8 levels (positions P .. P + 7) per "
                      "sequence, the ancestor mask"),
        Workload("V4-CSA", "DeepSeek-V4, compressed sparse attention layer, decode",
                 "second_decode", 64, 1, 512, 512, 128, True, 64, context=8192,
                 contexts=(8192, 131072), batches=(64, 256), latent=True,
                 second=(SecondSource("csa", 4, 512),),
                 note="MQA, K = V; a window of 128 over the sliding cache and the indexer's "
                      "top 512 of the entries compressed 4 to 1, one softmax with the sinks"),
        Workload("V4-HCA", "DeepSeek-V4, heavily compressed attention layer, decode",
                 "second_decode", 64, 1, 512, 512, 128, True, 64, context=8192,
                 contexts=(8192, 131072), batches=(64, 256), latent=True,
                 second=(SecondSource("hca", 128, 0),),
                 note="MQA, K = V; a window of 128 and every entry compressed 128 to 1 that "
                      "the position has closed"),
        Workload("V4-X", "DeepSeek-V4, extend", "second_extend", 64, 1, 512, 512, 128, True, 1,
                 cases=((32768, 8192),), latent=True,
                 second=(SecondSource("csa", 4, 512), SecondSource("hca", 128, 0)),
                 note="a chunk of 8192 after a 32k prefix (one request's chunked prefill), "
                      "each new token its window and its compressed entries; a CSA and an "
                      "HCA layer"),
    )
}


# --------------------------------------------------------------------------------------
# Draft trees (T) and the first key a query sees.
# --------------------------------------------------------------------------------------

def tree_parents(levels):
    """Each node's parent (-1: the root) of a draft tree with ``levels[d]`` nodes at depth d,
    in level order (every node after its parent): node ``i`` of a level of ``n`` nodes hangs
    under node ``i * m // n`` of the ``m`` above it, so the branches spread evenly."""
    if not levels or levels[0] != 1 or any(n < 1 for n in levels):
        raise ValueError(f"a tree has one root and >= 1 node a level, got levels {levels}")
    parents, above = [-1], [0]
    for n in levels[1:]:
        level = [len(parents) + i for i in range(n)]
        parents += [above[i * len(above) // n] for i in range(n)]
        above = level
    return tuple(parents)


def tree_depths(parents):
    """Each node's depth (the root 0) from its parent (nodes after their parents)."""
    depths = []
    for parent in parents:
        depths.append(0 if parent < 0 else depths[parent] + 1)
    return depths


def tree_ancestors(parents):
    """Per node, the nodes it sees among the new tokens: its ancestors and itself."""
    seen = []
    for i, parent in enumerate(parents):
        seen.append((seen[parent] if parent >= 0 else ()) + (i,))
    return seen


def first_key(q_pos, window_left, chunk):
    """The lowest key position the query at ``q_pos`` sees under the window and the chunk
    (:func:`swattn.window.row_key_range` over the keys ``[0, q_pos]``)."""
    lo, _ = row_key_range(q_pos, 0, q_pos + 1, window_left or 0, 0, chunk or 1,
                          window_left is not None, chunk is not None, True, False)
    return lo


@dataclass(frozen=True)
class _Measured:
    """What an extend and a decode case share: the model shape, and the batch and FLOPs
    counted from a subclass's per-sequence entries (``per_seq``) and visible pairs.
    ``window_left`` is the kernels' convention (None = full attention)."""

    workload: str
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    head_dim_v: int
    window_left: int | None
    sinks: bool

    @property
    def batch(self):
        return len(self.per_seq)

    @property
    def uniform(self):
        return len(set(self.per_seq)) == 1

    def flops(self):
        """``2 * pairs * Hq * (D + Dv)``: QK^T and PV over the visible (query, key) pairs
        only (``4 * pairs * D * Hq`` when ``D == Dv``)."""
        return 2 * self.visible_pairs() * self.num_q_heads * (self.head_dim + self.head_dim_v)


@dataclass(frozen=True)
class Case(_Measured):
    """One extend measurement: every sequence's (prefix, new) and the model shape.

    ``page_size`` is the paged cache's (the token pool of SGLang is a page-size-1 view of
    the same memory).
    """

    seqs: tuple[tuple[int, int], ...]
    page_size: int = 16
    layer: str = ""  # "window" / "full" for the layers of a mix, else ""
    attention_chunk: int | None = None
    # A tree verify: each node's parent (tree_parents); every sequence's new tokens are this
    # tree. () for a chain.
    tree: tuple[int, ...] = ()
    # A second key source beside the window (V4-X), and whether the values are the keys'
    # first head_dim_v columns (then K alone is read).
    second: SecondSource | None = None
    latent: bool = False

    @property
    def per_seq(self):
        return self.seqs

    @property
    def name(self):
        """``A P128 E8192`` (uniform batch) or ``A P0:E8192,P128:E64`` (ragged)."""
        head = self.workload + (f"/{self.layer}" if self.layer else "")
        if self.uniform:
            prefix, new = self.seqs[0]
            return f"{head} P{prefix} E{new}"
        return head + " " + ",".join(f"P{p}:E{e}" for p, e in self.seqs)

    @property
    def num_tokens(self):
        return sum(new for _, new in self.seqs)

    def lowest_key(self, prefix):
        """Lowest key position any new token of a sequence with this prefix can see: the
        first new token's (at position P, a tree's root too) window and chunk start."""
        return first_key(prefix, self.window_left, self.attention_chunk)

    def positions(self, prefix, new):
        """The new tokens' positions of a sequence: ``P + depth`` over a tree, else ``P + i``."""
        if self.tree:
            return [prefix + d for d in tree_depths(self.tree[:new])]
        return list(range(prefix, prefix + new))

    def visible_pairs(self):
        """(query, key) pairs inside the window and chunk (and a tree's mask), plus each
        row's second-source entries, over all sequences (one head)."""
        pairs = sum(visible_pairs(p, e, self.window_left, self.attention_chunk, self.tree)
                    for p, e in self.seqs)
        if self.second is not None:
            pairs += sum(self.second.visible(q) for p, e in self.seqs for q in range(p, p + e))
        return pairs

    def entries_in_reach(self, prefix, new):
        """Second-source entries some row of a sequence may read: those the last row has
        closed (under an index list at most ``new * topk``; the bench's lists over a chunk
        of thousands of rows name nearly all)."""
        if self.second is None or new < 1:
            return 0
        held = self.second.held(prefix + new)
        return min(held, new * self.second.topk) if self.second.topk else held

    def keys_in_reach(self):
        """Keys some query sees, over all sequences: ``[lowest_key, P + E)`` each, and the
        second source's entries in reach."""
        return sum(p + e - self.lowest_key(p) + self.entries_in_reach(p, e)
                   for p, e in self.seqs if e > 0)

    def bytes_moved(self, element_size=2, kv_element_size=None):
        """Q and O of the new tokens and K, V within reach, each once (K and V at
        ``kv_element_size`` bytes an element, by default ``element_size``; where the values
        are the keys' first columns, the K rows alone)."""
        q_o = self.num_tokens * self.num_q_heads * (self.head_dim + self.head_dim_v)
        width = self.head_dim + (0 if self.latent else self.head_dim_v)
        k_v = self.keys_in_reach() * self.num_kv_heads * width
        return q_o * element_size + k_v * (kv_element_size or element_size)


def visible_pairs(prefix_len, extend_len, window_left, chunk=None, tree=()):
    """Exact count of (query, key) pairs a causal window keeps for one sequence.

    The query at position ``p`` sees ``min(p, L) + 1`` keys (``p + 1`` with no window):
    summed over ``p = P .. P + E - 1`` in closed form. Under a ``chunk`` (or a ``tree``:
    each node's parent, nodes at ``P + depth``) query by query: the cached keys from its
    :func:`first_key` up, and the new tokens it sees (those before it, or a node's ancestors
    and itself) at or past that key.
    """
    if chunk is not None or tree:
        seen = tree_ancestors(tree[:extend_len]) if tree else None
        pos = ([prefix_len + d for d in tree_depths(tree[:extend_len])] if tree
               else range(prefix_len, prefix_len + extend_len))
        total = 0
        for i, q_pos in enumerate(pos):
            lo = first_key(q_pos, window_left, chunk)
            total += max(prefix_len - lo, 0)
            if seen is None:
                total += q_pos + 1 - max(lo, prefix_len)
            else:
                total += sum(1 for a in seen[i] if pos[a] >= lo)
        return total

    def upto(n):
        # Keys seen by the queries at positions 0 .. n-1.
        if window_left is None or n <= window_left + 1:
            return n * (n + 1) // 2
        width = window_left + 1
        return width * (width + 1) // 2 + (n - width) * width

    return upto(prefix_len + extend_len) - upto(prefix_len)


def parse_cases(text):
    """``"P:E,P:E"`` (or ``"PxE"``) to ``((P, E), ...)`` (swattn.tiles.parse_workload), every
    case with at least one new token; ValueError naming a bad item."""
    from ..tiles import parse_workload
    cases = tuple(parse_workload(text.replace("x", ":")))
    for prefix, new in cases:
        if new < 1:
            raise ValueError(f"cases need PREFIX >= 0 and NEW >= 1, got {prefix}:{new}")
    return cases


def get(name):
    """The workload called ``name`` (case-insensitive); ValueError listing the known ones."""
    for key, workload in WORKLOADS.items():
        if key.lower() == name.strip().lower():
            return workload
    raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")


def extend_cases(workload, *, batch=None, cases=None, page_size=16, max_tokens_per_seq=None):
    """The :class:`Case` list of an extend (or mix) workload, sizes overridable.

    ``batch`` replaces the batch size, ``cases`` the (prefix, new) pairs; every sequence of
    a case has the same (prefix, new). A mix (M) gives each case twice: its window layers'
    and its full layers'. ``max_tokens_per_seq`` drops cases longer than that (prefix +
    new), to keep GPU memory modest.
    """
    if isinstance(workload, str):
        workload = get(workload)
    if workload.kind not in EXTEND_KINDS:
        raise ValueError(f"workload {workload.name} is a {workload.kind} workload, not extend")
    batch = workload.batch if batch is None else batch
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    pairs = workload.cases if cases is None else tuple(cases)
    tree = tree_parents(workload.tree_levels) if workload.tree_levels else ()
    if tree and any(new != len(tree) for _, new in pairs):
        raise ValueError(f"workload {workload.name} verifies a tree of {len(tree)} new tokens: "
                         f"its cases need NEW = {len(tree)}")
    layers = [("", workload.window_left, None)]
    if workload.kind == "mix":
        layers = [("window", workload.window_left, None), ("full", None, None)]
    if workload.second:
        layers = [(source.layer if len(workload.second) > 1 else "", workload.window_left,
                   source) for source in workload.second]
    out = []
    for prefix, new in pairs:
        if max_tokens_per_seq is not None and prefix + new > max_tokens_per_seq:
            continue
        for layer, window_left, source in layers:
            out.append(Case(workload.name, workload.num_q_heads, workload.num_kv_heads,
                            workload.head_dim, workload.head_dim_v, window_left, workload.sinks,
                            ((prefix, new),) * batch, page_size, layer,
                            workload.attention_chunk, tree, source, workload.latent))
    return out


# --------------------------------------------------------------------------------------
# Decode.
# --------------------------------------------------------------------------------------

def sparse_invalid(sparse_keys):
    """-1 entries per row of a sparse index list of ``sparse_keys`` entries in the decode
    inputs: one in 16 (the rest name distinct pool rows), so the work is exact."""
    return sparse_keys // 16


@dataclass(frozen=True)
class DecodeCase(_Measured):
    """One decode measurement: one new token per sequence over its paged cache.

    ``seq_lens`` are the tokens in cache per sequence, the new one included (it sits at
    ``S - 1``). ``sparse_keys`` is K, the width of the sparse index list of S (each row
    holds ``sparse_valid`` distinct pool rows and -1 in the rest).
    """

    seq_lens: tuple[int, ...]
    sparse_keys: int = 0
    page_size: int = 16
    latent: bool = False  # the workload's: values are the keys' first head_dim_v columns
    attention_chunk: int | None = None
    # A second key source beside the window (V4-CSA, V4-HCA), and whether the name carries
    # the batch (a workload of several batch sizes).
    second: SecondSource | None = None
    named_batch: bool = False

    kind = "decode"

    @property
    def per_seq(self):
        return self.seq_lens

    @property
    def name(self):
        """``C-A S32768`` (uniform batch; ``V4-CSA B64 S8192`` where the workload has several
        batch sizes) or ``C-A S100,S7`` (ragged)."""
        head = self.workload + (f" B{self.batch}" if self.named_batch else "")
        if self.uniform:
            return f"{head} S{self.seq_lens[0]}"
        return head + " " + ",".join(f"S{s}" for s in self.seq_lens)

    @property
    def sparse_valid(self):
        """Sparse keys each sequence attends (entries of its index row that are not -1)."""
        return self.sparse_keys - sparse_invalid(self.sparse_keys)

    def window_keys(self, seq_len):
        """Cached keys the new token sees: ``min(L + 1, S)`` (``S`` with no window), and
        under a chunk only those of its chunk (:func:`swattn.window.decode_bounds`)."""
        lo, hi = decode_bounds(seq_len, self.window_left, self.attention_chunk)
        return hi - lo

    def lowest_key(self, seq_len):
        """Position of the first visible cached key: ``max(0, S - 1 - L)``, under a chunk no
        lower than the chunk's first position."""
        return seq_len - self.window_keys(seq_len)

    def second_keys(self, seq_len):
        """The second source's entries the new token (at ``seq_len - 1``) attends."""
        return self.second.visible(seq_len - 1) if self.second is not None and seq_len else 0

    def keys(self):
        """Keys attended over all sequences (one head): window keys plus sparse keys (S) or
        the second source's entries (V4)."""
        return sum(self.window_keys(s) + (self.sparse_valid if s > 0 else 0)
                   + self.second_keys(s) for s in self.seq_lens)

    def visible_pairs(self):
        """(query, key) pairs over all sequences (one head): one query each, so the keys."""
        return self.keys()

    def bytes_moved(self, element_size=2, kv_element_size=None):
        """Q and O of the new tokens and the K, V rows of the window (and the sparse rows),
        each once (K and V at ``kv_element_size`` bytes an element, by default
        ``element_size``; over a latent cache the K rows alone, which hold the values)."""
        q_o = self.batch * self.num_q_heads * (self.head_dim + self.head_dim_v)
        k_v = self.keys() * self.num_kv_heads * (self.head_dim + (0 if self.latent
                                                                  else self.head_dim_v))
        return q_o * element_size + k_v * (kv_element_size or element_size)


def parse_contexts(text):
    """``"32768"`` or ``"4096,32768"`` to ``(4096, 32768)``; ValueError naming a bad item."""
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            value = int(item)
        except ValueError:
            raise ValueError(f"contexts are integers >= 1, got {item!r}") from None
        if value < 1:
            raise ValueError(f"contexts are integers >= 1, got {value}")
        out.append(value)
    if not out:
        raise ValueError(f"no context in {text!r}")
    return tuple(out)


def decode_cases(workload, *, batch=None, contexts=None, page_size=16):
    """The :class:`DecodeCase` list of a decode workload (C-A, C-B, C-F, C-L4, S, V4-CSA,
    V4-HCA): one case per batch size (``batch``, else the workload's) and context (default
    the workload's), every sequence of a case at the same context."""
    if isinstance(workload, str):
        workload = get(workload)
    if workload.kind not in DECODE_KINDS:
        raise ValueError(f"workload {workload.name} is a {workload.kind} workload, not decode")
    batches = (batch,) if batch is not None else (workload.batches or (workload.batch,))
    if min(batches) < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if contexts is None:
        contexts = workload.contexts or (workload.context,)
    source = workload.second[0] if workload.second else None
    return [DecodeCase(workload.name, workload.num_q_heads, workload.num_kv_heads,
                       workload.head_dim, workload.head_dim_v, workload.window_left,
                       workload.sinks, (context,) * size, workload.sparse_keys, page_size,
                       workload.latent, workload.attention_chunk, source,
                       len(workload.batches) > 1)
            for size in batches for context in tuple(contexts)]
