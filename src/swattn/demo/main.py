"""The demo's run: the model, the requests, the engine, the check and the report."""

from __future__ import annotations

import random
import time

import torch

from .engine import Engine, Request
from .report import Progress, summary

ENGINE_IMPL = "swattn_engine"
_ENGINES = []  # the engine whose step is running (the attention function's target)


def _register():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    def attention(module, query, key, value, attention_mask, **kwargs):
        return _ENGINES[-1].attention(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(ENGINE_IMPL, attention)
    # The engine's plans carry the masks: the model needs none built.
    AttentionMaskInterface.register(ENGINE_IMPL, lambda *args, **kwargs: None)


def build_model(size, seed, device, dtype):
    """gpt-oss's architecture at ``size``: alternating window and full layers, sinks,
    experts; random weights (seeded), larger than the default init so tokens vary."""
    import transformers
    config = transformers.GptOssConfig(
        vocab_size=size["vocab"], hidden_size=size["hidden"], intermediate_size=size["hidden"],
        num_hidden_layers=size["layers"], num_attention_heads=size["heads"],
        num_key_value_heads=size["kv_heads"], head_dim=size["head_dim"],
        sliding_window=size["window"], num_local_experts=size["experts"],
        num_experts_per_tok=size["top_k"], max_position_embeddings=8192,
        layer_types=["sliding_attention" if i % 2 == 0 else "full_attention"
                     for i in range(size["layers"])],
        rope_parameters={"rope_type": "default", "rope_theta": 150000.0})
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.GptOssForCausalLM(config).to(dtype).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 1.0 / p.shape[-1] ** 0.5)
            elif "sinks" in name:
                p.normal_(0, 1)
    return model.to(device)


def make_requests(size, count, seed):
    """``count`` requests: two in three share a system prompt; the rest are unrelated."""
    rng = random.Random(seed)
    vocab = size["vocab"]
    system = [rng.randrange(vocab) for _ in range(size["system"])]
    requests = []
    for rid in range(count):
        user = [rng.randrange(vocab) for _ in range(rng.randint(*size["user"]))]
        prompt = system + user if rid % 3 != 2 else user + user[:size["system"] // 2]
        requests.append(Request(rid, prompt, rng.randint(*size["new"]),
                                arrival=rid * size["arrivals"] // 2))
    return requests


def _generate(model, requests, impl, device):
    """Greedy generation by transformers with ``impl`` attention, one request at a time:
    {rid: tokens} and the seconds it took."""
    model.set_attn_implementation(impl)
    out = {}
    start = time.perf_counter()
    with torch.no_grad():
        for r in requests:
            ids = torch.tensor([r.prompt], device=device)
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=r.max_new,
                                 min_new_tokens=r.max_new, do_sample=False, pad_token_id=0)
            out[r.rid] = gen[0, len(r.prompt):].tolist()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return out, time.perf_counter() - start


def main(args):
    from . import SIZES as sizes_of
    gpu = torch.cuda.is_available()
    name = args.size or ("gpu" if gpu else "cpu")
    size = dict(sizes_of[name])
    if args.requests is not None:
        size["requests"] = args.requests
    device = torch.device("cuda" if gpu else "cpu")
    dtype = torch.bfloat16 if gpu and name == "gpu" else torch.float32
    _register()
    model = build_model(size, args.seed, device, dtype)
    requests = make_requests(size, size["requests"], args.seed + 1)
    longest = max(len(r.prompt) + r.max_new for r in requests)
    pages = sum(-(-(len(r.prompt) + r.max_new) // size["page"]) for r in requests) + 8
    engine = Engine(model, page_size=size["page"], num_pages=pages, token_budget=size["budget"],
                    device=device, dtype=dtype)
    total = sum(r.max_new for r in requests)
    print(f"swattn demo: {len(requests)} requests on a gpt-oss-style model ({size['layers']} layers, "
          f"window {size['window']}, {size['heads']}/{size['kv_heads']} heads of {size['head_dim']}, "
          f"sinks), {device.type}, {str(dtype)[6:]}"
          + (" under Triton's interpreter" if not gpu else ""))
    model.set_attn_implementation(ENGINE_IMPL)
    _ENGINES.append(engine)
    try:
        with Progress(total, "generating") as bar:
            done = engine.run(requests, progress=bar.update)
    finally:
        _ENGINES.pop()
    rows = {"engine": engine.stats}
    check = None
    if not args.no_check:
        want, seconds = _generate(model, requests, "eager", device)
        rows["eager"] = {"seconds": seconds}
        same = [rid for rid in want if want[rid] == done[rid]]
        check = (len(same), len(want), sorted(set(want) - set(same)))
    if gpu and not args.no_baselines:
        _, seconds = _generate(model, requests, "sdpa", device)
        rows["sdpa"] = {"seconds": seconds}
    print(summary(engine, requests, rows, check, longest))
    return 0 if check is None or check[0] == check[1] or dtype != torch.float32 else 1
