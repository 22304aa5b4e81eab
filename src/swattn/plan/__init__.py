"""Plan once per batch, run per layer: the engine path.

A plan takes a batch's metadata on the host (lists or CPU tensors; a GPU tensor is read
back once, here), checks it, chooses the kernel and its config (the one place in swattn
that decides which kernel runs), keeps the lengths in device buffers of its own and
allocates its scratch. ``plan.run`` then serves every layer that shares the batch, the
window and the dtypes: it checks only what a tensor carries on the host, never reads
device memory, never waits for the GPU, allocates nothing when ``out`` (and ``lse``) are
given, and can be captured in a CUDA graph. ``plan.replan`` writes the next batch's
lengths into the same buffers in place (the same batch size, or a smaller one padded to
it), so a captured run replays with them.

A plan's scratch (the decode split's partial states) and buffers are its own: keep the plan
alive while a graph captured from its ``run`` replays, and run one plan on one stream at a
time.

``extend.py`` holds the extend plan, ``decode.py`` the decode plan, each with the plan of a
one-shot call (sizes from the call's tensors, the lengths neither read nor copied); this
module, the one-shot calls with the verification options (``run_extend``, ``run_decode``).
"""

from ..ops import _launch
from ._common import ONE_SHOT, replace_spec
from .decode import DecodePlan, decode_plan_for, plan_decode
from .extend import ExtendPlan, extend_plan_for, plan_extend, plan_key_ranges
from .second import SecondKeys, SecondKeysPlan, plan_second_keys

__all__ = ["ExtendPlan", "DecodePlan", "plan_extend", "plan_decode", "plan_key_ranges",
           "extend_plan_for", "decode_plan_for", "run_extend", "run_decode", "SecondKeys",
           "SecondKeysPlan", "plan_second_keys", "forget_one_shot", "compiled_launchers"]


def forget_one_shot():
    """Forget the choices one-shot calls remembered by their sizes (the next call of each
    size plans, and checks, from scratch)."""
    ONE_SHOT.clear()


def compiled_launchers():
    """How many compiled kernels the plans' direct launcher holds (ops._launch): a run on a
    layout an earlier run compiled adds none."""
    return len(_launch._COMPILED)


def _tiling(config, **fields):
    """``config`` with the tile fields given (not None) changed: a dict of Config fields."""
    fields = {k: v for k, v in fields.items() if v is not None}
    if not fields:
        return config
    if config is not None and not isinstance(config, dict):
        return replace_spec(config, **fields)
    return {**(config or {}), **fields}


def run_extend(q, k, v, k_cache, v_cache, block_table, cu_seqlens, prefix_lens, *, sinks=None,
               mask=None, out=None, lse=None, k_scale=None, v_scale=None, block_m=None,
               block_n=None, pack_gqa=None, config=None, **options):
    """:func:`extend_plan_for` and its run on these tensors. ``block_m``, ``block_n``,
    ``pack_gqa`` change those fields of the config (the Triton kernel's tiling)."""
    plan = extend_plan_for(q, k, v, k_cache, v_cache, block_table, cu_seqlens, prefix_lens,
                           config=_tiling(config, block_m=block_m, block_n=block_n,
                                          pack_gqa=pack_gqa), **options)
    return plan.run(q, k, v, k_cache, v_cache, block_table, sinks=sinks, mask=mask, k_scale=k_scale,
                    v_scale=v_scale, out=out, lse=lse)


def run_decode(q, k_cache, v_cache, block_table, seq_lens, *, sinks=None, sparse=None, out=None,
               lse=None, k_scale=None, v_scale=None, block_n=None, config=None, **options):
    """:func:`decode_plan_for` and its run on these tensors. ``block_n`` changes the
    config's key tile."""
    plan = decode_plan_for(q, k_cache, v_cache, block_table, seq_lens, sparse=sparse,
                           config=_tiling(config, block_n=block_n), **options)
    return plan.run(q, k_cache, v_cache, block_table, sinks=sinks, sparse=sparse, k_scale=k_scale,
                    v_scale=v_scale, out=out, lse=lse)
