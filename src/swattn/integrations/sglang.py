"""SGLang's Triton attention kernels' signatures on swattn's kernels: change the import.

``extend_attention_fwd`` and ``decode_attention_fwd`` take the arguments of
``sglang/.../triton_ops/extend_attention.py`` and ``decode_attention.py`` (the positional
order of SGLang 0.5's later releases, with ``k_scale``/``v_scale`` after
``max_len_extend``), their layouts (a token pool ``k_buffer [tokens, Hkv, D]`` read through
``kv_indptr``/``kv_indices``; the new tokens packed by ``qo_indptr``) and their semantics:

- ``sliding_window_size`` in SGLang's convention: a query at list position ``q`` sees the
  key at ``k`` when ``q <= k + sliding_window_size`` (swattn's ``window_left``); -1 = none.
  The prefix list may hold only the window's tail (``window_kv_offsets``): positions count
  from the list start, so the window is unchanged.
- ``custom_mask`` (bool or int8, SGLang's layout: each sequence's ``E x (P + E)`` entries
  from ``mask_indptr``) replaces causality, the window still applies (both ways when
  ``is_causal=False``, as SGLang's); ``skip_prefix_custom_mask=True`` keeps every prefix key
  visible. ``identity_kv_indices=True``: each prefix lies densely in the pool from
  ``kv_indptr[b]`` (``kv_indices`` unread).
- ``is_causal=False``: the new tokens see each other both ways (within the window).
- Speculative verify of a draft tree (its ``custom_mask``) over a window layer: SGLang's kernel
  measures the window from each draft's row index, so siblings at one depth see different keys;
  pass the drafts' ``positions=`` (keyword only, swattn's) and the window is measured between
  positions, as the model means it.
- ``sinks``, ``logit_cap`` (soft-cap), ``sm_scale``, ``lse_extend`` (natural log),
  ``skip_prefix``/``skip_extend`` (partial states for context parallelism).
- decode's ``attn_logits``/``attn_lse``/``num_kv_splits``/``max_kv_splits`` are SGLang's
  split scratch, ``lean_*`` the lean decode's, ``use_pdl`` a launch choice and extend's
  ``max_len_extend``/``extend_seq_lens_cpu`` hints of sizes: accepted and not used (swattn
  plans its own split). Every other argument is applied or refused; the signature takes no
  ``**kwargs``, so an argument it does not name is a TypeError naming it.

An fp8 pool (e4m3fn or e5m2) holds ``value / scale`` with ``k_scale``/``v_scale`` (a float or
a one-value tensor), as SGLang's kernels read it; fp16/bf16 pools take only scales of 1. One
difference: the new tokens' ``k_extend``/``v_extend`` are taken as the pool will store them
(rounded to fp8), where SGLang's extend kernel uses them unrounded within the chunk (so a chunk's
result does not depend on whether a key is new or cached).

Not served (a NotImplementedError, never a wrong answer): ``page_size > 1``,
``xai_temperature_len``, ``score_mod``, a custom mask together with ``window_kv_offsets``, MLA's
shared 4-D buffers, the lean decode, ``uneven_batch``.

Each call reads the longest prefix back to the host once (the block table's width): SGLang's
backend knows it on the host; an engine that wants no sync plans with ``swattn.plan_extend``.
"""

import torch

from ..api import decode_attention, extend_attention
from ..window import from_sglang
from ._paged import cache_scale, require, table_from_indices, token_rows


def _mask(custom_mask, mask_indptr, prefix_lens, extend_lens, skip_prefix_custom_mask):
    """The custom mask as swattn takes it (flat bool, same layout); with
    ``skip_prefix_custom_mask``, the prefix columns set (device ops, no sync)."""
    mask = custom_mask if custom_mask.dtype == torch.bool else custom_mask != 0
    if not skip_prefix_custom_mask:
        return mask
    seq, entry = token_rows(mask_indptr, mask.numel())  # each entry's sequence and place
    width = (prefix_lens + extend_lens).to(torch.int64)[seq]
    return mask | (entry % width.clamp(min=1) < prefix_lens.to(torch.int64)[seq])


