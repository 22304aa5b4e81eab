"""deterministic=True (the single-pass kernel) and write_kv: against the reference, the
bounds variants bit for bit, and the determinism contract: a request's bits do not depend
on the rest of the batch, on its place in it, on how its prefill was chunked, or on the
page size."""

import random

import pytest
import torch
from checks import assert_bounds_identical, assert_matches_reference
from conftest import DEVICE

import swattn
from swattn import reference
from swattn.ops import extend as ops_extend
from swattn.plan import run_extend
from swattn.verify.cases import ExtendCase, build_extend, random_mask


def _det(*tensors, **kwargs):
    return run_extend(*tensors, deterministic=True, **kwargs)


CASES = [
    ExtendCase([0, 33, 5], [20, 17, 1], window_left=9, page_size=4, seed=1),
    ExtendCase([40], [33], window_left=None, page_size=16, num_q_heads=6, num_kv_heads=2, seed=2),
    ExtendCase([17, 64], [15, 16], window_left=16, page_size=1, head_dim=24, head_dim_v=8, seed=3),
    ExtendCase([3, 0], [40, 7], window_left=0, page_size=16, seed=4),
]
FEATURES = [{}, {"sinks": True}, {"softcap": 4.0}, {"causal": False, "window_right": 5},
            {"mask": True}, {"keys": "prefix", "return_lse": True},
            {"keys": "new", "return_lse": True}]


def _kwargs(feature, case):
    kw = dict(feature)
    if kw.pop("sinks", False):
        kw["sinks"] = torch.randn(case.num_q_heads,
                                  generator=torch.Generator().manual_seed(case.seed)).to(DEVICE)
    if kw.pop("mask", False):
        mask, indptr = random_mask(case.prefix_lens, case.extend_lens, case.seed)
        kw.update(mask=mask.to(DEVICE), mask_indptr=indptr.to(DEVICE))
    return kw


@pytest.mark.parametrize("feature", FEATURES,
                         ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items()) or "plain")
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id())
def test_against_reference_and_bounds_identical(case, feature):
    """tight, skip and none give the same bits: a fully masked tile leaves the running
    max, sum and accumulator bit-unchanged (none walks many of them)."""
    tensors = build_extend(case, DEVICE)
    kw = _kwargs(feature, case)
    got = assert_bounds_identical([_det(*tensors, window_left=case.window_left, bounds=b, **kw)
                                   for b in ops_extend.BOUNDS])
    assert_matches_reference(got, reference.extend_attention(*tensors,
                                                             window_left=case.window_left, **kw))


