"""fp8 KV caches: write_kv's quantization against the reference's, decode over an fp8 cache
(window, sparse pool, splits, sinks, per-tensor and per-KV-head scales) against the float64
reference on the dequantized cache, its bounds variants bit for bit, and the arguments a
plan refuses. Runs under the interpreter on the CPU (fp16 queries) and on the GPU (bf16 too:
tests/test_gpu.py)."""

import itertools

import pytest
import torch
from checks import (
    TOL,
    assert_bounds_identical,
    assert_matches_reference,
    latent_inputs,
    replay_after,
    runs_without_sync,
)
from conftest import DEVICE

import swattn
from swattn import reference
from swattn.plan import run_decode, run_extend
from swattn.verify.cases import DecodeCase, ExtendCase, build_decode, build_extend, build_sparse

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
IDS = {torch.float8_e4m3fn: "e4m3fn", torch.float8_e5m2: "e5m2"}


def _scales(per_head, heads, seed):
    """Random positive scales, one or one a KV head, so the stored values span the format."""
    g = torch.Generator().manual_seed(seed)
    n = heads if per_head else 1
    return ((torch.rand(n, generator=g) * 0.05 + 0.01).to(DEVICE),
            (torch.rand(n, generator=g) * 0.05 + 0.01).to(DEVICE))


def _fp8_decode_inputs(case, fp8, per_head):
    """build_decode's tensors with the cache quantized (NaN rows stay NaN; -1 pages stay -1),
    and the scales."""
    q, k_cache, v_cache, block_table, seq_lens = build_decode(case, DEVICE)
    k_scale, v_scale = _scales(per_head, case.num_kv_heads, case.seed)
    k8 = reference.quantize(k_cache, k_scale, fp8)
    v8 = reference.quantize(v_cache, v_scale, fp8)
    return (q, k8, v8, block_table, seq_lens), k_scale, v_scale


@pytest.mark.parametrize("fp8", FP8, ids=IDS.get)
@pytest.mark.parametrize("per_head", [False, True], ids=["per-tensor", "per-head"])
def test_write_kv_stores_what_the_reference_quantizes(fp8, per_head):
    g = torch.Generator().manual_seed(3)
    tokens, heads, d, dv = 11, 3, 24, 20
    # Large values too: they saturate to the format's largest finite value.
    k = (torch.randn(tokens, heads, d, generator=g) * 30).to(torch.float16).to(DEVICE)
    k[0, 0, :4] = torch.tensor([60000.0, -60000.0, 1e-7, -1e-7])
    v = torch.randn(tokens, heads, dv, generator=g).to(torch.float16).to(DEVICE)
    k_scale, v_scale = _scales(per_head, heads, 5)
    k_cache = torch.full((4, 8, heads, d), float("nan"), device=DEVICE).to(fp8)
    v_cache = torch.full((4, 8, heads, dv), float("nan"), device=DEVICE).to(fp8)
    slots = torch.tensor([0, 5, 9, -1, 31, 32, 12, 13, 14, 40, 1], device=DEVICE)
    swattn.write_kv(k, v, k_cache, v_cache, slots, k_scale=k_scale, v_scale=v_scale)
    written = set()
    for t, slot in enumerate(slots.tolist()):
        if not 0 <= slot < 32:
            continue
        written.add(slot)
        page, row = divmod(slot, 8)
        # Values, not bits: under the interpreter a negative value that rounds to zero is
        # stored as +0 (the GPU stores -0, as torch does).
        assert torch.equal(k_cache[page, row].float(),
                           reference.quantize(k[t], k_scale, fp8).float())
        assert torch.equal(v_cache[page, row].float(),
                           reference.quantize(v[t], v_scale, fp8).float())
    limit = torch.finfo(fp8).max  # saturated, not inf or NaN
    assert k_cache[0, 0, 0, :2].float().tolist() == [limit, -limit]
    untouched = [s for s in range(32) if s not in written]
    for slot in untouched:  # -1, 32 and 40 wrote nothing
        assert torch.isnan(k_cache.view(32, heads, d)[slot].float()).all()


@pytest.mark.parametrize("fp8", FP8, ids=IDS.get)
@pytest.mark.parametrize("per_head", [False, True], ids=["per-tensor", "per-head"])
@pytest.mark.parametrize("case, kwargs", [
    (DecodeCase([37, 1, 70], num_q_heads=4, num_kv_heads=2, head_dim=32, head_dim_v=32,
                page_size=16, window_left=20, seed=1), {"num_splits": 1}),
    (DecodeCase([65, 17], num_q_heads=6, num_kv_heads=2, head_dim=24, head_dim_v=16,
                page_size=4, window_left=None, seed=2), {"num_splits": 3, "return_lse": True}),
    (DecodeCase([33, 15, 1], num_q_heads=8, num_kv_heads=1, head_dim=40, head_dim_v=16,
                page_size=16, window_left=14, sparse_keys=17, seed=3), {"num_splits": 2}),
], ids=["window", "full-lse-splits", "sparse"])
def test_decode_over_an_fp8_cache_matches_the_dequantized_reference(fp8, per_head, case, kwargs):
    tensors, k_scale, v_scale = _fp8_decode_inputs(case, fp8, per_head)
    kw = dict(kwargs, window_left=case.window_left, k_scale=k_scale, v_scale=v_scale,
              sinks=torch.randn(case.num_q_heads,
                                generator=torch.Generator().manual_seed(9)).to(DEVICE))
    if case.sparse_keys:
        k_pool, v_pool, idx = build_sparse(case, DEVICE)
        kw["sparse"] = (reference.quantize(k_pool, k_scale, fp8),
                        reference.quantize(v_pool, v_scale, fp8), idx)
    got = assert_bounds_identical([run_decode(*tensors, bounds=b, **kw)
                                   for b in ("tight", "skip", "none")])
    want = reference.decode_attention(*tensors, **kw)
    assert_matches_reference(got, want)


