"""The demo's run: the model, the requests, the engine, the check and the report."""

from __future__ import annotations

import random
import time

import torch

from .engine import Engine, Request
from .report import Progress, summary
from .sizes import FULL_KV
from .sizes import SIZES as sizes_of

ENGINE_IMPL = "swattn_engine"
ENGINES = []  # the engine whose step is running (the attention function's target)
# How far the fp32 check run's logits may part from eager's (relative to eager's largest)
# where a token differs: fp32 sums in another order, nothing more.
GAP_FP32 = 1e-3


def register():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    def attention(module, query, key, value, attention_mask, **kwargs):
        return ENGINES[-1].attention(module, query, key, value, attention_mask, **kwargs)

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


def _generate(model, requests, impl, device, batched, logits=None):
    """Greedy generation by transformers with ``impl`` attention: {rid: tokens} and the
    seconds it took. One request at a time (each alone, the exact check; ``logits``, a
    dict, then gets each request's logits per generated token), or all in one left-padded
    batch (how transformers serves several; the speed baseline)."""
    model.set_attn_implementation(impl)
    out = {}
    start = time.perf_counter()
    with torch.no_grad():
        if batched:
            longest = max(len(r.prompt) for r in requests)
            ids = torch.zeros(len(requests), longest, dtype=torch.long, device=device)
            mask = torch.zeros_like(ids)
            for i, r in enumerate(requests):
                ids[i, longest - len(r.prompt):] = torch.tensor(r.prompt, device=device)
                mask[i, longest - len(r.prompt):] = 1
            most = max(r.max_new for r in requests)
            gen = model.generate(ids, attention_mask=mask, max_new_tokens=most,
                                 min_new_tokens=most, do_sample=False, pad_token_id=0)
            for i, r in enumerate(requests):
                out[r.rid] = gen[i, longest:longest + r.max_new].tolist()
        else:
            for r in requests:
                ids = torch.tensor([r.prompt], device=device)
                gen = model.generate(ids, attention_mask=torch.ones_like(ids),
                                     max_new_tokens=r.max_new, min_new_tokens=r.max_new,
                                     do_sample=False, pad_token_id=0,
                                     output_logits=logits is not None,
                                     return_dict_in_generate=True)
                out[r.rid] = gen.sequences[0, len(r.prompt):].tolist()
                if logits is not None:
                    logits[r.rid] = [step[0].float().cpu() for step in gen.logits]
    if device.type == "cuda":
        torch.cuda.synchronize()
    return out, time.perf_counter() - start


def _agreement(want, got, logits=None, ours=None):
    """(requests identical, total, generated tokens before each request's first
    difference, summed; all generated tokens; logits gap): with eager's ``logits`` and the
    engine's (``ours``), the largest difference of the two over the steps each request's
    two runs share (up to and with its first difference), relative to eager's largest
    logit, else None. A token that differs where the two runs' logits agree that closely
    is a tie the two computations' rounding settles differently; a wrong attention moves
    logits by their own size."""
    same = sum(want[rid] == got[rid] for rid in want)
    prefix, gap = 0, 0.0 if logits is not None else None
    for rid in want:
        steps = len(want[rid])
        for step, (a, b) in enumerate(zip(want[rid], got[rid])):
            if a != b:
                steps = step + 1
                break
            prefix += 1
        if logits is not None:
            for e, o in zip(logits[rid][:steps], ours[rid][:steps]):
                gap = max(gap, ((o - e).abs().max() / e.abs().max()).item())
    return same, len(want), prefix, sum(len(w) for w in want.values()), gap


