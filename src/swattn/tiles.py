"""The tile-count model: how many key tiles each loop walks, before any GPU run.

For one sequence and one head, a query block of ``block_m`` new rows (first new token
``block_start = 0, BM, 2 BM, ... < extend_len``) walks
``num_tiles(*key_bounds(loop, P, E, block_start, BM, BN, window, bounds), BN)`` key
tiles; the model sums that over the blocks, for each loop (``stage1`` over the prefix,
``stage2`` over the new tokens, ``unified`` over both) and each bounds variant
(``all``: from the range start, causal end kept, SGLang's loops; ``tight``). The bounds
come from :mod:`swattn.window` and nowhere else.

The predicted change of a kernel is the ratio of tiles walked, minus one:
two-stage ``(stage1.tight + stage2.tight) / (stage1.all + stage2.tight) - 1`` (SGLang's
stage 2 is already bounded, its stage 1 is not), unified ``unified.tight / unified.all - 1``.

Chunked local attention (``chunk=C``, Llama 4): the bounds are the ones the kernels take
under a chunk, from their rows' ranges (``window.row_key_range`` through
``window.range_bounds``): ``tight`` walks only the tiles of the rows' chunks within their
windows, ``all`` from the range start to the last key a row sees. Beside them the model
counts the same shapes with the chunk left out of the bounds (a kernel that only masks
it), the cost of serving a chunked layer with the window's bounds alone.

A second key source (``swattn.SecondKeys``, DeepSeek-V4): :func:`count_second` walks one
row at a time, as its kernel does: the window's tiles in the cache, the new keys' (extend),
then the second source's (an index list whole, or the entries up to the row's limit).

Plain Python: no torch, no triton, no numpy.
"""

from __future__ import annotations

from .window import (
    Window,
    aligned_tiles,
    check_chunk,
    check_window,
    decode_bounds,
    key_bounds,
    num_tiles,
    second_limit,
    second_tiles,
)

EXTEND_LOOPS = ("stage1", "stage2", "unified")
TILE_BOUNDS = ("all", "tight")


def _empty_counts():
    return {loop: {bounds: 0 for bounds in TILE_BOUNDS} for loop in EXTEND_LOOPS}


