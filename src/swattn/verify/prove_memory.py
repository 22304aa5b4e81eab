"""The schedule prover: :class:`swattn.memory.KVMemory` never frees a page a step not yet
finished reads, and frees every page none reads.

For every configuration of a grid (a sliding group's window and chunk, its page size, the
tokens a prefill step adds, the drafts a decode step carries, the engine's lag, and a start
from nothing or from a prefix-cache hit), one sequence is driven through the real manager
over every history its steps can take: prefill chunks up to the prompt's end, then decode
steps of ``1 + drafts`` tokens, ``lag + 1`` steps open at once, and at each commit every
number of accepted tokens the step allows (each branch on a copy of the manager; states
already seen are not walked again). After every commit and the reservations that follow
it, every open step is checked at each position it can still take (earlier open steps may
roll back their drafts and move it down):

- its reads: the block-table entries its kernels load, from their own bounds in
  :mod:`swattn.window`: for each tiling, every query block's tiles of the extend loops
  (``key_bounds`` of stage 1 and of the unified loop) from the block's lowest key (the
  rows' :func:`~swattn.window.row_key_range`), below the step's first position; and for a
  one-token step, the decode loop's keys (``decode_bounds``) in every split of
  ``decode_split_bounds``, Triton's tiles and the aligned ones. Its writes: its tokens'
  pages. Each such page must be held by the sequence (else a **violation**: freed early);
- tightness: every page the sequence holds must be read or written by an open step (else
  it is **late**: held with no reader);
- the ring: the pages held fall on distinct columns of :func:`~swattn.memory.ring_width`
  and number at most that width (else **ring_collisions**, **over_width**).

When the trace ends the sequence is released and every page it held must be free or held
by the prefix cache alone (else **leaks**). Counts, not samples: every history of the
grid's traces is walked.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

from ..memory import KVMemory, LayerGroup, Schedule, first_page_kept, ring_width
from ..window import Window, decode_bounds, decode_split_bounds, key_bounds, row_key_range

FAILURES = ("violations", "late", "ring_collisions", "over_width", "leaks")
DECODE_SPLITS = (1, 2, 3, 4)


@dataclass(frozen=True)
class MemoryGrid:
    """The schedules to prove: every ``(window_left, attention_chunk)`` of ``windows`` x
    page size x prefill step x drafts x lag x start (``"fresh"``, ``"hit"``)."""

    windows: tuple
    page_sizes: tuple
    prefill_steps: tuple
    drafts: tuple
    lags: tuple
    tilings: tuple = ((16, 16), (16, 32), (32, 16))
    starts: tuple = ("fresh", "hit")

    def configs(self):
        return itertools.product(self.windows, self.page_sizes, self.prefill_steps, self.drafts,
                                 self.lags, self.starts)

    def describe(self):
        return {"windows": [list(w) for w in self.windows], "page_sizes": list(self.page_sizes),
                "prefill_steps": list(self.prefill_steps), "drafts": list(self.drafts),
                "lags": list(self.lags), "tilings": [list(t) for t in self.tilings],
                "starts": list(self.starts)}


DEFAULT_MEMORY_GRID = MemoryGrid(
    windows=((0, None), (1, None), (3, None), (4, None), (7, None), (8, None), (17, None),
             (None, 1), (None, 4), (None, 6), (None, 8), (5, 8), (8, 6)),
    page_sizes=(1, 2, 3, 4, 8),
    prefill_steps=(1, 3, 4, 7),
    drafts=(0, 1, 3),
    lags=(0, 1, 2),
)

QUICK_MEMORY_GRID = MemoryGrid(
    windows=((0, None), (3, None), (8, None), (None, 4), (5, 8)),
    page_sizes=(1, 3, 4),
    prefill_steps=(1, 5),
    drafts=(0, 2),
    lags=(0, 1),
)


class _Steps:
    """The pages one configuration's steps read and write, from the kernels' bounds."""

    def __init__(self, window_left, chunk, page_size, tilings):
        self.window = Window(window_left, None, True, chunk)
        self.left, self.chunk, self.page, self.tilings = window_left, chunk, page_size, tilings
        self.block_ns = sorted({n for _, n in tilings})
        self.memo = {}

    def _lowest(self, rows, range_end):
        """The block's lowest loaded key: the least start of its rows' nonempty ranges."""
        starts = [lo for lo, hi in (
            row_key_range(q, 0, range_end, self.left or 0, 0, self.chunk or 1,
                          self.left is not None, self.chunk is not None, True, False)
            for q in rows) if max(lo, 0) < hi]
        return max(min(starts), 0) if starts else range_end

    def reads(self, start, count):
        """Logical pages whose block-table entries a step of ``count`` tokens from position
        ``start`` loads for keys written before it (below ``start``: decode's own key is
        the step's write)."""
        key = (start, count)
        if key in self.memo:
            return self.memo[key]
        keys = set()
        for (block_m, block_n), loop in itertools.product(self.tilings, ("stage1", "unified")):
            range_end = start if loop == "stage1" else start + count
            for block_start in range(0, count, block_m):
                rows = range(start + block_start, start + min(block_start + block_m, count))
                lo, hi = key_bounds(loop, start, count, block_start, block_m, block_n,
                                    self.window)
                keys.update(range(max(lo, self._lowest(rows, range_end)), min(hi, start)))
        if count == 1:
            seq_len = start + 1
            lo, hi = decode_bounds(seq_len, self.left, self.chunk)
            for block_n, splits, aligned in itertools.product(self.block_ns, DECODE_SPLITS,
                                                              (False, True)):
                for i_split in range(splits):
                    a, b = decode_split_bounds(seq_len, self.left, block_n, splits, i_split,
                                               aligned, self.chunk)
                    keys.update(range(max(a, lo), min(b, hi, start)))
        pages = frozenset(k // self.page for k in keys)
        self.memo[key] = pages
        return pages

    def writes(self, start, count):
        return range(start // self.page, (start + count - 1) // self.page + 1)


def _needed(steps, committed, open_steps):
    """``(pages read or written by the open steps at every position each can take, reads
    checked)``; with no step open, the pages the least next step (one token at
    ``committed``, not yet reserved) reads, and the page it writes where earlier tokens
    already fill part of it."""
    if not open_steps:
        reads = steps.reads(committed, 1)
        part = {committed // steps.page} if committed % steps.page else set()
        return set(reads) | part, len(reads)
    needed, checked, start, pending = set(), 0, committed, 0
    for count, drafts in open_steps:
        for real in range(start - pending, start + 1):
            reads = steps.reads(real, count)
            needed.update(reads)
            needed.update(steps.writes(real, count))
            checked += len(reads)
        start += count
        pending += drafts
    return needed, checked


def _trace_lengths(group, schedule, prefill_step):
    """(prompt, total): long enough for the window to slide past several pages while the
    prompt is prefilled and again while decoding."""
    reach, page = group.reach, group.page_size
    prompt = reach + 1 + 2 * prefill_step + page
    return prompt, prompt + reach + 1 + 2 * schedule.open_tokens + page


def prove_config(window, page_size, prefill_step, drafts, lag, start, tilings,
                 keep_from=first_page_kept, stats=None):
    """Walk every history of one configuration; adds to and returns ``stats``."""
    stats = new_stats() if stats is None else stats
    window_left, chunk = window
    decode_step = 1 + drafts
    schedule = Schedule(max(prefill_step, decode_step), drafts, lag)
    probe = LayerGroup("sliding", page_size, 1, window_left, chunk)
    prompt_len, total = _trace_lengths(probe, schedule, prefill_step)
    pages = 4 * (total // page_size + 2)
    group = LayerGroup("sliding", page_size, pages, window_left, chunk)
    memory = KVMemory([group, LayerGroup("full", page_size, pages)], schedule,
                      keep_prompt_ends=True, keep_from=keep_from)
    width = ring_width(group, schedule)
    prompt = list(range(1, prompt_len + 1))
    if start == "hit":  # another sequence computes the prompt first and leaves its pages
        memory.add("first", prompt)
        while memory.reserved_end("first") < prompt_len:
            memory.reserve("first", min(prefill_step, prompt_len - memory.reserved_end("first")))
            memory.commit("first")
        memory.release("first")
    hit = memory.add("seq", prompt)
    stats["hits"] += hit.tokens > 0
    steps = _Steps(window_left, chunk, page_size, tilings)
    seen = set()

    def fill(memory):
        while len(memory.open_steps("seq")) < schedule.open_steps:
            end = memory.reserved_end("seq")
            if end >= total:
                return
            if end < prompt_len:
                memory.reserve("seq", min(prefill_step, prompt_len - end))
            else:
                memory.reserve("seq", min(decode_step, total - end), min(drafts, total - end - 1))

    def check(memory):
        stats["states"] += 1
        open_steps = memory.open_steps("seq")
        stats["steps"] += len(open_steps)
        needed, checked = _needed(steps, memory.committed("seq"), open_steps)
        stats["reads"] += checked
        held = {j for j, page in enumerate(memory.pages("sliding", "seq")) if page >= 0}
        stats["violations"] += len(needed - held)
        stats["late"] += len(held - needed)
        stats["witnesses"] += bool(held) and min(held) in needed
        stats["max_held"] = max(stats["max_held"], len(held))
        stats["over_width"] += len(held) > width
        stats["ring_collisions"] += len(held) - len({j % width for j in held})

    def walk(memory):
        fill(memory)
        key = (memory.committed("seq"), tuple(memory.open_steps("seq")))
        if key in seen:
            return
        seen.add(key)
        check(memory)
        open_steps = memory.open_steps("seq")
        if not open_steps:
            before = memory.pools["sliding"].frees
            memory.release("seq")
            stats["frees"] += memory.pools["sliding"].frees - before
            cached = len(memory.cache.entries["sliding"])
            stats["leaks"] += memory.pools["sliding"].held - cached
            return
        count, step_drafts = open_steps[0]
        for accepted in range(count - step_drafts, count + 1):
            branch = memory.copy() if accepted < count else memory
            before = branch.pools["sliding"].frees
            branch.commit("seq", accepted)
            stats["frees"] += branch.pools["sliding"].frees - before
            walk(branch)

    walk(memory)
    stats["configs"] += 1
    stats["width"] = max(stats["width"], width)
    return stats


def new_stats():
    return {"configs": 0, "states": 0, "steps": 0, "reads": 0, "frees": 0, "hits": 0,
            "violations": 0, "late": 0, "witnesses": 0, "ring_collisions": 0, "over_width": 0,
            "leaks": 0, "max_held": 0, "width": 0, "seconds": 0.0}


def prove_memory(grid=DEFAULT_MEMORY_GRID, keep_from=first_page_kept):
    """Counts of the schedule over ``grid``, with ``ok`` False on any failure."""
    started = time.perf_counter()
    stats = new_stats()
    for window, page, prefill_step, drafts, lag, start in grid.configs():
        prove_config(window, page, prefill_step, drafts, lag, start, grid.tilings, keep_from,
                     stats)
    stats["seconds"] = time.perf_counter() - started
    stats["ok"] = not any(stats[key] for key in FAILURES)
    stats["grid"] = grid.describe()
    return stats


_COLUMNS = (("configs", "configs"), ("states", "states"), ("steps", "open steps"),
            ("reads", "pages read"), ("frees", "frees"), ("hits", "hits"),
            ("violations", "freed early"), ("late", "held late"), ("witnesses", "witnesses"),
            ("ring_collisions", "ring collisions"), ("over_width", "over width"),
            ("leaks", "leaks"))


def format_memory_report(stats):
    """The schedule's lines of the ``swattn prove`` report."""
    grid = stats["grid"]
    windows = ", ".join(f"L={w[0]}" if w[1] is None else (
        f"C={w[1]}" if w[0] is None else f"L={w[0]}/C={w[1]}") for w in grid["windows"])
    title = (f"schedule (swattn.memory): windows/chunks {{{windows}}} x pages "
             f"{grid['page_sizes']} x prefill steps {grid['prefill_steps']} x drafts "
             f"{grid['drafts']} x lag {grid['lags']} x start {grid['starts']}; reads from "
             f"the extend loops' tiles {grid['tilings']} and the decode splits {DECODE_SPLITS}")
    lines = [title]
    widths = [max(len(title), len(f"{stats[key]:,}")) for key, title in _COLUMNS]
    lines.append("loop     " + "  ".join(f"{t:>{w}}" for (_, t), w in zip(_COLUMNS, widths))
                 + "  seconds")
    lines.append("schedule " + "  ".join(f"{stats[k]:>{w},}" for (k, _), w in zip(_COLUMNS, widths))
                 + f"  {stats['seconds']:7.2f}")
    lines.append(f"most pages a sequence held: {stats['max_held']} (ring width up to "
                 f"{stats['width']})")
    return "\n".join(lines)
