"""Decode rows of ``swattn bench``: swattn's variants, the table of variants and one decode case.

Everything else (graph capture, interleaved timing, the same-variant control's noise floor,
the L2 flush, the ceilings, the floor and roofline arithmetic) is the extend harness's
(:func:`swattn.bench.harness.run_case`, :mod:`swattn.bench.report`); this module only brings
what differs for one new token per sequence.

The inputs and the reference check are in :mod:`swattn.bench.decode_inputs`, the peers'
adapters in :mod:`swattn.bench.decode_peers`; this module holds swattn's own variants, the
table of variants and :func:`run_case`, and names the others' public functions.
"""

from __future__ import annotations

import importlib

from . import harness
from .decode_inputs import (CHECK_SEQS, DecodeInputs, _empty_out, _need_device, _poisoner,  # noqa: F401
                            build_inputs, footprint, reference_first)
from .decode_peers import (_SGLANG_DECODE, FLEX_MAX_ELEMENTS, SGLANG_MAX_KV_SPLITS,  # noqa: F401
                           VLLM_MIN_GRID_2D, VLLM_SEGMENTS, flashinfer_decode, flex_chunks,
                           flex_decode, sglang_decode, sglang_num_kv_splits, vllm_capture_sizes,
                           vllm_decode, vllm_threshold_3d)
from .peers import Prepared, Skip, Variant, control_module


# --------------------------------------------------------------------------------------
# swattn's decode.
# --------------------------------------------------------------------------------------

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


def ours(inputs, *, bounds="tight", layout="window", control=False, num_splits=None,
         hopper=None):
    """swattn's decode kernel over the paged cache through ``swattn.ops.decode.prepare``
    (validated once; the launch it returns does no host sync, so it is what gets captured).

    ``layout="window"``: the block table holds -1 for every page wholly below the window
    (freed pages); ``"full"``: every page is mapped (those pages hold NaN: only the bounds
    keep the kernel off them). ``num_splits=None`` lets the library choose. S passes its
    sparse pool and index list. ``hopper``: the launcher's choice of the Gluon path (None:
    the library's; its control replays the same compiled Gluon kernel, a second capture).
    """
    _need_device(inputs)
    module = decode_module(control)
    case = inputs.case
    table = inputs.block_table_window if layout == "window" else inputs.block_table_full
    out = _empty_out(inputs)
    launch, out, _ = module.prepare(
        inputs.q, inputs.k_cache, inputs.v_cache, table, inputs.seq_lens,
        window_left=case.window_left, sinks=inputs.sinks, sparse=inputs.sparse,
        num_splits=num_splits, out=out, bounds=bounds, hopper=hopper)
    splits = "library's split count" if num_splits is None else f"{num_splits} split(s)"
    kernel = {None: "", False: ", Triton kernel", True: ", Gluon path"}[hopper]
    return Prepared(launch, lambda: out, f"{layout} layout, {splits}{kernel}", True,
                    _poisoner(out))


# --------------------------------------------------------------------------------------
# The variants a decode run times, in the order of the table, and one case.
# --------------------------------------------------------------------------------------

VARIANTS = (
    Variant("swattn tight", "tight", "tight", lambda i: ours(i)),
    Variant("swattn tight (control)", "control", "control", lambda i: ours(i, control=True)),
    Variant("swattn skip, full layout", "skip", "ours", lambda i: ours(i, bounds="skip", layout="full")),
    Variant("swattn tight, 1 split", "split1", "ours", lambda i: ours(i, num_splits=1)),
    Variant("swattn tight, Triton kernel", "triton", "ours", lambda i: ours(i, hopper=False)),
    Variant("SGLang decode", "sglang", "peer", sglang_decode),
    Variant("vLLM unified", "vllm", "peer", vllm_decode),
    Variant("FlexAttention", "flex", "peer", flex_decode),
    Variant("FlashInfer", "flashinfer", "peer", flashinfer_decode),
)


def run_case(case, variants, **kwargs):
    """:func:`swattn.bench.harness.run_case` with the decode inputs and reference."""
    return harness.run_case(case, variants, build=build_inputs, reference=reference_first, **kwargs)
