"""Chunked local attention (attention_chunk, Llama 4) and the new tokens' positions
(speculative trees): against the float64 reference, the bounds variants bit for bit, pages
outside every query's chunk and window never read (their entries -1)."""

import pytest
import torch
from checks import assert_bounds_identical, assert_matches_reference
from conftest import DEVICE

import swattn
from swattn import reference
from swattn.ops import extend as ops_extend
from swattn.plan import run_decode, run_extend
from swattn.verify.cases import ExtendCase, build_extend, random_tree

VARIANTS = ops_extend.BOUNDS


def _drop_unread_pages(tensors, case, chunk, positions=None):
    """The block table with every entry below each sequence's lowest readable key (its
    lowest query's window and chunk, the test's own statement of the convention) set to
    -1: an engine may have freed those pages."""
    table = tensors[5].clone()
    cu = [0]
    for e in case.extend_lens:
        cu.append(cu[-1] + e)
    for b, p in enumerate(case.prefix_lens):
        if case.extend_lens[b] == 0:
            continue
        first = p if positions is None else int(positions[cu[b]:cu[b + 1]].min())
        low = 0 if case.window_left is None else max(first - case.window_left, 0)
        if chunk is not None:
            low = max(low, first // chunk * chunk)
        table[b, :low // case.page_size] = -1
    return (*tensors[:5], table, *tensors[6:])


CHUNK_CASES = [
    ExtendCase([0, 33, 5], [20, 17, 1], window_left=None, page_size=4, seed=11),
    ExtendCase([13, 40], [30, 9], window_left=6, page_size=4, seed=12),
    ExtendCase([64, 2], [33, 40], window_left=None, page_size=16, num_q_heads=6,
               num_kv_heads=2, seed=13),
    ExtendCase([7], [50], window_left=20, page_size=1, head_dim=24, head_dim_v=8, seed=14),
]
CHUNKS = [1, 16, 100]


@pytest.mark.parametrize("deterministic", [False, True], ids=["two-stage", "single-pass"])
@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("case", CHUNK_CASES, ids=lambda c: c.id())
def test_extend_chunk(case, chunk, deterministic):
    """Each query sees its own chunk only (blocks straddling a chunk boundary included);
    tight, skip and none give the same bits; the pages below every query's chunk are -1."""
    tensors = _drop_unread_pages(build_extend(case, DEVICE), case, chunk)
    got = assert_bounds_identical([
        run_extend(*tensors, window_left=case.window_left, attention_chunk=chunk, bounds=b,
                   deterministic=deterministic, block_m=16, block_n=16)
        for b in VARIANTS])
    want = reference.extend_attention(*tensors, window_left=case.window_left,
                                      attention_chunk=chunk)
    assert_matches_reference(got, want)


@pytest.mark.parametrize("tiles", [(16, 32), (32, 16)], ids=lambda t: f"m{t[0]}-n{t[1]}")
def test_extend_chunk_tilings_and_features(tiles):
    """Other tilings, non-causal with a right window, soft-cap and sinks, lse."""
    case = ExtendCase([9, 70], [40, 25], window_left=30, page_size=8, seed=15)
    tensors = build_extend(case, DEVICE)
    g = torch.Generator().manual_seed(16)
    sinks = torch.randn(case.num_q_heads, generator=g).to(DEVICE)
    for kw in ({"causal": False, "window_right": 7}, {"softcap": 5.0, "sinks": sinks},
               {"return_lse": True, "keys": "prefix"}):
        got = assert_bounds_identical([
            run_extend(*tensors, window_left=case.window_left, attention_chunk=17, bounds=b,
                       block_m=tiles[0], block_n=tiles[1], **kw) for b in VARIANTS])
        want = reference.extend_attention(*tensors, window_left=case.window_left,
                                          attention_chunk=17, **kw)
        assert_matches_reference(got, want)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_chunk(num_splits):
    """Decode under a chunk reads only the query's chunk (the pages below it -1)."""
    g = torch.Generator().manual_seed(17)
    lens, chunk, page, heads, dim = [1, 16, 17, 40, 33], 16, 4, (4, 2), 16
    q = torch.randn(len(lens), heads[0], dim, generator=g).to(DEVICE)
    k_cache = torch.randn(64, page, heads[1], dim, generator=g).to(DEVICE)
    v_cache = torch.randn(64, page, heads[1], dim, generator=g).to(DEVICE)
    table = torch.randperm(64, generator=g)[:len(lens) * 10].view(len(lens), 10).to(torch.int32)
    for b, s in enumerate(lens):
        table[b, :(s - 1) // chunk * chunk // page] = -1
    table = table.to(DEVICE)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    for window in (None, 5):
        got = assert_bounds_identical([
            run_decode(q, k_cache, v_cache, table, seq_lens, window_left=window,
                       attention_chunk=chunk, num_splits=num_splits, bounds=b)
            for b in VARIANTS])
        want = reference.decode_attention(q, k_cache, v_cache, table, seq_lens,
                                          window_left=window, attention_chunk=chunk)
        assert_matches_reference(got, want)


@pytest.mark.parametrize("deterministic", [False, True], ids=["two-stage", "single-pass"])
def test_linear_positions_are_the_default(deterministic):
    """Positions given as the default (prefix_lens[b] + i) give the bits of a call without
    them, with and without a chunk."""
    case = ExtendCase([13, 40], [30, 9], window_left=6, page_size=4, seed=18)
    tensors = build_extend(case, DEVICE)
    positions = torch.cat([torch.arange(p, p + e) for p, e in zip(case.prefix_lens,
                                                                   case.extend_lens)])
    positions = positions.to(torch.int32).to(DEVICE)
    for chunk in (None, 16):
        plain = swattn.extend_attention(*tensors, window_left=6, attention_chunk=chunk,
                                        deterministic=deterministic)
        given = swattn.extend_attention(*tensors, window_left=6, attention_chunk=chunk,
                                        positions=positions, deterministic=deterministic)
        assert torch.equal(plain, given)


@pytest.mark.parametrize("deterministic", [False, True], ids=["two-stage", "single-pass"])
@pytest.mark.parametrize("window,chunk", [(3, None), (7, None), (None, 8), (5, 16)],
                         ids=["w3", "w7", "c8", "w5-c16"])
def test_tree_verify(window, chunk, deterministic):
    """A speculative tree verified over a window shorter than the tree's span: siblings
    share a position, the window and the chunk are measured between positions, the mask
    says which drafts see each other (a window measured from the row index saw the wrong
    keys); tight, skip and none give the same bits."""
    prefix_lens, sizes = [20, 5, 0], [24, 9, 13]
    case = ExtendCase(prefix_lens, sizes, window_left=window, page_size=4, seed=19)
    tensors = build_extend(case, DEVICE)
    positions, mask, indptr = random_tree(prefix_lens, sizes, seed=20)
    tensors = _drop_unread_pages(tensors, case, chunk, positions)
    kw = dict(window_left=window, attention_chunk=chunk, mask=mask.to(DEVICE),
              mask_indptr=indptr.to(DEVICE))
    got = assert_bounds_identical([
        run_extend(*tensors, positions=positions.to(DEVICE), bounds=b,
                   deterministic=deterministic, block_m=16, block_n=16, **kw)
        for b in VARIANTS])
    want = reference.extend_attention(*tensors, positions=positions, **kw)
    assert_matches_reference(got, want)


def test_plan_with_positions_replans_in_place():
    """A plan made with positions runs the tree, and replan writes the next batch's
    positions into the same buffer."""
    prefix_lens, sizes = [20, 5], [12, 9]
    case = ExtendCase(prefix_lens, sizes, window_left=4, page_size=4, seed=21)
    tensors = build_extend(case, DEVICE)
    positions, mask, indptr = random_tree(prefix_lens, sizes, seed=22)
    cu = [0, sizes[0], sum(sizes)]
    plan = swattn.plan_extend(cu, prefix_lens, num_q_heads=case.num_q_heads,
                              num_kv_heads=case.num_kv_heads, head_dim=case.head_dim,
                              page_size=case.page_size, window_left=4,
                              mask_indptr=indptr.tolist(), positions=positions.tolist(),
                              dtype=case.dtype, device=DEVICE)
    buffer = plan.positions
    out = plan.run(*tensors[:6], mask=mask.to(DEVICE))
    want = reference.extend_attention(*tensors, window_left=4, positions=positions,
                                      mask=mask, mask_indptr=indptr)
    assert_matches_reference(out, want)
    positions2, mask2, indptr2 = random_tree(prefix_lens, sizes, seed=23)
    plan.replan(cu, prefix_lens, mask_indptr=indptr2.tolist(), positions=positions2.tolist())
    assert plan.positions is buffer
    out = plan.run(*tensors[:6], mask=mask2.to(DEVICE))
    want = reference.extend_attention(*tensors, window_left=4, positions=positions2,
                                      mask=mask2, mask_indptr=indptr2)
    assert_matches_reference(out, want)
    with pytest.raises(ValueError, match="positions"):
        plan.replan(cu, prefix_lens, mask_indptr=indptr2.tolist())


def test_chunk_and_positions_arguments_are_checked():
    """attention_chunk must be an int >= 1; positions one a new token, within [0, 2^30)."""
    case = ExtendCase([3], [4], window_left=None, page_size=4, seed=24)
    tensors = build_extend(case, DEVICE)
    with pytest.raises(ValueError, match="attention_chunk"):
        swattn.extend_attention(*tensors, attention_chunk=0)
    with pytest.raises(TypeError, match="attention_chunk"):
        swattn.extend_attention(*tensors, attention_chunk=2.0)
    with pytest.raises(ValueError, match="positions"):
        swattn.extend_attention(*tensors, positions=torch.zeros(3, dtype=torch.int32,
                                                                device=DEVICE))
    kw = dict(num_q_heads=case.num_q_heads, num_kv_heads=case.num_kv_heads,
              head_dim=case.head_dim, page_size=4, dtype=case.dtype, device=DEVICE)
    with pytest.raises(ValueError, match="positions"):
        swattn.plan_extend([0, 4], [3], positions=[3, 4, 5], **kw)
    with pytest.raises(ValueError, match="positions"):
        swattn.plan_extend([0, 4], [3], positions=[3, 4, 5, -1], **kw)
