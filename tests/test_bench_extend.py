"""The benchmark's CPU-checkable parts: the workload registry, the work a case counts
(visible pairs, keys in reach, FLOPs, bytes) against brute force, the floor and roofline
arithmetic, the tile prediction, the tables, the input builder's poisoning, and peers that
skip cleanly where they cannot run."""

import csv
import io
import json
import os
import sys

import numpy as np
import pytest
import torch
from conftest import DEVICE

from swattn import window
from swattn.bench import extend as ebench
from swattn.bench import extend_inputs, extend_peers, harness, peers, report
from swattn.bench import workloads as wl
from swattn.bench.cli import build_cases, parse_args

WINDOWS = [None, 0, 1, 3, 7, 16]


def _case(seqs, window_left=3, sinks=True, heads=(4, 2), dims=(8, 8), page_size=4):
    return wl.Case("T", heads[0], heads[1], dims[0], dims[1], window_left, sinks, tuple(seqs),
                   page_size)


# --------------------------------------------------------------------------------------
# Registry.
# --------------------------------------------------------------------------------------

def test_every_workload_builds_cases_of_its_own_shape():
    """Each registered workload gives at least one case at its defaults, and every case has
    the workload's heads, head dims, window (Hugging Face W less one; none in a mix's full
    layers), sinks and batch; a
    grouped-query workload's heads divide; an extend case's sequences are its (prefix, new)
    pairs and a decode case's its contexts."""
    assert wl.WORKLOADS
    for name, workload in wl.WORKLOADS.items():
        assert workload.name == name and wl.get(name.lower()) is workload
        assert workload.num_q_heads % workload.num_kv_heads == 0
        assert workload.window_left == (None if workload.sliding_window is None
                                        else workload.sliding_window - 1)
        if workload.kind in wl.DECODE_KINDS:
            cases = wl.decode_cases(workload)
            assert {c.seq_lens[0] for c in cases} == set(workload.contexts or (workload.context,))
        else:
            cases = wl.extend_cases(workload)
            assert {c.seqs[0] for c in cases} == set(workload.cases)
        assert cases, name
        for case in cases:
            window_left = None if getattr(case, "layer", "") == "full" else workload.window_left
            assert (case.workload, case.num_q_heads, case.num_kv_heads, case.head_dim,
                    case.head_dim_v, case.window_left, case.sinks) == \
                (name, workload.num_q_heads, workload.num_kv_heads, workload.head_dim,
                 workload.head_dim_v, window_left, workload.sinks)
            assert case.batch in (getattr(workload, "batches", ()) or (workload.batch,))
            assert case.uniform
            assert case.flops() > 0


def test_extend_cases_and_overrides():
    cases = wl.extend_cases("A")
    assert [c.name for c in cases] == ["A P0 E8192", "A P128 E8192", "A P4096 E4096",
                                       "A P8192 E8192", "A P7168 E1024"]
    assert all(c.batch == 8 and c.window_left == 127 and c.sinks for c in cases)
    small = wl.extend_cases("a", batch=2, cases=wl.parse_cases("5:7, 0x3"), page_size=1)
    assert [(c.batch, c.seqs[0], c.page_size) for c in small] == [(2, (5, 7), 1), (2, (0, 3), 1)]
    assert [c.seqs for c in wl.extend_cases("A", max_tokens_per_seq=8192)] == \
        [((0, 8192),) * 8, ((4096, 4096),) * 8, ((7168, 1024),) * 8]
    mix = wl.extend_cases("M")
    assert [(c.layer, c.window_left) for c in mix] == [("window", 127), ("full", None)] * 2
    assert mix[1].name == "M/full P0 E4096"


def test_decode_workloads_and_bad_input_are_refused():
    with pytest.raises(ValueError, match="decode"):
        wl.extend_cases("C-A")
    with pytest.raises(ValueError, match="unknown workload"):
        wl.get("Z")
    for bad in ("5", "a:b", "3:0", "-1:4", ""):
        with pytest.raises(ValueError):
            wl.parse_cases(bad)


def test_cli_quick_and_overrides():
    args = parse_args(["--quick"])
    assert (args.workload, args.reps, args.rounds) == ("A", 10, 2)
    assert [c.seqs[0] for c in build_cases(args)] == [(4096, 4096), (7168, 1024)]
    args = parse_args(["--workload", "A,B", "--batch", "2", "--cases", "64:32"])
    assert [(c.workload, c.batch, c.seqs[0]) for c in build_cases(args)] == [
        ("A", 2, (64, 32)), ("B", 2, (64, 32))]


