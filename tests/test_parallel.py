"""Context-parallel decode and extend (swattn.parallel) on the CPU: 2 and 3 gloo processes
spawned by the test, each holding a shard of the cache, against the single-process call over
the whole cache; window and full attention, sinks, ragged batches, both shard layouts, fp8
caches, and ranks that see no key (they launch nothing and contribute a neutral state)."""

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
from conftest import DEVICE

from swattn import parallel

WORKER = os.path.join(os.path.dirname(__file__), "parallel_worker.py")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(case, world, timeout=240, device="cpu", backend="gloo"):
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, WORKER, "--rank", str(r), "--world", str(world),
                               "--port", str(port), "--case", case, "--device", device,
                               "--backend", backend],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            assert p.returncode == 0, err[-2000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return results


# (case, world): decode cases, then extend's (a chunk of new tokens after a prefix); "-fp8"
# an e4m3fn cache with a scale a KV head, "-e5m2" one with one scale (tests/parallel_worker.py).
CASES = [
    ("window-interleaved", 2), ("window-interleaved", 3), ("window-interleaved-4", 3),
    ("full-contiguous", 3), ("window-contiguous-idle", 2), ("window-interleaved-4-fp8", 2),
    ("extend-window-interleaved", 3),
    ("extend-window-interleaved-4", 3), ("extend-full-interleaved", 2),
    ("extend-full-contiguous", 3), ("extend-window-contiguous", 3),
    ("extend-window-contiguous-idle", 2), ("extend-window-contiguous-e5m2", 3),
    ("chunk-interleaved", 2), ("extend-chunk-interleaved", 3),
]


# The CPU ranks run under the interpreter, which a process with a GPU does not set up: on
# a GPU machine test_gpu_parallel_on_one_gpu_over_gloo runs the ranks' kernels instead.
cpu_only = pytest.mark.skipif(DEVICE == "cuda", reason="CPU ranks (the CPU suite runs these)")


@cpu_only
@pytest.mark.parametrize("case, world", CASES)
def test_parallel_equals_the_single_process_call(case, world):
    results = _run(case, world)
    assert len(results) == world
    for r in results:
        assert not r["nan"] and r["err"] < 5e-3, r
        # deterministic=True: right, and the weighted parts added in rank order, bit for bit.
        assert r["det_err"] < 5e-3 and r["det_in_rank_order"], r
        if "rs_err" in r:  # merge="reduce-scatter": the rank's share of the heads
            assert (r["rs_shape"] and r["rs_err"] < 5e-3 and r["rs_det_in_rank_order"]
                    and r["rs_out"]), r
    # Where the ranks share the query heads (2 ranks; 3 over window-interleaved-4's six).
    if world == 2 or case == "window-interleaved-4":
        assert all("rs_err" in r for r in results), results
    if case.endswith("window-contiguous-idle"):
        # Every window lies in rank 0's chunk: rank 1 launched nothing.
        assert [r["launched"] for r in sorted(results, key=lambda r: r["rank"])] == [True, False]
    # A replanned batch (shorter, a sequence emptied or dropped) against the single process's.
    assert all(not r["replan_nan"] and r["replan_err"] < 5e-3 for r in results), results
    if case.startswith("extend-"):
        # Extend runs on the extend kernel, each query row's run its key range, and the
        # rows past a replanned chunk see no key.
        assert all(r["path"] in ("triton", "hopper", None) and not r["sparse"] and r["pad_zero"]
                   for r in results), results
        return
    # Decode: runs of unequal lengths take sparse keys beside the kernel's window (contiguous
    # chunks all of them); without a window the kernel's window holds every run.
    took_sparse = any(r["sparse"] for r in results)
    if case.startswith("chunk"):
        assert took_sparse, results  # a chunk's start cuts runs anywhere: all sparse
    if "full" in case:
        assert not took_sparse, results
    if "window" in case and case.removesuffix("-fp8").endswith(
            ("interleaved-4", "contiguous", "contiguous-idle")):
        assert took_sparse, results


@pytest.mark.parametrize("layout, world",
                         [(parallel.Interleaved(1), 3), (parallel.Interleaved(4), 2),
                          (parallel.Contiguous(5), 3)])
def test_the_window_is_one_run_of_local_positions_on_every_rank(layout, world):
    """The layouts' arithmetic against a brute-force deal of positions: how many of [0, n)
    a rank holds, for every n, and that those are the rank's first local positions."""
    for n in range(0, 3 * world * 5 + 1):
        owners = [layout.owner(p, world) for p in range(n)]
        for rank in range(world):
            assert layout.local_len(n, rank, world) == owners.count(rank)
            assert layout.local_len(torch.tensor([n]), rank, world).item() == owners.count(rank)


@pytest.mark.gpu
@pytest.mark.parametrize("case, world", [("window-interleaved", 2), ("full-contiguous", 3),
                                         ("extend-window-interleaved-4", 3),
                                         ("extend-window-contiguous", 3),
                                         ("extend-window-interleaved-d64", 2),
                                         ("extend-full-contiguous-d64", 2),
                                         ("window-interleaved-4-fp8", 2),
                                         ("extend-window-interleaved-d64-fp8", 2),
                                         ("extend-full-contiguous-d64-e5m2", 2)])
def test_gpu_parallel_on_one_gpu_over_gloo(case, world):
    """The ranks' kernels on the GPU (every rank on the one device; gloo moves the partial
    states): the plan's device tensors, the decode kernel's window and sparse keys, the
    extend kernels' key ranges (heads of 64 on the Hopper path on sm_90), fp8 caches, the
    merge, against the single-process call there, and a replanned batch."""
    if DEVICE != "cuda":
        pytest.skip("CUDA only")
    results = _run(case, world, device="cuda")
    for r in results:
        assert not r["nan"] and r["err"] < 5e-3, r
        assert not r["replan_nan"] and r["replan_err"] < 5e-3, r
        if "rs_err" in r:
            assert (r["rs_shape"] and r["rs_err"] < 5e-3 and r["rs_det_in_rank_order"]
                    and r["rs_out"]), r
    if "-d64" in case and torch.cuda.get_device_capability() == (9, 0):
        assert any(r["path"] == "hopper" for r in results), results


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["window-interleaved", "window-contiguous-idle",
                                  "window-interleaved-4-fp8", "extend-window-interleaved-d64",
                                  "extend-full-contiguous-d64-fp8"])
