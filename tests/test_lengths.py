"""Lengths nobody checked on the host (a one-shot call's device tensors): no read or write
out of bounds, no stale row, no finite garbage. Every output row is a computed attention
row or NaN. The well-formed sequences of each case are listed by hand here, not taken from
window.extend_seq_ok, so the tests check the kernels' guard against the contract."""

import pytest
import torch
from checks import assert_matches_reference
from conftest import DEVICE

import swattn
from swattn import plan_decode, plan_extend, window
from swattn import reference as ref

HQ, HKV, D, PAGE, PAGES = 4, 2, 16, 4, 24
TABLE_COLS = 4  # 16 keys a block-table row


def _on_device(call):
    """``call`` with its tensors on the suite's device (the cases are built on the host, so
    the same draws serve the interpreter and a GPU) and its results back on the host."""
    def moved(*args, **kwargs):
        def to(x):
            return x.to(DEVICE) if isinstance(x, torch.Tensor) else x
        result = call(*map(to, args), **{k: to(v) for k, v in kwargs.items()})
        return tuple(r.cpu() for r in result) if isinstance(result, tuple) else result.cpu()
    return moved


extend_attention = _on_device(swattn.extend_attention)
decode_attention = _on_device(swattn.decode_attention)


def _extend_inputs(num_tokens, num_seqs, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(num_tokens, HQ, D, generator=g, dtype=torch.float32)
    k = torch.randn(num_tokens, HKV, D, generator=g, dtype=torch.float32)
    v = torch.randn(num_tokens, HKV, D, generator=g, dtype=torch.float32)
    k_cache = torch.randn(PAGES, PAGE, HKV, D, generator=g, dtype=torch.float32)
    v_cache = torch.randn(PAGES, PAGE, HKV, D, generator=g, dtype=torch.float32)
    # Distinct pages a row, so a read of the next row's pages would change the result.
    table = torch.randperm(PAGES, generator=g)[:num_seqs * TABLE_COLS].view(num_seqs, TABLE_COLS)
    return q, k, v, k_cache, v_cache, table.to(torch.int32).contiguous()


# (name, cu_seqlens, prefix_lens, rows of q, the sequences that are well formed)
EXTEND_CASES = [
    ("rows past q", [0, 3, 9], [2, 5], 5, [0]),
    ("non-monotone", [0, 4, 3], [2, 5], 5, [0]),
    ("starts past 0", [1, 3, 5], [2, 5], 5, [0, 1]),
    ("total short of q", [0, 2, 3], [2, 5], 5, [0, 1]),
    ("negative entry", [0, -3, 5], [2, 5], 5, []),
    ("overlap after a bad one", [0, 5, 2, 5], [1, 1, 1], 5, [0]),
    ("negative prefix", [0, 2, 5], [-3, 5], 5, [1]),
    ("prefix past the table row", [0, 2, 5], [17, 5], 5, [1]),
    ("position past the limit", [0, 2, 5], [2 ** 31 - 2, 5], 5, [1]),
    ("empty sequence", [0, 0, 5], [3, 5], 5, [0, 1]),
]


def _want(q, k, v, k_cache, v_cache, table, cu, prefix, good, window_left, lse):
    """The reference of each well-formed sequence on its own; NaN everywhere else."""
    out = torch.full((q.shape[0], HQ, D), float("nan"), dtype=torch.float64)
    lse_want = torch.full((q.shape[0], HQ), float("nan"), dtype=torch.float64)
    for b in good:
        a, e = cu[b], cu[b + 1]
        if a == e:
            continue
        o, s = ref.extend_attention(q[a:e], k[a:e], v[a:e], k_cache, v_cache, table[b:b + 1],
                                    torch.tensor([0, e - a]), torch.tensor([prefix[b]]),
                                    window_left=window_left, return_lse=True)
        out[a:e], lse_want[a:e] = o, s
    return out, lse_want if lse else None


@pytest.mark.parametrize("deterministic", [False, True], ids=["two-stage", "single-pass"])
@pytest.mark.parametrize("name,cu,prefix,rows,good", EXTEND_CASES,
                         ids=[c[0] for c in EXTEND_CASES])
def test_extend_rows_are_computed_or_nan(name, cu, prefix, rows, good, deterministic):
    """A one-shot extend with lengths that are not well formed (segfaults and stale rows of
    `out` before: rows past q read and written, non-monotone or short cu_seqlens left rows
    holding what was there, negative lengths gave zeros, a prefix past the table row read
    the next row's pages): the well-formed sequences' rows equal the reference, every other
    row is NaN, a pre-filled `out` keeps nothing."""
    q, k, v, k_cache, v_cache, table = _extend_inputs(rows, len(prefix), seed=len(name))
    window_left = 5
    out = torch.full((rows, HQ, D), 7.0)
    got, got_lse = extend_attention(q, k, v, k_cache, v_cache, table,
                                    torch.tensor(cu, dtype=torch.int32),
                                    torch.tensor(prefix, dtype=torch.int32),
                                    window_left=window_left, deterministic=deterministic,
                                    return_lse=True, out=out)
    want, want_lse = _want(q, k, v, k_cache, v_cache, table, cu, prefix, good, window_left, True)
    nan_rows = torch.isnan(want[:, 0, 0])
    assert torch.isnan(got[nan_rows]).all() and torch.isnan(got_lse[nan_rows]).all()
    if (~nan_rows).any():
        assert_matches_reference((got[~nan_rows], got_lse[~nan_rows]),
                                 (want[~nan_rows], want_lse[~nan_rows]))


def test_uncovered_rows_follow_the_cases():
    """window.uncovered_rows (the host statement of the guard) leaves exactly the rows of
    the hand-listed well-formed sequences covered."""
    for name, cu, prefix, rows, good in EXTEND_CASES:
        covered = {t for b in good for t in range(cu[b], cu[b + 1])}
        want = [t for t in range(rows) if t not in covered]
        assert window.uncovered_rows(cu, prefix, rows, TABLE_COLS * PAGE) == want, name


def test_extend_mask_rows_outside_the_mask_are_nan():
    """A custom mask whose mask_indptr points past the mask (read out of bounds before):
    that sequence's rows are NaN, the other's computed."""
    q, k, v, k_cache, v_cache, table = _extend_inputs(5, 2, seed=3)
    cu, prefix = [0, 2, 5], [3, 2]
    sizes = [2 * (3 + 2), 3 * (2 + 3)]
    g = torch.Generator().manual_seed(4)
    mask = torch.rand(sum(sizes), generator=g) < 0.7
    indptr = torch.tensor([0, 10 ** 6, 10 ** 6 + sizes[1]], dtype=torch.int32)
    got = extend_attention(q, k, v, k_cache, v_cache, table, torch.tensor(cu, dtype=torch.int32),
                           torch.tensor(prefix, dtype=torch.int32), mask=mask,
                           mask_indptr=indptr)
    want = ref.extend_attention(q[:2], k[:2], v[:2], k_cache, v_cache, table[:1],
                                torch.tensor([0, 2]), torch.tensor([3]), mask=mask[:sizes[0]],
                                mask_indptr=torch.tensor([0, sizes[0]]))
    assert_matches_reference(got[:2], want)
    assert torch.isnan(got[2:]).all()


def test_huge_window_does_not_overflow():
    """window_left near 2**31 (a position minus it overflowed int32 in the bounds) equals
    full attention."""
    q, k, v, k_cache, v_cache, table = _extend_inputs(5, 2, seed=5)
    cu, prefix = torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([7, 9], dtype=torch.int32)
    got = extend_attention(q, k, v, k_cache, v_cache, table, cu, prefix,
                           window_left=2 ** 31 - 1)
    want = extend_attention(q, k, v, k_cache, v_cache, table, cu, prefix)
    assert torch.equal(got, want)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_rows_are_computed_or_nan(num_splits):
    """One-shot decode with lengths that are not well formed (a negative length gave zeros,
    2**31 - 1 overflowed into zeros, a length past the table row read the next row's
    pages): NaN rows; a length of 0 stays an empty attention (0); the rest computed."""
    g = torch.Generator().manual_seed(6)
    lens = [-2, 2 ** 31 - 1, 0, 11, TABLE_COLS * PAGE + 1, TABLE_COLS * PAGE]
    batch = len(lens)
    q = torch.randn(batch, HQ, D, generator=g)
    k_cache = torch.randn(PAGES, PAGE, HKV, D, generator=g)
    v_cache = torch.randn(PAGES, PAGE, HKV, D, generator=g)
    table = torch.randint(0, PAGES, (batch, TABLE_COLS), generator=g, dtype=torch.int32)
    got = decode_attention(q, k_cache, v_cache, table, torch.tensor(lens, dtype=torch.int32),
                           window_left=6, num_splits=num_splits)
    assert torch.isnan(got[[0, 1, 4]]).all()
    assert (got[2] == 0).all()
    good = [3, 5]
    want = ref.decode_attention(q[good], k_cache, v_cache, table[good],
                                torch.tensor([lens[b] for b in good]), window_left=6)
    assert_matches_reference(got[good], want)


def test_plans_refuse_positions_past_the_limit():
    """Plans check lengths on the host: a position past window.MAX_POSITION is a ValueError
    naming the argument (the kernels' int32 bounds would overflow)."""
    with pytest.raises(ValueError, match="prefix_lens"):
        plan_extend([0, 4], [window.MAX_POSITION - 2], num_q_heads=HQ, num_kv_heads=HKV,
                    head_dim=D, page_size=PAGE, dtype=torch.float32, device=DEVICE)
    with pytest.raises(ValueError, match="seq_lens"):
        plan_decode([window.MAX_POSITION + 1], num_q_heads=HQ, num_kv_heads=HKV, head_dim=D,
                    page_size=PAGE, dtype=torch.float32, device=DEVICE)
