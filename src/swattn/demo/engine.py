"""A small continuous-batching engine on swattn's plan/run API, serving a Hugging Face
model whose attention layers call swattn on the engine's paged cache.

Each step the scheduler takes the running sequences' next tokens (one each when decoding, a
chunk of the prompt when prefilling, within a token budget), allocates their pages, builds
one block table per layer kind and plans the step once per kind (``plan_extend`` on host
lengths, with the block table checked there); the model then runs once over the step's
packed tokens, and each layer writes its new keys (``write_kv``) and runs its kind's plan.

Pages: full-attention layers keep every page of a sequence; window layers share one block
table whose pages are dropped as they slide out of the window (their entries become -1,
which no kernel reads) and freed unless the prefix cache holds them. The prefix cache shares
the pages of prompt prefixes between requests: it keeps every prompt page it is offered in
both layer kinds (no eviction; a window-aware cache would keep the window pages of a prefix
only near the boundaries requests hit), so the window layers' saving comes from the pages
the sequences drop beyond the cached prompts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

import swattn
from swattn import tiles as _tiles
from swattn.window import from_hf

KINDS = ("window", "full")


@dataclass
class Request:
    rid: int
    prompt: list
    max_new: int
    arrival: int  # the step it arrives at


class PagePool:
    """Pages of one layer kind, reference counted (a sequence and the prefix cache may hold
    the same page)."""

    def __init__(self, num_pages):
        self.num_pages = num_pages
        self.refs = [0] * num_pages
        self.free = list(range(num_pages - 1, -1, -1))
        self.peak = 0

    def alloc(self):
        if not self.free:
            raise RuntimeError(f"out of pages ({self.num_pages}): make the pool larger")
        page = self.free.pop()
        self.refs[page] = 1
        self.peak = max(self.peak, self.held)
        return page

    def ref(self, page):
        self.refs[page] += 1

    def unref(self, page):
        self.refs[page] -= 1
        if self.refs[page] == 0:
            self.free.append(page)

    @property
    def held(self):
        return self.num_pages - len(self.free)


@dataclass
class Sequence:
    req: Request
    tokens: list
    computed: int = 0  # tokens whose keys are in the cache
    generated: list = field(default_factory=list)
    pages: dict = field(default_factory=lambda: {k: [] for k in KINDS})
    cached_tokens: int = 0  # prompt tokens served by the prefix cache
    inserted: int = 0  # prompt pages offered to the prefix cache

    @property
    def prefilling(self):
        return self.computed < len(self.req.prompt)


class PrefixCache:
    """Prompt pages by their tokens and every token before them (a chain of page blocks):
    each entry holds its full-layer page and, while it lives, its window-layer page."""

    def __init__(self, pools, page_size, window_left):
        self.pools, self.page_size, self.window_left = pools, page_size, window_left
        self.entries = {}  # chain key -> {kind: page or None}

    def _keys(self, tokens, pages):
        key, P = None, self.page_size
        for j in range(pages):
            key = (key, tuple(tokens[j * P:(j + 1) * P]))
            yield key

    def insert(self, seq):
        """Offer the sequence's full prompt pages written so far."""
        full = min(seq.computed, len(seq.req.prompt)) // self.page_size
        for j, key in enumerate(self._keys(seq.req.prompt, full)):
            if j < seq.inserted or key in self.entries:
                continue
            entry = {}
            for kind in KINDS:
                page = seq.pages[kind][j]
                entry[kind] = None if page < 0 else page
                if page >= 0:
                    self.pools[kind].ref(page)
            self.entries[key] = entry
        seq.inserted = max(seq.inserted, full)

    def lookup(self, prompt):
        """The longest cached prefix (whole pages, at least one prompt token left to compute)
        whose window pages cover the window of its first uncached token: the entries'
        pages, or []."""
        P = self.page_size
        chain = []
        for key in self._keys(prompt, (len(prompt) - 1) // P):
            entry = self.entries.get(key)
            if entry is None:
                break
            chain.append(entry)
        while chain:
            first = _first_live_page(len(chain) * P, self.window_left, P)
            if all(e["window"] is not None for e in chain[first:]):
                return chain
            chain.pop()
        return []


def _first_live_page(next_pos, window_left, page_size):
    """The first logical page holding a key visible to queries at or after ``next_pos``."""
    return max(next_pos - window_left, 0) // page_size


class Engine:
    """Runs requests to completion on ``model`` (a Hugging Face causal LM whose layers have a
    ``layer_type`` of "sliding_attention" or "full_attention")."""

    def __init__(self, model, *, page_size, num_pages, token_budget, device, dtype,
                 full_kv_dtype=None):
        """``full_kv_dtype``: the full layers' cache dtype where it is not ``dtype`` (an fp8
        one, scale 1: the window layers keep ``dtype``, each kind its own plan)."""
        cfg = model.config
        self.model, self.device, self.dtype = model, device, dtype
        self.kv_dtypes = {"window": dtype, "full": full_kv_dtype or dtype}
        self.page_size, self.token_budget = page_size, token_budget
        self.num_q_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.window_left = from_hf(cfg.sliding_window)
        self.layer_kinds = ["window" if t == "sliding_attention" else "full" for t in cfg.layer_types]
        shape = (num_pages, page_size, self.num_kv_heads, self.head_dim)
        self.caches = []
        for kind in self.layer_kinds:  # unwritten rows are NaN: a read of one would show
            kv = self.kv_dtypes[kind]
            self.caches.append((torch.full(shape, float("nan"), dtype=dtype, device=device).to(kv),
                                torch.full(shape, float("nan"), dtype=dtype, device=device).to(kv)))
        self.pools = {kind: PagePool(num_pages) for kind in KINDS}
        self.prefix = PrefixCache(self.pools, page_size, self.window_left)
        self.step_state = None
        self.stats = dict(steps=0, tokens=0, generated=0, prompt_tokens=0, cached_tokens=0,
                          tiles=0, tiles_unbounded=0, window_pages_dropped=0, seconds=0.0,
                          plan_seconds=0.0, forward_seconds=0.0)

    # -- pages ---------------------------------------------------------------------------
    def _admit(self, seq):
        chain = self.prefix.lookup(seq.req.prompt)
        P = self.page_size
        first = _first_live_page(len(chain) * P, self.window_left, P)
        for j, entry in enumerate(chain):
            self.pools["full"].ref(entry["full"])
            seq.pages["full"].append(entry["full"])
            if j >= first:
                self.pools["window"].ref(entry["window"])
                seq.pages["window"].append(entry["window"])
            else:
                seq.pages["window"].append(-1)
        seq.computed = seq.cached_tokens = len(chain) * P
        seq.inserted = len(chain)  # pages
        self.stats["cached_tokens"] += seq.cached_tokens
        self.stats["prompt_tokens"] += len(seq.req.prompt)

    def _grow(self, seq, end):
        """Pages for the tokens up to ``end``."""
        need = -(-end // self.page_size)
        for kind in KINDS:
            while len(seq.pages[kind]) < need:
                seq.pages[kind].append(self.pools[kind].alloc())

    def _slide(self, seq):
        """Free the window pages no later query of ``seq`` can see."""
        first = _first_live_page(seq.computed, self.window_left, self.page_size)
        pages = seq.pages["window"]
        for j in range(min(first, len(pages))):
            if pages[j] >= 0:
                self.pools["window"].unref(pages[j])
                self.stats["window_pages_dropped"] += 1
                pages[j] = -1

    def _release(self, seq):
        for kind in KINDS:
            for page in seq.pages[kind]:
                if page >= 0:
                    self.pools[kind].unref(page)
            seq.pages[kind] = []

    # -- one step ------------------------------------------------------------------------
    def _schedule(self, running):
        budget, batch = self.token_budget, []
        for seq in running:  # decoding sequences first: one token each
            if not seq.prefilling and budget:
                batch.append((seq, 1))
                budget -= 1
        for seq in running:  # then prompt chunks
            if seq.prefilling and budget:
                n = min(len(seq.req.prompt) - seq.computed, budget)
                batch.append((seq, n))
                budget -= n
        return batch

    def _plan(self, batch):
        """The step's inputs and one plan per layer kind."""
        P = self.page_size
        ids, positions, cu, prefix = [], [], [0], []
        slots = {kind: [] for kind in KINDS}
        for seq, n in batch:
            self._grow(seq, seq.computed + n)
            for pos in range(seq.computed, seq.computed + n):
                ids.append(seq.tokens[pos])
                positions.append(pos)
                for kind in KINDS:
                    slots[kind].append(seq.pages[kind][pos // P] * P + pos % P)
            cu.append(cu[-1] + n)
            prefix.append(seq.computed)
        width = max(len(seq.pages["full"]) for seq, _ in batch)
        state = {"slots": {}, "tables": {}, "plans": {}, "sinks": {}}
        for kind in KINDS:
            table = torch.full((len(batch), width), -1, dtype=torch.int32)
            for b, (seq, _) in enumerate(batch):
                table[b, :len(seq.pages[kind])] = torch.tensor(seq.pages[kind], dtype=torch.int32)
            state["plans"][kind] = swattn.plan_extend(
                cu, prefix, num_q_heads=self.num_q_heads, num_kv_heads=self.num_kv_heads,
                head_dim=self.head_dim, page_size=P,
                window_left=self.window_left if kind == "window" else None,
                block_table=table, num_pages=self.pools[kind].num_pages, dtype=self.dtype,
                kv_dtype=self.kv_dtypes[kind] if self.kv_dtypes[kind] != self.dtype else None,
                device=self.device)
            state["tables"][kind] = table.to(self.device)
            state["slots"][kind] = torch.tensor(slots[kind], dtype=torch.int64, device=self.device)
        shapes = [(seq.computed, n) for seq, n in batch]
        self._count_tiles(state["plans"]["window"], shapes)
        ids = torch.tensor(ids, device=self.device)[None]
        positions = torch.tensor(positions, device=self.device)[None]
        return state, ids, positions, cu

    def _count_tiles(self, plan, shapes):
        t = plan.tiling()
        counts = _tiles.count_workload(shapes, self.window_left, block_m=t["tokens_per_block"],
                                       block_n=t["block_n"], heads=t["heads"])
        layers = self.layer_kinds.count("window")
        self.stats["tiles"] += layers * (counts["stage1"]["tight"] + counts["stage2"]["tight"])
        self.stats["tiles_unbounded"] += layers * (counts["stage1"]["all"] + counts["stage2"]["all"])

    def attention(self, module, query, key, value, attention_mask, scaling=None, s_aux=None,
                  **kwargs):
        """The model's attention on the engine's cache: write this step's keys, run the plan
        of the layer's kind (query/key/value ``[1, H, T, D]``)."""
        state = self.step_state
        layer = module.layer_idx
        kind = self.layer_kinds[layer]
        q = query[0].transpose(0, 1)
        k = key[0].transpose(0, 1).contiguous()
        v = value[0].transpose(0, 1).contiguous()
        k_cache, v_cache = self.caches[layer]
        swattn.write_kv(k, v, k_cache, v_cache, state["slots"][kind])
        sinks = None if s_aux is None else s_aux.to(torch.float32)
        out = state["plans"][kind].run(q.contiguous(), k, v, k_cache, v_cache,
                                       state["tables"][kind], sinks=sinks)
        return out[None], None

    def run(self, requests, progress=None, logits=None):
        """Serve ``requests``; returns {rid: generated tokens}. ``progress(done, total)`` is
        called after each step; ``logits``, a dict, gets each request's logits (fp32, on
        the host) for each token it generates."""
        pending = sorted(requests, key=lambda r: (r.arrival, r.rid))
        running, done = [], {}
        total = sum(r.max_new for r in requests)
        step = 0
        start = time.perf_counter()
        while pending or running:
            while pending and pending[0].arrival <= step:
                seq = Sequence(pending.pop(0), [])
                seq.tokens = list(seq.req.prompt)
                self._admit(seq)
                running.append(seq)
            if not running:
                step += 1
                continue
            t0 = time.perf_counter()
            batch = self._schedule(running)
            state, ids, positions, cu = self._plan(batch)
            self.step_state = state
            t1 = time.perf_counter()
            with torch.no_grad():
                scores = self.model(input_ids=ids, position_ids=positions, use_cache=False,
                                    logits_to_keep=0).logits[0]
            self.step_state = None
            ends = torch.tensor([c - 1 for c in cu[1:]], device=scores.device)
            last = scores[ends]
            picks = last.argmax(-1).tolist()  # waits for the step
            rows = last.float().cpu() if logits is not None else None
            self.stats["plan_seconds"] += t1 - t0
            self.stats["forward_seconds"] += time.perf_counter() - t1
            for i, ((seq, n), token) in enumerate(zip(batch, picks)):
                seq.computed += n
                self.stats["tokens"] += n
                if not seq.prefilling:
                    seq.generated.append(token)
                    seq.tokens.append(token)
                    if logits is not None:
                        logits.setdefault(seq.req.rid, []).append(rows[i])
                self.prefix.insert(seq)
                self._slide(seq)
                if len(seq.generated) >= seq.req.max_new:
                    done[seq.req.rid] = seq.generated
                    self._release(seq)
                    running.remove(seq)
            self.stats["steps"] += 1
            step += 1
            if progress is not None:
                progress(sum(len(d) for d in done.values())
                         + sum(len(s.generated) for s in running), total)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.stats["seconds"] = time.perf_counter() - start
        self.stats["generated"] = sum(len(g) for g in done.values())
        # A window-unaware cache keeps every page in the window layers too: as many as the
        # full layers' pool held.
        self.stats["pages_held"] = self.pools["full"].peak + self.pools["window"].peak
        self.stats["pages_unaware"] = 2 * self.pools["full"].peak
        return done
