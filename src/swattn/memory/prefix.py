"""The window-aware prefix cache: prompt pages shared between sequences, by their tokens.

A page is named by a digest of its tokens and of every token before it (a chain), one
chain per group at that group's page size, so two prompts share a page exactly when they
agree up to its end. A hit serves the first ``h`` tokens of a prompt (``h`` a multiple of
every group's page size, at least one prompt token left to compute) when every group holds
what the steps from ``h`` on read: a full group, all its pages below ``h``; a sliding group
(window or chunk), only the pages from :func:`first_page_kept` ``(h)`` up. The rest of a
sliding group's prefix may be gone.

What a sliding group keeps: a sequence offers its committed prompt pages as they fill; a
full group keeps every one, a sliding group only the tails that hits at a *boundary* need:
every boundary a lookup has matched before (where requests sharing a system prompt part;
such a boundary is "hot") and, with ``keep_prompt_ends``, the end of every prompt (where a
chat's next turn, or a repeat, hits). A lookup whose full groups match further than its
sliding groups' pages reach is cut short to the last boundary they cover; it marks the
boundary it matched hot, so the sequence, computing those pages again, leaves them for the
next one. Prompt ends cost a window's pages a cached prompt, held whether or not a later
request comes: worth it for chats, not for independent requests (the demo's).

Pages only the cache holds are evicted least recently used first when a pool runs short;
a hit touches its full pages deepest first, so a chain loses its tail before its head.
"""

from __future__ import annotations

import hashlib
import math
from array import array
from collections import OrderedDict
from dataclasses import dataclass

from .groups import first_page_kept

# Boundaries remembered as hot at most (the oldest forgotten first).
HOT_BOUNDARIES = 4096


def _chain(tokens, block):
    """Digests of the prefixes ``tokens[:block * (i + 1)]``, for every whole block."""
    digests, previous = [], b""
    for start in range(0, len(tokens) - block + 1, block):
        previous = hashlib.blake2b(previous + array("q", tokens[start:start + block]).tobytes(),
                                   digest_size=16).digest()
        digests.append(previous)
    return digests


@dataclass
class PromptKeys:
    """A prompt's page digests per group, and its boundary digests every ``grain`` tokens
    (boundary ``b`` is ``boundaries[b // grain - 1]``)."""

    length: int
    pages: dict
    boundaries: list


@dataclass
class CacheStats:
    """``lookups``; ``hits`` (a lookup served ``h > 0`` tokens) and their ``hit_tokens``;
    ``cut_short``: lookups the sliding groups' pages served less than the full groups
    matched, and the ``tokens_cut`` so lost."""

    lookups: int = 0
    hits: int = 0
    hit_tokens: int = 0
    cut_short: int = 0
    tokens_cut: int = 0


