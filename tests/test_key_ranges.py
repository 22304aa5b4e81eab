"""The extend kernel under ``key_ranges`` (each query row sees its own range of cached keys:
swattn.parallel's extend over a rank's local keys) against a float64 softmax over those keys,
its bounds variants bit for bit, every tiling, over fp8 caches too, and the plans it refuses.
Small odd shapes: this runs under Triton's interpreter on CPU."""

import pytest
import torch
from checks import assert_bounds_identical
from conftest import DEVICE

from swattn import reference
from swattn.plan.extend import build_extend_plan, plan_key_ranges

DTYPE = torch.float32 if DEVICE == "cpu" else torch.float16


def _case(seed, keys=(37, 0, 20), queries=(9, 3, 12), floors=(10, 0, 3), hq=4, hkv=2, d=24,
          page=4, window=None):
    """Random queries and a paged cache of ``keys[b]`` keys a sequence, every query row a
    random range of its keys from ``floors[b]`` on (some empty, some reversed, some whole),
    or with ``window`` a causal window's: row ``t`` of ``T`` the ``window`` keys before
    ``n - T + t + 1``, cut at the floor. Rows nothing writes and pages wholly below a
    sequence's lowest visible key (freed: entry -1) hold NaN."""
    g = torch.Generator().manual_seed(seed)
    ranges = []
    for n, t, floor in zip(keys, queries, floors):
        for i in range(t):
            kind = int(torch.randint(0, 6, (1,), generator=g))
            a, b = (int(x) for x in torch.randint(floor, n + 1, (2,), generator=g))
            if window is not None:
                end = n - t + i + 1
                ranges.append((max(end - window, floor), end))
            else:
                ranges.append({0: (a, a), 1: (b, a), 2: (floor, n)}.get(kind,
                                                                        (min(a, b), max(a, b))))
    dense_k = [torch.randn(n, hkv, d, generator=g) for n in keys]
    dense_v = [torch.randn(n, hkv, d, generator=g) for n in keys]
    pages = [-(-n // page) for n in keys]
    order = torch.randperm(sum(pages), generator=g) + 1
    k_cache = torch.full((sum(pages) + 2, page, hkv, d), float("nan"))
    v_cache = k_cache.clone()
    table = torch.full((len(keys), max(pages) + 1), -1, dtype=torch.int32)
    cu = [0]
    nxt = 0
    for b, n in enumerate(keys):
        rows = ranges[cu[-1]:cu[-1] + queries[b]]
        lowest = min((lo for lo, hi in rows if lo < hi), default=n)
        for i in range(pages[b]):
            slot = slice(i * page, min((i + 1) * page, n))
            if (i + 1) * page > lowest:  # a page below every range stays freed
                table[b, i] = int(order[nxt])
                k_cache[order[nxt], :slot.stop - slot.start] = dense_k[b][slot]
                v_cache[order[nxt], :slot.stop - slot.start] = dense_v[b][slot]
            nxt += 1
        cu.append(cu[-1] + queries[b])
    q = torch.randn(cu[-1], hq, d, generator=g)
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, table=table, cu=cu, keys=list(keys),
                ranges=torch.tensor(ranges, dtype=torch.int32).T.contiguous(), dense_k=dense_k,
                dense_v=dense_v, hq=hq, hkv=hkv, d=d, page=page)


def _expected(c, scale, dtype):
    """float64 softmax of each row over its range's keys, taken from the dense keys (not the
    cache) as ``dtype`` rounds them: ``(out, lse)``, 0 and -inf where a row sees nothing."""
    group = c["hq"] // c["hkv"]
    outs, lses = [], []
    for b, n in enumerate(c["keys"]):
        rows = slice(c["cu"][b], c["cu"][b + 1])
        q = c["q"][rows].to(dtype).double()  # [T, H, D]
        k = c["dense_k"][b].to(dtype).double().repeat_interleave(group, 1)  # [N, H, D]
        v = c["dense_v"][b].to(dtype).double().repeat_interleave(group, 1)
        lo, hi = (x.long()[:, None, None] for x in c["ranges"][:, rows])
        j = torch.arange(n)[None, None, :]
        s = torch.einsum("thd,nhd->thn", q, k) * scale
        s = torch.where((j >= lo) & (j < hi), s, float("-inf"))  # [T, H, N]
        lse = torch.logsumexp(s, -1) if n else torch.full(q.shape[:2], float("-inf"))
        p = torch.where(lse[..., None] == float("-inf"), 0.0, torch.exp(s - lse[..., None]))
        outs.append(torch.einsum("thn,nhd->thd", p, v))
        lses.append(lse.double())
    return torch.cat(outs), torch.cat(lses)


def _fp8(c, fp8):
    """Case ``c`` over an fp8 cache of ``fp8``: the cache quantized with a scale a KV head
    (powers of two, so the dequantized keys are exact in fp16), and the dense keys the
    float64 softmax takes dequantized."""
    hkv = c["hkv"]
    k_scale = torch.tensor([2.0 ** -(5 + h % 2) for h in range(hkv)])
    v_scale = torch.tensor([2.0 ** -(4 + h % 3) for h in range(hkv)])
    c = dict(c, kv_dtype=fp8, scales=(k_scale, v_scale))
    for name, scale in (("k", k_scale), ("v", v_scale)):
        c[f"{name}_cache"] = reference.quantize(c[f"{name}_cache"], scale, fp8)
        c[f"dense_{name}"] = [reference.dequantize(reference.quantize(x, scale, fp8), scale)
                              for x in c[f"dense_{name}"]]
    return c


def _run(c, bounds="tight", config=None, dtype=DTYPE, hopper=None, path="triton",
         fp8_products=False):
    dev = DEVICE
    ranges = c["ranges"].to(dev)
    kv_dtype = c.get("kv_dtype")
    plan = plan_key_ranges(c["cu"], c["keys"], (ranges[0], ranges[1]), num_q_heads=c["hq"],
                           num_kv_heads=c["hkv"], head_dim=c["d"], page_size=c["page"],
                           kv_dtype=kv_dtype, dtype=dtype, device=dev, hopper=hopper,
                           bounds=bounds, config=config, fp8_products=fp8_products)
    assert plan.path == path
    t = c["q"].shape[0]
    no_k = torch.zeros(1, c["hkv"], c["d"], dtype=dtype, device=dev).expand(t, -1, -1)
    scales = {}
    if kv_dtype is not None:
        scales = dict(k_scale=c["scales"][0].to(dev), v_scale=c["scales"][1].to(dev))
    cache = kv_dtype or dtype
    return plan.run(c["q"].to(dev, dtype), no_k, no_k, c["k_cache"].to(dev, cache),
                    c["v_cache"].to(dev, cache), c["table"].to(dev), **scales)


# Tilings: one masked loop, mask-free tiles between masked ones, GQA packed into the rows
# (on the GPU no product side below 16).
TILINGS = ([dict(block_m=16, block_n=16, split_full=False), dict(block_m=16, block_n=8),
            dict(block_m=8, block_n=4, pack_gqa=True)] if DEVICE == "cpu" else
           [dict(block_m=16, block_n=16, split_full=False), dict(block_m=32, block_n=16),
            dict(block_m=32, block_n=16, pack_gqa=True)])


@pytest.mark.parametrize("seed, config", enumerate(TILINGS), ids=["one-loop", "split", "packed"])
def test_key_ranges_match_a_float64_softmax_under_every_bounds_variant(seed, config):
    c = _case(seed)
    _check(c, assert_bounds_identical([_run(c, b, config) for b in ("tight", "skip", "none")]))


def _check(c, got, some_empty=True):
    out, lse = (x.cpu() for x in got)
    want_out, want_lse = _expected(c, c["d"] ** -0.5, out.dtype)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    empty = want_lse == float("-inf")
    assert (~empty).any() and (empty.any() or not some_empty)  # (rows that see nothing)
    assert torch.equal(lse == float("-inf"), empty)
    assert (out[empty] == 0).all()
    tol = 1e-4 if out.dtype == torch.float32 else 2e-2
    assert torch.allclose(out.double(), want_out, atol=tol, rtol=tol)
    assert torch.allclose(lse.double()[~empty], want_lse[~empty], atol=tol, rtol=tol)


@pytest.mark.parametrize("config", TILINGS[2:], ids=["packed"])
def test_key_ranges_of_a_window(config):
    """Ranges that slide as a causal window's: blocks with mask-free tiles between masked
    ones."""
    c = _case(2, keys=(44, 30), queries=(20, 12), floors=(9, 0), window=14)
    _check(c, assert_bounds_identical([_run(c, b, config) for b in ("tight", "skip", "none")]),
           some_empty=False)


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3fn", "e5m2"])
def test_key_ranges_over_an_fp8_cache(fp8):
    """Over an fp8 cache (fp16 queries, a scale a KV head): the float64 softmax over the
    dequantized keys, the bounds variants bit for bit, the mask-free tiles between masked
    ones."""
    c = _fp8(_case(6), fp8)
    _check(c, assert_bounds_identical([_run(c, b, TILINGS[1], dtype=torch.float16)
                                       for b in ("tight", "skip", "none")]))


def _no_new_rows(monkeypatch):
    """Key ranges read no new rows: a Hopper plan over an fp8 cache that made its launch
    quantizing them (ops.cache.NewRowsLaunch) fails the test."""
    from swattn.ops import cache

    def refuse(*args, **kwargs):
        raise AssertionError("key ranges launched the new rows' quantization")
    monkeypatch.setattr(cache, "NewRowsLaunch", refuse)


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["triton", "hopper"])
@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3fn", "e5m2"])
def test_gpu_key_ranges_over_an_fp8_cache_at_real_sizes(fp8, path, monkeypatch):
    """Either kernel over an fp8 cache with the plan's own tiles (the Hopper path's converter
    warps widening the pages the ranges reach), bf16 queries, every bounds variant bit for
    bit, against the float64 softmax over the dequantized keys; no new rows quantized."""
    if DEVICE != "cuda":
        pytest.skip("CUDA only")
    if path == "hopper" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90 only")
    _no_new_rows(monkeypatch)
    c = _fp8(_case(7, keys=(3000, 1500), queries=(300, 200), floors=(700, 0), hq=64, hkv=8,
                   d=64, page=16), fp8)
    _check(c, assert_bounds_identical([_run(c, b, dtype=torch.bfloat16, hopper=path == "hopper",
                                            path=path) for b in ("tight", "skip", "none")]))


