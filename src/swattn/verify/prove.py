"""The exhaustive bound prover: every key tile a loop skips holds no visible element.

For each loop, tiling, window, prefix and extend length of a grid, the mask is built as
the kernels write it, element by element: row ``i`` of the query block at
``block_start`` (rows below ``extend_len`` only) against key column ``j`` (keys below the
loop's range end only) is kept iff ``visible(q, k, L, R, causal, chunk)`` with, at
absolute positions,

- stage1:  ``q = P + block_start + i``, ``k = j`` over ``[0, P)``;
- stage2:  ``q = P + block_start + i``, ``k = P + j`` over ``[0, E)``;
- unified: ``q = ws + P + block_start + i``, ``k = ws + j`` over ``[0, P + E)``, for every
  window start ``ws`` of the grid, so that ``ws`` cancelling out is checked, not assumed;
- decode:  ``q = ws + seq_len - 1``, ``k = ws + j`` over ``[0, seq_len)``;
- ranges:  row ``t`` keeps ``a_t <= j < b_t`` over ``[0, K)``, for every block of up to
  ``range_rows`` rows and every range of each row (``0 <= a_t, b_t <= K``, empty and
  reversed ones included): stage 1 under ``key_ranges`` (:func:`prove_ranges`);
- the ``*-chunk`` loops: stage1, stage2, unified, decode and the split decode loops again
  under chunked local attention (``chunk=C``: ``k // C == q // C`` on top of the window),
  for every chunk of the grid. Chunk boundaries sit at absolute positions and do not
  shift, so these run at ``ws = 0`` only; stage 2's keys start at ``P``, which its bounds
  must take as the origin of its rows' chunks. A block's walked tiles must also lie in the
  chunks of its rows (``tiles_outside_chunks``), and blocks whose rows straddle a chunk
  boundary are counted (``straddling_blocks``), so that case is not left out.

The bound under test comes from ``bounds_fn`` (``key_bounds`` unless a test plants a
bug) and is computed from the unshifted positions. Every tile of the whole range from 0
is then classed: below the floor ``lo``, at or past the end ``hi``, or walked. A skipped
tile (below or past) that holds a visible element is a violation. A query block that
sees anything must also see something in its floor tile: that tile is a tightness
witness, and a block without one has a loose floor. Decode reads keys ``[lo, hi)`` with
no tiling: no visible key may lie outside, and it must read exactly ``min(L + 1, seq_len)``
(under a chunk: exactly as many keys as the mask holds).

The per-tile counts are sums of the element mask over rectangles: the predicate is
evaluated on every element once per (loop, window, prefix, window start) for the longest
extend length, summed per row between tile edges in one pass, then prefix-summed over
edges and rows, so every (query block, key tile) pair of every shorter extend length and
every tiling is four lookups (a shorter extend's mask is the top-left corner of the
longest's). Nothing here re-derives an interval from the window; the chunk spans of
``tiles_outside_chunks`` are the convention's own (``p // C * C``), not window.py's.
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass

import numpy as np

from ..window import (
    Window,
    decode_bounds,
    decode_split_bounds,
    full_tile_range,
    key_bounds,
    range_bounds,
    second_limit,
    second_tiles,
    segment_tiles,
    split_tiles,
    visible,
)
from .blocks import (
    check_blocks,
    check_chunk_spans,
    loop_layout,
    new_stats,
    range_end_of,
    range_layout,
    rectangle_sums,
)

EXTEND_LOOPS = ("stage1", "stage2", "unified")
# Counts that must be zero: a skipped visible key, a floor below the first visible tile
# (decode: a read of more keys than the window holds), a bound off the tile grid or range.
FAILURES = ("violations", "loose_floors", "loose", "bad_bounds", "partial_full_tiles", "overlaps",
            "empty_tiles", "tiles_outside_chunks", "read_past", "bad_picks")
# Split counts the split decode loops are proved at.
DECODE_SPLITS = (1, 2, 3, 4, 8)


@dataclass(frozen=True)
class Grid:
    """The configurations to prove. Every ``window_left``, and ``None`` (full attention),
    is proved causal and, paired with every ``window_right`` (``None``: unbounded),
    non-causal; window starts apply to the unified and decode loops, whose masks
    compare absolute positions."""

    tilings: tuple
    window_lefts: tuple
    window_rights: tuple
    prefix_lens: tuple
    extend_lens: tuple
    window_starts: tuple = (0, 7777)
    # The ranges loop: blocks of up to range_rows rows, keys [0, K) for K in range_keys,
    # tiles of range_block_ns keys.
    range_rows: int = 3
    range_keys: tuple = (7, 8)
    range_block_ns: tuple = (1, 2, 3, 4)
    # Chunked local attention (the *-chunk loops): every chunk size, with every
    # chunk_window_left and None, causal and, paired with every chunk_window_right,
    # non-causal; at absolute positions only, chunks starting at position 0.
    chunks: tuple = ()
    chunk_window_lefts: tuple = ()
    chunk_window_rights: tuple = ()
    # A second key source (the second-* loops): every compression rate, every entry count
    # below second_entries, every query position up to a few entries past the last, tiles
    # of the tilings' widths and second_block_ns.
    second_rates: tuple = ()
    second_entries: int = 0
    second_block_ns: tuple = (1, 2, 3)

    def windows(self):
        lefts = tuple(self.window_lefts) + (None,)
        causal = [Window(left, None, True) for left in lefts]
        return causal + [Window(left, right, False)
                         for right in self.window_rights for left in lefts]

    def chunk_windows(self):
        lefts = tuple(self.chunk_window_lefts) + (None,)
        modes = [(True, None)] + [(False, right) for right in self.chunk_window_rights]
        return [Window(left, right, causal, chunk) for chunk in self.chunks for left in lefts
                for causal, right in modes]

    def decode_seq_lens(self):
        """Every length up to the largest block, and every prefix + extend of the grid."""
        longest_block = max(block_m for block_m, _ in self.tilings)
        lens = set(range(1, 2 * longest_block + 2))
        lens.update(p + e for p in self.prefix_lens for e in self.extend_lens)
        return tuple(sorted(lens))

    def chunk_decode_seq_lens(self):
        """:meth:`decode_seq_lens` and, for every chunk, the lengths that put the decode
        query one before, on, or one past the first and last positions of its first chunks."""
        lens = set(self.decode_seq_lens())
        longest = max(lens)
        lens.update(n * chunk + d for chunk in self.chunks for n in range(1, 5)
                    for d in (-1, 0, 1, 2) if 1 <= n * chunk + d <= longest)
        return tuple(sorted(lens))

    def describe(self):
        return {
            "tilings": [list(t) for t in self.tilings],
            "window_lefts": list(self.window_lefts),
            "window_rights": list(self.window_rights),
            "prefix_lens": list(self.prefix_lens),
            "extend_lens": list(self.extend_lens),
            "window_starts": list(self.window_starts),
            "decode_seq_lens": len(self.decode_seq_lens()),
            "range_rows": self.range_rows,
            "range_keys": list(self.range_keys),
            "range_block_ns": list(self.range_block_ns),
            "chunks": list(self.chunks),
            "chunk_window_lefts": list(self.chunk_window_lefts),
            "chunk_window_rights": list(self.chunk_window_rights),
            "chunk_decode_seq_lens": len(self.chunk_decode_seq_lens()),
            "second_rates": list(self.second_rates),
            "second_entries": self.second_entries,
            "second_block_ns": list(self.second_block_ns),
        }


DEFAULT_GRID = Grid(
    tilings=((16, 16), (16, 64), (32, 32), (32, 64), (64, 64), (64, 128), (128, 64), (128, 128)),
    window_lefts=(0, 1, 14, 15, 16, 31, 62, 63, 64, 65, 126, 127, 128, 129, 190, 191, 255, 256,
                  1023, 4095),
    window_rights=(0, 1, 63, 64, 200, None),
    prefix_lens=(0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1000, 4096, 8193),
    extend_lens=(1, 2, 15, 16, 17, 63, 64, 65, 128, 300),
    chunks=(1, 3, 16, 17, 64, 100, 8192),
    chunk_window_lefts=(63,),
    chunk_window_rights=(17, None),
    second_rates=(1, 2, 3, 4, 5, 8, 128),
    second_entries=40,
    second_block_ns=(1, 2, 3, 16, 64),
)

QUICK_GRID = Grid(
    tilings=((16, 16), (16, 32), (32, 16), (32, 64)),
    window_lefts=(0, 1, 15, 16, 17, 31, 32, 63, 100),
    window_rights=(0, 17, None),
    prefix_lens=(0, 1, 16, 17, 31, 64, 65, 200),
    extend_lens=(1, 15, 16, 17, 33, 70),
    window_starts=(0, 7777),
    range_rows=3,
    range_keys=(4,),
    range_block_ns=(1, 2, 3),
    chunks=(1, 3, 16, 17, 100),
    chunk_window_lefts=(16,),
    chunk_window_rights=(None,),
    second_rates=(1, 3, 4, 128),
    second_entries=12,
    second_block_ns=(1, 3, 16),
)


def _key_origin(loop, prefix_len):
    """Absolute position of the loop's key 0: the first new token's in stage 2."""
    return prefix_len if loop == "stage2" else 0


def _positions(loop, prefix_len, extend_len, window_start):
    """Absolute query positions of the new rows and key positions of the loop's range
    (int32, as in the kernels: half the memory traffic of int64 in the element-wise mask),
    the unified loop's shifted by ``window_start``."""
    rows = np.arange(extend_len, dtype=np.int32)
    keys = np.arange(range_end_of(loop, prefix_len, extend_len), dtype=np.int32)
    if loop == "unified":
        return window_start + prefix_len + rows, window_start + keys
    return prefix_len + rows, _key_origin(loop, prefix_len) + keys


