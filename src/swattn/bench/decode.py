"""Decode rows of ``swattn bench``: inputs, reference check and variants of one decode case.

Everything else (graph capture, interleaved timing, the same-variant control's noise floor,
the L2 flush, the ceilings, the floor and roofline arithmetic) is the extend harness's
(:func:`swattn.bench.harness.run_case`, :mod:`swattn.bench.report`); this module only brings
what differs for one new token per sequence.

Inputs (:func:`build_inputs`), built with tensor operations on the device (C-B's cache is
64 x 32768 x 8 x 128 x 2 bytes x 2 = 8.6 GB):

* a paged cache (page 16) of random values, each sequence's pages in a random permutation of
  the pool; page 0 is a null page of finite data that belongs to nobody;
* NaN in every row no kernel may read: rows past each sequence's end in its last page,
  every page wholly below its window (an engine has freed them), one NaN page just before
  the cache (what a -1 page id would address) and one NaN row just after it;
* ``block_table_window``: -1 for pages wholly below the window and past the end (one spare
  column past every sequence's end); ``block_table_full`` maps every page of the sequence;
* sinks where the workload has them;
* for S, a sparse pool of ``2 K`` rows per sequence (K = 512 index entries) and
  ``idx [B, K]`` of distinct random rows of the sequence's share, ``K / 16`` entries -1 at
  random places; pool rows no index names are NaN, and so is the row just before the pool
  (what -1 would address).

The cache, the rows between and the sparse pool are views of one flat allocation per K and V
(``k_rows``/``v_rows`` ``[rows, Hkv, D]``): swattn gets the paged cache and a separate pool,
SGLang's token-pool kernel the flat rows with its index list over both.

Each variant's output is poisoned with NaN, then checked against the float64 reference
(``swattn.reference.decode_attention``) on the first :data:`CHECK_SEQS` sequences (NaN
anywhere in the output fails).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

import torch

from . import harness
from .peers import Prepared, Skip, Variant, _compiled_flex, control_module, import_peer
from ..window import to_flash_attn, to_flashinfer

CHECK_SEQS = 4  # sequences checked against the reference
SGLANG_MAX_KV_SPLITS = 8  # its default --triton-attention-num-kv-splits
VLLM_SEGMENTS = 16  # NUM_PAR_SOFTMAX_SEGMENTS of vLLM's triton_attn.py
VLLM_MIN_GRID_2D = 128  # MIN_LAUNCH_GRID_SIZE_2D of vLLM's triton_attn.py
FLEX_MAX_ELEMENTS = 1 << 31  # torch 2.11's flex decode does not compile at 2^31 K elements


# --------------------------------------------------------------------------------------
# Inputs.
# --------------------------------------------------------------------------------------

@dataclass
class DecodeInputs:
    """One decode case's tensors (see the module docstring).

    ``k_cache``/``v_cache`` ``[num_pages, page_size, Hkv, D|Dv]`` are views of
    ``k_rows``/``v_rows`` starting at row ``cache_row0``; the sparse pool (S only) starts at
    row ``sparse_row0``. ``seq_pages[b, n]`` is the physical page of sequence b's logical
    page n (-1 past the end)."""

    case: object
    q: torch.Tensor
    k_rows: torch.Tensor
    v_rows: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    cache_row0: int
    seq_pages: torch.Tensor
    block_table_window: torch.Tensor
    block_table_full: torch.Tensor
    seq_lens: torch.Tensor
    sinks: torch.Tensor | None
    sparse: tuple | None = None
    sparse_row0: int = 0
    null_page: int = 0

    def slots(self, b, start, stop):
        """Cache slots (``page * page_size + offset``, relative to ``k_cache``) of positions
        ``[start, stop)`` of sequence ``b``, int64 on the device."""
        size = self.case.page_size
        pos = torch.arange(start, stop, device=self.seq_pages.device, dtype=torch.int64)
        return self.seq_pages[b].to(torch.int64)[pos // size] * size + pos % size

    def window_starts(self):
        """``[B]`` int64 (device): each sequence's first visible cached position."""
        case = self.case
        return torch.tensor([case.lowest_key(s) for s in case.seq_lens], dtype=torch.int64,
                            device=self.q.device)


