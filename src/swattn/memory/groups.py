"""Layer groups, the engine's step limits, and which pages a sequence's future steps read.

A layer group is a set of layers that share one page pool and one block table: the full
attention layers, the layers of one window, the layers of one chunk size. What a group
must keep for a sequence follows from one question, asked of the kernels' own bounds
(:mod:`swattn.window`): which key is the lowest that any query not yet finished can read?

Every step of a sequence starts at or after its committed length ``c`` (the tokens of the
finished steps; rejected drafts roll back to it, never below), and the lowest key a query
at position ``q`` reads is ``decode_bounds(q + 1, L, C)[0]``: the decode loop's first key,
which is also the first row's lower end in :func:`swattn.window.row_key_range` (the extend
loops load no block-table entry below it, masked tiles included). That key is
non-decreasing in ``q``, so the step that starts at ``c`` (the oldest one still in flight,
or the next one planned) reads the lowest key any later step reads, and every page wholly
below that key's page can go back: :func:`first_page_kept`. ``swattn prove`` checks this
against every loop's tile bounds rather than taking it on trust.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import window
from ..window import check_chunk, check_window, decode_bounds


def _check_count(name, value, least):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < least:
        raise ValueError(f"{name} must be >= {least}, got {value}")


@dataclass(frozen=True)
class LayerGroup:
    """Layers that share a page pool and a block table.

    ``window_left`` (``None``: no window) and ``attention_chunk`` (``None``: no chunk) are
    the layers' own, as the kernels take them; a group with neither is full attention and
    keeps every page of a sequence. ``num_pages`` pages of ``page_size`` tokens each.
    """

    name: str
    page_size: int
    num_pages: int
    window_left: int | None = None
    attention_chunk: int | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty str, got {self.name!r}")
        _check_count("page_size", self.page_size, 1)
        _check_count("num_pages", self.num_pages, 1)
        check_window(self.window_left)
        check_chunk(self.attention_chunk)

    @property
    def slides(self):
        """Whether a query sees only a bounded run of keys before it (window or chunk)."""
        return self.window_left is not None or self.attention_chunk is not None

    @property
    def reach(self):
        """The most keys before its own a query can see: ``L``, ``C - 1`` under a chunk of C,
        the smaller of the two under both; ``None`` for full attention."""
        reaches = [r for r in (self.window_left,
                               None if self.attention_chunk is None else self.attention_chunk - 1)
                   if r is not None]
        return min(reaches) if reaches else None


@dataclass(frozen=True)
class Schedule:
    """The engine's limits that decide how far a sequence's pages reach past its window.

    ``max_step_tokens``: the most tokens one reservation adds for one sequence (a prefill
    chunk, or one token plus its drafts). ``max_drafts``: the most of those a step may have
    rejected (speculative decoding; 0 without). ``lag``: how many steps an engine plans
    before the oldest planned one has finished (0: plan, run, commit, plan the next; 1: the
    next step is planned while this one runs).
    """

    max_step_tokens: int
    max_drafts: int = 0
    lag: int = 0

    def __post_init__(self):
        _check_count("max_step_tokens", self.max_step_tokens, 1)
        _check_count("max_drafts", self.max_drafts, 0)
        _check_count("lag", self.lag, 0)
        if self.max_drafts >= self.max_step_tokens:
            raise ValueError(f"max_drafts ({self.max_drafts}) must be below max_step_tokens "
                             f"({self.max_step_tokens}): a step keeps at least one token")

    @property
    def open_steps(self):
        """Reservations a sequence may hold uncommitted at once: ``lag + 1``."""
        return self.lag + 1

    @property
    def open_tokens(self):
        """Tokens a sequence may have reserved beyond its committed length: ``(lag + 1) *
        max_step_tokens``. This is the ``C`` of the ring's width."""
        return self.open_steps * self.max_step_tokens


def first_key_read(group, position):
    """The lowest key a query at ``position`` reads in ``group``'s layers: the first key of
    the decode loop for a sequence of ``position + 1`` tokens (0 for full attention)."""
    return decode_bounds(position + 1, group.window_left, group.attention_chunk)[0]


def first_page_kept(group, committed):
    """The first logical page that a step starting at ``committed`` (or any later one) can
    read: the page of :func:`first_key_read`. Every page below it can be freed."""
    return first_key_read(group, committed) // group.page_size


def ring_width(group, schedule):
    """Columns of a ring block table for ``group``: ``ceil((R + 1 + C) / page_size) + 1``,
    ``R`` the group's :attr:`LayerGroup.reach`, ``C`` the schedule's
    :attr:`Schedule.open_tokens`. A sequence's pages run from the page of ``c - R`` to the
    page of its last reserved token ``c + C - 1``: ``R + C`` keys, which touch at most
    ``ceil((R + C - 1) / P) + 1`` pages, so no two of them share column ``i % width``.
    ``None`` for full attention (it has no ring)."""
    if group.reach is None:
        return None
    return window.ring_width(group.reach, schedule.open_tokens, group.page_size)


def pages_for(tokens, page_size):
    """Logical pages that hold ``tokens`` tokens from position 0: ``ceil(tokens / P)``."""
    return (tokens + page_size - 1) // page_size