def count_tiles(prefix_len, extend_len, window_left=None, window_right=None, causal=True,
                block_m=128, block_n=64, *, batch=1, heads=1, chunk=None):
    """Key tiles walked by every loop and bounds variant for one (prefix, extend) shape.

    Returns ``{"stage1": {"all": n, "tight": n}, "stage2": {...}, "unified": {...}}``:
    the sum over the query blocks of one sequence and one head, times ``batch * heads``
    (identical sequences, every head walking the same tiles). ``chunk``: chunked local
    attention (``attention_chunk``), on top of the window.
    """
    for name, value in (("prefix_len", prefix_len), ("extend_len", extend_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    for name, value in (("block_m", block_m), ("block_n", block_n), ("batch", batch),
                        ("heads", heads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    # Window() drops window_right when causal; a causal call that names one is an error.
    check_window(window_left, window_right, causal)
    check_chunk(chunk)
    window = Window(window_left, window_right, causal, chunk)
    counts = _empty_counts()
    for loop in EXTEND_LOOPS:
        for bounds in TILE_BOUNDS:
            total = 0
            for block_start in range(0, extend_len, block_m):
                lo, hi = key_bounds(loop, prefix_len, extend_len, block_start, block_m, block_n,
                                    window, bounds)
                total += num_tiles(lo, hi, block_n)
            counts[loop][bounds] = total * batch * heads
    return counts


def count_workload(shapes, window_left=None, window_right=None, causal=True, block_m=128,
                   block_n=64, *, batch=1, heads=1, chunk=None):
    """:func:`count_tiles` summed over a ragged batch of ``(prefix_len, extend_len)`` pairs
    (each pair one sequence), times ``batch * heads``."""
    counts = _empty_counts()
    for prefix_len, extend_len in shapes:
        one = count_tiles(prefix_len, extend_len, window_left, window_right, causal, block_m,
                          block_n, batch=batch, heads=heads, chunk=chunk)
        for loop in EXTEND_LOOPS:
            for bounds in TILE_BOUNDS:
                counts[loop][bounds] += one[loop][bounds]
    return counts


def count_decode(seq_lens, window_left=None, block_n=64, *, batch=1, heads=1, chunk=None):
    """Keys and tiles of ``block_n`` the decode loop reads, summed over ``seq_lens`` (one
    new token per sequence, at ``seq_len - 1``), times ``batch * heads``.

    Returns ``{"keys": {...}, "tiles": {...}}`` with ``all`` (the whole cache ``[0,
    seq_len)``), ``tight`` (``decode_bounds``: exactly ``min(window_left + 1, seq_len)``
    keys, and under a ``chunk`` only those of the query's chunk; the Triton kernel's tiles
    from the first of them) and ``aligned`` (the same keys in the Hopper path's tiles on
    the grid of 0, :func:`swattn.window.aligned_tiles`). Split-KV cuts these tiles into
    runs without adding any (``swattn prove``'s decode-splits loops).
    """
    if isinstance(block_n, bool) or not isinstance(block_n, int) or block_n < 1:
        raise ValueError(f"block_n must be an int >= 1, got {block_n!r}")
    check_window(window_left)
    check_chunk(chunk)
    kinds = ("all", "tight", "aligned")
    counts = {"keys": dict.fromkeys(kinds, 0), "tiles": dict.fromkeys(kinds, 0)}
    for seq_len in seq_lens:
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(f"seq_lens must hold ints >= 1, got {seq_len!r}")
        lo, hi = decode_bounds(seq_len, window_left, chunk)
        t_lo, t_end = aligned_tiles(lo, hi, block_n)
        for kind, keys, walked in (("all", seq_len, num_tiles(0, seq_len, block_n)),
                                   ("tight", hi - lo, num_tiles(lo, hi, block_n)),
                                   ("aligned", hi - lo, t_end - t_lo)):
            counts["keys"][kind] += keys * batch * heads
            counts["tiles"][kind] += walked * batch * heads
    return counts


def count_second(rows, window_left, rate, topk, block_n, *, heads=1):
    """Keys and tiles of ``block_n`` one program of the second-source kernel reads for each
    row, summed over ``rows`` (``(cached, pos, held)``: the keys in the cache, the query's
    position, the entries the sequence's second cache holds; a decode row is ``(S, S - 1,
    held)``), times ``heads`` (the programs a row: KV heads x head blocks).

    A row's tiles: its window ``[lo, pos]`` (:func:`swattn.window.decode_bounds`) in the
    cache below ``cached`` and in the new keys from it, each part tiled from its first key,
    then the second source's: ``topk`` slots of an index list (walked whole), else the
    entries up to :func:`swattn.window.second_limit` (``tight``) or every one held
    (``all``: the skip variant's, whose window also starts on lo's grid from 0). Returns
    ``{"keys": {"tight", "all"}, "tiles": {"tight", "all"}}``.
    """
    if isinstance(block_n, bool) or not isinstance(block_n, int) or block_n < 1:
        raise ValueError(f"block_n must be an int >= 1, got {block_n!r}")
    check_window(window_left)
    counts = {"keys": {"tight": 0, "all": 0}, "tiles": {"tight": 0, "all": 0}}
    for cached, pos, held in rows:
        lo, hi = decode_bounds(pos + 1, window_left)
        in_cache, new_lo = min(cached, hi), max(lo, cached)
        window = num_tiles(lo, in_cache, block_n) + num_tiles(new_lo, hi, block_n)
        below = -(-lo // block_n)  # the skip variant's tiles from 0 on lo's grid
        for bounds in ("tight", "all"):
            if topk:
                second = num_tiles(0, topk, block_n)
                entries = min(topk, held) if bounds == "all" else min(
                    topk, second_limit(pos, rate, held))
            else:
                _, stop = second_tiles(pos, rate, held, block_n,
                                       "tight" if bounds == "tight" else "skip")
                second = stop // block_n
                entries = second_limit(pos, rate, held) if bounds == "tight" else held
            keys = hi - lo + entries
            walked = window + second + (below if bounds == "all" else 0)
            counts["keys"][bounds] += keys * heads
            counts["tiles"][bounds] += walked * heads
    return counts


def _ratio(new, old):
    return None if old == 0 else new / old - 1.0


def predicted_change(counts):
    """Relative change in tiles walked, ``None`` where the baseline walks none:
    ``{"two_stage": x, "unified": y}`` (``-0.33`` is a third fewer tiles)."""
    stage1, stage2, unified = (counts[loop] for loop in EXTEND_LOOPS)
    return {
        "two_stage": _ratio(stage1["tight"] + stage2["tight"], stage1["all"] + stage2["tight"]),
        "unified": _ratio(unified["tight"], unified["all"]),
    }


def parse_workload(text):
    """``"P:E,P:E,..."`` to ``[(P, E), ...]``; raises ValueError naming the bad item."""
    shapes = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        parts = item.split(":")
        try:
            prefix_len, extend_len = (int(part) for part in parts)
        except ValueError:
            raise ValueError(f"workload items must be PREFIX:EXTEND with ints >= 0, "
                             f"got {item!r}") from None
        if prefix_len < 0 or extend_len < 0:
            raise ValueError(f"workload items must be PREFIX:EXTEND with ints >= 0, got {item!r}")
        shapes.append((prefix_len, extend_len))
    if not shapes:
        raise ValueError(f"workload must hold at least one PREFIX:EXTEND pair, got {text!r}")
    return shapes


def _percent(change):
    return "n/a" if change is None else f"{100.0 * change:+.1f}%"


def format_table(counts, title="", unchunked=None):
    """The readable report of :func:`count_tiles`: tiles per loop and the predicted
    change of the two-stage and unified kernels; with ``unchunked`` (the same shapes
    counted without the chunk), what the chunk's bounds save over masking it."""
    change = predicted_change(counts)
    lines = [title] if title else []
    lines.append(f"{'loop':<8} {'all':>14} {'tight':>14} {'change':>8}")
    for loop in EXTEND_LOOPS:
        row = counts[loop]
        lines.append(f"{loop:<8} {row['all']:>14,} {row['tight']:>14,} "
                     f"{_percent(_ratio(row['tight'], row['all'])):>8}")
    stage1, stage2, unified = (counts[loop] for loop in EXTEND_LOOPS)
    before = stage1["all"] + stage2["tight"]
    after = stage1["tight"] + stage2["tight"]
    lines.append(f"predicted change, two-stage kernel (stage 2 already bounded): "
                 f"{before:,} -> {after:,} tiles, {_percent(change['two_stage'])}")
    lines.append(f"predicted change, unified kernel: "
                 f"{unified['all']:,} -> {unified['tight']:,} tiles, {_percent(change['unified'])}")
    if unchunked is not None:
        masked = {
            "two-stage": (unchunked["stage1"]["tight"] + unchunked["stage2"]["tight"], after),
            "unified": (unchunked["unified"]["tight"], unified["tight"]),
        }
        for kernel, (old, new) in masked.items():
            lines.append(f"chunk in the bounds vs masked only ({kernel}, tight): {old:,} -> "
                         f"{new:,} tiles, {_percent(_ratio(new, old))}")
    return "\n".join(lines)


def format_decode_table(counts, title=""):
    """The readable report of :func:`count_decode`."""
    lines = [title] if title else []
    lines.append(f"{'decode':<8} {'all':>14} {'tight':>14} {'change':>8} {'aligned':>14} "
                 f"{'change':>8}")
    for what in ("keys", "tiles"):
        row = counts[what]
        lines.append(f"{what:<8} {row['all']:>14,} {row['tight']:>14,} "
                     f"{_percent(_ratio(row['tight'], row['all'])):>8} {row['aligned']:>14,} "
                     f"{_percent(_ratio(row['aligned'], row['all'])):>8}")
    return "\n".join(lines)