def prove_loop(loop, grid=DEFAULT_GRID, bounds_fn=key_bounds, full_fn=full_tile_range,
               chunked=False):
    """Counts of one extend loop (``stage1``, ``stage2`` or ``unified``) over the grid.

    ``chunked``: over the grid's chunked windows (:meth:`Grid.chunk_windows`) instead, at
    window start 0 only (chunk boundaries sit at absolute positions), and every tile a
    block walks must lie in the chunks of its rows (:func:`check_chunk_spans`)."""
    if loop not in EXTEND_LOOPS:
        raise ValueError(f"loop must be one of {EXTEND_LOOPS}, got {loop!r}")
    stats = new_stats()
    if chunked:
        stats.update(straddling_blocks=0, tiles_outside_chunks=0)
    started = time.perf_counter()
    windows = grid.chunk_windows() if chunked else grid.windows()
    window_starts = grid.window_starts if loop == "unified" and not chunked else (0,)
    longest = max(grid.extend_lens)
    for prefix_len in grid.prefix_lens:
        layout = loop_layout(loop, prefix_len, grid)
        for window in windows:
            bounds = [bounds_fn(loop, prefix_len, extend_len, block_start, block_m, block_n,
                                window, "tight")
                      for extend_len, block_start, block_m, block_n in layout.calls]
            lo, hi = np.asarray(bounds, dtype=np.int64).reshape(-1, 2).T
            mids = [full_fn(loop, prefix_len, extend_len, block_start, block_m, block_n, window,
                            int(a), int(b))
                    for (extend_len, block_start, block_m, block_n), a, b
                    in zip(layout.calls, lo, hi)]
            mid_lo, mid_hi = np.asarray(mids, dtype=np.int64).reshape(-1, 2).T
            if chunked:
                check_chunk_spans(layout, window.chunk, prefix_len,
                                  _key_origin(loop, prefix_len), lo, hi, stats)
            for window_start in window_starts:
                q_pos, k_pos = _positions(loop, prefix_len, longest, window_start)
                mask = visible(q_pos[:, None], k_pos[None, :], window.left, window.right,
                               window.causal, window.chunk)
                sums = rectangle_sums(mask, len(q_pos), len(k_pos), layout.cuts)
                check_blocks(layout, sums, lo, hi, mid_lo, mid_hi, stats)
                stats["query_blocks"] += len(layout.calls)
    stats["configs"] = (len(grid.tilings) * len(windows) * len(grid.prefix_lens)
                        * len(grid.extend_lens) * len(window_starts))
    stats["seconds"] = time.perf_counter() - started
    return stats


