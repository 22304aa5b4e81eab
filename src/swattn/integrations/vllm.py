"""vLLM's Triton ``unified_attention`` signature on swattn's extend kernel: change the import.

``unified_attention(q, k, v, out, cu_seqlens_q, max_seqlen_q, seqused_k, max_seqlen_k,
softmax_scale, causal, window_size, block_table, softcap, q_descale, k_descale, v_descale,
..., sinks=None)`` as in ``vllm/v1/attention/ops/triton_unified_attention.py``: ``k``/``v``
are the paged cache ``[num_blocks, block_size, Hkv, D]`` holding every key, the batch's new
ones included (vLLM writes them before attending); the queries of sequence b are its last
``cu_seqlens_q[b + 1] - cu_seqlens_q[b]`` positions of ``seqused_k[b]``; ``window_size =
(left, right)``, -1 for none, a query at position p seeing keys from ``p - left``;
``softcap`` 0 = off; ``sinks`` as gpt-oss's. The new tokens' keys are gathered from the
cache on the device (no host read, graph-capturable), then swattn's extend kernel runs.

An fp8 cache (e4m3fn or e5m2) is taken as vLLM's kernel takes it: with ``kv_quant_mode``
``FP8_PER_TENSOR`` (1) the cache holds value / scale and ``k_descale``/``v_descale`` give the
scale (their first element, as vLLM's kernel reads them; vLLM passes one value expanded to
``[num_seqs, Hkv]``); with ``NONE`` (0, the default) its values are taken as they are. The new
tokens' keys gathered from such a cache are handed to swattn dequantized, which quantizes them
back to the very bytes stored. With fp16/bf16 caches the descales are ignored, as vLLM's kernel
ignores them there; q_descale must be None. The 3-D kernel's scratch (``seq_threshold_3D``,
``softmax_segm_*``) is accepted and unused, as are ``use_td`` (how vLLM's kernel loads its
tiles) and ``mm_prefix_clamp_sliding_window`` (it only clamps PrefixLM ranges, refused below).
Not served (a NotImplementedError naming it): ALiBi, ``output_scale``, ``qq_bias``, PrefixLM
ranges, R-SWA, chunked attention, per-token-head and packed cache formats (``kv_quant_mode`` 2
and up, scale caches), non-causal calls (``causal=False`` or a per-sequence tensor), and any
argument this signature does not name.
"""

import torch

from ..api import extend_attention
from ..ops._validate import FP8_DTYPES
from ..window import from_flash_attn
from ._paged import require, token_rows


def unified_attention(q, k, v, out, cu_seqlens_q, max_seqlen_q, seqused_k, max_seqlen_k,
                      softmax_scale, causal, window_size, block_table, softcap, q_descale,
                      k_descale, v_descale, seq_threshold_3D=None, num_par_softmax_segments=None,
                      softmax_segm_output=None, softmax_segm_max=None, softmax_segm_expsum=None,
                      alibi_slopes=None, output_scale=None, qq_bias=None, sinks=None,
                      mm_prefix_range=None, rswa_prefix_lens=None, rswa_window=None,
                      use_alibi_sqrt=False, kv_quant_mode=None, k_scale_cache=None,
                      v_scale_cache=None, chunk_lookback=-1, use_td=False,
                      mm_prefix_clamp_sliding_window=False, **kwargs):
    """vLLM's ``unified_attention`` on swattn (see the module); writes ``out``."""
    # A later vLLM's argument would otherwise be dropped unread: refused by name instead.
    require(not kwargs, f"{', '.join(sorted(kwargs))} (arguments this drop-in does not know)")
    require(not isinstance(causal, torch.Tensor), "a per-sequence causal tensor")
    require(causal, "causal=False (non-causal attention)")
    require(q_descale is None, "q_descale (an fp8 query)")
    mode = 0 if kv_quant_mode is None else int(kv_quant_mode)
    require(mode in (0, 1), f"kv_quant_mode {mode} (per-token-head and packed cache formats; "
                            "fp8 per tensor (1) and none (0) are served)")
    fp8 = k.dtype in FP8_DTYPES
    require(k.dtype == q.dtype or fp8, f"a {k.dtype} cache with {q.dtype} queries")
    require(alibi_slopes is None and not use_alibi_sqrt, "ALiBi")
    require(output_scale is None and qq_bias is None, "output_scale / qq_bias")
    require(mm_prefix_range is None and rswa_prefix_lens is None and rswa_window is None,
            "PrefixLM ranges / R-SWA")
    require(k_scale_cache is None and v_scale_cache is None, "per-token-head scale caches")
    require(chunk_lookback is None or chunk_lookback < 0, "chunked attention")
    left, right = from_flash_attn(window_size if window_size is not None else (-1, -1))
    require(right in (None, 0), f"window_size right = {right} with causal attention")
    page = k.shape[1]
    q_lens = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).to(torch.int32)
    prefix_lens = seqused_k.to(torch.int32) - q_lens
    # The new tokens' keys, where vLLM wrote them: token t of sequence b sits at position
    # prefix_b + i in that sequence's pages.
    seq, i = token_rows(cu_seqlens_q, q.shape[0])
    pos = prefix_lens.to(torch.int64)[seq] + i
    pages = block_table.to(torch.int64)[
        seq, (pos // page).clamp(min=0, max=block_table.shape[1] - 1)]
    slots = pos % page
    k_new, v_new = k[pages, slots], v[pages, slots]
    k_scale = v_scale = None
    if fp8:
        if mode == 1:
            # The first element, as vLLM's kernel loads it (a view: no copy, no sync).
            k_scale, v_scale = (None if d is None else d[(0,) * d.dim()].to(torch.float32)
                                for d in (k_descale, v_descale))
        k_new, v_new = (x.to(torch.float32) * (1.0 if s is None else s)
                        for x, s in ((k_new, k_scale), (v_new, v_scale)))
        k_new, v_new = k_new.to(q.dtype), v_new.to(q.dtype)
    extend_attention(q, k_new, v_new, k, v, block_table.to(torch.int32),
                     cu_seqlens_q.to(torch.int32), prefix_lens, window_left=left,
                     sinks=None if sinks is None else sinks.to(torch.float32),
                     softcap=float(softcap or 0.0), scale=softmax_scale, out=out,
                     k_scale=k_scale, v_scale=v_scale)
    return out
