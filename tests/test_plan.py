"""The engine path: plan once per batch, run per layer, replan in place; the checks a plan
makes once and those a run makes without reading device memory; and bad page ids, which
no kernel dereferences: the rows that needed them come out NaN, every other row keeps the
bits of a good run."""

import pytest
import torch
from checks import assert_matches_reference, runs_without_sync
from conftest import DEVICE

import swattn
import swattn.ops  # noqa: F401  (installs the interpreter's patches)
from swattn import reference
from swattn.plan import run_decode, run_extend
from swattn.verify.cases import (
    DecodeCase,
    ExtendCase,
    build_decode,
    build_extend,
    build_sparse,
    rel_err,
)


def _extend_plan(case, tensors, **kw):
    q, k, v, k_cache, *_ = tensors
    return swattn.plan_extend(tensors[6].tolist(), tensors[7].tolist(), num_q_heads=q.shape[1],
                              num_kv_heads=k.shape[1], head_dim=q.shape[2],
                              head_dim_v=v.shape[2], page_size=k_cache.shape[1],
                              window_left=case.window_left, dtype=q.dtype, device=DEVICE, **kw)


def _decode_plan(case, tensors, **kw):
    q, k_cache, v_cache, _, seq_lens = tensors
    return swattn.plan_decode(seq_lens.tolist(), num_q_heads=q.shape[1],
                              num_kv_heads=k_cache.shape[2], head_dim=q.shape[2],
                              head_dim_v=v_cache.shape[3], page_size=k_cache.shape[1],
                              window_left=case.window_left, dtype=q.dtype, device=DEVICE, **kw)


def _sinks(heads, seed):
    return torch.randn(heads, generator=torch.Generator().manual_seed(seed)).to(DEVICE)


EXTEND = ExtendCase([0, 33, 5], [20, 17, 1], num_q_heads=4, num_kv_heads=2, window_left=9,
                    page_size=4, seed=1)
DECODE = DecodeCase([1, 17, 40], num_q_heads=8, num_kv_heads=2, window_left=14, page_size=4,
                    sparse_keys=5, seed=3)


@pytest.mark.parametrize("deterministic", [False, True], ids=["two-stage", "single-pass"])
def test_extend_plan_runs_the_one_shot_bits(deterministic):
    """A plan's run and the one-shot call give the same bits; the run serves a second layer
    (other tensors, sinks, return_lse) without a new plan."""
    tensors = build_extend(EXTEND, DEVICE)
    sinks = _sinks(4, 1)
    plan = _extend_plan(EXTEND, tensors, deterministic=deterministic, return_lse=True)
    assert plan.path == ("single-pass" if deterministic else "triton")
    assert plan.num_tokens == 38 and plan.num_seqs == 3
    out, lse = plan.run(*tensors[:6], sinks=sinks)
    want = swattn.extend_attention(*tensors, window_left=9, sinks=sinks, return_lse=True,
                                   deterministic=deterministic)
    assert torch.equal(out, want[0]) and torch.equal(lse, want[1])
    other = build_extend(ExtendCase([0, 33, 5], [20, 17, 1], window_left=9, page_size=4, seed=2),
                         DEVICE)
    out2, _ = plan.run(*other[:6])
    assert_matches_reference(out2, reference.extend_attention(*other, window_left=9))


@pytest.mark.parametrize("splits", [1, 3], ids=lambda s: f"splits{s}")
def test_decode_plan_runs_the_one_shot_bits(splits):
    tensors = build_decode(DECODE, DEVICE)
    sparse = build_sparse(DECODE, DEVICE)
    sinks = _sinks(8, 3)
    plan = _decode_plan(DECODE, tensors, num_splits=splits, sparse_keys=5, return_lse=True)
    assert (plan.path, plan.num_splits, plan.batch) == ("triton", splits, 3)
    got = plan.run(*tensors[:4], sinks=sinks, sparse=sparse)
    want = swattn.decode_attention(*tensors, window_left=14, sinks=sinks, sparse=sparse,
                                   num_splits=splits, return_lse=True)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert_matches_reference(got, reference.decode_attention(*tensors, window_left=14, sinks=sinks,
                                                             sparse=sparse, return_lse=True))


def test_extend_replan_in_place():
    """replan writes the next batch's lengths into the plan's own buffers (same tensors):
    a smaller batch padded to the plan's, fewer tokens than it holds; the run gives the bits
    of a fresh plan of that batch on its rows and leaves the padding rows alone."""
    big = build_extend(EXTEND, DEVICE)
    plan = _extend_plan(EXTEND, big)
    buffers = (plan.cu_seqlens.data_ptr(), plan.prefix_lens.data_ptr())
    small_case = ExtendCase([7, 12], [9, 4], num_q_heads=4, num_kv_heads=2, window_left=9,
                            page_size=4, seed=5)
    small = build_extend(small_case, DEVICE)
    plan.replan(small[6].tolist(), small[7].tolist())
    assert (plan.cu_seqlens.data_ptr(), plan.prefix_lens.data_ptr()) == buffers
    assert plan.cu_seqlens.tolist() == [0, 9, 13, 13] and plan.prefix_lens.tolist() == [7, 12, 0]
    # The run's tensors padded to the plan's capacity: 38 token rows, 3 block-table rows.
    q, k, v = (torch.cat([t, torch.randn(38 - 13, *t.shape[1:]).to(t)]) for t in small[:3])
    table = torch.cat([small[5], torch.full((1, small[5].shape[1]), -1, dtype=torch.int32,
                                            device=DEVICE)])
    out = torch.full((38, 4, 16), float("nan"), dtype=q.dtype, device=DEVICE)
    plan.run(q, k, v, small[3], small[4], table, out=out)
    fresh = _extend_plan(small_case, small).run(*small[:6])
    assert torch.equal(out[:13], fresh)
    assert torch.isnan(out[13:]).all()


