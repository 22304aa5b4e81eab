"""The KV memory of an engine: one page pool per layer group, the pages of every sequence,
the window-aware prefix cache, and the block-table rows the plans read.

A sequence's life, the engine's calls:

- :meth:`KVMemory.add`: a new sequence, its prompt looked up in the prefix cache (the hit
  is its committed length: its first step starts there);
- :meth:`KVMemory.reserve`: room for the next ``n`` tokens of a step (``drafts`` of them
  speculative): pages allocated in every group, slots for ``write_kv``; up to
  ``schedule.lag + 1`` reservations may be open at once (a step planned while the previous
  one runs);
- :meth:`KVMemory.commit`: the oldest open step finished and kept ``accepted`` tokens; the
  rejected drafts roll back (the later open steps move down to follow them, and pages past
  the new end go back), and every page below :func:`first_page_kept` of the new committed
  length goes back at once: no step not yet finished can read it;
- :meth:`KVMemory.release`: the sequence is done; its pages go back unless another
  sequence or the prefix cache holds them.

A page given back may be handed to another sequence by the next reservation and written
by its step, whatever still runs: so a page is given back only once no step not yet
finished (the open ones, planned or running, and every later one) can read it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .groups import first_page_kept, pages_for, ring_width
from .pool import OutOfPages, PagePool
from .prefix import PrefixCache


@dataclass(frozen=True)
class Reservation:
    """Room for one step of one sequence: positions ``start .. start + num_tokens - 1``
    (``start`` as if every open step before it keeps all its drafts), ``slots[group]``
    their flat cache slots (``page * page_size + offset``) for ``write_kv``. With drafts
    still open before it, the step's real positions may lie up to that many lower: an
    engine then takes its slots from the block table at the real positions
    (:meth:`KVMemory.slots`)."""

    seq_id: object
    start: int
    num_tokens: int
    drafts: int
    slots: dict


@dataclass(frozen=True)
class PrefixHit:
    """What :meth:`KVMemory.add` found: ``tokens`` served from the cache (the sequence's
    first step starts there) and ``matched``, what the full groups matched; ``matched >
    tokens`` where the sliding groups' pages cut the hit short."""

    tokens: int
    matched: int


@dataclass
class _Sequence:
    committed: int
    prompt_len: int
    keys: object
    pages: dict
    first_held: dict
    offered: dict
    steps: deque = field(default_factory=deque)

    @property
    def reserved_end(self):
        return self.committed + sum(n for n, _ in self.steps)