class PrefixCache:
    """Cached prompt pages of every group (each entry holds one reference to its page)."""

    def __init__(self, groups, pools, keep_from=first_page_kept, keep_prompt_ends=False):
        self.groups = {g.name: g for g in groups}
        self.keep_prompt_ends = keep_prompt_ends
        self.pools = pools
        self.keep_from = keep_from
        self.grain = math.lcm(*(g.page_size for g in groups))
        # Per group: page digest -> physical page, least recently used first.
        self.entries = {g.name: OrderedDict() for g in groups}
        self.hot = OrderedDict()
        self.stats = CacheStats()

    def keys(self, prompt):
        prompt = [int(t) for t in prompt]
        return PromptKeys(len(prompt), {name: _chain(prompt, g.page_size)
                                        for name, g in self.groups.items()},
                          _chain(prompt, self.grain))

    # -- lookup ---------------------------------------------------------------------------
    def _tail_cached(self, group, keys, boundary):
        entries, names = self.entries[group.name], keys.pages[group.name]
        end = boundary // group.page_size
        return all(names[j] in entries for j in range(end - 1, self.keep_from(group, boundary) - 1,
                                                      -1))

    def lookup(self, keys):
        """``(h, matched)``: the tokens a hit serves, and the tokens the full groups matched
        (``matched > h``: the sliding groups' pages cut the hit short). Counts it."""
        limit = (keys.length - 1) // self.grain * self.grain if keys.length else 0
        matched = limit
        full = [g for g in self.groups.values() if not g.slides]
        for group in full:
            entries, names, count = self.entries[group.name], keys.pages[group.name], 0
            while count * group.page_size < matched and names[count] in entries:
                count += 1
            matched = min(matched, count * group.page_size // self.grain * self.grain)
        sliding = [g for g in self.groups.values() if g.slides]
        h = matched
        while h > 0 and not all(self._tail_cached(g, keys, h) for g in sliding):
            h -= self.grain
        if not full:
            matched = h  # nothing names how far the prompt matched beyond what is served
        stats = self.stats
        stats.lookups += 1
        stats.hits += h > 0
        stats.hit_tokens += h
        if matched > h:
            stats.cut_short += 1
            stats.tokens_cut += matched - h
        if matched:
            self.hot[keys.boundaries[matched // self.grain - 1]] = None
            self.hot.move_to_end(keys.boundaries[matched // self.grain - 1])
            while len(self.hot) > HOT_BOUNDARIES:
                self.hot.popitem(last=False)
        return h, matched

    def pages_of_hit(self, group, keys, h):
        """``{logical page: physical page}`` a sequence takes from the cache for a hit of
        ``h`` tokens in ``group`` (each touched as recently used, deepest first)."""
        entries, names = self.entries[group.name], keys.pages[group.name]
        first = self.keep_from(group, h) if group.slides else 0
        taken = {}
        for j in range(h // group.page_size - 1, first - 1, -1):
            entries.move_to_end(names[j])
            taken[j] = entries[names[j]]
        return taken

    # -- insert ---------------------------------------------------------------------------
    def kept_tails(self, group, keys):
        """The logical pages of ``group`` a prompt's offer leaves in the cache: every page
        (full attention), or the union of the tails of its boundaries (every hot boundary
        within it, and with ``keep_prompt_ends`` its end)."""
        if not group.slides:
            return None
        ends = set()
        if self.keep_prompt_ends:
            ends = {keys.length // self.grain * self.grain,
                    max(keys.length - 1, 0) // self.grain * self.grain}
        ends.update((i + 1) * self.grain for i, name in enumerate(keys.boundaries)
                    if name in self.hot)
        kept = set()
        for end in ends:
            if end > 0:
                kept.update(range(self.keep_from(group, end), end // group.page_size))
        return kept

    def offer(self, group, keys, logical, page):
        """Keep ``page`` (logical page ``logical`` of the prompt ``keys``) unless an entry
        of that name exists: the cache takes a reference to it."""
        name = keys.pages[group.name][logical]
        entries = self.entries[group.name]
        if name in entries:
            entries.move_to_end(name)
            return
        self.pools[group.name].ref(page)
        entries[name] = page

    # -- eviction -------------------------------------------------------------------------
    def evictable(self, group_name):
        refs = self.pools[group_name].refs
        return sum(1 for page in self.entries[group_name].values() if refs[page] == 1)

    def evict(self, group_name, count):
        """Give back up to ``count`` pages that only the cache holds, least recently used
        first; returns how many."""
        pool, entries = self.pools[group_name], self.entries[group_name]
        victims = [name for name, page in entries.items() if pool.refs[page] == 1][:count]
        for name in victims:
            pool.unref(entries.pop(name))
        return len(victims)

    def clear(self):
        """Drop every entry (the pages other holders keep stay theirs)."""
        for name, entries in self.entries.items():
            for page in entries.values():
                self.pools[name].unref(page)
            entries.clear()
        self.hot.clear()

    def copy(self, pools):
        other = PrefixCache.__new__(PrefixCache)
        other.__dict__.update(self.__dict__)
        other.pools = pools
        other.entries = {name: OrderedDict(entries) for name, entries in self.entries.items()}
        other.hot = OrderedDict(self.hot)
        other.stats = CacheStats(**vars(self.stats))
        return other