@pytest.mark.gpu
def test_gpu_key_ranges_with_fp8_products(monkeypatch):
    """The Hopper path's opt-in fp8 products under key ranges: every bounds variant bit for
    bit, rows that see nothing 0 and -inf, and the rest within the fp8 products' error of
    the float64 softmax over the dequantized keys (a few 1e-2, docs/api.md); no new rows
    quantized."""
    if DEVICE != "cuda" or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90 only")
    _no_new_rows(monkeypatch)
    c = _fp8(_case(8, keys=(3000, 1500), queries=(300, 200), floors=(700, 0), hq=64, hkv=8,
                   d=64, page=16), torch.float8_e4m3fn)
    out, lse = (x.cpu() for x in assert_bounds_identical(
        [_run(c, b, dtype=torch.bfloat16, hopper=True, path="hopper", fp8_products=True)
         for b in ("tight", "skip", "none")]))
    want_out, want_lse = _expected(c, c["d"] ** -0.5, out.dtype)
    empty = want_lse == float("-inf")
    assert empty.any() and not torch.isnan(out).any()
    assert torch.equal(lse == float("-inf"), empty) and (out[empty] == 0).all()
    err = (out.double() - want_out).norm() / want_out.norm()
    assert err < 6e-2, err
    assert torch.allclose(lse.double()[~empty], want_lse[~empty], atol=5e-2, rtol=5e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["triton", "hopper"])