def _serve(model, size, requests, device, dtype, label=None, logits=None, full_kv_dtype=None):
    """Run ``requests`` through a fresh engine on ``model``: (engine, {rid: tokens});
    ``logits`` as :meth:`Engine.run`'s, ``full_kv_dtype`` as :class:`Engine`'s."""
    pages = sum(-(-(len(r.prompt) + r.max_new) // size["page"]) for r in requests) + 8
    engine = Engine(model, page_size=size["page"], num_pages=pages, token_budget=size["budget"],
                    device=device, dtype=dtype, full_kv_dtype=full_kv_dtype)
    model.set_attn_implementation(ENGINE_IMPL)
    ENGINES.append(engine)
    try:
        if label is None:
            return engine, engine.run(requests, logits=logits)
        with Progress(sum(r.max_new for r in requests), label) as bar:
            return engine, engine.run(requests, progress=bar.update)
    finally:
        ENGINES.pop()


def main(args):
    gpu = torch.cuda.is_available()
    name = args.size or ("gpu" if gpu else "cpu")
    size = dict(sizes_of[name])
    if args.requests is not None:
        size["requests"] = args.requests
    device = torch.device("cuda" if gpu else "cpu")
    dtype = torch.bfloat16 if gpu and name == "gpu" else torch.float32
    full_kv = getattr(args, "full_kv", None)
    full_kv_dtype = None if full_kv is None else getattr(torch, FULL_KV[full_kv])
    register()
    model = build_model(size, args.seed, device, dtype)
    requests = make_requests(size, size["requests"], args.seed + 1)
    longest = max(len(r.prompt) + r.max_new for r in requests)
    print(f"swattn demo: {len(requests)} requests on a gpt-oss-style model "
          f"({size['layers']} layers, window {size['window']}, "
          f"{size['heads']}/{size['kv_heads']} heads of {size['head_dim']}, sinks), "
          f"{device.type}, {str(dtype)[6:]}"
          + (" under Triton's interpreter" if not gpu else "")
          + (f"; full layers' KV cache {str(full_kv_dtype)[6:]}" if full_kv_dtype else ""))
    if gpu:  # compile each kernel variant before the timed run
        _serve(model, size, make_requests(dict(size, new=(4, 4)), 4, args.seed + 2), device, dtype,
               full_kv_dtype=full_kv_dtype)
    engine, done = _serve(model, size, requests, device, dtype, "generating",
                          full_kv_dtype=full_kv_dtype)
    rows = {"engine": engine.stats}
    checks = []
    if not args.no_check:
        # Each request alone: no padding in the eager run, the exact comparison.
        want, seconds = _generate(model, requests, "eager", device, batched=False)
        rows["eager, one request at a time"] = {"seconds": seconds}
        checks.append((str(dtype)[6:], _agreement(want, done)))
        if dtype != torch.float32:
            # bf16 rounds the two attentions differently and random weights leave many near
            # ties, so greedy paths part early: the closer check runs in fp32, on a few. A
            # part is accepted where the two runs' logits agree within GAP_FP32 up to it.
            few = requests[:4]
            model32 = model.float()
            ours, logits = {}, {}
            _, got = _serve(model32, size, few, device, torch.float32, logits=ours,
                            full_kv_dtype=full_kv_dtype)
            want, _ = _generate(model32, few, "eager", device, batched=False, logits=logits)
            checks.append(("float32 check run", _agreement(want, got, logits, ours)))
            model = model32.to(dtype)
    if gpu and not args.no_baselines:
        for impl in ("eager", "sdpa"):
            try:
                _, seconds = _generate(model, requests, impl, device, batched=True)
            except ValueError as exc:  # transformers serves no SDPA for some architectures
                rows[f"{impl}, one padded batch"] = {"error": str(exc).split(".")[0]}
                continue
            rows[f"{impl}, one padded batch"] = {"seconds": seconds}
    print(summary(engine, requests, rows, checks, longest))
    if getattr(args, "plot", None):
        from .report import plot_pages
        plot_pages(engine, args.plot)
        print(f"pages over time: {args.plot}")
    if full_kv_dtype is not None:
        return 0  # fp8 moves the attention: the check reports how far, it decides nothing
    exact = [c for label, c in checks if label.startswith("float32")]
    return 0 if all(c[0] == c[1] or (c[4] is not None and c[4] <= GAP_FP32) for c in exact) else 1
