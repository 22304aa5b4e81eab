"""attn_implementation="swattn" against transformers' eager attention: tiny models of every
sliding-window family, built from their real configs with random weights (no download,
``hf_models.py``), a window shorter than the prompts, a left-padded batch. Logits match; greedy
generations are identical. On the CPU (interpreter, fp32) and on the GPU (bf16)."""

import pytest
import torch

transformers = pytest.importorskip("transformers")
import hf_models  # noqa: E402
from hf_models import PROMPT  # noqa: E402

import swattn.integrations.transformers as swattn_hf  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GPU = DEVICE == "cuda"
DTYPE = torch.bfloat16 if GPU else torch.float32
# Logit tolerance: fp32 sums in another order; bf16 rounds every product's inputs.
TOL_FP32 = 1e-4
TOL = 3e-2 if GPU else TOL_FP32


# Every sliding-window family of transformers 5.23 (Gemma 4 three ways: plain, with
# KV-shared layers, with 512-wide heads in its full layers), Llama for full attention,
# Phi-MoE for a window the model builds a mask for but passes its layers no sliding_window,
# Llama 4 for chunked local attention (its cache keeps the last chunk: keys handed over
# from past position 0 once the generation passes it), and DeepSeek-V3.2 for sparse attention
# over its indexer's top-k keys (DeepSeek-V4 has its own test below).
FAMILIES = ("gpt-oss", "mistral", "gemma2", "gemma3", "gemma3n", "gemma4", "gemma4-kv-shared",
            "gemma4-wide-global", "cohere2", "olmo3", "exaone4", "mimo-v2-flash", "step3p7",
            "llama", "phimoe", "llama4", "deepseek-v3.2")


def _model(family, seed=0, dtype=DTYPE):
    why = hf_models.missing(family)
    if why:
        pytest.skip(why)
    return hf_models.build(family, seed, dtype, DEVICE)


def _run(model, impl, fn):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return fn()


def _generate(model, ids, mask, steps):
    return model.generate(ids, attention_mask=mask, max_new_tokens=steps, do_sample=False,
                          pad_token_id=0, output_logits=True, return_dict_in_generate=True)


def _check_tokens(got, want, steps, prompt=PROMPT):
    """fp32 (CPU): the tokens are identical. bf16 (GPU): identical up to a step where
    eager's own logits hold a near tie between its token and ours (bf16 rounds the two
    attentions differently; greedy then picks either), and from there on each run follows
    its own token."""
    new = want.sequences[:, prompt:]
    assert new.shape[1] == steps
    if not GPU:
        assert torch.equal(got, want.sequences)
        return
    for row in range(got.shape[0]):
        differ = (got[row, prompt:] != new[row]).nonzero()
        if len(differ):
            step = int(differ[0])
            logits = want.logits[step][row].float()
            gap = (logits[new[row, step]] - logits[got[row, prompt + step]]).item()
            assert 0 <= gap <= TOL * logits.abs().max().item(), (row, step, gap)


def _forwards_match(model, ids, mask, tol, record_property, **padded):
    """Logits against eager's: of the padded batch over its valid tokens (``padded``: more
    arguments of that forward), then of the batch without padding."""
    want = _run(model, "eager", lambda: model(ids, attention_mask=mask, **padded).logits)
    got = _run(model, "swattn", lambda: model(ids, attention_mask=mask, **padded).logits)
    valid = mask.bool()
    diff = (got - want)[valid].abs().max().item()
    record_property("max_abs_logit_diff", diff)
    assert diff / want[valid].abs().max().item() < tol, diff
    want = _run(model, "eager", lambda: model(ids).logits)
    got = _run(model, "swattn", lambda: model(ids).logits)
    assert ((got - want).abs().max() / want.abs().max()).item() < tol


def _generation_matches(model, ids, mask, steps, tol, record_property, prompt=PROMPT,
                        fp32=not GPU):
    """Greedy generation from the padded batch against eager's: the same tokens (up to
    eager's near ties in bf16), and in fp32 the same logits at every step."""
    want = _run(model, "eager", lambda: _generate(model, ids, mask, steps))
    got = _run(model, "swattn", lambda: _generate(model, ids, mask, steps))
    record_property("tokens_equal", torch.equal(got.sequences, want.sequences))
    # Greedy tokens that never change would hide a difference; the logits below would not.
    assert len(set(want.sequences[:, prompt:].flatten().tolist())) >= 3, "degenerate generation"
    _check_tokens(got.sequences, want, steps, prompt)
    if fp32:
        for step, (a, b) in enumerate(zip(got.logits, want.logits)):
            assert ((a - b).abs().max() / b.abs().max()).item() < tol, step


