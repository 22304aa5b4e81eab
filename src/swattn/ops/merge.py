"""Merge of partial attention states over disjoint key sets.

``lse = log sum_i e^{lse_i}``, ``o = sum_i e^{lse_i} o_i / (sum_i e^{lse_i} + e^{sink})``:
the parts (context-parallel shards, the splits of a split-KV decode) carry no sink, so the
sink joins the denominator once, here. A part with lse ``-inf`` saw no key: its output is
not read (it may hold anything); all parts ``-inf`` give 0 and ``-inf``. One program per
(row, head) reads every part's lse at once, then the parts' outputs as one
[parts, Dv] tile. The split-KV decode runs this same kernel as its second pass, with two
differences: its parts are finite (a split that saw no key wrote 0), so the outputs load
beside the lses instead of after them; and on sm_90 it is launched as a programmatic
dependent of the decode kernel (PDL): its programs start while the decode's last ones
run and wait (``griddepcontrol.wait``) for the decode's writes, so the second launch's
latency is hidden.
"""

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra import cuda as tl_cuda

from ._launch import Launch
from ._validate import FLOAT_DTYPES, check_sinks, check_tensor


@triton.jit
def _merge_kernel(Parts_o, Parts_lse, sinks, Out, Lse,
                  stride_os, stride_on, stride_oh, stride_ls, stride_ln, stride_lh,
                  stride_n, stride_h, stride_lse_n, num_parts,
                  DV: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr,
                  HAS_SINKS: tl.constexpr, RETURN_LSE: tl.constexpr, FINITE: tl.constexpr,
                  WAIT: tl.constexpr):
    if WAIT:
        tl_cuda.gdc_wait()  # the parts' writer (the decode kernel) has finished
    i_n = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1).to(tl.int64)
    o_s = tl.arange(0, BLOCK_S)
    o_dv = tl.arange(0, BLOCK_DV)
    m_s = o_s < num_parts
    b_lse = tl.load(Parts_lse + o_s * stride_ls + i_n * stride_ln + i_h * stride_lh,
                    mask=m_s, other=float("-inf"))  # [BS]
    m = tl.max(b_lse, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    # exp(-inf) is 0: a part that saw no key weighs nothing, and (unless FINITE) its output
    # is not loaded.
    w = tl.exp(b_lse - m_safe)  # [BS]
    l = tl.sum(w, 0)
    m_part = m_s
    if not FINITE:
        m_part = m_s & (b_lse > float("-inf"))
    p_o = Parts_o + o_s[:, None].to(tl.int64) * stride_os + i_n * stride_on + i_h * stride_oh
    b_o = tl.load(p_o + o_dv[None, :], mask=m_part[:, None] & (o_dv < DV)[None, :],
                  other=0.0).to(tl.float32)  # [BS, BDV]
    denom = l
    if HAS_SINKS:
        denom = l + tl.exp(tl.load(sinks + i_h) - m_safe)
    # l is 0 where no part saw a key, NaN where a part is NaN (a key it could not read):
    # that reaches o and lse.
    o = tl.where(l == 0.0, 0.0, tl.sum(w[:, None] * b_o, 0) / denom)  # [BDV]
    tl.store(Out + i_n * stride_n + i_h * stride_h + o_dv, o.to(Out.dtype.element_ty),
             mask=o_dv < DV)
    if RETURN_LSE:
        tl.store(Lse + i_n * stride_lse_n + i_h,
                 tl.where(l == 0.0, float("-inf"), m_safe + tl.log(l)))


@functools.lru_cache(maxsize=128)
def _launcher(num_parts, dv, has_sinks, return_lse, finite, pdl, dtypes):
    fixed = dict(DV=dv, BLOCK_S=max(triton.next_power_of_2(num_parts), 2),
                 BLOCK_DV=triton.next_power_of_2(dv), HAS_SINKS=has_sinks,
                 RETURN_LSE=return_lse, FINITE=finite, WAIT=pdl)
    options = {"num_warps": 1 if num_parts * dv <= 2048 else 4, "launch_pdl": pdl}
    return Launch(_merge_kernel, fixed, options,
                  ("Parts_o", "Parts_lse", "sinks", "Out", "Lse"),
                  ("stride_os", "stride_on", "stride_oh", "stride_ls", "stride_ln", "stride_lh",
                   "stride_n", "stride_h", "stride_lse_n", "num_parts"), dtypes)


def split_scratch(parts, out):
    """``(part_o, part_lse, strides)`` of a split kernel's scratch (``parts``: ``(part_o
    [B, Hq, S, Dv], part_lse [B, Hq, S])``): the five strides its kernels take; without
    splits (None) ``out`` stands in for both (never written) and the strides are 0."""
    if parts is None:
        return out, out, (0, 0, 0, 0, 0)
    part_o, part_lse = parts
    pos, pls = part_o.stride(), part_lse.stride()
    return part_o, part_lse, (pos[0], pos[1], pos[2], pls[0], pls[1])


class MergeLaunch:
    """The split merge of a plan's scratch, bound once per (parts, Dv, flags); a call
    merges ``parts_o [S, N, H, Dv]``, ``parts_lse [S, N, H]`` (views of the plan's
    [N, H, S, ...] buffers) into ``out`` (and ``lse``) with the run's ``sinks`` (see
    :func:`launch_merge`); it returns what ``ops._launch.relaunch`` takes, or None."""

    def __init__(self, num_parts, dv, has_sinks, return_lse, finite, pdl, dtypes):
        self.num_parts = num_parts
        self.launch = _launcher(num_parts, dv, has_sinks, return_lse, finite, pdl, dtypes)

    def __call__(self, parts_o, parts_lse, sinks, out, lse):
        _, rows, heads, _ = parts_o.shape
        if rows == 0 or heads == 0:
            return None
        po, pl = parts_o.stride(), parts_lse.stride()
        return self.launch((rows, heads, 1),
                    (parts_o, parts_lse, parts_lse if sinks is None else sinks, out,
                     parts_lse if lse is None else lse),
                    (po[0], po[1], po[2], pl[0], pl[1], pl[2], out.stride(0), out.stride(1),
                     0 if lse is None else lse.stride(0), self.num_parts))


def launch_merge(parts_o, parts_lse, sinks, out, lse, finite=False, pdl=False):
    """Merge ``parts_o [S, N, H, Dv]`` (any strides, Dv contiguous) and ``parts_lse
    [S, N, H]`` float32 into ``out [N, H, Dv]`` and, if given, ``lse [N, H]``. Checked
    arguments only; no host sync, no allocation (CUDA-graph safe). ``finite``: every part's
    output is finite, so it is read whatever its lse; ``pdl``: launched as a programmatic
    dependent of the previous kernel on the stream (sm_90+), which must write the parts
    before it exits."""
    num_parts, rows, heads, dv = parts_o.shape
    if rows == 0 or heads == 0:
        return
    po, pl = parts_o.stride(), parts_lse.stride()
    _launcher(num_parts, dv, sinks is not None, lse is not None, finite, pdl,
              (parts_o.dtype, out.dtype))(
        (rows, heads, 1),
        (parts_o, parts_lse, sinks if sinks is not None else parts_lse, out,
         lse if lse is not None else parts_lse),
        (po[0], po[1], po[2], pl[0], pl[1], pl[2], out.stride(0), out.stride(1),
         lse.stride(0) if lse is not None else 0, num_parts))


def check_merge(outs, lses, sinks, out, lse):
    """Lists of equally shaped parts: outs [N, H, Dv] (one float dtype), lses [N, H] float32."""
    for name, parts in (("outs", outs), ("lses", lses)):
        if not isinstance(parts, (list, tuple)):
            raise TypeError(f"{name} must be a list of tensors, got {type(parts).__name__}")
    if len(outs) == 0 or len(outs) != len(lses):
        raise ValueError("outs and lses must be lists of the same length >= 1, got "
                         f"{len(outs)} and {len(lses)}")
    first = outs[0]
    check_tensor("outs[0]", first, dim=3, dtypes=FLOAT_DTYPES, first=True)
    rows, heads, dv = first.shape
    for i, (part_o, part_lse) in enumerate(zip(outs, lses)):
        check_tensor(f"outs[{i}]", part_o, dim=3, dtype=first.dtype, device=first.device,
                     shape=(rows, heads, dv))
        check_tensor(f"lses[{i}]", part_lse, dim=2, dtype=torch.float32, device=first.device,
                     shape=(rows, heads))
    check_sinks(sinks, heads, first)
    if out is not None:
        check_tensor("out", out, dim=3, dtype=first.dtype, device=first.device,
                     shape=(rows, heads, dv))
    if lse is not None:
        check_tensor("lse", lse, dim=2, dtype=torch.float32, device=first.device,
                     shape=(rows, heads))


def merge_states(outs, lses, sinks=None, out=None, lse=None):
    """Launcher of the merge (see swattn.merge_states): validates, stacks the parts (one
    copy) and launches. Returns ``(out, lse)``."""
    check_merge(outs, lses, sinks, out, lse)
    first = outs[0]
    if out is None:
        out = torch.empty(first.shape, dtype=first.dtype, device=first.device)
    if lse is None:
        lse = torch.empty(first.shape[:2], dtype=torch.float32, device=first.device)
    launch_merge(torch.stack(list(outs)), torch.stack(list(lses)), sinks, out, lse)
    return out, lse
