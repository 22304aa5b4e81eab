"""``swattn demo`` end to end on a few requests: the engine's tokens equal transformers'
eager greedy generation, prefix-cache hits happen, window pages are freed, and the window
layers walk fewer key tiles than an unbounded kernel."""

import argparse

import pytest
import torch

pytest.importorskip("transformers")
from conftest import DEVICE  # noqa: E402


def test_demo_matches_eager(capsys):
    # One request: the demo's whole path against eager generation, token for token (several
    # requests batched against eager: test_transformers' continuous-batching tests).
    from swattn.demo import main
    args = argparse.Namespace(size="cpu", requests=1, seed=3, no_check=False, no_baselines=True)
    assert main.main(args) == 0
    text = capsys.readouterr().out
    assert "1 of 1 requests identical" in text and "tokens = eager (float32)" in text


def _engine_run(count, max_new, **engine_kw):
    """``count`` requests of ``max_new`` tokens through an engine on a 2-layer cpu-size
    model: (engine, requests, {rid: tokens})."""
    from swattn.demo import SIZES
    from swattn.demo.engine import Engine
    from swattn.demo.main import ENGINE_IMPL, ENGINES, build_model, make_requests, register
    size = dict(SIZES["cpu"], layers=2)
    register()
    device = torch.device(DEVICE)
    model = build_model(size, 0, device, torch.float32)
    requests = make_requests(size, count, 1)
    for r in requests:
        r.max_new = max_new
    engine = Engine(model, page_size=size["page"], num_pages=64, token_budget=32,
                    device=device, dtype=torch.float32, **engine_kw)
    model.set_attn_implementation(ENGINE_IMPL)
    ENGINES.append(engine)
    try:
        return engine, requests, engine.run(requests)
    finally:
        ENGINES.pop()


def test_engine_pages_and_prefix_cache():
    # 8 new tokens a request are plenty: the window is 8 tokens (pages of 4), so window
    # pages are freed as the requests go.
    engine, _requests, done = _engine_run(2, 8)
    assert sorted(done) == [0, 1] and all(len(t) == 8 for t in done.values())
    s = engine.stats
    # Request 1 shares request 0's system prompt: its full pages are cached, but request 0's
    # window passed the boundary before anyone asked, so the window cut the hit short.
    cache = engine.memory.cache.stats
    assert cache.lookups == 2 and cache.cut_short == 1
    assert s["window_pages_dropped"] > 0
    pools = engine.memory.pools
    assert pools["window"].peak < pools["full"].peak
    assert max(engine.pages_over_time["window"]) == pools["window"].peak
    assert s["tiles"] < s["tiles_unbounded"]
    # Every page is back: the sequences released theirs; the prefix cache holds the rest.
    held = {kind: pool.held for kind, pool in pools.items()}
    cached = {kind: len(entries) for kind, entries in engine.memory.cache.entries.items()}
    assert held == cached


def test_demo_schedule_holds_under_half_the_window_unaware_pages():
    """The demo's requests and schedule at its cpu size, pages only (no model): the window
    layers' peak stays under half of a window-unaware cache's (the full layers' peak), and
    the system prompt is served from the cache once a lookup has marked its boundary."""
    from swattn.demo import SIZES
    from swattn.demo.engine import KINDS, Engine, Sequence
    from swattn.demo.main import make_requests
    from swattn.memory import KVMemory, LayerGroup, Schedule
    size = SIZES["cpu"]
    memory = KVMemory([LayerGroup(kind, size["page"], 256, size["window"] - 1 if kind ==
                                  "window" else None) for kind in KINDS],
                      Schedule(size["budget"]))
    scheduler = type("Scheduler", (), {"token_budget": size["budget"]})()
    pending = sorted(make_requests(size, size["requests"], 1), key=lambda r: r.arrival)
    running, peaks, step = [], {kind: 0 for kind in KINDS}, 0
    while pending or running:
        while pending and pending[0].arrival <= step:
            seq = Sequence(pending.pop(0), [])
            seq.computed = memory.add(seq.req.rid, seq.req.prompt).tokens
            running.append(seq)
        batch = Engine.schedule(scheduler, running)
        memory.reserve_batch([(seq.req.rid, n, 0) for seq, n in batch])
        peaks = {kind: max(peaks[kind], memory.held(kind)) for kind in KINDS}
        for seq, n in batch:
            memory.commit(seq.req.rid)
            seq.computed += n
            if not seq.prefilling:
                seq.generated.append(0)
            if len(seq.generated) >= seq.req.max_new:
                memory.release(seq.req.rid)
                running.remove(seq)
        step += 1
    assert peaks["window"] < peaks["full"] / 2
    assert memory.cache.stats.hits >= 2 and memory.cache.stats.cut_short >= 1


def test_engine_keeps_the_full_layers_cache_in_fp8():
    """``--full-kv fp8-e4m3``: the full layers' cache is fp8 (a plan run checks its cache's
    dtype against the plan's), the window layers' keeps the model's dtype, and the run fills
    both with finite rows; the report gives the cache's bytes against one all in the model's
    dtype."""
    from swattn.demo.report import summary
    e4m3 = torch.float8_e4m3fn
    engine, requests, done = _engine_run(2, 6, full_kv_dtype=e4m3)
    assert sorted(done) == [0, 1] and all(len(t) == 6 for t in done.values())
    kinds = {kind: engine.caches[i][0].dtype for i, kind in enumerate(engine.layer_kinds)}
    assert kinds == {"window": torch.float32, "full": e4m3}
    for k_cache, _ in engine.caches:
        written = ~k_cache.float().isnan()
        assert written.any() and k_cache.float()[written].isfinite().all()
    text = summary(engine, requests, {"engine": engine.stats}, [], 30)
    assert "KV cache" in text and "float8_e4m3fn" in text
