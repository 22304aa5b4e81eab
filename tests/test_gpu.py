"""GPU-only checks (run by scripts/gpu_check.sh): real sizes, bf16, torch.compile."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import swattn
from swattn import reference
from swattn.plan import run_extend
from swattn.verify.cases import DecodeCase, ExtendCase, build_decode, build_extend, rel_err

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_extend_gpt_oss_shape_against_reference(dtype):
    case = ExtendCase([0, 128, 1000, 8192], [700, 513, 64, 1100], num_q_heads=16, num_kv_heads=2,
                      head_dim=64, head_dim_v=64, page_size=16, window_left=127, dtype=dtype)
    tensors = build_extend(case, "cuda")
    sinks = torch.randn(16, device="cuda")
    out = swattn.extend_attention(*tensors, window_left=127, sinks=sinks)
    assert rel_err(out, reference.extend_attention(*tensors, window_left=127, sinks=sinks)) < 1e-2


def test_fp32_products_are_fp32():
    """fp32 inputs multiply in fp32 on the GPU (Triton's default rounds fp32 products'
    operands to TF32, 10 mantissa bits: errors near 1e-3 against the float64 reference)."""
    case = ExtendCase([0, 300, 1000], [200, 129, 64], num_q_heads=16, num_kv_heads=2,
                      head_dim=64, head_dim_v=64, page_size=16, window_left=127,
                      dtype=torch.float32, seed=5)
    tensors = build_extend(case, "cuda")
    sinks = torch.randn(16, device="cuda", generator=torch.Generator("cuda").manual_seed(5))
    for deterministic in (False, True):
        out = swattn.extend_attention(*tensors, window_left=127, sinks=sinks,
                                      deterministic=deterministic)
        want = reference.extend_attention(*tensors, window_left=127, sinks=sinks)
        assert rel_err(out, want) < 1e-5, deterministic
    dcase = DecodeCase([5000, 100, 9000, 1], num_q_heads=32, num_kv_heads=8, head_dim=128,
                       head_dim_v=128, page_size=16, window_left=4095, dtype=torch.float32, seed=6)
    dt = build_decode(dcase, "cuda")
    for splits in (1, 3):
        out = swattn.decode_attention(*dt, window_left=4095, num_splits=splits)
        assert rel_err(out, reference.decode_attention(*dt, window_left=4095)) < 1e-5, splits


def test_extend_under_torch_compile():
    case = ExtendCase([300, 40], [129, 77], num_q_heads=8, num_kv_heads=2, head_dim=128,
                      head_dim_v=128, page_size=16, window_left=63, dtype=torch.bfloat16)
    tensors = build_extend(case, "cuda")

    def layer(q, k, v, k_cache, v_cache, block_table, cu, prefix):
        out, lse = swattn.extend_attention(q * 1.0, k, v, k_cache, v_cache, block_table, cu, prefix,
                                           window_left=63, return_lse=True)
        return out.float() * 2.0, lse

    compiled = torch.compile(layer, fullgraph=True)
    out, lse = compiled(*tensors)
    eager_out, eager_lse = layer(*tensors)
    assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse)
    assert rel_err(out / 2.0, reference.extend_attention(*tensors, window_left=63)) < 1e-2


@pytest.mark.parametrize("page_size", [16, 64], ids=lambda p: f"page{p}")
@pytest.mark.parametrize("deterministic", [False, True], ids=["two-stage", "deterministic"])
def test_tma_loads_give_the_pointer_loads_bits(page_size, deterministic):
    """Mistral-style d128 at real size: the mask-free tiles loaded by tensor-memory copy
    (new k/v; the cache too over pages of 64) give the same bits as pointer loads, and the
    reference's result, with and without the config's own tiling."""
    from dataclasses import replace

    from swattn.ops import extend as ops_extend
    from swattn.ops.config import extend_config
    case = ExtendCase([0, 4100, 9000], [3000, 2049, 700], num_q_heads=32, num_kv_heads=8,
                      head_dim=128, head_dim_v=128, page_size=page_size, window_left=4095,
                      dtype=torch.bfloat16, seed=page_size)
    tensors = build_extend(case, "cuda")
    cfg = extend_config(128, 128, 4, 4095, torch.bfloat16, torch.device("cuda"), page_size)
    descs = ops_extend.descriptors(cfg, *tensors[1:5], False)
    assert descs[0] is not None and (descs[2] is not None) == (page_size == 64)
    outs = [run_extend(*tensors, window_left=4095, deterministic=deterministic,
                                        config=replace(cfg, tma=tma), hopper=False)
            for tma in (True, False)]
    assert torch.equal(outs[0], outs[1])
    assert rel_err(outs[0], reference.extend_attention(*tensors, window_left=4095)) < 1e-2


class _TorchOps(TorchDispatchMode):
    """The torch ops run inside the ``with`` (a Triton launch is none)."""

    def __enter__(self):
        self.names = []
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("hopper", [False, True], ids=["triton", "hopper"])
@pytest.mark.parametrize("page_size", [16, 64], ids=lambda p: f"page{p}")
def test_plan_run_is_one_kernel_and_replays_from_a_cuda_graph(page_size, hopper):
    """A plan's run is one kernel and no torch op; captured in a CUDA graph (the TMA
    descriptors are encoded into the captured parameters) and replayed it gives the eager
    run's bits; with new q/k/v values written in place, the bits of an eager run on them."""
    case = ExtendCase([4100, 0], [2049, 700], num_q_heads=32, num_kv_heads=8, head_dim=128,
                      head_dim_v=128, page_size=page_size, window_left=4095, dtype=torch.bfloat16,
                      seed=7)
    tensors = build_extend(case, "cuda")
    plan = swattn.plan_extend([0, 2049, 2749], [4100, 0], num_q_heads=32, num_kv_heads=8,
                              head_dim=128, page_size=page_size, window_left=4095, hopper=hopper)
    assert plan.path == ("hopper" if hopper else "triton")
    out = torch.empty(2749, 32, 128, dtype=torch.bfloat16, device="cuda")
    plan.run(*tensors[:6], out=out)  # the compile, outside the recording

    def launch():
        plan.run(*tensors[:6], out=out)

    with _TorchOps() as ops:
        launch()
    assert ops.names == []  # one Triton kernel: no torch op before it
    eager = out.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        launch()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    for t in tensors[:3]:
        t.copy_(torch.randn_like(t))
    graph.replay()
    torch.cuda.synchronize()
    fresh = run_extend(*tensors, window_left=4095, hopper=hopper)
    assert torch.equal(out, fresh) and not torch.equal(out, eager)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", [(16, 2, 64, 127, 16), (32, 8, 128, 4095, 64)],
                         ids=["gpt-oss", "mistral-page64"])
