"""The peers' extend adapters: each takes the case's :class:`~.extend_inputs.ExtendInputs`
(one paged pool of K/V that holds every sequence's prefix *and* its new tokens, as an
engine has written them before attention) and returns a :class:`~.peers.Prepared`. A
variant that cannot run here raises :class:`~.peers.Skip` with the reason.
"""

from __future__ import annotations

import torch

from ..window import to_flash_attn, to_flashinfer, to_sglang
from .peers import (
    Prepared,
    Skip,
    causal_mask_mod,
    compiled_flex,
    empty_out,
    flashinfer_page_lists,
    fp8_cache,
    import_peer,
    need_cuda,
    poisoner,
    softmax_scale,
)

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
        keep = (prefix if (layout == "full" or case.window_left is None)
                else min(prefix, case.window_left))
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


def sglang_extend(inputs, *, layout="window", verify=None):
    """SGLang ``extend_attention_fwd`` (two-stage, SKIP_TILE) as its Triton backend calls it.

    Window layout: ``kv_indices`` lists the last ``W-1`` prefix tokens (``window_kv_indptr``
    of its backend; its kernel counts positions from the list start, which keeps the
    window predicate since queries shift by the same amount). Full layout: the whole prefix
    (what the same kernel gets on a cache hit without the trimming); skipped where it is the
    same list. New tokens come from ``k``/``v``, the prefix from the token pool.
    ``verify``: a target verify's ``(custom mask, mask_indptr, note, reference, computes)``
    (tree_peers.sglang_verify), the mask replacing causality among the new tokens."""
    if verify is None:
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
    mask, mask_indptr, extra_note, reference, computes = verify or (None, None, "", None, None)

    def fn():
        mod.extend_attention_fwd(
            inputs.q, inputs.k, inputs.v, out, k_buffer, v_buffer, qo_indptr, kv_indptr,
            kv_indices, mask, True, mask_indptr, max_len_extend, 1.0, 1.0,
            sm_scale=softmax_scale(case), logit_cap=0.0,
            sliding_window_size=to_sglang(case.window_left), sinks=inputs.sinks,
            window_kv_offsets=offsets)

    note = (f"token pool (page 1), {layout} layout: {sum(len(x) for x in lists)} prefix indices"
            + extra_note)
    keep = [kv_indptr, kv_indices, qo_indptr, offsets] + ([] if verify is None else [mask_indptr])
    if verify is None:
        return Prepared(fn, lambda: out, note, True, poisoner(out), keep)
    return Prepared(fn, lambda: out, note, True, poisoner(out), keep, reference=reference,
                    computes=computes)


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

def _fp8_copy(inputs, fp8, sinks):
    """A peer's fp8 copy of the case's pool under one scale for the tensor, and the float64
    reference over it on the first sequence (``sinks``: the case's, or None for a peer that
    drops them): ``(k_pool, v_pool, k_scale, v_scale, want)``."""
    from .. import reference
    case = inputs.case
    k_pool, v_pool, k_scale, v_scale = fp8_cache(inputs.k_pool, inputs.v_pool, fp8,
                                                 per_head=False)

    def want():
        new = case.seqs[0][1]
        return reference.extend_attention(
            inputs.q[:new], inputs.k[:new], inputs.v[:new], k_pool, v_pool,
            inputs.block_table_window[:1], inputs.cu_seqlens[:2], inputs.prefix_lens[:1],
            window_left=case.window_left, sinks=sinks, k_scale=k_scale, v_scale=v_scale)
    return k_pool, v_pool, k_scale, v_scale, want