def test_gpu_parallel_over_nccl(case):
    """Two ranks on two GPUs of one host over NCCL (skipped with fewer GPUs): the same checks
    as over gloo, both merges, decode and extend (the Hopper path on sm_90), fp8, an idle
    rank."""
    if DEVICE != "cuda" or torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    results = _run(case, 2, device="cuda", backend="nccl")
    for r in results:
        assert not r["nan"] and r["err"] < 5e-3, r
        assert r["det_err"] < 5e-3 and r["det_in_rank_order"], r
        assert not r["replan_nan"] and r["replan_err"] < 5e-3, r
        assert (r["rs_shape"] and r["rs_err"] < 5e-3 and r["rs_det_in_rank_order"]
                and r["rs_out"]), r
    if case == "window-contiguous-idle":
        assert [r["launched"] for r in sorted(results, key=lambda r: r["rank"])] == [True, False]


@pytest.mark.parametrize("layout, world",
                         [(parallel.Interleaved(1), 3), (parallel.Interleaved(4), 2),
                          (parallel.Interleaved(3), 3), (parallel.Contiguous(5), 3)])
def test_run_bounds_hold_for_every_full_window(layout, world):
    """run_bounds' fewest and most positions a rank holds in n consecutive ones, against every
    window of a brute-force deal (the plan's window width and sparse width rest on them)."""
    span = 4 * world * 5
    owners = [layout.owner(p, world) for p in range(span)]
    for n in range(1, 14):
        for rank in range(world):
            counts = [owners[a:a + n].count(rank) for a in range(span - n + 1)]
            fewest, most = parallel.run_bounds(layout, n, rank, world)
            assert fewest <= min(counts) and most >= max(counts)
            if isinstance(layout, parallel.Interleaved):  # exact over a period
                assert (fewest, most) == (min(counts), max(counts))


@cpu_only
def test_the_parallel_benchmark_runs_its_ranks(capsys):
    """swattn bench --parallel on 2 gloo ranks (tiny sizes): a row a rank and workload,
    kernel and merge times apart, each rank's share of one GPU's keys, and under a window a
    contiguous layout's idle rank launching nothing."""
    from swattn import cli
    status = cli.main(["bench", "--parallel", "--world", "2", "--device", "cpu",
                       "--context", "64", "--batch", "1", "--chunk", "4", "--window", "20",
                       "--page", "8", "--reps", "1", "--heads", "mistral", "--layout",
                       "contiguous"])
    out = capsys.readouterr()
    assert status == 0, out.err[-2000:]
    rows = [line.split("|")[1:-1] for line in out.out.splitlines()
            if line.startswith("| decode") or line.startswith("| extend")]
    assert len(rows) == 2 * 2 * 2  # kinds x (full, window) x ranks
    for kind, heads, window, rank, kernel, merge, run, keys, share, launched, sparse, _ in rows:
        assert float(kernel) >= 0 and float(merge) > 0 and float(run) > 0
    windowed = {(r[0].strip(), r[3].strip()): r for r in rows if r[2].strip() == "20"}
    # Positions 0..31 on rank 0, 32..63 on rank 1: the last query's window is rank 1's alone.
    assert windowed[("decode", "0")][9].strip() == "False"
    assert float(windowed[("decode", "1")][8]) == 1.0