# --------------------------------------------------------------------------------------
# The work a case asks for, against brute force.
# --------------------------------------------------------------------------------------

def _brute_visible(prefix, new, window_left):
    q_pos = np.arange(prefix, prefix + new)[:, None]
    k_pos = np.arange(prefix + new)[None, :]
    return np.broadcast_to(window.visible(q_pos, k_pos, window_left), (new, prefix + new))


@pytest.mark.parametrize("window_left", WINDOWS, ids=lambda w: f"L{w}")
def test_visible_pairs_and_keys_in_reach_match_brute_force(window_left):
    for prefix in (0, 1, 2, 5, 9, 17):
        for new in (1, 2, 7, 16):
            vis = _brute_visible(prefix, new, window_left)
            assert wl.visible_pairs(prefix, new, window_left) == int(vis.sum()), (prefix, new)
            case = _case([(prefix, new)], window_left)
            assert case.keys_in_reach() == int(vis.any(axis=0).sum()), (prefix, new)
            assert case.lowest_key(prefix) == int(np.argmax(vis.any(axis=0)))


def test_flops_and_bytes_of_a_ragged_case():
    case = _case([(5, 3), (0, 4)], window_left=2, heads=(4, 2), dims=(8, 6))
    pairs = sum(int(_brute_visible(p, e, 2).sum()) for p, e in case.seqs)
    assert case.flops() == 2 * pairs * 4 * (8 + 6)
    reach = (5 + 3 - 3) + 4
    assert case.bytes_moved() == 2 * ((3 + 4) * 4 * (8 + 6) + reach * 2 * (8 + 6))


def test_anchor_floors():
    """The floors at the H200's ceilings (791 TFLOP/s, 4266 GB/s): A P8192 E8192 71 us,
    B 2085/2780 us."""
    ceilings = {"matmul_tflops": 791.0, "copy_gbps": 4266.0}
    floors = {c.name: report.floor_us(c.flops(), c.bytes_moved(), ceilings)
              for c in wl.extend_cases("A") + wl.extend_cases("B")}
    assert round(floors["A P8192 E8192"]) == 71
    assert round(floors["A P7168 E1024"]) == 9
    assert round(floors["B P0 E8192"]) == 2085
    assert round(floors["B P8192 E8192"]) == 2780


def test_floor_roofline_and_verdict_arithmetic():
    ceilings = {"matmul_tflops": 500.0, "copy_gbps": 2000.0}
    assert report.floor_us(1e12, 0, ceilings) == pytest.approx(2000.0)  # 1 TFLOP at 500 TFLOP/s
    assert report.floor_us(1e9, 4e9, ceilings) == pytest.approx(2000.0)  # 4 GB at 2 TB/s
    assert report.roofline(50.0, 200.0) == 0.25
    assert report.roofline(50.0, None) is None
    assert report.verdict(1.015, 0.02) == "no change"
    assert report.verdict(0.9, 0.02) == "faster"
    assert report.verdict(1.1, 0.02) == "slower"
    assert report.verdict(None, 0.02) == ""


# --------------------------------------------------------------------------------------
# Tile prediction.
# --------------------------------------------------------------------------------------

def _direct_tiles(case, bm, bn):
    w = window.Window(case.window_left)
    total = {"tight": 0, "all": 0}
    for p, e in case.seqs:
        for bounds in total:
            for start in range(0, e, bm):
                for loop in ("stage1", "stage2"):
                    total[bounds] += window.num_tiles(
                        *window.key_bounds(loop, p, e, start, bm, bn, w, bounds), bn)
    return total["tight"] * case.num_q_heads, total["all"] * case.num_q_heads


@pytest.mark.parametrize("seqs,window_left", [([(8192, 8192)], 127), ([(0, 300), (700, 65)], 63),
                                              ([(40, 40)], None)], ids=["A", "ragged", "full"])
def test_tile_prediction_matches_window_bounds(seqs, window_left):
    case = _case(seqs, window_left, heads=(16, 2), dims=(64, 64))
    pred = report.tile_prediction(case, 128, 64)
    assert (pred["tight"], pred["skip"]) == _direct_tiles(case, 128, 64)
    if window_left is None:
        assert pred["ratio"] == 1.0
    else:
        assert pred["ratio"] < 1.0


