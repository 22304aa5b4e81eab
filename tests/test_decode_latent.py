"""The Gluon latent-cache decode path (swattn.ops.decode_latent, sm_90): which plans take it,
its answers against the reference over bf16 and fp8 latent caches (bounds variants bit-identical),
bad pages and pool rows, a CUDA graph; and, on any machine, its compile for sm_90 without
spills. Its bit-identity matrix is the decode-hopper-latent family (tests/test_verify.py)."""

import pytest
import torch
from checks import (
    assert_bounds_identical,
    assert_matches_reference,
    latent_inputs,
    replay_after,
    run_fresh,
    runs_without_sync,
)
from conftest import DEVICE

import swattn
from swattn import reference
from swattn.ops import decode_latent
from swattn.plan import run_decode
from swattn.verify.cases import DecodeCase, build_decode, build_sparse

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _hopper():
    return DEVICE == "cuda" and torch.cuda.get_device_capability() == (9, 0)


def _bits(t):
    """``t``'s bits as integers of its width (torch.equal takes NaN as unequal)."""
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _latent_case(seq_lens, fp8, seed=61):
    """S's layout (64 query heads on one KV head, 576 key columns, the values their first
    512; window 128, 480 sparse keys, pages of 64) over ``seq_lens``: the case, the tensors
    with the values as the keys' first columns, the pool likewise, the same values as their
    own copies, and over an fp8 cache the quantized cache and pool under one scale."""
    case = DecodeCase(seq_lens, num_q_heads=64, num_kv_heads=1, head_dim=576, head_dim_v=512,
                      page_size=64, window_left=127, sparse_keys=480, pool_rows=900,
                      dtype=torch.bfloat16, seed=seed)
    q, k_cache, _, block_table, seq_lens_t = build_decode(case, "cuda")
    k_pool, _, idx = build_sparse(case, "cuda")
    scales = {}
    if fp8 is not None:
        g = torch.Generator().manual_seed(seed + 1)
        scale = (torch.rand(1, generator=g) * 0.05 + 0.01).cuda()
        k_cache = reference.quantize(k_cache, scale, fp8)
        k_pool = reference.quantize(k_pool, scale, fp8)
        scales = {"k_scale": scale, "v_scale": scale}
    tensors = (q, k_cache, None, block_table, seq_lens_t)
    (v_cache, sparse), copied = latent_inputs(case, tensors, (k_pool, None, idx))
    return case, (q, k_cache, v_cache, block_table, seq_lens_t), sparse, copied, scales


def test_plans_take_the_latent_path_on_hopper_only():
    """A plan takes the path for 576/512 heads with a group of 16 or more on sm_90, and
    ``unsupported`` names why elsewhere."""
    kw = dict(num_q_heads=64, num_kv_heads=1, head_dim=576, head_dim_v=512, page_size=64,
              window_left=127, sparse_keys=16, dtype=torch.bfloat16, device=DEVICE)
    plan = swattn.plan.plan_decode([300, 40], **kw)
    assert plan.path == ("latent" if _hopper() else "triton")
    cpu = torch.device("cpu")
    assert "CUDA" in decode_latent.unsupported(cpu, torch.bfloat16, 576, 512, 64)
    if _hopper():
        dev = torch.device("cuda")
        assert decode_latent.unsupported(dev, torch.bfloat16, 576, 512, 64) is None
        assert "576" in decode_latent.unsupported(dev, torch.bfloat16, 128, 128, 64)
        assert "at least 16" in decode_latent.unsupported(dev, torch.bfloat16, 576, 512, 8)
        assert swattn.plan.plan_decode([300, 40], **dict(kw, num_q_heads=8)).path == "triton"
        assert swattn.plan.plan_decode([300, 40], hopper=False, **kw).path == "triton"


