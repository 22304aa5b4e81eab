"""Ring block tables (ring_table=True): logical page i at column i % width, a fixed width
for CUDA graphs (swattn.window.ring_width). The kernels give the linear table's bits."""

import pytest
import torch
from conftest import DEVICE

import swattn
from swattn import window
from swattn.plan import run_decode, run_extend
from swattn.verify.cases import DecodeCase, ExtendCase, build_decode, build_extend


def _ring(table, width, firsts, ends):
    """The ring of ``width`` columns holding each row's logical pages ``[first, end)`` of the
    linear ``table``; every other column a page id no query may read (-1)."""
    ring = torch.full((table.shape[0], width), -1, dtype=torch.int32)
    for b, (first, end) in enumerate(zip(firsts, ends)):
        for i in range(first, end):
            ring[b, i % width] = table[b, i]
    return ring.to(table.device)


@pytest.mark.parametrize("deterministic", [False, True], ids=["two-stage", "single-pass"])
@pytest.mark.parametrize("chunk", [None, 12], ids=["window", "window+chunk"])
def test_extend_ring_equals_linear(deterministic, chunk):
    case = ExtendCase([40, 3, 77], [9, 20, 14], window_left=10, page_size=4, seed=51)
    tensors = build_extend(case, DEVICE)
    table = tensors[5].cpu()
    width = window.ring_width(10, max(case.extend_lens), 4)
    firsts = [window.decode_bounds(p + 1, 10, chunk)[0] // 4 for p in case.prefix_lens]
    ends = [-(-p // 4) for p in case.prefix_lens]
    ring = _ring(table, width, firsts, ends)
    linear = swattn.extend_attention(*tensors, window_left=10, attention_chunk=chunk,
                                     deterministic=deterministic)
    for bounds in ("tight", "skip"):
        got = run_extend(*tensors[:5], ring, *tensors[6:], window_left=10, attention_chunk=chunk,
                         deterministic=deterministic, ring_table=True, bounds=bounds)
        assert torch.equal(got, linear), bounds


@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_ring_equals_linear(num_splits):
    case = DecodeCase([1, 9, 40, 77], window_left=10, page_size=4, seed=52)
    q, k_cache, v_cache, table, seq_lens = build_decode(case, DEVICE)
    width = window.ring_width(10, 1, 4)
    firsts = [window.decode_bounds(s, 10)[0] // 4 for s in case.seq_lens]
    ends = [-(-s // 4) for s in case.seq_lens]
    ring = _ring(table.cpu(), width, firsts, ends)
    linear = swattn.decode_attention(q, k_cache, v_cache, table, seq_lens, window_left=10,
                                     num_splits=num_splits)
    got = run_decode(q, k_cache, v_cache, ring, seq_lens, window_left=10, num_splits=num_splits,
                     ring_table=True)
    assert torch.equal(got, linear)


def test_plans_check_a_ring_table():
    """A ring narrower than the pages a step reads at once, or holding a bad entry where a
    query reads, is a ValueError naming block_table."""
    kw = dict(num_q_heads=2, num_kv_heads=1, head_dim=16, page_size=4, window_left=10,
              dtype=torch.float32, device=DEVICE, ring_table=True, num_pages=8)
    swattn.plan_decode([40], block_table=[[0, 1, 2, 3, 4]], **kw)
    with pytest.raises(ValueError, match="ring of 2 columns"):
        swattn.plan_decode([40], block_table=[[0, 1]], **kw)
    with pytest.raises(ValueError, match="block_table"):
        swattn.plan_decode([40], block_table=[[0, 1, -1, 3, 4]], **kw)
    plan = swattn.plan_extend([0, 5], [40], **kw, block_table=[[0, 1, 2, 3, 4]])
    assert plan.path == "triton"


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["hopper-extend", "hopper-decode", "latent-decode"])
def test_gpu_gluon_paths_take_a_ring(path):
    """The Gluon paths (sm_90) over a ring table: the linear table's bits."""
    if path == "hopper-extend":
        case = ExtendCase([3000, 70], [700, 300], num_q_heads=16, num_kv_heads=2, head_dim=128,
                          head_dim_v=128, page_size=16, window_left=1000, dtype=torch.bfloat16,
                          seed=53)
        tensors = build_extend(case, "cuda")
        width = window.ring_width(1000, 700, 16)
        firsts = [window.decode_bounds(p + 1, 1000)[0] // 16 for p in case.prefix_lens]
        ends = [-(-p // 16) for p in case.prefix_lens]
        ring = _ring(tensors[5].cpu(), width, firsts, ends)
        linear = run_extend(*tensors, window_left=1000, hopper=True)
        got = run_extend(*tensors[:5], ring, *tensors[6:], window_left=1000, hopper=True,
                         ring_table=True)
    else:
        latent = path == "latent-decode"
        case = DecodeCase([5000, 1, 2100], num_q_heads=64 if latent else 16,
                          num_kv_heads=1 if latent else 4, head_dim=576 if latent else 128,
                          head_dim_v=512 if latent else 128, page_size=16, window_left=2047,
                          dtype=torch.bfloat16, seed=54)
        q, k_cache, v_cache, table, seq_lens = build_decode(case, "cuda")
        if latent:
            v_cache = k_cache[..., :512]
        width = window.ring_width(2047, 1, 16)
        firsts = [window.decode_bounds(s, 2047)[0] // 16 for s in case.seq_lens]
        ends = [-(-s // 16) for s in case.seq_lens]
        ring = _ring(table.cpu(), width, firsts, ends)
        linear = run_decode(q, k_cache, v_cache, table, seq_lens, window_left=2047)
        got = run_decode(q, k_cache, v_cache, ring, seq_lens, window_left=2047, ring_table=True)
    assert torch.equal(got, linear)
