"""Two-stage extend kernel against the float reference, and its bounds variants against
each other bit for bit. Small odd shapes: this runs under Triton's interpreter on CPU."""

import random

import pytest
import torch
from checks import TOL, assert_bounds_identical, assert_matches_reference
from conftest import DEVICE

import swattn
from swattn import reference
from swattn.ops import extend as ops_extend
from swattn.ops.config import EXTEND_TILINGS
from swattn.plan import run_extend
from swattn.verify.cases import ExtendCase, build_extend, random_mask, rel_err


def run_all_bounds(case, tensors, **kwargs):
    """The kernel under every bounds variant; asserts they are bit-identical."""
    return assert_bounds_identical([run_extend(*tensors, window_left=case.window_left,
                                                                bounds=b, **kwargs)
                                    for b in ops_extend.BOUNDS])


def check_case(case, block_m=None, block_n=None, **kwargs):
    tensors = build_extend(case, DEVICE)
    kw = dict(case.kwargs, **kwargs)
    got = run_all_bounds(case, tensors, block_m=block_m, block_n=block_n, **kw)
    kw.pop("pack_gqa", None)
    assert_matches_reference(got, reference.extend_attention(*tensors,
                                                             window_left=case.window_left, **kw))
    return got


def _matrix(count, seed):
    """Random configurations: windows and prefixes near tile boundaries, ragged batches."""
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        batch = rng.choice([1, 2, 3])
        prefixes = [rng.choice([0, 1, 7, 15, 16, 17, 31, 33, 63]) for _ in range(batch)]
        extends = [rng.choice([1, 2, 7, 15, 16, 17, 33]) for _ in range(batch)]
        hkv = rng.choice([1, 2])
        case = ExtendCase(prefixes, extends, num_q_heads=hkv * rng.choice([1, 3]), num_kv_heads=hkv,
                          head_dim=rng.choice([16, 24]), head_dim_v=rng.choice([16, 8]),
                          page_size=rng.choice([1, 4, 16]),
                          window_left=rng.choice([None, 0, 1, 7, 15, 16, 17, 40]), seed=i)
        kw = {}
        if rng.random() < 0.3:
            kw["sinks"] = torch.randn(case.num_q_heads,
                                      generator=torch.Generator().manual_seed(i)).to(DEVICE)
        if rng.random() < 0.3:
            kw["softcap"] = 5.0
        if rng.random() < 0.25:
            kw["causal"] = False
            kw["window_right"] = rng.choice([None, 0, 3, 16])
        case.kwargs = kw
        cases.append(case)
    return cases


MATRIX = _matrix(24, seed=1234)


@pytest.mark.parametrize("case", MATRIX, ids=[c.id() + f"-{sorted(c.kwargs)}" for c in MATRIX])
def test_random_matrix(case):
    """Half the matrix packs the query heads of a KV group into the rows of a block."""
    check_case(case, block_m=16, block_n=16, pack_gqa=case.seed % 2 == 0)


@pytest.mark.parametrize("tiling", EXTEND_TILINGS, ids=lambda t: f"BM{t[0]}-BN{t[1]}")
def test_every_tiling(tiling):
    case = ExtendCase([65, 0, 129], [70, 9, 1], window_left=63, page_size=16, seed=3)
    check_case(case, block_m=tiling[0], block_n=tiling[1])


@pytest.mark.parametrize("window_left,prefix",
                         [(0, 5), (15, 16), (16, 15), (16, 16), (17, 33), (200, 9)],
                         ids=lambda x: str(x))
def test_window_around_tile_boundaries(window_left, prefix):
    """Windows and prefixes straddling BN = 16; window_left 200 is wider than the sequence."""
    check_case(ExtendCase([prefix, prefix + 1], [17, 16], window_left=window_left, seed=prefix),
               block_m=16, block_n=16)


@pytest.mark.parametrize("pack_gqa", [False, True], ids=["per-head", "packed"])
def test_page_size_1_and_gqa_4(pack_gqa):
    check_case(ExtendCase([33, 7], [13, 20], num_q_heads=8, num_kv_heads=2, page_size=1,
                          window_left=9), block_m=16, block_n=16, pack_gqa=pack_gqa)


@pytest.mark.parametrize("head_dims", [(80, 96), (24, 40)], ids=["d80-dv96", "d24-dv40"])
def test_head_dims_not_powers_of_two(head_dims):
    check_case(ExtendCase([19], [21], head_dim=head_dims[0], head_dim_v=head_dims[1],
                          window_left=12),
               block_m=16, block_n=16)