def test_decode_replan_in_place():
    """replan with other lengths (one of 0) and a batch padded to the plan's: the bits of
    a fresh plan; padded sequences give 0."""
    # Every row of every page written (no window at build), so shorter lengths find keys.
    tensors = build_decode(DecodeCase([1, 17, 40], num_q_heads=8, num_kv_heads=2, page_size=4,
                                      seed=3), DEVICE)
    plan = _decode_plan(DECODE, tensors, num_splits=2)
    buffer = plan.seq_lens.data_ptr()
    q, k_cache, v_cache, table, seq_lens = tensors
    plan.replan([0, 9])
    assert plan.seq_lens.data_ptr() == buffer and plan.seq_lens.tolist() == [0, 9, 0]
    got = plan.run(q, k_cache, v_cache, table)
    fresh = swattn.plan_decode([0, 9, 0], num_q_heads=8, num_kv_heads=2, head_dim=16,
                               page_size=4, window_left=14, num_splits=2, dtype=q.dtype,
                               device=DEVICE).run(q, k_cache, v_cache, table)
    assert torch.equal(got, fresh)
    assert torch.all(got[0] == 0) and torch.all(got[2] == 0)
    seq_lens.copy_(torch.tensor([0, 9, 0], dtype=torch.int32))
    assert_matches_reference(got, reference.decode_attention(q, k_cache, v_cache, table, seq_lens,
                                                             window_left=14))


# ---- what a plan checks, once, on the host ------------------------------------------

def _extend_kw(**kw):
    return dict(dict(num_q_heads=4, num_kv_heads=2, head_dim=16, page_size=4, window_left=3,
                     dtype=torch.float16, device=DEVICE), **kw)


BAD_PLANS = [
    (([1, 5], [0]), {}, ValueError, "cu_seqlens must start at 0"),
    (([0, 5, 4], [0, 1]), {}, ValueError, "cu_seqlens must be non-decreasing"),
    (([0, 5], [0, 1]), {}, ValueError, r"cu_seqlens must have len\(prefix_lens\) \+ 1 = 3"),
    (([0, 5], [-2]), {}, ValueError, "prefix_lens must be >= 0"),
    (([0, 5], [0.5]), {}, TypeError, "prefix_lens must hold ints"),
    (([0, 5], [3]), {"mask_indptr": [0, 30]}, ValueError, "mask_indptr gives sequence 0 30"),
    (([0, 5], [3]), {"num_kv_heads": 3}, ValueError, r"num_q_heads \(4\) must be a multiple"),
    (([0, 5], [3]), {"head_dim": 0}, ValueError, "head_dim must be >= 1"),
    (([0, 5], [3]), {"window_left": -1}, ValueError, "window_left must be >= 0"),
    (([0, 5], [3]), {"keys": "old"}, ValueError, "keys must be one of"),
    (([0, 5], [3]), {"dtype": torch.int8}, TypeError, "dtype must be one of"),
    (([0, 5], [3]), {"kv_dtype": torch.int8}, ValueError, "kv_dtype must be"),
    (([0, 5], [3]), {"hopper": "yes"}, TypeError, "hopper must be None or a bool"),
    (([0, 5], [3]), {"bounds": "loose"}, ValueError, "bounds must be one of"),
    (([0, 5], [3]), {"max_tokens": 4}, ValueError, "max_tokens must be >= 5"),
    (([0, 5], [3]), {"block_table": [[0, 1]]}, ValueError, "num_pages"),
]


@pytest.mark.parametrize("lengths,kw,error,message", BAD_PLANS, ids=[b[3] for b in BAD_PLANS])
def test_bad_extend_plan(lengths, kw, error, message):
    with pytest.raises(error, match=message):
        swattn.plan_extend(*lengths, **_extend_kw(**kw))


def test_plan_checks_every_entry_a_query_reads_once():
    """With a host block table, the entries below every window may be anything (-1); one a
    query reads that is not a page of the cache raises, naming it."""
    # Sequence 0: prefix 10, pages of 4, window 3: the first new token sees keys 7..; pages 1, 2.
    table = [[-1, 5, 6, -1], [7, -1, -1, -1]]
    swattn.plan_extend([0, 2, 2], [10, 3], block_table=table, num_pages=8, **_extend_kw())
    with pytest.raises(ValueError, match=r"block_table\[0, 2\] = 8 is read"):
        swattn.plan_extend([0, 2, 2], [10, 3], block_table=[[-1, 5, 8, -1], [7, -1, -1, -1]],
                           num_pages=8, **_extend_kw())
    with pytest.raises(ValueError, match=r"block_table\[0, 1\] = -1 is read"):
        swattn.plan_extend([0, 2, 2], [10, 3], block_table=[[5, -1, 6, -1], [7, 1, 1, 1]],
                           num_pages=8, **_extend_kw())
    # Decode: seq 10, window 3: keys 6..9, pages 1 and 2.
    dkw = dict(num_q_heads=4, num_kv_heads=2, head_dim=16, page_size=4, window_left=3,
               dtype=torch.float16, device=DEVICE, num_pages=8)
    swattn.plan_decode([10], block_table=torch.tensor([[-1, 5, 6]]), **dkw)
    with pytest.raises(ValueError, match=r"block_table\[0, 2\] = 9 is read"):
        swattn.plan_decode([10], block_table=torch.tensor([[-1, 5, 9]]), **dkw)
    with pytest.raises(ValueError, match="block_table has 2 pages per sequence"):
        swattn.plan_decode([10], block_table=torch.tensor([[-1, 5]]), **dkw)