def build_inputs(case, device="cuda", seed=0, dtype=torch.bfloat16):
    """The tensors of ``case`` on ``device`` (see :class:`DecodeInputs`)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    size, hkv, d, dv = case.page_size, case.num_kv_heads, case.head_dim, case.head_dim_v
    batch, nan = case.batch, float("nan")

    def randn(*shape, dt=dtype):
        return torch.randn(*shape, generator=gen, device=device, dtype=dt)

    lens = torch.tensor(case.seq_lens, dtype=torch.int64)
    pages = (lens + size - 1) // size
    width = int(pages.max()) + 1  # a spare column: every sequence has an entry past its end
    total = int(pages.sum())
    num_pages = 1 + total  # page 0: the null page
    order = torch.randperm(total, generator=torch.Generator().manual_seed(seed)) + 1
    logical = torch.arange(width)
    seq_pages = torch.full((batch, width), -1, dtype=torch.int32)
    seq_pages[logical[None, :] < pages[:, None]] = order.to(torch.int32)  # row-major: b's run
    seq_pages = seq_pages.to(device)

    guard = size  # a NaN page before the cache: page id -1 addresses it
    sparse_rows = batch * 2 * case.sparse_keys
    cache_end = guard + num_pages * size
    sparse_row0 = cache_end + 1  # one NaN row between: pool row -1 addresses it
    rows = sparse_row0 + sparse_rows
    k_rows, v_rows = randn(rows, hkv, d), randn(rows, hkv, dv)
    for flat in (k_rows, v_rows):
        flat[:guard] = nan
        flat[cache_end] = nan
    k_cache = k_rows[guard:cache_end].view(num_pages, size, hkv, d)
    v_cache = v_rows[guard:cache_end].view(num_pages, size, hkv, dv)

    dev_lens = lens.to(device)
    dev_pages = pages.to(device)
    dev_logical = logical.to(device)
    # Rows past each sequence's end in its last page: never written.
    last = (dev_pages - 1).clamp_min(0)
    offsets = torch.arange(size, device=device)
    tail_pos = last[:, None] * size + offsets[None, :]
    tail = (tail_pos >= dev_lens[:, None]) & (dev_pages[:, None] > 0)
    tail_slots = seq_pages.to(torch.int64).gather(1, last[:, None]) * size + offsets[None, :]
    # Pages wholly below each window: freed by the engine.
    starts = torch.tensor([case.lowest_key(s) for s in case.seq_lens], dtype=torch.int64, device=device)
    below = dev_logical[None, :] < (starts // size)[:, None]
    below_pages = seq_pages[below].to(torch.int64)
    for cache, flat in ((k_cache, k_cache.view(-1, hkv, d)), (v_cache, v_cache.view(-1, hkv, dv))):
        flat[tail_slots[tail]] = nan
        cache[below_pages] = nan
    k_cache[0] = randn(size, hkv, d)  # the null page stays finite
    v_cache[0] = randn(size, hkv, dv)

    table_full = seq_pages.clone()
    table_window = seq_pages.clone()
    table_window[below] = -1

    sparse = None
    if case.sparse_keys:
        k_pool = k_rows[sparse_row0:]
        v_pool = v_rows[sparse_row0:]
        share = 2 * case.sparse_keys
        base = torch.arange(batch, device=device)[:, None] * share
        chosen = torch.rand(batch, share, generator=gen, device=device).argsort(1)[:, :case.sparse_keys] + base
        holes = torch.rand(batch, case.sparse_keys, generator=gen, device=device).argsort(1)
        invalid = case.sparse_keys - case.sparse_valid
        idx = chosen.scatter(1, holes[:, :invalid], -1).to(torch.int32)
        named = torch.zeros(k_pool.shape[0], dtype=torch.bool, device=device)
        named[idx[idx >= 0].to(torch.int64)] = True
        k_pool[~named] = nan
        v_pool[~named] = nan
        k_rows[sparse_row0 - 1] = nan
        v_rows[sparse_row0 - 1] = nan
        sparse = (k_pool, v_pool, idx)

    return DecodeInputs(
        case, randn(batch, case.num_q_heads, d), k_rows, v_rows, k_cache, v_cache, guard,
        seq_pages, table_window, table_full, lens.to(device=device, dtype=torch.int32),
        randn(case.num_q_heads, dt=torch.float32) if case.sinks else None, sparse, sparse_row0)


def footprint(case, element_size=2):
    """Bytes the inputs take on the device, and a dense copy for FlexAttention (an estimate
    for the run's log)."""
    pages = sum(-(-s // case.page_size) for s in case.seq_lens) + 2
    rows = pages * case.page_size + 2 * case.batch * case.sparse_keys
    per_row = case.num_kv_heads * (case.head_dim + case.head_dim_v) * element_size
    dense = sum(case.seq_lens) * per_row
    return rows * per_row + dense


# --------------------------------------------------------------------------------------
# Reference.
# --------------------------------------------------------------------------------------

def reference_first(inputs, sinks=True, sparse=True, count=CHECK_SEQS):
    """The float64 reference ``[n, Hq, Dv]`` of the first ``n = min(count, B)`` sequences,
    read through the window block table (-1 below the window). ``sinks=False`` drops the
    sinks, ``sparse=False`` the sparse keys (what a variant that cannot apply them
    computes)."""
    from .. import reference
    case = inputs.case
    n = min(count, case.batch)
    out = torch.empty(n, case.num_q_heads, case.head_dim_v, dtype=torch.float64, device=inputs.q.device)
    extra = None
    if sparse and inputs.sparse is not None:
        k_pool, v_pool, idx = inputs.sparse
        extra = (k_pool, v_pool, idx[:n])
    reference.decode_attention(
        inputs.q[:n], inputs.k_cache, inputs.v_cache, inputs.block_table_window[:n],
        inputs.seq_lens[:n], window_left=case.window_left,
        sinks=inputs.sinks if sinks else None, sparse=extra, out=out)
    return out


# --------------------------------------------------------------------------------------
# Adapters.
# --------------------------------------------------------------------------------------

def _need_device(inputs):
    """Triton kernels run on CUDA, or on the CPU under the interpreter (tests)."""
    if inputs.q.is_cuda or os.environ.get("TRITON_INTERPRET") == "1":
        return
    raise Skip("needs a CUDA device (or TRITON_INTERPRET=1 on the CPU)")


def _need_cuda(inputs):
    if not inputs.q.is_cuda:
        raise Skip("needs a CUDA device")


def _empty_out(inputs):
    case = inputs.case
    return torch.empty(case.batch, case.num_q_heads, case.head_dim_v, dtype=inputs.q.dtype,
                       device=inputs.q.device)


def _poisoner(out):
    return lambda: out.fill_(float("nan"))


def _scale(case):
    return case.head_dim ** -0.5


def decode_module(control=False):
    """``swattn.ops.decode`` (or its control copy), or Skip saying why it cannot be used:
    it is being written beside this harness."""
    try:
        module = control_module("decode") if control else importlib.import_module("swattn.ops.decode")
    except Exception as exc:  # noqa: BLE001 - any failure: the kernel is not there yet
        raise Skip(f"swattn.ops.decode not importable ({type(exc).__name__}: {exc})") from None
    if not callable(getattr(module, "prepare", None)):
        raise Skip("swattn.ops.decode has no prepare() yet")
    return module


def ours(inputs, *, bounds="tight", layout="window", control=False, num_splits=None):
    """swattn's decode kernel over the paged cache through ``swattn.ops.decode.prepare``
    (validated once; the launch it returns does no host sync, so it is what gets captured).

    ``layout="window"``: the block table holds -1 for every page wholly below the window
    (freed pages); ``"full"``: every page is mapped (those pages hold NaN: only the bounds
    keep the kernel off them). ``num_splits=None`` lets the library choose. S passes its
    sparse pool and index list.
    """
    _need_device(inputs)
    module = decode_module(control)
    case = inputs.case
    table = inputs.block_table_window if layout == "window" else inputs.block_table_full
    out = _empty_out(inputs)
    launch, out, _ = module.prepare(
        inputs.q, inputs.k_cache, inputs.v_cache, table, inputs.seq_lens,
        window_left=case.window_left, sinks=inputs.sinks, sparse=inputs.sparse,
        num_splits=num_splits, out=out, bounds=bounds)
    splits = "library's split count" if num_splits is None else f"{num_splits} split(s)"
    return Prepared(launch, lambda: out, f"{layout} layout, {splits}", True, _poisoner(out))


# SGLang 0.5.23: decode_attention_fwd over its token pool --------------------------------

_SGLANG_DECODE = "sglang.kernels.ops.attention.decode_attention"
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
    swattn does; V is its own buffer (``has_mla=False``). Index building is not timed.
    """
    _need_device(inputs)
    mod = import_peer(_SGLANG_DECODE)
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
    out = _empty_out(inputs)

    def fn():
        mod.decode_attention_fwd(
            inputs.q, inputs.k_rows, inputs.v_rows, out, kv_indptr, kv_indices, attn_logits,
            attn_lse, num_kv_splits, SGLANG_MAX_KV_SPLITS, _scale(case), 1.0, 1.0, logit_cap=0.0,
            sinks=inputs.sinks, has_mla=False, use_pdl=use_pdl, page_size=1, uneven_batch=uneven)

    what = "all keys" if case.window_left is None else f"last W={case.window_left + 1} keys"
    note = (f"token pool (page 1), {what} per sequence in kv_indices"
            + (" + its sparse rows" if inputs.sparse is not None else "")
            + f"; max_kv_splits {SGLANG_MAX_KV_SPLITS}, num_kv_splits from its helper"
            + (" (PDL)" if use_pdl else "") + "; index build not timed")
    return Prepared(fn, lambda: out, note, True, _poisoner(out),
                    [kv_indptr, kv_indices, num_kv_splits, attn_logits, attn_lse, uneven])


# vLLM 0.33.0: unified_attention, decode -----------------------------------------------

def vllm_capture_sizes(max_size=512):
    """vLLM's default CUDA-graph capture sizes: 1, 2, 4, then steps of 8 to 256, of 16 on."""
    return [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, max_size + 1, 16))


def vllm_threshold_3d(num_kv_heads):
    """``seq_threshold_3D`` as vLLM's ``triton_attn.py`` sets it under CUDA graphs: 128 /
    Hkv, moved to the nearest capture size."""
    target = VLLM_MIN_GRID_2D // num_kv_heads
    return min(vllm_capture_sizes(), key=lambda x: abs(x - target))


def vllm_decode(inputs):
    """vLLM ``unified_attention`` on single-token queries over ``[pages, 16, Hkv, D]``,
    ``window_size=(W-1, 0)``, sinks, with the split-KV scratch its ``triton_attn.py``
    allocates: ``seq_threshold_3D`` rows (128 / Hkv at the nearest capture size) of 16 softmax
    segments; the kernel takes its 3D (split-KV) path when ``B`` query blocks fit under that
    threshold, else its 2D path (the note says which).

    Pages wholly below the window map to page 0, a null page of finite data (vLLM's null
    block): its first tile may start a page below the window. Two spare -1 columns keep its
    last tile's table read inside the table. It has one head size for K and V and no sparse
    rows: S is skipped.
    """
    _need_device(inputs)
    case = inputs.case
    if case.page_size != 16:
        raise Skip(f"vLLM's Triton backend runs block size 16, this pool has {case.page_size}")
    if case.head_dim != case.head_dim_v or inputs.sparse is not None:
        raise Skip(f"vLLM's kernel has one head size for K and V ({case.head_dim}/{case.head_dim_v} "
                   "here) and no separate sparse rows")
    mod = import_peer("vllm.v1.attention.ops.triton_unified_attention")
    device = inputs.q.device
    table = inputs.block_table_full.clone()
    width = table.shape[1]
    below = torch.arange(width, device=device)[None, :] < (inputs.window_starts() // case.page_size)[:, None]
    table[below] = inputs.null_page
    table = torch.cat([table, torch.full((case.batch, 2), -1, dtype=torch.int32, device=device)], 1)
    cu_seqlens_q = torch.arange(case.batch + 1, dtype=torch.int32, device=device)
    ones = torch.ones(1, dtype=torch.float32, device=device)
    threshold = vllm_threshold_3d(case.num_kv_heads)
    padded = 1 << (case.head_dim - 1).bit_length()
    segm_out = torch.empty(threshold, case.num_q_heads, VLLM_SEGMENTS, padded, dtype=torch.float32,
                           device=device)
    segm_max = torch.empty(threshold, case.num_q_heads, VLLM_SEGMENTS, dtype=torch.float32, device=device)
    segm_sum = torch.empty_like(segm_max)
    # One query per sequence: one query block each, so the 3D path runs while B <= threshold.
    path = ("3D split-KV, 16 segments" if case.batch <= threshold
            else "2D (batch over the 3D threshold)")
    left, _ = to_flash_attn(case.window_left)
    window = (left, 0) if case.window_left is not None else (-1, -1)
    out = _empty_out(inputs)

    def fn():
        mod.unified_attention(
            q=inputs.q, k=inputs.k_cache, v=inputs.v_cache, out=out, cu_seqlens_q=cu_seqlens_q,
            max_seqlen_q=1, seqused_k=inputs.seq_lens, max_seqlen_k=max(case.seq_lens),
            softmax_scale=_scale(case), causal=True, window_size=window, block_table=table,
            softcap=0, q_descale=None, k_descale=ones, v_descale=ones,
            seq_threshold_3D=threshold, num_par_softmax_segments=VLLM_SEGMENTS,
            softmax_segm_output=segm_out, softmax_segm_max=segm_max, softmax_segm_expsum=segm_sum,
            sinks=inputs.sinks)

    note = f"paged 16, pages below the window -> null page; {path} (threshold {threshold})"
    return Prepared(fn, lambda: out, note, True, _poisoner(out),
                    [table, cu_seqlens_q, ones, segm_out, segm_max, segm_sum])


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
    zero: their cache rows are NaN, freed), block mask ``k >= S - 1 - L``, ``enable_gqa``; the
    batch split into as few equal launches as keep K under 2^31 elements. No sinks (and on
    S no sparse keys): a different function where the workload has them."""
    _need_cuda(inputs)
    case = inputs.case
    if not case.uniform:
        raise Skip("ragged batch: the dense FlexAttention adapter needs one context per case")
    compiled, create_block_mask = _compiled_flex()
    seq_len = case.seq_lens[0]
    lo = case.lowest_key(seq_len)
    window_left = case.window_left
    hkv = case.num_kv_heads
    slots = torch.stack([inputs.slots(b, lo, seq_len) for b in range(case.batch)])  # [B, W]
    dense = []
    for cache, dim in ((inputs.k_cache, case.head_dim), (inputs.v_cache, case.head_dim_v)):
        full = torch.zeros(case.batch, hkv, seq_len, dim, dtype=inputs.q.dtype, device=inputs.q.device)
        full[:, :, lo:] = cache.view(-1, hkv, dim)[slots].permute(0, 2, 1, 3)
        dense.append(full)
    k, v = dense
    q = inputs.q.unsqueeze(2)  # [B, Hq, 1, D]

    def mask_mod(b, h, q_idx, kv_idx):
        pos = q_idx + (seq_len - 1)
        keep = kv_idx <= pos
        if window_left is not None:
            keep = keep & (pos - kv_idx <= window_left)
        return keep

    block_mask = create_block_mask(mask_mod, B=None, H=None, Q_LEN=1, KV_LEN=seq_len,
                                   device=inputs.q.device)
    chunks = flex_chunks(case.batch, hkv * seq_len * max(case.head_dim, case.head_dim_v), FLEX_MAX_ELEMENTS)
    step = case.batch // chunks
    state = {}

    def fn():
        state["outs"] = [compiled(q[i:i + step], k[i:i + step], v[i:i + step], block_mask=block_mask,
                                  scale=_scale(case), enable_gqa=True)
                         for i in range(0, case.batch, step)]

    def result():
        return torch.cat(state["outs"])[:, :, 0]

    note = (f"dense [B,H,S,D], block mask; {chunks} launch(es) of batch {step}; output allocated "
            "by flex (not poisoned)")
    return Prepared(fn, result, note, False, None, [q, k, v, block_mask], applies_sparse=False)


# FlashInfer ---------------------------------------------------------------------------

def flashinfer_decode(inputs):
    """FlashInfer ``BatchDecodeWithPagedKVCacheWrapper`` (NHD, page 16,
    ``use_tensor_cores=True``), planned once, ``window_left=W-1``, over each sequence's pages
    from the one holding its first window key (as engines hand window layers their trimmed
    page lists). Its FA2/FA3 paths on the H200 ignore sinks (peers/README.md): run without
    them, marked as a different function where the workload has sinks. S is skipped (head
    dims 576/512 differ, sparse rows)."""
    _need_cuda(inputs)
    case = inputs.case
    if case.head_dim != case.head_dim_v or inputs.sparse is not None:
        raise Skip("its decode wrapper takes one head dim for K and V and no sparse rows")
    fi = import_peer("flashinfer")
    device = inputs.q.device
    size = case.page_size
    firsts = [case.lowest_key(s) // size for s in case.seq_lens]
    ends = [-(-s // size) for s in case.seq_lens]
    seq_pages = inputs.seq_pages.cpu()
    indices = torch.cat([seq_pages[b, f:e] for b, (f, e) in enumerate(zip(firsts, ends))]).to(torch.int32)
    indptr = torch.zeros(case.batch + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor([e - f for f, e in zip(firsts, ends)]), 0)
    last = torch.tensor([(s - 1) % size + 1 for s in case.seq_lens], dtype=torch.int32)
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device=device)
    wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=True)
    wrapper.plan(indptr, indices, last, case.num_q_heads, case.num_kv_heads, case.head_dim, size,
                 window_left=to_flashinfer(case.window_left), q_data_type=inputs.q.dtype,
                 kv_data_type=inputs.k_cache.dtype, sm_scale=_scale(case))
    out = _empty_out(inputs)

    def fn():
        wrapper.run(inputs.q, (inputs.k_cache, inputs.v_cache), out=out)

    return Prepared(fn, lambda: out, "paged 16 NHD, window pages, planned once; no sinks", False,
                    _poisoner(out), [workspace, wrapper, indices, indptr, last])


# --------------------------------------------------------------------------------------
# The variants a decode run times, in the order of the table, and one case.
# --------------------------------------------------------------------------------------

VARIANTS = (
    Variant("swattn tight", "tight", "tight", lambda i: ours(i)),
    Variant("swattn tight (control)", "control", "control", lambda i: ours(i, control=True)),
    Variant("swattn skip, full layout", "skip", "ours", lambda i: ours(i, bounds="skip", layout="full")),
    Variant("swattn tight, 1 split", "split1", "ours", lambda i: ours(i, num_splits=1)),
    Variant("SGLang decode", "sglang", "peer", sglang_decode),
    Variant("vLLM unified", "vllm", "peer", vllm_decode),
    Variant("FlexAttention", "flex", "peer", flex_decode),
    Variant("FlashInfer", "flashinfer", "peer", flashinfer_decode),
)


def run_case(case, variants, **kwargs):
    """:func:`swattn.bench.harness.run_case` with the decode inputs and reference."""
    return harness.run_case(case, variants, build=build_inputs, reference=reference_first, **kwargs)
