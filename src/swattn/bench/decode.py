"""Decode rows of ``swattn bench``: swattn's variants, the table of variants and one decode case.

Everything else (graph capture, interleaved timing, the same-variant control's noise floor,
the L2 flush, the ceilings, the floor and roofline arithmetic) is the harness's
(:func:`swattn.bench.harness.run_case`, :mod:`swattn.bench.report`), as for the extend rows
(:mod:`.extend`); this module only brings what differs for one new token per sequence.

The inputs and the reference check are in :mod:`swattn.bench.decode_inputs`, the peers'
adapters in :mod:`swattn.bench.decode_peers`; this module holds swattn's own variants, the
table of variants and :func:`run_case`, and names the others' public functions.
"""

from __future__ import annotations

import torch

from . import harness, second_variants
from .chunk_peers import flash_attn_chunk_decode, flashinfer_chunk_decode, vllm_chunk_decode
from .decode_inputs import (  # noqa: F401
    CHECK_SEQS,
    DecodeInputs,
    build_inputs,
    footprint,
    need_device,
    reference_first,
)
from .decode_peers import (  # noqa: F401
    FLEX_MAX_ELEMENTS,
    SGLANG_DECODE,
    SGLANG_MAX_KV_SPLITS,
    VLLM_MIN_GRID_2D,
    VLLM_SEGMENTS,
    flashinfer_decode,
    flex_chunks,
    flex_decode,
    sglang_decode,
    sglang_num_kv_splits,
    vllm_capture_sizes,
    vllm_decode,
    vllm_threshold_3d,
)
from .peers import Prepared, Skip, Variant, empty_out, fp8_cache, fp8_pool, poisoner

# --------------------------------------------------------------------------------------
# swattn's decode.
# --------------------------------------------------------------------------------------

def decode_tiling(plan, case):
    """The tiles the plan's decode loop reads, for the tile model (:mod:`.predict`): keys a
    tile, the KV heads its programs read them for, and whether they lie on the grid of 0
    (the Hopper path's)."""
    config = plan.spec.latent_config if plan.path == "latent" else plan.config
    return {"block_n": config.block_n, "heads": case.num_kv_heads, "aligned": plan.path == "hopper"}


def ours(inputs, *, bounds="tight", layout="window", control=False, num_splits=None,
         hopper=None, window_left=None, same_keys=False):
    """swattn's decode through its engine path: ``swattn.plan_decode`` on the host lengths
    once, then ``plan.run`` timed. ``control``: a second plan of the same batch, timed as its
    own variant: the noise floor.

    ``layout="window"``: the block table holds -1 for every page wholly below the window
    (freed pages); ``"full"``: every page is mapped (those pages hold NaN: only the bounds
    keep the kernel off them). ``num_splits=None`` lets the plan choose. S passes its
    sparse pool and index list, C-L4 its chunk. ``hopper``: the plan's choice of the Gluon
    path (None: its own). The host time of ``plan.run`` and of the one-shot
    ``swattn.decode_attention`` (both with ``out`` given) are measured beside the graph
    replay.

    ``same_keys``: under the case's chunk, the same decode over a window of the keys the
    chunk holds (``window_left`` = those keys - 1, no chunk; every sequence's the same), the
    same function on the same cache: the chunk's decode should be no slower.
    """
    need_device(inputs)
    import swattn
    case = inputs.case
    chunk = case.attention_chunk
    window_left = case.window_left
    if same_keys:
        keys = {case.window_keys(s) for s in case.seq_lens}
        if chunk is None or len(keys) != 1:
            raise Skip("a window of the chunk's keys needs a chunk and every sequence's chunk "
                       "holding as many keys")
        window_left, chunk = keys.pop() - 1, None
    table = inputs.block_table_window if layout == "window" else inputs.block_table_full
    out = empty_out(inputs)
    try:
        plan = swattn.plan_decode(
            case.seq_lens, num_q_heads=case.num_q_heads, num_kv_heads=case.num_kv_heads,
            head_dim=case.head_dim, head_dim_v=case.head_dim_v, page_size=case.page_size,
            window_left=window_left, num_splits=num_splits, attention_chunk=chunk,
            sparse_keys=inputs.sparse[2].shape[1] if inputs.sparse is not None else 0,
            dtype=inputs.q.dtype, device=inputs.q.device, bounds=bounds, hopper=hopper)
    except ValueError as exc:
        raise Skip(str(exc)) from None
    tensors = (inputs.q, inputs.k_cache, inputs.v_cache, table)

    def run():
        plan.run(*tensors, sinks=inputs.sinks, sparse=inputs.sparse, out=out)

    def one_shot():
        swattn.decode_attention(*tensors, inputs.seq_lens, window_left=window_left,
                                sinks=inputs.sinks, sparse=inputs.sparse, num_splits=num_splits,
                                attention_chunk=chunk, out=out)

    host = {"plan.run": run}
    if bounds == "tight" and hopper is None and num_splits is None and not (control or same_keys):
        host["one-shot"] = one_shot
    note = (f"{layout} layout, {plan.path} kernel, {plan.num_splits} split(s)"
            + (", a second plan" if control else "")
            + (f", window_left={window_left} and no chunk" if same_keys else ""))
    return Prepared(run, lambda: out, note, True, poisoner(out), [plan], host=host,
                    tiling=decode_tiling(plan, case))


