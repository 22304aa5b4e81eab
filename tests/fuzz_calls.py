"""The property-based fuzz of the one-shot calls and the plans, run by test_fuzz.py in a
process of its own (a crash is then a failed test, not the end of the suite).

Each draw: random sizes, lengths (inconsistent ones too), page ids (bad ones too), windows,
chunks and dtypes. The call either raises ValueError/TypeError, or every output row is NaN or
equals the float64 reference of its sequence, where the sequences taken are the ones
this file calls well formed (written here from the contract, not taken from swattn) and
the reference reads a bad page's keys as NaN. Prints the draws and what they gave.

Usage: python fuzz_calls.py EXAMPLES SEED
"""

import os
import sys
from collections import Counter

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import swattn  # noqa: E402
from swattn import reference as ref  # noqa: E402

HKV, PAGE, PAGES = 1, 4, 6
LIMIT = 1 << 30  # positions stop below this (docs/api.md)
OUTCOMES = Counter()

lengths = st.one_of(st.integers(-3, 14), st.sampled_from([2 ** 31 - 1, LIMIT, -(2 ** 31)]))
page_ids = st.one_of(st.integers(-2, PAGES + 1), st.just(2 ** 31 - 1))
chunks = st.one_of(st.none(), st.integers(1, 9))


def _inputs(draw, rows, seqs, cols, dtype, group, dim):
    g = torch.Generator().manual_seed(draw(st.integers(0, 2 ** 16)))
    hq = HKV * group

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    q, k, v = rand(rows, hq, dim), rand(rows, HKV, dim), rand(rows, HKV, dim)
    k_cache, v_cache = rand(PAGES, PAGE, HKV, dim), rand(PAGES, PAGE, HKV, dim)
    table = torch.tensor([[draw(page_ids) for _ in range(cols)] for _ in range(seqs)],
                         dtype=torch.int32).view(seqs, cols)
    return q, k, v, k_cache, v_cache, table


def _reference_cache(table):
    """The block table the reference reads: every entry that is not a page of the cache
    pointed at page 0 (the rows that need one are expected NaN: :func:`_reads_bad`)."""
    return torch.where((table < 0) | (table >= PAGES), 0, table)