def prove_decode(grid=DEFAULT_GRID, decode_bounds_fn=decode_bounds, chunked=False):
    """Counts of the decode loop: for every seq_len and window_left of the grid (and no
    window), keys ``[lo, hi)`` must hold every visible key and exactly ``min(L+1, seq_len)``.

    ``chunked``: for every chunk of the grid too, ``decode_bounds_fn(seq_len, L, chunk)``
    over :meth:`Grid.chunk_decode_seq_lens` at window start 0 (chunks start at position 0):
    the keys read must be every visible key and as many as the mask holds."""
    started = time.perf_counter()
    lens = grid.chunk_decode_seq_lens() if chunked else grid.decode_seq_lens()
    seq_lens = np.asarray(lens, dtype=np.int32)
    key_index = np.arange(int(seq_lens.max()), dtype=np.int32)
    exists = key_index[None, :] < seq_lens[:, None]
    stats = {"configs": 0, "keys_below_floor": 0, "violations": 0, "witnesses": 0,
             "loose": 0, "bad_bounds": 0, "seconds": 0.0}
    lefts = tuple(grid.window_lefts) + (None,)
    cases = ([(left, chunk) for chunk in grid.chunks for left in lefts] if chunked
             else [(left, None) for left in lefts])
    for window_left, chunk in cases:
        extra = () if chunk is None else (chunk,)
        bounds = [decode_bounds_fn(int(s), window_left, *extra) for s in seq_lens]
        lo, hi = np.asarray(bounds, dtype=np.int64).reshape(-1, 2).T
        bad = (lo < 0) | (hi > seq_lens) | (hi < lo)
        lo_c, hi_c = np.clip(lo, 0, seq_lens), np.clip(hi, 0, seq_lens)
        keep = seq_lens if window_left is None else np.minimum(window_left + 1, seq_lens)
        rows = np.arange(len(seq_lens))
        for window_start in (0,) if chunked else grid.window_starts:
            q_pos = window_start + seq_lens - 1
            mask = visible(q_pos[:, None], window_start + key_index[None, :], window_left,
                           None, True, chunk) & exists
            sums = np.zeros((len(seq_lens), len(key_index) + 1), dtype=np.int64)
            np.cumsum(mask, axis=1, out=sums[:, 1:])
            if chunk is not None:
                keep = sums[rows, -1]
            inside = sums[rows, hi_c] - sums[rows, lo_c]
            outside = sums[rows, -1] - inside
            floor_key = sums[rows, np.minimum(lo_c + 1, seq_lens)] - sums[rows, lo_c]
            stats["configs"] += len(seq_lens)
            stats["keys_below_floor"] += int(lo_c.sum())
            stats["violations"] += int(np.count_nonzero((outside > 0) | (inside != keep)))
            stats["witnesses"] += int(np.count_nonzero(floor_key > 0))
            stats["loose"] += int(np.count_nonzero(hi - lo != keep))
            stats["bad_bounds"] += int(np.count_nonzero(bad))
    stats["seconds"] = time.perf_counter() - started
    return stats


