"""Extend rows of ``swattn bench``: swattn's variants, the table of variants and one
extend case.

Everything else (graph capture, interleaved timing, the same-variant control's noise floor,
the L2 flush, the ceilings) is the harness's (:func:`swattn.bench.harness.run_case`,
:mod:`swattn.bench.report`). The inputs and the reference check are in
:mod:`.extend_inputs`, the peers' adapters in :mod:`.extend_peers`; the decode rows mirror
this layout (:mod:`.decode`).
"""

from __future__ import annotations

import torch

from ..ops.config import HOPPER_EXTEND_128_ROWS
from ..verify.identity import TOLERANCES
from . import harness, second_variants
from .chunk_peers import flash_attn_chunk_extend, flashinfer_chunk_extend, vllm_chunk_extend
from .extend_inputs import build_inputs, reference_first
from .extend_peers import flashinfer, flex, sglang_extend, sglang_unified, vllm_unified
from .peers import Prepared, Skip, Variant, empty_out, fp8_cache, need_cuda, poisoner
from .tree_peers import flex_tree, sglang_verify

# --------------------------------------------------------------------------------------
# swattn's extend: the plan's run, as an engine calls it (tight / skip, and the same-variant
# control).
# --------------------------------------------------------------------------------------

def extend_plan(inputs, table, *, bounds="tight", deterministic=False, hopper=None, config=None,
                **kwargs):
    """The plan of one case, made as an engine makes it: from the host lengths, with the
    case's chunk, and a tree verify's positions and mask offsets (host lists); ``kwargs``
    go to the plan as they are (an fp8 cache's ``kv_dtype``, ...)."""
    import swattn
    case = inputs.case
    cu = [0]
    for _, e in case.seqs:
        cu.append(cu[-1] + e)
    return swattn.plan_extend(cu, [p for p, _ in case.seqs], num_q_heads=case.num_q_heads,
                              num_kv_heads=case.num_kv_heads, head_dim=case.head_dim,
                              head_dim_v=case.head_dim_v, page_size=case.page_size,
                              window_left=case.window_left,
                              attention_chunk=case.attention_chunk,
                              positions=inputs.host_positions(),
                              mask_indptr=inputs.host_mask_indptr(), dtype=inputs.q.dtype,
                              device=inputs.q.device, bounds=bounds, deterministic=deterministic,
                              hopper=hopper, config=config, **kwargs)


def local_args(inputs):
    """What a call takes of the case's local attention beyond the window: the chunk, and a
    tree verify's positions and mask (keyword arguments of ``swattn.extend_attention``)."""
    args = {"attention_chunk": inputs.case.attention_chunk}
    if inputs.mask is not None:
        args.update(positions=inputs.positions, mask=inputs.mask, mask_indptr=inputs.mask_indptr)
    return args


def plan_note(plan):
    """What a plan runs, for the legend: its kernel, and the Triton kernel's tiling."""
    if plan.config is None:
        return f"{plan.path} path"
    rows = ", prefix widened before it" if getattr(plan.config, "prefix_rows", False) else ""
    return f"{plan.path} kernel {plan.config.block_m}x{plan.config.block_n}{rows}"


