"""The benchmark's DeepSeek-V4 rows (V4-CSA, V4-HCA decode, V4-X extend: a window and a
second key source) on the CPU: the workloads' shapes, their keys, FLOPs and bytes by hand,
the tile model against the kernel's tiles row by row, the predictions printed, and every
new workload built at a tiny size with swattn's rows and FlexAttention's checked against
the float64 reference under Triton's interpreter, the peers that cannot run saying why."""

import os
import warnings

import pytest
import torch

from swattn import tiles
from swattn.bench import decode as dbench
from swattn.bench import extend as ebench
from swattn.bench import harness, peers, predict, second_inputs, second_variants
from swattn.bench import workloads as wl
from swattn.bench.cli import build_cases, case_variants, main, parse_args
from swattn.window import num_tiles, second_limit

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
interpreter = pytest.mark.skipif(not INTERPRET, reason="runs the kernels under TRITON_INTERPRET=1")


def test_registry_has_the_v4_rows():
    csa, hca, x = wl.get("V4-CSA"), wl.get("v4-hca"), wl.get("V4-X")
    for w in (csa, hca, x):
        assert (w.num_q_heads, w.num_kv_heads, w.head_dim, w.head_dim_v, w.window_left,
                w.sinks, w.latent) == (64, 1, 512, 512, 127, True, True)
    assert csa.second == (wl.SecondSource("csa", 4, 512),)
    assert hca.second == (wl.SecondSource("hca", 128, 0),)
    names = [c.name for c in wl.decode_cases(csa)]
    assert names == ["V4-CSA B64 S8192", "V4-CSA B64 S131072", "V4-CSA B256 S8192",
                     "V4-CSA B256 S131072"]
    assert [c.name for c in wl.decode_cases(hca, batch=8)] == ["V4-HCA B8 S8192",
                                                               "V4-HCA B8 S131072"]
    assert [c.name for c in wl.extend_cases(x)] == ["V4-X/csa P32768 E8192",
                                                    "V4-X/hca P32768 E8192"]


