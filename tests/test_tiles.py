"""The tile-count model (swattn.tiles): seed figures, shape of the result, multipliers,
workloads, full attention, decode, and agreement with the mask on small shapes."""

import numpy as np
import pytest

from swattn import tiles
from swattn.window import visible


def test_seed_gpt_oss_chunk_over_cached_prefix():
    """The seed's figure: gpt-oss (window 128, L = 127), BLOCK_M 128 / BLOCK_N 64, an
    8192-token chunk over a 128-token prefix walks 382 tiles per (seq, head) in SGLang's
    two-stage kernel (stage 1 unbounded, stage 2 bounded) and 256 once stage 1 is bounded."""
    counts = tiles.count_tiles(128, 8192, 127, block_m=128, block_n=64)
    assert counts["stage1"]["all"] + counts["stage2"]["tight"] == 382
    assert counts["stage1"]["tight"] + counts["stage2"]["tight"] == 256
    change = tiles.predicted_change(counts)
    assert change["two_stage"] == pytest.approx(256 / 382 - 1)
    assert change["unified"] == pytest.approx(
        counts["unified"]["tight"] / counts["unified"]["all"] - 1)


def test_hand_counted_stage2():
    """P = 0, E = 256, L = 63, BM = BN = 64, causal: block m0 walks keys [m0 - 64, m0 + 64)
    once m0 >= 64 (2 tiles) and [0, 64) for m0 = 0; the unbounded loop walks m0/64 + 1."""
    counts = tiles.count_tiles(0, 256, 63, block_m=64, block_n=64)
    assert counts == {"stage1": {"all": 0, "tight": 0},
                      "stage2": {"all": 1 + 2 + 3 + 4, "tight": 1 + 2 + 2 + 2},
                      "unified": {"all": 1 + 2 + 3 + 4, "tight": 1 + 2 + 2 + 2}}


def test_result_shape_is_exact():
    counts = tiles.count_tiles(65, 300, 31, block_m=32, block_n=16)
    assert list(counts) == ["stage1", "stage2", "unified"]
    for loop in counts:
        assert list(counts[loop]) == ["all", "tight"]
        assert all(type(n) is int for n in counts[loop].values())


@pytest.mark.parametrize("batch,heads", [(1, 1), (3, 1), (1, 8), (4, 16)],
                         ids=lambda v: str(v))
def test_batch_and_heads_multiply(batch, heads):
    one = tiles.count_tiles(129, 1000, 127, block_m=64, block_n=32)
    many = tiles.count_tiles(129, 1000, 127, block_m=64, block_n=32, batch=batch, heads=heads)
    for loop in one:
        for bounds in one[loop]:
            assert many[loop][bounds] == one[loop][bounds] * batch * heads


def test_workload_sums_its_sequences():
    shapes = [(0, 4096), (128, 4096), (17, 1), (4096, 300)]
    total = tiles.count_workload(shapes, 127, heads=2)
    for loop in total:
        for bounds in total[loop]:
            expected = sum(tiles.count_tiles(p, e, 127, heads=2)[loop][bounds] for p, e in shapes)
            assert total[loop][bounds] == expected


def test_parse_workload():
    assert tiles.parse_workload("0:4096, 128:4096,") == [(0, 4096), (128, 4096)]
    for bad in ("", "12", "1:2:3", "a:1", "-1:5"):
        with pytest.raises(ValueError, match="workload"):
            tiles.parse_workload(bad)


@pytest.mark.parametrize("causal,right", [(True, None), (False, None)],
                         ids=["causal", "non-causal"])
@pytest.mark.parametrize("prefix_len,extend_len", [(0, 1), (129, 63), (4096, 300)],
                         ids=lambda v: str(v))
