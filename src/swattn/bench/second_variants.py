"""The V4 rows of ``swattn bench`` (a window and a second key source: V4-CSA, V4-HCA decode,
V4-X extend): swattn's variants, FlexAttention over the same keys, and the peers that cannot
run them, each saying why.

swattn runs ``swattn.plan_second_keys`` once on the host lengths, then ``plan.run`` (timed),
over the bf16 caches or an fp8 copy of both under one shared scale a KV head. FlexAttention
gets each row's visible keys gathered outside the timed region (its window, then its
compressed entries) as dense K = V, one query a batch entry, a block mask over the padding;
it has no sinks, so it computes another function where the case has them (as the other
Flex rows). Inputs and the reference: :mod:`.second_inputs`.
"""

from __future__ import annotations

import torch

from ..ops import config as _config
from . import harness
from .decode_inputs import need_device
from .decode_peers import FLEX_MAX_ELEMENTS, flex_chunks
from .peers import (
    Prepared,
    Skip,
    Variant,
    compiled_flex,
    empty_out,
    need_cuda,
    poisoner,
    softmax_scale,
)
from .second_inputs import build_inputs, quantized, reference_first, reference_rows

SGLANG_V4_DECODE = "sglang.kernels.ops.attention.dsv4.triton_sparse_decode"


# --------------------------------------------------------------------------------------
# swattn.
# --------------------------------------------------------------------------------------

def _lengths(inputs):
    if inputs.extend:
        return {"cu_seqlens": inputs.cu_seqlens.tolist(),
                "prefix_lens": inputs.prefix_lens.tolist()}
    return {"seq_lens": list(inputs.case.seq_lens)}


def ours(inputs, *, bounds="tight", control=False, num_splits=None, fp8=None):
    """swattn through its engine path: ``swattn.plan_second_keys`` on the host lengths once,
    then ``plan.run`` timed (``control``: a second plan, timed as its own variant: the noise
    floor). ``fp8`` (a torch fp8 dtype): over an fp8 copy of the sliding and compressed
    caches under one shared scale a KV head (:func:`.second_inputs.quantized`), checked
    against the reference over the same copy. The one-shot call's host time is measured
    beside the tight bf16 row's."""
    need_device(inputs)
    import swattn
    case, source = inputs.case, inputs.source
    k_cache, second, scale = inputs.k_cache, source, None
    if fp8 is not None:
        k_cache, second, scale = quantized(inputs, fp8)
    try:
        plan = swattn.plan_second_keys(
            **_lengths(inputs), num_q_heads=case.num_q_heads, num_kv_heads=case.num_kv_heads,
            head_dim=case.head_dim, head_dim_v=case.head_dim_v, page_size=case.page_size,
            rate=second.rate, num_indices=0 if second.indices is None else second.indices.shape[1],
            window_left=case.window_left, num_splits=num_splits, kv_dtype=k_cache.dtype,
            dtype=inputs.q.dtype, device=inputs.q.device, bounds=bounds)
    except ValueError as exc:
        raise Skip(str(exc)) from None
    out = empty_out(inputs)
    new = {"k": inputs.k, "v": inputs.k} if inputs.extend else {}
    scales = {"k_scale": scale, "v_scale": scale}

    def run():
        plan.run(inputs.q, k_cache, k_cache, inputs.block_table, second, sinks=inputs.sinks,
                 out=out, **new, **scales)

    def one_shot():
        common = dict(window_left=case.window_left, sinks=inputs.sinks, second=second, out=out,
                      **scales)
        if inputs.extend:
            swattn.extend_attention(inputs.q, inputs.k, inputs.k, k_cache, k_cache,
                                    inputs.block_table, inputs.cu_seqlens, inputs.prefix_lens,
                                    **common)
        else:
            swattn.decode_attention(inputs.q, k_cache, k_cache, inputs.block_table,
                                    inputs.seq_lens, **common)

    host = {"plan.run": run}
    if bounds == "tight" and not control and fp8 is None and num_splits is None:
        host["one-shot"] = one_shot
    group = case.num_q_heads // case.num_kv_heads
    cfg = plan.spec.config
    blocks = _config.head_blocking(cfg, group)[1]
    tiling = {"block_m": 1, "block_n": cfg.block_n, "tokens_per_block": 1, "aligned": False,
              "heads": case.num_kv_heads * blocks}
    want = None
    if fp8 is not None:
        def want():
            return reference_rows(inputs, k_cache=k_cache, second=second, scale=scale)
    kind = f"{str(fp8)[6:]} caches, one shared scale a KV head; " if fp8 is not None else ""
    note = (f"{kind}second-source kernel BN{cfg.block_n}, {blocks} head blocks, "
            f"{plan.num_splits} split(s)" + (", a second plan" if control else ""))
    return Prepared(run, lambda: out, note, True, poisoner(out), [plan, k_cache, second, scale],
                    host=host, tiling=tiling, reference=want, kv_bytes=1 if fp8 else 2)


