"""A layer group's page pool: reference-counted pages (a sequence and the prefix cache may
hold the same page), a free list, and the counts the reports read."""

from __future__ import annotations


class OutOfPages(MemoryError):
    """A reservation that needs more pages than a group's pool has free (its prefix cache's
    unused pages included). Nothing was allocated: every pool is as it was."""

    def __init__(self, group, needed, available, num_pages):
        self.group, self.needed, self.available = group, needed, available
        super().__init__(f"layer group {group!r}: {needed} pages needed, {available} available "
                         f"of {num_pages} (nothing was allocated)")


class PagePool:
    """``num_pages`` pages, each with a reference count; a page goes back to the free list
    when its last holder lets go. ``freed`` collects the pages given back since the last
    :meth:`take_freed` (an engine poisons or reuses them; the tests do)."""

    def __init__(self, num_pages):
        self.num_pages = num_pages
        self.refs = [0] * num_pages
        # Popped from the end: page 0 first.
        self.free = list(range(num_pages - 1, -1, -1))
        self.used_before = [False] * num_pages
        self.freed = []
        self.peak = 0
        self.allocations = 0
        self.reuses = 0
        self.frees = 0

    @property
    def held(self):
        """Pages some holder has."""
        return self.num_pages - len(self.free)

    def take(self, count):
        """``count`` pages off the free list, each with one reference (the caller checked
        that there are enough)."""
        pages = [self.free.pop() for _ in range(count)]
        for page in pages:
            self.refs[page] = 1
            self.reuses += self.used_before[page]
            self.used_before[page] = True
        self.allocations += count
        self.peak = max(self.peak, self.held)
        return pages

    def ref(self, page):
        if self.refs[page] <= 0:
            raise RuntimeError(f"page {page} is free: it cannot take another holder")
        self.refs[page] += 1

    def unref(self, page):
        """Drop one reference; True when that was the last and the page is free again."""
        if self.refs[page] <= 0:
            raise RuntimeError(f"page {page} is already free")
        self.refs[page] -= 1
        if self.refs[page]:
            return False
        self.free.append(page)
        self.freed.append(page)
        self.frees += 1
        return True

    def take_freed(self):
        freed, self.freed = self.freed, []
        return freed

    def copy(self):
        other = PagePool.__new__(PagePool)
        other.__dict__.update(self.__dict__)
        for name in ("refs", "free", "used_before", "freed"):
            setattr(other, name, list(getattr(self, name)))
        return other