def test_the_extend_plan_passes_on_its_cache_dtype_and_products(tmp_path, monkeypatch):
    """A one-rank group (gloo, in this process): an fp8 extend plan runs the key-range plan
    over an fp8 cache, and fp8_products reaches it (off sm_90 its ValueError names the
    Hopper path); an unknown merge is refused, and a reduce-scatter over heads the ranks
    cannot share (the group seen as 3 ranks); a rank with nothing to launch refuses bad
    options and tensors as a launching rank does."""
    import torch.distributed as dist
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        sizes = dict(group=dist.group.WORLD, layout=parallel.Interleaved(1), num_q_heads=2,
                     num_kv_heads=1, head_dim=16, page_size=4, kv_dtype=torch.float8_e5m2,
                     dtype=torch.float16, device=DEVICE)
        plan = parallel.plan_extend([5], [3], **sizes)
        assert plan.inner.kv_dtype == torch.float8_e5m2
        # (heads of 16: no Hopper path on any device)
        with pytest.raises(ValueError, match="fp8_products=True: the Hopper path cannot"):
            parallel.plan_extend([5], [3], fp8_products=True, **sizes)
        with pytest.raises(ValueError, match="merge must be one of"):
            parallel.plan_decode([5], merge="gather", **sizes)
        # Seen as rank 1 of 2 holding positions 40 on: a rank that launches nothing still
        # refuses what a launching rank's plan or run would.
        monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
        monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
        idle = dict(sizes, layout=parallel.Contiguous(40))
        plan = parallel.plan_decode([6], **idle)
        assert not plan.launched
        with pytest.raises(ValueError, match="kv_dtype must be"):
            parallel.plan_decode([6], **dict(idle, kv_dtype=torch.int8))
        with pytest.raises(ValueError, match="fp8_products needs an fp8 cache"):
            parallel.plan_extend([5], [1], fp8_products=True,
                                 **dict(idle, kv_dtype=torch.float16))
        with pytest.raises(TypeError, match="fp8_products must be a bool"):
            parallel.plan_extend([5], [1], fp8_products=1, **idle)
        with pytest.raises(ValueError, match="fp8_products=True: the Hopper path cannot"):
            parallel.plan_extend([5], [1], fp8_products=True, **idle)
        cache = torch.zeros(2, 4, 1, 16, dtype=torch.float16, device=DEVICE)
        q = torch.zeros(1, 2, 16, dtype=torch.float16, device=DEVICE)
        with pytest.raises(TypeError, match="k_cache must be torch.float8_e5m2"):
            plan.partial(q, cache, cache, torch.zeros(1, 1, dtype=torch.int32))
        # A scale a launching rank's plan refuses (3 values for one KV head).
        with pytest.raises(ValueError, match="k_scale"):
            plan.partial(q, cache.to(torch.float8_e5m2), cache.to(torch.float8_e5m2),
                         torch.zeros(1, 1, dtype=torch.int32),
                         k_scale=torch.ones(3, device=DEVICE))
        monkeypatch.setattr(dist, "get_world_size", lambda group=None: 3)
        with pytest.raises(ValueError, match="2 heads do not divide among 3"):
            parallel.plan_decode([5], merge="reduce-scatter", **sizes)
    finally:
        dist.destroy_process_group()


def test_parallel_plans_without_device(tmp_path, monkeypatch):
    """The parallel plans defaulted to device="cuda": on a machine without CUDA a raw
    AssertionError. Now None picks the CPU under the interpreter there, or a ValueError
    says what to pass (a one-rank gloo group, in this process)."""
    import torch.distributed as dist
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        sizes = {"group": dist.group.WORLD, "layout": parallel.Interleaved(1), "num_q_heads": 2,
                 "num_kv_heads": 1, "head_dim": 16, "page_size": 4, "dtype": torch.float16}
        assert parallel.plan_decode([5], **sizes).inner.device == torch.device("cpu")
        assert parallel.plan_extend([5], [3], **sizes).inner.device == torch.device("cpu")
        monkeypatch.delenv("TRITON_INTERPRET")
        for make in (lambda: parallel.plan_decode([5], **sizes),
                     lambda: parallel.plan_extend([5], [3], **sizes)):
            with pytest.raises(ValueError, match="set TRITON_INTERPRET=1 .* or pass device="):
                make()
    finally:
        dist.destroy_process_group()


def test_bad_layouts_are_refused():
    with pytest.raises(ValueError, match="Interleaved size"):
        parallel.check_layout(parallel.Interleaved(0))
    with pytest.raises(TypeError, match="layout must be"):
        parallel.check_layout("cyclic")
