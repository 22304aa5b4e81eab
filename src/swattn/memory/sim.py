"""``swattn memory-sim``: one trace at a real model's KV shapes under every policy of
:mod:`.policies`: the peak KV bytes, the largest batch that fits in a KV budget (80 GB by
default), the most pages a sequence holds in a sliding group, and whether any peer ever
holds fewer pages than ours.

The trace: ``requests`` requests arrive together, each ``prompt`` tokens then ``output``
generated ones. Prompts are prefilled first, one chunk of at most ``chunk`` tokens a step
(one request's chunk a step, in order: SGLang's default order, prefill before decode), then
every request decodes one token a step until done. No prefix is shared (the prefix cache
plays no part). Every policy sees the same steps.

Peak bytes: ours keeps one pool per group, sized for that group's own peak, so its bytes
are the sum of the groups' peaks; vLLM and a window-unaware cache keep one pool for all
groups, so theirs are the peak of the sum; SGLang keeps a full pool of ``F`` tokens and an
SWA pool of ``0.8 F``, so it needs ``max(full tokens, SWA tokens / 0.8)`` tokens of both at
their per-token bytes. The largest batch is the largest request count whose peak fits.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .groups import LayerGroup, Schedule, pages_for, ring_width
from .models import MODELS
from .policies import POLICIES, SGLANG_SWA_RATIO, make_policy

GB = 10 ** 9


@dataclass(frozen=True)
class Trace:
    requests: int
    prompt: int = 32512
    output: int = 256
    chunk: int = 8192

    def steps(self):
        """Each step's ``(seq_id, tokens, decode)`` triples, and the sequences done after it."""
        for seq in range(self.requests):
            for start in range(0, self.prompt, self.chunk):
                yield [(seq, min(self.chunk, self.prompt - start), False)], []
        everyone = list(range(self.requests))
        for t in range(self.output):
            yield [(seq, 1, True) for seq in everyone], everyone if t == self.output - 1 else []


def _page_bytes(model):
    return {g.name: model.page_size * g.layers * g.bytes_per_token for g in model.groups}


def simulate(model, trace, names=POLICIES, per_sequence=True):
    """Run ``trace`` under the policies ``names``; returns per policy its per-group peak
    pages, peak of the summed bytes, peak full and SWA tokens, the most pages a sequence
    held in a sliding group (ours, with ``per_sequence``), and (with ours among them) the
    steps at which it held fewer pages than ours in some group."""
    pages = trace.requests * (pages_for(trace.prompt + trace.output, model.page_size) + 1)
    policies = {name: make_policy(name, model, trace.chunk, pages) for name in names}
    page_bytes = _page_bytes(model)
    sliding = [g.name for g in model.groups if g.slides]
    out = {name: {"peaks": dict.fromkeys(page_bytes, 0), "peak_bytes": 0.0, "full_tokens": 0,
                  "swa_tokens": 0, "seq_pages": 0, "below_ours": 0} for name in names}
    for policy in policies.values():
        for seq in range(trace.requests):
            policy.add(seq)
    for steps, done in trace.steps():
        held = {}
        for name, policy in policies.items():
            policy.reserve(steps)
            held[name] = {g: policy.held(g) for g in page_bytes}
            row = out[name]
            for g, count in held[name].items():
                row["peaks"][g] = max(row["peaks"][g], count)
            row["peak_bytes"] = max(row["peak_bytes"],
                                    sum(held[name][g] * page_bytes[g] for g in page_bytes))
            full = [count for g, count in held[name].items() if g not in sliding]
            row["full_tokens"] = max(row["full_tokens"], max(full, default=0) * model.page_size)
            row["swa_tokens"] = max(row["swa_tokens"], max(
                (held[name][g] for g in sliding), default=0) * model.page_size)
        if "ours" in policies and per_sequence:
            memory = policies["ours"].memory
            for seq, _, _ in steps:
                for g in sliding:
                    out["ours"]["seq_pages"] = max(out["ours"]["seq_pages"], memory.held(g, seq))
            for name in policies:
                out[name]["below_ours"] += any(held[name][g] < held["ours"][g] for g in page_bytes)
        for policy in policies.values():
            policy.commit(steps)
            for seq in done:
                policy.release(seq)
    return out