def test_the_kernel_compiles_for_sm90_without_spills():
    """The latent kernel compiled for sm_90 by Triton's ptxas (no GPU needed), bf16 and fp8
    with a sparse pool: no register spills (its query's descriptors once took 72 registers
    across the loop: ops.decode_latent._opaque_zero)."""
    result = run_fresh(
        "import torch\n"
        "from swattn.verify import asm\n"
        "for kv in (None, torch.float8_e4m3fn):\n"
        "    c, _ = asm.compile_latent_decode(kv_dtype=kv)\n"
        "    print(c.registers, c.stack, c.local, sum('HGMMA' in i for i in c.sass))\n")
    assert result.returncode == 0, result.stderr[-3000:]
    for line in result.stdout.split("\n")[:2]:
        registers, stack, local, products = map(int, line.split())
        # 512 / 16 + 64 / 16 steps of the scores, 32 / 16 of the output, a tile.
        assert stack == 0 and local == 0 and registers <= 255 and products == 38, line


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", (None,) + FP8, ids=lambda x: "bf16" if x is None else str(x)[11:])
def test_gpu_latent_path_at_s_shape(fp8):
    """S's heads over a latent cache (window 128, 480 sparse keys, ragged lengths: one key,
    below, at and past the window): the plan binds the latent kernel, the bounds variants
    are bit-identical for each split count, and the answers are the reference's; the same
    values as their own copy are refused by the latent plan and take the Triton kernel in a
    one-shot call, with the reference's answers too."""
    if not _hopper():
        pytest.skip("the Gluon latent path runs on sm_90 only")
    case, tensors, sparse, copied, scales = _latent_case([700, 300, 1, 129, 128, 5000], fp8)
    sinks = torch.randn(64, generator=torch.Generator().manual_seed(7)).cuda()
    kw = dict(window_left=127, sinks=sinks, sparse=sparse, return_lse=True, **scales)
    want = reference.decode_attention(*tensors, **kw)
    tol = 5e-3 if fp8 is None else 1e-2
    for splits in (None, 1, 3):
        got = assert_bounds_identical([run_decode(*tensors, bounds=b, num_splits=splits, **kw)
                                       for b in ("tight", "skip", "none")])
        assert_matches_reference(got, want, tol=tol)
    plan = swattn.plan.plan_decode(case.seq_lens, num_q_heads=64, num_kv_heads=1, head_dim=576,
                                   head_dim_v=512, page_size=64, window_left=127,
                                   sparse_keys=480, dtype=torch.bfloat16, kv_dtype=fp8,
                                   return_lse=True, device="cuda")
    assert plan.path == "latent" and plan.num_splits >= 1
    q, k_cache, v_cache, block_table, _ = tensors
    got = plan.run(q, k_cache, v_cache, block_table, sinks=sinks, sparse=sparse, **scales)
    with pytest.raises(ValueError, match="v_cache must be the keys' first head_dim_v columns"):
        plan.run(q, k_cache, copied[0], block_table, sinks=sinks, sparse=copied[1], **scales)
    kinds = {key[3]: type(launch).__name__ for key, (launch, _) in plan.launches.items()}
    assert kinds == {True: "LatentDecodeLaunch"}
    own = run_decode(q, k_cache, copied[0], block_table, tensors[4], window_left=127,
                     sinks=sinks, sparse=copied[1], return_lse=True, **scales)
    for result in (got, own):
        assert_matches_reference(result, want, tol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", (None, torch.float8_e4m3fn), ids=["bf16", "e4m3fn"])
def test_gpu_latent_path_bad_pages_and_pool_rows(fp8):
    """A block-table entry off the cache inside one sequence's window, and a pool index
    off the pool in another's, are never read: those sequences' outputs (every head) and
    lse come out NaN, the other sequences' are the reference's; freed pages (-1) below the
    window and NaN rows outside it are not read either."""
    if not _hopper():
        pytest.skip("the Gluon latent path runs on sm_90 only")
    case, tensors, sparse, _, scales = _latent_case([700, 300, 400, 90], fp8, seed=62)
    q, k_cache, v_cache, block_table, seq_lens = tensors
    k_pool, v_pool, idx = sparse
    kw = dict(window_left=127, return_lse=True, **scales)
    want = reference.decode_attention(*tensors, sparse=sparse, **kw)
    bad_table, bad_idx = block_table.clone(), idx.clone()
    # Far past any allocation: a read would fault, not land in another tensor.
    bad_table[0, 699 // 64] = 2 ** 31 - 1  # the page of sequence 0's last key
    bad_idx[1, 3] = 2 ** 31 - 1
    for splits in (1, 2):
        results = [run_decode(q, k_cache, v_cache, bad_table, seq_lens,
                              sparse=(k_pool, v_pool, bad_idx), bounds=b, num_splits=splits, **kw)
                   for b in ("tight", "skip", "none")]
        for other in results[1:]:  # bit for bit, NaN included
            assert all(torch.equal(_bits(a), _bits(b)) for a, b in zip(results[0], other))
        out, lse = results[0]
        assert torch.isnan(out[:2]).all() and torch.isnan(lse[:2]).all()
        tol = 5e-3 if fp8 is None else 1e-2
        assert_matches_reference((out[2:], lse[2:]), (want[0][2:], want[1][2:]), tol=tol)


@pytest.mark.gpu
def test_gpu_latent_path_replays_from_a_cuda_graph():
    """plan_decode's run over a latent cache with sparse keys: later runs on its tensors
    relaunch what the first assembled, with no host sync; captured in a CUDA graph, a replay
    after replan (new lengths in place) gives the reference's answer for them."""
    if not _hopper():
        pytest.skip("the Gluon latent path runs on sm_90 only")
    lens = [900, 100, 128, 1, 600, 64]
    _, tensors, sparse, _, _ = _latent_case(lens, None, seed=63)
    q, k_cache, v_cache, block_table, seq_lens = tensors
    plan = swattn.plan.plan_decode(lens, num_q_heads=64, num_kv_heads=1, head_dim=576,
                                   head_dim_v=512, page_size=64, window_left=127, sparse_keys=480,
                                   dtype=torch.bfloat16, device="cuda")
    assert plan.path == "latent"
    out = torch.empty(len(lens), 64, 512, dtype=torch.bfloat16, device="cuda")
    sinks = torch.randn(64, generator=torch.Generator().manual_seed(8)).cuda()

    def run():
        return plan.run(q, k_cache, v_cache, block_table, sinks=sinks, sparse=sparse, out=out)

    run()  # (the first launch compiles)
    first, second = runs_without_sync(run, out, times=2)
    assert torch.equal(first, second)
    # The run's tensors, sparse pool and index list among them, are relaunched unchecked;
    # another index list is a run of its own.
    assert plan.relaunches == 1
    k_pool, v_pool, idx = sparse
    other = plan.run(q, k_cache, v_cache, block_table, sinks=sinks, sparse=(k_pool, v_pool,
                                                                            idx.clone()), out=out)
    assert plan.relaunches == 2 and torch.equal(other, first)
    want = reference.decode_attention(*tensors, window_left=127, sinks=sinks, sparse=sparse)
    assert_matches_reference(first, want)
    # (shorter where every key of the new window was written: the old one started at 0)
    new_lens = [900, 50, 127, 1, 600, 2]
    replay_after(run, lambda: plan.replan(new_lens), out)
    seq_lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
    want = reference.decode_attention(q, k_cache, v_cache, block_table, seq_lens, window_left=127,
                                      sinks=sinks, sparse=sparse)
    assert_matches_reference(out, want)


def test_a_single_kv_heads_latent_view_is_recognized():
    """``v_cache = k_rows[..., :512]`` viewed as pages (one KV head) gets a stride on the
    head axis other than the keys' (``view`` picks any for an axis of one): still the
    keys' first columns (what lets a plan's latent or one-load kernel take it); a copy, or
    the same address stepped otherwise, is not."""
    from swattn.ops.decode import values_in_keys
    k_rows = torch.randn(100, 1, 576)
    k_cache = k_rows[4:68].view(4, 16, 1, 576)
    v_cache = k_rows[..., :512][4:68].view(4, 16, 1, 512)
    assert v_cache.stride(2) != k_cache.stride(2)

    class Spec:
        head_dim, head_dim_v = 576, 512

    assert values_in_keys(Spec, k_cache, v_cache, None)
    assert not values_in_keys(Spec, k_cache, v_cache.clone(), None)
    # The same address, another stride on an axis of more than one element: not the keys.
    other = torch.as_strided(k_rows, (2, 16, 1, 512), (2 * 16 * 576, 576, 576, 1), 4 * 576)
    assert other.data_ptr() == k_cache.data_ptr()
    assert not values_in_keys(Spec, k_cache[:2], other, None)


def test_the_latent_path_is_decided_at_plan_time(monkeypatch):
    """Regression: a "latent" plan ran the Triton kernel when v_cache was not a view of
    k_cache, decided inside run, so ``plan.path`` said what might not run. A plan's latent
    path now reads the values from the key tiles on every run: separate values are refused
    before any launch, and a one-shot call takes the latent path only for a latent view.
    (The path is made available on the CPU here; nothing is launched.)"""
    monkeypatch.setattr(decode_latent, "unsupported", lambda *args: None)
    case = DecodeCase([9, 4], num_q_heads=16, num_kv_heads=1, head_dim=40, head_dim_v=32,
                      page_size=4, window_left=6, seed=5)
    q, k_cache, _, block_table, seq_lens = build_decode(case, DEVICE)
    latent, copied = k_cache[..., :32], k_cache[..., :32].clone()
    plan = swattn.plan.plan_decode(case.seq_lens, num_q_heads=16, num_kv_heads=1, head_dim=40,
                                   head_dim_v=32, page_size=4, window_left=6, dtype=case.dtype,
                                   device=DEVICE)
    assert plan.path == "latent"
    with pytest.raises(ValueError, match="make the plan with hopper=False"):
        plan.run(q, k_cache, copied, block_table)
    assert not plan.launches
    one_shot = swattn.plan.decode_plan_for
    assert one_shot(q, k_cache, copied, block_table, seq_lens, window_left=6).path == "triton"
    assert one_shot(q, k_cache, latent, block_table, seq_lens, window_left=6).path == "latent"
    assert one_shot(q, k_cache, copied, block_table, seq_lens, window_left=6).path == "triton"
