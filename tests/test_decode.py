"""Decode kernel against the float reference; its bounds variants and split counts against
each other. Small odd shapes: this runs under Triton's interpreter on CPU."""

import random

import pytest
import torch
from checks import (
    TOL,
    assert_bounds_identical,
    assert_matches_reference,
    latent_inputs,
    replay_after,
    run_fresh,
)
from conftest import DEVICE

import swattn
from swattn import reference
from swattn.ops import decode as ops_decode
from swattn.ops.config import DecodeConfig, HopperDecodeConfig, decode_config, head_blocking
from swattn.plan import run_decode
from swattn.verify.cases import DecodeCase, build_decode, build_sparse, rel_err


def run_all_bounds(tensors, **kwargs):
    """The kernel under every bounds variant; asserts they are bit-identical."""
    return assert_bounds_identical([run_decode(*tensors, bounds=b, **kwargs)
                                    for b in ops_decode.BOUNDS])


def check_case(case, **kwargs):
    tensors = build_decode(case, DEVICE)
    kw = dict(case.kwargs, window_left=case.window_left, **kwargs)
    if case.sparse_keys:
        kw["sparse"] = build_sparse(case, DEVICE)
    got = run_all_bounds(tensors, **kw)
    kw.pop("config", None)  # the kernel's tile config: the reference has none
    want = reference.decode_attention(*tensors, **kw)
    assert_matches_reference(got, want)
    return got


def _matrix(count, seed):
    """Random configurations: lengths and windows around BLOCK_N = 16 and page edges."""
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        batch = rng.choice([1, 2, 3])
        hkv = rng.choice([1, 2])
        case = DecodeCase([rng.choice([1, 7, 15, 16, 17, 33, 65]) for _ in range(batch)],
                          num_q_heads=hkv * rng.choice([1, 2, 4, 8, 16]), num_kv_heads=hkv,
                          head_dim=rng.choice([16, 24, 40]), head_dim_v=rng.choice([16, 8]),
                          page_size=rng.choice([1, 4, 16]),
                          window_left=rng.choice([0, 1, 14, 15, 16, 17, 40, None]),
                          sparse_keys=rng.choice([0, 0, 5, 17]), seed=i)
        kw = {"num_splits": rng.choice([1, 1, 2, 3, None])}
        if rng.random() < 0.3:
            kw["sinks"] = torch.randn(case.num_q_heads,
                                      generator=torch.Generator().manual_seed(i)).to(DEVICE)
        if rng.random() < 0.3:
            kw["softcap"] = 5.0
        if rng.random() < 0.3:
            kw["return_lse"] = True
        if i % 2:
            # The carried path (three stages: the block-table entries carried a tile
            # ahead) and the grid heads first; every third case, unreadable rows flagged in
            # the state (flag_unread) instead of read as NaN.
            kw["config"] = DecodeConfig(block_h=16, block_n=16, num_warps=4, num_stages=3,
                                        heads_first=True, flag_unread=i % 3 == 0)
        elif i % 3 == 0:
            kw["config"] = DecodeConfig(block_h=16, block_n=16, num_warps=4, num_stages=1,
                                        flag_unread=True)
        case.kwargs = kw
        cases.append(case)
    return cases


MATRIX = _matrix(20, seed=4321)


@pytest.mark.parametrize("case", MATRIX,
                         ids=[f"{c.id()}-{sorted(c.kwargs, key=str)}" for c in MATRIX])
def test_random_matrix(case):
    check_case(case)


@pytest.mark.parametrize("group", [1, 2, 4, 8, 16], ids=lambda g: f"group{g}")
def test_gqa_ratios(group):
    check_case(DecodeCase([17, 65, 1], num_q_heads=2 * group, num_kv_heads=2, window_left=15,
                          page_size=4, seed=group), num_splits=1, return_lse=True)


@pytest.mark.parametrize("sparse_keys", [0, 19], ids=lambda k: f"K{k}")
def test_group_cut_into_head_blocks(sparse_keys):
    """A group of 40 query heads in blocks of 16 (3 programs a KV head, the last one part
    empty), as wide heads run: every head against the reference, bounds identical, with
    splits, sinks and lse."""
    case = DecodeCase([33, 5, 17], num_q_heads=80, num_kv_heads=2, window_left=14, page_size=4,
                      sparse_keys=sparse_keys, seed=7)
    tensors = build_decode(case, DEVICE)
    kw = dict(window_left=14,
              sinks=torch.randn(80, generator=torch.Generator().manual_seed(7)).to(DEVICE),
              return_lse=True)
    if sparse_keys:
        kw["sparse"] = build_sparse(case, DEVICE)
    want = reference.decode_attention(*tensors, **kw)
    for splits, config in (
            (1, DecodeConfig(block_h=16, block_n=16, num_warps=4, num_stages=1)),
            (3, DecodeConfig(block_h=16, block_n=16, num_warps=4, num_stages=1)),
            (3, DecodeConfig(block_h=16, block_n=16, num_warps=4, num_stages=3, heads_first=True))):
        got = run_all_bounds(tensors, num_splits=splits, config=config, **kw)
        assert_matches_reference(got, want)


