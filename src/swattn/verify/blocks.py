"""Every (query block, key tile) pair of a loop, classed against the loop's bounds from
sums of the element mask (see :mod:`swattn.verify.prove`): the tile layouts of the extend
and ranges loops, the rectangle sums of a mask, and the counts they add up to."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def range_end_of(loop, prefix_len, extend_len):
    """End of a loop's key range in its own coordinates: the prefix (stage 1), the new
    tokens (stage 2) or both (unified)."""
    if loop == "stage1":
        return prefix_len
    if loop == "stage2":
        return extend_len
    return prefix_len + extend_len


@dataclass
class Layout:
    """Every (query block, key tile) pair of one loop and prefix, over the grid's extend
    lengths and tilings. Blocks: the bounds call and its row span; tiles: 0-aligned
    starts over the whole range, each with its block. ``cuts`` are the key positions
    where some tile starts or ends; ``tile_start_col``/``tile_end_col`` index a tile's
    start and end in ``cuts`` followed by the longest range end."""

    calls: list          # per block: (extend_len, block_start, block_m, block_n)
    row_start: np.ndarray
    row_end: np.ndarray
    block_n: np.ndarray
    range_end: np.ndarray
    tile_block: np.ndarray
    tile_start: np.ndarray
    tile_start_col: np.ndarray
    tile_end_col: np.ndarray
    cuts: np.ndarray


def loop_layout(loop, prefix_len, grid):
    """The :class:`Layout` of one extend loop and prefix over ``grid``'s extend lengths and
    tilings."""
    calls, row_start, row_end, block_ns, range_ends = [], [], [], [], []
    tile_block, tile_start, tile_end = [], [], []
    for extend_len in grid.extend_lens:
        range_end = range_end_of(loop, prefix_len, extend_len)
        for block_m, block_n in grid.tilings:
            starts = np.arange(0, range_end, block_n, dtype=np.int64)
            ends = np.minimum(starts + block_n, range_end)
            for block_start in range(0, extend_len, block_m):
                tile_block.append(np.full(len(starts), len(calls), dtype=np.int64))
                tile_start.append(starts)
                tile_end.append(ends)
                calls.append((extend_len, block_start, block_m, block_n))
                row_start.append(block_start)
                row_end.append(min(block_start + block_m, extend_len))
                block_ns.append(block_n)
                range_ends.append(range_end)
    tile_start, tile_end = np.concatenate(tile_start), np.concatenate(tile_end)
    longest_range = range_end_of(loop, prefix_len, max(grid.extend_lens))
    edges = np.unique(np.concatenate([tile_start, tile_end, [0, longest_range]]))

    def as_array(values):
        return np.asarray(values, dtype=np.int64)

    return Layout(calls, as_array(row_start), as_array(row_end), as_array(block_ns),
                  as_array(range_ends), np.concatenate(tile_block), tile_start,
                  np.searchsorted(edges, tile_start), np.searchsorted(edges, tile_end),
                  edges[:-1])


def rectangle_sums(mask, rows, cols, cuts):
    """``sums[r, c]``: visible elements in rows ``< r`` and keys ``< [*cuts, cols][c]``.

    The element mask is summed per row between consecutive cuts (one pass over the
    elements), then prefix-summed over cuts and rows, so the count of any (row span,
    key span between cuts) rectangle is four lookups."""
    sums = np.zeros((rows + 1, len(cuts) + 1), dtype=np.int64)
    if rows and cols:
        elements = np.broadcast_to(np.asarray(mask, dtype=bool), (rows, cols))
        per_row = np.add.reduceat(np.ascontiguousarray(elements).view(np.uint8), cuts, axis=1,
                                  dtype=np.int32)
        np.cumsum(per_row, axis=1, out=sums[1:, 1:])
        np.cumsum(sums[1:, 1:], axis=0, out=sums[1:, 1:])
    return sums


def new_stats():
    """The zeroed counts of an extend (or ranges) loop."""
    return {"configs": 0, "query_blocks": 0, "tiles_below_floor": 0, "violations": 0,
            "witnesses": 0, "loose_floors": 0, "tiles_past_end": 0, "empty_tiles_walked": 0,
            "bad_bounds": 0, "full_tiles": 0, "partial_full_tiles": 0, "seconds": 0.0}


def check_blocks(layout, sums, lo, hi, mid_lo, mid_hi, stats):
    """Class every tile of every block against ``(lo, hi)`` and the mask-free tiles
    ``[mid_lo, mid_hi)`` (every element of those must be visible, and the tile whole)
    and add up the counts."""
    first_row = layout.row_start[layout.tile_block]
    end_row = layout.row_end[layout.tile_block]
    tile_count = (sums[end_row, layout.tile_end_col] - sums[first_row, layout.tile_end_col]
                  - sums[end_row, layout.tile_start_col] + sums[first_row, layout.tile_start_col])
    tiles_vis = tile_count > 0
    block_n = layout.block_n[layout.tile_block]
    full = ((layout.tile_start >= mid_lo[layout.tile_block])
            & (layout.tile_start < mid_hi[layout.tile_block]))
    whole = (tile_count == (end_row - first_row) * block_n) & (
        layout.tile_start + block_n <= layout.range_end[layout.tile_block])
    stats["full_tiles"] += int(np.count_nonzero(full))
    stats["partial_full_tiles"] += int(np.count_nonzero(full & ~whole))
    # A non-empty mask-free run must sit on the loop's grid, inside the loop.
    stats["bad_bounds"] += int(np.count_nonzero((mid_hi > mid_lo) & (
        (mid_lo < lo) | (mid_hi > hi) | ((mid_lo - lo) % layout.block_n != 0))))
    tile_lo, tile_hi = lo[layout.tile_block], hi[layout.tile_block]
    below = layout.tile_start < tile_lo
    past = layout.tile_start >= tile_hi
    walked = ~below & ~past
    n_blocks = len(layout.calls)
    block_sees = np.bincount(layout.tile_block[tiles_vis], minlength=n_blocks) > 0
    witnesses = int(np.count_nonzero(tiles_vis & (layout.tile_start == tile_lo)))
    stats["tiles_below_floor"] += int(np.count_nonzero(below))
    stats["tiles_past_end"] += int(np.count_nonzero(past & ~below))
    stats["violations"] += int(np.count_nonzero(tiles_vis & ~walked))
    stats["witnesses"] += witnesses
    stats["loose_floors"] += int(np.count_nonzero(block_sees)) - witnesses
    stats["empty_tiles_walked"] += int(np.count_nonzero(walked & ~tiles_vis))
    # A floor off the 0-aligned tile grid, or a loop leaving [0, range_end), is wrong
    # whatever the mask holds: the kernel's tiles must be aligned and in range.
    stats["bad_bounds"] += int(np.count_nonzero((lo % layout.block_n != 0) | (lo < 0)
                                                | ((hi > layout.range_end) & (hi > lo))))


def range_layout(count, rows, keys, block_n):
    """The :class:`Layout` of ``count`` blocks of ``rows`` rows each, block ``i`` the rows
    ``[i * rows, (i + 1) * rows)`` of the stacked mask, every block over keys ``[0, keys)``
    in tiles of ``block_n``."""
    starts = np.arange(0, keys, block_n, dtype=np.int64)
    ends = np.minimum(starts + block_n, keys)
    edges = np.unique(np.concatenate([starts, ends, [0, keys]]))
    row_start = np.arange(count, dtype=np.int64) * rows
    return Layout([None] * count, row_start, row_start + rows,
                  np.full(count, block_n, dtype=np.int64), np.full(count, keys, dtype=np.int64),
                  np.repeat(np.arange(count, dtype=np.int64), len(starts)),
                  np.tile(starts, count), np.tile(np.searchsorted(edges, starts), count),
                  np.tile(np.searchsorted(edges, ends), count), edges[:-1])


def check_chunk_spans(layout, chunk, first_row_pos, key_origin, lo, hi, stats):
    """Chunked attention: count the blocks whose rows lie in more than one chunk, and the
    tiles a block walks (``lo <= start < hi``) that lie wholly outside the chunks of its
    rows, ``[p_first // C * C, (p_last // C + 1) * C)`` in absolute positions. Row ``i``
    of a block is at absolute position ``first_row_pos + i``, key ``j`` of the loop at
    ``key_origin + j``."""
    first_chunk = (first_row_pos + layout.row_start) // chunk
    last_chunk = (first_row_pos + layout.row_end - 1) // chunk
    stats["straddling_blocks"] += int(np.count_nonzero(last_chunk > first_chunk))
    block = layout.tile_block
    span_lo = (first_chunk * chunk - key_origin)[block]
    span_hi = ((last_chunk + 1) * chunk - key_origin)[block]
    tile_end = np.minimum(layout.tile_start + layout.block_n[block], layout.range_end[block])
    walked = (layout.tile_start >= lo[block]) & (layout.tile_start < hi[block])
    outside = (tile_end <= span_lo) | (layout.tile_start >= span_hi)
    stats["tiles_outside_chunks"] += int(np.count_nonzero(walked & outside))