def vllm_unified(inputs, *, fp8=None):
    """vLLM ``unified_attention`` (2D path: multi-token queries) over the paged pool, new
    tokens already in their pages, ``window_size=(W-1, 0)``, sinks. ``fp8`` (a torch fp8
    dtype): over an fp8 copy of the pool with one scale for the tensor
    (``KVQuantMode.FP8_PER_TENSOR``), checked against the reference over the same pool.

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
    k_pool, v_pool, k_descale, v_descale, mode, want = (inputs.k_pool, inputs.v_pool, ones, ones,
                                                        {}, None)
    note = "paged 16, pages below the window -> null page"
    if fp8 is not None:
        k_pool, v_pool, k_descale, v_descale, want = _fp8_copy(inputs, fp8, inputs.sinks)
        mode = {"kv_quant_mode":
                import_peer("vllm.v1.kv_cache_interface").KVQuantMode.FP8_PER_TENSOR}
        note += (f"; {str(fp8)[6:]} pool, one scale for the tensor (FP8_PER_TENSOR); checked "
                 "against the reference over the same fp8 pool")

    def fn():
        mod.unified_attention(
            q=inputs.q, k=k_pool, v=v_pool, out=out, cu_seqlens_q=inputs.cu_seqlens,
            max_seqlen_q=max_q, seqused_k=seqused_k, max_seqlen_k=max_k,
            softmax_scale=softmax_scale(case), causal=True, window_size=window,
            block_table=table, softcap=0, q_descale=None, k_descale=k_descale,
            v_descale=v_descale, sinks=inputs.sinks, **mode)

    return Prepared(fn, lambda: out, note, True, poisoner(out),
                    [table, seqused_k, ones, k_pool, v_pool],
                    reference=want, kv_bytes=1 if fp8 is not None else 2)


# --------------------------------------------------------------------------------------
# PyTorch FlexAttention, compiled, dense Q/K/V per batch.
# --------------------------------------------------------------------------------------

def flex(inputs):
    """FlexAttention (``torch.compile``d), dense and unpaged: Q ``[B, Hq, E, D]``, K/V
    ``[B, Hkv, P+E, D]`` gathered from the pool outside the timed region (the whole
    sequence: the block mask, causal and ``q - k <= W-1``, and under a chunk ``k // C ==
    q // C``, skips the rest), ``enable_gqa``. It has no sinks: on a workload with sinks it
    computes a different function."""
    need_cuda(inputs)
    case = inputs.case
    window_left, chunk = case.window_left, case.attention_chunk
    return flex_dense(inputs, lambda prefix: causal_mask_mod(prefix, window_left, chunk),
                      "block mask" + (" with the chunk" if chunk is not None else ""))


def flex_dense(inputs, mask_mod_of, what):
    """FlexAttention over the dense, unpaged batch (one (prefix, new) a case): Q ``[B, Hq, E,
    D]``, K/V ``[B, Hkv, P+E, D]`` gathered from the pool outside the timed region, the block
    mask of ``mask_mod_of(prefix)``, ``enable_gqa``; ``what`` the mask, for the note."""
    case = inputs.case
    if not case.uniform:
        raise Skip("ragged batch: the dense FlexAttention adapter needs one (prefix, new) per case")
    compiled, create_block_mask = compiled_flex()
    prefix, new = case.seqs[0]
    total = prefix + new
    q = inputs.q.view(case.batch, new, case.num_q_heads, case.head_dim).transpose(1, 2).contiguous()
    keys = [inputs.slots(b, 0, total).to(inputs.q.device) for b in range(case.batch)]
    k_flat, v_flat = _token_pool(inputs)
    k = torch.stack([k_flat[s] for s in keys]).transpose(1, 2).contiguous()
    v = torch.stack([v_flat[s] for s in keys]).transpose(1, 2).contiguous()
    block_mask = create_block_mask(mask_mod_of(prefix), B=None, H=None, Q_LEN=new, KV_LEN=total,
                                   device=inputs.q.device)
    state = {}

    def fn():
        state["out"] = compiled(q, k, v, block_mask=block_mask, scale=softmax_scale(case),
                                enable_gqa=True)

    def result():
        return state["out"].transpose(1, 2).reshape(-1, case.num_q_heads, case.head_dim_v)

    note = f"dense [B,H,S,D], {what}; output allocated by flex (not poisoned)"
    return Prepared(fn, result, note, False, None, [q, k, v, block_mask])


# --------------------------------------------------------------------------------------
# FlashInfer, only where it imports.
# --------------------------------------------------------------------------------------

def flashinfer(inputs, *, fp8=None):
    """FlashInfer ``BatchPrefillWithPagedKVCacheWrapper`` (NHD, page 16), planned once,
    ``window_left=W-1``, over every page of each sequence (new tokens included). Its FA2/FA3
    paths on the H200 ignore sinks (peers/README.md), so it runs without them and is marked
    as computing a different function on workloads with sinks. ``fp8`` (a torch fp8 dtype):
    over an fp8 copy of the pool with one scale for the tensor (its ``kv_data_type`` and
    ``k_scale``/``v_scale``, queries in their own dtype), checked against the reference over
    the same fp8 pool."""
    need_cuda(inputs)
    fi = import_peer("flashinfer")
    case = inputs.case
    device = inputs.q.device
    lengths = [p + e for p, e in case.seqs]
    pages = [(n + case.page_size - 1) // case.page_size for n in lengths]
    kv_indptr, kv_indices, last = flashinfer_page_lists(inputs.seq_pages, [0] * case.batch, pages,
                                                        lengths, case.page_size)
    k_pool, v_pool, scales, want = inputs.k_pool, inputs.v_pool, {}, None
    note = "paged 16 NHD, planned once; no sinks"
    if fp8 is not None:
        k_pool, v_pool, k_scale, v_scale, want = _fp8_copy(inputs, fp8, None)
        scales = {"k_scale": k_scale.item(), "v_scale": v_scale.item()}
        note += f"; {str(fp8)[6:]} pool, one scale for the tensor (k_scale, v_scale)"
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device=device)
    wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
    wrapper.plan(inputs.cu_seqlens.cpu(), kv_indptr, kv_indices, last, case.num_q_heads,
                 case.num_kv_heads, case.head_dim, case.page_size, causal=True,
                 window_left=to_flashinfer(case.window_left), q_data_type=inputs.q.dtype,
                 kv_data_type=k_pool.dtype, sm_scale=softmax_scale(case))
    out = empty_out(inputs)

    def fn():
        wrapper.run(inputs.q, (k_pool, v_pool), out=out, **scales)

    return Prepared(fn, lambda: out, note, False, poisoner(out),
                    [workspace, wrapper, k_pool, v_pool], reference=want,
                    kv_bytes=1 if fp8 is not None else 2)
