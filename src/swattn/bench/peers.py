"""Adapters: each variant's inputs built from one case, outside the timed region.

Every adapter takes the case's :class:`~swattn.bench.harness.ExtendInputs` (one paged pool
of K/V that holds every sequence's prefix *and* its new tokens, as an engine has written
them before attention) and returns a :class:`Prepared`: a zero-argument callable that
launches the variant, how to read its output back in token layout ``[T, Hq, Dv]``, and a
note. A variant that cannot run here raises :class:`Skip` with the reason.

Peers are called as their engines call them (``docs/peers.md``) and loaded
from the folder named by ``--peers`` / ``SWATTN_PEERS`` (default ``.peers/py``), put
first on ``sys.path``. Layout decisions (what is fair) are in each adapter's docstring and
in the README of the results.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..window import to_flash_attn, to_flashinfer, to_sglang

DEFAULT_PEERS = os.path.join(".peers", "py")


class Skip(Exception):
    """This variant cannot run here; the message says why (it goes into the table)."""


@dataclass
class Prepared:
    """A variant ready to time: ``fn()`` launches it, ``result()`` reads the last output
    as ``[T, Hq, Dv]``, ``poison()`` fills the output with NaN (None where the variant
    allocates its own output). ``applies_sinks=False`` marks a variant that drops the
    case's sinks: it computes a different function and is checked against a sink-less
    reference; ``applies_sparse=False`` likewise one that leaves out a decode case's sparse
    keys (checked against a window-only reference)."""

    fn: Callable[[], object]
    result: Callable[[], torch.Tensor]
    note: str = ""
    applies_sinks: bool = True
    poison: Callable[[], None] | None = None
    keep: list = field(default_factory=list)
    applies_sparse: bool = True
    # Calls whose host time is measured (name -> zero-argument callable), and the tiles
    # the plan's kernel walks (ExtendPlan.tiling) for the tile model's prediction.
    host: dict = field(default_factory=dict)
    tiling: dict | None = None


def peers_dir(path=None):
    """The peers folder: ``path``, else ``$SWATTN_PEERS``, else ``.peers/py``."""
    return path or os.environ.get("SWATTN_PEERS") or DEFAULT_PEERS


def use_peers(path=None):
    """Put the peers folder first on ``sys.path``; returns a note for the report."""
    path = os.path.abspath(peers_dir(path))
    if not os.path.isdir(path):
        return f"peers folder {path} not found: SGLang and vLLM rows will be skipped"
    if path in sys.path:
        sys.path.remove(path)
    sys.path.insert(0, path)
    return f"peers loaded from {path}"


def import_peer(module_name):
    """Import one peer module, or raise Skip naming the import error."""
    try:
        return importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure means "skip this peer"
        raise Skip(f"import {module_name} failed: {type(exc).__name__}: {exc}") from None


def need_cuda(inputs):
    if not inputs.q.is_cuda:
        raise Skip("needs a CUDA device")


def empty_out(inputs):
    case = inputs.case
    return torch.empty(inputs.q.shape[0], case.num_q_heads, case.head_dim_v,
                       dtype=inputs.q.dtype, device=inputs.q.device)


def poisoner(out):
    return lambda: out.fill_(float("nan"))


def softmax_scale(case):
    return case.head_dim ** -0.5


# --------------------------------------------------------------------------------------
# swattn: the plan's run, as an engine calls it (tight / skip, and the same-variant control).
# --------------------------------------------------------------------------------------

def extend_plan(inputs, table, *, bounds="tight", deterministic=False, hopper=None):
    """The plan of one case, made as an engine makes it: from the host lengths."""
    import swattn
    case = inputs.case
    cu = [0]
    for _, e in case.seqs:
        cu.append(cu[-1] + e)
    return swattn.plan_extend(cu, [p for p, _ in case.seqs], num_q_heads=case.num_q_heads,
                              num_kv_heads=case.num_kv_heads, head_dim=case.head_dim,
                              head_dim_v=case.head_dim_v, page_size=case.page_size,
                              window_left=case.window_left, dtype=inputs.q.dtype,
                              device=inputs.q.device, bounds=bounds, deterministic=deterministic,
                              hopper=hopper)


def plan_note(plan):
    """What a plan runs, for the legend: its kernel, and the Triton kernel's tiling."""
    if plan.config is None:
        return f"{plan.path} path"
    return f"{plan.path} kernel {plan.config.block_m}x{plan.config.block_n}"