def test_deterministic_chunking_and_repeats(dtype, shape):
    """deterministic=True at gpt-oss size, and Mistral-style over pages of 64 (mask-free
    tiles by TMA from the cache and from the new tokens, whichever holds them in a chunk
    plan): one chunk, three chunk plans, and 100 repeats of the same launch all give the
    same bits."""
    hq, hkv, d, window_left, page_size = shape
    length = 3000
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(length, hq, d, device="cuda", generator=g).to(dtype)
    k = torch.randn(length, hkv, d, device="cuda", generator=g).to(dtype)
    v = torch.randn(length, hkv, d, device="cuda", generator=g).to(dtype)
    sinks = torch.randn(hq, device="cuda")
    pages = torch.randperm(400)[: -(-length // page_size)].to(torch.int32)
    block_table = pages[None].cuda()

    def prefill(plan):
        k_cache = torch.full((400, page_size, hkv, d), float("nan"), dtype=dtype, device="cuda")
        v_cache = torch.full_like(k_cache, float("nan"))
        outs = []
        for start, stop in zip(plan, plan[1:]):
            cu = torch.tensor([0, stop - start], dtype=torch.int32, device="cuda")
            prefix = torch.tensor([start], dtype=torch.int32, device="cuda")
            outs.append(swattn.extend_attention(q[start:stop], k[start:stop], v[start:stop],
                                                k_cache, v_cache, block_table, cu, prefix,
                                                window_left=window_left, sinks=sinks,
                                                deterministic=True))
            pos = torch.arange(start, stop, device="cuda")
            slots = pages.cuda().long()[pos // page_size] * page_size + pos % page_size
            swattn.write_kv(k[start:stop], v[start:stop], k_cache, v_cache, slots)
        return torch.cat(outs)

    whole = prefill([0, length])
    for plan in ([0, 1024, length], [0, 7, 1000, 1001, 2500, length], [0, 2048, 2049, length]):
        assert torch.equal(prefill(plan), whole), plan
    for _ in range(100):
        assert torch.equal(prefill([0, length]), whole)


@pytest.mark.parametrize("shape", [(16, 2, 64, 127), (32, 8, 128, 4095)],
                         ids=["gpt-oss", "mistral"])
def test_deterministic_bits_do_not_depend_on_the_batch(shape):
    """deterministic=True at real sizes: one request alone, and first, in the middle and
    last of batches of other requests (its cache pages elsewhere in the pool), gives the
    same bits, with lse."""
    hq, hkv, d, window = shape
    request = ExtendCase([5000], [1500], num_q_heads=hq, num_kv_heads=hkv, head_dim=d, head_dim_v=d,
                         page_size=16, window_left=window, dtype=torch.bfloat16, seed=40)
    alone = build_extend(request, "cuda")
    sinks = torch.randn(hq, device="cuda")
    want = swattn.extend_attention(*alone, window_left=window, sinks=sinks, deterministic=True,
                                   return_lse=True)
    pages = -(-5000 // 16)
    for b, (prefixes, extends) in enumerate((([5000, 300], [1500, 2000]),
                                             ([8000, 5000, 0], [1, 1500, 4097]),
                                             ([64, 9000, 5000], [700, 333, 1500]))):
        where = prefixes.index(5000)
        case = ExtendCase(prefixes, extends, num_q_heads=hq, num_kv_heads=hkv, head_dim=d,
                          head_dim_v=d, page_size=16, window_left=window, dtype=torch.bfloat16,
                          seed=41 + b)
        q, k, v, k_cache, v_cache, block_table, cu, prefix = build_extend(case, "cuda")
        rows = slice(int(cu[where]), int(cu[where + 1]))
        q[rows], k[rows], v[rows] = alone[0], alone[1], alone[2]
        for i in range(pages):
            if alone[5][0, i] >= 0:
                k_cache[block_table[where, i]] = alone[3][alone[5][0, i]]
                v_cache[block_table[where, i]] = alone[4][alone[5][0, i]]
        got = swattn.extend_attention(q, k, v, k_cache, v_cache, block_table, cu, prefix,
                                      window_left=window, sinks=sinks, deterministic=True,
                                      return_lse=True)
        assert torch.equal(got[0][rows], want[0]) and torch.equal(got[1][rows], want[1]), (
            prefixes, extends)
    assert rel_err(want[0],
                   reference.extend_attention(*alone, window_left=window, sinks=sinks)) < 1e-2


HOPPER_CASES = {
    # Mistral-style (workload B's heads) over pages of 16 and 64: prefixes off the tile and
    # page grid, one sequence without a prefix, one shorter than a query block.
    "mistral-page16": (ExtendCase([0, 4100, 9000, 77], [3000, 2049, 700, 5], num_q_heads=32,
                                  num_kv_heads=8, head_dim=128, head_dim_v=128, page_size=16,
                                  window_left=4095, dtype=torch.bfloat16, seed=11), {}),
    "mistral-page64-fp16": (ExtendCase([4100, 0, 130], [2049, 700, 64], num_q_heads=32,
                                       num_kv_heads=8, head_dim=128, head_dim_v=128, page_size=64,
                                       window_left=4095, dtype=torch.float16, seed=12), {}),
    # gpt-oss heads with sinks, window 128, pages of 32.
    "gpt-oss-sinks-page32": (ExtendCase([0, 128, 1000, 8192], [700, 513, 64, 1100], num_q_heads=16,
                                        num_kv_heads=2, head_dim=64, head_dim_v=64, page_size=32,
                                        window_left=127, dtype=torch.bfloat16, seed=13),
                             {"sinks": True}),
    # An odd KV group, a window under HopperExtendConfig.ws_min_window at d128 (the loop
    # not warp-specialized), sinks and lse.
    "group3-sinks-lse-page16": (ExtendCase([70, 0, 4200], [1000, 300, 129], num_q_heads=6,
                                           num_kv_heads=2, head_dim=128, head_dim_v=128,
                                           page_size=16, window_left=1000, dtype=torch.float16,
                                           seed=15), {"sinks": True, "return_lse": True}),
    # Full attention, non-causal with a right window, soft-cap and lse, pages of 128.
    "full-noncausal-softcap-page128": (ExtendCase([300, 0, 1500], [129, 77, 1000], num_q_heads=8,
                                                  num_kv_heads=2, head_dim=128, head_dim_v=128,
                                                  page_size=128, window_left=None,
                                                  dtype=torch.bfloat16, seed=14),
                                       {"causal": False, "window_right": 200, "softcap": 20.0,
                                        "return_lse": True}),
    # Chunked attention (Llama 4's local layers, scaled down): chunks starting mid-tile and
    # mid-page, blocks straddling them, a chunk under a window and one without.
    "chunk-1000-window-page16": (ExtendCase([0, 2500, 900], [2100, 700, 300], num_q_heads=40,
                                            num_kv_heads=8, head_dim=128, head_dim_v=128,
                                            page_size=16, window_left=600,
                                            dtype=torch.bfloat16, seed=16),
                                 {"attention_chunk": 1000}),
    "chunk-2048-page64-sinks": (ExtendCase([2000, 0, 4096], [1500, 3000, 64], num_q_heads=16,
                                           num_kv_heads=2, head_dim=64, head_dim_v=64,
                                           page_size=64, window_left=None,
                                           dtype=torch.float16, seed=17),
                                {"attention_chunk": 2048, "sinks": True}),
}


@pytest.mark.parametrize("rows", [64, 128], ids=["64-rows", "128-rows"])
@pytest.mark.parametrize("name", sorted(HOPPER_CASES))
def test_hopper_path_against_the_reference_and_the_triton_kernel(name, rows):
    """The Gluon fast path at real sizes (NaN in unwritten cache rows, -1 in unread
    block-table entries), with one warpgroup a program or two (128 rows): the reference's
    result, within the Triton kernel's own error, and bit-identical across its bounds
    variants."""
    from swattn.ops import extend as ops_extend
    from swattn.ops import extend_hopper
    from swattn.ops.config import HOPPER_EXTEND_128_ROWS
    case, extra = HOPPER_CASES[name]
    tensors = build_extend(case, "cuda")
    kwargs = dict(extra, window_left=case.window_left)
    if kwargs.pop("sinks", False):
        kwargs["sinks"] = torch.randn(case.num_q_heads, device="cuda")
    assert extend_hopper.unsupported(tensors[0].device, tensors[0].dtype, case.head_dim,
                                     case.head_dim_v, case.page_size, False, False) is None
    want = reference.extend_attention(*tensors, **kwargs)
    tiling = HOPPER_EXTEND_128_ROWS if rows == 128 else None
    outs = {b: run_extend(*tensors, bounds=b, hopper=True, config=tiling, **kwargs)
            for b in ops_extend.BOUNDS}
    triton_out = run_extend(*tensors, hopper=False, **kwargs)

    def parts(x):
        return x if isinstance(x, tuple) else (x,)

    for b in ("skip", "none"):
        assert all(torch.equal(x, y) for x, y in zip(parts(outs["tight"]), parts(outs[b]))), b
    out, want_out = parts(outs["tight"])[0], parts(want)[0]
    assert not out.isnan().any()
    err = rel_err(out, want_out)
    assert err < 1e-2 and err <= 2 * rel_err(parts(triton_out)[0], want_out) + 1e-4
    if isinstance(want, tuple):
        lse, want_lse = outs["tight"][1], want[1]
        assert torch.equal(torch.isinf(lse), torch.isinf(want_lse))
        fin = torch.isfinite(want_lse)
        assert rel_err(lse[fin], want_lse[fin]) < 1e-3