def ours_fp8(inputs, *, fp8=torch.float8_e4m3fn, hopper=None, config=None):
    """swattn's decode over an fp8 copy of the case's cache (and sparse pool), one scale a KV
    head calibrated from the data (:func:`.peers.fp8_cache`), through ``plan.run``; checked
    against the float64 reference over the same fp8 cache (what it computes). The copy is
    made outside the timed region. ``hopper``, ``config``: as :func:`swattn.plan_decode`'s
    (with ``hopper=True`` the dict changes the Hopper path's config)."""
    need_device(inputs)
    import swattn

    from .. import reference
    case = inputs.case
    k8, v8, k_scale, v_scale = fp8_cache(inputs.k_cache, inputs.v_cache, fp8, latent=case.latent)
    sparse = None
    if inputs.sparse is not None:
        sparse = fp8_pool(inputs.sparse, k_scale, v_scale, fp8, case.latent)
    table = inputs.block_table_window
    try:
        plan = swattn.plan_decode(
            case.seq_lens, num_q_heads=case.num_q_heads, num_kv_heads=case.num_kv_heads,
            head_dim=case.head_dim, head_dim_v=case.head_dim_v, page_size=case.page_size,
            window_left=case.window_left, sparse_keys=sparse[2].shape[1] if sparse else 0,
            kv_dtype=fp8, dtype=inputs.q.dtype, device=inputs.q.device, hopper=hopper,
            config=config, attention_chunk=case.attention_chunk)
    except ValueError as exc:
        raise Skip(str(exc)) from None
    out = empty_out(inputs)

    def run():
        plan.run(inputs.q, k8, v8, table, sinks=inputs.sinks, sparse=sparse, k_scale=k_scale,
                 v_scale=v_scale, out=out)

    def want():
        n = min(CHECK_SEQS, case.batch)
        part = None if sparse is None else (sparse[0], sparse[1], sparse[2][:n])
        return reference.decode_attention(
            inputs.q[:n], k8, v8, table[:n], inputs.seq_lens[:n], window_left=case.window_left,
            sinks=inputs.sinks, sparse=part, k_scale=k_scale, v_scale=v_scale,
            attention_chunk=case.attention_chunk)

    stages = f", {plan.config.num_stages} stages" if plan.path == "hopper" else ""
    note = (f"{str(fp8)[6:]} cache (one scale a KV head), {plan.path} kernel "
            f"BN{plan.config.block_n}{stages}, {plan.num_splits} split(s); checked against the "
            "reference over the same fp8 cache")
    return Prepared(run, lambda: out, note, True, poisoner(out), [plan, k8, v8, sparse],
                    host={"plan.run": run}, reference=want, kv_bytes=1)


