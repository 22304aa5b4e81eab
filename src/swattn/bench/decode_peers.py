"""The peers' decode kernels for ``swattn bench``, each called as its engine calls it
(``docs/peers.md``): SGLang's Triton decode over its token pool, vLLM's unified
attention over pages of 16, FlexAttention on dense tensors with a block mask, FlashInfer's
paged decode wrapper. Each returns a :class:`swattn.bench.peers.Prepared` or raises
:class:`swattn.bench.peers.Skip` saying why it cannot run the case.
"""

from __future__ import annotations

import torch

from ..window import to_flash_attn, to_flashinfer
from .decode_inputs import need_device
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

SGLANG_MAX_KV_SPLITS = 8  # its default --triton-attention-num-kv-splits
VLLM_SEGMENTS = 16  # NUM_PAR_SOFTMAX_SEGMENTS of vLLM's triton_attn.py
VLLM_MIN_GRID_2D = 128  # MIN_LAUNCH_GRID_SIZE_2D of vLLM's triton_attn.py
FLEX_MAX_ELEMENTS = 1 << 31  # torch 2.11's flex decode does not compile at 2^31 K elements


# SGLang 0.5.23: decode_attention_fwd over its token pool --------------------------------

SGLANG_DECODE = "sglang.kernels.ops.attention.decode_attention"
_SGLANG_METADATA = "sglang.kernels.ops.attention.metadata"


def sglang_num_kv_splits(seq_lens, num_q_heads, num_kv_heads, max_kv_splits, core_count):
    """``num_kv_splits [B] int32`` as SGLang's Triton backend fills it (``get_num_kv_splits``):
    its metadata helper ``get_num_kv_splits_triton`` over ``seq_lens`` on ``core_count`` SMs,
    or ``max_kv_splits`` everywhere when there is no device to size against."""
    batch = seq_lens.shape[0]
    out = torch.empty(batch, dtype=torch.int32, device=seq_lens.device)
    if core_count <= 0:
        return out.fill_(max_kv_splits)
    meta = import_peer(_SGLANG_METADATA)
    uneven = torch.zeros(1, dtype=torch.int32, device=seq_lens.device)
    schedule = 256 if batch < 256 else 1 << (batch - 1).bit_length()
    meta.get_num_kv_splits_triton[(1,)](
        out, seq_lens, batch, 1, num_q_heads, num_kv_heads, max_kv_splits, core_count,
        MAX_NUM_SEQ=schedule, uneven_batch_ptr=uneven)
    return out


def _core_count(device):
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 0