def prove_decode_splits(grid=DEFAULT_GRID, split_fn=decode_split_bounds, chunked=False):
    """Counts of the split decode loops: the Triton kernel's tiles from the first visible
    key and the Hopper path's on the grid of 0 (``aligned``), for every seq_len and
    window_left of the grid (and no window), every tile width of its tilings and every
    split count of :data:`DECODE_SPLITS`. The splits' key runs must lie on their tile grid,
    follow one another without overlap, hold together every key of :func:`decode_bounds`
    and no tile without one of them.

    ``chunked``: for every chunk of the grid and its chunked windows' lefts instead, over
    :meth:`Grid.chunk_decode_seq_lens`, against ``decode_bounds(seq_len, L, chunk)``."""
    started = time.perf_counter()
    stats = {"configs": 0, "splits": 0, "empty_splits": 0, "tiles": 0, "violations": 0,
             "overlaps": 0, "empty_tiles": 0, "bad_bounds": 0, "seconds": 0.0}
    block_ns = sorted({block_n for _, block_n in grid.tilings})
    if chunked:
        lefts = tuple(grid.chunk_window_lefts) + (None,)
        cases = [(left, chunk) for chunk in grid.chunks for left in lefts]
        seq_lens = grid.chunk_decode_seq_lens()
    else:
        cases = [(left, None) for left in tuple(grid.window_lefts) + (None,)]
        seq_lens = grid.decode_seq_lens()
    for aligned, block_n, (window_left, chunk), seq_len in itertools.product(
            (False, True), block_ns, cases, seq_lens):
        extra = () if chunk is None else (chunk,)
        lo, hi = decode_bounds(seq_len, window_left, chunk)
        origin = 0 if aligned else lo
        for num_splits in DECODE_SPLITS:
            read, stop_before = 0, None
            for i_split in range(num_splits):
                start, stop = split_fn(seq_len, window_left, block_n, num_splits, i_split,
                                       aligned, *extra)
                if (start - origin) % block_n or (stop - origin) % block_n or stop < start:
                    stats["bad_bounds"] += 1
                    continue
                if stop_before is not None and start < stop_before:
                    stats["overlaps"] += 1
                stop_before = stop
                stats["splits"] += 1
                stats["empty_splits"] += start == stop
                read += max(min(stop, hi) - max(start, lo), 0)
                for key0 in range(start, stop, block_n):
                    stats["tiles"] += 1
                    stats["empty_tiles"] += not (key0 < hi and key0 + block_n > lo)
            stats["configs"] += 1
            stats["violations"] += read != hi - lo
    stats["seconds"] = time.perf_counter() - started
    return stats