def check_latent(case, fp8, kwargs, tol):
    """A latent cache over ``fp8`` (None: the queries' dtype), the values the keys' first
    columns under the keys' scale, in the Triton kernel (``hopper=False``: on sm_90 S's
    heads otherwise take the Gluon latent path, tests/test_decode_latent.py): the same bits
    as the values given as their own copy, every bounds variant, and the reference's
    answer."""
    if fp8 is None:
        tensors = build_decode(case, DEVICE)
        k_scale = None
        k_pool, _, idx = build_sparse(case, DEVICE)
    else:
        tensors, k_scale, _ = _fp8_decode_inputs(case, fp8, True)
        k_pool, _, idx = build_sparse(case, DEVICE)
        k_pool = reference.quantize(k_pool, k_scale, fp8)
    latent, copied = latent_inputs(case, tensors, (k_pool, None, idx))
    q, k_cache, _, block_table, seq_lens = tensors
    sinks = torch.randn(case.num_q_heads, generator=torch.Generator().manual_seed(9)).to(DEVICE)
    kw = dict(kwargs, window_left=case.window_left, k_scale=k_scale, v_scale=k_scale, sinks=sinks)
    results = []
    for v_cache, sparse in (latent, copied):
        results.append(assert_bounds_identical([
            run_decode(q, k_cache, v_cache, block_table, seq_lens, sparse=sparse, bounds=b,
                       hopper=False, **kw)
            for b in ("tight", "skip", "none")]))
    assert all(torch.equal(a, b) for a, b in zip(*results))
    assert_matches_reference(results[0], reference.decode_attention(
        q, k_cache, latent[0], block_table, seq_lens, sparse=latent[1], **kw), tol=tol)


@pytest.mark.parametrize("fp8", FP8, ids=IDS.get)
def test_a_latent_fp8_cache_reads_values_from_the_key_tiles(fp8):
    check_latent(DecodeCase([33, 15, 1], num_q_heads=8, num_kv_heads=1, head_dim=40,
                            head_dim_v=32, page_size=16, window_left=14, sparse_keys=17, seed=43),
                 fp8, {"num_splits": 2, "return_lse": True}, 5e-3)


def test_fp8_products_are_asked_for_and_say_why_a_plan_cannot_take_them():
    """``plan_extend(fp8_products=True)``: a bool, over an fp8 cache, on the Hopper path only
    (off sm_90 the plan names the reason); on sm_90 the plan runs that path with them."""
    kw = dict(num_q_heads=4, num_kv_heads=2, head_dim=64, page_size=16, window_left=15,
              device=DEVICE)
    e4m3 = torch.float8_e4m3fn
    with pytest.raises(TypeError, match="fp8_products"):
        swattn.plan_extend([0, 5], [3], kv_dtype=e4m3, fp8_products=1, **kw)
    with pytest.raises(ValueError, match="needs an fp8 cache"):
        swattn.plan_extend([0, 5], [3], fp8_products=True, **kw)
    for bad in ({"hopper": False}, {"deterministic": True}):
        with pytest.raises(ValueError, match="runs on the Hopper path"):
            swattn.plan_extend([0, 5], [3], kv_dtype=e4m3, fp8_products=True, **bad, **kw)
    with pytest.raises(TypeError, match="config must be a dict"):
        swattn.plan_extend([0, 5], [3], kv_dtype=e4m3, fp8_products=True, config=object(), **kw)
    if DEVICE == "cuda" and torch.cuda.get_device_capability() == (9, 0):
        plan = swattn.plan_extend([0, 5], [3], kv_dtype=e4m3, fp8_products=True, **kw)
        assert plan.path == "hopper" and plan.spec.config.fp8_products
        # Not asked for, an fp8 plan keeps the products in the queries' precision.
        plan = swattn.plan_extend([0, 5], [3], kv_dtype=e4m3, hopper=True, **kw)
        assert plan.path == "hopper" and not plan.spec.config.fp8_products
        with pytest.raises(ValueError, match="needs an fp8 cache"):
            swattn.plan_extend([0, 5], [3], hopper=True, config={"fp8_products": True}, **kw)
    else:
        with pytest.raises(ValueError, match="fp8_products=True: the Hopper path cannot take"):
            swattn.plan_extend([0, 5], [3], kv_dtype=e4m3, fp8_products=True, **kw)


