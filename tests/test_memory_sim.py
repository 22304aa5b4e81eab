"""``swattn memory-sim``: the figures predicted from the arithmetic first (docs/memory.md),
then simulated; no peer policy ever holds fewer pages than ours; ours stays within the
ring's width."""

import json
import math

import pytest

from swattn import cli
from swattn.memory.models import MODELS
from swattn.memory.sim import GB, Trace, largest_batch, needed_bytes, run_model, simulate

# Gemma 3 27B: 52 window layers (L = 1023) and 10 full ones, 16 KV heads of 128 in bf16.
LAYER = 2 * 16 * 128 * 2
WINDOW, FULL, PAGE = 52 * LAYER, 10 * LAYER, 16
PROMPT, OUTPUT, CHUNK = 32512, 256, 8192


def gemma_prediction(requests):
    """Bytes each policy needs for ``requests`` 32k-token requests, by hand.

    Full layers: every request ends at 32768 tokens, 2048 pages. Window layers, ours: a
    prefilled request waits holding the pages of [32512 - 1023, 32512): pages 1968..2031,
    64; the one prefilling a middle chunk of 8192 at c = 8192k holds pages from
    (8192k - 1023) // 16 = 512k - 64 to 512(k + 1): 576; decoding, 65 at most. vLLM frees
    one step late: the prefilling request still holds the chunk before (1088 pages). SGLang
    must provision its full pool for every request's 32768 tokens and an SWA pool of 0.8 of
    that."""
    full_pages = requests * 2048
    ours = ((requests - 1) * 64 + 576) * PAGE * WINDOW + full_pages * PAGE * FULL
    sglang = requests * 32768 * (FULL + 0.8 * WINDOW)
    unaware = full_pages * PAGE * (WINDOW + FULL)
    return {"ours": ours, "sglang": sglang, "unaware": unaware}


def test_gemma_peak_bytes_are_the_predicted_ones():
    model = MODELS["gemma-3-27b"]
    rows = simulate(model, Trace(8))
    want = gemma_prediction(8)
    for name, value in want.items():
        assert needed_bytes(model, name, rows[name]) == pytest.approx(value, rel=1e-12), name
    assert rows["vllm"]["peaks"]["window"] == 7 * 64 + 1088
    assert rows["ours"]["seq_pages"] == 576


def test_gemma_largest_batch_is_at_least_four_times_a_window_unaware_cache():
    """Predicted: ours fits 24 (((B - 1) * 64 + 576) * 16 * 425984 + B * 32768 * 81920 <=
    80e9), a window-unaware cache 4 (B * 32768 * 507904), SGLang 5 (its full pool: 80e9 /
    (81920 + 0.8 * 425984) tokens over 32768 a request), vLLM 23."""
    model, capacity = MODELS["gemma-3-27b"], 80 * GB
    predicted = {name: max(b for b in range(1, 200)
                           if gemma_prediction(b)[name] <= capacity)
                 for name in ("ours", "sglang", "unaware")}
    assert predicted == {"ours": 24, "sglang": 5, "unaware": 4}
    for name, batch in predicted.items():
        assert largest_batch(model, name, Trace(8), capacity) == batch, name
    assert largest_batch(model, "vllm", Trace(8), capacity) == 23
    assert predicted["ours"] >= 4 * predicted["unaware"]


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("trace", [Trace(3, 3000, 40, 512), Trace(2, 1000, 300, 96),
                                   Trace(4, 700, 20, 700)],
                         ids=["chunk512", "long-decode", "one-chunk"])
def test_no_peer_holds_fewer_pages_than_ours(model, trace):
    shape = MODELS[model]
    rows = simulate(shape, trace)
    assert all(row["below_ours"] == 0 for row in rows.values())
    for name in ("vllm", "sglang", "unaware"):
        for group, peak in rows[name]["peaks"].items():
            assert peak >= rows["ours"]["peaks"][group], (name, group)
    # A sequence's sliding pages stay within ceil((R + 1 + C) / P) + 1 at every step.
    reach = min(r for g in shape.groups if g.slides
                for r in (g.window_left, (g.attention_chunk or math.inf) - 1) if r is not None)
    width = -(-(reach + 1 + trace.chunk) // shape.page_size) + 1
    assert 0 < rows["ours"]["seq_pages"] <= width


def test_run_model_reports_every_policy():
    result = run_model(MODELS["gpt-oss-120b"], Trace(2, 2000, 16, 512), 2 * GB)
    assert set(result["policies"]) == {"ours", "vllm", "sglang", "unaware"}
    batches = {name: row["largest_batch"] for name, row in result["policies"].items()}
    assert batches["ours"] >= batches["vllm"] >= batches["unaware"] > 0


def test_cli_prints_json(capsys):
    status = cli.main(["memory-sim", "--model", "llama-4-scout", "--requests", "2", "--prompt",
                       "9000", "--output", "8", "--chunk", "4096", "--capacity-gb", "1", "--json"])
    assert status == 0
    (result,) = json.loads(capsys.readouterr().out)
    assert result["model"] == "llama-4-scout" and result["trace"]["prompt"] == 9000
    assert result["policies"]["ours"]["largest_batch"] >= result["policies"]["unaware"][
        "largest_batch"]