def sglang_decode(inputs, *, core_count=None):
    """SGLang ``decode_attention_fwd`` as its Triton backend calls it: the token pool
    (``k_rows``/``v_rows``, a page-size-1 view of the same memory), ``kv_indptr`` /
    ``kv_indices`` listing each sequence's last **W** = window_left + 1 keys (its backend's
    ``update_sliding_window_buffer`` lists ``min(S, W - 1)``: one key short; W here so every
    variant computes the same function), ``max_kv_splits=8``, ``num_kv_splits`` from its
    metadata helper over the sequence lengths (as its backend's ``forward_decode`` uses
    ``forward_metadata.num_kv_splits`` on window layers too), PDL on sm90+, sinks.

    On S the index list of a sequence is its window slots followed by its sparse pool rows
    (the pool lives in the same flat buffer), so the kernel joins both in one softmax, as
    swattn does; over its latent cache the values come from the key tiles (``has_mla=True``,
    as its MLA backend calls it), else V is its own buffer. Index building is not timed.
    """
    need_device(inputs)
    mod = import_peer(SGLANG_DECODE)
    case = inputs.case
    device = inputs.q.device
    lists = []
    for b, s in enumerate(case.seq_lens):
        part = [inputs.slots(b, case.lowest_key(s), s) + inputs.cache_row0]
        if inputs.sparse is not None:
            row = inputs.sparse[2][b]
            part.append(row[row >= 0].to(torch.int64) + inputs.sparse_row0)
        lists.append(torch.cat(part))
    lengths = torch.tensor([len(x) for x in lists], dtype=torch.int64)
    kv_indptr = torch.zeros(case.batch + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(lengths, 0)
    kv_indptr = kv_indptr.to(device)
    kv_indices = torch.cat(lists).to(device=device, dtype=torch.int64)
    cores = _core_count(device) if core_count is None else core_count
    num_kv_splits = sglang_num_kv_splits(inputs.seq_lens, case.num_q_heads, case.num_kv_heads,
                                         SGLANG_MAX_KV_SPLITS, cores)
    attn_logits = torch.empty(case.batch, case.num_q_heads, SGLANG_MAX_KV_SPLITS, case.head_dim_v,
                              dtype=torch.float32, device=device)
    attn_lse = torch.empty(case.batch, case.num_q_heads, SGLANG_MAX_KV_SPLITS, dtype=torch.float32,
                           device=device)
    uneven = torch.zeros(1, dtype=torch.int32, device=device)
    use_pdl = device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9
    out = empty_out(inputs)

    def fn():
        mod.decode_attention_fwd(
            inputs.q, inputs.k_rows, inputs.v_rows, out, kv_indptr, kv_indices, attn_logits,
            attn_lse, num_kv_splits, SGLANG_MAX_KV_SPLITS, softmax_scale(case), 1.0, 1.0,
            logit_cap=0.0, sinks=inputs.sinks, has_mla=case.latent, use_pdl=use_pdl, page_size=1,
            uneven_batch=uneven)

    what = "all keys" if case.window_left is None else f"last W={case.window_left + 1} keys"
    note = (f"token pool (page 1), {what} per sequence in kv_indices"
            + (" + its sparse rows" if inputs.sparse is not None else "")
            + f"; max_kv_splits {SGLANG_MAX_KV_SPLITS}, num_kv_splits from its helper"
            + (" (PDL)" if use_pdl else "") + "; index build not timed")
    return Prepared(fn, lambda: out, note, True, poisoner(out),
                    [kv_indptr, kv_indices, num_kv_splits, attn_logits, attn_lse, uneven])


def _fp8_copy(inputs, fp8, sinks):
    """A peer's fp8 copy of the case's cache under one scale for the tensor, and the float64
    reference over it on the first 4 sequences (``sinks``: the case's, or None for a peer
    that drops them): ``(k, v, k_scale, v_scale, want)``."""
    from .. import reference
    case = inputs.case
    k, v, k_scale, v_scale = fp8_cache(inputs.k_cache, inputs.v_cache, fp8, per_head=False)

    def want():
        n = min(4, case.batch)
        return reference.decode_attention(
            inputs.q[:n], k, v, inputs.block_table_window[:n], inputs.seq_lens[:n],
            window_left=case.window_left, sinks=sinks, k_scale=k_scale, v_scale=v_scale)
    return k, v, k_scale, v_scale, want


# vLLM 0.33.0: unified_attention, decode -----------------------------------------------

def vllm_capture_sizes(max_size=512):
    """vLLM's default CUDA-graph capture sizes: 1, 2, 4, then steps of 8 to 256, of 16 on."""
    return [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, max_size + 1, 16))


def vllm_threshold_3d(num_kv_heads):
    """``seq_threshold_3D`` as vLLM's ``triton_attn.py`` sets it under CUDA graphs: 128 /
    Hkv, moved to the nearest capture size."""
    target = VLLM_MIN_GRID_2D // num_kv_heads
    return min(vllm_capture_sizes(), key=lambda x: abs(x - target))


