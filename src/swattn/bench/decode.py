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

from . import harness
from .decode_inputs import (CHECK_SEQS, DecodeInputs, build_inputs, footprint,  # noqa: F401
                            need_device, reference_first)
from .decode_peers import (SGLANG_DECODE, FLEX_MAX_ELEMENTS, SGLANG_MAX_KV_SPLITS,  # noqa: F401
                           VLLM_MIN_GRID_2D, VLLM_SEGMENTS, flashinfer_decode, flex_chunks,
                           flex_decode, sglang_decode, sglang_num_kv_splits, vllm_capture_sizes,
                           vllm_decode, vllm_threshold_3d)
from .peers import Prepared, Skip, Variant, empty_out, fp8_cache, fp8_pool, poisoner


# --------------------------------------------------------------------------------------
# swattn's decode.
# --------------------------------------------------------------------------------------

def ours(inputs, *, bounds="tight", layout="window", control=False, num_splits=None,
         hopper=None):
    """swattn's decode through its engine path: ``swattn.plan_decode`` on the host lengths
    once, then ``plan.run`` timed. ``control``: a second plan of the same batch, timed as its
    own variant: the noise floor.

    ``layout="window"``: the block table holds -1 for every page wholly below the window
    (freed pages); ``"full"``: every page is mapped (those pages hold NaN: only the bounds
    keep the kernel off them). ``num_splits=None`` lets the plan choose. S passes its
    sparse pool and index list. ``hopper``: the plan's choice of the Gluon path (None: its
    own). The host time of ``plan.run`` and of the one-shot ``swattn.decode_attention``
    (both with ``out`` given) are measured beside the graph replay.
    """
    need_device(inputs)
    import swattn
    case = inputs.case
    table = inputs.block_table_window if layout == "window" else inputs.block_table_full
    out = empty_out(inputs)
    try:
        plan = swattn.plan_decode(
            case.seq_lens, num_q_heads=case.num_q_heads, num_kv_heads=case.num_kv_heads,
            head_dim=case.head_dim, head_dim_v=case.head_dim_v, page_size=case.page_size,
            window_left=case.window_left, num_splits=num_splits,
            sparse_keys=inputs.sparse[2].shape[1] if inputs.sparse is not None else 0,
            dtype=inputs.q.dtype, device=inputs.q.device, bounds=bounds, hopper=hopper)
    except ValueError as exc:
        raise Skip(str(exc)) from None
    tensors = (inputs.q, inputs.k_cache, inputs.v_cache, table)

    def run():
        plan.run(*tensors, sinks=inputs.sinks, sparse=inputs.sparse, out=out)

    def one_shot():
        swattn.decode_attention(*tensors, inputs.seq_lens, window_left=case.window_left,
                                sinks=inputs.sinks, sparse=inputs.sparse, num_splits=num_splits,
                                out=out)

    host = {"plan.run": run}
    if bounds == "tight" and hopper is None and num_splits is None and not control:
        host["one-shot"] = one_shot
    note = (f"{layout} layout, {plan.path} kernel, {plan.num_splits} split(s)"
            + (", a second plan" if control else ""))
    return Prepared(run, lambda: out, note, True, poisoner(out), [plan], host=host)


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
            config=config)
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
            sinks=inputs.sinks, sparse=part, k_scale=k_scale, v_scale=v_scale)

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
    Variant("swattn skip, full layout", "skip", "ours", lambda i: ours(i, bounds="skip", layout="full")),
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


def run_case(case, variants, **kwargs):
    """:func:`swattn.bench.harness.run_case` with the decode inputs and reference."""
    return harness.run_case(case, variants, build=build_inputs, reference=reference_first, **kwargs)