def _reads_bad(table_row, lo, hi):
    """Whether the cached keys ``[lo, hi)`` of a sequence need an entry of ``table_row``
    that is not a page of the cache (the kernels then give the row NaN)."""
    pages = table_row[lo // PAGE:(hi + PAGE - 1) // PAGE] if hi > lo else table_row[:0]
    return bool(((pages < 0) | (pages >= PAGES)).any())


def _check_rows(got, want):
    """Each row all NaN where the reference's is NaN (or None: not a sequence's row),
    else within tolerance of it."""
    for t in range(got.shape[0]):
        row = got[t].double()
        if want[t] is None or torch.isnan(want[t]).any():
            assert torch.isnan(row).all(), f"row {t} should be NaN, got {row.flatten()[:4]}"
        else:
            err = (row - want[t].double()).abs().max().item() / max(
                want[t].abs().max().item(), 1.0)
            assert err < 2e-2, f"row {t}: relative error {err}"


def _extend_good(cu, prefix, rows, cols):
    """The well-formed sequences: rows within q after every earlier entry of cu_seqlens,
    prefix within the table row, positions below the limit."""
    good, earlier = [], None
    for b, p in enumerate(prefix):
        start, end = cu[b], cu[b + 1]
        earlier = start if earlier is None else max(earlier, start)
        if (0 <= start and start >= earlier and start <= end <= rows and 0 <= p <= cols * PAGE
                and p + end - start <= LIMIT):
            good.append(b)
    return good


@st.composite
def extend_draws(draw):
    seqs = draw(st.integers(1, 3))
    rows = draw(st.integers(0, 9))
    cols = draw(st.integers(1, 4))
    dtype = draw(st.sampled_from([torch.float32, torch.float16]))
    cu = [draw(lengths) for _ in range(seqs + 1)]
    prefix = [draw(lengths) for _ in range(seqs)]
    window_left = draw(st.one_of(st.none(), st.integers(0, 9), st.just(2 ** 31 - 1)))
    chunk = draw(chunks)
    deterministic = draw(st.booleans())
    planned = draw(st.booleans())
    tensors = _inputs(draw, rows, seqs, cols, dtype, draw(st.sampled_from([1, 2])),
                      draw(st.sampled_from([16, 24])))
    return cu, prefix, rows, cols, window_left, chunk, deterministic, planned, tensors


@st.composite
def decode_draws(draw):
    batch = draw(st.integers(1, 4))
    cols = draw(st.integers(1, 4))
    dtype = draw(st.sampled_from([torch.float32, torch.float16]))
    lens = [draw(lengths) for _ in range(batch)]
    window_left = draw(st.one_of(st.none(), st.integers(0, 9)))
    chunk = draw(chunks)
    num_splits = draw(st.sampled_from([None, 1, 3]))
    planned = draw(st.booleans())
    q, _, _, k_cache, v_cache, table = _inputs(draw, batch, batch, cols, dtype,
                                               draw(st.sampled_from([1, 2])),
                                               draw(st.sampled_from([16, 24])))
    return lens, cols, window_left, chunk, num_splits, planned, q, k_cache, v_cache, table


def _run_extend(cu, prefix, rows, cols, window_left, chunk, deterministic, planned, tensors):
    q, k, v, k_cache, v_cache, table = tensors
    out = torch.full((rows, q.shape[1], v.shape[2]), 7.0, dtype=q.dtype)
    options = dict(window_left=window_left, attention_chunk=chunk, deterministic=deterministic)
    if planned:
        plan = swattn.plan_extend(cu, prefix, num_q_heads=q.shape[1], num_kv_heads=HKV,
                                  head_dim=q.shape[2], page_size=PAGE, dtype=q.dtype,
                                  device="cpu", **options)
        out.fill_(float("nan"))  # a plan leaves rows past its tokens alone
        return plan.run(q, k, v, k_cache, v_cache, table, out=out)
    return swattn.extend_attention(q, k, v, k_cache, v_cache, table,
                                   torch.tensor(cu, dtype=torch.int32),
                                   torch.tensor(prefix, dtype=torch.int32), out=out, **options)


def _first_key(pos, window_left, chunk):
    """The lowest key a query at ``pos`` sees (its window, its chunk)."""
    low = 0 if window_left is None else max(pos - window_left, 0)
    return low if chunk is None else max(low, pos // chunk * chunk)


def _want_extend(cu, prefix, rows, cols, window_left, chunk, tensors):
    q, k, v, k_cache, v_cache, table = tensors
    tab = _reference_cache(table)
    want = [None] * rows
    for b in _extend_good(cu, prefix, rows, cols):
        a, e, p = cu[b], cu[b + 1], prefix[b]
        if a < e:
            o = ref.extend_attention(q[a:e], k[a:e], v[a:e], k_cache, v_cache, tab[b:b + 1],
                                     torch.tensor([0, e - a]), torch.tensor([p]),
                                     window_left=window_left, attention_chunk=chunk)
            for i in range(e - a):
                lo = _first_key(p + i, window_left, chunk)
                want[a + i] = torch.full_like(o[i], float("nan")) \
                    if _reads_bad(table[b], lo, p) else o[i]
    return want


def _run_decode(lens, cols, window_left, chunk, num_splits, planned, q, k_cache, v_cache, table):
    if planned:
        plan = swattn.plan_decode(lens, num_q_heads=q.shape[1], num_kv_heads=HKV,
                                  head_dim=q.shape[2], page_size=PAGE, window_left=window_left,
                                  attention_chunk=chunk, num_splits=num_splits, dtype=q.dtype,
                                  device="cpu")
        return plan.run(q, k_cache, v_cache, table)
    return swattn.decode_attention(q, k_cache, v_cache, table,
                                   torch.tensor(lens, dtype=torch.int32),
                                   window_left=window_left, attention_chunk=chunk,
                                   num_splits=num_splits)


def _want_decode(lens, cols, window_left, chunk, q, k_cache, v_cache, table):
    tab = _reference_cache(table)
    want = [None] * len(lens)
    for b, s in enumerate(lens):
        if 0 <= s <= cols * PAGE:
            want[b] = ref.decode_attention(q[b:b + 1], k_cache, v_cache, tab[b:b + 1],
                                           torch.tensor([s]), window_left=window_left,
                                           attention_chunk=chunk)[0]
            lo = _first_key(max(s - 1, 0), window_left, chunk)
            if _reads_bad(table[b], lo, s):
                want[b] = torch.full_like(want[b], float("nan"))
    return want


def _outcome(kind, call):
    try:
        got = call()
    except (ValueError, TypeError):
        OUTCOMES[f"{kind} refused"] += 1
        return None
    OUTCOMES[f"{kind} ran"] += 1
    return got


def main(examples, base_seed):
    common = settings(max_examples=examples, deadline=None, database=None, derandomize=False,
                      suppress_health_check=list(HealthCheck), print_blob=True)

    @seed(base_seed)
    @common
    @given(extend_draws())
    def fuzz_extend(draw):
        cu, prefix, rows, cols, window_left, chunk, deterministic, planned, tensors = draw
        got = _outcome("extend", lambda: _run_extend(*draw))
        if got is not None:
            _check_rows(got, _want_extend(cu, prefix, rows, cols, window_left, chunk, tensors))

    @seed(base_seed + 1)
    @common
    @given(decode_draws())
    def fuzz_decode(draw):
        lens, cols, window_left, chunk, num_splits, planned, q, k_cache, v_cache, table = draw
        got = _outcome("decode", lambda: _run_decode(*draw))
        if got is not None:
            _check_rows(got, _want_decode(lens, cols, window_left, chunk, q, k_cache, v_cache,
                                          table))

    fuzz_extend()
    fuzz_decode()
    print("draws:", sum(OUTCOMES.values()), dict(sorted(OUTCOMES.items())))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