def ours(inputs, *, bounds="tight", layout="window", control=False, deterministic=False,
         hopper=None):
    """swattn's extend through its engine path: ``swattn.plan_extend`` on the host lengths
    once, then ``plan.run`` timed (``deterministic=True``: the single-pass kernel) over the
    paged pool (page size ``case.page_size``). ``control``: a second plan of the same
    batch, timed as its own variant: the noise floor.

    ``layout="window"``: the block table holds -1 for every page wholly below the first
    new token's window (what an engine that frees out-of-window pages hands over), so a
    read of one would fault; ``"full"``: the whole prefix is mapped and only the bounds
    trim it. ``prefix_lens`` is P in both (the positions stay absolute). ``hopper``:
    the plan's choice of the Gluon fast path (None: its own).

    The host time of a ``plan.run`` call and of the one-shot ``swattn.extend_attention``
    on the same tensors (both with ``out`` given) are measured beside the graph replay."""
    need_cuda(inputs)
    import swattn
    case = inputs.case
    table = inputs.block_table_window if layout == "window" else inputs.block_table_full
    if layout == "full" and bounds == "tight" and torch.equal(table, inputs.block_table_window):
        raise Skip("= window layout (no page lies below the window)")
    try:
        plan = extend_plan(inputs, table, bounds=bounds, deterministic=deterministic, hopper=hopper)
    except ValueError as exc:
        raise Skip(str(exc)) from None
    out = empty_out(inputs)
    tensors = (inputs.q, inputs.k, inputs.v, inputs.k_pool, inputs.v_pool, table)

    def run():
        plan.run(*tensors, sinks=inputs.sinks, out=out)

    def one_shot():
        swattn.extend_attention(*tensors, inputs.cu_seqlens, inputs.prefix_lens,
                                window_left=case.window_left, sinks=inputs.sinks,
                                deterministic=deterministic, out=out)

    host = {"plan.run": run}
    if bounds == "tight" and hopper is None and not control:
        host["one-shot"] = one_shot
    note = f"{layout} layout, {plan_note(plan)}" + (", a second plan" if control else "")
    return Prepared(run, lambda: out, note, True, poisoner(out), [plan], host=host,
                    tiling=plan.tiling())


# --------------------------------------------------------------------------------------
# SGLang 0.5.23 Triton kernels, over its token pool (a page-size-1 view of the same pool).
# --------------------------------------------------------------------------------------

_SGLANG = "sglang.kernels.ops.attention.extend_attention"


def _token_pool(inputs):
    case = inputs.case
    return (inputs.k_pool.view(-1, case.num_kv_heads, case.head_dim),
            inputs.v_pool.view(-1, case.num_kv_heads, case.head_dim_v))


def _prefix_lists(inputs, layout):
    """Per sequence, the prefix slots SGLang's backend hands the kernel: the last
    ``min(P, W-1)`` (window layout, ``update_sliding_window_buffer``) or all ``P``."""
    case = inputs.case
    lists, starts = [], []
    for b, (prefix, _) in enumerate(case.seqs):
        keep = prefix if (layout == "full" or case.window_left is None) else min(prefix, case.window_left)
        lists.append(inputs.slots(b, prefix - keep, prefix))
        starts.append(prefix - keep)
    return lists, starts