def test_full_attention_tight_equals_all(causal, right, prefix_len, extend_len):
    counts = tiles.count_tiles(prefix_len, extend_len, None, right, causal, block_m=64, block_n=64)
    for loop in counts:
        assert counts[loop]["tight"] == counts[loop]["all"]
    assert tiles.predicted_change(counts) == {"two_stage": 0.0, "unified": 0.0}


def test_window_right_bounds_only_tight():
    """Non-causal with window_right: ``all`` walks to the range end, ``tight`` stops at
    the last row's p + R."""
    counts = tiles.count_tiles(0, 1024, None, 0, False, block_m=64, block_n=64)
    assert counts["stage2"]["all"] == 16 * 16
    assert counts["stage2"]["tight"] == sum(m // 64 + 1 for m in range(0, 1024, 64))


def test_empty_extend_has_no_change():
    counts = tiles.count_tiles(100, 0, 15)
    assert all(n == 0 for loop in counts.values() for n in loop.values())
    assert tiles.predicted_change(counts) == {"two_stage": None, "unified": None}


@pytest.mark.parametrize("window_left", [0, 1, 63, 127, 4095], ids=lambda v: f"L{v}")
@pytest.mark.parametrize("block_n", [16, 64], ids=lambda v: f"BN{v}")
def test_decode_reads_exactly_window(window_left, block_n):
    seq_len = window_left + 1 + 1000
    counts = tiles.count_decode([seq_len], window_left, block_n)
    lo = seq_len - 1 - window_left
    assert counts["keys"] == {"all": seq_len, "tight": window_left + 1, "aligned": window_left + 1}
    assert counts["tiles"] == {"all": -(-seq_len // block_n),
                               "tight": -(-(window_left + 1) // block_n),
                               "aligned": -(-seq_len // block_n) - lo // block_n}


def test_decode_short_sequence_and_multipliers():
    counts = tiles.count_decode([1, 50, 500], 127, 64, batch=2, heads=3)
    assert counts["keys"]["tight"] == (1 + 50 + 128) * 6
    assert counts["keys"]["all"] == (1 + 50 + 500) * 6
    assert tiles.count_decode([500], None)["keys"] == {"all": 500, "tight": 500, "aligned": 500}


@pytest.mark.parametrize("call", [
    lambda: tiles.count_tiles(-1, 5, 3),
    lambda: tiles.count_tiles(1, 5, 3, block_n=0),
    lambda: tiles.count_tiles(1, 5, -1),
    lambda: tiles.count_tiles(1, 5, 3, 2, True),
    lambda: tiles.count_decode([0], 3),
], ids=["negative-prefix", "zero-block-n", "negative-window", "right-with-causal", "empty-decode"])
def test_bad_arguments_raise(call):
    with pytest.raises((ValueError, TypeError)):
        call()


def _tiles_holding_visible(loop, prefix_len, extend_len, window_left, block_m, block_n):
    """Brute force: (query block, key tile) pairs of the unified or stage-2 loop that hold
    a visible element."""
    offset = prefix_len if loop == "unified" else 0
    range_end = extend_len + offset
    rows = offset + np.arange(extend_len)[:, None]
    keys = np.arange(range_end)[None, :]
    mask = np.broadcast_to(visible(rows, keys, window_left), (extend_len, range_end))
    return sum(bool(mask[m0:m0 + block_m, n:n + block_n].any())
               for m0 in range(0, extend_len, block_m) for n in range(0, range_end, block_n))


@pytest.mark.parametrize("loop", ["stage2", "unified"])
@pytest.mark.parametrize("prefix_len,extend_len,window_left,block_m,block_n", [
    (0, 65, 15, 16, 16), (17, 100, 31, 32, 16), (129, 77, 63, 16, 32), (5, 300, 0, 64, 64),
    (300, 40, 1000, 16, 64),
], ids=lambda v: str(v))
def test_tight_count_is_the_tiles_holding_a_visible_key(loop, prefix_len, extend_len, window_left,
                                                         block_m, block_n):
    """For the causal loops that start at a query's own coordinates, the tight model walks
    exactly the tiles that hold a visible key: none wasted, none missing."""
    counts = tiles.count_tiles(prefix_len, extend_len, window_left, block_m=block_m,
                               block_n=block_n)
    assert counts[loop]["tight"] == _tiles_holding_visible(loop, prefix_len, extend_len,
                                                           window_left, block_m, block_n)


def test_table_names_both_kernels():
    text = tiles.format_table(tiles.count_tiles(128, 8192, 127), "gpt-oss")
    assert text.splitlines()[0] == "gpt-oss"
    assert "382 -> 256 tiles, -33.0%" in text
    assert "unified kernel: 4,288 -> 256 tiles, -94.0%" in text


# --------------------------------------------------------------------------------------
# Chunked local attention (Llama 4's attention_chunk).
# --------------------------------------------------------------------------------------

# (prefix, extend, block_m, block_n): tiles below, equal to and above the chunks below.
CHUNK_SHAPES = [(0, 65, 16, 16), (17, 100, 32, 16), (129, 77, 16, 32), (100, 300, 64, 64),
                (1000, 40, 16, 64)]
# (window_left, window_right, causal)
CHUNK_WINDOWS = [(None, None, True), (15, None, True), (63, None, True), (None, None, False),
                 (31, 0, False), (None, 17, False)]
shape_id = "P{0}-E{1}-BM{2}-BN{3}".format


def _window_id(window):
    left, right, causal = window
    return f"L{left}-" + ("causal" if causal else f"R{right}")


@pytest.mark.parametrize("window", CHUNK_WINDOWS, ids=_window_id)
@pytest.mark.parametrize("shape", CHUNK_SHAPES, ids=lambda s: shape_id(*s))
def test_chunk_past_every_position_is_no_chunk(shape, window):
    """A chunk longer than every position of the sequence bounds nothing: the tight counts
    equal those without a chunk. So do the ``all`` ones where no window bounds a row (under
    a chunk ``all`` runs from 0 to the last key a row sees, as the tight end does, so a
    block whose window reaches no key of the range walks nothing)."""
    prefix_len, extend_len, block_m, block_n = shape
    left, right, causal = window
    plain = tiles.count_tiles(prefix_len, extend_len, left, right, causal, block_m, block_n)
    for chunk in (prefix_len + extend_len, 10 * (prefix_len + extend_len) + 7):
        chunked = tiles.count_tiles(prefix_len, extend_len, left, right, causal, block_m,
                                    block_n, chunk=chunk)
        for loop in chunked:
            assert chunked[loop]["tight"] == plain[loop]["tight"], (loop, chunk)
            if left is None and right is None:
                assert chunked[loop]["all"] == plain[loop]["all"], (loop, chunk)


@pytest.mark.parametrize("window", CHUNK_WINDOWS, ids=_window_id)
@pytest.mark.parametrize("shape", CHUNK_SHAPES, ids=lambda s: shape_id(*s))
@pytest.mark.parametrize("chunk", [1, 3, 16, 17, 64, 100], ids=lambda c: f"C{c}")
def test_chunk_and_window_hold_together(shape, window, chunk):
    """Both bounds hold: the tight tiles under a chunk and a window are at most those of
    either alone, and a window reaching back a whole chunk (L >= C - 1) adds nothing to the
    chunk, in every loop and bounds variant."""
    prefix_len, extend_len, block_m, block_n = shape
    left, right, causal = window

    def count(window_left, chunk):
        return tiles.count_tiles(prefix_len, extend_len, window_left, right, causal, block_m,
                                 block_n, chunk=chunk)

    both, window_only, chunk_only = count(left, chunk), count(left, None), count(None, chunk)
    for loop in both:
        assert both[loop]["tight"] <= min(window_only[loop]["tight"], chunk_only[loop]["tight"])
    assert count(chunk - 1, chunk) == chunk_only
    assert count(chunk + 40, chunk) == chunk_only


@pytest.mark.parametrize("shape", CHUNK_SHAPES, ids=lambda s: shape_id(*s))
def test_a_chunk_inside_another_walks_no_more(shape):
    """Chunks that divide a longer chunk split each of its chunks: never more tiles."""
    prefix_len, extend_len, block_m, block_n = shape
    for small, large in ((1, 3), (3, 48), (16, 64), (17, 51), (50, 100)):
        inner = tiles.count_tiles(prefix_len, extend_len, 63, None, True, block_m, block_n,
                                  chunk=small)
        outer = tiles.count_tiles(prefix_len, extend_len, 63, None, True, block_m, block_n,
                                  chunk=large)
        for loop in inner:
            assert inner[loop]["tight"] <= outer[loop]["tight"], (loop, small, large)


def _chunk_tiles_holding_visible(loop, prefix_len, extend_len, window, chunk, block_m, block_n):
    """Brute force at absolute positions: (query block, key tile) pairs of a loop that hold
    a visible element under the chunk (stage 1: keys [0, P); stage 2: keys [P, P + E), its
    tiles from P; unified: keys [0, P + E))."""
    left, right, causal = window
    origin, range_end = {"stage1": (0, prefix_len), "stage2": (prefix_len, extend_len),
                         "unified": (0, prefix_len + extend_len)}[loop]
    rows = prefix_len + np.arange(extend_len)[:, None]
    keys = origin + np.arange(range_end)[None, :]
    mask = np.broadcast_to(visible(rows, keys, left, right, causal, chunk),
                           (extend_len, range_end))
    return sum(bool(mask[m0:m0 + block_m, n:n + block_n].any())
               for m0 in range(0, extend_len, block_m) for n in range(0, range_end, block_n))


@pytest.mark.parametrize("window", CHUNK_WINDOWS, ids=_window_id)
@pytest.mark.parametrize("shape", CHUNK_SHAPES, ids=lambda s: shape_id(*s))
@pytest.mark.parametrize("chunk", [1, 16, 17, 100], ids=lambda c: f"C{c}")
def test_chunk_tight_count_is_the_tiles_holding_a_visible_key(shape, window, chunk):
    """Under a chunk every loop's tight bounds walk exactly the tiles that hold a visible
    key: a block straddling a chunk boundary walks both chunks' tiles and nothing else."""
    prefix_len, extend_len, block_m, block_n = shape
    left, right, causal = window
    counts = tiles.count_tiles(prefix_len, extend_len, left, right, causal, block_m, block_n,
                               chunk=chunk)
    for loop in counts:
        assert counts[loop]["tight"] == _chunk_tiles_holding_visible(
            loop, prefix_len, extend_len, window, chunk, block_m, block_n), loop


@pytest.mark.parametrize("window_left", [None, 0, 63, 127, 8191], ids=lambda v: f"L{v}")
@pytest.mark.parametrize("chunk", [1, 3, 64, 100, 8192], ids=lambda c: f"C{c}")
def test_decode_under_a_chunk_is_the_tighter_bound(window_left, chunk):
    """Decode reads, per sequence, the fewer keys (and tiles) of the window and the chunk
    (both end at the query), and a chunk past the query changes nothing."""
    seq_lens = [1, 63, 64, 65, 100, 101, 8191, 8192, 8193, 20000, 32768, 131072]
    for seq_len in seq_lens:
        both = tiles.count_decode([seq_len], window_left, 64, chunk=chunk)
        window_only = tiles.count_decode([seq_len], window_left, 64)
        chunk_only = tiles.count_decode([seq_len], None, 64, chunk=chunk)
        for what in ("keys", "tiles"):
            assert both[what]["tight"] == min(window_only[what]["tight"],
                                              chunk_only[what]["tight"]), (what, seq_len)
            assert both[what]["all"] == window_only[what]["all"]
        if chunk >= seq_len:
            assert both == window_only
    total = tiles.count_decode(seq_lens, window_left, 64, chunk=chunk, batch=2, heads=3)
    one_by_one = [tiles.count_decode([s], window_left, 64, chunk=chunk) for s in seq_lens]
    assert total["keys"]["tight"] == 6 * sum(c["keys"]["tight"] for c in one_by_one)


# Llama 4 Scout: 40 query heads, attention_chunk 8192; a 32k-token prefill in 8k steps,
# each over the cached prefix of the steps before, and decode at 32k and 128k context.
SCOUT_HEADS, SCOUT_CHUNK = 40, 8192
SCOUT_PREFILL = [(0, 8192), (8192, 8192), (16384, 8192), (24576, 8192)]
SCOUT_DECODE = [32768, 131072]


def test_llama4_scout_prefill_steps_on_chunk_boundaries():
    """Steps that start on chunk boundaries see none of their cached prefix: stage 1 walks
    nothing, and each step walks what a fresh 8k sequence walks; masking the chunk with
    causal bounds alone walks the whole prefix."""
    counts = tiles.count_workload(SCOUT_PREFILL, heads=SCOUT_HEADS, chunk=SCOUT_CHUNK)
    fresh = tiles.count_workload([(0, 8192)] * 4, heads=SCOUT_HEADS)
    masked = tiles.count_workload(SCOUT_PREFILL, heads=SCOUT_HEADS)
    assert counts["stage1"] == {"all": 0, "tight": 0}
    assert counts["unified"]["tight"] == counts["stage2"]["tight"] == fresh["unified"]["tight"]
    assert masked["unified"]["tight"] > 3 * counts["unified"]["tight"]
    text = tiles.format_table(counts, "L4", masked)
    expected = (f"chunk in the bounds vs masked only (unified, tight): "
                f"{masked['unified']['tight']:,} -> {counts['unified']['tight']:,} tiles")
    assert expected in text


def test_llama4_scout_prefill_off_chunk_boundaries():
    """A cached prefix off the chunk grid: stage 1 sees only the start of the rows' chunk,
    and the blocks straddling a chunk boundary cost tiles, never more than the window of
    a whole chunk would."""
    shifted = [(1000 + p, e) for p, e in SCOUT_PREFILL]
    counts = tiles.count_workload(shifted, heads=SCOUT_HEADS, chunk=SCOUT_CHUNK)
    aligned = tiles.count_workload(SCOUT_PREFILL, heads=SCOUT_HEADS, chunk=SCOUT_CHUNK)
    window = tiles.count_workload(shifted, SCOUT_CHUNK - 1, heads=SCOUT_HEADS)
    assert counts["stage1"]["tight"] > 0
    assert aligned["unified"]["tight"] < counts["unified"]["tight"] < window["unified"]["tight"]


def test_llama4_scout_decode_reads_one_chunk():
    """At 32k and 128k context the query is the last of a chunk: it reads that chunk, the
    keys and tiles of a window of the same keys (L = C - 1), whatever the context."""
    chunked = tiles.count_decode(SCOUT_DECODE, heads=SCOUT_HEADS, chunk=SCOUT_CHUNK)
    assert chunked == tiles.count_decode(SCOUT_DECODE, SCOUT_CHUNK - 1, heads=SCOUT_HEADS)
    assert chunked["keys"]["tight"] == len(SCOUT_DECODE) * SCOUT_HEADS * SCOUT_CHUNK
    assert chunked["keys"]["all"] == SCOUT_HEADS * sum(SCOUT_DECODE)


def test_bad_chunk_raises():
    with pytest.raises(ValueError, match="attention_chunk"):
        tiles.count_tiles(1, 5, chunk=0)
    with pytest.raises(TypeError, match="attention_chunk"):
        tiles.count_decode([5], chunk=2.0)