def prove_ranges(grid=DEFAULT_GRID, range_fn=range_bounds):
    """Counts of the ranges loop (stage 1 under ``key_ranges``): every block of 1 to
    ``grid.range_rows`` rows whose rows see any ranges ``[a_t, b_t)`` of ``[0, K)``, for
    every K of ``grid.range_keys`` and tile width of ``grid.range_block_ns``, against the
    tight bounds of ``range_fn``. A tile skipped while holding a visible element is a
    violation; a floor tile with nothing visible in a block that sees something is loose; a
    mask-free tile must be whole for every row and inside the range."""
    started = time.perf_counter()
    stats = new_stats()
    for keys in grid.range_keys:
        pairs = [(a, b) for a in range(keys + 1) for b in range(keys + 1)]
        for rows in range(1, grid.range_rows + 1):
            blocks = list(itertools.product(pairs, repeat=rows))
            a, b = np.asarray(blocks, dtype=np.int64).reshape(-1, 2).T
            # The element mask, every block's rows one after another: [blocks * rows, K].
            j = np.arange(keys)[None, :]
            mask = (j >= a[:, None]) & (j < b[:, None])
            for block_n in grid.range_block_ns:
                bounds = np.asarray([range_fn(block, block_n, keys) for block in blocks],
                                    dtype=np.int64).reshape(-1, 4)
                layout = range_layout(len(blocks), rows, keys, block_n)
                sums = rectangle_sums(mask, mask.shape[0], keys, layout.cuts)
                check_blocks(layout, sums, *bounds.T, stats)
                stats["query_blocks"] += len(blocks)
                stats["configs"] += len(blocks)
    stats["seconds"] = time.perf_counter() - started
    return stats


def _second_positions(rate, entries):
    """Query positions of the second-* loops: every one up to two entries past the last
    (-1 too: a row that is not well formed sits there); at large rates every position
    within one of an entry's closing, instead."""
    end = (entries + 2) * rate
    if rate <= 8:
        return np.arange(-1, end)
    near = {e * rate + d for e in range(entries + 3) for d in (-2, -1, 0, 1)}
    return np.asarray(sorted(p for p in near if -1 <= p < end))