def test_many_ragged_sequences_find_their_blocks():
    """37 sequences of 0 to 5 new tokens: each program finds its sequence from cu_seqlens
    (a prefix sum of block counts over 64 lanes), empty sequences owning no block."""
    rng = random.Random(37)
    case = ExtendCase([rng.choice([0, 3, 9]) for _ in range(37)],
                      [rng.choice([0, 1, 2, 5]) for _ in range(37)],
                      head_dim=16, head_dim_v=16, page_size=4, window_left=6, seed=37)
    got = check_case(case, block_m=16, block_n=16, pack_gqa=False)
    det = run_extend(*build_extend(case, DEVICE), window_left=6, block_m=16,
                                      block_n=16, pack_gqa=False, deterministic=True)
    assert rel_err(det, got) < TOL


def test_sequences_without_prefix_or_new_tokens():
    check_case(ExtendCase([0, 20, 5, 0], [11, 0, 3, 1], window_left=6), block_m=16, block_n=16)


def test_custom_mask_with_window():
    case = ExtendCase([9, 30], [12, 5], window_left=10, seed=5)
    mask, indptr = random_mask(case.prefix_lens, case.extend_lens, seed=5)
    check_case(case, block_m=16, block_n=16, mask=mask.to(DEVICE), mask_indptr=indptr.to(DEVICE))


def test_masked_out_rows_give_zero_and_minus_inf():
    """A query with no visible key: output 0, lse -inf, never NaN (also with sinks)."""
    case = ExtendCase([4], [6], window_left=None, seed=6)
    mask, indptr = random_mask(case.prefix_lens, case.extend_lens, seed=6)
    mask.view(6, 10)[2] = False
    sinks = torch.randn(case.num_q_heads).to(DEVICE)
    out, lse = check_case(case, block_m=16, block_n=16, mask=mask.to(DEVICE),
                          mask_indptr=indptr.to(DEVICE), sinks=sinks, return_lse=True)
    assert torch.all(out[2] == 0)
    assert torch.all(lse[2] == float("-inf"))


def test_keys_prefix_and_new_merge_to_all():
    """Context-parallel partials: lse of each part, merged, give the full result."""
    case = ExtendCase([23, 40], [9, 18], window_left=20, seed=8)
    sinks = torch.randn(case.num_q_heads).to(DEVICE)
    tensors = build_extend(case, DEVICE)
    parts = [check_case(case, block_m=16, block_n=16, keys=keys, return_lse=True)
             for keys in ("prefix", "new")]
    merged, _ = reference.merge_states([p[0] for p in parts], [p[1] for p in parts], sinks=sinks)
    full = reference.extend_attention(*tensors, window_left=20, sinks=sinks)
    assert rel_err(merged, full) < TOL


def test_out_argument_is_written_and_returned():
    case = ExtendCase([10], [7], window_left=4)
    tensors = build_extend(case, DEVICE)
    out = torch.full((7, case.num_q_heads, case.head_dim_v), float("nan"), dtype=case.dtype,
                     device=DEVICE)
    got = swattn.extend_attention(*tensors, window_left=4, out=out)
    assert got.data_ptr() == out.data_ptr()
    assert rel_err(out, reference.extend_attention(*tensors, window_left=4)) < TOL


def test_public_function_with_lse():
    case = ExtendCase([12, 3], [5, 9], window_left=7, seed=11)
    tensors = build_extend(case, DEVICE)
    out, lse = swattn.extend_attention(*tensors, window_left=7, return_lse=True, softcap=3.0)
    ref_out, ref_lse = reference.extend_attention(*tensors, window_left=7, return_lse=True,
                                                  softcap=3.0)
    assert rel_err(out, ref_out) < TOL
    assert (lse - ref_lse.to(lse.device)).abs().max().item() < 1e-2