def _indptr(lists, device):
    lengths = torch.tensor([len(x) for x in lists], dtype=torch.int64)
    indptr = torch.zeros(len(lists) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(lengths, 0)
    return indptr.to(device)


def _cat(lists, device):
    if not lists or sum(len(x) for x in lists) == 0:
        return torch.zeros(1, dtype=torch.int64, device=device)
    return torch.cat(lists).to(device=device, dtype=torch.int64)


def sglang_extend(inputs, *, layout="window"):
    """SGLang ``extend_attention_fwd`` (two-stage, SKIP_TILE) as its Triton backend calls it.

    Window layout: ``kv_indices`` lists the last ``W-1`` prefix tokens (``window_kv_indptr``
    of its backend; its kernel counts positions from the list start, which keeps the
    window predicate since queries shift by the same amount). Full layout: the whole prefix
    (what the same kernel gets on a cache hit without the trimming); skipped where it is the
    same list. New tokens come from ``k``/``v``, the prefix from the token pool.
    """
    need_cuda(inputs)
    case = inputs.case
    inside = case.window_left is None or all(p <= case.window_left for p, _ in case.seqs)
    if layout == "full" and inside:
        raise Skip("= window layout (every prefix is inside the window)")
    mod = import_peer(_SGLANG)
    device = inputs.q.device
    k_buffer, v_buffer = _token_pool(inputs)
    lists, starts = _prefix_lists(inputs, layout)
    kv_indptr, kv_indices = _indptr(lists, device), _cat(lists, device)
    qo_indptr = inputs.cu_seqlens.to(torch.int64)
    offsets = torch.tensor(starts, dtype=torch.int32, device=device)
    max_len_extend = max(e for _, e in case.seqs)
    out = empty_out(inputs)

    def fn():
        mod.extend_attention_fwd(
            inputs.q, inputs.k, inputs.v, out, k_buffer, v_buffer, qo_indptr, kv_indptr,
            kv_indices, None, True, None, max_len_extend, 1.0, 1.0, sm_scale=softmax_scale(case),
            logit_cap=0.0, sliding_window_size=to_sglang(case.window_left), sinks=inputs.sinks,
            window_kv_offsets=offsets)

    note = f"token pool (page 1), {layout} layout: {sum(len(x) for x in lists)} prefix indices"
    return Prepared(fn, lambda: out, note, True, poisoner(out),
                    [kv_indptr, kv_indices, qo_indptr, offsets])


def sglang_unified(inputs):
    """SGLang ``extend_attention_fwd_unified`` (deterministic mode) as its backend calls it:
    the window list (last ``W-1`` prefix tokens) padded to start on an absolute multiple of
    128 (``align_window_kv_to_tiles``), then one index list per request, prefix and new
    tokens (``build_unified_kv_indices``), all reading the token pool. The backend builds the
    unified list in every layer's call; here it is built once, outside the timed region."""
    need_cuda(inputs)
    case = inputs.case
    mod = import_peer(_SGLANG)
    device = inputs.q.device
    bs = case.batch
    k_buffer, v_buffer = _token_pool(inputs)
    lists, starts = _prefix_lists(inputs, "window")
    prefix_indptr, prefix_indices = _indptr(lists, device), _cat(lists, device)
    window_start = torch.tensor(starts, dtype=torch.int32, device=device)
    prefix_lens = inputs.prefix_lens
    note = "token pool (page 1), window list"
    if case.window_left is not None:
        align = getattr(mod, "align_window_kv_to_tiles", None)
        if align is not None:
            prefix_indptr, prefix_indices = align(prefix_indptr, prefix_indices, window_start, bs)
            window_start = prefix_lens - (prefix_indptr[1:] - prefix_indptr[:-1]).to(torch.int32)
            note += " aligned to 128"
        else:
            note += " (this SGLang has no align_window_kv_to_tiles: unaligned)"
    new_lists = [inputs.slots(b, p, p + e) for b, (p, e) in enumerate(case.seqs)]
    new_indices = _cat(new_lists, device)
    extend_seq_lens = (inputs.cu_seqlens[1:] - inputs.cu_seqlens[:-1]).to(torch.int32)
    extend_start_loc = inputs.cu_seqlens[:-1].to(torch.int32)
    unified_indptr, unified_indices, unified_prefix = mod.build_unified_kv_indices(
        prefix_indptr, prefix_indices, extend_start_loc, extend_seq_lens, new_indices, bs)
    unified_prefix = unified_prefix.to(torch.int32)
    qo_indptr = inputs.cu_seqlens.to(torch.int64)
    max_len_extend = max(e for _, e in case.seqs)
    out = empty_out(inputs)
    window_pos = window_start if case.window_left is not None else None

    def fn():
        mod.extend_attention_fwd_unified(
            inputs.q, out, k_buffer, v_buffer, 1.0, 1.0, qo_indptr, unified_indptr,
            unified_indices, unified_prefix, max_len_extend, custom_mask=None, mask_indptr=None,
            sm_scale=softmax_scale(case), logit_cap=0.0, is_causal=True,
            sliding_window_size=to_sglang(case.window_left), sinks=inputs.sinks,
            window_start_pos=window_pos)

    note += "; index build not timed"
    return Prepared(fn, lambda: out, note, True, poisoner(out),
                    [unified_indptr, unified_indices, unified_prefix, qo_indptr, window_start])


# --------------------------------------------------------------------------------------
# vLLM 0.33.0 Triton unified attention over [pages, 16, Hkv, D].
# --------------------------------------------------------------------------------------

def vllm_unified(inputs):
    """vLLM ``unified_attention`` (2D path: multi-token queries) over the paged pool, new
    tokens already in their pages, ``window_size=(W-1, 0)``, sinks.

    Pages wholly below the first new token's window map to page 0, a null page holding
    finite data, as vLLM's sliding-window block manager maps freed blocks to its null
    block: its first key tile is aligned to 32 tokens and may read one page below the
    window (masked), so -1 there would fault. Its tile bounds are exact, so the full
    layout costs the same and is not timed separately.
    """
    need_cuda(inputs)
    case = inputs.case
    if case.page_size != 16:
        raise Skip(f"vLLM's Triton backend runs block size 16, this pool has {case.page_size}")
    mod = import_peer("vllm.v1.attention.ops.triton_unified_attention")
    device = inputs.q.device
    # Two spare columns (-1): its last 32-token tile reads the table entry one page past the
    # end of a sequence (masked loads after it), which must lie inside the table.
    spare = torch.full((case.batch, 2), -1, dtype=torch.int32, device=device)
    table = torch.cat([inputs.seq_pages, spare], dim=1)
    for b, (prefix, _) in enumerate(case.seqs):
        below = case.lowest_key(prefix) // case.page_size
        table[b, :below] = inputs.null_page
    seqused_k = torch.tensor([p + e for p, e in case.seqs], dtype=torch.int32, device=device)
    ones = torch.ones(1, dtype=torch.float32, device=device)
    out = empty_out(inputs)
    left, _ = to_flash_attn(case.window_left)
    window = (left, 0) if case.window_left is not None else (-1, -1)
    max_q = max(e for _, e in case.seqs)
    max_k = max(p + e for p, e in case.seqs)

    def fn():
        mod.unified_attention(
            q=inputs.q, k=inputs.k_pool, v=inputs.v_pool, out=out, cu_seqlens_q=inputs.cu_seqlens,
            max_seqlen_q=max_q, seqused_k=seqused_k, max_seqlen_k=max_k, softmax_scale=softmax_scale(case),
            causal=True, window_size=window, block_table=table, softcap=0, q_descale=None,
            k_descale=ones, v_descale=ones, sinks=inputs.sinks)

    return Prepared(fn, lambda: out, "paged 16, pages below the window -> null page", True,
                    poisoner(out), [table, seqused_k, ones])


# --------------------------------------------------------------------------------------
# PyTorch FlexAttention, compiled, dense Q/K/V per batch.
# --------------------------------------------------------------------------------------

_FLEX = {}


def compiled_flex():
    if "fn" not in _FLEX:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        except Exception as exc:  # noqa: BLE001
            raise Skip(f"FlexAttention unavailable: {exc}") from None
        import torch._dynamo
        for name in ("cache_size_limit", "recompile_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 64)
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
        _FLEX["block_mask"] = create_block_mask
    return _FLEX["fn"], _FLEX["block_mask"]


def flex(inputs):
    """FlexAttention (``torch.compile``d), dense and unpaged: Q ``[B, Hq, E, D]``, K/V
    ``[B, Hkv, P+E, D]`` gathered from the pool outside the timed region (the whole
    sequence: the block mask, causal and ``q - k <= W-1``, skips the rest), ``enable_gqa``.
    It has no sinks: on a workload with sinks it computes a different function."""
    need_cuda(inputs)
    case = inputs.case
    if not case.uniform:
        raise Skip("ragged batch: the dense FlexAttention adapter needs one (prefix, new) per case")
    compiled, create_block_mask = compiled_flex()
    prefix, new = case.seqs[0]
    total = prefix + new
    window_left = case.window_left
    q = inputs.q.view(case.batch, new, case.num_q_heads, case.head_dim).transpose(1, 2).contiguous()
    keys = [inputs.slots(b, 0, total).to(inputs.q.device) for b in range(case.batch)]
    k_flat, v_flat = _token_pool(inputs)
    k = torch.stack([k_flat[s] for s in keys]).transpose(1, 2).contiguous()
    v = torch.stack([v_flat[s] for s in keys]).transpose(1, 2).contiguous()

    def mask_mod(b, h, q_idx, kv_idx):
        pos = q_idx + prefix
        keep = kv_idx <= pos
        if window_left is not None:
            keep = keep & (pos - kv_idx <= window_left)
        return keep

    block_mask = create_block_mask(mask_mod, B=None, H=None, Q_LEN=new, KV_LEN=total,
                                   device=inputs.q.device)
    state = {}

    def fn():
        state["out"] = compiled(q, k, v, block_mask=block_mask, scale=softmax_scale(case), enable_gqa=True)

    def result():
        return state["out"].transpose(1, 2).reshape(-1, case.num_q_heads, case.head_dim_v)

    note = "dense [B,H,S,D], block mask; output allocated by flex (not poisoned)"
    return Prepared(fn, result, note, False, None, [q, k, v, block_mask])


# --------------------------------------------------------------------------------------
# FlashInfer, only where it imports.
# --------------------------------------------------------------------------------------

def flashinfer_page_lists(seq_pages, first_pages, end_pages, lengths, page_size):
    """FlashInfer's paged-KV lists, int32 on the host: ``(indptr, indices, last)`` for
    sequence b's pages ``first_pages[b]`` to ``end_pages[b]`` of its block-table row
    ``seq_pages[b]``, ``lengths[b]`` keys long (``last``: the keys in its last page)."""
    seq_pages = seq_pages.cpu()
    indices = torch.cat([seq_pages[b, f:e] for b, (f, e) in enumerate(zip(first_pages, end_pages))])
    indptr = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor([e - f for f, e in zip(first_pages, end_pages)]), 0)
    last = torch.tensor([(n - 1) % page_size + 1 for n in lengths], dtype=torch.int32)
    return indptr, indices.to(torch.int32), last


def flashinfer(inputs):
    """FlashInfer ``BatchPrefillWithPagedKVCacheWrapper`` (NHD, page 16), planned once,
    ``window_left=W-1``, over every page of each sequence (new tokens included). Its FA2/FA3
    paths on the H200 ignore sinks (peers/README.md), so it runs without them and is marked
    as computing a different function on workloads with sinks."""
    need_cuda(inputs)
    fi = import_peer("flashinfer")
    case = inputs.case
    device = inputs.q.device
    lengths = [p + e for p, e in case.seqs]
    pages = [(n + case.page_size - 1) // case.page_size for n in lengths]
    kv_indptr, kv_indices, last = flashinfer_page_lists(inputs.seq_pages, [0] * case.batch, pages,
                                                        lengths, case.page_size)
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device=device)
    wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
    wrapper.plan(inputs.cu_seqlens.cpu(), kv_indptr, kv_indices, last, case.num_q_heads,
                 case.num_kv_heads, case.head_dim, case.page_size, causal=True,
                 window_left=to_flashinfer(case.window_left), q_data_type=inputs.q.dtype,
                 kv_data_type=inputs.k_pool.dtype, sm_scale=softmax_scale(case))
    out = empty_out(inputs)

    def fn():
        wrapper.run(inputs.q, (inputs.k_pool, inputs.v_pool), out=out)

    return Prepared(fn, lambda: out, "paged 16 NHD, planned once; no sinks", False,
                    poisoner(out), [workspace, wrapper])


# --------------------------------------------------------------------------------------
# The variants a run times, in the order of the table.
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Variant:
    """``key`` selects it on the command line (``--skip``); ``role`` is ``tight``,
    ``control``, ``ours`` or ``peer``."""

    name: str
    key: str
    role: str
    build: Callable


VARIANTS = (
    Variant("swattn tight", "tight", "tight", lambda i: ours(i, bounds="tight", layout="window")),
    Variant("swattn tight (control)", "control", "control",
            lambda i: ours(i, bounds="tight", layout="window", control=True)),
    Variant("swattn tight, Triton kernel", "triton", "ours",
            lambda i: ours(i, bounds="tight", layout="window", hopper=False)),
    Variant("swattn tight, Hopper path", "hopper", "ours",
            lambda i: ours(i, bounds="tight", layout="window", hopper=True)),
    Variant("swattn tight, full layout", "tight-full", "ours",
            lambda i: ours(i, bounds="tight", layout="full")),
    Variant("swattn skip, full layout", "skip", "ours", lambda i: ours(i, bounds="skip", layout="full")),
    Variant("swattn deterministic", "det", "ours", lambda i: ours(i, deterministic=True)),
    Variant("swattn deterministic skip, full layout", "det-skip", "ours",
            lambda i: ours(i, bounds="skip", layout="full", deterministic=True)),
    Variant("SGLang, window layout", "sglang", "peer", lambda i: sglang_extend(i, layout="window")),
    Variant("SGLang, full layout", "sglang-full", "peer", lambda i: sglang_extend(i, layout="full")),
    Variant("SGLang unified", "sglang-unified", "peer", sglang_unified),
    Variant("vLLM unified", "vllm", "peer", vllm_unified),
    Variant("FlexAttention", "flex", "peer", flex),
    Variant("FlashInfer", "flashinfer", "peer", flashinfer),
)


def select(skip=(), variants=None, known=None):
    """``variants`` (default the extend ones) minus those whose key is in ``skip``;
    ValueError on a key that is in neither ``variants`` nor ``known``."""
    variants = VARIANTS if variants is None else variants
    keys = {v.key for v in variants} | set(known or ())
    unknown = set(skip) - keys
    if unknown:
        raise ValueError(f"unknown variant(s) {sorted(unknown)}; known: {sorted(keys)}")
    return [v for v in variants if v.key not in set(skip)]
