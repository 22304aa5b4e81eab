"""The reference against things it shares no code with: a plain-Python loop, one-hot
counting in each system's own window terms, and algebraic identities (merge, decode as
extend, duplicated sparse keys)."""

import ast
import math
import sys

import pytest
import torch

from swattn import reference

# --------------------------------------------------------------------------------------
# Inputs: logical per-sequence keys, scattered into a shuffled paged cache.
# --------------------------------------------------------------------------------------

def build_cache(keys, values, lowest, page_size, gen):
    """Scatter each sequence's logical rows into shuffled physical pages.

    Pages wholly below ``lowest[b]`` get block-table entry -1 and are never allocated;
    rows below ``lowest[b]`` and past the end are NaN; one spare -1 column at the end.
    """
    pages_of = [math.ceil(len(k) / page_size) for k in keys]
    max_pages = max(pages_of) + 1
    total = sum(pages_of) + 2
    physical = torch.randperm(total, generator=gen).tolist()
    hkv, d, dv = keys[0].shape[1], keys[0].shape[2], values[0].shape[2]
    k_cache = torch.full((total, page_size, hkv, d), math.nan, dtype=torch.float64)
    v_cache = torch.full((total, page_size, hkv, dv), math.nan, dtype=torch.float64)
    block_table = torch.full((len(keys), max_pages), -1, dtype=torch.int32)
    for b, (seq_k, seq_v) in enumerate(zip(keys, values)):
        for page in range(pages_of[b]):
            if (page + 1) * page_size <= lowest[b]:
                continue
            block_table[b, page] = phys = physical.pop()
            for j in range(max(page * page_size, lowest[b]),
                           min((page + 1) * page_size, len(seq_k))):
                k_cache[phys, j % page_size] = seq_k[j]
                v_cache[phys, j % page_size] = seq_v[j]
    return k_cache, v_cache, block_table


def make_extend(seqs, *, hq=4, hkv=2, d=5, dv=3, page_size=16, window_left=None, seed=0):
    """Random extend inputs for ``seqs = [(prefix_len, new_len), ...]`` plus the logical
    keys/values of every position (prefix and new) for the brute force."""
    gen = torch.Generator().manual_seed(seed)
    total = sum(e for _, e in seqs)
    q = torch.randn(total, hq, d, generator=gen, dtype=torch.float64)
    full_k = [torch.randn(p + e, hkv, d, generator=gen, dtype=torch.float64) for p, e in seqs]
    full_v = [torch.randn(p + e, hkv, dv, generator=gen, dtype=torch.float64) for p, e in seqs]
    lowest = [0 if window_left is None else max(0, p - window_left) for p, _ in seqs]
    k_cache, v_cache, block_table = build_cache([fk[:p] for fk, (p, _) in zip(full_k, seqs)],
                                                [fv[:p] for fv, (p, _) in zip(full_v, seqs)],
                                                lowest, page_size, gen)
    k = torch.cat([fk[p:] for fk, (p, _) in zip(full_k, seqs)])
    v = torch.cat([fv[p:] for fv, (p, _) in zip(full_v, seqs)])
    cu = [0]
    for _, e in seqs:
        cu.append(cu[-1] + e)
    args = (q, k, v, k_cache, v_cache, block_table, torch.tensor(cu, dtype=torch.int32),
            torch.tensor([p for p, _ in seqs], dtype=torch.int32))
    return args, full_k, full_v