def test_an_fp8_decode_plan_checks_its_scales_and_cache():
    case = DecodeCase([9, 20], num_q_heads=4, num_kv_heads=2, head_dim=16, head_dim_v=16,
                      page_size=4, window_left=7, seed=4)
    (q, k8, v8, table, lens), k_scale, v_scale = _fp8_decode_inputs(case, torch.float8_e4m3fn, True)
    plan = swattn.plan_decode([9, 20], num_q_heads=4, num_kv_heads=2, head_dim=16, page_size=4,
                              window_left=7, kv_dtype=torch.float8_e4m3fn, dtype=q.dtype,
                              device=DEVICE)
    assert plan.path == "triton"
    out = plan.run(q, k8, v8, table, k_scale=k_scale, v_scale=v_scale)
    assert not torch.isnan(out).any()
    with pytest.raises(ValueError, match="k_scale must be"):
        plan.run(q, k8, v8, table, k_scale=torch.ones(3, device=DEVICE), v_scale=v_scale)
    with pytest.raises(TypeError, match="v_scale must be float32"):
        plan.run(q, k8, v8, table, k_scale=k_scale, v_scale=v_scale.double())
    # Per KV head, strided: refused (the kernels step one element a head).
    with pytest.raises(ValueError, match="k_scale must be contiguous"):
        plan.run(q, k8, v8, table, k_scale=k_scale.repeat_interleave(2)[::2], v_scale=v_scale)
    with pytest.raises(TypeError, match="k_cache must be"):
        plan.run(q, k8.to(q.dtype), v8, table)
    # A cache of the queries' dtype takes no scales.
    plain = swattn.plan_decode([9, 20], num_q_heads=4, num_kv_heads=2, head_dim=16, page_size=4,
                               dtype=q.dtype, device=DEVICE)
    with pytest.raises(ValueError, match="k_scale applies to fp8 caches"):
        plain.run(q, k8.to(q.dtype), v8.to(q.dtype), table, k_scale=k_scale)
    with pytest.raises(ValueError, match="kv_dtype must be"):
        swattn.plan_decode([9], num_q_heads=4, num_kv_heads=2, head_dim=16, page_size=4,
                           kv_dtype=torch.int8, dtype=q.dtype, device=DEVICE)
    with pytest.raises(ValueError, match="k_scale applies to fp8 caches"):
        swattn.write_kv(q[:, :2], q[:, :2], k8.to(q.dtype), v8.to(q.dtype),
                        torch.zeros(2, dtype=torch.int64, device=DEVICE), k_scale=k_scale)


def test_the_custom_ops_take_fp8_caches_and_scales():
    """The fake (meta) implementations of the decode and write_kv ops (the torch.compile
    path) with an fp8 cache and its scales (torch's schema check multiplies inputs, which
    fp8 on the CPU cannot)."""
    case = DecodeCase([9, 4], window_left=4, seed=7)
    (q, k8, v8, table, lens), k_scale, v_scale = _fp8_decode_inputs(case, torch.float8_e4m3fn, True)
    out = torch.zeros(2, 4, 16, dtype=torch.float16, device=DEVICE)
    torch.library.opcheck(torch.ops.swattn.decode_attention.default,
                          (q, k8, v8, table, lens, None, None, None, None, out,
                           None, k_scale, v_scale, 4, -1, 0.0, 0.0, 1),
                          test_utils=("test_faketensor",))
    k = torch.randn(3, 2, 16,
                    generator=torch.Generator().manual_seed(1)).to(torch.float16).to(DEVICE)
    slots = torch.tensor([0, 5, -1], device=DEVICE)
    torch.library.opcheck(torch.ops.swattn.write_kv.default,
                          (k, k, k8.clone(), v8.clone(), slots, k_scale, v_scale),
                          test_utils=("test_faketensor",))


def test_fp8_scales_default_to_one():
    case = DecodeCase([30], num_q_heads=2, num_kv_heads=1, head_dim=16, head_dim_v=16,
                      page_size=8, window_left=None, seed=6)
    q, k_cache, v_cache, table, lens = build_decode(case, DEVICE)
    k8, v8 = k_cache.to(torch.float8_e4m3fn), v_cache.to(torch.float8_e4m3fn)
    got = swattn.decode_attention(q, k8, v8, table, lens)
    assert_matches_reference(got, reference.decode_attention(q, k8, v8, table, lens))


@pytest.mark.parametrize("fp8", FP8, ids=IDS.get)
def test_new_rows_are_what_write_kv_stores(fp8):
    """The Hopper extend path over an fp8 cache reads the new keys and values from rows
    quantized before it (ops.cache.NewRowsLaunch): the bits write_kv stores for them, or
    their values in fp16."""
    from swattn.ops.cache import NewRowsLaunch
    g = torch.Generator().manual_seed(41)
    tokens, heads, d, dv = 7, 3, 24, 20
    k = (torch.randn(tokens, heads, d, generator=g) * 20).to(torch.float16).to(DEVICE)
    v = torch.randn(tokens, heads, dv, generator=g).to(torch.float16).to(DEVICE)
    k_scale, v_scale = _scales(True, heads, 42)
    v_scale = v_scale[:1]  # one per KV head for K, one for the tensor for V
    k_rows = torch.full((tokens, heads, d), float("nan"), device=DEVICE).to(fp8)
    v_rows = torch.full((tokens, heads, dv), float("nan"), device=DEVICE).to(fp8)
    NewRowsLaunch(heads, d, dv, (1, 0), (torch.float16, fp8))(k, v, k_rows, v_rows,
                                                                (k_scale, v_scale))
    k_cache = torch.full((tokens, 1, heads, d), float("nan"), device=DEVICE).to(fp8)
    v_cache = torch.full((tokens, 1, heads, dv), float("nan"), device=DEVICE).to(fp8)
    swattn.write_kv(k, v, k_cache, v_cache, torch.arange(tokens, device=DEVICE),
                    k_scale=k_scale, v_scale=v_scale)
    assert torch.equal(k_rows.view(torch.uint8), k_cache[:, 0].view(torch.uint8))
    assert torch.equal(v_rows.view(torch.uint8), v_cache[:, 0].view(torch.uint8))
    # As fp16 rows holding the fp8 values (what the default products' copies read): the
    # same values, exactly (the cache's NaN-free rows: every fp8 value is an fp16 one).
    k16 = torch.full((tokens, heads, d), float("nan"), device=DEVICE, dtype=torch.float16)
    v16 = torch.full((tokens, heads, dv), float("nan"), device=DEVICE, dtype=torch.float16)
    NewRowsLaunch(heads, d, dv, (1, 0), (torch.float16, torch.float16, fp8), fp8)(
        k, v, k16, v16, (k_scale, v_scale))
    assert torch.equal(k16, k_cache[:, 0].to(torch.float16))
    assert torch.equal(v16, v_cache[:, 0].to(torch.float16))


