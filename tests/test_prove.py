"""The exhaustive bound prover (swattn.verify.prove): the true bounds prove on the quick
grid, and an off-by-one planted in a copy of a bound is caught."""

import argparse
import dataclasses
import json

import pytest

from swattn import window
from swattn.verify import prove
from swattn.window import causal_key_end, first_key_tile, key_bounds, right_key_end, visible_key_end

EXTEND_LOOPS = ("stage1", "stage2", "unified")


def copy_of_key_bounds(first_tile=first_key_tile, causal_end=causal_key_end,
                       right_end=right_key_end):
    """``key_bounds`` (tight) rebuilt from swappable primitives, so a test can plant a bug
    in one of them."""

    def bounds(loop, prefix_len, extend_len, block_start, block_m, block_n, win, variant="tight"):
        assert variant == "tight"
        last_row = min(block_start + block_m, extend_len) - 1
        range_end, first_q, last_q = {
            "stage1": (prefix_len, prefix_len + block_start, prefix_len + last_row),
            "stage2": (extend_len, block_start, last_row),
            "unified": (prefix_len + extend_len, prefix_len + block_start, prefix_len + last_row),
        }[loop]
        end = range_end
        if win.causal:
            end = causal_end(last_q, range_end)
        elif win.right is not None:
            end = right_end(last_q, win.right, range_end)
        lo = 0
        if win.left is not None:
            lo = first_tile(first_q, win.left, block_n)
            end = visible_key_end(first_q, win.left, lo, end)
        return lo, max(end, lo)

    return bounds


def _quick(**kwargs):
    return prove.prove(prove.QUICK_GRID, **kwargs)


def _quick_unchunked(**kwargs):
    """The quick grid without its chunked loops: for bugs planted outside them."""
    return prove.prove(dataclasses.replace(prove.QUICK_GRID, chunks=()), **kwargs)


@pytest.fixture(scope="module")
def true_result():
    return _quick()


def test_copy_matches_key_bounds():
    """The planted bugs below are planted in a faithful copy: unchanged, it agrees with
    window.key_bounds everywhere on the quick grid."""
    copy = copy_of_key_bounds()
    grid = prove.QUICK_GRID
    for loop in EXTEND_LOOPS:
        for win in grid.windows():
            for prefix_len in grid.prefix_lens:
                for extend_len in grid.extend_lens:
                    for block_m, block_n in grid.tilings:
                        for m0 in range(0, extend_len, block_m):
                            args = (loop, prefix_len, extend_len, m0, block_m, block_n, win)
                            assert copy(*args) == key_bounds(*args, "tight")


def test_true_bounds_prove_with_witnesses(true_result):
    assert true_result["ok"] is True
    assert true_result["violations"] == 0
    for loop in EXTEND_LOOPS:
        stats = true_result["loops"][loop]
        assert stats["violations"] == 0 and stats["loose_floors"] == 0 and stats["bad_bounds"] == 0
        assert stats["witnesses"] > 0
        assert stats["tiles_below_floor"] > 0, "the check below the floor must not be vacuous"
    assert true_result["loops"]["stage2"]["tiles_past_end"] > 0
    assert (true_result["loops"]["unified"]["configs"]
            == 2 * true_result["loops"]["stage1"]["configs"])
    decode = true_result["loops"]["decode"]
    assert decode["violations"] == 0 and decode["loose"] == 0
    assert decode["witnesses"] == decode["configs"]


def test_counts_are_deterministic(true_result):
    again = _quick()
    for loop in true_result["loops"]:
        a = {k: v for k, v in true_result["loops"][loop].items() if k != "seconds"}
        b = {k: v for k, v in again["loops"][loop].items() if k != "seconds"}
        assert a == b


def _floor_plus_one(first_q, window_left, block_n):
    """Bug: the lowest key row 0 sees taken as p0 - L + 1."""
    return first_key_tile(first_q + 1, window_left, block_n)


