"""Window-aware KV memory: the pages a sliding-window model's engine keeps, and no more.

Layer groups (full attention, each window, each chunk size) each own a page pool and a page
size; :class:`KVMemory` keeps every sequence's pages, gives back each page the moment no
step not yet finished can read it (by the kernels' own bounds, :mod:`swattn.window`),
shares prompt pages through a window-aware prefix cache, and writes the block-table rows
the plans read, linear or ring. docs/memory.md says what each call takes and promises;
``swattn prove`` proves the schedule.

The pure-Python core (groups, pools, the cache, the manager) imports no torch; the device
tables (:class:`BlockTables`, :func:`slot_mapping`) load torch on first use.
"""

from .groups import (
    LayerGroup,
    Schedule,
    first_key_read,
    first_page_kept,
    pages_for,
    ring_width,
)
from .manager import KVMemory, PrefixHit, Reservation
from .pool import OutOfPages, PagePool
from .prefix import CacheStats, PrefixCache

_TABLES = ("BlockTables", "slot_mapping")
__all__ = ["BlockTables", "CacheStats", "KVMemory", "LayerGroup", "OutOfPages", "PagePool",
           "PrefixCache", "PrefixHit", "Reservation", "Schedule", "first_key_read",
           "first_page_kept", "pages_for", "ring_width", "slot_mapping"]


def __getattr__(name):
    if name in _TABLES:
        from . import tables
        return getattr(tables, name)
    raise AttributeError(f"module 'swattn.memory' has no attribute {name!r}")