def vllm_decode(inputs, *, fp8=None):
    """vLLM ``unified_attention`` on single-token queries over ``[pages, 16, Hkv, D]``,
    ``window_size=(W-1, 0)``, sinks, with the split-KV scratch its ``triton_attn.py``
    allocates: ``seq_threshold_3D`` rows (128 / Hkv at the nearest capture size) of 16 softmax
    segments; the kernel takes its 3D (split-KV) path when ``B`` query blocks fit under that
    threshold, else its 2D path (the note says which).

    Pages wholly below the window map to page 0, a null page of finite data (vLLM's null
    block): its first tile may start a page below the window. Two spare -1 columns keep its
    last tile's table read inside the table. It has one head size for K and V and no sparse
    rows: S is skipped.

    ``fp8`` (a torch fp8 dtype): over an fp8 copy of the cache with one scale for the tensor,
    its ``FP8_PER_TENSOR`` mode (``k_descale``/``v_descale``), checked against the reference
    over the same fp8 cache.
    """
    need_device(inputs)
    case = inputs.case
    if case.page_size != 16:
        raise Skip(f"vLLM's Triton backend runs block size 16, this pool has {case.page_size}")
    if case.head_dim != case.head_dim_v or inputs.sparse is not None:
        raise Skip(f"vLLM's kernel has one head size for K and V "
                   f"({case.head_dim}/{case.head_dim_v} here) and no separate sparse rows")
    mod = import_peer("vllm.v1.attention.ops.triton_unified_attention")
    device = inputs.q.device
    table = inputs.block_table_full.clone()
    width = table.shape[1]
    below = (torch.arange(width, device=device)[None, :]
             < (inputs.window_starts() // case.page_size)[:, None])
    table[below] = inputs.null_page
    table = torch.cat([table, torch.full((case.batch, 2), -1, dtype=torch.int32, device=device)], 1)
    cu_seqlens_q = torch.arange(case.batch + 1, dtype=torch.int32, device=device)
    ones = torch.ones(1, dtype=torch.float32, device=device)
    threshold = vllm_threshold_3d(case.num_kv_heads)
    padded = 1 << (case.head_dim - 1).bit_length()
    segm_out = torch.empty(threshold, case.num_q_heads, VLLM_SEGMENTS, padded, dtype=torch.float32,
                           device=device)
    segm_max = torch.empty(threshold, case.num_q_heads, VLLM_SEGMENTS, dtype=torch.float32,
                           device=device)
    segm_sum = torch.empty_like(segm_max)
    # One query per sequence: one query block each, so the 3D path runs while B <= threshold.
    path = ("3D split-KV, 16 segments" if case.batch <= threshold
            else "2D (batch over the 3D threshold)")
    left, _ = to_flash_attn(case.window_left)
    window = (left, 0) if case.window_left is not None else (-1, -1)
    out = empty_out(inputs)
    k_cache, v_cache, k_descale, v_descale, mode, want = (inputs.k_cache, inputs.v_cache, ones,
                                                          ones, {}, None)
    if fp8 is not None:
        k_cache, v_cache, k_descale, v_descale, want = _fp8_copy(inputs, fp8, inputs.sinks)
        mode = {"kv_quant_mode":
                import_peer("vllm.v1.kv_cache_interface").KVQuantMode.FP8_PER_TENSOR}

    def fn():
        mod.unified_attention(
            q=inputs.q, k=k_cache, v=v_cache, out=out, cu_seqlens_q=cu_seqlens_q,
            max_seqlen_q=1, seqused_k=inputs.seq_lens, max_seqlen_k=max(case.seq_lens),
            softmax_scale=softmax_scale(case), causal=True, window_size=window, block_table=table,
            softcap=0, q_descale=None, k_descale=k_descale, v_descale=v_descale,
            seq_threshold_3D=threshold, num_par_softmax_segments=VLLM_SEGMENTS,
            softmax_segm_output=segm_out, softmax_segm_max=segm_max, softmax_segm_expsum=segm_sum,
            sinks=inputs.sinks, **mode)

    note = f"paged 16, pages below the window -> null page; {path} (threshold {threshold})"
    if fp8 is not None:
        note += (f"; {str(fp8)[6:]} cache, one scale for the tensor (FP8_PER_TENSOR); checked "
                 "against the reference over the same fp8 cache")
    return Prepared(fn, lambda: out, note, True, poisoner(out),
                    [table, cu_seqlens_q, ones, segm_out, segm_max, segm_sum, k_cache, v_cache],
                    reference=want, kv_bytes=1 if fp8 is not None else 2)


# FlexAttention: compiled, dense -------------------------------------------------------

def flex_chunks(batch, elements_per_seq, limit=FLEX_MAX_ELEMENTS):
    """Fewest equal batch chunks whose K (``chunk * elements_per_seq`` elements) stays under
    ``limit``: torch 2.11's flex decode fails to compile from 2^31 K elements."""
    for n in range(1, batch + 1):
        if batch % n == 0 and (batch // n) * elements_per_seq < limit:
            return n
    return batch


def flex_decode(inputs):
    """FlexAttention (``torch.compile``d), dense and unpaged: Q ``[B, Hq, 1, D]``, K/V
    ``[B, Hkv, S, D]`` gathered outside the timed region (positions below the window left
    zero: their cache rows are NaN, freed), block mask ``k >= S - 1 - L`` (and under a chunk
    ``k // C == (S - 1) // C``), ``enable_gqa``; the batch split into as few equal launches as
    keep K under 2^31 elements. No sinks (and on S no sparse keys): a different function
    where the workload has them."""
    need_cuda(inputs)
    case = inputs.case
    if not case.uniform:
        raise Skip("ragged batch: the dense FlexAttention adapter needs one context per case")
    compiled, create_block_mask = compiled_flex()
    seq_len = case.seq_lens[0]
    lo = case.lowest_key(seq_len)
    window_left, chunk = case.window_left, case.attention_chunk
    hkv = case.num_kv_heads
    slots = torch.stack([inputs.slots(b, lo, seq_len) for b in range(case.batch)])  # [B, W]
    dense = []
    for cache, dim in ((inputs.k_cache, case.head_dim), (inputs.v_cache, case.head_dim_v)):
        full = torch.zeros(case.batch, hkv, seq_len, dim, dtype=inputs.q.dtype,
                           device=inputs.q.device)
        full[:, :, lo:] = cache.view(-1, hkv, dim)[slots].permute(0, 2, 1, 3)
        dense.append(full)
    k, v = dense
    q = inputs.q.unsqueeze(2)  # [B, Hq, 1, D]

    block_mask = create_block_mask(causal_mask_mod(seq_len - 1, window_left, chunk), B=None,
                                   H=None, Q_LEN=1, KV_LEN=seq_len, device=inputs.q.device)
    chunks = flex_chunks(case.batch, hkv * seq_len * max(case.head_dim, case.head_dim_v),
                         FLEX_MAX_ELEMENTS)
    step = case.batch // chunks
    state = {}

    def fn():
        state["outs"] = [compiled(q[i:i + step], k[i:i + step], v[i:i + step],
                                  block_mask=block_mask, scale=softmax_scale(case),
                                  enable_gqa=True)
                         for i in range(0, case.batch, step)]

    def result():
        return torch.cat(state["outs"])[:, :, 0]

    note = (f"dense [B,H,S,D], block mask{' with the chunk' if chunk is not None else ''}; "
            f"{chunks} launch(es) of batch {step}; output allocated by flex (not poisoned)")
    return Prepared(fn, result, note, False, None, [q, k, v, block_mask], applies_sparse=False)


# FlashInfer ---------------------------------------------------------------------------

def flashinfer_decode(inputs, *, fp8=None):
    """FlashInfer ``BatchDecodeWithPagedKVCacheWrapper`` (NHD, page 16,
    ``use_tensor_cores=True``), planned once, ``window_left=W-1``, over each sequence's pages
    from the one holding its first window key (as engines hand window layers their trimmed
    page lists). Its FA2/FA3 paths on the H200 ignore sinks (peers/README.md): run without
    them, marked as a different function where the workload has sinks. S is skipped (head
    dims 576/512 differ, sparse rows). ``fp8`` (a torch fp8 dtype): over an fp8 copy of the
    cache with one scale for the tensor (its ``kv_data_type`` and ``k_scale``/``v_scale``,
    queries in their own dtype), checked against the reference over the same fp8 cache."""
    need_cuda(inputs)
    case = inputs.case
    if case.head_dim != case.head_dim_v or inputs.sparse is not None:
        raise Skip("its decode wrapper takes one head dim for K and V and no sparse rows")
    fi = import_peer("flashinfer")
    device = inputs.q.device
    size = case.page_size
    firsts = [case.lowest_key(s) // size for s in case.seq_lens]
    ends = [-(-s // size) for s in case.seq_lens]
    indptr, indices, last = flashinfer_page_lists(inputs.seq_pages, firsts, ends, case.seq_lens,
                                                  size)
    k_cache, v_cache, scales, want = inputs.k_cache, inputs.v_cache, {}, None
    if fp8 is not None:
        k_cache, v_cache, k_scale, v_scale, want = _fp8_copy(inputs, fp8, None)
        scales = {"k_scale": k_scale.item(), "v_scale": v_scale.item()}
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device=device)
    wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=True)
    wrapper.plan(indptr, indices, last, case.num_q_heads, case.num_kv_heads, case.head_dim, size,
                 window_left=to_flashinfer(case.window_left), q_data_type=inputs.q.dtype,
                 kv_data_type=k_cache.dtype, sm_scale=softmax_scale(case))
    out = empty_out(inputs)

    def fn():
        wrapper.run(inputs.q, (k_cache, v_cache), out=out, **scales)

    note = "paged 16 NHD, window pages, planned once; no sinks"
    if fp8 is not None:
        note += f"; {str(fp8)[6:]} cache, one scale for the tensor (k_scale, v_scale)"
    return Prepared(fn, lambda: out, note, False, poisoner(out),
                    [workspace, wrapper, indices, indptr, last, k_cache, v_cache],
                    reference=want, kv_bytes=1 if fp8 is not None else 2)