def test_full_prefix_and_trimmed_prefix_agree():
    """A block table covering the whole prefix and one with -1 (and NaN pages) below the
    window give the same bits: the bounds alone do the trimming."""
    case = ExtendCase([50], [9], window_left=None, page_size=4, seed=12)
    q, k, v, k_cache, v_cache, block_table, cu, prefix = build_extend(case, DEVICE)
    whole = run_extend(q, k, v, k_cache, v_cache, block_table, cu, prefix,
                                        window_left=8, block_m=16, block_n=16)
    k_cache, v_cache, block_table = k_cache.clone(), v_cache.clone(), block_table.clone()
    for i in range((50 - 8) // 4):  # pages wholly below position 42, the lowest visible
        k_cache[block_table[0, i]] = float("nan")
        v_cache[block_table[0, i]] = float("nan")
        block_table[0, i] = -1
    trimmed = run_extend(q, k, v, k_cache, v_cache, block_table, cu, prefix,
                                          window_left=8, block_m=16, block_n=16)
    assert torch.equal(trimmed, whole)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_real_sizes(dtype):
    case = ExtendCase([0, 128, 1000, 4096], [700, 513, 64, 1100], num_q_heads=16, num_kv_heads=2,
                      head_dim=64, head_dim_v=64, page_size=16, window_left=127, dtype=dtype)
    check_case(case, sinks=torch.randn(16, device=DEVICE))


def test_split_and_single_loop_agree():
    """The mask-free middle loop (window.full_tile_range) gives the bits one masked loop
    gives: its tiles' mask is all true."""
    from swattn.ops.config import Config
    case = ExtendCase([70, 3], [40, 35], window_left=37, seed=21)
    tensors = build_extend(case, DEVICE)
    split, single = (run_extend(*tensors, window_left=37,
                                config=Config(block_m=16, block_n=16, num_warps=4, num_stages=1,
                                              pack_gqa=True, split_full=s))
                     for s in (True, False))
    assert torch.equal(split, single)
    assert rel_err(split, reference.extend_attention(*tensors, window_left=37)) < TOL


@pytest.mark.parametrize("deterministic", [False, True], ids=["two-stage", "deterministic"])
def test_tma_and_pointer_loads_agree(deterministic):
    """Mask-free tiles loaded by tensor-memory copy (new k/v, and a cache whose pages hold
    whole key tiles) give the bits the pointer loads give, and the reference's result. k
    and v are slices of one fused qkv tensor, so a row's stride is not its width."""
    from swattn.ops.config import Config
    case = ExtendCase([70, 0, 33], [40, 50, 19], num_q_heads=4, num_kv_heads=2, head_dim=16,
                      head_dim_v=16, page_size=32, window_left=41, seed=22)
    q, k, v, *rest = build_extend(case, DEVICE)
    qkv = torch.cat([q, k, v], 1)
    k, v = qkv[:, 4:6], qkv[:, 6:8]
    tensors = (q, k, v, *rest)
    configs = [Config(block_m=16, block_n=16, num_warps=4, num_stages=1, pack_gqa=True,
                      split_full=True, tma=tma) for tma in (True, False)]
    assert all(d is not None for d in ops_extend.descriptors(configs[0], k, v, *rest[:2], False))
    with_tma, without = (run_extend(*tensors, window_left=41, config=c,
                                                     deterministic=deterministic)
                         for c in configs)
    assert torch.equal(with_tma, without)
    assert rel_err(with_tma, reference.extend_attention(*tensors, window_left=41)) < TOL


def test_tma_only_where_the_copy_engine_can_take_it():
    """No descriptor for a head dim off the box, a row stride off 16 bytes, or pages
    smaller than a key tile (the cache then loads through pointers)."""
    from swattn.ops.config import Config
    cfg = Config(block_m=16, block_n=16, num_warps=4, num_stages=1, pack_gqa=True, split_full=True)
    x = torch.zeros(10, 2, 16, dtype=torch.bfloat16)
    assert ops_extend.rows_descriptor(x, 16) is not None
    assert ops_extend.rows_descriptor(torch.zeros(10, 2, 24, dtype=torch.bfloat16), 16) is None
    assert ops_extend.rows_descriptor(torch.zeros(10, 2, 19, dtype=torch.bfloat16)[..., :16],
                                      16) is None
    assert ops_extend.rows_descriptor(torch.zeros(10, 3, 16, dtype=torch.bfloat16)[:, :2],
                                      16) is not None
    case = ExtendCase([20], [5], head_dim=16, head_dim_v=16, page_size=4, window_left=None)
    tensors = build_extend(case, "cpu")
    descs = ops_extend.descriptors(cfg, *tensors[1:5], False)
    assert descs[0] is not None and descs[2] is None


def test_h200_config_follows_the_page_size():
    """d128 over pages of 64 (whole key tiles, which the cache loads by TMA) takes 64 x 64
    tiles and 4 warps; over pages of 16, 128 x 64 and 8 warps (scripts/tune.py). Both take
    the Hopper path where the launch can, and so does gpt-oss's d64."""
    from swattn.ops.config import Config, extend_config
    assert extend_config(128, 128, 4, 4095, torch.bfloat16, "cuda", 64) == Config(
        block_m=64, block_n=64, num_warps=4, num_stages=3, pack_gqa=True, split_full=True,
        hopper=True)
    assert extend_config(128, 128, 4, 4095, torch.bfloat16, "cuda", 16) == Config(
        block_m=128, block_n=64, num_warps=8, num_stages=3, pack_gqa=True, split_full=True,
        hopper=True)
    assert extend_config(64, 64, 8, 127, torch.bfloat16, "cuda", 64) == Config(
        block_m=64, block_n=32, num_warps=4, num_stages=2, pack_gqa=True, split_full=False,
        hopper=True)
