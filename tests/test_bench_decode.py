"""The decode rows of ``swattn bench``, on the CPU: the registry (C-A, C-B, C-F, S), the work a
decode case counts against hand-computed values, the input builder's poisoning at a tiny
size, the peers' adapters run under Triton's interpreter against the float64 reference
(SGLang's decode kernel and its split helper, vLLM's 3D path, swattn's decode kernel when it
is there), clean skips, the tables, and the command line."""

import csv
import io
import json
import os
import sys

import pytest
import torch

from swattn.bench import decode as dbench
from swattn.bench import extend as ebench
from swattn.bench import harness, peers, report
from swattn.bench import workloads as wl
from swattn.bench.cli import build_cases, parse_args, split_cases

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
ANCHOR_CEILINGS = {"matmul_tflops": 791.0, "copy_gbps": 4266.0}

interpreter = pytest.mark.skipif(not INTERPRET, reason="runs the kernels under TRITON_INTERPRET=1")


def _case(lens=(40, 7, 29), window_left=13, sinks=True, heads=(4, 2), dims=(32, 32), sparse=0,
          page_size=4):
    return wl.DecodeCase("T", heads[0], heads[1], dims[0], dims[1], window_left, sinks, tuple(lens),
                         sparse, page_size)


# --------------------------------------------------------------------------------------
# Registry.
# --------------------------------------------------------------------------------------

def test_decode_workloads_in_the_registry():
    ca, cb, s, cf = (wl.get(n) for n in ("C-A", "C-B", "S", "C-F"))
    assert (ca.kind, ca.num_q_heads, ca.num_kv_heads, ca.head_dim, ca.head_dim_v, ca.window_left,
            ca.sinks, ca.batch, ca.context) == ("decode", 16, 2, 64, 64, 127, True, 64, 32768)
    assert (cb.kind, cb.num_q_heads, cb.num_kv_heads, cb.head_dim, cb.window_left, cb.sinks,
            cb.batch, cb.context) == ("decode", 32, 8, 128, 4095, False, 64, 32768)
    assert (s.kind, s.num_q_heads, s.num_kv_heads, s.head_dim, s.head_dim_v, s.window_left, s.sinks,
            s.batch, s.context, s.sparse_keys) == ("sparse_decode", 64, 1, 576, 512, 127, True, 64,
                                                   32768, 512)
    assert (cf.kind, cf.window_left, cf.sinks, cf.num_q_heads, cf.head_dim) == (
        "decode", None, True, 16, 64)
    case, = wl.decode_cases("c-a")
    assert case.name == "C-A S32768" and case.batch == 64 and case.uniform and case.kind == "decode"
    small = wl.decode_cases("S", batch=2, contexts=wl.parse_contexts("100, 4096"), page_size=1)
    assert [(c.name, c.batch, c.page_size, c.sparse_keys) for c in small] == \
        [("S S100", 2, 1, 512), ("S S4096", 2, 1, 512)]
    with pytest.raises(ValueError, match="not decode"):
        wl.decode_cases("A")
    with pytest.raises(ValueError, match="decode"):
        wl.extend_cases("S")
    for bad in ("", "0", "x", "12,-3"):
        with pytest.raises(ValueError):
            wl.parse_contexts(bad)


# --------------------------------------------------------------------------------------
# Work: FLOPs and bytes by hand.
# --------------------------------------------------------------------------------------

