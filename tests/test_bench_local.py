"""The benchmark's chunked-local (L4, C-L4) and tree-verify (T) rows on the CPU: the workloads'
shapes, their pairs, keys in reach and bytes against brute force from the mask convention,
the tile model's prediction, the inputs, swattn's variants and the peers' adapters under
Triton's interpreter against the float64 reference at tiny sizes (vLLM's virtual batches,
SGLang's verify path, FlexAttention's masks run eagerly), the virtual-batch builder against
swattn's own chunk, and peers that cannot load reported as skipped."""

import os
import sys
import warnings

import numpy as np
import pytest
import torch

import swattn
from swattn import tiles, window
from swattn.bench import (
    chunk_peers,
    decode_peers,
    extend_inputs,
    extend_peers,
    harness,
    peers,
    predict,
    report,
    tree_peers,
)
from swattn.bench import decode as dbench
from swattn.bench import extend as ebench
from swattn.bench import workloads as wl
from swattn.bench.cli import build_cases, case_variants, main, parse_args

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
interpreter = pytest.mark.skipif(not INTERPRET, reason="runs the kernels under TRITON_INTERPRET=1")

SMALL_TREE = wl.tree_parents((1, 2, 3, 3))  # 9 nodes, depths 0..3


def _case(seqs, window_left=None, chunk=8, tree=(), sinks=False, heads=(4, 2), dims=(16, 16),
          page_size=4):
    return wl.Case("X", heads[0], heads[1], dims[0], dims[1], window_left, sinks, tuple(seqs),
                   page_size, "", chunk, tree)


def _decode_case(lens, chunk=32, window_left=None, heads=(4, 2), dims=(32, 32), page_size=16):
    return wl.DecodeCase("X", heads[0], heads[1], dims[0], dims[1], window_left, False,
                         tuple(lens), 0, page_size, False, chunk)