def test_the_work_of_the_v4_rows_by_hand():
    csa = wl.decode_cases("V4-CSA")[0]
    assert csa.keys() == 64 * (128 + 512)
    assert csa.flops() == 2 * 64 * 640 * 64 * 1024
    assert csa.bytes_moved() == 2 * (64 * 64 * 1024 + 64 * 640 * 512)
    assert csa.bytes_moved(kv_element_size=1) == 2 * 64 * 64 * 1024 + 64 * 640 * 512
    hca = wl.decode_cases("V4-HCA")[1]  # B64 S131072: 1024 closed entries
    assert hca.keys() == 64 * (128 + 1024)
    x_csa, x_hca = wl.extend_cases("V4-X")
    rows = range(32768, 32768 + 8192)
    assert x_hca.visible_pairs() == 8192 * 128 + sum((p + 1) // 128 for p in rows)
    assert x_csa.visible_pairs() == 8192 * (128 + 512)
    reach = 32768 + 8192 - (32768 - 127)
    assert x_hca.keys_in_reach() == reach + (32768 + 8192) // 128
    assert x_csa.keys_in_reach() == reach + (32768 + 8192) // 4
    assert x_hca.bytes_moved() == 2 * (8192 * 64 * 1024 + x_hca.keys_in_reach() * 512)


def _kernel_tiles(cached, pos, held, window_left, rate, topk, block_n):
    """One row's tiles as the kernel counts them (its cache, new and second segments)."""
    lo = max(0, pos - window_left)
    cache = max(-(-(min(cached, pos + 1) - lo) // block_n), 0)
    new = max(-(-(pos + 1 - max(lo, cached)) // block_n), 0)
    second = -(-topk // block_n) if topk else -(-second_limit(pos, rate, held) // block_n)
    return cache + new + second


@pytest.mark.parametrize("rate, topk", [(4, 6), (3, 0)], ids=["indexed", "causal"])
def test_count_second_matches_the_kernels_segments(rate, topk):
    rows = [(c, q, h) for c, q, h in [(0, 0, 2), (5, 9, 3), (40, 40, 10), (13, 20, 7),
                                      (70, 69, 17), (1, 1, 0)]]
    counts = tiles.count_second(rows, 9, rate, topk, 4, heads=3)
    want = sum(_kernel_tiles(c, q, h, 9, rate, topk, 4) for c, q, h in rows)
    assert counts["tiles"]["tight"] == 3 * want
    assert counts["tiles"]["all"] >= counts["tiles"]["tight"]
    keys = sum(q + 1 - max(0, q - 9) + (min(topk, second_limit(q, rate, h)) if topk
                                        else second_limit(q, rate, h)) for c, q, h in rows)
    assert counts["keys"]["tight"] == 3 * keys
    assert num_tiles(0, 0, 4) == 0


def test_predict_prints_the_v4_rows_without_a_gpu(capsys):
    assert main(["--workload", "V4-CSA,V4-HCA,V4-X", "--predict"]) == 0
    text = capsys.readouterr().out
    assert "| V4-CSA B64 S8192 | 64 | 2.6M | 5.4 | 50.3 | 11.8 |" in text
    assert "| 10,240 / 139,264 (0.074) | 29.4, 6.9 |" in text
    assert "| V4-HCA B256 S131072 | 256 |" in text and "V4-X/hca P32768 E8192" in text
    case = wl.decode_cases("V4-CSA")[0]
    tiling = predict.expected_decode_tiling(case)
    assert (tiling["block_n"], tiling["heads"]) == (16, 4)
    assert predict.decode_tile_prediction(case, tiling)["tight"] == 64 * 4 * (8 + 32)


def test_variant_tables_and_skip_keys():
    args = parse_args(["--workload", "V4-CSA,V4-X", "--batch", "2", "--context", "70",
                       "--cases", "40:9", "--skip", "flashmla,vllm"])
    cases = build_cases(args)
    assert [c.name for c in cases] == ["V4-CSA B2 S70", "V4-X/csa P40 E9", "V4-X/hca P40 E9"]
    decode_keys = [v.key for v in case_variants(args, dbench)(cases[0])]
    assert decode_keys == ["tight", "control", "skip", "fp8", "sglang", "flex"]
    assert case_variants(args, ebench)(cases[1])[-1].key == "flex"


def test_peers_that_cannot_run_say_why():
    for build, why in ((second_variants.sglang_v4, "FlashMLA's fp8 page layout"),
                       (second_variants.vllm_v4, "no second key source"),
                       (second_variants.flashmla, "CUDA build")):
        with pytest.raises(peers.Skip, match=why):
            build(None)


TINY = {
    "V4-CSA": dict(batch=1, contexts=(70,)),
    "V4-HCA": dict(batch=2, contexts=(300,)),
    "V4-X": dict(batch=1, cases=((260, 3),)),
}


def _tiny_cases(name):
    workload = wl.get(name)
    if workload.kind in wl.DECODE_KINDS:
        return wl.decode_cases(workload, **TINY[name])
    return wl.extend_cases(workload, **TINY[name])


@interpreter
@pytest.mark.parametrize("name", list(TINY))
def test_every_v4_row_matches_the_reference(name, monkeypatch):
    """Each new workload at a tiny size, real heads and head dims: swattn's rows (tight,
    control, skip, fp8) against the reference (fp8: over the same fp8 caches) and
    FlexAttention (eager here) against the sink-less one, through the harness's per-case
    flow with the GPU parts replaced."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    monkeypatch.setattr(second_variants, "need_cuda", lambda inputs: None)
    monkeypatch.setitem(peers._FLEX, "fn", flex_attention)
    monkeypatch.setitem(peers._FLEX, "block_mask", create_block_mask)
    monkeypatch.setattr(harness, "capture", lambda fn, warmup=2: (fn, True, ""))
    monkeypatch.setattr(harness, "measure", lambda replay, reps, flush: [10.0] * reps)
    original = second_inputs.build_inputs
    monkeypatch.setattr(second_variants, "build_inputs",
                        lambda c, device, seed: original(c, device, seed, dtype=torch.float32))
    warnings.filterwarnings("ignore")
    for case in _tiny_cases(name):
        bench = dbench if getattr(case, "kind", "") == "decode" else ebench
        variants = bench.variants_for(case)
        assert variants is second_variants.VARIANTS
        result = bench.run_case(case, variants, reps=1, rounds=1, flush=lambda: None,
                                device="cpu")
        by = {v.key: v for v in result.variants}
        for key in ("tight", "control", "skip", "fp8", "flex"):
            assert by[key].status == "ok", (case.name, key, by[key].note)
        assert not by["flex"].applies_sinks
        assert {by[k].status for k in ("sglang", "vllm", "flashmla")} == {"skipped"}
        assert result.noise == 0.0


def test_inputs_hold_nan_where_no_row_reads():
    """The sliding cache keeps only the window's pages; the compressed cache's rows past
    each sequence's count are NaN, and the index lists name closed entries only."""
    case = wl.decode_cases("V4-CSA", batch=3, contexts=(300,), page_size=16)[0]
    inp = second_inputs.build_inputs(case, "cpu", seed=3, dtype=torch.float32)
    first = (300 - 1 - 127) // 16  # the page of the first window key
    assert (inp.block_table[:, :first] == -1).all() and (inp.block_table[:, first:19] > 0).all()
    assert torch.isnan(inp.k_cache[0]).all()
    source = inp.source
    assert source.indices.shape == (3, 512)
    assert torch.isnan(source.cache.view(-1, 1, 512)[
        source.block_table[0, 75 // 16].long() * 16 + 75 % 16]).all()
    limit = 300 // 4
    picked = source.indices[source.indices >= 0]
    assert picked.max() < limit and (source.indices >= 0).sum(1).tolist() == [limit] * 3
    ref = second_inputs.reference_first(inp)
    assert torch.isfinite(ref).all()
