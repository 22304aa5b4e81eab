"""A second key source beside the window (swattn.SecondKeys: DeepSeek-V3.2's and V4's
compressed or selected keys): decode and extend rows against the float64 reference, index
lists and the causal limit at a compression rate, the window off, K = V, fp8, the bounds
variants bit-identical and the splits, entries nobody wrote never read, bad pages, indices
and lengths NaN, plans with replan and a CUDA graph, and the errors that name the argument."""

import pytest
import torch
from checks import (
    assert_bounds_identical,
    assert_matches_reference,
    replay_after,
    runs_without_sync,
)
from conftest import DEVICE

import swattn
from swattn import reference


def _source(seqs, *, rate, entries, page_size, num_kv_heads, head_dim, dtype, indices=None,
            values=False, window=True, spare=3, generator):
    """A second paged cache whose entries past each sequence's count hold NaN, its block
    table (the columns past what the counts need -1), the counts."""
    pages_each = max(-(-max(entries) // page_size), 1) + 1
    num_pages = seqs * pages_each + spare
    cache = torch.randn(num_pages, page_size, num_kv_heads, head_dim, generator=generator)
    table = torch.randperm(num_pages, generator=generator)[:seqs * pages_each]
    table = table.reshape(seqs, pages_each).to(torch.int32)
    for b, held in enumerate(entries):
        for e in range(held, pages_each * page_size):
            cache[table[b, e // page_size], e % page_size] = float("nan")
        table[b, -(-held // page_size):] = -1
    value_cache = None
    if values:
        value_cache = torch.randn(num_pages, page_size, num_kv_heads, head_dim,
                                  generator=generator).to(dtype).to(DEVICE)
    return swattn.SecondKeys(cache.to(dtype).to(DEVICE), table.to(DEVICE),
                             torch.tensor(entries, dtype=torch.int32, device=DEVICE), rate=rate,
                             indices=None if indices is None else indices.to(DEVICE),
                             values=value_cache, window=window)


def _main_cache(lens, *, page_size, num_kv_heads, head_dim, dtype, window_left, generator):
    """A paged cache of ``lens`` tokens, the pages wholly below each window -1 in the table
    and NaN in the cache, as an engine that freed them leaves them."""
    pages_each = -(-max(lens) // page_size) + 1
    num_pages = len(lens) * pages_each + 2
    cache = torch.randn(num_pages, page_size, num_kv_heads, head_dim, generator=generator)
    table = torch.randperm(num_pages, generator=generator)[:len(lens) * pages_each]
    table = table.reshape(len(lens), pages_each).to(torch.int32)
    for b, n in enumerate(lens):
        first = 0 if window_left is None else max(n - 1 - window_left - 8, 0)
        for page in range(first // page_size):
            cache[table[b, page]] = float("nan")
            table[b, page] = -1
    return cache.to(dtype).to(DEVICE), table.to(DEVICE)


def _indices(rows, k, limit, generator):
    """Index lists of ``rows`` rows: -1s, entries below ``limit`` and some past it."""
    return torch.randint(-1, limit + 3, (rows, k), generator=generator, dtype=torch.int32)


def _decode_case(*, indexed, window=True, values=False, rate=4, heads=(8, 1), head_dim=64,
                 dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    lens = [1, 13, 40, 71]
    hq, hkv = heads
    k_cache, table = _main_cache(lens, page_size=8, num_kv_heads=hkv, head_dim=head_dim,
                                 dtype=dtype, window_left=9, generator=g)
    entries = [n // rate for n in lens]
    indices = _indices(len(lens), 6, max(entries), g) if indexed else None
    second = _source(len(lens), rate=rate, entries=entries, page_size=4, num_kv_heads=hkv,
                     head_dim=head_dim, dtype=dtype, indices=indices, values=values,
                     window=window, generator=g)
    q = torch.randn(len(lens), hq, head_dim, generator=g).to(dtype).to(DEVICE)
    sinks = torch.randn(hq, generator=g).to(DEVICE)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    return q, k_cache, table, seq_lens, second, sinks


@pytest.mark.parametrize("indexed", [True, False])
@pytest.mark.parametrize("window", [True, False])
def test_decode_matches_reference(indexed, window):
    """K = V (the cache is both), a window of 10 keys, sinks: every row against the
    reference, whose rows nobody wrote are NaN (so a read of one shows)."""
    q, k_cache, table, seq_lens, second, sinks = _decode_case(indexed=indexed, window=window)
    got = swattn.decode_attention(q, k_cache, k_cache, table, seq_lens, window_left=9,
                                  sinks=sinks, second=second, return_lse=True)
    want = reference.decode_attention(q, k_cache, k_cache, table, seq_lens, window_left=9,
                                      sinks=sinks, second=second, return_lse=True)
    assert_matches_reference(got, want)


def test_decode_values_of_their_own_and_gqa():
    """Values in a cache of their own (not the keys), two KV heads of four query heads."""
    q, k_cache, table, seq_lens, second, sinks = _decode_case(indexed=True, values=True,
                                                              heads=(4, 2), head_dim=48)
    v_cache = torch.randn_like(k_cache)
    got = swattn.decode_attention(q, k_cache, v_cache, table, seq_lens, window_left=9,
                                  sinks=sinks, second=second)
    want = reference.decode_attention(q, k_cache, v_cache, table, seq_lens, window_left=9,
                                      sinks=sinks, second=second)
    assert_matches_reference(got, want)


def _extend_case(*, indexed, window=True, rate=3, dtype=torch.float16, seed=1, hq=4,
                 head_dim=32):
    g = torch.Generator().manual_seed(seed)
    prefix, new = [0, 9, 30], [5, 1, 7]
    lens = [p + n for p, n in zip(prefix, new)]
    k_cache, table = _main_cache(lens, page_size=4, num_kv_heads=1, head_dim=head_dim,
                                 dtype=dtype, window_left=6, generator=g)
    cu = [0]
    for n in new:
        cu.append(cu[-1] + n)
    rows = cu[-1]
    entries = [n // rate for n in lens]
    indices = _indices(rows, 5, max(entries), g) if indexed else None
    second = _source(len(lens), rate=rate, entries=entries, page_size=2, num_kv_heads=1,
                     head_dim=head_dim, dtype=dtype, indices=indices, window=window,
                     generator=g)
    q = torch.randn(rows, hq, head_dim, generator=g).to(dtype).to(DEVICE)
    k = torch.randn(rows, 1, head_dim, generator=g).to(dtype).to(DEVICE)
    sinks = torch.randn(hq, generator=g).to(DEVICE)
    lengths = (torch.tensor(cu, dtype=torch.int32, device=DEVICE),
               torch.tensor(prefix, dtype=torch.int32, device=DEVICE))
    return q, k, k_cache, table, lengths, second, sinks


@pytest.mark.parametrize("indexed", [True, False])
@pytest.mark.parametrize("window", [True, False])
def test_extend_matches_reference(indexed, window):
    """Each new token a row: its window over the prefix and the new keys before it, and
    its own index list (or every entry its position has closed)."""
    q, k, k_cache, table, (cu, prefix), second, sinks = _extend_case(indexed=indexed,
                                                                     window=window)
    got = swattn.extend_attention(q, k, k, k_cache, k_cache, table, cu, prefix, window_left=6,
                                  sinks=sinks, second=second, return_lse=True)
    want = reference.extend_attention(q, k, k, k_cache, k_cache, table, cu, prefix,
                                      window_left=6, sinks=sinks, second=second,
                                      return_lse=True)
    assert_matches_reference(got, want)


@pytest.mark.parametrize("indexed", [True, False])
def test_bounds_variants_and_splits_are_bit_identical(indexed):
    """tight, skip and none give the same bits, at one split and at three."""
    q, k_cache, table, seq_lens, second, sinks = _decode_case(indexed=indexed)
    for splits in (1, 3):
        results = [swattn.plan_second_keys(
            seq_lens=seq_lens.tolist(), num_q_heads=q.shape[1], num_kv_heads=1,
            head_dim=q.shape[2], page_size=k_cache.shape[1], rate=second.rate,
            num_indices=0 if second.indices is None else second.indices.shape[1],
            window_left=9, dtype=q.dtype, device=DEVICE, bounds=bounds,
            num_splits=splits).run(q, k_cache, k_cache, table, second, sinks=sinks)
            for bounds in ("tight", "skip", "none")]
        assert_bounds_identical(results)
    want = reference.decode_attention(q, k_cache, k_cache, table, seq_lens, window_left=9,
                                      sinks=sinks, second=second)
    assert_matches_reference(results[0], want)


def test_fp8_cache():
    """An fp8 cache and second cache under one scale: against the reference over the same
    stored values."""
    q, k_cache, table, seq_lens, second, sinks = _decode_case(indexed=True)
    scale = torch.tensor([0.05], device=DEVICE)
    fp8 = torch.float8_e4m3fn
    k8 = reference.quantize(k_cache, scale, fp8)
    second8 = swattn.SecondKeys(reference.quantize(second.cache, scale, fp8), second.block_table,
                                second.entries, rate=second.rate, indices=second.indices)
    got = swattn.decode_attention(q, k8, k8, table, seq_lens, window_left=9, sinks=sinks,
                                  second=second8, k_scale=scale, v_scale=scale)
    want = reference.decode_attention(q, k8, k8, table, seq_lens, window_left=9, sinks=sinks,
                                      second=second8, k_scale=scale, v_scale=scale)
    assert_matches_reference(got, want)


@pytest.mark.parametrize("indexed", [True, False])
def test_fp8_extend_takes_new_tokens_as_stored(indexed):
    """Regression: over an fp8 cache the extend rows' new keys and values were read as given
    and then scaled by k_scale and v_scale as if stored, so a chunk's own keys came out
    scaled twice over; they are now taken as the cache stores them (as ops.extend's)."""
    q, k, k_cache, table, (cu, prefix), second, sinks = _extend_case(indexed=indexed)
    scale = torch.tensor([0.05], device=DEVICE)
    fp8 = torch.float8_e4m3fn
    k8 = reference.quantize(k_cache, scale, fp8)
    second8 = swattn.SecondKeys(reference.quantize(second.cache, scale, fp8), second.block_table,
                                second.entries, rate=second.rate, indices=second.indices)
    args = dict(window_left=6, sinks=sinks, second=second8, k_scale=scale, v_scale=scale)
    got = swattn.extend_attention(q, k, k, k8, k8, table, cu, prefix, **args)
    want = reference.extend_attention(q, k, k, k8, k8, table, cu, prefix, **args)
    assert_matches_reference(got, want)


def test_bad_pages_indices_and_counts_are_nan():
    """A visible entry on a page id outside the cache, an index below -1, an entry count
    past the table's row: that row NaN, the others as the reference."""
    q, k_cache, table, seq_lens, second, sinks = _decode_case(indexed=True)
    indices = second.indices.clone()
    indices[1, 0] = -7
    entries = second.entries.clone()
    entries[2] = 10 ** 6
    x_table = second.block_table.clone()
    x_table[3, 0] = 10 ** 6
    indices[3, :] = 0  # row 3 reads entry 0, on the bad page
    bad = swattn.SecondKeys(second.cache, x_table, entries, rate=second.rate, indices=indices)
    got = swattn.decode_attention(q, k_cache, k_cache, table, seq_lens, window_left=9,
                                  sinks=sinks, second=bad)
    assert torch.isnan(got[1:]).all(dim=-1).all()
    ok = swattn.SecondKeys(second.cache, second.block_table, second.entries, rate=second.rate,
                           indices=indices.clamp(min=-1))
    want = reference.decode_attention(q, k_cache, k_cache, table, seq_lens, window_left=9,
                                      sinks=sinks, second=ok)
    assert_matches_reference(got[:1], want[:1])


def test_ill_formed_extend_rows_are_nan():
    """cu_seqlens that do not cover q, or a prefix past the block table: those rows NaN,
    never a read out of bounds."""
    q, k, k_cache, table, (cu, prefix), second, sinks = _extend_case(indexed=False)
    prefix = prefix.clone()
    prefix[2] = 10 ** 6
    cu = cu.clone()
    cu[-1] = cu[-1] - 2
    got = swattn.extend_attention(q, k, k, k_cache, k_cache, table, cu, prefix, window_left=6,
                                  sinks=sinks, second=second)
    assert torch.isnan(got[int(cu[2]):]).all()
    assert not torch.isnan(got[:int(cu[2])]).any()


def test_plan_replan():
    """A decode plan run, replanned to other lengths in place, and run again: the
    reference's answers both times."""
    q, k_cache, table, seq_lens, second, sinks = _decode_case(indexed=False)
    lens = seq_lens.tolist()
    plan = swattn.plan_second_keys(seq_lens=lens, num_q_heads=q.shape[1], num_kv_heads=1,
                                   head_dim=q.shape[2], page_size=k_cache.shape[1],
                                   rate=second.rate, window_left=9, dtype=q.dtype,
                                   device=DEVICE)
    got = plan.run(q, k_cache, k_cache, table, second, sinks=sinks)
    want = reference.decode_attention(q, k_cache, k_cache, table, seq_lens, window_left=9,
                                      sinks=sinks, second=second)
    assert_matches_reference(got, want)
    shorter = [max(n - 3, 0) for n in lens]
    plan.replan(shorter)
    got = plan.run(q, k_cache, k_cache, table, second, sinks=sinks)
    want = reference.decode_attention(q, k_cache, k_cache, table,
                                      torch.tensor(shorter, dtype=torch.int32, device=DEVICE),
                                      window_left=9, sinks=sinks, second=second)
    assert_matches_reference(got, want)


def test_extend_plan_matches_one_shot():
    """An extend plan's rows equal the one-shot call's, bit for bit."""
    q, k, k_cache, table, (cu, prefix), second, sinks = _extend_case(indexed=True)
    plan = swattn.plan_second_keys(cu_seqlens=cu.tolist(), prefix_lens=prefix.tolist(),
                                   num_q_heads=q.shape[1], num_kv_heads=1, head_dim=q.shape[2],
                                   page_size=k_cache.shape[1], rate=second.rate,
                                   num_indices=second.indices.shape[1], window_left=6,
                                   dtype=q.dtype, device=DEVICE)
    got = plan.run(q, k_cache, k_cache, table, second, k=k, v=k, sinks=sinks)
    want = swattn.extend_attention(q, k, k, k_cache, k_cache, table, cu, prefix, window_left=6,
                                   sinks=sinks, second=second)
    assert torch.equal(got, want)


@pytest.mark.parametrize("change, error, match", [
    (dict(second="no"), TypeError, "second must be a swattn.SecondKeys"),
    (dict(rate=0), ValueError, "second.rate"),
    (dict(indices_dtype=torch.int64), TypeError, "second.indices"),
    (dict(sparse=True), ValueError, "sparse and second"),
    (dict(entries_rows=2), ValueError, "second.entries"),
])
def test_errors_name_the_argument(change, error, match):
    q, k_cache, table, seq_lens, second, sinks = _decode_case(indexed=True)
    fields = dict(cache=second.cache, block_table=second.block_table, entries=second.entries,
                  rate=change.get("rate", second.rate), indices=second.indices)
    if "indices_dtype" in change:
        fields["indices"] = second.indices.to(change["indices_dtype"])
    if "entries_rows" in change:
        fields["entries"] = second.entries[:change["entries_rows"]]
    source = change.get("second", swattn.SecondKeys(**fields))
    sparse = None
    if change.get("sparse"):
        sparse = (k_cache[0], k_cache[0], second.indices)
    with pytest.raises(error, match=match):
        swattn.decode_attention(q, k_cache, k_cache, table, seq_lens, window_left=9,
                                second=source, sparse=sparse)


def test_extend_refuses_what_it_does_not_take():
    q, k, k_cache, table, (cu, prefix), second, sinks = _extend_case(indexed=False)
    with pytest.raises(ValueError, match="deterministic"):
        swattn.extend_attention(q, k, k, k_cache, k_cache, table, cu, prefix, second=second,
                                deterministic=True)


@pytest.mark.gpu
def test_plan_runs_without_sync_and_replays_in_a_graph():
    """A decode plan's run makes no host sync and replays in a CUDA graph after a replan."""
    q, k_cache, table, seq_lens, second, sinks = _decode_case(indexed=True,
                                                              dtype=torch.bfloat16)
    lens = seq_lens.tolist()
    plan = swattn.plan_second_keys(seq_lens=lens, num_q_heads=q.shape[1], num_kv_heads=1,
                                   head_dim=q.shape[2], page_size=k_cache.shape[1],
                                   rate=second.rate, num_indices=second.indices.shape[1],
                                   window_left=9, dtype=q.dtype, device=DEVICE)
    out = torch.empty(q.shape[0], q.shape[1], q.shape[2], dtype=q.dtype, device=DEVICE)

    def run():
        return plan.run(q, k_cache, k_cache, table, second, sinks=sinks, out=out)

    first = runs_without_sync(run, out)
    want = reference.decode_attention(q, k_cache, k_cache, table, seq_lens, window_left=9,
                                      sinks=sinks, second=second)
    for got in first:
        assert_matches_reference(got, want)
    shorter = [max(n - 5, 0) for n in lens]
    replay_after(run, lambda: plan.replan(shorter), out)
    want = reference.decode_attention(q, k_cache, k_cache, table,
                                      torch.tensor(shorter, dtype=torch.int32, device=DEVICE),
                                      window_left=9, sinks=sinks, second=second)
    assert_matches_reference(out, want)


@pytest.mark.parametrize("indexed", [True, False])
def test_deepseek_v4_shape(indexed):
    """DeepSeek-V4's layer shape: 64 query heads on one KV head of 512 columns that is both
    K and V, a window of 128 keys, sinks, compressed entries at rate 4 (an index list of
    8 a row) or every closed one at rate 128; bf16 on a GPU (fp16 under the interpreter,
    whose bf16 products are not exact)."""
    g = torch.Generator().manual_seed(3)
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float16
    rate = 4 if indexed else 128
    lens = [140, 300] if indexed else [129, 385]
    k_cache, table = _main_cache(lens, page_size=64, num_kv_heads=1, head_dim=512,
                                 dtype=dtype, window_left=127, generator=g)
    entries = [n // rate for n in lens]
    indices = _indices(len(lens), 8, max(entries), g) if indexed else None
    second = _source(len(lens), rate=rate, entries=entries, page_size=64, num_kv_heads=1,
                     head_dim=512, dtype=dtype, indices=indices, generator=g)
    q = torch.randn(len(lens), 64, 512, generator=g).to(dtype).to(DEVICE)
    sinks = torch.randn(64, generator=g).to(DEVICE)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    got = swattn.decode_attention(q, k_cache, k_cache, table, seq_lens, window_left=127,
                                  sinks=sinks, second=second)
    want = reference.decode_attention(q, k_cache, k_cache, table, seq_lens, window_left=127,
                                      sinks=sinks, second=second)
    assert_matches_reference(got, want)


def test_values_wider_than_the_keys_need_their_own_cache():
    """Values as the keys' first columns need as many columns: a ValueError naming
    second.values, before any launch."""
    q, k_cache, table, seq_lens, second, sinks = _decode_case(indexed=True, head_dim=48)
    v_cache = torch.randn(*k_cache.shape[:3], 64, dtype=k_cache.dtype, device=DEVICE)
    with pytest.raises(ValueError, match="second.values"):
        swattn.decode_attention(q, k_cache, v_cache, table, seq_lens, window_left=9,
                                second=second)