def test_replan_checks_the_capacity():
    plan = swattn.plan_extend([0, 5, 9], [3, 4], **_extend_kw())
    with pytest.raises(ValueError, match="replan with 3 sequences: the plan holds 2"):
        plan.replan([0, 1, 2, 3], [0, 0, 0])
    with pytest.raises(ValueError, match="replan with 10 tokens: the plan holds 9"):
        plan.replan([0, 10], [0])
    decode = swattn.plan_decode([4, 5], num_q_heads=4, num_kv_heads=2, head_dim=16, page_size=4,
                                dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match="seq_lens must be >= 0"):
        decode.replan([3, -1])
    case = ExtendCase([3], [2], window_left=3)
    oneshot = swattn.plan.extend_plan_for(*build_extend(case, DEVICE), window_left=3)
    with pytest.raises(ValueError, match="make one with plan_extend to replan"):
        oneshot.replan([0, 2], [3])


# ---- what a run checks, without reading device memory --------------------------------

def test_run_checks_the_tensors_against_the_plan():
    tensors = build_extend(EXTEND, DEVICE)
    plan = _extend_plan(EXTEND, tensors)
    q, k, v, kc, vc, table = tensors[:6]
    with pytest.raises(ValueError, match="q has 37 rows, the planned batch has 38 tokens"):
        plan.run(q[:37], k[:37], v[:37], kc, vc, table)
    with pytest.raises(TypeError, match="q must be torch.float16"):
        plan.run(q.float(), k, v, kc, vc, table)
    with pytest.raises(ValueError, match="k_cache must have shape"):
        plan.run(q, k, v, kc[:, :2], vc, table)
    with pytest.raises(ValueError, match="block_table must be at least"):
        plan.run(q, k, v, kc, vc, table[:, :2])
    with pytest.raises(ValueError, match="the plan was made without mask_indptr"):
        plan.run(q, k, v, kc, vc, table, mask=torch.ones(5, dtype=torch.bool, device=DEVICE))
    with pytest.raises(ValueError, match="k_scale applies to fp8 caches"):
        plan.run(q, k, v, kc, vc, table, k_scale=torch.ones(1, device=DEVICE))
    with pytest.raises(ValueError, match="sinks must have shape"):
        plan.run(q, k, v, kc, vc, table, sinks=torch.zeros(3, device=DEVICE))
    dtensors = build_decode(DECODE, DEVICE)
    dplan = _decode_plan(DECODE, dtensors)
    with pytest.raises(ValueError, match="plan was made with sparse_keys=0"):
        dplan.run(*dtensors[:4], sparse=build_sparse(DECODE, DEVICE))
    with pytest.raises(ValueError, match="block_table must be"):
        dplan.run(*dtensors[:3], dtensors[3][:, :2])


def _restrided(t):
    """``t``'s values in a tensor at the same address with the same shape, its rows twice
    as far apart (the last dimension contiguous still)."""
    wide = torch.empty(t.shape[0], 2 * t[0].numel(), dtype=t.dtype, device=t.device)
    other = wide[:, :t[0].numel()].view(t.shape)
    other.copy_(t)
    return other


def test_every_planned_tensor_enters_the_relaunch_key_whole():
    """Regression: the extend plan's relaunch key left out lse's stride (decode's had it), so
    a run with an lse at the same address but of another stride could relaunch the earlier
    run's launch with the stale stride. Each plan's table now gives its key: every tensor of
    a run (lse, sinks and out among them) changes the key by its stride alone."""
    tensors = build_extend(EXTEND, DEVICE)
    plan = _extend_plan(EXTEND, tensors, return_lse=True)
    q, k, v, kc, vc, table = tensors[:6]
    out = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=DEVICE)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=DEVICE)
    sinks = torch.zeros(q.shape[1], 1, device=DEVICE)[:, 0]
    run = [q, k, v, kc, vc, table, sinks, out, lse]
    assert [arg.name for arg in plan.table] == ["q", "k", "v", "k_cache", "v_cache",
                                                 "block_table", "sinks", "out", "lse"]
    key = plan.relaunch_key(tuple(run), None, None)
    for i, arg in enumerate(plan.table):
        changed = list(run)
        changed[i] = _restrided(run[i]) if run[i].dim() > 1 else torch.zeros(
            run[i].shape[0], 2, device=DEVICE)[:, 0]
        assert plan.relaunch_key(tuple(changed), None, None) != key, arg.name
    dtensors = build_decode(DECODE, DEVICE)
    dplan = _decode_plan(DECODE, dtensors, return_lse=True)
    dq = dtensors[0]
    dlse = torch.empty(dq.shape[:2], dtype=torch.float32, device=DEVICE)
    drun = (*dtensors[:4], None, None, dlse)
    assert dplan.relaunch_key(drun, None, None, None) != dplan.relaunch_key(
        drun[:-1] + (_restrided(dlse),), None, None, None)


def test_a_run_with_an_lse_of_another_stride_writes_that_lse():
    """Regression (the lse-stride drift above): runs with ``out`` and an ``lse`` at one
    address, the second lse's rows twice as far apart, each write the lse they are given."""
    tensors = build_extend(EXTEND, DEVICE)
    plan = _extend_plan(EXTEND, tensors, return_lse=True)
    q, k, v, kc, vc, table = tensors[:6]
    out = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=DEVICE)
    buffer = torch.full((q.shape[0], 2 * q.shape[1]), float("nan"), device=DEVICE)
    dense = buffer.view(-1)[:q.shape[0] * q.shape[1]].view(q.shape[:2])
    spread = buffer[:, :q.shape[1]]
    assert dense.data_ptr() == spread.data_ptr() and dense.stride() != spread.stride()
    _, want = plan.run(q, k, v, kc, vc, table, out=out, lse=dense)
    want = want.clone()
    buffer.fill_(float("nan"))
    _, got = plan.run(q, k, v, kc, vc, table, out=out, lse=spread)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


