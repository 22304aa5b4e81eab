"""Tiny random-weight models of transformers' sliding-window families, built from their real
config and model classes (no download): hidden size 64, 2 to 4 layers, a window of 5 under
prompts of 11 tokens. Shared by the transformers tests; run as a script, it prints each
family's comparison with eager (``python tests/hf_models.py``)."""

import os

import torch

if __name__ == "__main__" and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # as tests/conftest.py, before swattn loads

import transformers  # noqa: E402

WINDOW = 5
PROMPT = 11
VOCAB = 101
SMALL = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=128)
SLIDING, FULL = "sliding_attention", "full_attention"


def _gemma4(**extra):
    # Gemma 4's E2B/E4B style: per-layer inputs, the last layers reusing earlier layers' keys
    # (num_kv_shared_layers), 4x wider heads in the full layers (512 against 128 in the
    # released ones; global_head_dim sets them).
    return transformers.Gemma4TextConfig(
        **SMALL, num_hidden_layers=4, sliding_window=WINDOW,
        layer_types=[SLIDING, FULL, SLIDING, FULL], vocab_size_per_layer_input=VOCAB,
        hidden_size_per_layer_input=8, final_logit_softcapping=30.0, **extra)


def _step3p7():
    text = dict(SMALL, num_hidden_layers=2, sliding_window=WINDOW, layer_types=[SLIDING, FULL],
                mlp_layer_types=["dense", "sparse"], n_routed_experts=4, num_experts_per_tok=2,
                moe_intermediate_size=32, share_expert_dim=32, pad_token_id=0)
    vision = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2)
    return transformers.Step3p7Config(text_config=text, vision_config=vision)


# family -> (config factory, the transformers class that must exist for it)
CONFIGS = {
    "gpt-oss": (lambda: transformers.GptOssConfig(
        **SMALL, num_hidden_layers=2, sliding_window=WINDOW, num_local_experts=4,
        num_experts_per_tok=2, layer_types=[SLIDING, FULL],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}), "GptOssConfig"),
    "mistral": (lambda: transformers.MistralConfig(
        **SMALL, num_hidden_layers=2, sliding_window=WINDOW), "MistralConfig"),
    "gemma2": (lambda: transformers.Gemma2Config(
        **SMALL, num_hidden_layers=2, sliding_window=WINDOW, attn_logit_softcapping=20.0,
        final_logit_softcapping=30.0, query_pre_attn_scalar=24,
        layer_types=[SLIDING, FULL]), "Gemma2Config"),
    "gemma3": (lambda: transformers.Gemma3TextConfig(
        **SMALL, num_hidden_layers=3, sliding_window=WINDOW, query_pre_attn_scalar=24,
        layer_types=[SLIDING, SLIDING, FULL]), "Gemma3TextConfig"),
    "gemma3n": (lambda: transformers.Gemma3nTextConfig(
        **SMALL, num_hidden_layers=4, sliding_window=WINDOW,
        layer_types=[SLIDING, FULL, SLIDING, FULL], num_kv_shared_layers=2,
        vocab_size_per_layer_input=VOCAB, hidden_size_per_layer_input=8, altup_num_inputs=2,
        laurel_rank=4, activation_sparsity_pattern=[0.0] * 4), "Gemma3nTextConfig"),
    "gemma4": (lambda: _gemma4(global_head_dim=32), "Gemma4TextConfig"),
    "gemma4-kv-shared": (lambda: _gemma4(global_head_dim=32, num_kv_shared_layers=2),
                         "Gemma4TextConfig"),
    "gemma4-wide-global": (lambda: _gemma4(global_head_dim=512), "Gemma4TextConfig"),
    "cohere2": (lambda: transformers.Cohere2Config(
        **{k: v for k, v in SMALL.items() if k != "head_dim"}, num_hidden_layers=2,
        sliding_window=WINDOW, layer_types=[SLIDING, FULL]), "Cohere2Config"),
    "olmo3": (lambda: transformers.Olmo3Config(
        **{k: v for k, v in SMALL.items() if k != "head_dim"}, num_hidden_layers=2,
        sliding_window=WINDOW, layer_types=[SLIDING, FULL]), "Olmo3Config"),
    "exaone4": (lambda: transformers.Exaone4Config(
        **SMALL, num_hidden_layers=2, sliding_window=WINDOW, layer_types=[SLIDING, FULL]),
        "Exaone4Config"),
    "mimo-v2-flash": (lambda: transformers.MiMoV2FlashConfig(
        **dict(SMALL, num_key_value_heads=1), v_head_dim=8, num_hidden_layers=2,
        sliding_window=WINDOW, layer_types=[FULL, SLIDING], mlp_layer_types=["dense", "sparse"],
        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
        "MiMoV2FlashConfig"),
    "step3p7": (_step3p7, "Step3p7Config"),
    "llama": (lambda: transformers.LlamaConfig(**SMALL, num_hidden_layers=2), "LlamaConfig"),
    "phimoe": (lambda: transformers.PhimoeConfig(  # a window mask, no sliding_window to its layers
        **SMALL, num_hidden_layers=2, sliding_window=WINDOW, num_local_experts=4,
        num_experts_per_tok=2), "PhimoeConfig"),
}