@pytest.mark.parametrize("family", FAMILIES)
def test_family_matches_eager(family, record_property):
    """The family's own eager attention is the oracle: logits of a left-padded batch (every
    prompt longer than the window) and of the same batch without padding (the path that
    builds its layout on the device), then greedy generation from the padded batch: the same
    tokens, and in fp32 the same logits at every step. Gemma 4 with KV-shared layers raised
    ``IndexError: too many indices for tensor of dimension 2`` on transformers 5.23, which
    slices every mask as 4D before its shared layers."""
    # Phi-MoE's router parts bf16 ties between experts (a jump in the logits that no
    # attention error causes): its check, of the window read from the mask, runs in fp32.
    fp32 = family == "phimoe" or not GPU
    model = _model(family, dtype=torch.float32 if fp32 else DTYPE)
    tol = TOL_FP32 if fp32 else TOL
    ids, mask = hf_models.padded_batch(device=DEVICE)
    _forwards_match(model, ids, mask, tol, record_property)
    # Decode steps past the window: the prompt already fills it, so each step slides it.
    _generation_matches(model, ids, mask, 16 if GPU else 6, tol, record_property, fp32=fp32)


@pytest.mark.parametrize("length", [5, 11], ids=["prompt-shorter-than-an-hca-entry",
                                                 "prompt-longer-than-an-hca-entry"])
def test_deepseek_v4_matches_eager(length, record_property):
    """DeepSeek-V4 (a window layer, a CSA layer of rate 4 and top 2, an HCA layer of rate 8,
    a window of 5) against its eager attention: logits of a left-padded batch (positions from
    each row's first token, as generate gives them) and of the batch without padding, then
    greedy steps from the padded batch that close entries of both compressed layers (a
    prompt of 5 tokens opens no HCA entry; 11 open one): the same tokens, and in fp32 the
    same logits at every step. Entries are causal by position: CSA's through the indexer's
    picks, HCA's by ``e < (p + 1) // 8`` in prefill and every entry in decode."""
    model = _model("deepseek-v4")
    ids, mask = hf_models.padded_batch(device=DEVICE, length=length)
    _forwards_match(model, ids, mask, TOL, record_property,
                    position_ids=hf_models.positions(mask))
    _generation_matches(model, ids, mask, 9, TOL, record_property, prompt=length)


def _second_sources(monkeypatch):
    """The ``second=`` of every extend call swattn's attention function makes (None where
    it passes none)."""
    seen = []
    extend = swattn_hf.extend_attention

    def spy(*args, **kwargs):
        seen.append(kwargs.get("second"))
        return extend(*args, **kwargs)

    monkeypatch.setattr(swattn_hf, "extend_attention", spy)
    return seen


def test_deepseek_layers_run_a_second_key_source(monkeypatch):
    """The compressed entries (V4) and the selected keys (V3.2) reach the kernel as its
    second key source, not as a dense mask: per V4 forward, the window layer's call has
    none, the CSA layer's has index lists of at most 2 entries at rate 4 among all the
    entries closed, the HCA layer's rate 8 without indices in prefill and rate 1 (every
    entry) in decode; every V3.2 call has the top-4 lists over all the keys, no window."""
    seen = _second_sources(monkeypatch)
    model = _model("deepseek-v4")
    ids, mask = hf_models.padded_batch(device=DEVICE)
    _run(model, "swattn", lambda: _generate(model, ids, mask, 6))
    prefill, *decode = [seen[i:i + 3] for i in range(0, len(seen), 3)]
    assert len(decode) == 5 and all(layers[0] is None for layers in [prefill] + decode)
    for (csa, hca), closed in zip([s[1:] for s in [prefill] + decode], range(11, 17)):
        assert csa.rate == 4 and csa.indices.shape[1] == 2
        assert int(csa.entries[0]) == closed // 4 and int(csa.indices.max()) < closed // 4
        assert hca.indices is None and int(hca.entries[0]) == closed // 8
    assert prefill[2].rate == 8 and {layers[2].rate for layers in decode} == {1}
    seen.clear()
    model = _model("deepseek-v3.2")
    _run(model, "swattn", lambda: _generate(model, ids, mask, 3))
    assert len(seen) == 2 * 3
    for second in seen:
        assert second.indices.shape[1] == 4 and not second.window and second.rate == 1
    assert all(int(second.entries.max()) > 4 for second in seen)