# ---- bad page ids: never dereferenced, NaN where needed --------------------------------

def _extend_needs(case, b, page):
    """[T] bool: the new tokens (of sequence b) that see a key on logical page ``page``."""
    rows = []
    for s, (p, e) in enumerate(zip(case.prefix_lens, case.extend_lens)):
        first, last = page * case.page_size, min((page + 1) * case.page_size, p) - 1
        for t in range(e):
            pos = p + t
            low = 0 if case.window_left is None else pos - case.window_left
            rows.append(s == b and first <= last and last >= low)
    return torch.tensor(rows, device=DEVICE)


def _assert_nan_where_needed(bad, good, needs):
    """``needs`` rows (dim 0) all NaN in ``bad``; every other row the bits of ``good``."""
    assert needs.any() and (~needs).any()
    assert torch.isnan(bad[needs]).all()
    assert torch.equal(bad[~needs], good[~needs])


BAD_IDS = [-1, 10 ** 6, 2 ** 31 - 1, -(2 ** 31)]


@pytest.mark.parametrize("deterministic", [False, True], ids=["two-stage", "single-pass"])
@pytest.mark.parametrize("bad_id", BAD_IDS, ids=lambda x: f"id{x}")
@pytest.mark.parametrize("window_left,page_size,tma",
                         [(9, 4, True), (None, 16, True), (None, 16, False)],
                         ids=["masked-tiles", "mask-free-tiles-tma", "mask-free-tiles-pointers"])
def test_extend_bad_page_gives_nan_rows(window_left, page_size, tma, bad_id, deterministic):
    """A visible page's entry replaced by an id outside the cache (-1, past it, the int32
    extremes): the process survives, the rows that see a key on it are NaN, the others
    bit-identical to the good run. Full attention over pages of 16 reaches the tiles every
    row sees whole (by TMA from the cache, whose pages hold whole tiles, or by pointers)."""
    case = ExtendCase([26, 40], [6, 19], num_q_heads=4, num_kv_heads=2, window_left=window_left,
                      page_size=page_size, seed=9)
    tensors = list(build_extend(case, DEVICE))
    sinks = _sinks(4, 9)
    config = None if tma else {"tma": False}
    good = run_extend(*tensors, window_left=window_left, sinks=sinks, deterministic=deterministic,
                      config=config)
    # A page of sequence 1's prefix that its first tokens see (in a masked edge tile), or
    # that every token sees whole (keys 16..31: a mask-free tile of 16).
    page = (40 - 2) // page_size if window_left is not None else 1
    tensors[5] = tensors[5].clone()
    tensors[5][1, page] = bad_id
    bad = run_extend(*tensors, window_left=window_left, sinks=sinks, deterministic=deterministic,
                     return_lse=True, config=config)
    needs = _extend_needs(case, 1, page)
    _assert_nan_where_needed(bad[0], good, needs)
    assert torch.isnan(bad[1][needs]).all() and not torch.isnan(bad[1][~needs]).any()


# The decode kernel reads an unreadable key's row as NaN, or with the config's flag_unread
# as zeros beside a NaN l (ops.config.DecodeConfig): the same outputs either way.
FLAG_UNREAD = [None, {"flag_unread": True}]


@pytest.mark.parametrize("config", FLAG_UNREAD, ids=["nan-rows", "flag-unread"])
@pytest.mark.parametrize("bounds", ["tight", "skip", "none"])
@pytest.mark.parametrize("splits", [1, 3], ids=lambda s: f"splits{s}")
def test_decode_bad_page_gives_nan_rows(splits, bounds, config):
    case = DecodeCase([30, 21, 9], num_q_heads=8, num_kv_heads=2, window_left=14, page_size=4,
                      seed=11)
    tensors = list(build_decode(case, DEVICE))
    sinks = _sinks(8, 11)
    good = run_decode(*tensors, window_left=14, sinks=sinks, num_splits=splits, bounds=bounds)
    for bad_id in BAD_IDS:
        table = tensors[3].clone()
        table[1, 4] = bad_id  # keys 16..19 of sequence 1 (its window: 6..20)
        bad = run_decode(*tensors[:3], table, tensors[4], window_left=14, sinks=sinks,
                         num_splits=splits, bounds=bounds, config=config, return_lse=True)
        _assert_nan_where_needed(bad[0], good, torch.tensor([False, True, False], device=DEVICE))
        assert torch.isnan(bad[1][1]).all() and not torch.isnan(bad[1][[0, 2]]).any()


@pytest.mark.parametrize("config", FLAG_UNREAD, ids=["nan-rows", "flag-unread"])
def test_sparse_index_outside_the_pool_gives_nan(config):
    """A sparse index past the pool or below -1 is not read; that sequence comes out NaN
    (-1 stays 'no key')."""
    case = DecodeCase([12, 30], num_q_heads=4, num_kv_heads=2, window_left=7, page_size=4,
                      sparse_keys=6, seed=13)
    tensors = build_decode(case, DEVICE)
    k_pool, v_pool, idx = build_sparse(case, DEVICE)
    good = run_decode(*tensors, window_left=7, sparse=(k_pool, v_pool, idx), num_splits=2)
    for bad_id in (case.pool_rows, -2, 2 ** 31 - 1):
        bad_idx = idx.clone()
        bad_idx[0, 3] = bad_id
        bad = run_decode(*tensors, window_left=7, sparse=(k_pool, v_pool, bad_idx), num_splits=2,
                         config=config)
        _assert_nan_where_needed(bad, good, torch.tensor([True, False], device=DEVICE))


# ---- the interpreter's product ----------------------------------------------------------

