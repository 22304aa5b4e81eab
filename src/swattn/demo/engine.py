"""A small continuous-batching engine on swattn's plan/run API, serving a Hugging Face
model whose attention layers call swattn on the engine's paged cache.

Each step the scheduler takes the running sequences' next tokens (one each when decoding, a
chunk of the prompt when prefilling, within a token budget), reserves their pages in
:mod:`swattn.memory` (one layer group per layer kind, each its own pool), writes the
memory's block-table rows into one device table per kind (in place) and plans the step once
per kind (``plan_extend`` on host lengths, with the block table checked there); the model
then runs once over the step's packed tokens, and each layer writes its new keys
(``write_kv``) and runs its kind's plan. After the step the memory commits the tokens.

Pages: the full-attention group keeps every page of a sequence; the window group gives each
page back the moment no later step of its sequence can read it, and its prefix cache keeps
only the window tails that hits need (the full group keeps every prompt page). The report
compares the window layers' pages with a window-unaware cache's, which would hold in the
window layers what the full layers hold (same pages, same page size).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

import swattn
from swattn import tiles as _tiles
from swattn.memory import BlockTables, KVMemory, LayerGroup, Schedule, pages_for, slot_mapping
from swattn.window import from_hf

KINDS = ("window", "full")


@dataclass
class Request:
    rid: int
    prompt: list
    max_new: int
    arrival: int  # the step it arrives at


@dataclass
class Sequence:
    req: Request
    tokens: list
    computed: int = 0  # tokens whose keys are in the cache
    generated: list = field(default_factory=list)
    cached_tokens: int = 0  # prompt tokens served by the prefix cache

    @property
    def prefilling(self):
        return self.computed < len(self.req.prompt)


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
        self.layer_kinds = ["window" if t == "sliding_attention" else "full"
                            for t in cfg.layer_types]
        shape = (num_pages, page_size, self.num_kv_heads, self.head_dim)
        self.caches = []
        for kind in self.layer_kinds:  # unwritten rows are NaN: a read of one would show
            kv = self.kv_dtypes[kind]
            self.caches.append((torch.full(shape, float("nan"), dtype=dtype, device=device).to(kv),
                                torch.full(shape, float("nan"), dtype=dtype, device=device).to(kv)))
        groups = [LayerGroup(kind, page_size, num_pages,
                             window_left=self.window_left if kind == "window" else None)
                  for kind in KINDS]
        # One reservation a sequence a step, planned after the last finished (no lag).
        self.memory = KVMemory(groups, Schedule(max_step_tokens=token_budget))
        self.tables = None
        self.step_state = None
        # Pages held per kind after each step's reservations (the step's most).
        self.pages_over_time = {kind: [] for kind in KINDS}
        self.stats = {"steps": 0, "tokens": 0, "generated": 0, "prompt_tokens": 0,
                      "cached_tokens": 0, "tiles": 0, "tiles_unbounded": 0,
                      "window_pages_dropped": 0, "seconds": 0.0, "plan_seconds": 0.0,
                      "forward_seconds": 0.0}

    # -- pages ---------------------------------------------------------------------------
    def _admit(self, seq):
        hit = self.memory.add(seq.req.rid, seq.req.prompt)
        seq.computed = seq.cached_tokens = hit.tokens
        self.stats["cached_tokens"] += seq.cached_tokens
        self.stats["prompt_tokens"] += len(seq.req.prompt)

    # -- one step ------------------------------------------------------------------------
    def schedule(self, running):
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
        reservations = self.memory.reserve_batch([(seq.req.rid, n, 0) for seq, n in batch])
        for kind in KINDS:
            self.pages_over_time[kind].append(self.memory.held(kind))
        ids, positions, cu, prefix = [], [], [0], []
        for seq, n in batch:
            ids += seq.tokens[seq.computed:seq.computed + n]
            positions += range(seq.computed, seq.computed + n)
            cu.append(cu[-1] + n)
            prefix.append(seq.computed)
        seq_ids = [seq.req.rid for seq, _ in batch]
        state = {"slots": {}, "tables": {}, "plans": {}}
        for kind in KINDS:
            # The device table is written in place: the same tensor every step.
            host = self.tables[kind].update(seq_ids)
            state["plans"][kind] = swattn.plan_extend(
                cu, prefix, num_q_heads=self.num_q_heads, num_kv_heads=self.num_kv_heads,
                head_dim=self.head_dim, page_size=self.page_size,
                window_left=self.window_left if kind == "window" else None,
                block_table=host, num_pages=self.memory.groups[kind].num_pages, dtype=self.dtype,
                kv_dtype=self.kv_dtypes[kind] if self.kv_dtypes[kind] != self.dtype else None,
                device=self.device)
            state["tables"][kind] = self.tables[kind].table[:len(batch)]
            state["slots"][kind] = slot_mapping(reservations, kind, device=self.device)
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
        self.stats["tiles_unbounded"] += layers * (counts["stage1"]["all"]
                                                   + counts["stage2"]["all"])

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
        longest = max(pages_for(len(r.prompt) + r.max_new, self.page_size) for r in requests)
        self.tables = {kind: BlockTables(self.memory, kind, max_batch=len(requests),
                                         max_pages=longest, device=self.device)
                       for kind in KINDS}
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
            batch = self.schedule(running)
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
                self.memory.commit(seq.req.rid)
                seq.computed += n
                self.stats["tokens"] += n
                if not seq.prefilling:
                    seq.generated.append(token)
                    seq.tokens.append(token)
                    if logits is not None:
                        logits.setdefault(seq.req.rid, []).append(rows[i])
                if len(seq.generated) >= seq.req.max_new:
                    done[seq.req.rid] = seq.generated
                    self.memory.release(seq.req.rid)
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
        pools = self.memory.pools
        self.stats["window_pages_dropped"] = pools["window"].frees
        # A window-unaware cache keeps every page in the window layers too: as many as the
        # full layers' pool held (the same pages of the same size).
        self.stats["pages_held"] = pools["full"].peak + pools["window"].peak
        self.stats["pages_unaware"] = 2 * pools["full"].peak
        self.stats["prefix_cache"] = vars(self.memory.cache.stats)
        return done