def ours(inputs, *, bounds="tight", layout="window", control=False, deterministic=False,
         hopper=None, config=None):
    """swattn's extend through its engine path: ``swattn.plan_extend`` on the host lengths
    once, then ``plan.run`` timed (``deterministic=True``: the single-pass kernel) over the
    paged pool (page size ``case.page_size``). ``control``: a second plan of the same
    batch, timed as its own variant: the noise floor.

    ``layout="window"``: the block table holds -1 for every page wholly below the first
    new token's window and chunk (what an engine that frees out-of-window pages hands
    over), so a read of one would fault; ``"full"``: the whole prefix is mapped and only
    the bounds trim it. ``prefix_lens`` is P in both (the positions stay absolute).
    ``hopper``, ``config``: as :func:`swattn.plan_extend` takes them (None: the plan's
    choice). The case's chunk, and a tree verify's positions and mask, go to the plan and
    its run as an engine hands them over.

    The host time of a ``plan.run`` call and of the one-shot ``swattn.extend_attention``
    on the same tensors (both with ``out`` given) are measured beside the graph replay."""
    need_cuda(inputs)
    import swattn
    case = inputs.case
    table = inputs.block_table_window if layout == "window" else inputs.block_table_full
    if layout == "full" and bounds == "tight" and torch.equal(table, inputs.block_table_window):
        raise Skip("= window layout (no page lies below the window)")
    try:
        plan = extend_plan(inputs, table, bounds=bounds, deterministic=deterministic, hopper=hopper,
                           config=config)
    except ValueError as exc:
        raise Skip(str(exc)) from None
    out = empty_out(inputs)
    tensors = (inputs.q, inputs.k, inputs.v, inputs.k_pool, inputs.v_pool, table)
    local = local_args(inputs)

    def run():
        plan.run(*tensors, sinks=inputs.sinks, mask=inputs.mask, out=out)

    def one_shot():
        swattn.extend_attention(*tensors, inputs.cu_seqlens, inputs.prefix_lens,
                                window_left=case.window_left, sinks=inputs.sinks,
                                deterministic=deterministic, out=out, **local)

    host = {"plan.run": run}
    if bounds == "tight" and hopper is None and not control:
        host["one-shot"] = one_shot
    note = f"{layout} layout, {plan_note(plan)}" + (", a second plan" if control else "")
    return Prepared(run, lambda: out, note, True, poisoner(out), [plan], host=host,
                    tiling=plan.tiling())


def ours_fp8(inputs, *, fp8=torch.float8_e4m3fn, hopper=None, config=None, fp8_products=False):
    """swattn's extend over an fp8 copy of the case's paged pool, one scale a KV head
    calibrated from the data (:func:`.peers.fp8_cache`), through ``plan.run`` (the new
    tokens' k/v in bf16, taken as the cache stores them); checked against the float64
    reference over the same fp8 pool. The copy is made outside the timed region.
    ``hopper``, ``config``, ``fp8_products``: as :func:`swattn.plan_extend` takes them
    (``hopper`` and ``config`` None: the plan's choice)."""
    need_cuda(inputs)
    from .. import reference
    case = inputs.case
    k8, v8, k_scale, v_scale = fp8_cache(inputs.k_pool, inputs.v_pool, fp8)
    table = inputs.block_table_window
    plan = extend_plan(inputs, table, hopper=hopper, config=config, kv_dtype=fp8,
                       fp8_products=fp8_products)
    out = empty_out(inputs)
    tensors = (inputs.q, inputs.k, inputs.v, k8, v8, table)

    def run():
        plan.run(*tensors, sinks=inputs.sinks, mask=inputs.mask, k_scale=k_scale,
                 v_scale=v_scale, out=out)

    def want():
        new = case.seqs[0][1]
        local = local_args(inputs)
        if inputs.mask is not None:
            local.update(positions=inputs.positions[:new], mask_indptr=inputs.mask_indptr[:2],
                         mask=inputs.mask[:int(inputs.mask_indptr[1])])
        return reference.extend_attention(
            inputs.q[:new], inputs.k[:new], inputs.v[:new], k8, v8, table[:1],
            inputs.cu_seqlens[:2], inputs.prefix_lens[:1], window_left=case.window_left,
            sinks=inputs.sinks, k_scale=k_scale, v_scale=v_scale, **local)

    # fp8 products: held to their own tolerance.
    tolerance = TOLERANCES["hopper-fp8-products"] if fp8_products else None
    note = (f"{str(fp8)[6:]} cache (one scale a KV head), {plan_note(plan)}; checked against "
            "the reference over the same fp8 cache"
            + (f" within {tolerance:g}" if tolerance else ""))
    return Prepared(run, lambda: out, note, True, poisoner(out), [plan, k8, v8],
                    host={"plan.run": run}, tiling=plan.tiling(), reference=want, kv_bytes=1,
                    tolerance=tolerance)


