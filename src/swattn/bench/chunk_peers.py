"""The peers of chunked local attention (L4, C-L4), each called as its engine serves Llama 4's
local layers (``docs/peers.md``):

* vLLM cuts every sequence at the chunk boundaries into *virtual batches*, each piece a
  sequence of its own whose keys start at its chunk's first page, and runs its ordinary
  ``unified_attention`` over them (``make_local_attention_virtual_batches`` under its
  chunked-local-attention backend); :func:`virtual_batches` builds the same pieces.
* FlashInfer has no chunk: the same pieces as instances of its batch prefill and decode
  wrappers.
* FlashAttention 3 takes ``attention_chunk`` (``flash_attn_interface``); FlashAttention 2
  does not.
* FlexAttention: :func:`.extend_peers.flex` and :func:`.decode_peers.flex_decode` with the
  chunk in the block mask.

Each returns a :class:`~.peers.Prepared` or raises :class:`~.peers.Skip` saying why it cannot
run the case. The pieces are built outside the timed region (vLLM rebuilds them at every
step, and runs this backend without CUDA graphs: the rows time its kernel alone).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from ..window import to_flash_attn, to_flashinfer
from .decode_inputs import need_device
from .decode_peers import VLLM_SEGMENTS, vllm_threshold_3d
from .peers import (
    Prepared,
    Skip,
    empty_out,
    flashinfer_page_lists,
    import_peer,
    need_cuda,
    poisoner,
    softmax_scale,
)

_VLLM = "vllm.v1.attention.ops.triton_unified_attention"


# --------------------------------------------------------------------------------------
# Virtual batches: each sequence cut at the chunk boundaries.
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class VirtualBatches:
    """The pieces of a batch that each lie in one chunk, each a sequence of its own, in the
    batch's token order. Piece ``v`` holds ``query_lens[v]`` new tokens of sequence
    ``seqs[v]``; its keys are the ``key_lens[v]`` positions from its chunk's first,
    ``key_starts[v]``, through its last new token. ``block_table`` ``[V, C / page_size]``
    int32 maps them: the sequence's pages from its chunk's first (-1 past the sequence's
    table)."""

    seqs: tuple[int, ...]
    query_lens: tuple[int, ...]
    key_starts: tuple[int, ...]
    key_lens: tuple[int, ...]
    block_table: torch.Tensor

    def cu_seqlens_q(self):
        """``[V + 1]`` offsets of the pieces' new tokens (host list)."""
        out = [0]
        for n in self.query_lens:
            out.append(out[-1] + n)
        return out

    def prefix_lens(self):
        """Keys of each piece before its new tokens (host list)."""
        return [k - q for k, q in zip(self.key_lens, self.query_lens)]