def _fp8_extend_inputs(case, fp8, per_head):
    """build_extend's tensors with the cache quantized (NaN rows stay NaN), and the scales."""
    q, k, v, k_cache, v_cache, *rest = build_extend(case, DEVICE)
    k_scale, v_scale = _scales(per_head, case.num_kv_heads, case.seed)
    return ((q, k, v, reference.quantize(k_cache, k_scale, fp8),
             reference.quantize(v_cache, v_scale, fp8), *rest), k_scale, v_scale)


@pytest.mark.parametrize("fp8", FP8, ids=IDS.get)
@pytest.mark.parametrize("per_head", [False, True], ids=["per-tensor", "per-head"])
@pytest.mark.parametrize("deterministic", [False, True], ids=["two-stage", "deterministic"])
@pytest.mark.parametrize("case", [
    ExtendCase([0, 37, 5], [9, 21, 1], num_q_heads=4, num_kv_heads=2, head_dim=32, head_dim_v=32,
               page_size=16, window_left=20, seed=11),
    ExtendCase([19, 0], [14, 30], num_q_heads=6, num_kv_heads=2, head_dim=24, head_dim_v=16,
               page_size=4, window_left=None, seed=12),
], ids=["window", "full-odd-dims"])
def test_extend_over_an_fp8_cache_matches_the_dequantized_reference(fp8, per_head, deterministic,
                                                                      case):
    tensors, k_scale, v_scale = _fp8_extend_inputs(case, fp8, per_head)
    kw = dict(window_left=case.window_left, k_scale=k_scale, v_scale=v_scale,
              deterministic=deterministic,
              sinks=torch.randn(case.num_q_heads,
                                generator=torch.Generator().manual_seed(8)).to(DEVICE))
    got = assert_bounds_identical([run_extend(*tensors, bounds=b, **kw)
                                   for b in ("tight", "skip", "none")])
    want = reference.extend_attention(*tensors, **kw)
    assert_matches_reference(got, want)