def test_tile_prediction_at_a_given_tiling():
    case = wl.extend_cases("A", cases=[(8192, 8192)], batch=1)[0]
    pred = report.tile_prediction(case, 128, 64)
    # Per head: block 0 walks 2 prefix tiles and 2 new ones; blocks 1..63 walk 4 new tiles
    # (their 127-key window and themselves); skip walks all 128 prefix tiles in every block.
    assert pred["tight"] == 16 * (2 + 2 + 63 * 4)
    assert pred["skip"] == 16 * (64 * 128 + sum(2 * (k + 1) for k in range(64)))


def test_tile_prediction_follows_the_kernel_that_runs():
    """The prediction walks the tiles of the plan that ran (ExtendPlan.tiling): gpt-oss on
    the Triton kernel packs its 8 query heads into a block's rows (BLOCK_M / 8 tokens a
    block, one block per KV head); the Hopper path takes one query head and 64 tokens a
    block, 64-key tiles."""
    import swattn
    case = wl.extend_cases("A", cases=[(8192, 8192)], batch=1)[0]
    plan = swattn.plan_extend([0, 8192], [8192], num_q_heads=case.num_q_heads,
                              num_kv_heads=case.num_kv_heads, head_dim=64, page_size=16,
                              window_left=127, dtype=torch.float16, device=DEVICE,
                              config={"block_m": 64, "block_n": 32, "pack_gqa": True})
    packed = plan.tiling()
    assert packed == {"block_m": 64, "block_n": 32, "tokens_per_block": 8,
                      "heads": case.num_kv_heads}
    pred = report.tile_prediction(case, tiling=packed)
    assert pred["tokens_per_block"] == pred["block_m"] // 8 and pred["block_n"] == 32
    assert pred["ratio"] < 0.05
    hopper = {"block_m": 64, "block_n": 64, "tokens_per_block": 64, "heads": case.num_q_heads}
    pred = report.tile_prediction(case, tiling=hopper)
    assert pred["tokens_per_block"] == pred["block_m"] == 64 and pred["block_n"] == 64
    assert pred["ratio"] < 0.05


# --------------------------------------------------------------------------------------
# Input builder.
# --------------------------------------------------------------------------------------