def test_decode_flops_and_bytes_by_hand():
    ca, = wl.decode_cases("C-A")
    # 64 sequences x 128 keys; 4 x keys x D x Hq; Q+O 64 x 16 x 128, K+V 8192 x 2 x 128 (bf16).
    assert ca.keys() == 8192
    assert ca.flops() == 4 * 8192 * 64 * 16 == 33_554_432
    assert ca.bytes_moved() == 2 * (64 * 16 * 128 + 8192 * 2 * 128) == 4_456_448
    cb, = wl.decode_cases("C-B")
    assert cb.keys() == 64 * 4096
    assert cb.flops() == 4 * 262_144 * 128 * 32 == 4_294_967_296
    assert cb.bytes_moved() == 2 * (64 * 32 * 256 + 262_144 * 8 * 256) == 1_074_790_400
    cf, = wl.decode_cases("C-F")
    assert cf.keys() == 64 * 32768
    assert cf.bytes_moved() == 2 * (64 * 16 * 128 + 2_097_152 * 2 * 128) == 1_074_003_968
    s, = wl.decode_cases("S")
    # 128 window keys + 480 sparse keys (512 entries, one in 16 is -1); QK 576, PV 512.
    assert (s.sparse_valid, s.keys()) == (480, 64 * 608)
    assert s.flops() == 2 * 38_912 * 64 * (576 + 512) == 5_419_040_768
    # A latent cache: the 576-wide key rows hold the values.
    assert s.latent and s.bytes_moved() == 2 * (64 * 64 * 1088 + 38_912 * 1 * 576) == 53_739_520
    # The floors at the H200's ceilings: C-A 1.0 us, C-B 252 us (copy-bound).
    assert round(report.floor_us(ca.flops(), ca.bytes_moved(), ANCHOR_CEILINGS), 1) == 1.0
    assert round(report.floor_us(cb.flops(), cb.bytes_moved(), ANCHOR_CEILINGS)) == 252


def test_window_keys_short_sequences_and_full_attention():
    case = _case(lens=(40, 7, 14, 1), window_left=13)
    assert [case.window_keys(s) for s in case.seq_lens] == [14, 7, 14, 1]
    assert [case.lowest_key(s) for s in case.seq_lens] == [26, 0, 0, 0]
    assert case.keys() == 36 and case.visible_pairs() == 36
    full = _case(lens=(40, 7), window_left=None)
    assert full.keys() == 47 and full.lowest_key(40) == 0
    sparse = _case(lens=(40, 7), sparse=32)
    assert sparse.keys() == 14 + 7 + 2 * 30
    assert sparse.name == "T S40,S7" and _case(lens=(9, 9)).name == "T S9"


# --------------------------------------------------------------------------------------
# Inputs.
# --------------------------------------------------------------------------------------