def prove_second(grid=DEFAULT_GRID, limit_fn=second_limit, tiles_fn=second_tiles):
    """Counts of the second source's loops: for every compression rate, entry count
    ``n`` below ``grid.second_entries`` and query position (:func:`_second_positions`),
    every tile width and bounds variant, the entries a rate-mode row walks
    (``tiles_fn``) and keeps (``e < limit_fn``) against the convention's own predicate:
    entry ``e`` summarises positions ``[e * r, (e + 1) * r)`` and is visible once the
    query has reached the last of them, if the sequence holds it (``e < n``). A visible
    entry outside the walk or the mask is a violation; a kept entry that is not visible a
    read past the limit (``read_past``, entries nobody wrote among them); a tight walk
    whose last tile holds nothing visible is loose. An index-mode row keeps index ``e``
    iff ``e != -1 and e < limit``: over every ``e`` from -1 to past the entries, kept must
    be visible for ``e >= 0`` (``bad_picks`` counts the others)."""
    started = time.perf_counter()
    stats = {"configs": 0, "visible": 0, "violations": 0, "read_past": 0, "loose": 0,
             "bad_bounds": 0, "bad_picks": 0, "tiles": 0, "seconds": 0.0}
    block_ns = sorted({block_n for _, block_n in grid.tilings} | set(grid.second_block_ns))
    for rate in grid.second_rates:
        for n in range(grid.second_entries):
            positions = _second_positions(rate, n)
            e = np.arange(-1, n + 3)
            oracle = ((e[None, :] >= 0) & ((e[None, :] + 1) * rate - 1 <= positions[:, None])
                      & (e[None, :] < n))
            limits = np.asarray([limit_fn(int(p), rate, n) for p in positions])
            picked = (e[None, :] != -1) & (e[None, :] < limits[:, None])
            stats["bad_picks"] += int(np.count_nonzero(picked[:, 1:] != oracle[:, 1:]))
            stats["visible"] += int(oracle.sum())
            for block_n, bounds in itertools.product(block_ns, ("tight", "skip", "none")):
                for row, p in enumerate(positions):
                    start, stop = tiles_fn(int(p), rate, n, block_n, bounds)
                    stats["configs"] += 1
                    if start < 0 or start % block_n or stop % block_n or stop < start:
                        stats["bad_bounds"] += 1
                        continue
                    stats["tiles"] += (stop - start) // block_n
                    walked = (e >= start) & (e < stop)
                    kept = walked & (e < limits[row]) & (e >= 0)
                    stats["violations"] += int(np.count_nonzero(oracle[row] & ~kept))
                    stats["read_past"] += int(np.count_nonzero(kept & ~oracle[row]))
                    if bounds == "tight" and stop > start:
                        last = (e >= stop - block_n) & (e < stop)
                        stats["loose"] += not (last & oracle[row]).any()
    stats["seconds"] = time.perf_counter() - started
    return stats


def prove_segments(most_tiles=7, split_fn=split_tiles, segment_fn=segment_tiles):
    """Counts of a row's run cut into splits (the second source's kernel: its cached
    window's tiles, its new keys', its second source's, one run): for every segment
    length up to ``most_tiles`` and every split count of :data:`DECODE_SPLITS`, each
    segment's tiles must be walked by exactly one split (``overlaps``: twice or more;
    ``violations``: never)."""
    started = time.perf_counter()
    stats = {"configs": 0, "splits": 0, "violations": 0, "overlaps": 0, "bad_bounds": 0,
             "seconds": 0.0}
    for counts in itertools.product(range(most_tiles + 1), repeat=3):
        total = sum(counts)
        for num_splits in DECODE_SPLITS:
            walks = [[0] * c for c in counts]
            for i_split in range(num_splits):
                t_start, t_stop = split_fn(0, total, num_splits, i_split)
                stats["splits"] += 1
                first = 0
                for seg, count in enumerate(counts):
                    a, b = segment_fn(t_start, t_stop, first, count)
                    if not 0 <= a <= b <= count:
                        stats["bad_bounds"] += 1
                    for t in range(a, b):
                        walks[seg][t] += 1
                    first += count
            stats["configs"] += 1
            flat = [w for seg in walks for w in seg]
            stats["violations"] += sum(w == 0 for w in flat)
            stats["overlaps"] += sum(w > 1 for w in flat)
    stats["seconds"] = time.perf_counter() - started
    return stats