def _floor_ceil(first_q, window_left, block_n):
    """Bug: ceil instead of floor."""
    return -(-max(first_q - window_left, 0) // block_n) * block_n


def _causal_end_one_short(last_q, range_end):
    """Bug: the causal end excludes the last row's own key."""
    return min(last_q, range_end)


def _right_end_one_short(last_q, window_right, range_end):
    """Bug: the right end excludes key p + R."""
    return min(last_q + window_right, range_end)


@pytest.mark.parametrize("bug,loops", [
    ({"first_tile": _floor_plus_one}, EXTEND_LOOPS),
    ({"first_tile": _floor_ceil}, EXTEND_LOOPS),
    ({"causal_end": _causal_end_one_short}, ("stage2", "unified")),
    ({"right_end": _right_end_one_short}, ("stage2", "unified")),
], ids=["floor-p0-minus-L-plus-1", "floor-ceil", "causal-end-one-short", "right-end-one-short"])
def test_planted_off_by_one_is_a_violation(bug, loops):
    result = _quick_unchunked(bounds_fn=copy_of_key_bounds(**bug))
    assert result["ok"] is False
    for loop in loops:
        assert result["loops"][loop]["violations"] > 0, loop


def test_floor_one_tile_low_is_loose_not_violating():
    """A floor one tile too low skips nothing visible but walks a dead tile: a loose
    floor, which the prover also fails."""
    def low(q, L, n):
        return max(first_key_tile(q, L, n) - n, 0)

    result = _quick_unchunked(bounds_fn=copy_of_key_bounds(first_tile=low))
    assert result["violations"] == 0
    assert all(result["loops"][loop]["loose_floors"] > 0 for loop in EXTEND_LOOPS)
    assert result["ok"] is False


def test_unaligned_floor_is_a_bad_bound():
    """A floor at the first visible key itself is conservative but leaves the 0-aligned
    tile grid the kernels (and deterministic mode) rely on."""
    def unaligned(q, L, n):
        return max(q - L, 0)

    result = _quick_unchunked(bounds_fn=copy_of_key_bounds(first_tile=unaligned))
    assert sum(result["loops"][loop]["bad_bounds"] for loop in EXTEND_LOOPS) > 0
    assert result["ok"] is False


@pytest.mark.parametrize("shift,field", [(1, "violations"), (-1, "loose")],
                         ids=["decode-floor-one-high", "decode-floor-one-low"])
def test_planted_decode_bug(shift, field):
    def buggy(seq_len, window_left):
        lo, hi = window.decode_bounds(seq_len, window_left)
        return min(max(lo + shift, 0), hi), hi

    result = _quick_unchunked(decode_bounds_fn=buggy)
    assert result["loops"]["decode"][field] > 0
    assert result["ok"] is False


def test_split_decode_loops_prove(true_result):
    stats = true_result["loops"]["decode-splits"]
    assert stats["configs"] > 0 and stats["splits"] > stats["configs"]
    assert stats["empty_splits"] > 0, "split counts past the tiles must be in the grid"
    for field in ("violations", "overlaps", "empty_tiles", "bad_bounds"):
        assert stats[field] == 0, field


def _split_floor(seq_len, window_left, block_n, num_splits, i_split, aligned=False):
    """Splits of floor(tiles / splits) tiles: the last tiles are left out."""
    lo, hi = window.decode_bounds(seq_len, window_left)
    origin = 0 if aligned else lo
    t_lo, t_end = ((lo // block_n, -(-hi // block_n)) if aligned
                   else (0, window.num_tiles(lo, hi, block_n)))
    per = max((t_end - t_lo) // num_splits, 1)
    t_start = min(t_lo + i_split * per, t_end)
    return origin + t_start * block_n, origin + min(t_start + per, t_end) * block_n


def _split_off_grid(seq_len, window_left, block_n, num_splits, i_split, aligned=False):
    """The aligned tiles started at the first visible key instead of its tile."""
    start, stop = window.decode_split_bounds(seq_len, window_left, block_n, num_splits, i_split,
                                             aligned)
    lo, _ = window.decode_bounds(seq_len, window_left)
    return (max(start, lo), stop) if aligned and i_split == 0 else (start, stop)


@pytest.mark.parametrize("bug,field",
                         [(_split_floor, "violations"), (_split_off_grid, "bad_bounds")],
                         ids=["splits-floor", "aligned-start-off-grid"])
def test_planted_split_bug(bug, field):
    result = _quick_unchunked(split_fn=bug)
    assert result["loops"]["decode-splits"][field] > 0
    assert result["ok"] is False


def test_prover_evaluates_the_mask_predicate(monkeypatch):
    """The prover brute-forces ``visible`` rather than re-deriving intervals: a predicate
    that keeps one key too many (L + 1 back) makes the true bounds fail."""
    true_visible = prove.visible
    monkeypatch.setattr(prove, "visible",
                        lambda q, k, left, right, causal, chunk=None: true_visible(
                            q, k, None if left is None else left + 1, right, causal, chunk))
    result = prove.prove_loop("unified", prove.QUICK_GRID)
    assert result["violations"] > 0


def test_cli_path_exits_one_on_a_planted_bug(capsys):
    args = argparse.Namespace(quick=True, json=True)
    assert prove.run(args, bounds_fn=copy_of_key_bounds(first_tile=_floor_ceil)) == 1
    printed = json.loads(capsys.readouterr().out)
    assert printed["ok"] is False and printed["violations"] > 0
    assert prove.run(args) == 0
    assert json.loads(capsys.readouterr().out)["violations"] == 0


def test_report_lists_every_loop(true_result):
    text = prove.format_report(true_result)
    for loop in ("stage1", "stage2", "unified", "decode", "decode-splits", "stage1-chunk",
                 "stage2-chunk", "unified-chunk", "decode-chunk", "decode-splits-chunk"):
        assert any(line.startswith(f"{loop} ") for line in text.splitlines()), loop
    assert text.splitlines()[-1].startswith("PROVED: 0 violations")


def test_default_grid_is_the_documented_one():
    grid = prove.DEFAULT_GRID
    assert len(grid.tilings) >= 8
    assert {(16, 16), (16, 64), (32, 32), (32, 64), (64, 64), (64, 128), (128, 64),
            (128, 128)} <= set(grid.tilings)
    assert len(grid.window_lefts) == 20 and len(grid.prefix_lens) == 17
    assert len(grid.extend_lens) == 10
    assert set(grid.window_starts) == {0, 7777}
    assert None in grid.window_rights and 0 in grid.window_rights
    # Chunks below, equal to and above the tiles, non-multiples of them, and one past
    # every position but the longest prefix's.
    block_ns = {block_n for _, block_n in grid.tilings}
    assert {1, 3, 16, 17, 64, 100, 8192} <= set(grid.chunks)
    assert any(c < min(block_ns) for c in grid.chunks) and block_ns & set(grid.chunks)
    assert any(c > n and c % n for c in grid.chunks for n in block_ns)
    assert None in grid.chunk_window_rights


def test_mask_free_tiles_are_whole_on_the_true_bounds(true_result):
    for loop in EXTEND_LOOPS:
        assert true_result["loops"][loop]["full_tiles"] > 0, loop
        assert true_result["loops"][loop]["partial_full_tiles"] == 0, loop


def _full_range_from_first_row(loop, prefix_len, extend_len, block_start, block_m, block_n, win,
                               lo, hi):
    """Bug: the mask-free run starts at the loop's first tile (the first row's floor), not
    at the last row's lowest key, so it takes in tiles the later rows only partly see."""
    mid_lo, mid_hi = window.full_tile_range(loop, prefix_len, extend_len, block_start, block_m,
                                            block_n, win, lo, hi)
    return min(lo, mid_lo), mid_hi


def test_planted_mask_free_bug_is_caught():
    result = _quick_unchunked(full_fn=_full_range_from_first_row)
    assert result["ok"] is False
    assert sum(result["loops"][loop]["partial_full_tiles"] for loop in EXTEND_LOOPS) > 0


def test_key_ranges_bounds_prove(true_result):
    """The ranges loop (stage 1 under key_ranges): every block of up to three rows, each row
    any range of the keys, no visible key skipped, no loose floor, mask-free tiles whole."""
    stats = true_result["loops"]["ranges"]
    assert stats["configs"] > 40_000 and stats["witnesses"] > 0 and stats["full_tiles"] > 0
    assert stats["tiles_below_floor"] > 0 and stats["tiles_past_end"] > 0
    for key in prove.FAILURES:
        assert stats.get(key, 0) == 0, key
    assert any(line.startswith("ranges") for line in prove.format_report(true_result).splitlines())


def _ranges_hi_one_short(rows, block_n, range_end, bounds="tight"):
    """Bug: the loop ends one key before the highest range end."""
    lo, hi, mid_lo, mid_hi = window.range_bounds(rows, block_n, range_end, bounds)
    hi = max(hi - 1, lo)
    return lo, hi, min(mid_lo, hi), min(mid_hi, hi)


def _ranges_full_from_floor(rows, block_n, range_end, bounds="tight"):
    """Bug: the mask-free tiles start at the floor, not at the highest range start."""
    lo, hi, _, mid_hi = window.range_bounds(rows, block_n, range_end, bounds)
    return lo, hi, lo, mid_hi


def _ranges_floor_of_first_row(rows, block_n, range_end, bounds="tight"):
    """Bug: the floor taken from the first row's range, not the lowest a row sees."""
    _, hi, mid_lo, mid_hi = window.range_bounds(rows, block_n, range_end, bounds)
    floor = min(rows[0][0], range_end) // block_n * block_n
    return floor, max(hi, floor), max(mid_lo, floor), max(mid_hi, floor)


@pytest.mark.parametrize("bug, failure", [(_ranges_hi_one_short, "violations"),
                                          (_ranges_full_from_floor, "partial_full_tiles"),
                                          (_ranges_floor_of_first_row, "violations")])
def test_planted_key_ranges_bugs_are_caught(bug, failure):
    assert prove.prove_ranges(prove.QUICK_GRID, bug)[failure] > 0


# --------------------------------------------------------------------------------------
# Chunked local attention: the *-chunk loops.
# --------------------------------------------------------------------------------------

CHUNK_LOOPS = tuple(f"{loop}-chunk" for loop in EXTEND_LOOPS)


def row_range_with(chunk_shift=0, chunk_floor=True, chunk_end=True):
    """``window.row_key_range`` rebuilt with switches, so a test can plant a bug in its
    chunk: the chunk's start moved by ``chunk_shift``, or left out of the floor or the end."""

    def row_range(q_pos, origin, range_end, window_left, window_right, chunk, USE_WINDOW,
                  USE_CHUNK, IS_CAUSAL, USE_RIGHT):
        lo, hi = 0, range_end
        if USE_WINDOW:
            lo = max(lo, q_pos - window_left)
        if USE_CHUNK:
            chunk_start = (q_pos + origin) // chunk * chunk - origin + chunk_shift
            if chunk_floor:
                lo = max(lo, chunk_start)
            if chunk_end:
                hi = min(hi, chunk_start + chunk)
        if IS_CAUSAL:
            hi = min(hi, q_pos + 1)
        elif USE_RIGHT:
            hi = min(hi, q_pos + window_right + 1)
        return lo, hi

    return row_range


def copy_of_chunk_bounds(row_range=None, stage2_origin=True):
    """``(key_bounds, full_tile_range)`` under a chunk rebuilt from ``row_range`` (default:
    :func:`row_range_with` unchanged) and ``window.range_bounds``; ``stage2_origin=False``
    plants the bug of stage 2 taking its rows' chunks at loop positions, as if the new
    tokens started at position 0."""
    row_range = row_range or row_range_with()

    def block(loop, prefix_len, extend_len, block_start, block_m, block_n, win, variant):
        last_row = min(block_start + block_m, extend_len) - 1
        range_end, first_q, last_q = {
            "stage1": (prefix_len, prefix_len + block_start, prefix_len + last_row),
            "stage2": (extend_len, block_start, last_row),
            "unified": (prefix_len + extend_len, prefix_len + block_start, prefix_len + last_row),
        }[loop]
        origin = prefix_len if loop == "stage2" and stage2_origin else 0
        rows = [row_range(q, origin, range_end, win.left or 0, win.right or 0, win.chunk,
                          win.left is not None, True, win.causal,
                          not win.causal and win.right is not None)
                for q in range(first_q, last_q + 1)]
        return window.range_bounds(rows, block_n, range_end, variant)

    def bounds(loop, prefix_len, extend_len, block_start, block_m, block_n, win, variant="tight"):
        return block(loop, prefix_len, extend_len, block_start, block_m, block_n, win, variant)[:2]

    def full(loop, prefix_len, extend_len, block_start, block_m, block_n, win, lo, hi):
        return block(loop, prefix_len, extend_len, block_start, block_m, block_n, win, "tight")[2:]

    return bounds, full


def test_chunk_copy_matches_key_bounds():
    """The chunk bugs below are planted in a faithful copy: unchanged, it agrees with
    window.key_bounds and window.full_tile_range on every chunked block of the quick grid."""
    bounds, full = copy_of_chunk_bounds()
    grid = prove.QUICK_GRID
    for loop in EXTEND_LOOPS:
        for win in grid.chunk_windows():
            for prefix_len in grid.prefix_lens:
                for extend_len in grid.extend_lens:
                    for block_m, block_n in grid.tilings:
                        for m0 in range(0, extend_len, block_m):
                            args = (loop, prefix_len, extend_len, m0, block_m, block_n, win)
                            lo, hi = key_bounds(*args, "tight")
                            assert bounds(*args) == (lo, hi)
                            assert full(*args, lo, hi) == window.full_tile_range(*args, lo, hi)


def test_chunked_loops_prove_with_witnesses(true_result):
    """Every chunked loop proves on the quick grid, and none of its checks is vacuous: blocks
    straddle chunk boundaries, tiles lie below the floors, mask-free tiles exist."""
    for loop in CHUNK_LOOPS:
        stats = true_result["loops"][loop]
        for key in prove.FAILURES:
            assert stats.get(key, 0) == 0, (loop, key)
        assert stats["witnesses"] > 0 and stats["full_tiles"] > 0, loop
        assert stats["straddling_blocks"] > 0 and stats["tiles_below_floor"] > 0, loop
    assert true_result["loops"]["stage2-chunk"]["configs"] == \
        true_result["loops"]["unified-chunk"]["configs"]
    decode = true_result["loops"]["decode-chunk"]
    assert decode["violations"] == 0 and decode["loose"] == 0 and decode["bad_bounds"] == 0
    assert decode["witnesses"] == decode["configs"] > 0
    splits = true_result["loops"]["decode-splits-chunk"]
    assert splits["configs"] > 0 and splits["empty_splits"] > 0
    for key in ("violations", "overlaps", "empty_tiles", "bad_bounds"):
        assert splits[key] == 0, key


@pytest.mark.parametrize("bug, loops, failure", [
    ({"row_range": row_range_with(chunk_shift=1)}, EXTEND_LOOPS, "violations"),
    ({"row_range": row_range_with(chunk_shift=-1)}, EXTEND_LOOPS, "loose_floors"),
    ({"row_range": row_range_with(chunk_floor=False)}, EXTEND_LOOPS, "loose_floors"),
    ({"row_range": row_range_with(chunk_floor=False)}, EXTEND_LOOPS, "tiles_outside_chunks"),
    ({"row_range": row_range_with(chunk_end=False)}, ("stage2", "unified"),
     "tiles_outside_chunks"),
    ({"stage2_origin": False}, ("stage2",), "violations"),
], ids=["chunk-start-one-late", "chunk-start-one-early", "chunk-ignored-in-floor",
        "chunk-ignored-in-floor-walks-other-chunks", "chunk-end-ignored", "stage2-origin-ignored"])
def test_planted_chunk_bug_is_caught(bug, loops, failure):
    bounds, full = copy_of_chunk_bounds(**bug)
    for loop in loops:
        stats = prove.prove_loop(loop, prove.QUICK_GRID, bounds, full, chunked=True)
        assert stats[failure] > 0, loop


def test_planted_chunk_bug_fails_the_prover():
    """Through :func:`prove.prove`: a chunk bug fails the run while the window loops pass."""
    bounds, full = copy_of_chunk_bounds(stage2_origin=False)
    result = _quick(chunk_bounds_fn=bounds, chunk_full_fn=full)
    assert result["ok"] is False and result["violations"] > 0
    assert all(result["loops"][loop]["violations"] == 0 for loop in EXTEND_LOOPS)


def test_planted_mask_free_tiles_ignoring_the_chunk():
    """Bug: the mask-free tiles taken from the window alone, as if there were no chunk: tiles
    a row of the block sees only in part would skip the mask."""
    def full(loop, prefix_len, extend_len, block_start, block_m, block_n, win, lo, hi):
        unchunked = window.Window(win.left, win.right, win.causal)
        return window.full_tile_range(loop, prefix_len, extend_len, block_start, block_m,
                                      block_n, unchunked, lo, hi)

    for loop in EXTEND_LOOPS:
        stats = prove.prove_loop(loop, prove.QUICK_GRID, key_bounds, full, chunked=True)
        assert stats["partial_full_tiles"] > 0, loop


def _decode_chunk_ignored(seq_len, window_left, chunk):
    return window.decode_bounds(seq_len, window_left)


def _decode_chunk_of_seq_len(seq_len, window_left, chunk):
    """The chunk taken at ``seq_len`` instead of the query's position ``seq_len - 1``."""
    lo, hi = window.decode_bounds(seq_len, window_left)
    return min(max(lo, seq_len // chunk * chunk), hi), hi


def _decode_chunk_shifted(shift):
    def bounds(seq_len, window_left, chunk):
        lo, hi = window.decode_bounds(seq_len, window_left)
        chunk_start = window.decode_chunk_first_key(seq_len, chunk) + shift
        return min(max(lo, chunk_start, 0), hi), hi

    return bounds


@pytest.mark.parametrize("bug, failure", [
    (_decode_chunk_ignored, "loose"), (_decode_chunk_of_seq_len, "violations"),
    (_decode_chunk_shifted(1), "violations"), (_decode_chunk_shifted(-1), "loose"),
], ids=["decode-chunk-ignored", "decode-chunk-of-seq-len", "decode-chunk-start-one-late",
        "decode-chunk-start-one-early"])
def test_planted_decode_chunk_bug(bug, failure):
    assert prove.prove_decode(prove.QUICK_GRID, bug, chunked=True)[failure] > 0


def test_planted_split_ignoring_the_chunk():
    """Bug: the split decode loops cut the window's keys into runs, not the chunk's."""
    def split(seq_len, window_left, block_n, num_splits, i_split, aligned=False, chunk=None):
        return window.decode_split_bounds(seq_len, window_left, block_n, num_splits, i_split,
                                          aligned)

    stats = prove.prove_decode_splits(prove.QUICK_GRID, split, chunked=True)
    assert stats["empty_tiles"] + stats["bad_bounds"] > 0


def test_second_source_loops_prove(true_result):
    """The second source's loops: every visible entry walked and kept, nothing past the
    limit kept, no loose tight walk; every tile of a row's run walked by one split."""
    second, segments = true_result["loops"]["second"], true_result["loops"]["second-splits"]
    assert second["configs"] > 0 and second["visible"] > 0
    for key in ("violations", "read_past", "bad_picks", "loose", "bad_bounds"):
        assert second[key] == 0, key
    assert segments["configs"] > 0
    assert segments["violations"] == segments["overlaps"] == segments["bad_bounds"] == 0


@pytest.mark.parametrize("limit, failure", [
    (lambda p, r, n: min((p + 2) // r, max(n, 0)), "read_past"),   # one position early
    (lambda p, r, n: (p + 1) // r, "read_past"),                    # past the entries held
    (lambda p, r, n: min(p // r, max(n, 0)), "violations"),         # one position late
])
def test_planted_second_limit_bug_is_caught(limit, failure):
    stats = prove.prove_second(prove.QUICK_GRID, limit_fn=limit)
    assert stats[failure] > 0


def test_planted_second_walk_bugs_are_caught():
    """A tight walk one tile short misses entries; one tile long is loose."""
    def short(p, r, n, bn, bounds="tight"):
        start, stop = window.second_tiles(p, r, n, bn, bounds)
        return start, max(stop - bn, start)

    def long(p, r, n, bn, bounds="tight"):
        start, stop = window.second_tiles(p, r, n, bn, bounds)
        return start, stop + bn

    assert prove.prove_second(prove.QUICK_GRID, tiles_fn=short)["violations"] > 0
    assert prove.prove_second(prove.QUICK_GRID, tiles_fn=long)["loose"] > 0


def test_planted_segment_bug_is_caught():
    def segment(t_start, t_stop, first, count):
        a, b = window.segment_tiles(t_start, t_stop, first, count)
        return a, min(b + 1, count)

    assert prove.prove_segments(4, segment_fn=segment)["overlaps"] > 0