def missing(family):
    """Why ``family`` cannot be built with the installed transformers (None: it can)."""
    name = CONFIGS[family][1]
    if not hasattr(transformers, name):
        return f"transformers {transformers.__version__} has no {name}"
    return None


def _model_class(config):
    if config.model_type == "step3p7":  # a vision-language model; its text runs alone
        return transformers.Step3p7ForConditionalGeneration
    return transformers.AutoModelForCausalLM._model_mapping[type(config)]


def build(family, seed=0, dtype=torch.float32, device="cpu"):
    """The family's tiny model in eval mode, seeded, with weights larger than the default
    init (so greedy tokens vary) and sinks of order one."""
    config = CONFIGS[family][0]()
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = _model_class(config)._from_config(config, torch_dtype=dtype).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 0.08)
            elif "sinks" in name:
                p.normal_(0, 1)
    return model.to(device)


def padded_batch(seed=1, device="cpu", length=PROMPT):
    """Three prompts of up to ``length`` tokens (11: every prompt longer than the window), two
    left-padded (by 3 and 1)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (3, length), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    mask[2, :1] = 0
    return ids.to(device), mask.to(device)


def positions(mask):
    """The position_ids generate gives a left-padded batch: counted from each row's first
    token (DeepSeek-V4's compressed entries are causal by position)."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


CSA, HCA = "compressed_sparse_attention", "heavily_compressed_attention"
# DeepSeek-V3.2: every layer attends its indexer's top 4 keys (fewer than the prompt's 11: sparse).
# DeepSeek-V4: a window layer, a CSA layer (an entry every 4 tokens, the indexer's top 2) and an
# HCA layer (an entry every 8 tokens), over a window of 5: a generation crosses several entries.
CONFIGS.update({
    "deepseek-v3.2": (lambda: transformers.DeepseekV32Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=64, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4,
        n_group=1, topk_group=1, num_experts_per_tok=2, kv_lora_rank=16, q_lora_rank=32,
        qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=16, index_topk=4,
        index_head_dim=16, index_n_heads=2, first_k_dense_replace=1), "DeepseekV32Config"),
    "deepseek-v4": (lambda: transformers.DeepseekV4Config(
        vocab_size=VOCAB, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=1, head_dim=32, q_lora_rank=32,
        num_experts_per_tok=2, n_routed_experts=4, sliding_window=WINDOW,
        layer_types=[SLIDING, CSA, HCA], compress_rates={CSA: 4, HCA: 8}, o_groups=2,
        o_lora_rank=16, index_n_heads=2, index_head_dim=16, index_topk=2,
        num_nextn_predict_layers=0, hc_mult=2, mlp_layer_types=["moe"] * 3,
        max_position_embeddings=128), "DeepseekV4Config"),
})
# Llama 4's text model: chunked local attention (chunks of 4, shorter than the prompt) in its
# rotary layers, full attention in its NoPE one.
CONFIGS["llama4"] = (lambda: transformers.Llama4TextConfig(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=64, intermediate_size_mlp=64,
    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    attention_chunk_size=4, num_local_experts=2, no_rope_layers=[1, 1, 0]), "Llama4TextConfig")


def compare(family, steps=10, seed=0):
    """The family's tiny fp32 model under swattn against its eager attention on the padded
    batch: (largest |logit difference| over the valid tokens, largest |logit|, greedy tokens
    of ``steps`` steps equal, number of distinct generated tokens)."""
    model = build(family, seed)
    ids, mask = padded_batch()

    def run(impl, fn):
        model.set_attn_implementation(impl)
        with torch.no_grad():
            return fn()

    # DeepSeek-V4 takes a left-padded forward with generate's positions (it refuses others).
    extra = {"position_ids": positions(mask)} if family == "deepseek-v4" else {}
    logits = [run(impl, lambda: model(ids, attention_mask=mask, **extra).logits)
              for impl in ("eager", "swattn")]
    valid = mask.bool()
    diff = (logits[1] - logits[0])[valid].abs().max().item()

    def generate():
        return model.generate(ids, attention_mask=mask, max_new_tokens=steps, do_sample=False,
                              pad_token_id=0)

    tokens = [run(impl, generate) for impl in ("eager", "swattn")]
    distinct = len(set(tokens[0][:, PROMPT:].flatten().tolist()))
    return diff, logits[0][valid].abs().max().item(), torch.equal(*tokens), distinct


if __name__ == "__main__":
    import swattn.integrations.transformers  # noqa: F401
    print(f"transformers {transformers.__version__}")
    print("| family | max abs logit diff | max abs logit | greedy tokens equal |")
    print("|---|---|---|---|")
    for name in CONFIGS:
        if name in ("llama", "phimoe"):
            continue
        if missing(name):
            print(f"| {name} | skipped: {missing(name)} | | |")
            continue
        diff, scale, equal, _ = compare(name)
        print(f"| {name} | {diff:.2e} | {scale:.2f} | {equal} |", flush=True)