def _sequence(length, heads=(4, 2), dims=(16, 16), seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(length, heads[0], dims[0], generator=g).half()
    k = torch.randn(length, heads[1], dims[0], generator=g).half()
    v = torch.randn(length, heads[1], dims[1], generator=g).half()
    return q.to(DEVICE), k.to(DEVICE), v.to(DEVICE)


def _prefill_in_chunks(q, k, v, bounds, window_left, page_size, pages, **kw):
    """Prefill one request chunk by chunk as an engine does: each chunk attends to the
    earlier ones through the cache (written with swattn.write_kv) and to itself."""
    length, hkv, d = k.shape
    dev = k.device
    k_cache = torch.full((max(pages) + 2, page_size, hkv, d), float("nan"), dtype=k.dtype,
                         device=dev)
    v_cache = torch.full((max(pages) + 2, page_size, hkv, v.shape[2]), float("nan"),
                         dtype=v.dtype, device=dev)
    block_table = torch.tensor([pages], dtype=torch.int32, device=dev)
    outs = []
    for start, stop in zip(bounds, bounds[1:]):
        cu = torch.tensor([0, stop - start], dtype=torch.int32, device=dev)
        prefix = torch.tensor([start], dtype=torch.int32, device=dev)
        outs.append(_det(q[start:stop], k[start:stop], v[start:stop], k_cache, v_cache, block_table,
                         cu, prefix, window_left=window_left, **kw))
        pos = torch.arange(start, stop, device=dev)
        slots = (torch.tensor(pages, dtype=torch.int64, device=dev)[pos // page_size] * page_size
                 + pos % page_size)
        swattn.write_kv(k[start:stop], v[start:stop], k_cache, v_cache, slots)
    return torch.cat(outs)


@pytest.mark.parametrize("window_left", [None, 6, 21], ids=lambda w: f"L{w}")
def test_bits_do_not_depend_on_chunking(window_left, seed):
    """Under the interpreter this failed for 4 of 6 sink draws while its dot was NumPy's
    BLAS product, whose rounding of a row depends on the row's place in its block
    (ops/_interpreter.py); ``--seed`` draws other inputs."""
    length, page_size = 57, 4
    q, k, v = _sequence(length, seed=1000 * seed + (window_left or 1))
    pages = random.Random(5 + seed).sample(range(30), -(-length // page_size))
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    plans = [[0, length], [0, 16, length], [0, 1, 2, 30, 31, length], [0, 13, 40, 41, length]]
    results = [_prefill_in_chunks(q, k, v, plan, window_left, page_size, pages, sinks=sinks)
               for plan in plans]
    for plan, other in zip(plans[1:], results[1:]):
        assert torch.equal(results[0], other), f"chunk plan {plan} differs from one chunk"
    assert not torch.isnan(results[0]).any()


@pytest.mark.parametrize("window_left", [None, 9], ids=lambda w: f"L{w}")
def test_bits_do_not_depend_on_chunking_under_chunked_attention(window_left, seed):
    """The determinism promise across chunk boundaries (attention_chunk): prefill cuts on,
    before and after a chunk's start give the bits of one prefill."""
    length, page_size, chunk = 57, 4, 16
    q, k, v = _sequence(length, seed=2000 * seed + (window_left or 1))
    pages = random.Random(6 + seed).sample(range(30), -(-length // page_size))
    plans = [[0, length], [0, 16, length], [0, 15, 17, 33, length], [0, 1, 40, 48, length]]
    results = [_prefill_in_chunks(q, k, v, plan, window_left, page_size, pages,
                                  attention_chunk=chunk) for plan in plans]
    for plan, other in zip(plans[1:], results[1:]):
        assert torch.equal(results[0], other), f"chunk plan {plan} differs from one chunk"
    assert not torch.isnan(results[0]).any()


def test_bits_do_not_depend_on_page_size(seed):
    length = 45
    q, k, v = _sequence(length, seed=9 + 1000 * seed)
    results = []
    for page_size in (1, 4, 16):
        pages = list(range(-(-length // page_size)))[::-1]
        results.append(_prefill_in_chunks(q, k, v, [0, 20, length], 11, page_size, pages))
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])


def test_bits_do_not_depend_on_the_batch(seed):
    """The same request alone, first, and last in batches of other requests."""
    request = ExtendCase([23], [19], window_left=8, page_size=4, seed=30 + 1000 * seed)
    alone = build_extend(request, DEVICE)
    want = _det(*alone, window_left=8)
    for others, where in (([7, 0], "first"), ([50, 3], "last")):
        case = ExtendCase([23] + [others[0]] if where == "first" else [others[0], 23],
                          [19] + [others[1] + 1] if where == "first" else [others[1] + 1, 19],
                          window_left=8, page_size=4, seed=31 + 1000 * seed)
        q, k, v, k_cache, v_cache, block_table, cu, prefix = build_extend(case, DEVICE)
        b = 0 if where == "first" else 1
        rows = slice(int(cu[b]), int(cu[b + 1]))
        # Put the lone request's tensors at its place in the batch.
        q[rows], k[rows], v[rows] = alone[0], alone[1], alone[2]
        for i in range(-(-23 // 4)):
            if alone[5][0, i] >= 0:
                k_cache[block_table[b, i]] = alone[3][alone[5][0, i]]
                v_cache[block_table[b, i]] = alone[4][alone[5][0, i]]
        got = _det(q, k, v, k_cache, v_cache, block_table, cu, prefix, window_left=8)
        assert torch.equal(got[rows], want), where


def test_write_kv_stores_bits_and_skips_minus_one():
    k = torch.randn(5, 2, 16).half().to(DEVICE)
    v = torch.randn(5, 2, 8).half().to(DEVICE)
    k_cache = torch.full((3, 4, 2, 16), float("nan"), dtype=torch.float16, device=DEVICE)
    v_cache = torch.full((3, 4, 2, 8), float("nan"), dtype=torch.float16, device=DEVICE)
    slots = torch.tensor([5, -1, 0, 11, 6], dtype=torch.int64, device=DEVICE)
    swattn.write_kv(k, v, k_cache, v_cache, slots)
    flat_k, flat_v = k_cache.view(-1, 2, 16), v_cache.view(-1, 2, 8)
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            assert torch.equal(flat_k[s], k[t]) and torch.equal(flat_v[s], v[t])
    written = {5, 0, 11, 6}
    for s in range(12):
        if s not in written:
            assert torch.isnan(flat_k[s]).all()


@pytest.mark.parametrize("bad,error,message", [
    (lambda a: a.update(slot_mapping=a["slot_mapping"].int()), TypeError,
     "slot_mapping must be torch.int64"),
    (lambda a: a.update(v=a["v"][:1]), ValueError, "v must have shape"),
    (lambda a: a.update(k_cache=a["k_cache"].float()), TypeError, "k_cache must be torch.float16"),
], ids=["slot-dtype", "v-rows", "cache-dtype"])
def test_write_kv_validation(bad, error, message):
    args = dict(k=torch.randn(2, 2, 16).half(), v=torch.randn(2, 2, 8).half(),
                k_cache=torch.randn(3, 4, 2, 16).half(), v_cache=torch.randn(3, 4, 2, 8).half(),
                slot_mapping=torch.tensor([0, 1], dtype=torch.int64))
    bad(args)
    args = {name: t.to(DEVICE) for name, t in args.items()}
    with pytest.raises(error, match=message):
        swattn.write_kv(**args)


def test_write_kv_never_writes_outside_the_cache():
    """Slots past the cache or below -1 are skipped (not read back to the host, so no
    ValueError): nothing outside the cache is written, the good slots are."""
    g = torch.Generator().manual_seed(3)
    k = torch.randn(4, 2, 16, generator=g).half().to(DEVICE)
    v = torch.randn(4, 2, 8, generator=g).half().to(DEVICE)
    store = torch.full((5, 4, 2, 16), float("nan"), dtype=torch.float16, device=DEVICE)
    v_store = torch.full((5, 4, 2, 8), float("nan"), dtype=torch.float16, device=DEVICE)
    k_cache, v_cache = store[1:4], v_store[1:4]  # pages 0 and 4 of the store lie outside
    swattn.write_kv(k, v, k_cache, v_cache, torch.tensor([12, 5, -7, 2 ** 40], dtype=torch.int64,
                                                         device=DEVICE))
    assert torch.equal(k_cache.view(-1, 2, 16)[5], k[1])
    assert torch.isnan(store[0]).all() and torch.isnan(store[4]).all()
    assert torch.isnan(v_store[0]).all() and torch.isnan(v_store[4]).all()
    assert torch.isnan(k_cache.view(-1, 2, 16)[:5]).all()
    assert torch.isnan(k_cache.view(-1, 2, 16)[6:]).all()


def test_public_deterministic_flag():
    case = CASES[0]
    tensors = build_extend(case, DEVICE)
    got = swattn.extend_attention(*tensors, window_left=case.window_left, deterministic=True)
    assert torch.equal(got, _det(*tensors, window_left=case.window_left))
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        swattn.extend_attention(*tensors, deterministic=1)
