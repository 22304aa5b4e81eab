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
    assert change["unified"] == pytest.approx(counts["unified"]["tight"] / counts["unified"]["all"] - 1)


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


@pytest.mark.parametrize("causal,right", [(True, None), (False, None)], ids=["causal", "non-causal"])
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
    assert counts["tiles"] == {"all": -(-seq_len // block_n), "tight": -(-(window_left + 1) // block_n),
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
    counts = tiles.count_tiles(prefix_len, extend_len, window_left, block_m=block_m, block_n=block_n)
    assert counts[loop]["tight"] == _tiles_holding_visible(loop, prefix_len, extend_len,
                                                           window_left, block_m, block_n)


def test_table_names_both_kernels():
    text = tiles.format_table(tiles.count_tiles(128, 8192, 127), "gpt-oss")
    assert text.splitlines()[0] == "gpt-oss"
    assert "382 -> 256 tiles, -33.0%" in text
    assert "unified kernel: 4,288 -> 256 tiles, -94.0%" in text