def prove(grid=DEFAULT_GRID, bounds_fn=key_bounds, decode_bounds_fn=decode_bounds,
          full_fn=full_tile_range, split_fn=decode_split_bounds, *, chunk_bounds_fn=key_bounds,
          chunk_full_fn=full_tile_range, chunk_decode_fn=decode_bounds,
          chunk_split_fn=decode_split_bounds):
    """Prove every loop's bounds over ``grid``, and with the grid's chunks the chunked
    loops (``*-chunk``, their bounds from the ``chunk_*`` functions). Returns ``{"grid",
    "loops", "violations", "ok", "seconds"}``; ``ok`` is False on any violation, loose
    floor or bad bound."""
    started = time.perf_counter()
    loops = {loop: prove_loop(loop, grid, bounds_fn, full_fn) for loop in EXTEND_LOOPS}
    loops["ranges"] = prove_ranges(grid)
    if grid.chunks:
        for loop in EXTEND_LOOPS:
            loops[f"{loop}-chunk"] = prove_loop(loop, grid, chunk_bounds_fn, chunk_full_fn,
                                                chunked=True)
    loops["decode"] = prove_decode(grid, decode_bounds_fn)
    loops["decode-splits"] = prove_decode_splits(grid, split_fn)
    if grid.chunks:
        loops["decode-chunk"] = prove_decode(grid, chunk_decode_fn, chunked=True)
        loops["decode-splits-chunk"] = prove_decode_splits(grid, chunk_split_fn, chunked=True)
    if grid.second_rates:
        loops["second"] = prove_second(grid)
        loops["second-splits"] = prove_segments()
    violations = sum(stats["violations"] for stats in loops.values())
    failures = sum(stats.get(key, 0) for stats in loops.values() for key in FAILURES)
    return {"grid": grid.describe(), "loops": loops, "violations": violations,
            "ok": failures == 0, "seconds": time.perf_counter() - started}


_EXTEND_COLUMNS = (("configs", "configs"), ("query_blocks", "blocks"),
                   ("tiles_below_floor", "below floor"), ("violations", "violations"),
                   ("witnesses", "witnesses"), ("loose_floors", "loose"),
                   ("tiles_past_end", "past end"), ("empty_tiles_walked", "empty walked"),
                   ("bad_bounds", "bad bounds"), ("full_tiles", "mask-free"),
                   ("partial_full_tiles", "mask-free not whole"))
_DECODE_COLUMNS = (("configs", "configs"), ("keys_below_floor", "keys below floor"),
                   ("violations", "violations"), ("witnesses", "witnesses"),
                   ("loose", "loose"), ("bad_bounds", "bad bounds"))
_CHUNK_COLUMNS = (*_EXTEND_COLUMNS, ("straddling_blocks", "straddling"),
                  ("tiles_outside_chunks", "outside chunks"))
_SECOND_COLUMNS = (("configs", "configs"), ("visible", "visible"), ("tiles", "tiles"),
                   ("violations", "violations"), ("read_past", "read past"),
                   ("bad_picks", "bad picks"), ("loose", "loose"), ("bad_bounds", "bad bounds"))
_SEGMENT_COLUMNS = (("configs", "configs"), ("splits", "splits"), ("violations", "violations"),
                    ("overlaps", "overlaps"), ("bad_bounds", "bad bounds"))
_SPLIT_COLUMNS = (("configs", "configs"), ("splits", "splits"), ("empty_splits", "empty splits"),
                  ("tiles", "tiles"), ("violations", "violations"), ("overlaps", "overlaps"),
                  ("empty_tiles", "empty tiles"), ("bad_bounds", "bad bounds"))


def _table(rows, columns, name_width=13):
    widths = [max(len(title), *(len(f"{row[key]:,}") for _, row in rows)) for key, title in columns]
    lines = [f"{'loop':<{name_width}} "
             + "  ".join(f"{title:>{w}}" for (_, title), w in zip(columns, widths)) + "  seconds"]
    for name, row in rows:
        cells = "  ".join(f"{row[key]:>{w},}" for (key, _), w in zip(columns, widths))
        lines.append(f"{name:<{name_width}} {cells}  {row['seconds']:7.2f}")
    return lines


def _none_or(values):
    return ", ".join("None" if value is None else str(value) for value in values)


