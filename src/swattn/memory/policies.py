"""How many pages each policy holds over a trace: ours (:class:`swattn.memory.KVMemory`
itself), and the documented rules of the engines it is compared with, each applied to the
same steps of the same sequences (``swattn memory-sim``).

A policy is told each step's tokens before the step runs (:meth:`reserve`, ``(seq_id,
tokens, decode)`` triples: its pages must be there), then that the step finished
(:meth:`commit`), and when a sequence is done (:meth:`release`); :meth:`held` is the pages it
holds in a group. Full-attention groups keep
every page in every policy; the policies differ in where a sliding group's first kept page
is:

- ``ours``: :func:`first_page_kept` of the committed length, from the commit on;
- ``vllm``: the same rule one step late: after engine step ``t`` a sequence keeps what
  ours kept after step ``t - 1`` (vLLM's hybrid allocator frees out-of-window blocks when
  it allocates the next step's, from the length before it), at the same block size;
- ``sglang``: SGLang's SWA eviction: a page-aligned frontier ``floor_P(pre_len - W - P)``
  (``W`` its ``sliding_window_size``, our ``window_left``, or under chunked attention the
  chunk size; ``P`` the page size; ``pre_len`` the tokens before the step), moved at each of
  the sequence's prefill chunks and once every ``W`` decode steps (rounded down to pages),
  from the first; its SWA pool is sized ``swa_full_tokens_ratio`` (0.8) times the full pool;
- ``unaware``: no sliding group frees anything: every layer keeps every page.
"""

from __future__ import annotations

from .groups import LayerGroup, Schedule, first_page_kept, pages_for
from .manager import KVMemory

POLICIES = ("ours", "vllm", "sglang", "unaware")
SGLANG_SWA_RATIO = 0.8


class Ours:
    """:class:`KVMemory` with pools large enough for the trace (it counts; it never
    refuses)."""

    name = "ours"

    def __init__(self, model, max_step_tokens, pages):
        self.groups = [LayerGroup(g.name, model.page_size, pages, g.window_left,
                                  g.attention_chunk) for g in model.groups]
        self.memory = KVMemory(self.groups, Schedule(max_step_tokens), prefix_cache=False)

    def add(self, seq_id):
        self.memory.add(seq_id)

    def reserve(self, steps):
        self.memory.reserve_batch([(seq_id, count, 0) for seq_id, count, _ in steps],
                                  slots=False)

    def commit(self, steps):
        for seq_id, _, _ in steps:
            self.memory.commit(seq_id)

    def release(self, seq_id):
        self.memory.release(seq_id)

    def held(self, group):
        return self.memory.held(group)


class _Frontiers:
    """A peer's accounting: per sequence its reserved end and, per sliding group, its first
    kept page (:meth:`first_kept`, the peer's rule)."""

    def __init__(self, model):
        self.model = model
        self.page = model.page_size
        self.sliding = [g for g in model.groups if g.slides]
        self.seqs = {}

    def add(self, seq_id):
        self.seqs[seq_id] = {"committed": 0, "end": 0, "decodes": 0, "previous": 0,
                             "first": {g.name: 0 for g in self.sliding}}

    def reserve(self, steps):
        for seq_id, count, decode in steps:
            seq = self.seqs[seq_id]
            seq["end"] = seq["committed"] + count
            self.before_step(seq, decode)

    def commit(self, steps):
        stepped = [seq_id for seq_id, _, _ in steps]
        for seq_id in stepped:
            self.seqs[seq_id]["committed"] = self.seqs[seq_id]["end"]
        self.after_step(stepped)

    def release(self, seq_id):
        del self.seqs[seq_id]

    def held(self, group):
        pages = [pages_for(seq["end"], self.page) for seq in self.seqs.values()]
        if not any(g.name == group for g in self.sliding):
            return sum(pages)
        return sum(max(n - seq["first"][group], 0) for n, seq in zip(pages, self.seqs.values()))

    def before_step(self, seq, decode):
        pass

    def after_step(self, stepped):
        pass


class Unaware(_Frontiers):
    name = "unaware"


class VLLM(_Frontiers):
    """One engine step late: after each step a sequence keeps what ours kept after the
    step before (the committed length one step earlier)."""

    name = "vllm"

    def __init__(self, model):
        super().__init__(model)
        self.groups = [_as_group(g, self.page) for g in self.sliding]
        self.recent = []  # the sequences the step before stepped: their frontier lags

    def after_step(self, stepped):
        for seq_id in dict.fromkeys([*self.recent, *stepped]):
            seq = self.seqs.get(seq_id)
            if seq is None:
                continue
            for g in self.groups:
                seq["first"][g.name] = max(seq["first"][g.name],
                                           first_page_kept(g, seq["previous"]))
            seq["previous"] = seq["committed"]
        self.recent = stepped


class SGLang(_Frontiers):
    """SGLang's SWA eviction, per sequence: at each prefill chunk and every ``W`` decode
    steps (from the first), the frontier ``floor_P(pre_len - W - P)``."""

    name = "sglang"

    def before_step(self, seq, decode):
        for g in self.sliding:
            reach = g.window_left if g.window_left is not None else g.attention_chunk
            interval = max(self.page, reach // self.page * self.page)
            if decode and seq["decodes"] % interval:
                continue
            frontier = max(seq["committed"] - reach - self.page, 0) // self.page
            seq["first"][g.name] = max(seq["first"][g.name], frontier)
        seq["decodes"] += decode


def _as_group(shape, page_size):
    return LayerGroup(shape.name, page_size, 1, shape.window_left, shape.attention_chunk)


def make_policy(name, model, max_step_tokens, pages):
    if name == "ours":
        return Ours(model, max_step_tokens, pages)
    return {"vllm": VLLM, "sglang": SGLang, "unaware": Unaware}[name](model)