# --------------------------------------------------------------------------------------
# The variants a decode run times, in the order of the table, and one case.
# --------------------------------------------------------------------------------------

VARIANTS = (
    Variant("swattn tight", "tight", "tight", lambda i: ours(i)),
    Variant("swattn tight (control)", "control", "control", lambda i: ours(i, control=True)),
    Variant("swattn skip, full layout", "skip", "ours",
            lambda i: ours(i, bounds="skip", layout="full")),
    Variant("swattn tight, 1 split", "split1", "ours", lambda i: ours(i, num_splits=1)),
    Variant("swattn tight, Triton kernel", "triton", "ours", lambda i: ours(i, hopper=False)),
    Variant("swattn tight, fp8 e4m3 cache", "fp8", "ours", lambda i: ours_fp8(i)),
    Variant("swattn tight, fp8 e4m3 cache, Triton kernel", "fp8-triton", "ours",
            lambda i: ours_fp8(i, hopper=False)),
    Variant("SGLang decode", "sglang", "peer", sglang_decode),
    Variant("vLLM unified", "vllm", "peer", vllm_decode),
    Variant("vLLM unified, fp8 e4m3 cache", "vllm-fp8", "peer",
            lambda i: vllm_decode(i, fp8=torch.float8_e4m3fn)),
    Variant("FlexAttention", "flex", "peer", flex_decode),
    Variant("FlashInfer", "flashinfer", "peer", flashinfer_decode),
    Variant("FlashInfer, fp8 e4m3 cache", "flashinfer-fp8", "peer",
            lambda i: flashinfer_decode(i, fp8=torch.float8_e4m3fn)),
)


# Chunked local attention (C-L4): swattn's rows with the chunk, the same decode over a window
# of the chunk's keys, and the peers as they serve a chunk.
CHUNK_VARIANTS = (
    Variant("swattn tight", "tight", "tight", lambda i: ours(i)),
    Variant("swattn tight (control)", "control", "control", lambda i: ours(i, control=True)),
    Variant("swattn tight, a window of the chunk's keys (no chunk)", "same-keys", "ours",
            lambda i: ours(i, same_keys=True)),
    Variant("swattn skip, full layout", "skip", "ours",
            lambda i: ours(i, bounds="skip", layout="full")),
    Variant("swattn tight, 1 split", "split1", "ours", lambda i: ours(i, num_splits=1)),
    Variant("swattn tight, Triton kernel", "triton", "ours", lambda i: ours(i, hopper=False)),
    Variant("swattn tight, fp8 e4m3 cache", "fp8", "ours", lambda i: ours_fp8(i)),
    Variant("vLLM unified, virtual batches", "vllm", "peer", vllm_chunk_decode),
    Variant("FlashAttention 3, attention_chunk", "flash-attn", "peer", flash_attn_chunk_decode),
    Variant("FlexAttention, chunk mask", "flex", "peer", flex_decode),
    Variant("FlashInfer, one instance a chunk", "flashinfer", "peer", flashinfer_chunk_decode),
)


def variants_for(case):
    """The variants of a decode case: the V4 rows' (:mod:`.second_variants`) with a second
    key source, :data:`CHUNK_VARIANTS` under a chunk, else :data:`VARIANTS`."""
    if case.second is not None:
        return second_variants.VARIANTS
    return CHUNK_VARIANTS if case.attention_chunk is not None else VARIANTS


def run_case(case, variants, **kwargs):
    """:func:`swattn.bench.harness.run_case` with the decode inputs and reference (the V4
    rows': :func:`.second_variants.run_case`)."""
    if case.second is not None:
        return second_variants.run_case(case, variants, **kwargs)
    return harness.run_case(case, variants, build=build_inputs, reference=reference_first, **kwargs)