def test_inputs_poison_what_nobody_may_read():
    case = _case(lens=(40, 7, 29), window_left=13, page_size=4, sparse=32)
    inp = dbench.build_inputs(case, "cpu", seed=1)
    size = case.page_size
    assert inp.seq_lens.dtype == inp.block_table_window.dtype == torch.int32
    assert inp.seq_lens.tolist() == [40, 7, 29]
    rows_k = inp.k_cache.view(-1, 2 * 32)
    written = torch.zeros(rows_k.shape[0], dtype=torch.bool)
    written[:size] = True  # the null page
    for b, s in enumerate(case.seq_lens):
        used = -(-s // size)
        lo = case.lowest_key(s)
        full, win = inp.block_table_full[b].tolist(), inp.block_table_window[b].tolist()
        assert len(full) == 10 + 1  # the longest sequence's pages and a spare column
        for n in range(len(full)):
            if n >= used:
                assert full[n] == win[n] == -1, (b, n)
            elif (n + 1) * size <= lo:
                assert full[n] >= 1 and win[n] == -1, (b, n)
            else:
                assert full[n] == win[n] >= 1, (b, n)
        written[inp.slots(b, lo // size * size, s)] = True  # the window's pages, up to the end
        # Pages wholly below the window are freed (NaN); the rows past the end too.
        below = [p for p in full[:lo // size]]
        assert all(torch.isnan(inp.k_cache[p]).all() for p in below)
        assert torch.isnan(inp.k_cache.view(-1, 2, 32)[inp.slots(b, s, used * size)]).all()
        # Rows below the window inside the window's first page are written (finite).
        assert torch.isfinite(inp.k_cache.view(-1, 2, 32)[inp.slots(b, lo // size * size, s)]).all()
    # Exactly the window's pages (up to each end) and the null page are finite in the cache.
    assert torch.isfinite(rows_k[written]).all() and torch.isnan(rows_k[~written]).all()
    assert torch.isnan(inp.v_cache.view(-1, 2 * 32)[~written]).all()
    # A -1 page id addresses the NaN page before the cache, -1 pool row the NaN row before it.
    assert torch.isnan(inp.k_rows[:inp.cache_row0]).all()
    assert torch.isnan(inp.v_rows[:inp.cache_row0]).all()
    assert torch.isnan(inp.k_rows[inp.sparse_row0 - 1]).all()
    assert inp.k_cache.data_ptr() == inp.k_rows[inp.cache_row0:].data_ptr()
    # Sparse: distinct rows of the sequence's share, 2 of 32 entries -1, unnamed rows NaN.
    k_pool, v_pool, idx = inp.sparse
    assert idx.shape == (3, 32) and idx.dtype == torch.int32
    assert k_pool.data_ptr() == inp.k_rows[inp.sparse_row0:].data_ptr()
    assert k_pool.shape[0] == 3 * 64
    for b in range(3):
        row = idx[b]
        assert int((row == -1).sum()) == 2
        valid = row[row >= 0]
        assert len(set(valid.tolist())) == 30
        assert all(64 * b <= r < 64 * (b + 1) for r in valid.tolist())
    named = torch.zeros(k_pool.shape[0], dtype=torch.bool)
    named[idx[idx >= 0].long()] = True
    assert torch.isfinite(k_pool[named]).all() and torch.isnan(k_pool[~named]).all()
    assert torch.isnan(v_pool[~named]).all()
    for t in (inp.q, inp.sinks):
        assert torch.isfinite(t).all() and (t != 0).float().mean() > 0.9


def test_reference_reads_only_the_window():
    """The check's reference runs through the window table (-1 below) without NaN, and the
    sinks and the sparse keys each change it (so dropping one is caught)."""
    case = _case(lens=(40, 7, 29, 33, 12), sparse=32)
    inp = dbench.build_inputs(case, "cpu", seed=2)
    ref = dbench.reference_first(inp)
    assert ref.shape == (dbench.CHECK_SEQS, 4, 32) and ref.dtype == torch.float64
    assert torch.isfinite(ref).all()
    assert harness.relative_error(dbench.reference_first(inp, sinks=False), ref) > 1e-2
    assert harness.relative_error(dbench.reference_first(inp, sparse=False), ref) > 1e-2
    assert dbench.reference_first(inp, count=99).shape[0] == 5


def test_footprint_of_cb_is_the_cache_and_a_dense_copy():
    cb, = wl.decode_cases("C-B")
    cache = 64 * 32768 * 8 * 128 * 2 * 2
    assert cache < dbench.footprint(cb) < 2.01 * cache


# --------------------------------------------------------------------------------------
# Peers' sizing helpers.
# --------------------------------------------------------------------------------------

def test_vllm_3d_threshold_and_flex_chunks():
    # 128 / Hkv at the nearest CUDA-graph capture size.
    assert [dbench.vllm_threshold_3d(h) for h in (1, 2, 8, 3)] == [128, 64, 16, 40]
    # C-B: 64 x 8 x 32768 x 128 = 2^31 K elements -> two launches of 32; C-A fits in one.
    assert dbench.flex_chunks(64, 8 * 32768 * 128) == 2
    assert dbench.flex_chunks(64, 2 * 32768 * 64) == 1
    assert dbench.flex_chunks(3, 1 << 31) == 3


def test_sglang_splits_without_a_device_fill_the_maximum():
    lens = torch.full((5,), 100, dtype=torch.int32)
    assert dbench.sglang_num_kv_splits(lens, 16, 2, 8, core_count=0).tolist() == [8] * 5


@interpreter
def test_sglang_split_helper_under_the_interpreter(with_peers):
    """Its helper on an H200 (132 SMs) at context 32768, batch 64: 8 splits for C-A, 3 for C-B."""
    lens = torch.full((64,), 32768, dtype=torch.int32)
    assert set(dbench.sglang_num_kv_splits(lens, 16, 2, 8, 132).tolist()) == {8}
    assert set(dbench.sglang_num_kv_splits(lens, 32, 8, 8, 132).tolist()) == {3}


# --------------------------------------------------------------------------------------
# The adapters against the reference, under the interpreter (fp32/fp16: its bf16 dot is broken).
# --------------------------------------------------------------------------------------

ADAPTER_CASES = {
    "window": _case(lens=(70, 9, 50, 33), window_left=20, page_size=16),
    "full": _case(lens=(70, 9, 50, 33), window_left=None, page_size=16),
    "sparse": _case(lens=(45, 20, 31), window_left=7, heads=(16, 1), dims=(80, 64), sparse=32,
                    page_size=16),
}


def _check(prepared, inp):
    prepared.poison()
    prepared.fn()
    out = prepared.result()
    ref = dbench.reference_first(inp, sinks=prepared.applies_sinks,
                                 sparse=prepared.applies_sparse, count=99)
    assert torch.isfinite(out).all()
    return harness.relative_error(out, ref)


@interpreter
@pytest.mark.parametrize("name", list(ADAPTER_CASES))
def test_sglang_decode_adapter_matches_the_reference(with_peers, name):
    case = ADAPTER_CASES[name]
    inp = dbench.build_inputs(case, "cpu", seed=3, dtype=torch.float32)
    prepared = dbench.sglang_decode(inp, core_count=8)  # its split helper, not the fallback
    assert _check(prepared, inp) < 1e-5
    window = "all keys" if case.window_left is None else f"last W={case.window_left + 1} keys"
    assert window in prepared.note


@interpreter
def test_sglang_decode_adapter_on_the_latent_head_dims(with_peers):
    """576/512 takes SGLang's split 512 + 64 (rope) path; fp16 under the interpreter."""
    case = _case(lens=(45, 20), window_left=7, heads=(16, 1), dims=(576, 512), sparse=32,
                 page_size=16)
    inp = dbench.build_inputs(case, "cpu", seed=4, dtype=torch.float16)
    assert _check(dbench.sglang_decode(inp, core_count=8), inp) < 2e-3


@interpreter
@pytest.mark.parametrize("name", ["window", "full"])
def test_vllm_decode_adapter_matches_the_reference(with_peers, name):
    inp = dbench.build_inputs(ADAPTER_CASES[name], "cpu", seed=5, dtype=torch.float32)
    prepared = dbench.vllm_decode(inp)
    assert "3D split-KV" in prepared.note  # batch 4 <= 64: its split-KV path
    assert _check(prepared, inp) < 1e-5


@interpreter
def test_vllm_fp8_decode_adapter_matches_its_reference(with_peers):
    """vLLM's FP8_PER_TENSOR mode over an fp8 copy of the cache, against the reference over
    that copy."""
    inp = dbench.build_inputs(ADAPTER_CASES["window"], "cpu", seed=5, dtype=torch.float32)
    prepared = dbench.vllm_decode(inp, fp8=torch.float8_e4m3fn)
    assert "FP8_PER_TENSOR" in prepared.note
    prepared.poison()
    prepared.fn()
    assert harness.relative_error(prepared.result()[:4], prepared.reference()) < 1e-5


@interpreter
@pytest.mark.parametrize("name", list(ADAPTER_CASES))
def test_our_decode_adapters_match_the_reference(name):
    inp = dbench.build_inputs(ADAPTER_CASES[name], "cpu", seed=6, dtype=torch.float32)
    for build in (dbench.ours, lambda i: dbench.ours(i, bounds="skip", layout="full"),
                  lambda i: dbench.ours(i, num_splits=1), lambda i: dbench.ours(i, control=True)):
        try:
            prepared = build(inp)
        except peers.Skip as skip:
            pytest.skip(f"swattn's decode kernel is not usable here: {skip}")
        assert _check(prepared, inp) < 1e-5


@interpreter
@pytest.mark.parametrize("name", ["window", "sparse"])
def test_our_fp8_decode_variant_matches_its_reference(name):
    """The fp8 row computes over an fp8 copy of the cache: checked against the reference over
    that copy, which stays within fp8's rounding of the case's own reference."""
    inp = dbench.build_inputs(ADAPTER_CASES[name], "cpu", seed=7, dtype=torch.float32)
    prepared = dbench.ours_fp8(inp)
    prepared.poison()
    prepared.fn()
    out = prepared.result()
    n = min(dbench.CHECK_SEQS, inp.case.batch)
    assert harness.relative_error(out[:n], prepared.reference()) < 1e-5
    assert harness.relative_error(out[:n], dbench.reference_first(inp)) < 0.1


@interpreter
def test_run_case_over_the_decode_variants(with_peers, monkeypatch):
    """The whole per-case flow (check, capture, interleave) with the GPU parts replaced."""
    monkeypatch.setattr(harness, "capture", lambda fn, warmup=2: (fn, True, ""))
    monkeypatch.setattr(harness, "measure", lambda replay, reps, flush: [10.0] * reps)
    case = _case(lens=(37, 6), window_left=20, heads=(2, 1), dims=(16, 16), page_size=16)

    original = dbench.build_inputs

    def build(c, device, seed):
        return original(c, device, seed, dtype=torch.float32)

    monkeypatch.setattr(dbench, "build_inputs", build)
    result = dbench.run_case(case, dbench.VARIANTS, reps=2, rounds=1, flush=lambda: None,
                             device="cpu")
    by = {v.key: v for v in result.variants}
    assert by["sglang"].status == by["vllm"].status == "ok"
    assert by["sglang"].rel_err < 1e-5 and by["vllm"].rel_err < 1e-5
    assert by["flex"].status == by["flashinfer"].status == "skipped"
    if by["tight"].status != "skipped":
        assert all(by[k].status == "ok" for k in ("tight", "control", "skip", "split1"))
        assert result.noise == 0.0


# --------------------------------------------------------------------------------------
# Skips.
# --------------------------------------------------------------------------------------

def test_peers_skip_cleanly_when_not_importable(monkeypatch):
    inp = dbench.build_inputs(_case(page_size=16), "cpu")
    for module in (dbench.SGLANG_DECODE, "vllm.v1.attention.ops.triton_unified_attention",
                   "flashinfer"):
        monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(peers.Skip,
                       match="import sglang.kernels.ops.attention.decode_attention failed"):
        dbench.sglang_decode(inp)
    with pytest.raises(peers.Skip,
                       match="import vllm.v1.attention.ops.triton_unified_attention failed"):
        dbench.vllm_decode(inp)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    with pytest.raises(peers.Skip, match="import flashinfer failed"):
        dbench.flashinfer_decode(inp)


def test_variants_that_cannot_run_here_skip(monkeypatch):
    inp = dbench.build_inputs(_case(page_size=16), "cpu")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for variant in dbench.VARIANTS:  # CPU without the interpreter: nothing runs
        with pytest.raises(peers.Skip):
            variant.build(inp)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for build in (dbench.flex_decode, dbench.flashinfer_decode):
        with pytest.raises(peers.Skip, match="needs a CUDA device"):
            build(inp)
    with pytest.raises(peers.Skip, match="block size 16"):
        dbench.vllm_decode(dbench.build_inputs(_case(page_size=4), "cpu"))
    sparse = dbench.build_inputs(_case(dims=(48, 32), sparse=16, page_size=16), "cpu")
    with pytest.raises(peers.Skip, match="one head size"):
        dbench.vllm_decode(sparse)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    with pytest.raises(peers.Skip, match="one head dim"):
        dbench.flashinfer_decode(sparse)


def test_decode_variant_keys():
    """Keys are unique, the tight variant and its control come first (the noise floor pairs
    them), and --skip drops exactly the keys named, the others in the table's order."""
    keys = [v.key for v in dbench.VARIANTS]
    assert keys[:2] == ["tight", "control"] and len(set(keys)) == len(keys)
    assert {v.role for v in dbench.VARIANTS[:2]} == {"tight", "control"}
    known = {v.key for v in ebench.VARIANTS} | set(keys)
    assert [v.key for v in peers.select(dbench.VARIANTS, ["split1", "flex"], known)] == \
        [k for k in keys if k not in ("split1", "flex")]
    assert "split1" not in {v.key for v in ebench.VARIANTS}
    # (a decode-only key)
    assert peers.select(ebench.VARIANTS, ["split1"], known) == list(ebench.VARIANTS)
    with pytest.raises(ValueError, match="unknown variant"):
        peers.select(dbench.VARIANTS, ["nope"], known)


# --------------------------------------------------------------------------------------
# Tables.
# --------------------------------------------------------------------------------------

def _fake_decode_result(name="S"):
    case, = wl.decode_cases(name)
    V = harness.VariantResult
    variants = [
        V("swattn tight", "tight", "tight", rel_err=3e-3, graphed=True,
          rounds_us=[[6.0, 6.1], [6.0]]),
        V("swattn tight (control)", "control", "control", rel_err=3e-3, graphed=True,
          rounds_us=[[6.1, 6.0], [6.0]]),
        V("swattn skip, full layout", "skip", "ours", rel_err=3e-3, graphed=True,
          rounds_us=[[60.0], [61.0]]),
        V("swattn tight, 1 split", "split1", "ours", rel_err=3e-3, graphed=True,
          rounds_us=[[12.0], [12.0]]),
        V("SGLang decode", "sglang", "peer", rel_err=4e-3, graphed=True,
          rounds_us=[[20.0], [20.0]]),
        V("vLLM unified", "vllm", "peer", status="skipped", note="vLLM's kernel has one head size"),
        V("FlexAttention", "flex", "peer", rel_err=5e-3, applies_sinks=False, applies_sparse=False,
          graphed=True, note="dense", rounds_us=[[9.0], [9.0]]),
        V("FlashInfer", "flashinfer", "peer", status="skipped", note="import flashinfer failed"),
    ]
    noise = harness.noise_floor(variants[0].rounds_us, variants[1].rounds_us)
    return harness.CaseResult(case, variants, noise, 3.0)


def test_an_fp8_variant_counts_its_own_bytes():
    """A variant reading an fp8 copy of the cache (Prepared.kv_bytes = 1): its GB/s and its
    floor count K and V at one byte an element, Q and O at two; the case's floor stays the
    16-bit cache's."""
    result = _fake_decode_result("C-B")
    result.variants.append(harness.VariantResult("swattn tight, fp8 e4m3 cache", "fp8", "ours",
                                                 rel_err=1e-3, graphed=True,
                                                 rounds_us=[[4.0], [4.0]], kv_bytes=1))
    summary, rows = report.case_report(result, ANCHOR_CEILINGS)
    by = {r["key"]: r for r in rows}
    case, = wl.decode_cases("C-B")
    fp8_bytes = case.bytes_moved(kv_element_size=1)
    q_o = case.batch * case.num_q_heads * (case.head_dim + case.head_dim_v) * 2
    assert fp8_bytes - q_o == (case.bytes_moved() - q_o) // 2
    assert by["fp8"]["gbps"] == pytest.approx(fp8_bytes / 4.0 / 1e3)
    assert by["fp8"]["floor_us"] < by["tight"]["floor_us"] == summary["floor_us"]
    assert by["fp8"]["roofline"] == pytest.approx(by["fp8"]["floor_us"] / 4.0)


def test_decode_case_report():
    summary, rows = report.case_report(_fake_decode_result(), ANCHOR_CEILINGS)
    by = {r["key"]: r for r in rows}
    # Flex drops the sinks and the sparse keys: SGLang is the fastest peer of the same function.
    assert summary["best_peer"] == "SGLang decode"
    assert by["flex"]["other_fn"] == "sinks, sparse keys"
    assert by["tight"]["ratio_best_peer"] == pytest.approx(6.0 / 20.0)
    assert summary["tight_over_skip"] == pytest.approx(6.0 / 60.5)
    assert summary["tight_over_one_split"] == pytest.approx(0.5)
    assert summary["verdict_tight_vs_one_split"] == "faster"
    assert by["control"]["verdict_tight"] == "no change"
    s, = wl.decode_cases("S")
    assert (summary["flops"], summary["bytes"], summary["keys_per_seq"]) == (
        s.flops(), s.bytes_moved(), 608)
    assert by["tight"]["gbps"] == pytest.approx(s.bytes_moved() / 6.0 / 1e3)
    assert by["tight"]["roofline"] == pytest.approx(summary["floor_us"] / 6.0)


def test_decode_tables_are_written(tmp_path):
    meta = {"date": "2026-12-01", "gpu": "H200", "driver": "1", "cuda": "12", "torch": "t",
            "triton": "3.6", "commit": "abc",
            "command": "python -m swattn.bench --workload C-A,C-B,S"}
    results = [_fake_decode_result("C-A"), _fake_decode_result("S")]
    text = report.write(str(tmp_path), meta, ANCHOR_CEILINGS, results, kind="decode")
    assert text.startswith("# swattn decode attention benchmark")
    assert "H200" in text and "`python -m swattn.bench --workload C-A,C-B,S`" in text
    lines = [line for line in text.splitlines() if line.startswith("| S S32768 | ")]
    # 12 columns a measurement, 13 a case (the tiles predicted).
    assert len(lines) == 8 + 1 and [line.count("|") for line in lines] == [13] * 8 + [14]
    flex = next(line for line in lines if "FlexAttention" in line)
    assert "other fn (no sinks, sparse keys)" in flex
    assert "608 (480 sparse)" in lines[-1]
    ca = next(line for line in text.splitlines() if line.startswith("| C-A S32768 | 64 | 128 |"))
    assert "other fn (no sinks)" in next(line for line in text.splitlines()
                                         if line.startswith("| C-A S32768 | FlexAttention"))
    assert "SGLang decode 20.0 us" in ca
    assert (tmp_path / "decode.md").read_text() == text
    rows = list(csv.DictReader(io.StringIO((tmp_path / "decode.csv").read_text())))
    assert len(rows) == 16 and rows[0]["key"] == "tight"
    data = json.loads((tmp_path / "decode.json").read_text())
    assert [c["case"] for c in data["cases"]] == ["C-A S32768", "S S32768"]
    assert data["raw_us"]["S S32768"]["swattn tight"] == [[6.0, 6.1], [6.0]]
    with pytest.raises(ValueError, match="kind"):
        report.write(str(tmp_path), meta, ANCHOR_CEILINGS, results, kind="prefill")
    from swattn.bench import plots
    written = plots.plot(str(tmp_path / "decode.json"))
    if not isinstance(written, str):
        assert sorted(os.path.basename(p) for p in written) == \
            ["C-A_roofline.png", "C-A_time.png", "S_roofline.png", "S_time.png"]


# --------------------------------------------------------------------------------------
# Command line.
# --------------------------------------------------------------------------------------

def test_cli_parses_decode_workloads():
    extend, decode = split_cases(build_cases(parse_args(["--workload", "C-A"])))
    assert extend == [] and [(c.name, c.batch, c.window_left, c.sinks) for c in decode] == \
        [("C-A S32768", 64, 127, True)]
    args = parse_args(["--workload", "C-A,C-B,S", "--batch", "2", "--context", "64,1000"])
    extend, decode = split_cases(build_cases(args))
    assert extend == [] and [(c.name, c.batch) for c in decode] == [
        ("C-A S64", 2), ("C-A S1000", 2), ("C-B S64", 2), ("C-B S1000", 2), ("S S64", 2),
        ("S S1000", 2)]
    extend, decode = split_cases(build_cases(parse_args(["--workload", "A,C-B",
                                                         "--cases", "64:32"])))
    assert [c.name for c in extend] == ["A P64 E32"] and [c.name for c in decode] == ["C-B S32768"]
    default = wl.extend_cases("A") + wl.extend_cases("B")
    assert [c.name for c in build_cases(parse_args([]))] == [c.name for c in default]


def test_fp8_config_adds_a_variant_a_config(capsys):
    """--fp8-config JSON (repeatable) adds a variant a config over the fp8 cache on the
    Hopper path, its dict handed to the kind's ours_fp8; bad JSON or a non-object is an
    argparse error naming the option."""
    from swattn.bench.cli import config_variants
    args = parse_args(["--workload", "C-B", "--fp8-config", '{"items": 1}',
                       "--fp8-config", '{"items": 2, "block_n": 64}'])
    assert args.fp8_config == [{"items": 1}, {"items": 2, "block_n": 64}]
    calls = []
    variants = config_variants(args.fp8_config, lambda i, **kw: calls.append((i, kw)))
    assert [(v.key, v.role) for v in variants] == [("fp8-config-1", "ours"),
                                                    ("fp8-config-2", "ours")]
    assert variants[1].name.endswith('config {"items": 2, "block_n": 64}')
    for v in variants:
        v.build("inputs")
    assert calls == [("inputs", {"hopper": True, "config": {"items": 1}}),
                     ("inputs", {"hopper": True, "config": {"items": 2, "block_n": 64}})]
    assert parse_args(["--workload", "C-B"]).fp8_config == []
    for bad, message in (("{items: 1}", "not JSON"), ("[1]", "JSON object")):
        with pytest.raises(SystemExit):
            parse_args(["--workload", "C-B", "--fp8-config", bad])
        assert message in capsys.readouterr().err


def test_main_runs_the_decode_rows(monkeypatch, tmp_path, capsys):
    from swattn.bench import cli
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (100 << 30, 141 << 30))
    kinds = []
    monkeypatch.setattr(harness, "Flush", lambda kind: kinds.append(kind) or (lambda: None))
    monkeypatch.setattr(harness, "measure_ceilings", lambda flush: ANCHOR_CEILINGS)
    monkeypatch.setattr(report, "collect_meta",
                        lambda command, method="": {"command": command, "gpu": "fake",
                                                    "method": method})
    seen = []

    def fake_run_case(case, variants, **kwargs):
        seen.append((case.name, [v.key for v in variants], kwargs.get("reps")))
        if case.workload == "C-B":
            raise RuntimeError("out of memory")
        res = _fake_decode_result(case.workload)
        res.case = case
        return res

    monkeypatch.setattr(dbench, "run_case", fake_run_case)
    assert cli.main(["--workload", "C-A,C-B,S", "--out", str(tmp_path), "--skip", "flex,split1",
                     "--peers", str(tmp_path), "--reps", "7"]) == 0
    assert [s[0] for s in seen] == ["C-A S32768", "C-B S32768", "S S32768"]
    assert "flex" not in seen[0][1] and "split1" not in seen[0][1] and seen[0][2] == 7
    text = capsys.readouterr().out
    assert "# swattn decode attention benchmark" in text and "out of memory" in text
    assert "--workload C-A,C-B,S" in text and "first 4 sequences" in text
    assert "256 MB read that flushes L2 (leaving it clean)" in text and kinds == ["clean"]
    assert (tmp_path / "decode.md").exists() and not (tmp_path / "extend.md").exists()
    assert cli.main(["--workload", "C-A", "--out", str(tmp_path), "--flush", "dirty"]) == 0
    assert kinds[-1] == "dirty" and "256 MB write that flushes L2" in capsys.readouterr().out
    assert cli.main(["--workload", "C-A", "--skip", "nope"]) == 2
    monkeypatch.setattr(torch.cuda, "mem_get_info",
                        lambda: (_ for _ in ()).throw(RuntimeError("no GPU")))
    assert cli.main(["--workload", "C-A", "--out", str(tmp_path)]) == 2