def format_report(result):
    """The readable report of :func:`prove`."""
    grid = result["grid"]
    lines = [
        "swattn prove: the key-tile bounds of swattn.window against the mask, element by element",
        (f"grid: {len(grid['tilings'])} tilings x ({len(grid['window_lefts'])} window_left + None) "
         f"x (causal + non-causal window_right in {{{_none_or(grid['window_rights'])}}}) x "
         f"{len(grid['prefix_lens'])} prefixes x {len(grid['extend_lens'])} extends; unified and "
         f"decode at window starts {grid['window_starts']}; decode over "
         f"{grid['decode_seq_lens']} seq_lens; ranges: blocks of up to {grid['range_rows']} rows, "
         f"every range of each row over {grid['range_keys']} keys, tiles of "
         f"{grid['range_block_ns']}"),
    ]
    if grid["chunks"]:
        lines.append(
            f"chunked: chunks {grid['chunks']} x window_left in "
            f"{{{_none_or([*grid['chunk_window_lefts'], None])}}} x (causal + non-causal "
            f"window_right in {{{_none_or(grid['chunk_window_rights'])}}}), every tiling, prefix "
            f"and extend, at absolute positions; decode: every window_left, over "
            f"{grid['chunk_decode_seq_lens']} seq_lens")
    loops = result["loops"]
    chunk_loops = [f"{loop}-chunk" for loop in EXTEND_LOOPS if f"{loop}-chunk" in loops]
    width = max(len(name) for name in loops)
    lines += _table([(loop, loops[loop]) for loop in (*EXTEND_LOOPS, "ranges")],
                    _EXTEND_COLUMNS, width)
    if chunk_loops:
        lines += _table([(loop, loops[loop]) for loop in chunk_loops], _CHUNK_COLUMNS, width)
    decode = [loop for loop in ("decode", "decode-chunk") if loop in loops]
    lines += _table([(loop, loops[loop]) for loop in decode], _DECODE_COLUMNS, width)
    splits = [loop for loop in ("decode-splits", "decode-splits-chunk") if loop in loops]
    lines += _table([(loop, loops[loop]) for loop in splits], _SPLIT_COLUMNS, width)
    if "second" in loops:
        lines.append(f"second source: rates {grid['second_rates']} x entry counts below "
                     f"{grid['second_entries']} x query positions x tiles of "
                     f"{grid['second_block_ns']} and the tilings' x tight/skip/none; its splits: "
                     f"three segments of up to 7 tiles x {DECODE_SPLITS} splits")
        lines += _table([("second", loops["second"])], _SECOND_COLUMNS, width)
        lines += _table([("second-splits", loops["second-splits"])], _SEGMENT_COLUMNS, width)
    verdict = "PROVED" if result["ok"] else "FAILED"
    lines.append(f"{verdict}: {result['violations']:,} violations "
                 f"(skipped tiles holding a visible element) in {result['seconds']:.1f} s")
    return "\n".join(lines)


def run(args, *, bounds_fn=key_bounds, decode_bounds_fn=decode_bounds, keep_from=None):
    """The ``swattn prove`` command (arguments ``json``, ``quick``, ``no_schedule``; see
    :mod:`swattn.cli`): print the report, return the exit status (0 proved; 1 on any
    violation, loose floor or bad bound, or a page the memory schedule frees early or holds
    late). ``keep_from``: the memory manager's free rule under test (default its own)."""
    grid = QUICK_GRID if args.quick else DEFAULT_GRID
    result = prove(grid, bounds_fn, decode_bounds_fn)
    report = None
    if not getattr(args, "no_schedule", False):
        from ..memory import first_page_kept
        from .prove_memory import (
            DEFAULT_MEMORY_GRID,
            QUICK_MEMORY_GRID,
            format_memory_report,
            prove_memory,
        )
        schedule = prove_memory(QUICK_MEMORY_GRID if args.quick else DEFAULT_MEMORY_GRID,
                                keep_from or first_page_kept)
        result["schedule"] = schedule
        result["ok"] = result["ok"] and schedule["ok"]
        verdict = "PROVED" if schedule["ok"] else "FAILED"
        report = (format_memory_report(schedule)
                  + f"\n{verdict}: {schedule['violations']:,} pages freed before a step that "
                  f"reads them, {schedule['late']:,} held with no step to read them")
    if args.json:
        print(json.dumps(result))
    else:
        print(format_report(result) + ("" if report is None else "\n" + report))
    return 0 if result["ok"] else 1