# --------------------------------------------------------------------------------------
# FlexAttention over each row's gathered keys.
# --------------------------------------------------------------------------------------

def _slots(table, seqs, positions, page_size):
    """Cache slots of ``positions [rows, n]`` of sequences ``seqs [rows]`` (-1 positions:
    slot 0, masked by the caller)."""
    pos = positions.clamp_min(0)
    pages = table.to(torch.int64)[seqs[:, None], pos // page_size]
    return pages.clamp_min(0) * page_size + pos % page_size


def gathered_keys(inputs):
    """Each row's visible keys, dense: ``(keys [rows, Hkv, L, D], valid [rows, L])``, its
    window (cached keys, then the chunk's new keys) before its compressed entries, padding
    zero and not valid. Built on the device, never timed."""
    case, source = inputs.case, inputs.source
    device, size = inputs.q.device, case.page_size
    rows = [(b, c, q) for b, (c, q) in zip(_row_seqs(inputs), inputs.row_positions())]
    seqs = torch.tensor([b for b, _, _ in rows], device=device)
    cached = torch.tensor([c for _, c, _ in rows], device=device)
    pos = torch.tensor([q for _, _, q in rows], device=device)
    width = case.window_left + 1
    window = pos[:, None] - torch.arange(width - 1, -1, -1, device=device)[None, :]  # [rows, W]
    flat = inputs.k_cache.view(-1, case.num_kv_heads, case.head_dim)
    in_cache = torch.minimum(window, cached[:, None] - 1)  # (new keys: replaced below)
    keys = flat[_slots(inputs.block_table, seqs, in_cache, size)]
    if inputs.extend:
        starts = inputs.cu_seqlens.to(torch.int64)[seqs]
        new_rows = (starts[:, None] + window - cached[:, None]).clamp_min(0)
        new_rows = new_rows.clamp_max(inputs.k.shape[0] - 1)
        keys = torch.where((window >= cached[:, None])[..., None, None], inputs.k[new_rows], keys)
    valid_window = window >= 0
    if source.indices is not None:
        entries = source.indices.to(torch.int64)
    else:
        limit = int((pos + 1).max()) // source.rate
        entries = torch.arange(limit, device=device).expand(len(rows), limit)
        entries = torch.where(entries < (pos[:, None] + 1) // source.rate, entries, -1)
    x_flat = source.cache.view(-1, case.num_kv_heads, case.head_dim)
    x_keys = x_flat[_slots(source.block_table, seqs, entries, size)]
    keys = torch.cat([keys, x_keys], 1).transpose(1, 2)  # [rows, Hkv, L, D]
    valid = torch.cat([valid_window, entries >= 0], 1)
    keys = torch.where(valid[:, None, :, None], keys, 0.0).contiguous()
    return keys, valid


def _row_seqs(inputs):
    if inputs.extend:
        return [b for b, (_, e) in enumerate(inputs.case.seqs) for _ in range(e)]
    return list(range(inputs.case.batch))


def flex_second(inputs):
    """FlexAttention (``torch.compile``d): each row one batch entry, Q ``[rows, Hq, 1, D]``
    over its visible keys gathered (:func:`gathered_keys`, not timed), K = V, a block mask
    over the padding, ``enable_gqa``; the rows split into as few launches as keep K under
    2^31 elements. No sinks: another function where the case has them."""
    need_cuda(inputs)
    compiled, create_block_mask = compiled_flex()
    case = inputs.case
    keys, valid = gathered_keys(inputs)
    rows, length = valid.shape
    q = inputs.q.unsqueeze(2)
    chunks = flex_chunks(rows, case.num_kv_heads * length * case.head_dim, FLEX_MAX_ELEMENTS)
    step = -(-rows // chunks)
    launches = []
    for start in range(0, rows, step):
        part = valid[start:start + step]

        def mask_mod(b, h, q_idx, kv_idx, part=part):
            return part[b, kv_idx]
        mask = create_block_mask(mask_mod, B=part.shape[0], H=None, Q_LEN=1, KV_LEN=length,
                                 device=inputs.q.device)
        launches.append((q[start:start + step], keys[start:start + step], mask))
    state = {}

    def fn():
        state["outs"] = [compiled(qs, ks, ks, block_mask=mask, scale=softmax_scale(case),
                                  enable_gqa=True) for qs, ks, mask in launches]

    def result():
        return torch.cat(state["outs"])[:, :, 0]

    note = (f"dense [rows, Hkv, {length}, D] of each row's window and entries (gathered, not "
            f"timed), K = V, block mask over the padding; {len(launches)} launch(es); output "
            "allocated by flex (not poisoned)")
    return Prepared(fn, result, note, False, None, [q, keys, launches])


# --------------------------------------------------------------------------------------
# Peers that cannot run these rows here.
# --------------------------------------------------------------------------------------

def sglang_v4(inputs):
    """SGLang 0.5.23 has a Triton decode for V4 (``dsv4/triton_sparse_decode``, behind its V4
    backend's ``SGLANG_HACK_FLASHMLA_BACKEND=triton``): a main and an extra index list, fp8
    only, in FlashMLA's page layout. Not carried: the peers folder holds its window kernels
    only, and the row needs an adapter that writes that layout."""
    raise Skip("SGLang's V4 Triton decode (dsv4/triton_sparse_decode) reads FlashMLA's fp8 page "
               "layout (448 e4m3 + 64 bf16 rope columns and 7 power-of-two scales a token); "
               "not carried in the peers folder, no adapter writes that layout yet")


def vllm_v4(inputs):
    """vLLM 0.33.0 runs V4's attention through FlashMLA or FlashInfer's sparse MLA (CUDA
    builds); its Triton unified attention takes no second key source."""
    raise Skip("vLLM serves V4 through FlashMLA / FlashInfer sparse MLA (CUDA builds, not "
               "carried); its Triton unified attention has no second key source")


def flashmla(inputs):
    """FlashMLA's sparse decode is V4's reference kernel in both engines; it needs its
    CUDA build (sm90a), which the GPU machine cannot fetch or compile here."""
    raise Skip("FlashMLA needs its CUDA build (sm90a): not carried")


# --------------------------------------------------------------------------------------
# The table and one case.
# --------------------------------------------------------------------------------------

VARIANTS = (
    Variant("swattn tight", "tight", "tight", lambda i: ours(i)),
    Variant("swattn tight (control)", "control", "control", lambda i: ours(i, control=True)),
    Variant("swattn skip", "skip", "ours", lambda i: ours(i, bounds="skip")),
    Variant("swattn tight, fp8 e4m3 caches", "fp8", "ours",
            lambda i: ours(i, fp8=torch.float8_e4m3fn)),
    Variant("SGLang V4 Triton decode", "sglang", "peer", sglang_v4),
    Variant("vLLM", "vllm", "peer", vllm_v4),
    Variant("FlashMLA sparse", "flashmla", "peer", flashmla),
    Variant("FlexAttention, gathered keys", "flex", "peer", flex_second),
)


def run_case(case, variants, **kwargs):
    """:func:`swattn.bench.harness.run_case` with the V4 inputs and reference."""
    return harness.run_case(case, variants, build=build_inputs, reference=reference_first,
                            **kwargs)