def virtual_batches(query_lens, seq_lens, chunk, page_size, block_table):
    """The :class:`VirtualBatches` of a batch whose sequence ``b`` ends with
    ``query_lens[b]`` new tokens of its ``seq_lens[b]`` (the new ones included), as vLLM's
    chunked-local-attention backend builds them: the new tokens cut at every multiple of
    ``chunk``, each piece seeing the keys from its chunk's first position. A key at position
    j of a piece is the piece's key ``j - key_start``: its page is the sequence's page
    ``key_start / page_size + (j - key_start) / page_size``, so ``chunk`` must be a multiple
    of ``page_size`` (as vLLM asserts). ``block_table`` ``[B, pages]``: the sequences' pages."""
    if chunk % page_size:
        raise ValueError(f"virtual batches need the chunk ({chunk}) to be a multiple of the "
                         f"page size ({page_size})")
    seqs, q_lens, starts, k_lens = [], [], [], []
    for b, (new, total) in enumerate(zip(query_lens, seq_lens)):
        pos = total - new
        while pos < total:
            start = pos // chunk * chunk
            end = min(total, start + chunk)
            seqs.append(b)
            q_lens.append(end - pos)
            starts.append(start)
            k_lens.append(end - start)
            pos = end
    pages = chunk // page_size
    pad = torch.full((block_table.shape[0], pages), -1, dtype=block_table.dtype,
                     device=block_table.device)
    padded = torch.cat([block_table, pad], dim=1)
    rows = torch.tensor(seqs, dtype=torch.int64, device=block_table.device)
    first = torch.tensor([s // page_size for s in starts], dtype=torch.int64,
                         device=block_table.device)
    cols = first[:, None] + torch.arange(pages, device=block_table.device)[None, :]
    table = padded[rows[:, None], cols].to(torch.int32)
    return VirtualBatches(tuple(seqs), tuple(q_lens), tuple(starts), tuple(k_lens), table)


def _chunk_of(inputs):
    chunk = inputs.case.attention_chunk
    if chunk is None:
        raise Skip("the case has no attention_chunk")
    return chunk


def _case_batches(inputs, chunk, decode):
    """The case's :func:`virtual_batches`: extend's new tokens of each sequence, or decode's
    one a sequence, cut where a chunk starts; a Skip where they cannot be cut."""
    case = inputs.case
    if decode:
        query_lens, seq_lens = [1] * case.batch, list(case.seq_lens)
    else:
        query_lens, seq_lens = [e for _, e in case.seqs], [p + e for p, e in case.seqs]
    try:
        return virtual_batches(query_lens, seq_lens, chunk, case.page_size, inputs.seq_pages)
    except ValueError as exc:
        raise Skip(str(exc)) from None


def _need_vllm_pages(case):
    if case.page_size != 16:
        raise Skip(f"vLLM's Triton backend runs block size 16, this pool has {case.page_size}")


def _spare(table):
    """``table`` with two spare -1 columns: vLLM's last 32-key tile reads the entry a page
    past a sequence's end (masked loads after it), which must lie inside the table."""
    spare = torch.full((table.shape[0], 2), -1, dtype=torch.int32, device=table.device)
    return torch.cat([table, spare], dim=1)


def _window(case):
    left, _ = to_flash_attn(case.window_left)
    return (left, 0) if case.window_left is not None else (-1, -1)


# --------------------------------------------------------------------------------------
# vLLM 0.33.0: unified_attention over the virtual batches.
# --------------------------------------------------------------------------------------

def vllm_chunk_extend(inputs):
    """vLLM's chunked local attention in extend: :func:`virtual_batches` of the case (built
    once, not timed), then ``unified_attention`` (its 2D path) over them, pages of 16, the
    new tokens already in their pages, no chunk in the call (each piece sees all its keys,
    causally), ``window_size`` the case's."""
    need_device(inputs)
    case = inputs.case
    chunk = _chunk_of(inputs)
    _need_vllm_pages(case)
    mod = import_peer(_VLLM)
    device = inputs.q.device
    vb = _case_batches(inputs, chunk, decode=False)
    table = _spare(vb.block_table)
    cu_q = torch.tensor(vb.cu_seqlens_q(), dtype=torch.int32, device=device)
    seqused_k = torch.tensor(vb.key_lens, dtype=torch.int32, device=device)
    ones = torch.ones(1, dtype=torch.float32, device=device)
    out = empty_out(inputs)

    def fn():
        mod.unified_attention(
            q=inputs.q, k=inputs.k_pool, v=inputs.v_pool, out=out, cu_seqlens_q=cu_q,
            max_seqlen_q=max(vb.query_lens), seqused_k=seqused_k, max_seqlen_k=max(vb.key_lens),
            softmax_scale=softmax_scale(case), causal=True, window_size=_window(case),
            block_table=table, softcap=0, q_descale=None, k_descale=ones, v_descale=ones,
            sinks=inputs.sinks)

    note = (f"paged 16, {len(vb.seqs)} virtual batches of at most {chunk} keys (built once, "
            "not timed; its backend runs without CUDA graphs)")
    return Prepared(fn, lambda: out, note, True, poisoner(out), [table, cu_q, seqused_k, ones])


def vllm_chunk_decode(inputs):
    """vLLM's chunked local attention in decode: one virtual batch a sequence (its new token
    and the keys of its chunk up to it), ``unified_attention`` with the split-KV scratch its
    ``triton_attn.py`` allocates (as :func:`.decode_peers.vllm_decode`: its 3D path while
    the batch is under ``seq_threshold_3D``)."""
    need_device(inputs)
    case = inputs.case
    chunk = _chunk_of(inputs)
    _need_vllm_pages(case)
    mod = import_peer(_VLLM)
    device = inputs.q.device
    vb = _case_batches(inputs, chunk, decode=True)
    table = _spare(vb.block_table)
    cu_q = torch.arange(case.batch + 1, dtype=torch.int32, device=device)
    seqused_k = torch.tensor(vb.key_lens, dtype=torch.int32, device=device)
    ones = torch.ones(1, dtype=torch.float32, device=device)
    threshold = vllm_threshold_3d(case.num_kv_heads)
    padded = 1 << (case.head_dim - 1).bit_length()
    segm_out = torch.empty(threshold, case.num_q_heads, VLLM_SEGMENTS, padded, dtype=torch.float32,
                           device=device)
    segm_max = torch.empty(threshold, case.num_q_heads, VLLM_SEGMENTS, dtype=torch.float32,
                           device=device)
    segm_sum = torch.empty_like(segm_max)
    path = ("3D split-KV, 16 segments" if case.batch <= threshold
            else "2D (batch over the 3D threshold)")
    out = empty_out(inputs)

    def fn():
        mod.unified_attention(
            q=inputs.q, k=inputs.k_cache, v=inputs.v_cache, out=out, cu_seqlens_q=cu_q,
            max_seqlen_q=1, seqused_k=seqused_k, max_seqlen_k=max(vb.key_lens),
            softmax_scale=softmax_scale(case), causal=True, window_size=_window(case),
            block_table=table, softcap=0, q_descale=None, k_descale=ones, v_descale=ones,
            seq_threshold_3D=threshold, num_par_softmax_segments=VLLM_SEGMENTS,
            softmax_segm_output=segm_out, softmax_segm_max=segm_max,
            softmax_segm_expsum=segm_sum, sinks=inputs.sinks)

    note = (f"paged 16, one virtual batch a sequence from its chunk's first page (built once, "
            f"not timed); {path} (threshold {threshold})")
    return Prepared(fn, lambda: out, note, True, poisoner(out),
                    [table, cu_q, seqused_k, ones, segm_out, segm_max, segm_sum])


# --------------------------------------------------------------------------------------
# FlashInfer: the same pieces as instances of its batch wrappers.
# --------------------------------------------------------------------------------------

def _instance_pages(vb, page_size):
    pages = [-(-n // page_size) for n in vb.key_lens]
    return flashinfer_page_lists(vb.block_table, [0] * len(pages), pages, list(vb.key_lens),
                                 page_size)


def flashinfer_chunk_extend(inputs):
    """FlashInfer ``BatchPrefillWithPagedKVCacheWrapper`` (NHD), planned once over the
    :func:`virtual_batches` of the case, one instance a piece (its pages from its chunk's
    first), causal, ``window_left`` the case's. No sinks on its H200 paths
    (peers/README.md)."""
    need_cuda(inputs)
    case = inputs.case
    chunk = _chunk_of(inputs)
    fi = import_peer("flashinfer")
    vb = _case_batches(inputs, chunk, decode=False)
    indptr, indices, last = _instance_pages(vb, case.page_size)
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device=inputs.q.device)
    wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
    wrapper.plan(torch.tensor(vb.cu_seqlens_q(), dtype=torch.int32), indptr, indices, last,
                 case.num_q_heads, case.num_kv_heads, case.head_dim, case.page_size, causal=True,
                 window_left=to_flashinfer(case.window_left), q_data_type=inputs.q.dtype,
                 kv_data_type=inputs.k_pool.dtype, sm_scale=softmax_scale(case))
    out = empty_out(inputs)

    def fn():
        wrapper.run(inputs.q, (inputs.k_pool, inputs.v_pool), out=out)

    note = f"paged NHD, {len(vb.seqs)} instances (one a chunk piece), planned once; no sinks"
    return Prepared(fn, lambda: out, note, False, poisoner(out), [workspace, wrapper, indices])


def flashinfer_chunk_decode(inputs):
    """FlashInfer ``BatchDecodeWithPagedKVCacheWrapper`` (NHD, ``use_tensor_cores=True``),
    planned once, one instance a sequence over the pages of its chunk up to its new token,
    ``window_left`` the case's. No sinks on its H200 paths."""
    need_cuda(inputs)
    case = inputs.case
    chunk = _chunk_of(inputs)
    fi = import_peer("flashinfer")
    vb = _case_batches(inputs, chunk, decode=True)
    indptr, indices, last = _instance_pages(vb, case.page_size)
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device=inputs.q.device)
    wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=True)
    wrapper.plan(indptr, indices, last, case.num_q_heads, case.num_kv_heads, case.head_dim,
                 case.page_size, window_left=to_flashinfer(case.window_left),
                 q_data_type=inputs.q.dtype, kv_data_type=inputs.k_cache.dtype,
                 sm_scale=softmax_scale(case))
    out = empty_out(inputs)

    def fn():
        wrapper.run(inputs.q, (inputs.k_cache, inputs.v_cache), out=out)

    note = "paged NHD, one instance a sequence over its chunk's pages, planned once; no sinks"
    return Prepared(fn, lambda: out, note, False, poisoner(out), [workspace, wrapper, indices])