def test_gemma4_kv_shared_layers_take_the_last_queries(monkeypatch):
    """Where transformers keeps only the last queries for Gemma 4's KV-shared layers (5.23:
    generate's prefill slices every mask as 4D), those layers get one query over the
    prompt's keys and a mask cut the same way, and answer as eager does."""
    model = _model("gemma4-kv-shared")
    shapes = []
    attention = swattn_hf.swattn_attention

    def spy(module, query, key, value, attention_mask, **kwargs):
        shapes.append((module.layer_idx, query.shape[2], key.shape[2]))
        return attention(module, query, key, value, attention_mask, **kwargs)

    monkeypatch.setitem(transformers.AttentionInterface._global_mapping, "swattn", spy)
    ids, mask = hf_models.padded_batch(device=DEVICE)
    want = _run(model, "eager", lambda: _generate(model, ids, mask, 3))
    got = _run(model, "swattn", lambda: _generate(model, ids, mask, 3)).sequences
    _check_tokens(got, want, 3)
    shared = {i for i, layer in enumerate(model.model.layers) if layer.self_attn.is_kv_shared_layer}
    prefill = [s for s in shapes if s[2] == PROMPT]
    sliced = hasattr(model.model, "_maybe_slice_kv_shared_inputs")
    assert {q for i, q, _ in prefill if i in shared} == ({1} if sliced else {PROMPT})
    assert {q for i, q, _ in prefill if i not in shared} == {PROMPT}


def _static_steps(model, ids):
    """Logits of a prefill and four single-token steps on a static cache."""
    cache = transformers.StaticCache(config=model.config, max_cache_len=32)
    logits = [model(ids, use_cache=True, past_key_values=cache).logits[:, -1]]
    for t in range(4):
        logits.append(model(ids[:, t:t + 1], use_cache=True, past_key_values=cache).logits[:, -1])
    return torch.cat(logits)


def test_static_caches():
    """A static sliding-window cache hands over keys that end at the queries: served. A
    static full cache hands over its whole buffer: refused, not answered wrongly."""
    ids = hf_models.padded_batch(device=DEVICE)[0][:1]
    model = _model("mistral")
    want = _run(model, "eager", lambda: _static_steps(model, ids))
    got = _run(model, "swattn", lambda: _static_steps(model, ids))
    assert ((got - want).abs().max() / want.abs().max()).item() < TOL
    model = _model("llama")
    with pytest.raises(NotImplementedError, match="static cache"):
        _run(model, "swattn", lambda: _static_steps(model, ids))


def test_refuses_what_it_cannot_serve():
    model = _model("mistral")
    ids, _ = hf_models.padded_batch(device=DEVICE)
    holes = torch.ones_like(ids)
    holes[0, 4] = 0
    with pytest.raises(ValueError, match="padding inside"):
        _run(model, "swattn", lambda: model(ids, attention_mask=holes))
    assert swattn_hf.tested_version()
    assert not swattn_hf.tested_version("4.57.0")


def _generate_batch(model, prompts, new, monkeypatch):
    """transformers' continuous batching on the suite's device; its paged cache sizes
    itself from the GPU's free memory, so on the CPU the test gives it 256 MB."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig
    from transformers.generation.continuous_batching import cache as cb_cache
    if not GPU:
        monkeypatch.setattr(cb_cache.PagedAttentionMemoryHandler, "get_available_memory",
                            lambda self: 1 << 28)
    config = transformers.GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=-1,
                                           pad_token_id=0)
    cb = ContinuousBatchingConfig(block_size=16, num_blocks=64, max_batch_tokens=64)
    with torch.no_grad():
        try:
            out = model.generate_batch(inputs=prompts, generation_config=config,
                                       continuous_batching_config=cb, progress_bar=False)
        except ValueError as exc:
            if "not supported for continuous batching" in str(exc):
                # transformers 5.24 takes only its own implementations there (5.17 takes ours)
                pytest.skip(f"transformers {transformers.__version__}: {exc}")
            raise
    return [out[f"req_{i}"].generated_tokens for i in range(len(prompts))]


@pytest.mark.parametrize("family", ["gpt-oss", "mistral"])
def test_continuous_batching_matches_eager(family, monkeypatch):
    """generate_batch (paged|swattn on transformers' paged cache) gives each request the
    tokens eager generation gives it alone (fp32; bf16 up to eager's near ties)."""
    model = _model(family)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 101, (n,), generator=g).tolist() for n in (11, 4, 19)]
    model.set_attn_implementation("swattn")
    got = _generate_batch(model, prompts, 8, monkeypatch)
    model.set_attn_implementation("eager")
    for prompt, tokens in zip(prompts, got):
        ids = torch.tensor([prompt], device=DEVICE)
        with torch.no_grad():
            want = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                                  min_new_tokens=8, do_sample=False, pad_token_id=0)
        want = want[0, len(prompt):].tolist()
        if not GPU:
            assert tokens == want
        else:
            assert tokens[:1] == want[:1]  # bf16: the first token; later ones may part at ties