def needed_bytes(model, name, row):
    """The KV bytes policy ``name`` must set aside for the trace behind ``row``."""
    if name == "ours":
        return sum(row["peaks"][g] * b for g, b in _page_bytes(model).items())
    if name == "sglang" and any(g.slides for g in model.groups):
        tokens = max(row["full_tokens"], row["swa_tokens"] / SGLANG_SWA_RATIO)
        return tokens * (model.bytes_per_token(False) + SGLANG_SWA_RATIO
                         * model.bytes_per_token(True))
    return row["peak_bytes"]


def _fits(model, name, trace, requests, capacity):
    probe = Trace(requests, trace.prompt, trace.output, trace.chunk)
    row = simulate(model, probe, (name,), per_sequence=False)[name]
    return needed_bytes(model, name, row) <= capacity


def largest_batch(model, name, trace, capacity):
    """The most requests of ``trace``'s shape whose peak fits in ``capacity`` bytes: a first
    guess from two small batches (a policy's bytes grow about the same amount a request),
    then a search simulated around it: ``n`` fits and ``n + 1`` does not."""
    small = [needed_bytes(model, name, simulate(
        model, Trace(n, trace.prompt, trace.output, trace.chunk), (name,), False)[name])
        for n in (2, 3)]
    slope = small[1] - small[0]
    guess = max(int(2 + (capacity - small[0]) // slope) if slope > 0 else 2, 1)
    fits = _fits(model, name, trace, guess, capacity)
    lo, hi = (guess, None) if fits else (0, guess)  # lo fits (0 always), hi does not
    step = 1
    while hi is None:
        if _fits(model, name, trace, lo + step, capacity):
            lo, step = lo + step, 2 * step
        else:
            hi = lo + step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _fits(model, name, trace, mid, capacity) else (lo, mid)
    return lo


def run_model(model, trace, capacity):
    """Every policy on ``trace`` and its largest batch in ``capacity`` bytes."""
    rows = simulate(model, trace)
    for name, row in rows.items():
        row["needed_bytes"] = needed_bytes(model, name, row)
        row["largest_batch"] = largest_batch(model, name, trace, capacity)
    width = max(ring_width(g, _schedule(trace)) for g in _sliding_groups(model))
    return {"model": model.name, "note": model.note, "page_size": model.page_size,
            "ring_width": width, "trace": vars(trace), "capacity_bytes": capacity,
            "policies": rows}


def _schedule(trace):
    return Schedule(trace.chunk)


def _sliding_groups(model):
    return [LayerGroup(g.name, model.page_size, 1, g.window_left, g.attention_chunk)
            for g in model.groups if g.slides]


def format_table(result):
    t = result["trace"]
    title = (f"{result['model']} ({result['note']}); {t['requests']} requests of "
             f"{t['prompt']} prompt + {t['output']} output tokens, prefill chunks of "
             f"{t['chunk']}, pages of {result['page_size']} tokens, "
             f"{result['capacity_bytes'] / GB:g} GB of KV")
    header = (f"{'policy':<8} {'peak KV (GB)':>12} {'largest batch':>13} {'x unaware':>9} "
              f"{'sliding pages a seq':>19} {'steps below ours':>16}")
    lines = [title, header]
    unaware = result["policies"]["unaware"]["largest_batch"]
    for name, row in result["policies"].items():
        seq_pages = (f"{row['seq_pages']} (ring {result['ring_width']})" if name == "ours"
                     else "")
        ratio = row["largest_batch"] / unaware if unaware else float("inf")
        lines.append(f"{name:<8} {row['needed_bytes'] / GB:>12.2f} {row['largest_batch']:>13} "
                     f"{ratio:>9.2f} {seq_pages:>19} {row['below_ours']:>16}")
    return "\n".join(lines)


def add_arguments(parser):
    parser.add_argument("--model", choices=["all", *MODELS], default="all")
    parser.add_argument("--requests", type=int, default=8,
                        help="requests of the trace whose peak is reported (8)")
    parser.add_argument("--prompt", type=int, default=32512, help="prompt tokens (32512)")
    parser.add_argument("--output", type=int, default=256, help="generated tokens (256)")
    parser.add_argument("--chunk", type=int, default=8192, help="prefill chunk (8192)")
    parser.add_argument("--capacity-gb", type=float, default=80.0,
                        help="KV memory for the largest batch, in GB of 10^9 bytes (80)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")


def run(args):
    trace = Trace(args.requests, args.prompt, args.output, args.chunk)
    names = list(MODELS) if args.model == "all" else [args.model]
    results = [run_model(MODELS[name], trace, args.capacity_gb * GB) for name in names]
    if args.json:
        print(json.dumps(results))
    else:
        print("\n\n".join(format_table(r) for r in results))
    return 0