@pytest.mark.parametrize("window", [None, 1000], ids=["random", "window"])
@pytest.mark.parametrize("d, hq, dtype", [(64, 64, torch.bfloat16), (128, 32, torch.float16)],
                         ids=["gpt-oss-bf16", "mistral-fp16"])
def test_gpu_key_ranges_at_real_sizes(d, hq, dtype, window, path):
    """Either kernel with the plan's own tiles on the GPU (mask-free tiles, packed heads on
    the Triton kernel, the producer warp on the Hopper path), long ranges over pages of 16,
    every bounds variant bit for bit."""
    if DEVICE != "cuda":
        pytest.skip("CUDA only")
    if path == "hopper" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90 only")
    c = _case(5, keys=(3000, 1500), queries=(300, 200), floors=(700, 0), hq=hq, hkv=8, d=d,
              page=16, window=window)
    _check(c, assert_bounds_identical([_run(c, b, dtype=dtype, hopper=path == "hopper",
                                            path=path) for b in ("tight", "skip", "none")]),
           some_empty=window is None)


def test_a_visible_key_on_a_freed_page_is_nan_not_garbage():
    """A range reaching below the pages the cache keeps reads a -1 entry: NaN in that row,
    finite everywhere else."""
    c = _case(3)
    assert (c["table"][0, :2] == -1).all()  # sequence 0's keys below 8 are freed
    t = next(t for t in range(c["cu"][1]) if c["ranges"][0, t] < c["ranges"][1, t])
    c["ranges"][0, t] = 0  # now row t reaches the freed pages
    out, lse = _run(c)
    assert torch.isnan(out[t]).all() and torch.isnan(lse[t]).all()
    rest = torch.ones(out.shape[0], dtype=torch.bool)
    rest[t] = False
    assert not torch.isnan(out[rest.to(out.device)]).any()


@pytest.mark.parametrize("change", [dict(keys="all"), dict(causal=True),
                                    dict(window_left=3), dict(deterministic=True)])
def test_key_ranges_refuse_what_they_cannot_take(change):
    args = dict(num_q_heads=2, num_kv_heads=1, head_dim=16, head_dim_v=None, page_size=4,
                window_left=None, window_right=None, causal=False, softcap=0.0, scale=None,
                keys="prefix", return_lse=True, deterministic=False, kv_dtype=None,
                dtype=torch.float32, device=torch.device("cpu"), hopper=None, bounds="tight",
                config=None, max_tokens=2)
    args.update(change)
    lens = torch.tensor([0, 2], dtype=torch.int32)
    with pytest.raises(ValueError, match="key_ranges"):
        build_extend_plan([0, 2], [5], None, lens, lens[1:], None, 1,
                     key_ranges=(lens, lens), **args)


def test_key_ranges_arrays_are_checked():
    lo = torch.zeros(4, dtype=torch.int32, device=DEVICE)
    sizes = dict(num_q_heads=2, num_kv_heads=1, head_dim=16, page_size=4, dtype=DTYPE,
                 device=DEVICE)
    with pytest.raises(TypeError, match="key_lo"):
        plan_key_ranges([0, 4], [9], (lo.long(), lo), **sizes)
    with pytest.raises(ValueError, match="key_hi has 3 entries"):
        plan_key_ranges([0, 4], [9], (lo, lo[:3]), **sizes)
