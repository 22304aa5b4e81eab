"""The window conversions of swattn.window, each against the predicate its convention
states in its own terms (written here, not taken from window.py), and their round trips."""

import pytest

from swattn import window

POSITIONS = range(12)


def _keys(p, window_left, window_right=None, causal=True):
    return {j for j in POSITIONS if window.visible(p, j, window_left, window_right, causal)}


@pytest.mark.parametrize("sliding_window", [1, 2, 5, None])
def test_hf_keeps_w_keys_the_querys_own_included(sliding_window):
    left = window.from_hf(sliding_window)
    for p in POSITIONS:
        # transformers' sliding mask: key j kept iff j <= p and p - j < W
        want = {j for j in POSITIONS
                if j <= p and (sliding_window is None or p - j < sliding_window)}
        assert _keys(p, left) == want
    assert window.to_hf(left) == sliding_window


@pytest.mark.parametrize("size", [(3, 0), (3, 2), (-1, 0), (-1, -1), (0, 4)])
def test_flash_attn_window_size(size):
    left, right = window.from_flash_attn(size)
    causal = size[1] == 0
    for p in POSITIONS:
        # FlashAttention: key j kept iff p - left <= j <= p + right, -1 unbounded
        want = {j for j in POSITIONS if (size[0] < 0 or p - size[0] <= j)
                and (size[1] < 0 or j <= p + size[1])}
        assert _keys(p, left, None if causal else right, causal) == want
    assert window.to_flash_attn(left, None if causal else right, causal) == size


@pytest.mark.parametrize("value", [4, 0, -1])
def test_flashinfer_window_left(value):
    left = window.from_flashinfer(value)
    for p in POSITIONS:
        # FlashInfer: key j kept iff j <= p and (window_left < 0 or p - j <= window_left)
        want = {j for j in POSITIONS if j <= p and (value < 0 or p - j <= value)}
        assert _keys(p, left) == want
    assert window.to_flashinfer(left) == value


@pytest.mark.parametrize("size", [4, 1, 0, -1])
def test_sglang_sliding_window_size(size):
    left = window.from_sglang(size)
    for p in POSITIONS:
        # SGLang's kernels: a window only when the size is above 0, then key j kept iff
        # j <= p and p <= j + size
        want = {j for j in POSITIONS if j <= p and (size <= 0 or p <= j + size)}
        assert _keys(p, left) == want
    assert window.to_sglang(left) == (size if size > 0 else -1)


def test_conversions_refuse_what_their_convention_cannot_say():
    with pytest.raises(ValueError, match="window_left 0 has no SGLang"):
        window.to_sglang(0)
    for bad in (0, -3, 2.0, True):
        with pytest.raises(ValueError, match="sliding_window"):
            window.from_hf(bad)
    for convert in (window.to_hf, window.to_flashinfer, window.to_sglang):
        with pytest.raises(ValueError, match="window_left must be >= 0"):
            convert(-1)
    with pytest.raises(ValueError, match="window_right applies only"):
        window.to_flash_attn(3, 2, causal=True)


@pytest.mark.parametrize("chunk", [1, 3, 4, 7, 64], ids=lambda c: f"C{c}")
@pytest.mark.parametrize("window_left", [None, 0, 2, 5], ids=lambda w: f"L{w}")
def test_decode_bounds_under_a_chunk_read_the_querys_chunk(chunk, window_left):
    """Chunked decode reads exactly the keys the query at ``seq_len - 1`` sees: those of its
    own chunk (Llama 4's ``j // C == p // C``) within its window, written here as the
    convention states it."""
    for seq_len in range(1, 30):
        query = seq_len - 1
        keys = {j for j in range(seq_len) if j // chunk == query // chunk
                and (window_left is None or j >= query - window_left)}
        lo, hi = window.decode_bounds(seq_len, window_left, chunk)
        assert set(range(lo, hi)) == keys, seq_len
        for num_splits in (1, 3):
            read = set()
            for i_split in range(num_splits):
                start, stop = window.decode_split_bounds(seq_len, window_left, 4, num_splits,
                                                         i_split, chunk=chunk)
                read |= set(range(start, stop))
            assert keys <= read, seq_len
            assert read == set(range(lo, lo + len(read))), seq_len
    assert window.decode_bounds(0, None, chunk) == (0, 0)
