"""attn_implementation="swattn" against transformers' eager attention: tiny models built
from real configs with random weights (no download), a window shorter than the sequence,
a left-padded batch. Logits match; greedy generations of 16 tokens are identical. On the CPU
(interpreter, fp32) and on the GPU (bf16)."""

import pytest
import torch

transformers = pytest.importorskip("transformers")
import swattn.integrations.transformers as swattn_hf  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GPU = DEVICE == "cuda"
DTYPE = torch.bfloat16 if GPU else torch.float32
# Logit tolerance: fp32 sums in another order; bf16 rounds every product's inputs.
TOL_FP32 = 1e-4
TOL = 3e-2 if GPU else TOL_FP32
WINDOW = 5
PROMPT = 11


def _config(family):
    small = dict(vocab_size=101, hidden_size=64, intermediate_size=64, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, max_position_embeddings=128)
    if family == "gpt-oss":
        return transformers.GptOssConfig(
            **small, num_hidden_layers=2, sliding_window=WINDOW, num_local_experts=4,
            num_experts_per_tok=2, layer_types=["sliding_attention", "full_attention"],
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    if family == "mistral":
        return transformers.MistralConfig(**small, num_hidden_layers=2, sliding_window=WINDOW)
    if family == "gemma2":
        return transformers.Gemma2Config(
            **small, num_hidden_layers=2, sliding_window=WINDOW, attn_logit_softcapping=20.0,
            final_logit_softcapping=30.0, query_pre_attn_scalar=24,
            layer_types=["sliding_attention", "full_attention"])
    if family == "gemma3":
        return transformers.Gemma3TextConfig(
            **small, num_hidden_layers=3, sliding_window=WINDOW, query_pre_attn_scalar=24,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"])
    if family == "llama":
        return transformers.LlamaConfig(**small, num_hidden_layers=2)
    if family == "phimoe":  # builds a window mask, passes its layers no sliding_window
        return transformers.PhimoeConfig(**small, num_hidden_layers=2, sliding_window=WINDOW,
                                         num_local_experts=4, num_experts_per_tok=2)
    raise ValueError(family)


FAMILIES = ("gpt-oss", "mistral", "gemma2", "gemma3", "llama")


def _model(family, seed=0, dtype=DTYPE):
    config = _config(family)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=dtype).eval()
    with torch.no_grad():  # larger weights than the default init, so tokens vary
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 0.08)
            elif "sinks" in name:
                p.normal_(0, 1)
    return model.to(DEVICE)


def _batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 101, (3, PROMPT), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    mask[2, :1] = 0
    return ids.to(DEVICE), mask.to(DEVICE)


def _run(model, impl, fn):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return fn()


@pytest.mark.parametrize("family", FAMILIES + ("phimoe",))
def test_logits_match_eager(family):
    # Phi-MoE's router parts bf16 ties between experts (a jump in the logits that no
    # attention error causes): its check, of the window read from the mask, runs in fp32.
    dtype, tol = (torch.float32, TOL_FP32) if family == "phimoe" else (DTYPE, TOL)
    model = _model(family, dtype=dtype)
    ids, mask = _batch()
    want = _run(model, "eager", lambda: model(ids, attention_mask=mask).logits)
    got = _run(model, "swattn", lambda: model(ids, attention_mask=mask).logits)
    valid = mask.bool()
    err = ((got - want)[valid].abs().max() / want[valid].abs().max()).item()
    assert err < tol, err
    # Without padding: the path that builds its layout on the device.
    want = _run(model, "eager", lambda: model(ids).logits)
    got = _run(model, "swattn", lambda: model(ids).logits)
    assert ((got - want).abs().max() / want.abs().max()).item() < tol


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generation_is_identical(family):
    """fp32 (CPU): the 10 tokens are identical. bf16 (GPU): 16 tokens identical up to a step
    where eager's own logits hold a near tie between its token and ours (bf16 rounds the
    two attentions differently; greedy then picks either), and from there on each run
    follows its own token. The prompt is past the window from the start."""
    model = _model(family)
    ids, mask = _batch()
    steps = 16 if GPU else 10

    def generate():
        return model.generate(ids, attention_mask=mask, max_new_tokens=steps, do_sample=False,
                              pad_token_id=0, output_logits=True, return_dict_in_generate=True)

    want = _run(model, "eager", generate)
    got = _run(model, "swattn", generate).sequences
    new = want.sequences[:, PROMPT:]
    assert new.shape[1] == steps
    assert len(set(new.flatten().tolist())) >= 4, "degenerate generation: the test would not see a difference"
    if not GPU:
        assert torch.equal(got, want.sequences)
        return
    for row in range(got.shape[0]):
        differ = (got[row, PROMPT:] != new[row]).nonzero()
        if len(differ):
            step = int(differ[0])
            logits = want.logits[step][row].float()
            gap = (logits[new[row, step]] - logits[got[row, PROMPT + step]]).item()
            assert 0 <= gap <= TOL * logits.abs().max().item(), (row, step, gap)


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
    ids = _batch()[0][:1]
    model = _model("mistral")
    want = _run(model, "eager", lambda: _static_steps(model, ids))
    got = _run(model, "swattn", lambda: _static_steps(model, ids))
    assert ((got - want).abs().max() / want.abs().max()).item() < TOL
    model = _model("llama")
    with pytest.raises(NotImplementedError, match="static cache"):
        _run(model, "swattn", lambda: _static_steps(model, ids))


def test_refuses_what_it_cannot_serve():
    model = _model("mistral")
    ids, _ = _batch()
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