def extend_attention_fwd(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr,
                         kv_indptr, kv_indices, custom_mask, is_causal, mask_indptr,
                         max_len_extend, k_scale=None, v_scale=None, sm_scale=None,
                         logit_cap=0.0, skip_prefix_custom_mask=True, sliding_window_size=-1,
                         sinks=None, window_kv_offsets=None, xai_temperature_len=-1,
                         lse_extend=None, skip_prefix=False, skip_extend=False, page_size=1,
                         score_mod=None, aux_tensors=None, extend_seq_lens_cpu=None,
                         identity_kv_indices=False, *, positions=None):
    """SGLang's ``extend_attention_fwd`` on swattn's extend kernel (see the module).
    ``positions`` (swattn's, keyword only): the new tokens' absolute positions, as an engine's
    forward batch holds them (a speculative tree's drafts at prefix + depth): the window is
    then measured between positions, where SGLang's kernel measures it from the row index."""
    k_scale = cache_scale("k_scale", k_scale, k_buffer)
    v_scale = cache_scale("v_scale", v_scale, v_buffer)
    require(page_size == 1, f"page_size={page_size}: the drop-in reads a token pool (page 1)")
    require(xai_temperature_len is None or xai_temperature_len <= 0, "xai_temperature_len")
    require(score_mod is None and aux_tensors is None, "score_mod")
    require(not (skip_prefix and skip_extend), "skip_prefix and skip_extend together")
    require(custom_mask is None or window_kv_offsets is None
            or from_sglang(sliding_window_size) is None,
            "a custom mask with window_kv_offsets")
    require(positions is None or window_kv_offsets is None,
            "positions with window_kv_offsets (a prefix list holding only the window's tail)")
    require(k_buffer.dim() == 3, "k_buffer must be the token pool [tokens, Hkv, D]")
    if identity_kv_indices:  # the prefixes lie densely in the pool from kv_indptr[b] on
        kv_indices = torch.arange(k_buffer.shape[0], device=k_buffer.device)
    table, prefix_lens = table_from_indices(kv_indptr, kv_indices)
    prefix_lens = prefix_lens.to(torch.int32)
    cu = qo_indptr.to(torch.int32)
    window = from_sglang(sliding_window_size)
    mask = None
    if custom_mask is not None:
        mask = _mask(custom_mask, mask_indptr, prefix_lens, cu[1:] - cu[:-1],
                     skip_prefix_custom_mask)
    keys = "new" if skip_prefix else "prefix" if skip_extend else "all"
    causal = bool(is_causal)  # with a mask too: it then says whether the window is one-sided
    result = extend_attention(
        q_extend, k_extend, v_extend, k_buffer.unsqueeze(1), v_buffer.unsqueeze(1), table, cu,
        prefix_lens, window_left=window,
        window_right=None if causal else window, causal=causal,
        sinks=None if sinks is None else sinks.to(torch.float32), softcap=float(logit_cap or 0.0),
        scale=sm_scale, mask=mask, mask_indptr=mask_indptr if mask is not None else None,
        keys=keys, return_lse=lse_extend is not None, out=o_extend, k_scale=k_scale,
        v_scale=v_scale, positions=None if positions is None else positions.to(torch.int32))
    if lse_extend is not None:
        lse_extend.copy_(result[1])


def decode_attention_fwd(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits=None,
                         attn_lse=None, num_kv_splits=None, max_kv_splits=None, sm_scale=None,
                         k_scale=None, v_scale=None, logit_cap=0.0, sinks=None,
                         xai_temperature_len=-1, has_mla=False, use_pdl=False, page_size=1,
                         score_mod=None, aux_tensors=None, enable_lean=None, lean_Mp=None,
                         lean_Lp=None, lean_Op=None, lean_locks=None, uneven_batch=None):
    """SGLang's ``decode_attention_fwd`` on swattn's decode kernel: every key the lists
    name (SGLang's decode takes its window as the list itself). With ``has_mla`` the values
    are the keys' first ``Lv`` columns, as SGLang's MLA decode reads them, whatever
    ``v_buffer`` holds; the kernel then loads each key tile once for both products."""
    if has_mla:
        v_buffer = k_buffer[..., :v_buffer.shape[-1]]
    k_scale = cache_scale("k_scale", k_scale, k_buffer)
    v_scale = cache_scale("v_scale", v_scale, v_buffer)
    require(page_size == 1, f"page_size={page_size}: the drop-in reads a token pool (page 1)")
    require(xai_temperature_len is None or xai_temperature_len <= 0, "xai_temperature_len")
    require(score_mod is None and aux_tensors is None, "score_mod")
    require(not enable_lean, "the lean decode")
    require(not uneven_batch, "uneven_batch (not applied by this drop-in)")
    require(k_buffer.dim() == 3, "k_buffer must be the token pool [tokens, Hkv, D]")
    batch = q.shape[0]
    table, lens = table_from_indices(kv_indptr[:batch + 1], kv_indices)
    decode_attention(q, k_buffer.unsqueeze(1), v_buffer.unsqueeze(1), table,
                     lens.to(torch.int32), sinks=None if sinks is None else sinks.to(torch.float32),
                     softcap=float(logit_cap or 0.0), scale=sm_scale, out=o[:batch],
                     k_scale=k_scale, v_scale=v_scale)