def make_decode(seq_lens, *, hq=4, hkv=2, d=5, dv=3, page_size=16, window_left=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(len(seq_lens), hq, d, generator=gen, dtype=torch.float64)
    full_k = [torch.randn(s, hkv, d, generator=gen, dtype=torch.float64) for s in seq_lens]
    full_v = [torch.randn(s, hkv, dv, generator=gen, dtype=torch.float64) for s in seq_lens]
    lowest = [0 if window_left is None else max(0, s - 1 - window_left) for s in seq_lens]
    k_cache, v_cache, block_table = build_cache(full_k, full_v, lowest, page_size, gen)
    args = (q, k_cache, v_cache, block_table, torch.tensor(seq_lens, dtype=torch.int32))
    return args, full_k, full_v


def random_sinks(hq, seed=1):
    return torch.randn(hq, generator=torch.Generator().manual_seed(seed)) * 2


# --------------------------------------------------------------------------------------
# Brute force: one query, one head at a time, with math.
# --------------------------------------------------------------------------------------

def brute_query(qv, keys, values, dv, scale, softcap, sink):
    """Softmax over plain lists; returns (out list, lse) with lse -inf and out 0 for no key."""
    scores = []
    for kv in keys:
        s = scale * sum(a * b for a, b in zip(qv, kv))
        if softcap > 0:
            s = softcap * math.tanh(s / softcap)
        scores.append(s)
    if not scores:
        return [0.0] * dv, -math.inf
    m = max(scores + ([sink] if sink is not None else []))
    weights = [math.exp(s - m) for s in scores]
    denominator = sum(weights) + (math.exp(sink - m) if sink is not None else 0.0)
    out = [sum(w * val[e] for w, val in zip(weights, values)) / denominator for e in range(dv)]
    return out, m + math.log(sum(weights))


def sees(p, j, window_left, window_right, causal, bit):
    """The convention of docs/api.md, written as plain comparisons."""
    if window_left is not None and j < p - window_left:
        return False
    if bit is None and causal and j > p:
        return False
    if bit is not None and not bit:
        return False
    if not causal and window_right is not None and j > p + window_right:
        return False
    return True


def brute_extend(args, full_k, full_v, *, window_left=None, window_right=None, causal=True,
                 sinks=None, softcap=0.0, scale=None, masks=None, keys="all"):
    q, _, _, _, _, _, cu, prefix_lens = args
    hq, d = q.shape[1], q.shape[2]
    hkv, dv = full_k[0].shape[1], full_v[0].shape[2]
    scale = d ** -0.5 if scale is None else scale
    out = torch.zeros(q.shape[0], hq, dv, dtype=torch.float64)
    lse = torch.zeros(q.shape[0], hq, dtype=torch.float64)
    for b, prefix in enumerate(prefix_lens.tolist()):
        for i in range(cu[b + 1] - cu[b]):
            t, p = int(cu[b]) + i, prefix + i
            for h in range(hq):
                kvh = h // (hq // hkv)
                chosen = [j for j in range(p + 1 if causal and masks is None else len(full_k[b]))
                          if (keys != "prefix" or j < prefix) and (keys != "new" or j >= prefix)
                          and sees(p, j, window_left, window_right, causal,
                                   None if masks is None else bool(masks[b][i][j]))]
                o, s = brute_query(q[t, h].tolist(), [full_k[b][j, kvh].tolist() for j in chosen],
                                   [full_v[b][j, kvh].tolist() for j in chosen], dv, scale, softcap,
                                   None if sinks is None else float(sinks[h]))
                out[t, h] = torch.tensor(o, dtype=torch.float64)
                lse[t, h] = s
    return out, lse


def flat_mask(masks):
    """Per-sequence [E, P+E] bool lists -> (flat mask, mask_indptr [B+1])."""
    flat = torch.cat([torch.tensor(m, dtype=torch.bool).reshape(-1) for m in masks])
    indptr = [0]
    for m in masks:
        indptr.append(indptr[-1] + sum(len(row) for row in m))
    return flat, torch.tensor(indptr, dtype=torch.int32)


SEQS = [(0, 7), (13, 1), (65, 5), (3, 13)]


def assert_same(actual, expected, atol=1e-12):
    assert not torch.isnan(actual).any()
    torch.testing.assert_close(actual.to(torch.float64), expected, rtol=0, atol=atol)


# --------------------------------------------------------------------------------------
# 1. Against the brute force.
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("page_size", [1, 16], ids=lambda p: f"page{p}")
@pytest.mark.parametrize("window", [
    dict(window_left=None), dict(window_left=0), dict(window_left=3), dict(window_left=13),
    dict(window_left=4, window_right=2, causal=False), dict(window_left=None, causal=False),
], ids=["full", "left0", "left3", "left13", "noncausal_left4_right2", "noncausal_full"])
@pytest.mark.parametrize("extras", [
    dict(), dict(sinks=True), dict(softcap=2.5, scale=0.9), dict(sinks=True, softcap=1.5),
], ids=["plain", "sinks", "softcap_scale", "sinks_softcap"])
def test_extend_matches_brute_force(page_size, window, extras):
    args, full_k, full_v = make_extend(SEQS, page_size=page_size, window_left=window["window_left"])
    kwargs = dict(window, **extras)
    if extras.get("sinks"):
        kwargs["sinks"] = random_sinks(args[0].shape[1])
    out, lse = reference.extend_attention(*args, return_lse=True, **kwargs)
    expected_out, expected_lse = brute_extend(args, full_k, full_v, **kwargs)
    assert out.dtype == torch.float64 and lse.dtype == torch.float32
    assert_same(out, expected_out)
    torch.testing.assert_close(lse.double(), expected_lse, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("heads", [(4, 4), (6, 2), (3, 1)], ids=["mha", "gqa3", "mqa"])
def test_extend_head_mapping_matches_brute_force(heads):
    hq, hkv = heads
    args, full_k, full_v = make_extend([(7, 7)], hq=hq, hkv=hkv, d=8, dv=13, window_left=5)
    out = reference.extend_attention(*args, window_left=5)
    assert_same(out, brute_extend(args, full_k, full_v, window_left=5)[0])


def test_decode_matches_brute_force():
    seq_lens = [1, 7, 13, 65]
    args, full_k, full_v = make_decode(seq_lens, window_left=6, page_size=16)
    sinks = random_sinks(4)
    out, lse = reference.decode_attention(*args, window_left=6, sinks=sinks, softcap=3.0,
                                          return_lse=True)
    q = args[0]
    for b, s in enumerate(seq_lens):
        for h in range(4):
            chosen = range(max(0, s - 7), s)
            o, ls = brute_query(q[b, h].tolist(), [full_k[b][j, h // 2].tolist() for j in chosen],
                                [full_v[b][j, h // 2].tolist() for j in chosen], 3, 5 ** -0.5, 3.0,
                                float(sinks[h]))
            assert_same(out[b, h], torch.tensor(o, dtype=torch.float64))
            assert abs(float(lse[b, h]) - ls) < 1e-5


# --------------------------------------------------------------------------------------
# 2. Window conventions in each system's own terms, by one-hot counting.
# --------------------------------------------------------------------------------------

# (convention, window_left in our terms, keys a query at p sees among 0..p)
CONVENTIONS = [
    ("hf_sliding_window_4", 4 - 1, lambda p: set(range(max(0, p - 4 + 1), p + 1))),
    ("flash_attn_window_size_3_0", 3, lambda p: set(range(max(0, p - 3), p + 1))),
    ("flashinfer_window_left_3", 3, lambda p: set(range(max(0, p - 3), p + 1))),
    ("sglang_sliding_window_size_5", 5, lambda p: set(range(max(0, p - 5), p + 1))),
    ("self_only_left0", 0, lambda p: {p}),
    ("full_causal_none", None, lambda p: set(range(p + 1))),
]


def one_hot_extend(prefix, new):
    """q = 0 and v_j = e_j: every visible key gets weight 1/n, so out > 0 marks the keys."""
    args, _, _ = make_extend([(prefix, new)], hq=2, hkv=1, d=3, dv=prefix + new, page_size=1)
    q, _, _, k_cache, v_cache, block_table, cu, prefix_lens = args
    eye = torch.eye(prefix + new, dtype=torch.float64)
    v_cache[block_table[0, :prefix].long(), 0, 0] = eye[:prefix]
    return (torch.zeros_like(q), args[1], eye[prefix:, None, :], k_cache, v_cache,
            block_table, cu, prefix_lens)


@pytest.mark.parametrize("convention,window_left,expected", CONVENTIONS,
                         ids=[c[0] for c in CONVENTIONS])
def test_window_keeps_keys_of_each_convention(convention, window_left, expected):
    prefix, new = 6, 7
    out = reference.extend_attention(*one_hot_extend(prefix, new), window_left=window_left)
    for i in range(new):
        p = prefix + i
        for h in range(2):
            seen = set(torch.nonzero(out[i, h] > 0).flatten().tolist())
            assert seen == expected(p), (convention, p)
            assert torch.allclose(out[i, h][list(seen)],
                                  torch.tensor(1.0 / len(seen), dtype=torch.float64))


@pytest.mark.parametrize("convention,window_left,expected", CONVENTIONS,
                         ids=[c[0] for c in CONVENTIONS])
@pytest.mark.parametrize("seq_len", [1, 4, 13])
def test_decode_window_keeps_keys_of_each_convention(convention, window_left, expected, seq_len):
    args, _, _ = make_decode([seq_len], hq=1, hkv=1, d=3, dv=seq_len, page_size=1)
    q, k_cache, v_cache, block_table, seq_lens = args
    v_cache[block_table[0, :seq_len].long(), 0, 0] = torch.eye(seq_len, dtype=torch.float64)
    out = reference.decode_attention(torch.zeros_like(q), k_cache, v_cache, block_table, seq_lens,
                                     window_left=window_left)
    assert set(torch.nonzero(out[0, 0] > 0).flatten().tolist()) == expected(seq_len - 1)


def test_causal_window_count_is_left_plus_one():
    out = reference.extend_attention(*one_hot_extend(20, 9), window_left=7)
    assert ((out > 0).sum(-1) == 8).all()


def test_noncausal_flash_attn_window_size_2_3():
    """FlashAttention window_size=(2, 3): keys p-2 .. p+3, clipped to the sequence."""
    prefix, new = 4, 9
    out = reference.extend_attention(*one_hot_extend(prefix, new), window_left=2, window_right=3,
                                     causal=False)
    for i in range(new):
        p = prefix + i
        want = set(range(max(0, p - 2), min(prefix + new, p + 4)))
        assert set(torch.nonzero(out[i, 0] > 0).flatten().tolist()) == want


# --------------------------------------------------------------------------------------
# 3. Partials merged with merge_states equal the whole.
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("window_left", [None, 2, 20], ids=lambda w: f"left{w}")
@pytest.mark.parametrize("use_sinks", [False, True], ids=["nosinks", "sinks"])
def test_prefix_and_new_partials_merge_to_all(window_left, use_sinks):
    args, _, _ = make_extend(SEQS, window_left=window_left, page_size=16)
    sinks = random_sinks(4) if use_sinks else None
    whole, whole_lse = reference.extend_attention(*args, window_left=window_left, sinks=sinks,
                                                  return_lse=True)
    parts = [reference.extend_attention(*args, window_left=window_left, keys=keys, return_lse=True)
             for keys in ("new", "prefix")]
    merged, merged_lse = reference.merge_states([o for o, _ in parts], [s for _, s in parts],
                                                sinks=sinks)
    # The partial lse is float32 (the contract), so the merge is exact to float32 only.
    assert_same(merged, whole, atol=1e-6)
    torch.testing.assert_close(merged_lse, whole_lse, rtol=1e-6, atol=1e-6)
    # The first sequence has no prefix: its prefix partial is empty.
    assert torch.isinf(parts[1][1][:7]).all() and (parts[1][0][:7] == 0).all()


def test_merge_states_formula_by_hand():
    """Two parts with lse log 1 and log 3 and a sink of log 4: weights 1/8 and 3/8."""
    a = torch.tensor([[[2.0, -2.0]]], dtype=torch.float64)
    b = torch.tensor([[[6.0, 10.0]]], dtype=torch.float64)
    lse_a, lse_b = torch.tensor([[0.0]]), torch.tensor([[math.log(3.0)]])
    out, lse = reference.merge_states([a, b], [lse_a, lse_b], sinks=torch.tensor([math.log(4.0)]))
    torch.testing.assert_close(out, (a * 1 + b * 3) / 8)
    torch.testing.assert_close(lse, torch.tensor([[math.log(4.0)]]))
    out, lse = reference.merge_states([a, b], [lse_a, lse_b])
    torch.testing.assert_close(out, (a * 1 + b * 3) / 4)


def test_merge_states_skips_empty_parts_even_with_nan():
    nan_part = torch.full((2, 1, 3), math.nan, dtype=torch.float16)
    good = torch.ones(2, 1, 3, dtype=torch.float16)
    inf = torch.full((2, 1), -math.inf)
    out, lse = reference.merge_states([nan_part, good], [inf, torch.zeros(2, 1)])
    assert out.dtype == torch.float16 and lse.dtype == torch.float32
    assert (out == 1).all() and (lse == 0).all()
    out, lse = reference.merge_states([nan_part, nan_part], [inf, inf], sinks=torch.tensor([0.5]))
    assert (out == 0).all() and torch.isneginf(lse).all()


# --------------------------------------------------------------------------------------
# 4. Unread block-table entries and NaN rows.
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("page_size", [1, 16], ids=lambda p: f"page{p}")
def test_poisoned_cache_is_never_read(page_size):
    """build_cache puts -1 below the window, NaN in rows below it and past the end."""
    args, full_k, full_v = make_extend([(65, 5), (40, 1), (17, 13)], page_size=page_size,
                                       window_left=9)
    assert (args[5] == -1).any() and torch.isnan(args[3]).any()
    out, lse = reference.extend_attention(*args, window_left=9, sinks=random_sinks(4),
                                          return_lse=True)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    assert_same(out, brute_extend(args, full_k, full_v, window_left=9, sinks=random_sinks(4))[0])

    dargs, _, _ = make_decode([65, 40, 17, 1], page_size=page_size, window_left=9)
    assert (dargs[3] == -1).any()
    out, lse = reference.decode_attention(*dargs, window_left=9, return_lse=True)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()


def test_poisoned_cache_with_custom_mask():
    args, full_k, full_v = make_extend([(30, 4)], page_size=16, window_left=5)
    masks = [[[(i + j) % 3 != 0 for j in range(34)] for i in range(4)]]
    mask, indptr = flat_mask(masks)
    out = reference.extend_attention(*args, window_left=5, mask=mask, mask_indptr=indptr)
    assert_same(out, brute_extend(args, full_k, full_v, window_left=5, masks=masks)[0])


def test_nan_row_that_the_mask_hides_from_every_query():
    """A gathered key that no query sees must not reach the output through 0 * NaN."""
    args, full_k, full_v = make_extend([(9, 3)], page_size=4)
    masks = [[[j != 5 for j in range(12)] for _ in range(3)]]
    clean = reference.extend_attention(*args, causal=False, mask=flat_mask(masks)[0],
                                       mask_indptr=flat_mask(masks)[1])
    k_cache, v_cache, block_table = args[3], args[4], args[5]
    k_cache[block_table[0, 1], 1] = math.nan
    v_cache[block_table[0, 1], 1] = math.nan
    got = reference.extend_attention(*args, causal=False, mask=flat_mask(masks)[0],
                                     mask_indptr=flat_mask(masks)[1])
    assert_same(got, clean)
    assert_same(got, brute_extend(args, full_k, full_v, causal=False, masks=masks)[0])


def test_negative_page_id_for_visible_key_raises():
    """Regression: a -1 entry would wrap to the last page and be read silently."""
    args, _, _ = make_extend([(20, 3)], page_size=4, window_left=3)
    with pytest.raises(ValueError, match="negative page id"):
        reference.extend_attention(*args, window_left=None)


# --------------------------------------------------------------------------------------
# 5. Custom masks.
# --------------------------------------------------------------------------------------

SEQS_MASK = [(5, 7), (0, 1), (13, 3)]


def triangular_masks():
    return [[[j <= p + i for j in range(p + e)] for i in range(e)] for p, e in SEQS_MASK]


def test_all_true_mask_is_non_causal():
    args, _, _ = make_extend(SEQS_MASK)
    mask, indptr = flat_mask([[[True] * (p + e)] * e for p, e in SEQS_MASK])
    plain = reference.extend_attention(*args, causal=False)
    assert_same(reference.extend_attention(*args, causal=False, mask=mask, mask_indptr=indptr),
                plain)
    assert not torch.allclose(plain, reference.extend_attention(*args))


@pytest.mark.parametrize("causal", [True, False], ids=["causal_arg", "noncausal_arg"])
@pytest.mark.parametrize("window_left", [None, 0, 4], ids=lambda w: f"left{w}")
def test_lower_triangular_mask_is_causal(causal, window_left):
    args, _, _ = make_extend(SEQS_MASK)
    mask, indptr = flat_mask(triangular_masks())
    got = reference.extend_attention(*args, causal=causal, window_left=window_left, mask=mask,
                                     mask_indptr=indptr)
    assert_same(got, reference.extend_attention(*args, window_left=window_left))


def test_mask_replaces_causality_and_window_right_only_when_noncausal():
    args, full_k, full_v = make_extend(SEQS_MASK)
    gen = torch.Generator().manual_seed(3)
    masks = [(torch.rand(e, p + e, generator=gen) < 0.6).tolist() for p, e in SEQS_MASK]
    mask, indptr = flat_mask(masks)
    for causal, right in [(True, None), (True, 1), (False, 1)]:
        got = reference.extend_attention(*args, window_left=3, window_right=right, causal=causal,
                                         mask=mask, mask_indptr=indptr)
        want = brute_extend(args, full_k, full_v, window_left=3, window_right=right, causal=causal,
                            masks=masks)[0]
        assert_same(got, want)


# --------------------------------------------------------------------------------------
# 6. Decode as extend; sparse keys.
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("window_left", [None, 0, 6], ids=lambda w: f"left{w}")
def test_decode_equals_extend_of_last_token(window_left):
    seq_lens = [1, 7, 13, 65]
    dargs, full_k, full_v = make_decode(seq_lens, window_left=window_left)
    q, k_cache, v_cache, block_table, lens = dargs
    sinks = random_sinks(4)
    got, got_lse = reference.decode_attention(*dargs, window_left=window_left, sinks=sinks,
                                              return_lse=True)
    k = torch.stack([fk[-1] for fk in full_k])
    v = torch.stack([fv[-1] for fv in full_v])
    want, want_lse = reference.extend_attention(
        q, k, v, k_cache, v_cache, block_table, torch.arange(len(seq_lens) + 1, dtype=torch.int32),
        lens - 1, window_left=window_left, sinks=sinks, return_lse=True)
    assert_same(got, want)
    assert torch.equal(got_lse, want_lse)


def test_sparse_all_none_equals_no_sparse():
    dargs, _, _ = make_decode([7, 13], window_left=4)
    pool_k = torch.randn(9, 2, 5, dtype=torch.float64)
    pool_v = torch.randn(9, 2, 3, dtype=torch.float64)
    idx = torch.full((2, 5), -1, dtype=torch.int32)
    got = reference.decode_attention(*dargs, window_left=4, sparse=(pool_k, pool_v, idx))
    assert torch.equal(got, reference.decode_attention(*dargs, window_left=4))


def test_sparse_copy_of_window_counts_twice():
    """Every window key also given as a sparse key: weights double, so without sinks the
    output is unchanged and lse grows by log 2; with a sink, out = 2Z / (2Z + e^sink)."""
    seq_lens, window_left = [7, 13], 4
    dargs, full_k, full_v = make_decode(seq_lens, window_left=window_left)
    pool_k = torch.cat([fk[-5:] for fk in full_k])
    pool_v = torch.cat([fv[-5:] for fv in full_v])
    idx = torch.tensor([[0, 1, 2, 3, 4, -1], [-1, 5, 6, 7, 8, 9]], dtype=torch.int32)
    sparse = (pool_k, pool_v, idx)
    base, base_lse = reference.decode_attention(*dargs, window_left=window_left, return_lse=True)
    twice, twice_lse = reference.decode_attention(*dargs, window_left=window_left, sparse=sparse,
                                                  return_lse=True)
    assert_same(twice, base)
    torch.testing.assert_close(twice_lse, base_lse + math.log(2.0))
    sinks = random_sinks(4)
    with_sink = reference.decode_attention(*dargs, window_left=window_left, sparse=sparse,
                                           sinks=sinks)
    z = torch.exp(base_lse.double())
    # z comes from the float32 lse, hence the float32-level tolerance.
    assert_same(with_sink, base * (2 * z / (2 * z + torch.exp(sinks.double())))[..., None],
                atol=1e-6)


def test_sparse_matches_brute_force():
    dargs, full_k, full_v = make_decode([13, 1], window_left=3, page_size=1)
    gen = torch.Generator().manual_seed(5)
    pool_k = torch.randn(11, 2, 5, generator=gen, dtype=torch.float64)
    pool_v = torch.randn(11, 2, 3, generator=gen, dtype=torch.float64)
    idx = torch.tensor([[10, -1, 0, 0], [3, 7, -1, -1]], dtype=torch.int32)
    sinks = random_sinks(4)
    out = reference.decode_attention(*dargs, window_left=3, sinks=sinks, softcap=2.0,
                                     sparse=(pool_k, pool_v, idx))
    for b, s in enumerate([13, 1]):
        for h in range(4):
            keys = [full_k[b][j, h // 2] for j in range(max(0, s - 4), s)]
            vals = [full_v[b][j, h // 2] for j in range(max(0, s - 4), s)]
            keys += [pool_k[i, h // 2] for i in idx[b].tolist() if i >= 0]
            vals += [pool_v[i, h // 2] for i in idx[b].tolist() if i >= 0]
            o, _ = brute_query(dargs[0][b, h].tolist(), [x.tolist() for x in keys],
                               [x.tolist() for x in vals], 3, 5 ** -0.5, 2.0, float(sinks[h]))
            assert_same(out[b, h], torch.tensor(o, dtype=torch.float64))


# --------------------------------------------------------------------------------------
# 7. No visible key; dtypes and out.
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("use_sinks", [False, True], ids=["nosinks", "sinks"])
def test_no_visible_key_gives_zero_and_neg_inf(use_sinks):
    sinks = random_sinks(4) if use_sinks else None
    args, _, _ = make_extend([(0, 3), (5, 2)])
    out, lse = reference.extend_attention(*args, keys="prefix", window_left=0, sinks=sinks,
                                          return_lse=True)
    assert (out == 0).all() and torch.isneginf(lse).all()

    mask, indptr = flat_mask([[[False] * 3] * 3, [[True] * 7, [False] * 7]])
    out, lse = reference.extend_attention(*args, mask=mask, mask_indptr=indptr, sinks=sinks,
                                          return_lse=True)
    assert (out[[0, 1, 2, 4]] == 0).all() and torch.isneginf(lse[[0, 1, 2, 4]]).all()
    assert torch.isfinite(lse[3]).all() and (out[3] != 0).any()

    dargs, _, _ = make_decode([0, 3])
    out, lse = reference.decode_attention(*dargs, sinks=sinks, return_lse=True)
    assert (out[0] == 0).all() and torch.isneginf(lse[0]).all() and torch.isfinite(lse[1]).all()


def test_output_dtype_out_argument_and_float32_compute():
    args, _, _ = make_extend(SEQS, window_left=5)
    half = (args[0].half(), args[1].half(), args[2].half()) + args[3:]
    got = reference.extend_attention(*half, window_left=5)
    assert got.dtype == torch.float16
    buffer = torch.full_like(got, math.nan)
    returned = reference.extend_attention(*half, window_left=5, out=buffer)
    assert returned is buffer and torch.equal(buffer, got)
    fp64 = reference.extend_attention(*args, window_left=5)
    fp32 = reference.extend_attention(*args, window_left=5, dtype=torch.float32)
    assert_same(fp32, fp64, atol=1e-5)


def test_query_chunking_does_not_change_result(monkeypatch):
    args, _, _ = make_extend([(13, 65)], window_left=7)
    whole = reference.extend_attention(*args, window_left=7, sinks=random_sinks(4))
    monkeypatch.setattr(reference, "_SCORE_BUDGET", 1)
    chunked = reference.extend_attention(*args, window_left=7, sinks=random_sinks(4))
    # One query row per chunk changes only the BLAS blocking, not the math.
    assert_same(chunked, whole, atol=1e-13)


# --------------------------------------------------------------------------------------
# 8. Independence.
# --------------------------------------------------------------------------------------

def test_reference_imports_only_torch_and_stdlib():
    tree = ast.parse(open(reference.__file__).read())
    imported = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import in reference.py"
            imported.append(node.module)
    assert imported, "found no imports at all: the walk is broken"
    allowed = set(sys.stdlib_module_names) | {"torch"}
    for name in imported:
        assert "swattn" not in name
        assert name.split(".")[0] in allowed, name
