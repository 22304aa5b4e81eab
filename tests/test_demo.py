"""``swattn demo`` end to end on a few requests: the engine's tokens equal transformers'
eager greedy generation, prefix-cache hits happen, window pages are freed, and the window
layers walk fewer key tiles than an unbounded kernel."""

import argparse

import pytest
import torch

pytest.importorskip("transformers")
from conftest import DEVICE  # noqa: E402


def test_demo_matches_eager(capsys):
    from swattn.demo import main
    args = argparse.Namespace(size="cpu", requests=2, seed=3, no_check=False, no_baselines=True)
    assert main.main(args) == 0
    text = capsys.readouterr().out
    assert "2 of 2 requests identical" in text and "tokens = eager (float32)" in text


def test_engine_pages_and_prefix_cache():
    from swattn.demo import SIZES
    from swattn.demo.engine import Engine
    from swattn.demo.main import ENGINE_IMPL, _ENGINES, _register, build_model, make_requests
    size = dict(SIZES["cpu"], layers=2)
    _register()
    device = torch.device(DEVICE)
    model = build_model(size, 0, device, torch.float32)
    requests = make_requests(size, 3, 1)
    for r in requests:
        r.max_new = 24
    engine = Engine(model, page_size=size["page"], num_pages=64, token_budget=32,
                    device=device, dtype=torch.float32)
    model.set_attn_implementation(ENGINE_IMPL)
    _ENGINES.append(engine)
    try:
        done = engine.run(requests)
    finally:
        _ENGINES.pop()
    assert sorted(done) == [0, 1, 2] and all(len(t) == 24 for t in done.values())
    s = engine.stats
    assert s["cached_tokens"] > 0  # request 1 shares request 0's system prompt
    assert s["window_pages_dropped"] > 0
    assert engine.pools["window"].peak <= engine.pools["full"].peak
    assert s["tiles"] < s["tiles_unbounded"]
    # Every page is back: the sequences released theirs; the prefix cache holds the rest.
    held = {kind: sum(1 for r in pool.refs if r) for kind, pool in engine.pools.items()}
    cached = {kind: sum(1 for e in engine.prefix.entries.values() if e[kind] is not None)
              for kind in engine.pools}
    assert held == cached