def test_head_blocking():
    assert head_blocking(DecodeConfig(block_h=16, block_n=16, num_warps=4, num_stages=2),
                         64) == (16, 4)
    assert head_blocking(DecodeConfig(block_h=16, block_n=16, num_warps=4, num_stages=2),
                         40) == (16, 3)
    assert head_blocking(DecodeConfig(block_h=16, block_n=64, num_warps=4, num_stages=2),
                         8) == (16, 1)
    assert head_blocking(DecodeConfig(block_h=32, block_n=64, num_warps=4, num_stages=2),
                         32) == (32, 1)
    # DeepSeek-style heads on the GPU: 16 heads and 16 keys a program.
    assert decode_config(576, 512, 64, torch.bfloat16, "cuda") == DecodeConfig(
        block_h=16, block_n=32, num_warps=4, num_stages=2, flag_unread=True)


@pytest.mark.parametrize("page_size", [1, 4, 16], ids=lambda p: f"ps{p}")
@pytest.mark.parametrize("window_left", [0, 1, 14, 16, 40], ids=lambda w: f"L{w}")
def test_exactly_window_plus_one_keys(page_size, window_left):
    """SGLang's Triton decode keeps one key too few. Every key gets the same score and a
    value one-hot in its position, so the output is 1/n on exactly the positions seen:
    L + 1 of them, [S - 1 - L, S), whatever the page size and split count."""
    seq_len, dv = 50, 64
    case = DecodeCase([seq_len], num_q_heads=2, num_kv_heads=1, head_dim=16, head_dim_v=dv,
                      page_size=page_size, window_left=None)
    q, k_cache, v_cache, block_table, seq_lens = build_decode(case, DEVICE)
    positions = torch.arange(seq_len, device=DEVICE)
    pages, offsets = block_table[0].long()[positions // page_size], positions % page_size
    k_cache[pages, offsets] = 0.0
    v_cache[pages, offsets] = torch.eye(dv, dtype=v_cache.dtype,
                                        device=DEVICE)[positions][:, None, :]
    for splits in (1, 3):
        out = run_decode(q, k_cache, v_cache, block_table, seq_lens,
                                          window_left=window_left, num_splits=splits)
        seen = (out[0, 0] != 0).nonzero().flatten().tolist()
        assert seen == list(range(seq_len - 1 - window_left, seq_len)), (splits, seen)
        expected = torch.full((window_left + 1,), 1.0 / (window_left + 1), dtype=out.dtype)
        assert torch.allclose(out[0, :, seen].cpu(), expected.expand(2, -1), rtol=1e-3, atol=0)


@pytest.mark.parametrize("window_left", [None, 40, 0], ids=lambda w: f"L{w}")
def test_seq_len_shorter_than_window_and_zero(window_left):
    """seq_len 0 sees nothing: output 0 and lse -inf, also with sinks and splits."""
    case = DecodeCase([0, 1, 7, 0, 33], window_left=window_left, seed=5)
    sinks = torch.randn(case.num_q_heads).to(DEVICE)
    for splits in (1, 4):
        out, lse = check_case(case, sinks=sinks, num_splits=splits, return_lse=True)
        assert torch.all(out[[0, 3]] == 0)
        assert torch.all(lse[[0, 3]] == float("-inf"))


def test_splits_equal_single_pass():
    """Split-KV over 1..8 chunks equals the single pass to rounding (fp16 outputs: a few
    ulps), lse to float32 rounding."""
    case = DecodeCase([65, 17, 40, 1], num_q_heads=8, num_kv_heads=2, page_size=4,
                      window_left=63, sparse_keys=9, seed=9)
    tensors = build_decode(case, DEVICE)
    kw = dict(window_left=63, sinks=torch.randn(8).to(DEVICE), sparse=build_sparse(case, DEVICE),
              return_lse=True)
    single_out, single_lse = run_decode(*tensors, num_splits=1, **kw)
    assert_matches_reference((single_out, single_lse), reference.decode_attention(*tensors, **kw))
    for splits in range(2, 9):
        out, lse = run_decode(*tensors, num_splits=splits, **kw)
        assert (out.float() - single_out.float()).abs().max().item() <= 2e-3, splits
        assert (lse - single_lse).abs().max().item() <= 1e-5, splits


def test_bounds_bit_identical_with_splits():
    """The split chunking is defined on the window for every bounds variant, so skip and
    none (split 0 walks from position 0) give the tight bits at any split count."""
    case = DecodeCase([65, 33, 7], num_q_heads=4, num_kv_heads=2, page_size=16, window_left=17,
                      seed=13)
    tensors = build_decode(case, DEVICE)
    for splits in (2, 5):
        run_all_bounds(tensors, window_left=17, num_splits=splits, return_lse=True)


def test_sparse_keys_with_minus_one_and_duplicates():
    case = DecodeCase([33, 16, 1], num_q_heads=8, num_kv_heads=2, window_left=14, sparse_keys=21,
                      seed=17)
    k_pool, v_pool, idx = build_sparse(case, DEVICE)
    assert (idx == -1).any() and (idx[:, 0] == idx[:, -1]).all()
    check_case(case, num_splits=1, softcap=4.0, return_lse=True)
    check_case(case, num_splits=4, sinks=torch.randn(8).to(DEVICE))


def test_sparse_all_minus_one_is_no_sparse():
    """Tiles of -1 entries are fully masked: the state, and so the bits, are unchanged."""
    case = DecodeCase([40, 9], window_left=16, seed=19)
    tensors = build_decode(case, DEVICE)
    k_pool = torch.full((5, 2, 16), float("nan"), dtype=torch.float16, device=DEVICE)
    idx = torch.full((2, 19), -1, dtype=torch.int32, device=DEVICE)
    plain = run_decode(*tensors, window_left=16, num_splits=1)
    with_sparse = run_decode(*tensors, window_left=16, num_splits=1,
                                              sparse=(k_pool, k_pool, idx))
    assert torch.equal(plain, with_sparse)


def test_sparse_only_sequence():
    """seq_len 0 with sparse keys attends to the sparse keys alone."""
    check_case(DecodeCase([0, 5], window_left=3, sparse_keys=6, seed=23), num_splits=2,
               return_lse=True)


def test_full_block_table_and_trimmed_agree():
    """A block table covering the whole sequence and one with -1 (and NaN pages) below the
    window give the same bits: nothing below the window is read."""
    case = DecodeCase([50, 23], window_left=None, page_size=4, seed=29)
    q, k_cache, v_cache, block_table, seq_lens = build_decode(case, DEVICE)
    whole = run_decode(q, k_cache, v_cache, block_table, seq_lens, window_left=8)
    k_cache, v_cache, block_table = k_cache.clone(), v_cache.clone(), block_table.clone()
    for b, s in enumerate((50, 23)):
        for i in range((s - 1 - 8) // 4):  # pages wholly below the window
            k_cache[block_table[b, i]] = float("nan")
            v_cache[block_table[b, i]] = float("nan")
            block_table[b, i] = -1
    trimmed = run_decode(q, k_cache, v_cache, block_table, seq_lens, window_left=8)
    assert torch.equal(trimmed, whole)


def test_out_argument_is_written_and_returned():
    case = DecodeCase([10, 3], window_left=4)
    tensors = build_decode(case, DEVICE)
    out = torch.full((2, case.num_q_heads, case.head_dim_v), float("nan"), dtype=case.dtype,
                     device=DEVICE)
    got = swattn.decode_attention(*tensors, window_left=4, out=out)
    assert got.data_ptr() == out.data_ptr()
    assert rel_err(out, reference.decode_attention(*tensors, window_left=4)) < TOL


def test_public_function_with_everything():
    case = DecodeCase([12, 30, 0], num_q_heads=8, num_kv_heads=2, head_dim=24, head_dim_v=8,
                      window_left=7, sparse_keys=6, seed=31)
    tensors = build_decode(case, DEVICE)
    kw = dict(window_left=7, sinks=torch.randn(8).to(DEVICE), softcap=3.0, scale=0.3,
              sparse=build_sparse(case, DEVICE), return_lse=True)
    for splits in (None, 1, 3):
        got = swattn.decode_attention(*tensors, num_splits=splits, **kw)
        assert_matches_reference(got, reference.decode_attention(*tensors, **kw))


@pytest.mark.parametrize("head_dim", [40, 36, 48], ids=lambda d: f"d{d}")
def test_key_head_split_into_two_products(head_dim):
    """A key head past a power of two runs as two products (DeepSeek's 576 as 512 + 64;
    here 40 = 32 + 16 whole, 36 = 32 + a masked tail, 48 = 32 + 16), with a value head of
    its own width, sparse keys, sinks, every split count."""
    from swattn.ops.config import split_width
    assert split_width(head_dim)[1] == 16 and split_width(576) == (512, 64)
    case = DecodeCase([40, 3, 77], num_q_heads=4, num_kv_heads=1, head_dim=head_dim, head_dim_v=32,
                      window_left=20, sparse_keys=9, page_size=4, seed=head_dim)
    sinks = torch.randn(4).to(DEVICE)
    for splits in (1, 2, 3):
        check_case(case, num_splits=splits, sinks=sinks, return_lse=True)


@pytest.mark.parametrize("head_dim, head_dim_v", [(40, 32), (32, 32)], ids=["d40-v32", "d32-v32"])
def test_latent_cache_reads_values_from_the_key_tiles(head_dim, head_dim_v):
    """Over a latent cache (DeepSeek's MLA: 576 key columns, the values their first 512)
    each tile is loaded once for both products: the same bits as the values given as their
    own copy, under every bounds variant and split count, and the reference's answer."""
    case = DecodeCase([40, 3, 77, 0], num_q_heads=4, num_kv_heads=1, head_dim=head_dim,
                      head_dim_v=head_dim_v, window_left=20, sparse_keys=9, page_size=4, seed=41)
    tensors = build_decode(case, DEVICE)
    q, k_cache, _, block_table, seq_lens = tensors
    latent, copied = latent_inputs(case, tensors, build_sparse(case, DEVICE))
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(41)).to(DEVICE)
    for splits in (1, 3):
        kw = dict(window_left=20, sinks=sinks, num_splits=splits, return_lse=True)
        got = run_all_bounds((q, k_cache, latent[0], block_table, seq_lens), sparse=latent[1], **kw)
        own = run_all_bounds((q, k_cache, copied[0], block_table, seq_lens), sparse=copied[1], **kw)
        assert all(torch.equal(a, b) for a, b in zip(got, own)), splits
        assert_matches_reference(got, reference.decode_attention(
            q, k_cache, latent[0], block_table, seq_lens, sparse=latent[1], **kw))
    # The plan took the one-load kernel for the latent cache only.
    plan = swattn.plan.plan_decode(case.seq_lens, num_q_heads=4, num_kv_heads=1,
                                   head_dim=head_dim, head_dim_v=head_dim_v, page_size=4,
                                   window_left=20, sparse_keys=9, dtype=case.dtype, device=DEVICE)
    for v_cache, sparse in (latent, copied):
        plan.run(q, k_cache, v_cache, block_table, sparse=sparse)
    assert sorted(key[3] for key in plan.launches) == [False, True]


def test_custom_op_registration():
    """Schema, fake (meta) implementation and the mutation of out/lse, as torch checks them;
    and a whole graph (decode, then merge) under torch.compile."""
    case = DecodeCase([9, 4], window_left=4, sparse_keys=3)
    q, k_cache, v_cache, block_table, seq_lens = build_decode(case, DEVICE)
    k_pool, v_pool, idx = build_sparse(case, DEVICE)
    out = torch.zeros(2, 4, 16, dtype=torch.float16, device=DEVICE)
    lse = torch.zeros(2, 4, device=DEVICE)
    torch.library.opcheck(torch.ops.swattn.decode_attention.default,
                          (q, k_cache, v_cache, block_table, seq_lens,
                           torch.randn(4, device=DEVICE), k_pool, v_pool, idx,
                           out, lse, None, None, 4, -1, 0.0, 0.0, 2))

    def layer(q, k_cache, v_cache, block_table, seq_lens):
        o, s = swattn.decode_attention(q * 1.0, k_cache, v_cache, block_table, seq_lens,
                                       window_left=4, return_lse=True, num_splits=2)
        return swattn.merge_states([o, o], [s, s])

    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    for a, b in zip(compiled(q, k_cache, v_cache, block_table, seq_lens),
                    layer(q, k_cache, v_cache, block_table, seq_lens)):
        assert torch.equal(a, b)


# ---- argument checks: each names the argument ---------------------------------------

def _args():
    return list(build_decode(DecodeCase([9, 4], window_left=4, page_size=4), DEVICE))


NAMES = ["q", "k_cache", "v_cache", "block_table", "seq_lens"]


def _on_device(x):
    """Bad values are made on the CPU; on a GPU machine they move to it (tuples too), so
    each test meets the check it is about, not the device check."""
    if isinstance(x, tuple):
        return tuple(map(_on_device, x))
    return x.to(DEVICE) if isinstance(x, torch.Tensor) else x


def _replace(name, value):
    args = _args()
    args[NAMES.index(name)] = _on_device(value(args[NAMES.index(name)]))
    return args


BAD_TENSORS = [
    ("q", lambda t: t.float().cpu().numpy(), TypeError, "q must be a torch.Tensor"),
    ("q", lambda t: t.to(torch.int32), TypeError, "q must be one of"),
    ("q", lambda t: t[:1], ValueError, "q must have shape"),
    ("q", lambda t: torch.randn(2, 3, 16).half(), ValueError, "q must have a multiple of 2 heads"),
    ("k_cache", lambda t: t.float(), TypeError, "k_cache must be torch.float16"),
    ("k_cache", lambda t: t[..., :8].contiguous(), ValueError,
     "q and k_cache disagree on the head dim"),
    ("v_cache", lambda t: t[:-1], ValueError, "k_cache and v_cache disagree on the page count"),
    ("v_cache", lambda t: t[..., 0], ValueError, "v_cache must have 4 dimensions"),
    ("block_table", lambda t: t.to(torch.int64), TypeError, "block_table must be torch.int32"),
    ("block_table", lambda t: t[:1], ValueError, "block_table must have shape"),
    ("seq_lens", lambda t: t[:1], ValueError, "seq_lens must have shape"),
    ("seq_lens", lambda t: t.long(), TypeError, "seq_lens must be torch.int32"),
]


@pytest.mark.parametrize("name,bad,error,message", BAD_TENSORS,
                         ids=[f"{b[0]}-{b[3]}" for b in BAD_TENSORS])
def test_bad_tensor(name, bad, error, message):
    with pytest.raises(error, match=message):
        swattn.decode_attention(*_replace(name, bad), window_left=4)


def _pool(rows=5, heads=2, d=16, dtype=torch.float16):
    return torch.randn(rows, heads, d).to(dtype)


def _idx(rows=2, k=3, value=0):
    return torch.full((rows, k), value, dtype=torch.int32)


BAD_KWARGS = [
    ({"window_left": -1}, ValueError, "window_left must be >= 0"),
    ({"window_left": 3.0}, TypeError, "window_left must be an int"),
    ({"softcap": -1.0}, ValueError, "softcap must be"),
    ({"scale": 0.0}, ValueError, "scale must be"),
    ({"num_splits": 0}, ValueError, "num_splits must be an int >= 1"),
    ({"num_splits": 2.0}, TypeError, "num_splits must be an int >= 1"),
    ({"sinks": torch.zeros(3)}, ValueError, "sinks must have shape"),
    ({"sinks": torch.zeros(4, dtype=torch.float16)}, TypeError, "sinks must be torch.float32"),
    ({"sparse": (_pool(), _pool())}, TypeError, "sparse must be a tuple"),
    ({"sparse": _pool()}, TypeError, "sparse must be a tuple"),
    ({"sparse": (_pool(), _pool(), None)}, TypeError, "sparse idx must be a torch.Tensor"),
    ({"sparse": (_pool(d=8), _pool(), _idx())}, ValueError, "sparse k_pool must have shape"),
    ({"sparse": (_pool(), _pool(rows=4), _idx())}, ValueError,
     "sparse k_pool and sparse v_pool disagree on the pool size"),
    ({"sparse": (_pool(), _pool(dtype=torch.float32), _idx())}, TypeError,
     "sparse v_pool must be torch.float16"),
    ({"sparse": (_pool(), _pool(), _idx(rows=3))}, ValueError, "sparse idx must have shape"),
    ({"sparse": (_pool(), _pool(), _idx().long())}, TypeError, "sparse idx must be torch.int32"),
    ({"out": torch.empty(2, 4, 15, dtype=torch.float16)}, ValueError, "out must have shape"),
    ({"out": torch.empty(2, 4, 16, dtype=torch.float32)}, TypeError, "out must be torch.float16"),
]


@pytest.mark.parametrize("kwargs,error,message", BAD_KWARGS, ids=[b[2] for b in BAD_KWARGS])
def test_bad_keyword(kwargs, error, message):
    with pytest.raises(error, match=message):
        swattn.decode_attention(*_args(), **{k: _on_device(v) for k, v in kwargs.items()})


def test_bad_bounds():
    with pytest.raises(ValueError, match="bounds must be one of"):
        run_decode(*_args(), bounds="loose")


# ---- config: pure functions ---------------------------------------------------------

def test_decode_config():
    # Up to d128 the Gluon path where the launch can take it (long windows on sm_90).
    assert decode_config(64, 64, 8, torch.bfloat16, "cuda") == DecodeConfig(
        block_h=16, block_n=128, num_warps=4, num_stages=2, hopper=True)
    # d128: 64-key tiles in 2 stages (4 programs an SM on the H200), the grid heads first.
    assert decode_config(128, 128, 4, torch.bfloat16, "cuda") == DecodeConfig(
        block_h=16, block_n=64, num_warps=4, num_stages=2, heads_first=True, hopper=True)
    assert decode_config(256, 256, 4, torch.bfloat16, "cuda") == DecodeConfig(
        block_h=16, block_n=32, num_warps=4, num_stages=2)
    # Unreadable rows flagged in the state where that code ran faster: wide heads (S), and
    # d64 over an fp8 cache (C-A).
    assert decode_config(576, 512, 64, torch.bfloat16, "cuda").flag_unread
    assert decode_config(64, 64, 8, torch.bfloat16, "cuda", torch.float8_e4m3fn).flag_unread
    assert not decode_config(128, 128, 4, torch.bfloat16, "cuda", torch.float8_e4m3fn).flag_unread
    assert decode_config(128, 128, 32, torch.float16, "cuda").block_h == 32
    assert decode_config(16, 8, 3, torch.float16, "cpu") == DecodeConfig(
        block_h=16, block_n=16, num_warps=4, num_stages=1)


def _splits(block_n, *args):
    return DecodeConfig(block_h=16, block_n=block_n, num_warps=4, num_stages=2).splits(*args)


def test_decode_splits():
    # gpt-oss batch 64 (2 KV heads, window 128): 128 keys are too few to split.
    assert _splits(128, 64, 2, 128, 132) == 1
    # A window of 1024 keys at batch 8: capped at 2 splits of 512 keys.
    assert _splits(64, 8, 2, 1024, 132) == 2
    # DeepSeek-style (64 x 4 head blocks, 128 + 480 keys): one split.
    assert _splits(16, 64, 4, 608, 132) == 1
    # Capped at the tiles one sequence holds.
    assert _splits(512, 1, 1, 1024, 132) == 2
    # One long full-attention sequence, 8 KV heads: 2 x 132 SMs worth of programs.
    assert _splits(64, 1, 8, 32768, 132) == 33
    # A big batch already fills the GPU.
    assert _splits(64, 512, 8, 4096, 132) == 1
    assert _splits(64, 1, 1, 0, 132) == 1


def test_hopper_decode_splits():
    # C-B (512 programs of a 4097-key window) is past one wave of 2 x 132: whole windows.
    assert HopperDecodeConfig().splits(64, 8, 4097, 132) == 1
    # C-F (128 programs, full attention over 32k): two splits fill one wave, four would not.
    assert HopperDecodeConfig().splits(64, 2, 32768, 132) == 2
    # Few programs: capped by the keys (512 a split at least) and the tiles.
    assert HopperDecodeConfig().splits(4, 8, 4097, 132) == 8
    assert HopperDecodeConfig().splits(1, 1, 32768, 132) == 64
    assert HopperDecodeConfig().splits(1, 1, 0, 132) == 1


# ---- compiles for the H200 without one ------------------------------------------------

_COMPILE_SM90 = r"""
import sys, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from swattn.verify.asm import kernel
decode_kernel, merge_kernel = kernel("decode"), kernel("merge")

def compile_sm90(fn, pointers, consts, warps, stages=2):
    # The feature flags these compiles leave off (chunked attention, ring block tables).
    consts = {**{k: False for k in ("USE_CHUNK", "RING") if k in fn.arg_names}, **consts}
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        sig[name] = ("constexpr" if name in consts else pointers.get(name)
                     or ("fp32" if name in ("qk_scale", "softcap") else "i32"))
        if name in pointers or name.startswith("stride_"):
            attrs[(i,)] = [["tt.divisibility", 16]]  # what the JIT specialises typical strides to
    kernel = triton.compile(ASTSource(fn, sig, constexprs=consts, attrs=attrs),
                            target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=warps, num_stages=stages))
    return kernel.asm

bf16 = {n: "*bf16" for n in ("Q", "K_cache", "V_cache", "K_pool", "V_pool", "Out")}
f32 = {n: "*fp32" for n in ("sinks", "Lse", "Part_o", "Part_lse", "Parts_o", "Parts_lse")}
i32 = {n: "*i32" for n in ("block_table", "seq_lens", "Idx")}
# (head dim, value dim, main/tail widths, window, sparse, partial, tight): 576 = 512 + 64,
# its values from the key tiles (a latent cache).
for d, dv, (bd, bd2), window, sparse, partial, tight in (
        (64, 64, (64, 0), True, False, False, True), (128, 128, (128, 0), False, True, True, False),
        (576, 512, (512, 64), True, True, False, True)):
    ptx = compile_sm90(decode_kernel, {**bf16, **f32, **i32}, dict(
        D=d, DV=dv, BLOCK_D=bd, BLOCK_D2=bd2 or 16, SPLIT_D=bd2 > 0, BLOCK_DV=dv, GROUP=8,
        BLOCK_H=16, BLOCK_N=64 if d <= 128 else 16, USE_WINDOW=window, HAS_SINKS=True,
        USE_SOFTCAP=True, HAS_SPARSE=sparse, WRITE_PARTIAL=partial, RETURN_LSE=True, TIGHT=tight,
        SKIP=not tight, CARRY=not tight, FLAG_UNREAD=d > 128, V_IN_K=d > 128,
        HEADS_FIRST=not tight, PDL=partial), 4)["ptx"]
    assert "mma.sync" in ptx, "the head-group products are not tensor-core dots"
    assert ("griddepcontrol.launch_dependents" in ptx) == partial, (
        "the split kernel lets the merge start")
# An fp8 cache under a head of 40 (32 + a tail of 16, its columns masked), unreadable rows
# flagged (FLAG_UNREAD), sparse keys and splits: what the interpreter runs without the
# compiler's checks (a function's returns must agree in type, dead branches too).
fp8 = {**bf16, **{n: "*fp8e4nv" for n in ("K_cache", "V_cache", "K_pool", "V_pool")},
       "k_scale": "*fp32", "v_scale": "*fp32"}
for flag in (False, True):
    ptx = compile_sm90(decode_kernel, {**fp8, **f32, **i32}, dict(
        D=40, DV=40, BLOCK_D=32, BLOCK_D2=16, SPLIT_D=True, BLOCK_DV=64, GROUP=8, BLOCK_H=16,
        BLOCK_N=64, USE_WINDOW=True, HAS_SINKS=True, USE_SOFTCAP=False, HAS_SPARSE=True,
        WRITE_PARTIAL=True, RETURN_LSE=False, TIGHT=True, SKIP=False, CARRY=False,
        FLAG_UNREAD=flag, V_IN_K=False, HEADS_FIRST=False, PDL=True, K_SCALE_STRIDE=1,
        V_SCALE_STRIDE=1), 4)["ptx"]
    assert "mma.sync" in ptx, "the fp8 products are not tensor-core dots"
# The carried path (d128, 32-key tiles, 3 stages): the block-table entries carried a tile
# ahead let the pipeliner double-buffer the K and V copies; loaded in the iteration that
# uses them, they hold each copy to one buffer.
for carry, want in ((True, 2), (False, 0)):
    ttgir = compile_sm90(decode_kernel, {**bf16, **f32, **i32}, dict(
        D=128, DV=128, BLOCK_D=128, BLOCK_D2=16, SPLIT_D=False, BLOCK_DV=128, GROUP=4,
        BLOCK_H=16, BLOCK_N=32, USE_WINDOW=True, HAS_SINKS=False, USE_SOFTCAP=False,
        HAS_SPARSE=False, WRITE_PARTIAL=False, RETURN_LSE=False, TIGHT=True, SKIP=False,
        CARRY=carry, FLAG_UNREAD=False, V_IN_K=False, HEADS_FIRST=True, PDL=False), 4,
        stages=3)["ttgir"]
    buffers = ttgir.count("ttg.local_alloc : () -> !ttg.memdesc<2x32x128xbf16")
    assert buffers == want, f"carry {carry}: {buffers} two-deep K/V buffers, expected {want}"
for wait in (False, True):
    ptx = compile_sm90(merge_kernel, {**f32, "Out": "*bf16"},
                       dict(DV=64, BLOCK_S=8, BLOCK_DV=64, HAS_SINKS=True, RETURN_LSE=True,
                            FINITE=wait, WAIT=wait), 1)["ptx"]
    assert ("griddepcontrol.wait" in ptx) == wait, "the PDL merge waits for the split kernel"
print("compiled")
"""


def test_kernels_compile_for_sm90():
    """The interpreter accepts code the compiler rejects (and never emits a tensor-core dot):
    compile the decode and merge kernels for sm_90 with Triton's own ptxas, no GPU needed."""
    result = run_fresh(_COMPILE_SM90, timeout=300)
    if result.returncode and "ptxas" in result.stderr and "not found" in result.stderr.lower():
        pytest.skip("Triton's ptxas is not available")
    assert result.returncode == 0 and "compiled" in result.stdout, result.stderr[-3000:]


# ---- GPU: real size and CUDA-graph capture ---------------------------------------------

@pytest.mark.gpu
def test_gpu_gpt_oss_decode_and_cuda_graph():
    """gpt-oss decode at serving size (batch 64, 32k context in pages of 16, window 127,
    16/2 heads of 64, sinks, bf16) against the reference; then launch() captured in a CUDA
    graph and replayed after seq_lens changed in place."""
    batch, context, window_left = 64, 32768, 127
    gen = torch.Generator().manual_seed(41)
    lens = torch.randint(1, context + 1, (batch,), generator=gen)
    lens[:4] = torch.tensor([1, 127, 128, context])
    sinks = torch.randn(16, device="cuda")
    kw = dict(window_left=window_left, sinks=sinks, return_lse=True)

    def check(out, lse, tensors):
        ref_out, ref_lse = reference.decode_attention(*tensors, **kw)
        assert rel_err(out, ref_out) < 1e-2
        assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
        fin = torch.isfinite(ref_lse)
        assert (lse[fin] - ref_lse[fin]).abs().max().item() < 1e-2

    # Only the windows are written, pages below them freed (-1): the serving layout.
    windowed = DecodeCase(lens.tolist(), num_q_heads=16, num_kv_heads=2, head_dim=64,
                          head_dim_v=64, page_size=16, window_left=window_left,
                          dtype=torch.bfloat16, seed=41)
    tensors = build_decode(windowed, "cuda")
    for splits in (None, 1, 4):
        check(*swattn.decode_attention(*tensors, num_splits=splits, **kw), tensors)

    # Graph capture of a plan's run, replayed after replan: every page written, so the
    # shorter lengths of the replay find keys.
    whole = DecodeCase(lens.tolist(), num_q_heads=16, num_kv_heads=2, head_dim=64,
                       head_dim_v=64, page_size=16, window_left=None, dtype=torch.bfloat16, seed=43)
    tensors = build_decode(whole, "cuda")
    q, k_cache, v_cache, block_table, seq_lens = tensors
    plan = swattn.plan_decode(lens.tolist(), num_q_heads=16, num_kv_heads=2, head_dim=64,
                              page_size=16, window_left=window_left, return_lse=True)
    # (compiles outside the capture)
    out, lse = plan.run(q, k_cache, v_cache, block_table, sinks=sinks)
    torch.cuda.synchronize()
    check(out, lse, tensors)
    new_lens = lens * 3 // 4
    new_lens[0] = 0
    replay_after(lambda: plan.run(q, k_cache, v_cache, block_table, sinks=sinks, out=out, lse=lse),
                 lambda: plan.replan(new_lens.tolist()), out)
    seq_lens.copy_(new_lens.to(torch.int32))  # what the reference reads
    check(out, lse, tensors)


@pytest.mark.gpu
def test_gpu_deepseek_sparse_window_decode():
    """DeepSeek-style decode at serving size: 64 query heads on one KV head of 576/512
    (padded to 1024/512, so the group runs in blocks of 16 heads), window 128 plus 480
    sparse pool rows per sequence, bf16, against the reference, each split count."""
    case = DecodeCase([32768, 100, 129, 5000] * 4, num_q_heads=64, num_kv_heads=1, head_dim=576,
                      head_dim_v=512, page_size=64, window_left=127, sparse_keys=480,
                      pool_rows=4096, dtype=torch.bfloat16, seed=51)
    tensors = build_decode(case, "cuda")
    sparse = build_sparse(case, "cuda")
    sinks = torch.randn(64, device="cuda")
    want = reference.decode_attention(*tensors, window_left=127, sinks=sinks, sparse=sparse,
                                      return_lse=True)
    for splits in (None, 1, 4):
        got = run_all_bounds(tensors, window_left=127, sinks=sinks, sparse=sparse,
                             num_splits=splits, return_lse=True)
        assert_matches_reference(got, want)


@pytest.mark.gpu
def test_gpu_mistral_decode_splits_and_cuda_graph():
    """Mistral-style decode at C-B's size (batch 64, 32/8 heads of 128, window 4096 in
    pages of 16, bf16) in the Triton kernel (the library's default there is the Gluon
    path, tests/test_decode_hopper.py), the Triton chooser's split count (one) and three
    splits merged by a second kernel (on sm_90 launched by PDL), against the reference;
    each captured in a CUDA graph and replayed after seq_lens changed in place."""
    batch, window_left = 64, 4095
    gen = torch.Generator().manual_seed(71)
    lens = torch.randint(1, 8193, (batch,), generator=gen)
    lens[:5] = torch.tensor([1, 4095, 4096, 4097, 8192])
    case = DecodeCase(lens.tolist(), num_q_heads=32, num_kv_heads=8, head_dim=128, head_dim_v=128,
                      page_size=16, window_left=None, dtype=torch.bfloat16, seed=71)
    tensors = build_decode(case, "cuda")
    q, k_cache, v_cache, block_table, seq_lens = tensors
    kw = dict(window_left=window_left, return_lse=True)
    pdl = torch.cuda.get_device_capability()[0] >= 9

    def check(out, lse):
        ref_out, ref_lse = reference.decode_attention(*tensors, **kw)
        assert rel_err(out, ref_out) < 1e-2
        assert (lse - ref_lse).abs().max().item() < 1e-2

    for splits, (want_splits, want_pdl) in ((None, (1, False)), (3, (3, pdl))):
        seq_lens.copy_(lens.to(torch.int32))
        plan = swattn.plan_decode(lens.tolist(), num_q_heads=32, num_kv_heads=8, head_dim=128,
                                  page_size=16, num_splits=splits, hopper=False, **kw)
        assert (plan.path, plan.num_splits, plan.spec.pdl) == ("triton", want_splits, want_pdl)
        out, lse = plan.run(q, k_cache, v_cache, block_table)
        torch.cuda.synchronize()
        check(out, lse)
        new_lens = (lens * 2 // 3).clamp(min=1)
        replay_after(lambda: plan.run(q, k_cache, v_cache, block_table, out=out, lse=lse),
                     lambda: plan.replan(new_lens.tolist()), out)
        seq_lens.copy_(new_lens.to(torch.int32))
        check(out, lse)