def test_fp8_deterministic_extend_does_not_depend_on_the_chunking():
    """A request prefilled in one chunk and in three (each chunk's keys written to the fp8
    cache by write_kv before the next) gives the same bits: the new keys are taken as the
    cache stores them."""
    fp8, heads, d, page = torch.float8_e4m3fn, (4, 2), 16, 8
    g = torch.Generator().manual_seed(21)
    total = 29
    q = torch.randn(total, heads[0], d, generator=g).to(torch.float16).to(DEVICE)
    k = torch.randn(total, heads[1], d, generator=g).to(torch.float16).to(DEVICE)
    v = torch.randn(total, heads[1], d, generator=g).to(torch.float16).to(DEVICE)
    k_scale, v_scale = _scales(True, heads[1], 22)
    pages = -(-total // page)
    table = torch.arange(pages, dtype=torch.int32, device=DEVICE)[None]

    def prefill(cuts):
        k_cache = torch.full((pages, page, heads[1], d), float("nan"), device=DEVICE).to(fp8)
        v_cache = torch.full((pages, page, heads[1], d), float("nan"), device=DEVICE).to(fp8)
        outs = []
        for lo, hi in zip(cuts, cuts[1:]):
            lens = (torch.tensor([0, hi - lo], dtype=torch.int32, device=DEVICE),
                    torch.tensor([lo], dtype=torch.int32, device=DEVICE))
            outs.append(swattn.extend_attention(q[lo:hi], k[lo:hi], v[lo:hi], k_cache, v_cache,
                                                table, *lens, window_left=11, deterministic=True,
                                                k_scale=k_scale, v_scale=v_scale))
            swattn.write_kv(k[lo:hi], v[lo:hi], k_cache, v_cache,
                            torch.arange(lo, hi, device=DEVICE), k_scale=k_scale, v_scale=v_scale)
        return torch.cat(outs)

    assert torch.equal(prefill([0, total]), prefill([0, 7, 20, total]))


# ---- on the GPU: bf16 queries, real sizes, the engine path --------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("fp8", FP8, ids=IDS.get)
@pytest.mark.parametrize("per_head", [False, True], ids=["per-tensor", "per-head"])
def test_gpu_bf16_queries_over_fp8_caches(fp8, per_head):
    """Decode (window, full attention with splits, sparse) and extend (two-stage and
    deterministic) at the workloads' head shapes, bf16 queries, against the float64
    reference over the same fp8 cache; every bounds variant bit-identical."""
    if DEVICE != "cuda":
        pytest.skip("bf16 products under the interpreter are broken (tests/test_gpu.py)")
    sinks = torch.randn(64, generator=torch.Generator().manual_seed(31)).cuda()
    dcases = [
        (DecodeCase([5000, 129, 40], num_q_heads=64, num_kv_heads=8, head_dim=64, head_dim_v=64,
                    page_size=16, window_left=127, dtype=torch.bfloat16, seed=31), {}),
        (DecodeCase([9000, 4100], num_q_heads=32, num_kv_heads=8, head_dim=128, head_dim_v=128,
                    page_size=16, window_left=None, dtype=torch.bfloat16, seed=32),
         {"num_splits": 4, "return_lse": True}),
        (DecodeCase([700, 300], num_q_heads=64, num_kv_heads=1, head_dim=576, head_dim_v=512,
                    page_size=64, window_left=127, sparse_keys=480, pool_rows=900,
                    dtype=torch.bfloat16, seed=33), {"num_splits": 2}),
    ]
    for case, kwargs in dcases:
        tensors, k_scale, v_scale = _fp8_decode_inputs(case, fp8, per_head)
        kw = dict(kwargs, window_left=case.window_left, k_scale=k_scale, v_scale=v_scale,
                  sinks=sinks[:case.num_q_heads])
        if case.sparse_keys:
            k_pool, v_pool, idx = build_sparse(case, "cuda")
            kw["sparse"] = (reference.quantize(k_pool, k_scale, fp8),
                            reference.quantize(v_pool, v_scale, fp8), idx)
        got = assert_bounds_identical([run_decode(*tensors, bounds=b, **kw)
                                       for b in ("tight", "skip", "none")])
        assert_matches_reference(got, reference.decode_attention(*tensors, **kw), tol=1e-2)
    ecase = ExtendCase([4100, 0, 700], [700, 1025, 129], num_q_heads=64, num_kv_heads=8,
                       head_dim=64, head_dim_v=64, page_size=16, window_left=127,
                       dtype=torch.bfloat16, seed=34)
    tensors, k_scale, v_scale = _fp8_extend_inputs(ecase, fp8, per_head)
    for deterministic in (False, True):
        kw = dict(window_left=127, k_scale=k_scale, v_scale=v_scale, sinks=sinks,
                  deterministic=deterministic)
        got = assert_bounds_identical([run_extend(*tensors, bounds=b, **kw)
                                       for b in ("tight", "skip", "none")])
        assert_matches_reference(got, reference.extend_attention(*tensors, **kw), tol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", (None,) + FP8, ids=lambda x: "bf16" if x is None else IDS[x])
def test_gpu_latent_cache_at_s_shape(fp8):
    """S's heads (64 query heads on one KV head, 576 key columns, values their first 512),
    bf16 queries over a bf16 or fp8 latent cache: the one-load kernel gives the bits of the
    values as their own copy, and the reference's answer."""
    if DEVICE != "cuda":
        pytest.skip("bf16 products under the interpreter are broken (tests/test_gpu.py)")
    case = DecodeCase([700, 300, 129], num_q_heads=64, num_kv_heads=1, head_dim=576,
                      head_dim_v=512, page_size=64, window_left=127, sparse_keys=480,
                      pool_rows=900, dtype=torch.bfloat16, seed=35)
    for splits in (1, 2):
        check_latent(case, fp8, {"num_splits": splits, "return_lse": True}, 1e-2)


# The Hopper decode path over fp8 caches: windows starting mid-page and mid-tile, a key of
# one, pages below, at and above the 64-key tile, groups of 4 to 64 (20: a second head
# block of 4 rows; 12: one block of 16 live rows), splits, sinks, soft-cap, lse, fp16 and
# bf16 queries, d64 and d128.
HOPPER_FP8_CASES = [
    (DecodeCase([1, 63, 64, 65, 200, 4133], num_q_heads=32, num_kv_heads=8, head_dim=128,
                head_dim_v=128, page_size=16, window_left=127, dtype=torch.bfloat16, seed=81),
     {"num_splits": 1}),
    (DecodeCase([9000, 31, 4096], num_q_heads=16, num_kv_heads=4, head_dim=128, head_dim_v=128,
                page_size=16, window_left=None, dtype=torch.bfloat16, seed=82),
     {"num_splits": 3, "return_lse": True, "sinks": True}),
    (DecodeCase([4097, 5000, 17], num_q_heads=8, num_kv_heads=1, head_dim=64, head_dim_v=64,
                page_size=32, window_left=4095, dtype=torch.float16, seed=83),
     {"num_splits": 2, "sinks": True, "softcap": 20.0}),
    (DecodeCase([300, 1, 129], num_q_heads=64, num_kv_heads=1, head_dim=128, head_dim_v=128,
                page_size=128, window_left=100, dtype=torch.bfloat16, seed=84),
     {"return_lse": True}),
    (DecodeCase([700, 2048], num_q_heads=40, num_kv_heads=2, head_dim=64, head_dim_v=64,
                page_size=64, window_left=1000, dtype=torch.float16, seed=85),
     {"num_splits": 2, "return_lse": True}),
    # A group of 12: one 16-row program whose softmax runs over all 16 rows.
    (DecodeCase([4200, 90, 129], num_q_heads=24, num_kv_heads=2, head_dim=128, head_dim_v=128,
                page_size=16, window_left=1000, dtype=torch.bfloat16, seed=86),
     {"return_lse": True, "sinks": True}),
]


def _second_sub_tile_page(seq_len, window_left, page_size, tile=128):
    """A page all of whose keys lie in the second 64-key half of a ``tile``-key tile and are
    visible to a sequence of ``seq_len`` keys (the highest such), or None."""
    lo = 0 if window_left is None else max(seq_len - 1 - window_left, 0)
    if page_size > tile // 2:
        return None
    keys = [k for k in range(lo, seq_len) if k % tile >= tile // 2]
    return keys[-1] // page_size if keys else None


def _hopper_fp8_run(run, want, tensors, case, kwargs, k_scale, v_scale, config=None, tol=1e-2,
                    lse_tol=1e-2):
    """A case on a Hopper path over an fp8 cache (``run``: run_decode or run_extend; ``want``:
    the reference's function; ``config``: a dict tuning the path): its bounds variants
    bit-identical and within ``tol`` (the lse ``lse_tol``) of the reference over the same
    cache. Returns (the run's keyword arguments, its output)."""
    kw = dict(kwargs, window_left=case.window_left, k_scale=k_scale, v_scale=v_scale)
    if kw.pop("sinks", False):
        kw["sinks"] = torch.randn(case.num_q_heads, generator=torch.Generator().manual_seed(
            case.seed)).cuda()
    got = assert_bounds_identical([run(*tensors, bounds=b, hopper=True, config=config, **kw)
                                   for b in ("tight", "skip", "none")])
    assert_matches_reference(got, want(*tensors, **kw), tol=tol, lse_tol=lse_tol)
    return kw, got[0] if isinstance(got, tuple) else got


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", FP8, ids=IDS.get)
@pytest.mark.parametrize("per_head", [False, True], ids=["per-tensor", "per-head"])
def test_gpu_hopper_decode_over_fp8_caches(fp8, per_head):
    """The Gluon decode path over an fp8 cache (TMA'd fp8 pages widened to fp16 in registers
    for mma.sync, groups of 4, 8 and 12 in one 16-row program, 20 and 64 in head blocks):
    its bounds variants bit-identical, within rounding of the float64 reference over the
    same cache, and a bad page's rows NaN (the poison rows read in its place; the page of
    the last key, and one in a tile's second sub-tile) with every other row the good run's
    bits, with one work item a program and with three; three give the same bits as one."""
    if DEVICE != "cuda":
        pytest.skip("CUDA only")
    for case, kwargs in HOPPER_FP8_CASES:
        tensors, k_scale, v_scale = _fp8_decode_inputs(case, fp8, per_head)
        kw, out = _hopper_fp8_run(run_decode, reference.decode_attention, tensors, case, kwargs,
                                  k_scale, v_scale)
        # Three work items a program (the ring running on across them, the last program's
        # items past the batch's): the same bits.
        items = run_decode(*tensors, hopper=True, config={"items": 3}, **kw)
        assert torch.equal(items[0] if isinstance(items, tuple) else items, out)
        # Bad pages of sequence 0: the one holding its last key (visible to it under every
        # window), and one confined to a tile's second 64-key sub-tile where it has one.
        second = _second_sub_tile_page(case.seq_lens[0], case.window_left, case.page_size)
        for page in [(case.seq_lens[0] - 1) // case.page_size] + [second] * (second is not None):
            table = tensors[3].clone()
            table[0, page] = -1
            for config in ({}, {"items": 3}):
                bad = run_decode(*tensors[:3], table, tensors[4], hopper=True, config=config,
                                 **kw)
                bad = bad[0] if isinstance(bad, tuple) else bad
                assert torch.isnan(bad[0]).all(), (page, config)
                assert torch.equal(bad[1:], out[1:])


# The Hopper extend path over fp8 caches: windows long (tight runs warp-specialized for
# 16-bit caches too) and short, full attention with prefix 0, pages of 16 to 128, odd
# groups, sinks, soft-cap, lse, fp16 and bf16 queries, d64 and d128.
HOPPER_EXTEND_FP8_CASES = [
    (ExtendCase([4100, 0, 700], [700, 1025, 129], num_q_heads=32, num_kv_heads=8, head_dim=128,
                head_dim_v=128, page_size=16, window_left=4095, dtype=torch.bfloat16, seed=91),
     {"sinks": True}),
    (ExtendCase([70, 1, 2000], [300, 64, 65], num_q_heads=6, num_kv_heads=2, head_dim=64,
                head_dim_v=64, page_size=64, window_left=127, dtype=torch.float16, seed=92),
     {"softcap": 20.0, "return_lse": True}),
    (ExtendCase([0, 1500], [1000, 129], num_q_heads=8, num_kv_heads=1, head_dim=128,
                head_dim_v=128, page_size=128, window_left=None, dtype=torch.bfloat16, seed=93),
     {"return_lse": True, "sinks": True}),
    (ExtendCase([300, 129], [200, 77], num_q_heads=4, num_kv_heads=2, head_dim=64,
                head_dim_v=64, page_size=32, window_left=None, dtype=torch.bfloat16, seed=94),
     {"causal": False, "window_right": 50}),
]


@pytest.mark.gpu
@pytest.mark.parametrize("products", ["fp16", "fp8"], ids=["fp16-products", "fp8-products"])
@pytest.mark.parametrize("rows", [64, 128], ids=["64-rows", "128-rows"])
@pytest.mark.parametrize("fp8", FP8, ids=IDS.get)
@pytest.mark.parametrize("per_head", [False, True], ids=["per-tensor", "per-head"])
def test_gpu_hopper_extend_over_fp8_caches(fp8, per_head, rows, products):
    """The Gluon extend path over an fp8 cache (fp8 pages and the new rows, quantized before
    the kernel, widened to fp16 in place by the converter warps), with one warpgroup a
    program or two (128 rows): its bounds variants bit-identical, within rounding of the
    float64 reference over the same cache (new keys taken as the cache stores them), and a
    bad page's rows NaN (the poison rows read in its place) with every other sequence's
    rows the good run's bits. With fp8 products (the query rows and the weights quantized
    to e4m3, the converter transposing V) the same within 8e-2 of the reference (the lse
    within 0.25: it failed 1e-2), and a query row of zeros among them (its scale)."""
    if DEVICE != "cuda":
        pytest.skip("CUDA only")
    from swattn.ops.config import HOPPER_EXTEND_128_ROWS
    tiling = dict(HOPPER_EXTEND_128_ROWS) if rows == 128 else {}
    tiling["fp8_products"] = products == "fp8"
    for case, kwargs in HOPPER_EXTEND_FP8_CASES:
        tensors, k_scale, v_scale = _fp8_extend_inputs(case, fp8, per_head)
        if products == "fp8":
            tensors[0][1, 0] = 0.0  # a query row of zeros: finite, as the reference's
        kw, out = _hopper_fp8_run(run_extend, reference.extend_attention, tensors, case, kwargs,
                                  k_scale, v_scale, tiling,
                                  *((8e-2, 0.25) if products == "fp8" else (1e-2, 1e-2)))
        # The last prefix page of the longest prefix: its first new token sees that page's
        # last key under every window.
        i = max(range(len(case.prefix_lens)), key=lambda s: case.prefix_lens[s])
        table = tensors[5].clone()
        table[i, (case.prefix_lens[i] - 1) // case.page_size] = -1
        bad = run_extend(*tensors[:5], table, *tensors[6:], hopper=True, config=tiling, **kw)
        bad = bad[0] if isinstance(bad, tuple) else bad
        rows = torch.arange(out.shape[0], device=out.device)
        first, end = tensors[6][i].item(), tensors[6][i + 1].item()
        assert torch.isnan(bad[first]).all()
        other = (rows < first) | (rows >= end)
        assert torch.equal(bad[other], out[other])


@pytest.mark.gpu
def test_gpu_fp8_plans_relaunch_without_sync_and_replay_in_a_graph():
    """A plan over an fp8 cache: its repeated runs (scales included in what the run's key
    fixes) relaunch without a host sync and with the first run's bits; a CUDA graph of a
    run replays them; a scale of another shape is checked, not relaunched."""
    if DEVICE != "cuda":
        pytest.skip("CUDA only")
    fp8 = torch.float8_e4m3fn
    case = DecodeCase([5000, 100, 2100, 1], num_q_heads=32, num_kv_heads=8, head_dim=128,
                      head_dim_v=128, page_size=16, window_left=4095, dtype=torch.bfloat16,
                      seed=35)
    (q, k8, v8, table, lens), k_scale, v_scale = _fp8_decode_inputs(case, fp8, True)
    dplan = swattn.plan_decode(lens.tolist(), num_q_heads=32, num_kv_heads=8, head_dim=128,
                               page_size=16, window_left=4095, kv_dtype=fp8)
    assert dplan.path == "hopper"
    out = torch.empty(4, 32, 128, dtype=torch.bfloat16, device="cuda")
    ecase = ExtendCase([4100, 300], [700, 129], num_q_heads=32, num_kv_heads=8, head_dim=128,
                       head_dim_v=128, page_size=16, window_left=1023, dtype=torch.bfloat16,
                       seed=36)
    etensors, ek, ev = _fp8_extend_inputs(ecase, fp8, False)
    eplan = swattn.plan_extend([0, 700, 829], [4100, 300], num_q_heads=32, num_kv_heads=8,
                               head_dim=128, page_size=16, window_left=1023, kv_dtype=fp8)
    eout = torch.empty(829, 32, 128, dtype=torch.bfloat16, device="cuda")
    for plan, run, o in (
            (dplan, lambda: dplan.run(q, k8, v8, table, k_scale=k_scale, v_scale=v_scale, out=out),
             out),
            (eplan, lambda: eplan.run(*etensors[:6], k_scale=ek, v_scale=ev, out=eout), eout)):
        first = run().clone()
        assert all(torch.equal(r, first) for r in runs_without_sync(run, o))
        assert plan.relaunches == 1
        replay_after(run, lambda: None, o)
        assert torch.equal(o, first)
    with pytest.raises(ValueError, match="k_scale must be"):
        dplan.run(q, k8, v8, table, k_scale=torch.ones(3, device="cuda"), v_scale=v_scale, out=out)


def test_fp8_decode_takes_two_work_items_a_program_past_one_wave():
    """Two work items a program where one a program is past a wave (2 x 132 slots on an
    H200) and half the grid still fills 95% of it (C-B's 512 items), else one (C-F's 8
    splits of 32 items: one wave)."""
    from swattn.ops.config import hopper_decode_config
    cfg = hopper_decode_config(128, torch.bfloat16, torch.float8_e4m3fn)
    assert [cfg.items_for(n, 132) for n in (512, 2048, 501, 500, 264, 256, 1)] == [2, 2, 2, 1,
                                                                                   1, 1, 1]


@pytest.mark.gpu
def test_gpu_fp8_decode_plans_choose_their_work_items():
    """The plan's work items a program: by items_for over an fp8 cache (C-B's shape 2 on an
    H200, C-F's 1), what a config dict names if it names it, 1 over a 16-bit cache."""
    if DEVICE != "cuda":
        pytest.skip("CUDA only")
    e4m3 = torch.float8_e4m3fn
    slots = 2 * torch.cuda.get_device_properties(0).multi_processor_count
    cb = dict(num_q_heads=32, num_kv_heads=8, head_dim=128, page_size=16, window_left=4095)
    plan = swattn.plan_decode([4097] * 64, kv_dtype=e4m3, **cb)
    assert plan.path == "hopper"
    assert plan.config.items == (2 if 256 >= 0.95 * slots else 1)
    assert swattn.plan_decode([4097] * 64, kv_dtype=e4m3, hopper=True, config={"items": 1},
                              **cb).config.items == 1
    assert swattn.plan_decode([4097] * 64, **cb).config.items == 1
    cf = swattn.plan_decode([32768] * 16, num_q_heads=16, num_kv_heads=2, head_dim=64,
                            page_size=16, kv_dtype=e4m3)
    assert cf.path == "hopper" and cf.num_splits > 1 and cf.config.items == 1


def test_an_fp8_cache_takes_128_key_tiles_at_d128():
    """A tile of an fp8 cache is half the bytes: at d128 the decode config doubles its key
    tile (C-B: 338 us against 430 with 64-key tiles, benchmarks/results/2026-12-02-h200-fp8)."""
    from swattn.ops.config import decode_config
    bf16, e4m3 = torch.bfloat16, torch.float8_e4m3fn
    assert decode_config(128, 128, 4, bf16, "cuda", e4m3).block_n == 128
    assert decode_config(128, 128, 4, bf16, "cuda").block_n == 64
    assert decode_config(576, 512, 64, bf16, "cuda", e4m3).block_n == 32  # 128 spilled there


@pytest.mark.parametrize("fp8", FP8, ids=IDS.get)
def test_prefix_rows_are_the_window_widened(fp8):
    """The Hopper extend path under a window widens each sequence's visible prefix into
    fp16 rows before the kernel (ops.cache.PrefixRowsLaunch): from the first key tile the
    first new token sees to the prefix end, sequence after sequence; a position below the
    window (its entry not read), or on a page that is not one of the cache's, reads K NaN
    and V 0; a sequence with no new tokens has no rows."""
    from swattn.ops.cache import PrefixRowsLaunch, prefix_rows_base
    g = torch.Generator().manual_seed(43)
    heads, d, dv, page, window, bn = 2, 24, 20, 4, 9, 8
    prefix = [23, 0, 5, 14, 11]
    new = [3, 2, 1, 4, 0]  # the last: no new tokens, no rows
    num_pages = 30
    k_cache = (torch.randn(num_pages, page, heads, d, generator=g) * 4).to(fp8).to(DEVICE)
    v_cache = torch.randn(num_pages, page, heads, dv, generator=g).to(fp8).to(DEVICE)
    # Every entry a page of the cache, below the windows too (a row read there would come
    # out finite), but one bad entry inside sequence 3's window.
    table = torch.randperm(num_pages, generator=g)[:5 * 6].view(5, 6).to(torch.int32)
    table[3, 3] = num_pages + 5
    table = table.to(DEVICE)
    launch = PrefixRowsLaunch(len(prefix), page, heads, d, dv, window, bn,
                              (fp8, torch.int32, torch.float16))
    k_rows = torch.full((launch.capacity(), heads, d), 7.0, dtype=torch.float16, device=DEVICE)
    v_rows = torch.full((launch.capacity(), heads, dv), 7.0, dtype=torch.float16, device=DEVICE)
    cu = torch.tensor([0] + list(itertools.accumulate(new)), dtype=torch.int32, device=DEVICE)
    launch(k_cache, v_cache, table, cu, torch.tensor(prefix, dtype=torch.int32, device=DEVICE),
           k_rows, v_rows, sum(new))
    row = 0
    for i, p in enumerate(prefix[:4]):
        for pos in range(prefix_rows_base(p, window, bn), p):
            entry = int(table[i, pos // page])
            if pos >= p - window and 0 <= entry < num_pages:
                want_k = k_cache[entry, pos % page].to(torch.float16)
                want_v = v_cache[entry, pos % page].to(torch.float16)
                assert torch.equal(k_rows[row], want_k) and torch.equal(v_rows[row], want_v)
            else:
                assert torch.isnan(k_rows[row]).all() and (v_rows[row] == 0).all(), (i, pos)
            row += 1
    assert (k_rows[row:] == 7.0).all() and (v_rows[row:] == 7.0).all()  # nothing past them


def test_fp8_accuracy_reports_each_kernel(monkeypatch, capsys):
    """swattn verify --fp8-accuracy (e4m3 on random keys here, for time): a row for each
    kernel and scale granularity; each kernel's own error (against the reference over the
    same fp8 cache) far below what the quantization costs against the unquantized cache."""
    from swattn import cli
    from swattn.verify import fp8_accuracy
    monkeypatch.setattr(fp8_accuracy, "FORMATS", (torch.float8_e4m3fn,))
    monkeypatch.setattr(fp8_accuracy, "KEYS", ("random",))
    assert cli.main(["verify", "--fp8-accuracy", "--device", "cpu"]) == 0
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines()
            if line.startswith("| decode") or line.startswith("| extend")]
    kernels = {r[0].strip() for r in rows}
    assert {"decode", "extend, two-stage", "extend, deterministic"} <= kernels
    assert len(rows) == 2 * len(kernels)  # per tensor and per KV head
    for *_, own, cost in rows:
        assert float(own) < TOL and 10 * float(own) < float(cost) < 0.1