# --------------------------------------------------------------------------------------
# FlashAttention 3: attention_chunk.
# --------------------------------------------------------------------------------------

def flash_attn_kvcache():
    """FlashAttention's ``flash_attn_with_kvcache`` where it takes ``attention_chunk`` (FA3,
    ``flash_attn_interface``); else Skip saying what is installed."""
    tried = []
    for name in ("flash_attn_interface", "flash_attn"):
        try:
            mod = import_peer(name)
        except Skip as skip:
            tried.append(str(skip))
            continue
        fn = getattr(mod, "flash_attn_with_kvcache", None)
        if fn is not None and "attention_chunk" in inspect.signature(fn).parameters:
            return fn
        version = getattr(mod, "__version__", "")
        tried.append(f"{name} {version}".strip() + " has no attention_chunk")
    raise Skip("FlashAttention 3 not installed (" + "; ".join(tried) + ")")


def _null_below(table, starts, page_size, null_page):
    """``table`` with every page wholly below its row's first key mapped to the null page."""
    below = (torch.arange(table.shape[1], device=table.device)[None, :]
             < (starts // page_size)[:, None])
    out = table.clone()
    out[below] = null_page
    return out


def flash_attn_chunk_extend(inputs):
    """FlashAttention 3 ``flash_attn_with_kvcache`` over the paged pool (new tokens already in
    their pages): ``cu_seqlens_q``, ``cache_seqlens`` P + E, ``page_table`` (pages below the
    first new token's chunk mapped to the null page), causal, ``attention_chunk`` C and the
    case's window. Its output is its own (not poisoned)."""
    need_cuda(inputs)
    case = inputs.case
    chunk = _chunk_of(inputs)
    fn_kv = flash_attn_kvcache()
    device = inputs.q.device
    starts = torch.tensor([case.lowest_key(p) for p, _ in case.seqs], dtype=torch.int64,
                          device=device)
    table = _null_below(inputs.seq_pages, starts, case.page_size, inputs.null_page)
    lens = torch.tensor([p + e for p, e in case.seqs], dtype=torch.int32, device=device)
    cu = inputs.cu_seqlens
    state = {}

    def fn():
        state["out"] = fn_kv(inputs.q, inputs.k_pool, inputs.v_pool, cache_seqlens=lens,
                             page_table=table, cu_seqlens_q=cu,
                             max_seqlen_q=max(e for _, e in case.seqs),
                             softmax_scale=softmax_scale(case), causal=True,
                             window_size=_window(case), attention_chunk=chunk)

    note = ("paged, attention_chunk; no sinks passed; output allocated by FlashAttention (not "
            "poisoned)")
    return Prepared(fn, lambda: state["out"], note, False, None, [table, lens])


def flash_attn_chunk_decode(inputs):
    """FlashAttention 3 ``flash_attn_with_kvcache`` in decode: one query a sequence
    (``[B, 1, Hq, D]``), ``cache_seqlens`` S, ``page_table`` (pages below the chunk mapped to
    the null page), causal, ``attention_chunk`` C and the case's window."""
    need_cuda(inputs)
    case = inputs.case
    chunk = _chunk_of(inputs)
    fn_kv = flash_attn_kvcache()
    table = _null_below(inputs.block_table_full, inputs.window_starts(), case.page_size,
                        inputs.null_page)
    q = inputs.q.unsqueeze(1)
    state = {}

    def fn():
        state["out"] = fn_kv(q, inputs.k_cache, inputs.v_cache, cache_seqlens=inputs.seq_lens,
                             page_table=table, softmax_scale=softmax_scale(case), causal=True,
                             window_size=_window(case), attention_chunk=chunk)

    note = ("paged, attention_chunk; no sinks passed; output allocated by FlashAttention (not "
            "poisoned)")
    return Prepared(fn, lambda: state["out"][:, 0], note, False, None, [table, q])