class KVMemory:
    """Pages of every layer group for every sequence (pure Python: pages are ints; the
    device side lives in :mod:`swattn.memory.tables`).

    Args:
        groups: the :class:`LayerGroup` of each pool (names unique).
        schedule: the engine's :class:`Schedule` (step size, drafts, lag).
        prefix_cache: share prompt pages between sequences (:mod:`.prefix`).
        keep_prompt_ends: the cache also keeps each prompt's window tail at its end, where a
            chat's next turn hits (else only at boundaries lookups have matched).
        keep_from: ``keep_from(group, committed)``, the first logical page a sequence keeps
            (default :func:`first_page_kept`; the prover plants wrong ones here).
    """

    def __init__(self, groups, schedule, *, prefix_cache=True, keep_prompt_ends=False,
                 keep_from=first_page_kept):
        groups = list(groups)
        names = [g.name for g in groups]
        if not groups or len(set(names)) != len(names):
            raise ValueError(f"groups must be a non-empty list with unique names, got {names}")
        self.groups = {g.name: g for g in groups}
        self.schedule = schedule
        self.keep_from = keep_from
        self.pools = {g.name: PagePool(g.num_pages) for g in groups}
        self.cache = (PrefixCache(groups, self.pools, keep_from, keep_prompt_ends)
                      if prefix_cache else None)
        self.sequences = {}

    # -- the sequence's life --------------------------------------------------------------
    def add(self, seq_id, prompt=None):
        """Start sequence ``seq_id``; with ``prompt`` (token ids) look it up in the prefix
        cache and take the pages of the hit. Returns the :class:`PrefixHit`."""
        if seq_id in self.sequences:
            raise ValueError(f"sequence {seq_id!r} is already added")
        keys = None if prompt is None or self.cache is None else self.cache.keys(prompt)
        hit, matched = self.cache.lookup(keys) if keys is not None else (0, 0)
        seq = _Sequence(hit, 0 if prompt is None else len(prompt), keys, {}, {}, {})
        for name, group in self.groups.items():
            pages = [-1] * (hit // group.page_size)
            if hit:
                for logical, page in self.cache.pages_of_hit(group, keys, hit).items():
                    self.pools[name].ref(page)
                    pages[logical] = page
            seq.pages[name] = pages
            seq.first_held[name] = self.keep_from(group, hit) if group.slides else 0
            seq.offered[name] = len(pages)
        self.sequences[seq_id] = seq
        return PrefixHit(hit, matched)

    def reserve(self, seq_id, num_tokens, drafts=0):
        """Room for a step of ``num_tokens`` tokens of ``seq_id`` (its last ``drafts``
        speculative). Raises :class:`OutOfPages` (nothing allocated) when a pool is short."""
        return self.reserve_batch([(seq_id, num_tokens, drafts)])[0]

    def reserve_batch(self, steps, slots=True):
        """:meth:`reserve` for ``(seq_id, num_tokens, drafts)`` triples, all or none: when
        any group is short for the batch, :class:`OutOfPages` and nothing changes.
        ``slots=False`` leaves the reservations' slots empty (a simulation counts pages)."""
        plans = []
        need = dict.fromkeys(self.groups, 0)
        ends, opened = {}, {}
        for seq_id, num_tokens, drafts in steps:
            seq = self._get(seq_id)
            opened[seq_id] = opened.get(seq_id, len(seq.steps)) + 1
            self._check_step(seq_id, opened[seq_id], num_tokens, drafts)
            start = ends.get(seq_id, seq.reserved_end)
            ends[seq_id] = start + num_tokens
            plans.append((seq_id, seq, start, num_tokens, drafts))
        for seq_id, end in ends.items():
            seq = self.sequences[seq_id]
            for name, group in self.groups.items():
                need[name] += max(pages_for(end, group.page_size) - len(seq.pages[name]), 0)
        for name, count in need.items():
            pool = self.pools[name]
            short = count - len(pool.free)
            if short > 0:
                available = len(pool.free) + (self.cache.evictable(name) if self.cache else 0)
                if available < count:
                    raise OutOfPages(name, count, available, pool.num_pages)
        for name, count in need.items():
            short = count - len(self.pools[name].free)
            if short > 0:
                self.cache.evict(name, short)
        for seq_id, end in ends.items():
            seq = self.sequences[seq_id]
            for name, group in self.groups.items():
                grow = pages_for(end, group.page_size) - len(seq.pages[name])
                if grow > 0:
                    seq.pages[name] += self.pools[name].take(grow)
        out = []
        for seq_id, seq, start, num_tokens, drafts in plans:
            seq.steps.append((num_tokens, drafts))
            where = {name: self._slots(seq, group, range(start, start + num_tokens))
                     for name, group in self.groups.items()} if slots else {}
            out.append(Reservation(seq_id, start, num_tokens, drafts, where))
        return out

    def commit(self, seq_id, accepted=None):
        """The oldest open step of ``seq_id`` finished and kept its first ``accepted`` tokens
        (default all; at least its tokens that are not drafts). Rejected drafts roll back;
        pages nothing unfinished reads go back; committed prompt pages are offered to the
        prefix cache."""
        seq = self._get(seq_id)
        if not seq.steps:
            raise ValueError(f"sequence {seq_id!r} has no open step to commit")
        num_tokens, drafts = seq.steps[0]
        accepted = num_tokens if accepted is None else accepted
        if not num_tokens - drafts <= accepted <= num_tokens:
            raise ValueError(f"accepted must be in [{num_tokens - drafts}, {num_tokens}] for a "
                             f"step of {num_tokens} tokens with {drafts} drafts, got {accepted}")
        seq.steps.popleft()
        # The later open steps follow the kept tokens: reserved_end moves down with them.
        seq.committed += accepted
        if seq.keys is not None:
            self._offer(seq)
        end = seq.reserved_end
        for name, group in self.groups.items():
            pages, pool = seq.pages[name], self.pools[name]
            if group.slides:
                first = max(self.keep_from(group, seq.committed), seq.first_held[name])
                for logical in range(seq.first_held[name], min(first, len(pages))):
                    if pages[logical] >= 0:
                        pool.unref(pages[logical])
                        pages[logical] = -1
                seq.first_held[name] = first
            # Rolled-back drafts: pages wholly past the open steps' end.
            while len(pages) > pages_for(end, group.page_size):
                page = pages.pop()
                if page >= 0:
                    pool.unref(page)

    def release(self, seq_id):
        """Sequence ``seq_id`` is done: every page it holds goes back (unless shared). Its
        open steps must have been committed: they may still read the pages."""
        seq = self._get(seq_id)
        if seq.steps:
            raise ValueError(f"sequence {seq_id!r} has {len(seq.steps)} open steps: commit "
                             f"them before releasing it (they may still read its pages)")
        for name, pages in seq.pages.items():
            for page in pages:
                if page >= 0:
                    self.pools[name].unref(page)
        del self.sequences[seq_id]

    # -- what the plans and write_kv take ---------------------------------------------------
    def pages(self, group_name, seq_id):
        """The sequence's logical pages in ``group_name``: physical page ids, -1 for pages
        it no longer holds (or never held: below a hit's window)."""
        return list(self._get(seq_id).pages[group_name])

    def slots(self, group_name, seq_id, positions):
        """Flat cache slots of ``positions`` of ``seq_id`` in ``group_name``."""
        return self._slots(self._get(seq_id), self.groups[group_name], positions)

    def linear_row(self, group_name, seq_id, width):
        """The sequence's row of a linear block table of ``width`` columns (logical page
        ``i`` at column ``i``; -1 where not held)."""
        pages = self._get(seq_id).pages[group_name]
        if len(pages) > width:
            raise ValueError(f"sequence {seq_id!r} has {len(pages)} pages in "
                             f"{group_name!r}: more than the table's {width} columns")
        return pages + [-1] * (width - len(pages))

    def ring_row(self, group_name, seq_id):
        """The sequence's row of a ring block table (:func:`ring_width` columns, logical
        page ``i`` at column ``i % width``; -1 where no held page falls)."""
        width = self.ring_width(group_name)
        row = [-1] * width
        pages = self._get(seq_id).pages[group_name]
        for logical in range(self._get(seq_id).first_held[group_name], len(pages)):
            if pages[logical] >= 0:
                if row[logical % width] >= 0:
                    raise RuntimeError(f"ring column {logical % width} of {group_name!r} "
                                       f"holds two pages")
                row[logical % width] = pages[logical]
        return row

    def ring_width(self, group_name):
        width = ring_width(self.groups[group_name], self.schedule)
        if width is None:
            raise ValueError(f"group {group_name!r} is full attention: it has no ring table")
        return width

    # -- state ------------------------------------------------------------------------------
    def committed(self, seq_id):
        return self._get(seq_id).committed

    def reserved_end(self, seq_id):
        return self._get(seq_id).reserved_end

    def open_steps(self, seq_id):
        return list(self._get(seq_id).steps)

    def held(self, group_name, seq_id=None):
        """Pages held in a group: by the pool's every holder, or by one sequence."""
        if seq_id is None:
            return self.pools[group_name].held
        seq = self._get(seq_id)
        pages = seq.pages[group_name]
        return sum(1 for j in range(seq.first_held[group_name], len(pages)) if pages[j] >= 0)

    def take_freed(self):
        """``{group: [pages]}`` given back since the last call (the tests poison them)."""
        return {name: pool.take_freed() for name, pool in self.pools.items()}

    def copy(self):
        """An independent copy (the prover branches a trace with it)."""
        other = KVMemory.__new__(KVMemory)
        other.__dict__.update(self.__dict__)
        other.pools = {name: pool.copy() for name, pool in self.pools.items()}
        other.cache = None if self.cache is None else self.cache.copy(other.pools)
        other.sequences = {
            key: _Sequence(s.committed, s.prompt_len, s.keys,
                           {n: list(p) for n, p in s.pages.items()}, dict(s.first_held),
                           dict(s.offered), deque(s.steps))
            for key, s in self.sequences.items()}
        return other

    # -- inside -----------------------------------------------------------------------------
    def _get(self, seq_id):
        try:
            return self.sequences[seq_id]
        except KeyError:
            raise ValueError(f"unknown sequence {seq_id!r}") from None

    def _check_step(self, seq_id, open_steps, num_tokens, drafts):
        schedule = self.schedule
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or not (
                1 <= num_tokens <= schedule.max_step_tokens):
            raise ValueError(f"num_tokens must be an int in [1, {schedule.max_step_tokens}] "
                             f"(the schedule's max_step_tokens), got {num_tokens!r}")
        most = min(schedule.max_drafts, num_tokens - 1)
        if isinstance(drafts, bool) or not isinstance(drafts, int) or not 0 <= drafts <= most:
            raise ValueError(f"drafts must be an int in [0, {most}] (the schedule's max_drafts, "
                             f"below num_tokens), got {drafts!r}")
        if open_steps > schedule.open_steps:
            raise ValueError(f"sequence {seq_id!r} would have {open_steps} open steps: the "
                             f"schedule's lag {schedule.lag} allows {schedule.open_steps}")

    @staticmethod
    def _slots(seq, group, positions):
        size, pages = group.page_size, seq.pages[group.name]
        return [pages[p // size] * size + p % size for p in positions]

    def _offer(self, seq):
        """Offer the sequence's newly committed whole prompt pages to the prefix cache."""
        for name, group in self.groups.items():
            whole = min(seq.committed, seq.prompt_len) // group.page_size
            if whole <= seq.offered[name]:
                continue
            kept = self.cache.kept_tails(group, seq.keys)
            pages = seq.pages[name]
            for logical in range(seq.offered[name], whole):
                if pages[logical] >= 0 and (kept is None or logical in kept):
                    self.cache.offer(group, seq.keys, logical, pages[logical])
            seq.offered[name] = whole