@pytest.fixture
def on_the_cpu(monkeypatch):
    """swattn's extend rows and the dense Flex adapters off CUDA: the kernels under the
    interpreter, FlexAttention eager (its compiled form needs a GPU here)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    for module in (ebench, extend_peers, tree_peers):
        monkeypatch.setattr(module, "need_cuda", lambda inputs: None)
    monkeypatch.setattr(decode_peers, "need_cuda", lambda inputs: None)
    monkeypatch.setitem(peers._FLEX, "fn", flex_attention)
    monkeypatch.setitem(peers._FLEX, "block_mask", create_block_mask)
    warnings.filterwarnings("ignore")


def _run(prepared):
    if prepared.poison is not None:
        prepared.poison()
    prepared.fn()
    return prepared.result()


# --------------------------------------------------------------------------------------
# The workloads.
# --------------------------------------------------------------------------------------

def test_chunk_and_tree_workloads_carry_their_structure_into_cases():
    """L4 and C-L4 pass their attention chunk to every case; T's cases are its draft tree,
    as many levels deep as the workload names and as many nodes as new tokens, and a case
    of another new-token count is refused; the CLI's default token cap keeps every L4 case."""
    l4, cl4, t = wl.get("L4"), wl.get("c-l4"), wl.get("T")
    assert l4.attention_chunk and all(c.attention_chunk == l4.attention_chunk
                                      for c in wl.extend_cases("L4"))
    assert cl4.attention_chunk and all(c.attention_chunk == cl4.attention_chunk
                                       for c in wl.decode_cases("C-L4"))
    (prefix, new), = t.cases
    case, = wl.extend_cases("T")
    assert len(case.tree) == new == sum(t.tree_levels)
    assert max(wl.tree_depths(case.tree)) == len(t.tree_levels) - 1
    with pytest.raises(ValueError, match=f"NEW = {new}"):
        wl.extend_cases("T", cases=[(prefix, new // 2)])
    assert [c.seqs[0] for c in build_cases(parse_args(["--workload", "L4"]))] == list(l4.cases)


def test_tree_is_in_level_order_with_each_level_spread():
    parents = wl.tree_parents((1, 3, 6, 9, 9, 12, 12, 12))
    depths = wl.tree_depths(parents)
    assert all(p < i for i, p in enumerate(parents)) and parents[0] == -1
    assert [depths.count(d) for d in range(8)] == [1, 3, 6, 9, 9, 12, 12, 12]
    assert all(depths[i] == depths[p] + 1 for i, p in enumerate(parents) if p >= 0)
    # Every node of a level above a wider one has a child; no level is a bare chain.
    for d in range(7):
        above = [i for i in range(64) if depths[i] == d]
        children = {parents[i] for i in range(64) if depths[i] == d + 1}
        assert children == set(above)
    assert wl.tree_ancestors(parents)[63][-1] == 63 and len(wl.tree_ancestors(parents)[63]) == 8
    for bad in ((), (2, 3), (1, 0)):
        with pytest.raises(ValueError):
            wl.tree_parents(bad)


def _brute(prefix, new, window_left, chunk, tree):
    """``[new, prefix + new]`` bool: who sees what, from the conventions alone: the window and
    chunk between positions (``window.visible``), causality by order or the tree's mask."""
    depths = wl.tree_depths(tree) if tree else list(range(new))
    q_pos = np.array([prefix + d for d in depths[:new]])[:, None]
    k_pos = np.concatenate([np.arange(prefix), q_pos[:, 0]])[None, :]
    seen = np.broadcast_to(window.visible(q_pos, k_pos, window_left, None, False, chunk),
                           (new, prefix + new)).copy()
    order = np.zeros((new, prefix + new), dtype=bool)
    order[:, :prefix] = True
    for i in range(new):
        for a in (wl.tree_ancestors(tree)[i] if tree else range(i + 1)):
            order[i, prefix + a] = True
    return seen & order


@pytest.mark.parametrize("chunk,window_left", [(8, None), (8, 3), (5, 11), (1, None), (64, 2)],
                         ids=lambda x: f"{x}")
def test_pairs_and_keys_in_reach_under_a_chunk_match_brute_force(chunk, window_left):
    for prefix in (0, 3, 8, 13, 24):
        for new in (1, 7, 8, 19):
            vis = _brute(prefix, new, window_left, chunk, ())
            case = _case([(prefix, new)], window_left, chunk)
            assert case.visible_pairs() == int(vis.sum()), (prefix, new)
            assert case.keys_in_reach() == int(vis.any(axis=0).sum()), (prefix, new)
            assert case.lowest_key(prefix) == int(np.argmax(vis.any(axis=0)))


@pytest.mark.parametrize("window_left,chunk", [(3, None), (1, None), (127, None), (None, None),
                                               (6, 16), (None, 15)], ids=lambda x: f"{x}")
def test_pairs_and_keys_in_reach_of_a_tree_match_brute_force(window_left, chunk):
    for prefix in (0, 5, 14, 40):
        vis = _brute(prefix, 9, window_left, chunk, SMALL_TREE)
        case = _case([(prefix, 9)], window_left, chunk, SMALL_TREE)
        assert case.visible_pairs() == int(vis.sum()), prefix
        assert case.keys_in_reach() == int(vis.any(axis=0).sum()), prefix
        # And the mask the inputs hand the kernels is the brute force's order part.
        _, mask, indptr = extend_inputs.tree_inputs(case, "cpu")
        order = _brute(prefix, 9, None, None, SMALL_TREE)
        assert torch.equal(mask[:int(indptr[1])].view(9, prefix + 9), torch.from_numpy(order))


def test_the_work_of_l4_cl4_and_t_by_hand():
    """L4: each step one whole chunk (8192 * 8193 / 2 pairs a sequence, its prefix out of
    reach); T: every node sees exactly W = 128 keys (127 - depth cached, depth + 1 in the
    tree); C-L4: 8192 keys at 32k and at 128k."""
    for case in wl.extend_cases("L4"):
        assert case.visible_pairs() == 4 * 8192 * 8193 // 2
        prefix = case.seqs[0][0]
        assert case.keys_in_reach() == 4 * 8192 and case.lowest_key(prefix) == prefix
        assert case.bytes_moved() == 2 * (4 * 8192 * 40 * 256 + 4 * 8192 * 8 * 256)
        assert case.flops() == 4 * case.visible_pairs() * 128 * 40
    t, = wl.extend_cases("T")
    assert t.visible_pairs() == 32 * 64 * 128 and t.keys_in_reach() == 32 * (127 + 64)
    for case in wl.decode_cases("C-L4"):
        context = case.seq_lens[0]
        assert case.keys() == 64 * 8192 and case.lowest_key(context) == context - 8192
    floors = {c.name: report.floor_us(c.flops(), c.bytes_moved(), predict.ANCHOR_CEILINGS)
              for c in wl.extend_cases("L4") + wl.extend_cases("T") + wl.decode_cases("C-L4")}
    assert round(floors["L4 P8192 E8192"]) == 3475 and round(floors["T P4096 E64"], 1) == 10.8
    assert round(floors["C-L4 S131072"]) == 504


def test_decode_keys_under_a_chunk_match_brute_force():
    for chunk, window_left in ((8, None), (8, 3), (5, 11)):
        case = _decode_case((1, 7, 8, 9, 16, 17, 40), chunk, window_left)
        for s in case.seq_lens:
            keys = window.visible(s - 1, np.arange(s), window_left, None, True, chunk)
            assert case.window_keys(s) == int(np.sum(keys))
            assert case.lowest_key(s) == int(np.argmax(keys))


# --------------------------------------------------------------------------------------
# The tile model's prediction.
# --------------------------------------------------------------------------------------

def test_tile_prediction_of_l4_t_and_cl4():
    """L4 at the Hopper path's 64 x 64: the chunk's bounds (stage 1 walks none of the prefix)
    against a kernel that only masks the chunk; T on the Triton kernel, 8 tokens a block
    (the 8 query heads of a KV group packed): 4 prefix tiles of 32 keys and 2 new ones a
    block; C-L4 at 64-key tiles: one chunk of 128 tiles a KV head."""
    l4 = wl.extend_cases("L4")
    hopper = predict.expected_tiling(l4[0])
    assert hopper == {"block_m": 64, "block_n": 64, "tokens_per_block": 64, "heads": 40,
                      "path": "hopper"}
    per_step = 4 * 40 * sum(i + 1 for i in range(128))
    for n, case in enumerate(l4):
        pred = report.tile_prediction(case, tiling=hopper)
        counts = tiles.count_workload(list(case.seqs), None, None, True, 64, 64, heads=40,
                                      chunk=8192)
        assert pred["tight"] == counts["stage1"]["tight"] + counts["stage2"]["tight"] == per_step
        unchunked = tiles.count_workload(list(case.seqs), None, None, True, 64, 64, heads=40)
        masked = unchunked["stage1"]["tight"] + unchunked["stage2"]["tight"]
        assert pred["chunk_masked_only"] == masked == per_step + 4 * 40 * 128 * 128 * n
    t, = wl.extend_cases("T")
    triton = predict.expected_tiling(t)
    assert triton == {"block_m": 64, "block_n": 32, "tokens_per_block": 8, "heads": 8,
                      "path": "triton"}
    pred = report.tile_prediction(t, tiling=triton)
    assert pred["tight"] == 32 * 8 * 8 * (4 + 2)
    assert pred["skip"] == 32 * 8 * 8 * (4096 // 32 + 2)
    for case in wl.decode_cases("C-L4"):
        tiling = predict.expected_decode_tiling(case)
        assert tiling["block_n"] == 64 and tiling["aligned"] and tiling["path"] == "hopper"
        pred = predict.decode_tile_prediction(case, tiling)
        assert pred["tight"] == 64 * 8 * 128 and pred["all"] == 64 * 8 * case.seq_lens[0] // 64


def test_position_tiles_match_the_rows_one_by_one():
    """The tree's stage-1 tiles from its rows' ranges, against each row's own first tile."""
    case = _case([(40, 9)], 6, None, SMALL_TREE)
    pos = case.positions(40, 9)
    for tokens, bn in ((1, 4), (3, 4), (9, 8)):
        want = 0
        for start in range(0, 9, tokens):
            lo = min(max(p - 6, 0) for p in pos[start:start + tokens]) // bn * bn
            want += -(-(40 - lo) // bn) + -(-9 // bn)
        assert predict.position_tiles(40, pos, 6, None, tokens, bn) == want


def test_predict_prints_without_a_gpu(capsys):
    assert main(["--workload", "L4,C-L4,T", "--predict"]) == 0
    text = capsys.readouterr().out
    assert "| L4 P24576 E8192 | 4 | 5369.4M | 2749.1 | 805.3 | 3475.5 |" in text
    assert "the chunk masked only: 9,185,280" in text
    assert "| C-L4 S131072 | 64 |" in text and "65,536 / 1,048,576 (0.062)" in text
    assert "| T P4096 E64 | 32 | 16.8M |" in text and "12,288 / 266,240" in text


# --------------------------------------------------------------------------------------
# Inputs.
# --------------------------------------------------------------------------------------

def test_inputs_of_a_chunk_and_a_tree():
    case = _case([(13, 5), (8, 3), (0, 4)], None, 8)
    inp = extend_inputs.build_inputs(case, "cpu", seed=1)
    assert inp.positions is None and inp.host_positions() is None and inp.mask is None
    for b, (prefix, _) in enumerate(case.seqs):
        lowest = case.lowest_key(prefix)  # the first new token's chunk start
        assert lowest == prefix // 8 * 8
        win = inp.block_table_window[b].tolist()
        assert all(win[n] == -1 for n in range(-(-prefix // 4)) if (n + 1) * 4 <= lowest)
    tree = _case([(13, 9), (0, 9)], 3, None, SMALL_TREE, sinks=True)
    inp = extend_inputs.build_inputs(tree, "cpu", seed=2)
    depths = wl.tree_depths(SMALL_TREE)
    assert inp.host_positions() == [13 + d for d in depths] + depths
    assert inp.positions.dtype == inp.mask_indptr.dtype == torch.int32
    assert inp.host_mask_indptr() == [0, 9 * 22, 9 * 22 + 81] and inp.mask.dtype == torch.bool
    # The window- and row-index references differ on a tree over a short window.
    ref = extend_inputs.reference_first(inp)
    assert harness.relative_error(extend_inputs.reference_first(inp, positions=False), ref) > 0.05


# --------------------------------------------------------------------------------------
# swattn's variants under the interpreter.
# --------------------------------------------------------------------------------------

OURS = {
    "tight": lambda i: ebench.ours(i),
    "full": lambda i: ebench.ours(i, layout="full"),
    "skip": lambda i: ebench.ours(i, bounds="skip", layout="full"),
    "det": lambda i: ebench.ours(i, deterministic=True),
}

LOCAL_CASES = {
    "chunk": _case([(5, 11), (16, 8), (0, 7)], None, 8),
    "chunk-window": _case([(21, 6), (3, 13)], 4, 8, sinks=True),
    "tree": _case([(13, 9), (6, 9)], 3, None, SMALL_TREE, sinks=True),
    "tree-chunk": _case([(14, 9)], 5, 16, SMALL_TREE),
}


@interpreter
@pytest.mark.parametrize("name", list(LOCAL_CASES))
def test_our_variants_match_the_reference(on_the_cpu, name, seed):
    case = LOCAL_CASES[name]
    inp = extend_inputs.build_inputs(case, "cpu", seed=seed, dtype=torch.float32)
    ref = extend_inputs.reference_first(inp)
    new = case.seqs[0][1]
    for key, build in OURS.items():
        prepared = build(inp)
        assert harness.relative_error(_run(prepared)[:new], ref) < 1e-5, key
    family = ebench.TREE_VARIANTS if case.tree else ebench.CHUNK_VARIANTS
    assert ebench.variants_for(case) is family


@interpreter
def test_our_chunk_decode_and_the_window_of_its_keys(seed):
    """C-L4's rows: the chunk, and the same decode over a window of the chunk's keys, both the
    case's function; the window row needs every sequence's chunk to hold as many keys."""
    case = _decode_case((70, 70, 70), chunk=32)
    inp = dbench.build_inputs(case, "cpu", seed=seed, dtype=torch.float32)
    ref = dbench.reference_first(inp, count=99)
    for build in (dbench.ours, lambda i: dbench.ours(i, same_keys=True),
                  lambda i: dbench.ours(i, bounds="skip", layout="full")):
        prepared = build(inp)
        assert harness.relative_error(_run(prepared), ref) < 1e-5
    same = dbench.ours(inp, same_keys=True)
    assert "window_left=5 and no chunk" in same.note and same.tiling["block_n"] >= 1
    ragged = dbench.build_inputs(_decode_case((70, 40), chunk=32), "cpu", dtype=torch.float32)
    with pytest.raises(peers.Skip, match="as many keys"):
        dbench.ours(ragged, same_keys=True)
    assert dbench.variants_for(case) is dbench.CHUNK_VARIANTS
    assert dbench.variants_for(wl.decode_cases("C-B")[0]) is dbench.VARIANTS


# --------------------------------------------------------------------------------------
# vLLM's virtual batches.
# --------------------------------------------------------------------------------------

def test_virtual_batches_by_hand():
    """Queries cut at every multiple of the chunk, keys from the chunk's first position,
    pages from the chunk's first page (vLLM's example: chunk 4, q 4/10/5, k 6/17/9)."""
    table = torch.arange(30, dtype=torch.int32).view(3, 10)
    vb = chunk_peers.virtual_batches([4, 10, 5], [6, 17, 9], 4, 2, table)
    assert vb.query_lens == (2, 2, 1, 4, 4, 1, 4, 1)
    assert vb.key_lens == (4, 2, 4, 4, 4, 1, 4, 1)
    assert vb.key_starts == (0, 4, 4, 8, 12, 16, 4, 8) and vb.seqs == (0, 0, 1, 1, 1, 1, 2, 2)
    assert vb.block_table.tolist() == [[0, 1], [2, 3], [12, 13], [14, 15], [16, 17], [18, 19],
                                       [22, 23], [24, 25]]
    assert vb.cu_seqlens_q()[-1] == 19 and vb.prefix_lens() == [2, 0, 3, 0, 0, 0, 0, 0]
    # Past a sequence's table: -1, never another sequence's page.
    vb = chunk_peers.virtual_batches([3], [20], 8, 2, table[:1])
    assert vb.block_table.tolist() == [[8, 9, -1, -1]]
    with pytest.raises(ValueError, match="multiple of the page size"):
        chunk_peers.virtual_batches([3], [20], 6, 4, table[:1])


@interpreter
def test_virtual_batches_give_the_chunk_through_swattn(seed):
    """The builder's pieces, fed to ``swattn.extend_attention`` with no chunk (each piece its
    keys from its chunk's first page), give what ``attention_chunk=C`` gives on the batch:
    the builder is right without vLLM."""
    case = _case([(20, 30), (40, 9), (0, 33), (31, 1)], None, 32, page_size=16, dims=(32, 32))
    inp = extend_inputs.build_inputs(case, "cpu", seed=seed, dtype=torch.float32)
    vb = chunk_peers.virtual_batches([e for _, e in case.seqs], [p + e for p, e in case.seqs], 32,
                                     16, inp.seq_pages)
    assert len(vb.seqs) == 6 and max(vb.key_lens) <= 32
    pieces = swattn.extend_attention(
        inp.q, inp.k, inp.v, inp.k_pool, inp.v_pool, vb.block_table,
        torch.tensor(vb.cu_seqlens_q(), dtype=torch.int32),
        torch.tensor(vb.prefix_lens(), dtype=torch.int32))
    chunked = swattn.extend_attention(inp.q, inp.k, inp.v, inp.k_pool, inp.v_pool,
                                      inp.block_table_full, inp.cu_seqlens, inp.prefix_lens,
                                      attention_chunk=32)
    torch.testing.assert_close(pieces, chunked, rtol=1e-5, atol=1e-6)


@interpreter
def test_vllm_virtual_batches_match_the_reference(with_peers, seed):
    case = _case([(20, 30), (40, 9), (0, 33)], None, 32, page_size=16, dims=(32, 32))
    inp = extend_inputs.build_inputs(case, "cpu", seed=seed, dtype=torch.float32)
    prepared = chunk_peers.vllm_chunk_extend(inp)
    assert "5 virtual batches" in prepared.note
    assert harness.relative_error(_run(prepared)[:30], extend_inputs.reference_first(inp)) < 1e-5
    decode = dbench.build_inputs(_decode_case((70, 9, 64, 33)), "cpu", seed=seed,
                                 dtype=torch.float32)
    prepared = chunk_peers.vllm_chunk_decode(decode)
    assert "3D split-KV" in prepared.note
    assert harness.relative_error(_run(prepared), dbench.reference_first(decode, count=99)) < 1e-5


# --------------------------------------------------------------------------------------
# SGLang's verify path and FlexAttention's masks.
# --------------------------------------------------------------------------------------

@interpreter
@pytest.mark.parametrize("layout", ["window", "full"])
def test_sglang_verify_computes_the_row_index_window(with_peers, layout, seed):
    """SGLang's verify kernel on a tree over a short window matches the reference with the
    window measured from the row index, and not the case's (positions P + depth)."""
    inp = extend_inputs.build_inputs(LOCAL_CASES["tree"], "cpu", seed=seed, dtype=torch.float32)
    prepared = tree_peers.sglang_verify(inp, layout=layout)
    out = _run(prepared)[:9]
    assert prepared.computes == tree_peers.ROW_INDEX_WINDOW and prepared.applies_sinks
    assert harness.relative_error(out, prepared.reference()) < 1e-5
    assert harness.relative_error(out, extend_inputs.reference_first(inp)) > 0.05


@pytest.mark.parametrize("name", ["chunk", "tree"])
def test_flex_masks_match_the_reference(on_the_cpu, name, seed):
    """FlexAttention (eager here) with the chunk in its mask, or the tree's; no sinks."""
    case = {"chunk": _case([(20, 30)] * 2, None, 32, page_size=16),
            "tree": _case([(13, 9)] * 2, 3, None, SMALL_TREE, sinks=True)}[name]
    inp = extend_inputs.build_inputs(case, "cpu", seed=seed, dtype=torch.float32)
    build = tree_peers.flex_tree if case.tree else extend_peers.flex
    out = _run(build(inp))
    new = case.seqs[0][1]
    assert harness.relative_error(out[:new], extend_inputs.reference_first(inp, sinks=False)) < 1e-5
    decode = dbench.build_inputs(_decode_case((70, 70)), "cpu", seed=seed, dtype=torch.float32)
    out = _run(decode_peers.flex_decode(decode))
    assert harness.relative_error(out, dbench.reference_first(decode, count=99)) < 1e-5


# --------------------------------------------------------------------------------------
# Peers that cannot run, the variant tables, the report.
# --------------------------------------------------------------------------------------

def test_peers_that_cannot_load_are_reported(monkeypatch):
    inp = extend_inputs.build_inputs(_case([(20, 30)], None, 32, page_size=16), "cpu")
    decode = dbench.build_inputs(_decode_case((70, 9)), "cpu")
    tree = extend_inputs.build_inputs(LOCAL_CASES["tree"], "cpu")
    for module in ("flash_attn_interface", "flash_attn", "flashinfer",
                   "vllm.v1.attention.ops.triton_unified_attention",
                   "sglang.kernels.ops.attention.extend_attention"):
        monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(peers.Skip, match="import vllm.v1.attention.ops.triton_unified_attention"):
        chunk_peers.vllm_chunk_extend(inp)
    with pytest.raises(peers.Skip, match="import vllm"):
        chunk_peers.vllm_chunk_decode(decode)
    with pytest.raises(peers.Skip, match="import sglang.kernels.ops.attention.extend_attention"):
        tree_peers.sglang_verify(tree)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    for build, data in ((chunk_peers.flash_attn_chunk_extend, inp),
                        (chunk_peers.flash_attn_chunk_decode, decode)):
        with pytest.raises(peers.Skip, match="FlashAttention 3 not installed"):
            build(data)
    for build, data in ((chunk_peers.flashinfer_chunk_extend, inp),
                        (chunk_peers.flashinfer_chunk_decode, decode)):
        with pytest.raises(peers.Skip, match="import flashinfer failed"):
            build(data)


def test_flash_attention_2_has_no_chunk(monkeypatch):
    """An installed FlashAttention without ``attention_chunk`` (FA2) is reported as such."""
    fa2 = type(sys)("flash_attn")
    fa2.__version__ = "2.8.3"
    fa2.flash_attn_with_kvcache = lambda q, k_cache, v_cache, causal=False: None
    monkeypatch.setitem(sys.modules, "flash_attn_interface", None)
    monkeypatch.setitem(sys.modules, "flash_attn", fa2)
    with pytest.raises(peers.Skip, match="flash_attn 2.8.3 has no attention_chunk"):
        chunk_peers.flash_attn_kvcache()


def test_every_local_variant_skips_off_the_gpu(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    extend = extend_inputs.build_inputs(_case([(20, 30)], None, 32, page_size=16), "cpu")
    tree = extend_inputs.build_inputs(LOCAL_CASES["tree"], "cpu")
    decode = dbench.build_inputs(_decode_case((70, 9)), "cpu")
    for table, data in ((ebench.CHUNK_VARIANTS, extend), (ebench.TREE_VARIANTS, tree),
                        (dbench.CHUNK_VARIANTS, decode)):
        for variant in table:
            with pytest.raises(peers.Skip):
                variant.build(data)


def test_variant_tables_and_skip_keys():
    for table in (ebench.CHUNK_VARIANTS, ebench.TREE_VARIANTS, dbench.CHUNK_VARIANTS):
        keys = [v.key for v in table]
        assert keys[:2] == ["tight", "control"] and len(set(keys)) == len(keys)
    assert {"vllm", "flex", "flashinfer", "flash-attn"} <= {v.key for v in ebench.CHUNK_VARIANTS}
    assert {"sglang", "sglang-full", "flex"} <= {v.key for v in ebench.TREE_VARIANTS}
    assert "same-keys" in {v.key for v in dbench.CHUNK_VARIANTS}
    args = parse_args(["--workload", "L4,T,C-L4,A",
                       "--skip", "flash-attn,same-keys,sglang-unified"])
    choose_extend, choose_decode = case_variants(args, ebench), case_variants(args, dbench)
    l4, t, cl4, a = (build_cases(args)[i] for i in (0, 4, 5, 7))
    assert [v.key for v in choose_extend(l4)] == [v.key for v in ebench.CHUNK_VARIANTS
                                                   if v.key != "flash-attn"]
    assert [v.key for v in choose_extend(t)] == [v.key for v in ebench.TREE_VARIANTS]
    assert "same-keys" not in [v.key for v in choose_decode(cl4)]
    assert "sglang-unified" not in [v.key for v in choose_extend(a)]
    with pytest.raises(ValueError, match="unknown variant"):
        case_variants(parse_args(["--skip", "nope"]), ebench)


def test_a_peer_of_another_function_is_marked_and_never_the_fastest():
    case, = wl.extend_cases("T")
    V = harness.VariantResult
    result = harness.CaseResult(case, [
        V("swattn tight", "tight", "tight", rel_err=1e-3, graphed=True, rounds_us=[[30.0], [30.0]]),
        V("swattn tight (control)", "control", "control", rel_err=1e-3, graphed=True,
          rounds_us=[[30.0], [30.2]]),
        V("SGLang verify, window layout", "sglang", "peer", rel_err=1e-3, graphed=True,
          rounds_us=[[20.0], [20.0]], computes=tree_peers.ROW_INDEX_WINDOW),
        V("FlexAttention, tree mask", "flex", "peer", rel_err=1e-3, graphed=True,
          applies_sinks=False, rounds_us=[[25.0], [25.0]]),
    ], 0.01, 1.0)
    summary, rows = report.case_report(result, predict.ANCHOR_CEILINGS)
    by = {r["key"]: r for r in rows}
    assert summary["best_peer"] is None and not by["sglang"]["same_function"]
    table = report.markdown({}, predict.ANCHOR_CEILINGS, [summary], rows)
    assert f"| ok, other fn ({tree_peers.ROW_INDEX_WINDOW}) |" in table
    assert "| ok, other fn (no sinks) |" in table
    assert summary["tiles_tight"] == 12_288 and summary["tree"] == list(case.tree)


@interpreter
def test_run_case_over_the_tree_rows(with_peers, on_the_cpu, monkeypatch):
    """The per-case flow (check, capture, interleave; the GPU parts replaced) over T's rows at
    a tiny size: swattn's and SGLang's checked, SGLang against its own function and marked."""
    monkeypatch.setattr(harness, "capture", lambda fn, warmup=2: (fn, True, ""))
    monkeypatch.setattr(harness, "measure", lambda replay, reps, flush: [10.0] * reps)
    original = extend_inputs.build_inputs
    monkeypatch.setattr(ebench, "build_inputs",
                        lambda c, device, seed: original(c, device, seed, dtype=torch.float32))
    case = _case([(13, 9), (13, 9)], 3, None, SMALL_TREE, sinks=True)
    # (Flex, eager here, is checked on its own above: slow under the interleaving.)
    rows = [v for v in ebench.TREE_VARIANTS if v.key in ("tight", "control", "skip", "sglang")]
    result = ebench.run_case(case, rows, reps=1, rounds=1, flush=lambda: None, device="cpu")
    by = {v.key: v for v in result.variants}
    assert all(by[k].status == "ok" for k in ("tight", "control", "skip"))
    assert by["sglang"].status == "ok" and by["sglang"].computes == tree_peers.ROW_INDEX_WINDOW
    assert "a different function" in by["sglang"].note and result.noise == 0.0
