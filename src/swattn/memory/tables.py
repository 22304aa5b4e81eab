"""The device side of :class:`swattn.memory.KVMemory`: block tables a captured plan reads,
written in place, and the slot mappings ``write_kv`` takes."""

from __future__ import annotations

import torch

LAYOUTS = ("linear", "ring")


class BlockTables:
    """One group's block table for batches of up to ``max_batch`` sequences, in one device
    tensor that :meth:`update` rewrites in place (same storage, same shape): a plan or a
    CUDA graph captured on :attr:`table` reads each batch's rows without a new tensor.

    ``layout="linear"``: ``max_pages`` columns, logical page ``i`` at column ``i`` (what the
    kernels take today). ``layout="ring"``: the group's ring width
    (:func:`swattn.memory.ring_width`), logical page ``i`` at column ``i % width``. Rows past
    the batch, and columns no held page falls on, hold -1.
    """

    def __init__(self, memory, group, *, max_batch, layout="linear", max_pages=None,
                 device="cpu"):
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if layout == "linear" and max_pages is None:
            raise ValueError("a linear table needs max_pages (its column count)")
        self.memory, self.group, self.layout = memory, group, layout
        width = memory.ring_width(group) if layout == "ring" else max_pages
        self.width = width
        device = torch.device(device)
        cuda = device.type == "cuda"
        # On CUDA the rows are staged in pinned host memory and copied asynchronously, in
        # stream order (a step still running reads the old rows). Two staging buffers, each
        # rewritten only once its last copy has run: with a step planned while another runs,
        # the next update must not overwrite rows a queued copy has yet to read.
        self._staging = [torch.full((max_batch, width), -1, dtype=torch.int32, pin_memory=cuda)
                         for _ in range(2 if cuda else 1)]
        self._copied = [None] * len(self._staging)
        self._next = 0
        self.host = self._staging[0]
        self.table = self.host if not cuda else self.host.to(device)

    def rows(self, seq_ids):
        """The rows of ``seq_ids`` as lists, in the table's layout."""
        if self.layout == "ring":
            return [self.memory.ring_row(self.group, s) for s in seq_ids]
        return [self.memory.linear_row(self.group, s, self.width) for s in seq_ids]

    def update(self, seq_ids):
        """Write the rows of ``seq_ids`` (row ``b`` is ``seq_ids[b]``) into :attr:`table` in
        place, -1 below them; returns the host copy of the batch's rows (a plan checks the
        entries its queries read there)."""
        if len(seq_ids) > self.table.shape[0]:
            raise ValueError(f"a batch of {len(seq_ids)} sequences: the table holds "
                             f"{self.table.shape[0]}")
        i = self._next
        self._next = (i + 1) % len(self._staging)
        if self._copied[i] is not None:
            self._copied[i].synchronize()
        self.host = self._staging[i]
        self.host.fill_(-1)
        if seq_ids:
            self.host[:len(seq_ids)] = torch.tensor(self.rows(seq_ids), dtype=torch.int32)
        if self.table is not self.host:
            self.table.copy_(self.host, non_blocking=True)
            self._copied[i] = torch.cuda.Event()
            self._copied[i].record()
        return self.host[:len(seq_ids)]


def slot_mapping(reservations, group, *, device="cpu", out=None):
    """The flat cache slots of ``reservations`` (in order) in ``group``: the ``slot_mapping``
    of ``swattn.write_kv``, int64. ``out``: a tensor written in place (its first entries;
    the rest set to -1, which ``write_kv`` skips)."""
    slots = [s for r in reservations for s in r.slots[group]]
    values = torch.tensor(slots, dtype=torch.int64)
    if out is None:
        return values.to(device)
    if len(slots) > out.numel():
        raise ValueError(f"{len(slots)} slots do not fit out's {out.numel()} entries")
    out.fill_(-1)
    out[:len(slots)].copy_(values, non_blocking=True)
    return out