def test_inputs_poison_what_nobody_may_read():
    case = _case([(13, 5), (2, 3), (0, 4)], window_left=5, page_size=4)
    inp = extend_inputs.build_inputs(case, "cpu", seed=1)
    size = case.page_size
    for b, (prefix, new) in enumerate(case.seqs):
        prefix_pages = -(-prefix // size)
        lowest = case.lowest_key(prefix)
        full, win = inp.block_table_full[b].tolist(), inp.block_table_window[b].tolist()
        for n in range(len(full)):
            if n >= prefix_pages:
                assert full[n] == -1 and win[n] == -1, (b, n)
            elif (n + 1) * size <= lowest:
                assert full[n] >= 1 and win[n] == -1, (b, n)
            else:
                assert full[n] == win[n] >= 1, (b, n)
        pages = inp.seq_pages[b].tolist()
        used = -(-(prefix + new) // size)
        assert all(p >= 1 for p in pages[:used]) and all(p == -1 for p in pages[used:])
        # The new tokens' K/V sit in their pages, as the engine writes them before attention.
        start = int(inp.cu_seqlens[b])
        assert torch.equal(inp.k_pool.view(-1, 2, 8)[inp.slots(b, prefix, prefix + new)],
                           inp.k[start:start + new])
    # 3 + 2 + 1 data pages plus the null page; every row nobody wrote is NaN.
    assert inp.k_pool.shape[0] == 1 + 5 + 2 + 1
    written = torch.zeros(inp.k_pool.shape[0] * size, dtype=torch.bool)
    written[:size] = True
    for b, (prefix, new) in enumerate(case.seqs):
        written[inp.slots(b, 0, prefix + new)] = True
    rows = inp.k_pool.view(-1, 2 * 8)
    assert torch.isnan(rows[~written]).all() and torch.isfinite(rows[written]).all()
    assert torch.isnan(inp.v_pool.view(-1, 2 * 8)[~written]).all()
    for t in (inp.q, inp.k, inp.v, inp.sinks):
        assert torch.isfinite(t).all() and (t != 0).float().mean() > 0.9
    assert inp.cu_seqlens.tolist() == [0, 5, 8, 12] and inp.prefix_lens.tolist() == [13, 2, 0]
    assert inp.seq_pages.dtype == inp.block_table_window.dtype == torch.int32


def test_reference_reads_only_the_window_of_the_inputs():
    """The check's reference runs on the window layout (-1 below the window) without NaN."""
    case = _case([(13, 5), (2, 3)], window_left=5, page_size=4, dims=(8, 8))
    inp = extend_inputs.build_inputs(case, "cpu", seed=2)
    ref = extend_inputs.reference_first(inp)
    assert ref.shape == (5, 4, 8) and ref.dtype == torch.float64 and torch.isfinite(ref).all()
    assert harness.relative_error(ref.to(torch.bfloat16), ref) < 1e-2
    assert harness.relative_error(ref, ref) == 0.0
    poisoned = ref.clone()
    poisoned[0, 0, 0] = float("nan")
    assert harness.relative_error(poisoned, ref) != harness.relative_error(poisoned, ref)


# --------------------------------------------------------------------------------------
# Peers.
# --------------------------------------------------------------------------------------

def test_peers_skip_cleanly_where_they_cannot_run(tmp_path, monkeypatch):
    with pytest.raises(peers.Skip, match="import swattn_no_such_peer failed"):
        peers.import_peer("swattn_no_such_peer")
    assert "not found" in peers.use_peers(str(tmp_path / "missing"))
    monkeypatch.setenv("SWATTN_PEERS", str(tmp_path))
    assert peers.peers_dir() == str(tmp_path)
    assert peers.peers_dir("x") == "x"
    inp = extend_inputs.build_inputs(_case([(4, 3)]), "cpu")
    for variant in ebench.VARIANTS:
        with pytest.raises(peers.Skip):
            variant.build(inp)


def test_flashinfer_skips_when_not_importable(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_flashinfer(name, *args, **kwargs):
        if name.startswith("flashinfer"):
            raise ImportError("no flashinfer here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_flashinfer)
    inp = extend_inputs.build_inputs(_case([(4, 3)]), "cpu")
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    with pytest.raises(peers.Skip, match="import flashinfer failed"):
        extend_peers.flashinfer(inp)


def test_sglang_full_layout_skips_when_the_prefix_is_inside_the_window(monkeypatch):
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    inp = extend_inputs.build_inputs(_case([(3, 4)], window_left=3), "cpu")
    with pytest.raises(peers.Skip, match="= window layout"):
        extend_peers.sglang_extend(inp, layout="full")


def test_variant_selection():
    keys = [v.key for v in peers.select(ebench.VARIANTS, ["flex", "flashinfer"])]
    assert "flex" not in keys and keys[:2] == ["tight", "control"]
    assert {v.role for v in ebench.VARIANTS} == {"tight", "control", "ours", "peer"}
    with pytest.raises(ValueError, match="unknown variant"):
        peers.select(ebench.VARIANTS, ["nope"])


# --------------------------------------------------------------------------------------
# Timing statistics and tables.
# --------------------------------------------------------------------------------------

def test_summary_noise_and_reps():
    stats = harness.summarize([[10.0, 12.0, 11.0], [13.0, 9.0]])
    assert stats["median_us"] == 11.0 and stats["reps"] == 5
    assert stats["p20_us"] == pytest.approx(np.percentile([9, 10, 11, 12, 13], 20))
    assert stats["round_medians_us"] == [11.0, 11.0]
    assert harness.noise_floor([[100.0] * 3, [100.0] * 3],
                               [[101.0] * 3, [98.0] * 3]) == pytest.approx(0.02)
    assert harness.reps_for(100.0, 30, 1500.0) == 30
    assert harness.reps_for(100_000.0, 30, 1500.0) == 15
    assert harness.reps_for(1e7, 30, 1500.0) == 5


def _fake_result():
    case = wl.extend_cases("A", cases=[(8192, 8192)])[0]
    V = harness.VariantResult
    variants = [
        V("swattn tight", "tight", "tight", rel_err=3e-3, graphed=True,
          rounds_us=[[150.0, 152.0], [151.0]],
          host_us={"plan.run": 9.5, "plan.run (eager)": 151.0, "one-shot": 21.0,
                   "one-shot (eager)": 152.0},
          tiling={"block_m": 64, "block_n": 64, "tokens_per_block": 64, "heads": 64}),
        V("swattn tight (control)", "control", "control", rel_err=3e-3, graphed=True,
          rounds_us=[[152.0, 153.0], [150.0]]),
        V("swattn skip, full layout", "skip", "ours", rel_err=3e-3, graphed=True,
          rounds_us=[[900.0], [910.0]]),
        V("vLLM unified", "vllm", "peer", rel_err=4e-3, graphed=True,
          rounds_us=[[1040.0], [1044.0]]),
        V("FlexAttention", "flex", "peer", rel_err=5e-3, applies_sinks=False, graphed=True,
          note="no sinks | dense", rounds_us=[[345.0], [346.0]]),
        V("SGLang, full layout", "sglang-full", "peer", status="skipped", note="import failed"),
        V("FlashInfer", "flashinfer", "peer", status="error", note="build: boom"),
    ]
    noise = harness.noise_floor(variants[0].rounds_us, variants[1].rounds_us)
    return harness.CaseResult(case, variants, noise, 12.0)


def test_case_report_ratios_and_prediction():
    ceilings = {"matmul_tflops": 791.0, "copy_gbps": 4266.0}
    summary, rows = report.case_report(_fake_result(), ceilings)
    by = {r["key"]: r for r in rows}
    # FlexAttention drops the sinks: the fastest peer that computes the same function is vLLM.
    assert summary["best_peer"] == "vLLM unified" and by["flex"]["same_function"] is False
    assert by["tight"]["ratio_best_peer"] == pytest.approx(151.0 / 1042.0)
    assert by["vllm"]["ratio_best_peer"] == 1.0 and by["vllm"]["verdict"] == "fastest peer"
    assert by["control"]["verdict"] == "faster"
    # The control is the same kernel: within the noise floor of the tight one by construction.
    assert by["control"]["verdict_tight"] == "no change" and by["skip"]["verdict_tight"] == "slower"
    assert by["skip"]["ratio_tight"] == pytest.approx(905.0 / 151.0)
    assert by["tight"]["roofline"] == pytest.approx(summary["floor_us"] / 151.0)
    assert by["tight"]["tflops"] == pytest.approx(summary["flops"] / 151.0 / 1e6)
    assert summary["measured_tight_over_skip"] == pytest.approx(151.0 / 905.0)
    assert 0 < summary["predicted_tight_over_skip"] < 0.05
    assert by["sglang-full"]["median_us"] is None and by["flashinfer"]["status"] == "error"


def test_tables_are_written(tmp_path):
    ceilings = {"matmul_tflops": 791.0, "copy_gbps": 4266.0}
    meta = {"date": "2026-12-01", "gpu": "H200", "driver": "1", "cuda": "12", "torch": "t",
            "triton": "3.6", "commit": "abc", "command": "python -m swattn.bench --quick"}
    text = report.write(str(tmp_path), meta, ceilings, [_fake_result()])
    assert "H200" in text and "`python -m swattn.bench --quick`" in text and "791 TFLOP/s" in text
    lines = text.splitlines()
    host_at = lines.index("## Host time of a call (us)")
    table = [line for line in lines[:host_at] if line.startswith("| A P8192 E8192 | ")]
    assert len(table) == 7 + 1
    # Pipes inside notes are escaped: 11 columns per line (the case line comes last).
    assert [line.count("|") for line in table] == [12] * 7 + [12]
    # The host times: the tight row only, plan.run's and the one-shot's.
    host = [line for line in lines[host_at:] if line.startswith("| A P8192 E8192 | ")]
    assert host == ["| A P8192 E8192 | swattn tight | 151.0 | 9.5 | 151.0 | 21.0 | 152.0 |"]
    assert "**FlexAttention**: no sinks / dense" in text
    flex_line = next(line for line in table if "FlexAttention" in line)
    assert "other fn" in flex_line
    assert "import failed" in next(line for line in table if "SGLang, full layout" in line)
    assert (tmp_path / "extend.md").read_text() == text
    rows = list(csv.DictReader(io.StringIO((tmp_path / "extend.csv").read_text())))
    assert [r["key"] for r in rows][:2] == ["tight", "control"] and len(rows) == 7
    assert (rows[0]["host_run_us"], rows[0]["host_one_shot_us"]) == ("9.5", "21.0")
    data = json.loads((tmp_path / "extend.json").read_text())
    assert data["cases"][0]["case"] == "A P8192 E8192"
    assert data["raw_us"]["A P8192 E8192"]["swattn tight"] == [[150.0, 152.0], [151.0]]


# --------------------------------------------------------------------------------------
# Orchestration, with the GPU parts (graph capture, event timing) replaced.
# --------------------------------------------------------------------------------------

def _ref_variant(scale=1.0, leave_nan=False, fail=False):
    def build(inputs):
        from swattn import reference
        case = inputs.case
        out = torch.empty(inputs.q.shape[0], case.num_q_heads, case.head_dim_v,
                          dtype=inputs.q.dtype)

        def fn():
            if fail:
                raise RuntimeError("launch failed")
            if leave_nan:
                return
            ref = reference.extend_attention(
                inputs.q, inputs.k, inputs.v, inputs.k_pool, inputs.v_pool,
                inputs.block_table_window, inputs.cu_seqlens, inputs.prefix_lens,
                window_left=case.window_left, sinks=inputs.sinks)
            out.copy_(ref * scale)

        return peers.Prepared(fn, lambda: out, "fake", True, lambda: out.fill_(float("nan")))
    return build


def _raise(exc):
    def build(inputs):
        raise exc
    return build


def test_run_case_records_every_variant_and_keeps_going(monkeypatch):
    monkeypatch.setattr(harness, "capture", lambda fn, warmup=2: (fn, True, ""))
    times = iter(range(1000))
    monkeypatch.setattr(harness, "measure",
                        lambda replay, reps, flush: [100.0 + next(times) % 2] * reps)
    V = peers.Variant
    variants = [V("tight", "tight", "tight", _ref_variant()),
                V("control", "control", "control", _ref_variant()),
                V("wrong", "w", "peer", _ref_variant(scale=0.5)),
                V("unwritten", "n", "peer", _ref_variant(leave_nan=True)),
                V("crash", "c", "peer", _ref_variant(fail=True)),
                V("boom", "b", "peer", _raise(RuntimeError("no"))),
                V("skipped", "s", "peer", _raise(peers.Skip("not here")))]
    case = _case([(13, 5), (6, 5)], window_left=5)
    result = ebench.run_case(case, variants, reps=3, rounds=2, flush=lambda: None, device="cpu")
    by = {v.name: v for v in result.variants}
    assert [v.name for v in result.variants] == [v.name for v in variants]
    assert by["tight"].status == by["control"].status == "ok" and by["tight"].rel_err < 1e-2
    assert by["wrong"].status == "WRONG" and by["wrong"].rel_err == pytest.approx(0.5, rel=1e-2)
    assert by["unwritten"].status == "WRONG" and by["unwritten"].rel_err != by["unwritten"].rel_err
    assert by["crash"].status == "error" and "launch failed" in by["crash"].note
    assert by["boom"].status == "error" and by["skipped"].status == "skipped"
    for name in ("tight", "control", "wrong", "unwritten"):
        assert [len(r) for r in by[name].rounds_us] == [3, 3]
    assert by["crash"].rounds_us == [] and result.noise is not None and result.noise <= 0.01


def test_interleave_times_the_variants_turn_by_turn(monkeypatch):
    """Each round times every variant once a turn (order rotated every turn and round),
    a slow variant only for its fewer repetitions, one that raises dropped from then on."""
    calls = []
    monkeypatch.setattr(harness, "measure", lambda replay, reps, flush: [replay()] * reps)

    def variant(name, us, fail_at=None):
        def replay():
            calls.append(name)
            if fail_at is not None and calls.count(name) == fail_at:
                raise RuntimeError("lost")
            return us
        return replay

    replays = {"a": variant("a", 100.0), "b": variant("b", 100.0), "slow": variant("slow", 1e6),
               "bad": variant("bad", 100.0, fail_at=5)}
    times, errors = harness.interleave(replays, reps=6, rounds=2, flush=lambda: None,
                                       budget_ms=1000.0, warm_ms=0.0)
    # Sizing (a call and a timed one each), then round 1: a warm call each, then turns.
    assert calls[:8] == ["a", "a", "b", "b", "slow", "slow", "bad", "bad"]
    assert calls[8:12] == ["a", "b", "slow", "bad"]
    assert calls[12:16] == ["a", "b", "slow", "bad"]  # turn 0
    assert calls[16:20] == ["b", "slow", "bad", "a"]  # turn 1, rotated; "bad" raises here
    assert calls[20:23] == ["slow", "a", "b"]  # turn 2: "bad" is out
    # "slow" gets the fewest repetitions, 5 (reps_for), so turn 5 (rotated by 1) is b, a.
    assert calls[29:31] == ["b", "a"] and calls[31:34] == ["b", "slow", "a"]  # round 2 warm calls
    assert [len(r) for r in times["a"]] == [6, 6] and [len(r) for r in times["slow"]] == [5, 5]
    assert times["bad"] == [] and "lost" in errors["bad"]


def test_flush_kinds():
    """The clean flush reads its buffer (L2 left clean), the dirty one writes it; another
    kind is refused by name."""
    clean = harness.Flush(device="cpu", nbytes=4096)
    clean.buffer[7] = 2.5
    clean()
    assert clean.total.item() == 1024.0 + 1.5 and clean.buffer.dtype == torch.float32
    dirty = harness.Flush(device="cpu", nbytes=4096, kind="dirty")
    dirty.buffer.fill_(3)
    dirty()
    assert dirty.buffer.numel() == 4096 and not dirty.buffer.any()
    with pytest.raises(ValueError, match="flush kind"):
        harness.Flush(device="cpu", nbytes=4096, kind="warm")


def test_main_writes_the_tables(monkeypatch, tmp_path, capsys):
    from swattn.bench import cli
    real_gpu = torch.cuda.is_available()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(harness, "Flush", lambda kind: (lambda: None))
    monkeypatch.setattr(harness, "measure_ceilings",
                        lambda flush: {"matmul_tflops": 791.0, "copy_gbps": 4266.0})
    monkeypatch.setattr(report, "collect_meta",
                        lambda command, method="": {"command": command, "gpu": "fake"})
    seen = []

    def fake_run_case(case, variants, **kwargs):
        seen.append((case.name, [v.key for v in variants], kwargs["reps"], kwargs["rounds"]))
        if case.seqs[0] == (7168, 1024):
            raise RuntimeError("out of memory")
        res = _fake_result()
        res.case = case
        return res

    monkeypatch.setattr(harness, "run_case", fake_run_case)
    assert cli.main(["--quick", "--out", str(tmp_path), "--skip", "flex",
                     "--peers", str(tmp_path)]) == 0
    assert [s[0] for s in seen] == ["A P4096 E4096", "A P7168 E1024"]
    assert "flex" not in seen[0][1] and seen[0][2:] == (10, 2)
    text = capsys.readouterr().out
    assert "python -m swattn.bench --quick" in text and "out of memory" in text
    assert (tmp_path / "extend.md").exists() and (tmp_path / "extend.csv").exists()
    # A decode workload goes down the decode path, which asks the GPU for its memory
    # before building an 8 GB cache: without one, refused with a clear message.
    if real_gpu:
        return
    assert cli.main(["--workload", "C-A"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_plots_from_a_results_json(tmp_path):
    """--replot draws from a run's JSON with no GPU; without matplotlib it says so."""
    from swattn.bench import plots
    rows = [{"case": f"A P{p} E8", "variant": v, "median_us": t, "roofline": t / 1000.0}
            for p in (0, 8) for v, t in (("swattn tight", 10.0), ("vLLM unified", 30.0))]
    meta = {"gpu": "test", "torch": "x", "triton": "y", "commit": "z"}
    path = tmp_path / "extend.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}))
    written = plots.plot(str(path))
    if isinstance(written, str):
        assert "matplotlib" in written
    else:
        assert sorted(os.path.basename(p) for p in written) == ["A_roofline.png", "A_time.png"]
        assert all(os.path.getsize(p) > 1000 for p in written)


def test_progress_in_log_lines_and_bar(capsys, monkeypatch):
    """Each log line carries the share of planned measurements done; on a terminal a bar
    is drawn too."""
    harness.PROGRESS.start(4)
    try:
        harness.PROGRESS.advance()
        harness.PROGRESS.advance()
        harness.log("half way")
        assert " 50%] half way" in capsys.readouterr().err
        monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
        harness.PROGRESS.advance()
        assert "[######################........] 3/4" in capsys.readouterr().err
    finally:
        harness.PROGRESS.start(0)