# --------------------------------------------------------------------------------------
# The variants an extend run times, in the order of the table, and one case.
# --------------------------------------------------------------------------------------

VARIANTS = (
    Variant("swattn tight", "tight", "tight", lambda i: ours(i, bounds="tight", layout="window")),
    Variant("swattn tight (control)", "control", "control",
            lambda i: ours(i, bounds="tight", layout="window", control=True)),
    Variant("swattn tight, Triton kernel", "triton", "ours",
            lambda i: ours(i, bounds="tight", layout="window", hopper=False)),
    Variant("swattn tight, Hopper path", "hopper", "ours",
            lambda i: ours(i, bounds="tight", layout="window", hopper=True)),
    Variant("swattn tight, Hopper path, 128 rows (two warpgroups)", "bm128", "ours",
            lambda i: ours(i, hopper=True, config=HOPPER_EXTEND_128_ROWS)),
    Variant("swattn tight, Hopper path, 128 rows, 3 ring stages", "bm128-3stages", "ours",
            lambda i: ours(i, hopper=True, config=dict(HOPPER_EXTEND_128_ROWS, stages=3))),
    Variant("swattn tight, fp8 e4m3 cache", "fp8", "ours", lambda i: ours_fp8(i)),
    Variant("swattn tight, fp8 e4m3 cache, Hopper path, 128 rows", "fp8-bm128", "ours",
            lambda i: ours_fp8(i, hopper=True, config=HOPPER_EXTEND_128_ROWS)),
    Variant("swattn tight, fp8 e4m3 cache, Hopper path, 128 rows, 3 ring stages",
            "fp8-bm128-3stages", "ours",
            lambda i: ours_fp8(i, hopper=True, config=dict(HOPPER_EXTEND_128_ROWS, stages=3))),
    Variant("swattn tight, fp8 e4m3 cache, fp8 products", "fp8-products", "ours",
            lambda i: ours_fp8(i, fp8_products=True)),
    Variant("swattn tight, fp8 e4m3 cache, fp8 products, 128 rows", "fp8-products-bm128", "ours",
            lambda i: ours_fp8(i, fp8_products=True, config=HOPPER_EXTEND_128_ROWS)),
    Variant("swattn tight, fp8 e4m3 cache, fp8 products, 3 ring stages", "fp8-products-3stages",
            "ours", lambda i: ours_fp8(i, fp8_products=True, config={"stages": 3})),
    Variant("swattn tight, fp8 e4m3 cache, fp8 products, one converter warp",
            "fp8-products-1warp", "ours",
            lambda i: ours_fp8(i, fp8_products=True,
                               config={"convert_warps": 1, "convert_regs": 80})),
    Variant("swattn tight, fp8 e4m3 cache, Hopper path, prefix widened in the kernel",
            "fp8-in-kernel", "ours",
            lambda i: ours_fp8(i, hopper=True, config={"prefix_rows": False})),
    Variant("swattn tight, fp8 e4m3 cache, Triton kernel", "fp8-triton", "ours",
            lambda i: ours_fp8(i, hopper=False)),
    Variant("swattn tight, fp8 e4m3 cache, Hopper path with 3 ring stages", "fp8-3stages", "ours",
            lambda i: ours_fp8(i, hopper=True, config={"stages": 3})),
    Variant("swattn tight, full layout", "tight-full", "ours",
            lambda i: ours(i, bounds="tight", layout="full")),
    Variant("swattn skip, full layout", "skip", "ours",
            lambda i: ours(i, bounds="skip", layout="full")),
    Variant("swattn deterministic", "det", "ours", lambda i: ours(i, deterministic=True)),
    Variant("swattn deterministic skip, full layout", "det-skip", "ours",
            lambda i: ours(i, bounds="skip", layout="full", deterministic=True)),
    Variant("SGLang, window layout", "sglang", "peer", lambda i: sglang_extend(i, layout="window")),
    Variant("SGLang, full layout", "sglang-full", "peer",
            lambda i: sglang_extend(i, layout="full")),
    Variant("SGLang unified", "sglang-unified", "peer", sglang_unified),
    Variant("vLLM unified", "vllm", "peer", vllm_unified),
    Variant("vLLM unified, fp8 e4m3 pool", "vllm-fp8", "peer",
            lambda i: vllm_unified(i, fp8=torch.float8_e4m3fn)),
    Variant("FlexAttention", "flex", "peer", flex),
    Variant("FlashInfer", "flashinfer", "peer", flashinfer),
    Variant("FlashInfer, fp8 e4m3 pool", "flashinfer-fp8", "peer",
            lambda i: flashinfer(i, fp8=torch.float8_e4m3fn)),
)