@pytest.mark.skipif(DEVICE == "cuda", reason="the interpreter only")
def test_interpreter_warnings_we_expect_are_not_shown():
    """Our kernels take log2(0) and exp2(-inf) on purpose (empty rows, masked keys): under
    the interpreter NumPy's warnings about them stay off (they reached users of the demo)."""
    import warnings
    g = torch.Generator().manual_seed(3)
    sinks = torch.randn(8, generator=g).to(DEVICE)
    ext = ExtendCase([0, 9, 4], [5, 0, 7], num_q_heads=8, num_kv_heads=1, window_left=7,
                     dtype=torch.float32, seed=3)
    dec = DecodeCase([1, 9, 30], num_q_heads=8, num_kv_heads=1, window_left=7,
                     dtype=torch.float32, seed=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        swattn.extend_attention(*build_extend(ext, DEVICE), window_left=7, sinks=sinks,
                                return_lse=True)
        swattn.decode_attention(*build_decode(dec, DEVICE), window_left=7, sinks=sinks,
                                num_splits=3, return_lse=True)


@pytest.mark.skipif(DEVICE == "cuda", reason="the interpreter only")
def test_interpreter_patches_the_language_once_a_launch(monkeypatch):
    """One launch patches triton.language once, not at every helper call (hundreds per
    launch in the extend kernel), and gives the same bits as a fresh patch at every call."""
    from triton.runtime import interpreter

    case = ExtendCase([9, 30], [5, 17], num_q_heads=4, num_kv_heads=2, head_dim=16,
                      head_dim_v=16, page_size=4, window_left=7, seed=5)
    tensors = build_extend(case, DEVICE)
    fast = swattn.extend_attention(*tensors, window_left=7)
    calls = []
    patch_builtin = interpreter._patch_builtin
    monkeypatch.setattr(interpreter, "_patch_builtin",
                        lambda *a: calls.append(1) or patch_builtin(*a))
    swattn.extend_attention(*tensors, window_left=7)
    # (two launches: the kernel, and the one-shot's NaN fill of rows no sequence owns)
    assert 0 < len(calls) <= 2 * 12, len(calls)
    # The interpreter's own behaviour: every helper call patches again; the same bits.
    calls.clear()
    monkeypatch.setattr(interpreter, "_patch_lang", interpreter._patch_lang.original)
    monkeypatch.setattr(interpreter.GridExecutor, "__call__",
                        interpreter.GridExecutor.__call__.original)
    slow = swattn.extend_attention(*tensors, window_left=7)
    assert len(calls) > 100
    assert torch.equal(fast, slow)


@pytest.mark.skipif(DEVICE == "cuda", reason="the interpreter only")
def test_interpreter_dot_does_not_depend_on_the_rows_place():
    """The product a row gets is the same bits wherever the row sits in the block (NumPy's
    BLAS product failed this for every one of 200 random draws), and bf16 operands are
    multiplied as the numbers they hold (the interpreter's own product read their bits as
    integers)."""
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    assert InterpreterBuilder.create_dot.__module__ == "swattn.ops._interpreter"
    g = torch.Generator().manual_seed(0)
    a = torch.randn(16, 64, generator=g).half().numpy()
    b = torch.randn(64, 32, generator=g).half().numpy()

    def dot(x, y, dtype=tl.float16):
        acc = TensorHandle(np.zeros((x.shape[0], y.shape[1]), np.float32), tl.float32)
        return InterpreterBuilder.create_dot(None, TensorHandle(x, dtype), TensorHandle(y, dtype),
                                             acc, None, None).data

    base = dot(a, b)
    for shift in range(1, 16):
        assert np.array_equal(np.roll(dot(np.roll(a, shift, 0), b), -shift, 0), base)
    want = (torch.from_numpy(a).double() @ torch.from_numpy(b).double()).float().numpy()
    assert np.array_equal(base, want)
    bits = torch.from_numpy(a).bfloat16().view(torch.int16).numpy().view(np.uint16)
    bf16 = dot(bits, torch.from_numpy(b).bfloat16().view(torch.int16).numpy().view(np.uint16),
               tl.bfloat16)
    want = (torch.from_numpy(a).bfloat16().double()
            @ torch.from_numpy(b).bfloat16().double()).float()
    assert rel_err(torch.from_numpy(bf16), want) < 1e-6


# ---- on the GPU: graphs, syncs, the Hopper paths, torch.compile -------------------------

def _gpu_extend_case(lens, hq, hkv, d, page, window, seed):
    """An extend batch whose cache holds every prefix row (no window at build, so any
    later, shorter batch finds its keys) and its plan's size arguments."""
    case = ExtendCase([p for p, _ in lens], [e for _, e in lens], num_q_heads=hq,
                      num_kv_heads=hkv, head_dim=d, head_dim_v=d, page_size=page,
                      window_left=None, dtype=torch.bfloat16, seed=seed)
    return case, dict(num_q_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=page,
                      window_left=window)


def _lengths(lens):
    """The host cu_seqlens and prefix_lens of ``lens`` ((prefix, new) per sequence)."""
    cu = [0]
    for _, e in lens:
        cu.append(cu[-1] + e)
    return cu, [p for p, _ in lens]


@pytest.mark.gpu
@pytest.mark.parametrize("hopper", [False, True], ids=["triton", "hopper"])
def test_gpu_extend_graph_replays_after_replan(hopper):
    """A plan's run captured once in a CUDA graph for a bucket of 3 sequences and 3000
    tokens, then replayed after replan with other lengths: new chunks of 1 token, chunks at
    and past the window, prefixes of 0, at and past the window, a batch of 2 padded to the
    bucket. Each replay gives the bits of a fresh plan run eagerly on the same batch."""
    window = 1023
    # Every sequence's cache holds 4100 prefix rows: any later prefix up to that finds its keys.
    case, sizes = _gpu_extend_case([(4100, 1000)] * 3, 32, 8, 128, 16, window, 21)
    q, k, v, k_cache, v_cache, table, cu, prefix = build_extend(case, "cuda")
    plan = swattn.plan_extend(cu.tolist(), prefix.tolist(), hopper=hopper, **sizes)
    assert plan.path == ("hopper" if hopper else "triton") and plan.max_tokens == 3000
    out = torch.empty(3000, 32, 128, dtype=torch.bfloat16, device="cuda")
    plan.run(q, k, v, k_cache, v_cache, table, out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run(q, k, v, k_cache, v_cache, table, out=out)
    for lens in ([(1, 1), (window, window + 1), (window + 1, 1975)],
                 [(0, 1), (4000, 1), (4100, 1)],
                 [(2000, 1024), (5, 1976), (0, 0)],
                 [(4099, 300), (999, 2)]):
        cu_new, prefix_new = _lengths(lens)
        plan.replan(cu_new, prefix_new)
        out.fill_(float("nan"))
        graph.replay()
        fresh = swattn.plan_extend(cu_new, prefix_new, hopper=hopper, **sizes)
        want = fresh.run(q[:cu_new[-1]], k[:cu_new[-1]], v[:cu_new[-1]], k_cache, v_cache,
                         table[:len(lens)])
        torch.cuda.synchronize()
        assert torch.equal(out[:cu_new[-1]], want), lens
        assert torch.isnan(out[cu_new[-1]:]).all()
        ref = reference.extend_attention(
            q[:cu_new[-1]], k[:cu_new[-1]], v[:cu_new[-1]], k_cache, v_cache, table[:len(lens)],
            torch.tensor(cu_new, dtype=torch.int32, device="cuda"),
            torch.tensor(prefix_new, dtype=torch.int32, device="cuda"), window_left=window)
        assert rel_err(want, ref) < 1e-2, lens


@pytest.mark.gpu
@pytest.mark.parametrize("hopper", [False, True], ids=["triton", "hopper"])
def test_gpu_decode_graph_replays_after_replan(hopper):
    """A decode plan captured for a bucket of 64 sequences, replayed after replan with
    lengths 1, at and past the window, and a batch of 40 padded to the bucket (the padding
    rows give 0): the bits of a fresh plan's eager run."""
    window = 4095
    gen = torch.Generator().manual_seed(5)
    lens = torch.randint(9000, 12000, (64,), generator=gen).tolist()  # rows for every later length
    case = DecodeCase(lens, num_q_heads=32, num_kv_heads=8, head_dim=128, head_dim_v=128,
                      page_size=16, window_left=None, dtype=torch.bfloat16, seed=5)
    q, k_cache, v_cache, table, _ = build_decode(case, "cuda")
    sizes = dict(num_q_heads=32, num_kv_heads=8, head_dim=128, page_size=16, window_left=window,
                 hopper=hopper, num_splits=2, return_lse=True)
    plan = swattn.plan_decode(lens, **sizes)
    assert plan.path == ("hopper" if hopper else "triton")
    sinks = torch.randn(32, device="cuda")
    out, lse = plan.run(q, k_cache, v_cache, table, sinks=sinks)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run(q, k_cache, v_cache, table, sinks=sinks, out=out, lse=lse)
    for new in ([1] * 64, [window, window + 1, window + 2] * 21 + [1],
                [x - 9000 for x in lens[:40]]):
        plan.replan(new)
        out.fill_(float("nan"))
        graph.replay()
        padded = new + [0] * (64 - len(new))
        want = swattn.plan_decode(padded, **sizes).run(q, k_cache, v_cache, table, sinks=sinks)
        torch.cuda.synchronize()
        assert torch.equal(out, want[0]) and torch.equal(lse, want[1])
        assert torch.all(out[len(new):] == 0)


def _paths():
    """One plan and its run for every kernel path a plan can choose."""
    ext, ext_sizes = _gpu_extend_case([(4100, 700), (0, 300)], 32, 8, 128, 16, 1023, 31)
    ext_t = build_extend(ext, "cuda")
    gpt, gpt_sizes = _gpu_extend_case([(8192, 1024)], 64, 8, 64, 16, 127, 32)
    gpt_t = build_extend(gpt, "cuda")
    dec = DecodeCase([5000, 100, 9000, 1], num_q_heads=32, num_kv_heads=8, head_dim=128,
                     head_dim_v=128, page_size=16, window_left=None, dtype=torch.bfloat16, seed=33)
    dec_t = build_decode(dec, "cuda")
    sparse = DecodeCase([300, 128], num_q_heads=16, num_kv_heads=1, head_dim=576, head_dim_v=512,
                        page_size=64, window_left=127, sparse_keys=64, pool_rows=256,
                        dtype=torch.bfloat16, seed=34)
    sparse_t = build_decode(sparse, "cuda")
    sinks32, sinks64 = torch.randn(32, device="cuda"), torch.randn(64, device="cuda")
    plans = {}
    for name, hopper, deterministic in (("extend-triton", False, False),
                                        ("extend-hopper", True, False),
                                        ("extend-single-pass", None, True)):
        plan = swattn.plan_extend(ext_t[6].tolist(), ext_t[7].tolist(), hopper=hopper,
                                  deterministic=deterministic, **ext_sizes)
        plans[name] = (plan, lambda p=plan: p.run(*ext_t[:6], sinks=sinks32))
    plan = swattn.plan_extend(gpt_t[6].tolist(), gpt_t[7].tolist(), **gpt_sizes)
    plans["extend-gpt-oss"] = (plan, lambda p=plan: p.run(*gpt_t[:6], sinks=sinks64))
    for name, hopper, splits in (("decode-triton", False, 1), ("decode-triton-splits", False, 3),
                                 ("decode-hopper", True, 1), ("decode-hopper-splits", True, 3)):
        plan = swattn.plan_decode(dec_t[4].tolist(), num_q_heads=32, num_kv_heads=8,
                                  head_dim=128, page_size=16, window_left=4095, hopper=hopper,
                                  num_splits=splits, return_lse=True)
        plans[name] = (plan, lambda p=plan: p.run(*dec_t[:4], sinks=sinks32))
    plan = swattn.plan_decode(sparse_t[4].tolist(), num_q_heads=16, num_kv_heads=1, head_dim=576,
                              head_dim_v=512, page_size=64, window_left=127, sparse_keys=64,
                              num_splits=2)
    pool = build_sparse(sparse, "cuda")
    plans["decode-sparse"] = (plan, lambda p=plan: p.run(*sparse_t[:4], sparse=pool))
    return plans


@pytest.mark.gpu
def test_gpu_no_run_waits_for_the_gpu():
    """Every kernel path's run (and its first, compiling call) under
    torch.cuda.set_sync_debug_mode("error"): a host sync would raise. The plans themselves
    (made from host lists) are made outside."""
    plans = _paths()
    assert {p.path for p, _ in plans.values()} == {"triton", "hopper", "single-pass"}
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for name, (_, run) in plans.items():
            run()
            run()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()


@pytest.mark.gpu
def test_gpu_fast_launch_gives_the_jit_launch_bits():
    """The first run of a plan goes through Triton's JIT, later ones through the compiled
    kernel's launcher with the arguments bound by swattn (ops/_launch.py): same bits."""
    for name, (_, run) in _paths().items():
        first = run()
        first = tuple(x.clone() for x in first) if isinstance(first, tuple) else first.clone()
        count = swattn.plan.compiled_launchers()
        again = run()
        # no new compile for the same layout
        assert swattn.plan.compiled_launchers() == count, name
        for a, b in zip(first if isinstance(first, tuple) else (first,),
                        again if isinstance(again, tuple) else (again,)):
            assert torch.equal(a, b), name



@pytest.mark.gpu
@pytest.mark.parametrize("path", ["triton", "hopper", "single-pass"])
def test_gpu_repeated_runs_relaunch_only_what_was_checked(path):
    """A run on the tensors (addresses, shapes, strides, dtypes) of an earlier run launches
    what that run assembled, without a host sync and with its bits; a tensor that differs
    in any of those is checked again, and a replan drops what the runs before it kept (the
    checks read the lengths): q too short for the new batch is refused, not launched."""
    case, sizes = _gpu_extend_case([(300, 9), (40, 7)], 64, 8, 64, 16, 127, 43)
    q, k, v, k_cache, v_cache, table, cu, prefix = build_extend(case, "cuda")
    kw = dict(hopper={"triton": False, "hopper": True, "single-pass": None}[path],
              deterministic=path == "single-pass")
    plan = swattn.plan_extend(cu.tolist(), prefix.tolist(), max_tokens=40, **kw, **sizes)
    assert plan.path == path
    sinks = _sinks(64, 43)
    out = torch.empty(16, 64, 64, dtype=torch.bfloat16, device="cuda")
    first = plan.run(q, k, v, k_cache, v_cache, table, sinks=sinks, out=out).clone()
    again = runs_without_sync(lambda: plan.run(q, k, v, k_cache, v_cache, table, sinks=sinks,
                                                out=out), out)
    assert all(torch.equal(a, first) for a in again)
    assert plan.relaunches == 1
    with pytest.raises(TypeError, match="sinks"):
        plan.run(q, k, v, k_cache, v_cache, table, sinks=sinks.half(), out=out)
    with pytest.raises(ValueError, match="out"):
        plan.run(q, k, v, k_cache, v_cache, table, sinks=sinks, out=out[:, :32])
    plan.replan([0, 20, 30], prefix.tolist())
    assert not plan.relaunches
    with pytest.raises(ValueError, match="q has 16 rows, the planned batch has 30 tokens"):
        plan.run(q, k, v, k_cache, v_cache, table, sinks=sinks, out=out)
    plan.replan(cu.tolist(), prefix.tolist())
    out.fill_(float("nan"))
    assert torch.equal(plan.run(q, k, v, k_cache, v_cache, table, sinks=sinks, out=out), first)
    # One-shot calls of one choice share what their runs kept, under their lengths'
    # addresses too; the kernel reads the lengths at launch.
    det = dict(deterministic=path == "single-pass")
    wants = []
    for lens in (prefix, torch.tensor([0, 3], dtype=torch.int32, device="cuda")):
        want = swattn.plan_extend(cu.tolist(), lens.tolist(), **det, **sizes).run(
            q, k, v, k_cache, v_cache, table, sinks=sinks)
        wants.append(want)
        for _ in range(3):
            got = swattn.extend_attention(q, k, v, k_cache, v_cache, table, cu, lens,
                                          window_left=127, sinks=sinks, out=out, **det)
            assert torch.equal(got, want)
    lens.copy_(prefix)
    got = swattn.extend_attention(q, k, v, k_cache, v_cache, table, cu, lens, window_left=127,
                                  sinks=sinks, out=out, **det)
    assert torch.equal(got, wants[0])


@pytest.mark.gpu
@pytest.mark.parametrize("hopper,splits", [(False, 1), (False, 3), (True, 1), (True, 3)],
                         ids=["triton", "triton-splits", "hopper", "hopper-splits"])
def test_gpu_repeated_decode_runs_relaunch_only_what_was_checked(hopper, splits):
    """As for extend: a decode run on an earlier run's tensors launches what it assembled
    (the split merge too), with its bits and no sync; a replan to lengths the block table
    cannot hold is refused, not launched."""
    case = DecodeCase([5000, 100, 2100, 1], num_q_heads=32, num_kv_heads=8, head_dim=128,
                      head_dim_v=128, page_size=16, window_left=4095, dtype=torch.bfloat16,
                      seed=44)
    q, k_cache, v_cache, table, seq_lens = build_decode(case, "cuda")
    plan = swattn.plan_decode(seq_lens.tolist(), num_q_heads=32, num_kv_heads=8, head_dim=128,
                              page_size=16, window_left=4095, hopper=hopper, num_splits=splits)
    sinks = _sinks(32, 44)
    out = torch.empty(4, 32, 128, dtype=torch.bfloat16, device="cuda")
    first = plan.run(q, k_cache, v_cache, table, sinks=sinks, out=out).clone()
    again = runs_without_sync(lambda: plan.run(q, k_cache, v_cache, table, sinks=sinks, out=out),
                               out)
    assert all(torch.equal(a, first) for a in again)
    assert plan.relaunches == 1
    plan.replan([table.shape[1] * 16 + 1, 1, 1, 1])
    with pytest.raises(ValueError, match="block_table must be"):
        plan.run(q, k_cache, v_cache, table, sinks=sinks, out=out)


@pytest.mark.gpu
@pytest.mark.parametrize("hopper", [False, True], ids=["triton", "hopper"])
def test_gpu_bad_page_on_every_path(hopper):
    """The Gluon paths (and the Triton kernels at real size) never dereference a bad page:
    the rows that needed it NaN, the rest the good run's bits."""
    case = ExtendCase([4100, 300], [700, 129], num_q_heads=32, num_kv_heads=8, head_dim=128,
                      head_dim_v=128, page_size=16, window_left=1023, dtype=torch.bfloat16,
                      seed=41)
    tensors = list(build_extend(case, "cuda"))
    good = run_extend(*tensors, window_left=1023, hopper=hopper)
    page = (4100 - 5) // 16  # seen by sequence 0's first new tokens
    for bad_id in BAD_IDS:
        bad_t = list(tensors)
        bad_t[5] = tensors[5].clone()
        bad_t[5][0, page] = bad_id
        bad = run_extend(*bad_t, window_left=1023, hopper=hopper)
        _assert_nan_where_needed(bad, good, _extend_needs(case, 0, page))
    dcase = DecodeCase([5000, 300, 4097], num_q_heads=32, num_kv_heads=8, head_dim=128,
                       head_dim_v=128, page_size=16, window_left=4095, dtype=torch.bfloat16,
                       seed=42)
    dt = list(build_decode(dcase, "cuda"))
    for splits in (1, 3):
        good = run_decode(*dt, window_left=4095, hopper=hopper, num_splits=splits)
        for bad_id in BAD_IDS:
            table = dt[3].clone()
            table[2, 100] = bad_id  # keys 1600..1615 of sequence 2 (window 1..4096)
            bad = run_decode(*dt[:3], table, dt[4], window_left=4095, hopper=hopper,
                             num_splits=splits)
            _assert_nan_where_needed(bad, good, torch.tensor([False, False, True], device="cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_gpu_one_shots_under_torch_compile(mode):
    """The one-shot functions traced whole (fullgraph) by torch.compile, and with
    mode="reduce-overhead" (CUDA graphs): the eager call's bits."""
    case, _ = _gpu_extend_case([(4100, 300), (0, 129)], 32, 8, 128, 16, 1023, 51)
    ext = build_extend(case, "cuda")
    dcase = DecodeCase([5000, 300], num_q_heads=32, num_kv_heads=8, head_dim=128,
                       head_dim_v=128, page_size=16, window_left=None, dtype=torch.bfloat16,
                       seed=52)
    dec = build_decode(dcase, "cuda")
    sinks = torch.randn(32, device="cuda")

    def layer(q, k, v, k_cache, v_cache, table, cu, prefix, dq, dk, dv, dtable, seq_lens):
        out, lse = swattn.extend_attention(q * 1.0, k, v, k_cache, v_cache, table, cu, prefix,
                                           window_left=1023, sinks=sinks, return_lse=True)
        dout = swattn.decode_attention(dq, dk, dv, dtable, seq_lens, window_left=4095, sinks=sinks)
        return out.float() * 2.0, lse, dout

    compiled = torch.compile(layer, fullgraph=True, mode=None if mode == "default" else mode)
    for _ in range(3):  # reduce-overhead records on a later call and then replays
        got = compiled(*ext, *dec)
    want = layer(*ext, *dec)
    torch.cuda.synchronize()
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@pytest.mark.gpu
def test_gpu_plans_of_other_dtypes_run_their_own_kernels():
    """Regression: the launch cache once keyed a compiled kernel by the plan's fixed values
    alone, so an fp16 plan's kernel ran a bf16 plan of the same sizes (relative error 1.19).
    Each dtype, each path, run in turn: each against the reference."""
    for hopper in (False, True):
        for dtype in (torch.float16, torch.bfloat16, torch.float16):
            case = ExtendCase([300, 0], [129, 64], num_q_heads=16, num_kv_heads=2, head_dim=64,
                              head_dim_v=64, page_size=16, window_left=127, dtype=dtype, seed=61)
            tensors = build_extend(case, "cuda")
            got = run_extend(*tensors, window_left=127, hopper=hopper)
            assert rel_err(got, reference.extend_attention(*tensors, window_left=127)) < 1e-2
            dcase = DecodeCase([300, 5000], num_q_heads=16, num_kv_heads=2, head_dim=64,
                               head_dim_v=64, page_size=16, window_left=None, dtype=dtype, seed=62)
            dec = build_decode(dcase, "cuda")
            for splits in (1, 2):
                got = run_decode(*dec, hopper=hopper, num_splits=splits)
                assert rel_err(got, reference.decode_attention(*dec)) < 1e-2