# Chunked local attention (L4): swattn's rows with the chunk, and the peers as they serve a
# chunk (the window peers above have none).
_TIGHT_ROWS = (
    Variant("swattn tight", "tight", "tight", lambda i: ours(i)),
    Variant("swattn tight (control)", "control", "control", lambda i: ours(i, control=True)),
)
# swattn's rows over the whole prefix, single-pass and fp8 (chunk and tree workloads alike).
_LOCAL_ROWS = (
    Variant("swattn tight, full layout", "tight-full", "ours", lambda i: ours(i, layout="full")),
    Variant("swattn skip, full layout", "skip", "ours",
            lambda i: ours(i, bounds="skip", layout="full")),
    Variant("swattn deterministic", "det", "ours", lambda i: ours(i, deterministic=True)),
    Variant("swattn tight, fp8 e4m3 cache", "fp8", "ours", lambda i: ours_fp8(i)),
)
CHUNK_VARIANTS = _TIGHT_ROWS + (
    Variant("swattn tight, Triton kernel", "triton", "ours", lambda i: ours(i, hopper=False)),
    Variant("swattn tight, Hopper path", "hopper", "ours", lambda i: ours(i, hopper=True)),
) + _LOCAL_ROWS + (
    Variant("vLLM unified, virtual batches", "vllm", "peer", vllm_chunk_extend),
    Variant("FlashAttention 3, attention_chunk", "flash-attn", "peer", flash_attn_chunk_extend),
    Variant("FlexAttention, chunk mask", "flex", "peer", flex),
    Variant("FlashInfer, one instance a chunk piece", "flashinfer", "peer",
            flashinfer_chunk_extend),
)

# A tree verify over a window layer (T): swattn's rows with the positions and the mask (the
# Triton kernels: the Hopper path takes no custom mask), SGLang's verify path and Flex.
TREE_VARIANTS = _TIGHT_ROWS + _LOCAL_ROWS + (
    Variant("SGLang verify, window layout", "sglang", "peer", lambda i: sglang_verify(i)),
    Variant("SGLang verify, full layout", "sglang-full", "peer",
            lambda i: sglang_verify(i, layout="full")),
    Variant("FlexAttention, tree mask", "flex", "peer", flex_tree),
)


def variants_for(case):
    """The variants of an extend case: the V4 rows' (:mod:`.second_variants`) with a second
    key source, :data:`TREE_VARIANTS` for a tree verify, :data:`CHUNK_VARIANTS` under a
    chunk, else :data:`VARIANTS`."""
    if case.second is not None:
        return second_variants.VARIANTS
    if case.tree:
        return TREE_VARIANTS
    return CHUNK_VARIANTS if case.attention_chunk is not None else VARIANTS


def run_case(case, variants, **kwargs):
    """:func:`swattn.bench.harness.run_case` with the extend inputs and reference (the V4
    rows': :func:`.second_variants.run_case`)."""
    if case.second is not None:
        return second_variants.run_case(case, variants, **kwargs)
    return harness.run_case(case, variants, build=build_inputs, reference=reference_first,
                            **kwargs)
