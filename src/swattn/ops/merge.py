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

import torch
import triton
import triton.language as tl
from triton.language.extra import cuda as tl_cuda

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
    b_o = tl.load(p_o + o_dv[None, :],
                  mask=m_part[:, None] & (o_dv < DV)[None, :], other=0.0).to(tl.float32)  # [BS, BDV]
    denom = l
    if HAS_SINKS:
        denom = l + tl.exp(tl.load(sinks + i_h) - m_safe)
    o = tl.where(l > 0.0, tl.sum(w[:, None] * b_o, 0) / denom, 0.0)  # [BDV]
    tl.store(Out + i_n * stride_n + i_h * stride_h + o_dv, o.to(Out.dtype.element_ty), mask=o_dv < DV)
    if RETURN_LSE:
        tl.store(Lse + i_n * stride_lse_n + i_h, tl.where(l > 0.0, m_safe + tl.log(l), float("-inf")))


def launch_merge(parts_o, parts_lse, sinks, out, lse, finite=False, pdl=False):
    """Merge ``parts_o [S, N, H, Dv]`` (any strides, Dv contiguous) and ``parts_lse
    [S, N, H]`` float32 into ``out [N, H, Dv]`` and, if given, ``lse [N, H]``. Validated
    arguments only; no host sync, no allocation (CUDA-graph safe). ``finite``: every part's
    output is finite, so it is read whatever its lse; ``pdl``: launched as a programmatic
    dependent of the previous kernel on the stream (sm_90+), which must write the parts
    before it exits."""
    num_parts, rows, heads, dv = parts_o.shape
    if rows == 0 or heads == 0:
        return
    _merge_kernel[(rows, heads)](
        Parts_o=parts_o, Parts_lse=parts_lse, sinks=sinks if sinks is not None else parts_lse,
        Out=out, Lse=lse if lse is not None else parts_lse,
        stride_os=parts_o.stride(0), stride_on=parts_o.stride(1), stride_oh=parts_o.stride(2),
        stride_ls=parts_lse.stride(0), stride_ln=parts_lse.stride(1), stride_lh=parts_lse.stride(2),
        stride_n=out.stride(0), stride_h=out.stride(1),
        stride_lse_n=lse.stride(0) if lse is not None else 0, num_parts=num_parts,
        DV=dv, BLOCK_S=max(triton.next_power_of_2(num_parts), 2),
        BLOCK_DV=triton.next_power_of_2(dv), HAS_SINKS=sinks is not None,
        RETURN_LSE=lse is not None, FINITE=finite, WAIT=pdl,
        num_warps=1 if num_parts * dv <= 2048 else 4, launch_pdl=pdl,
    )


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
        check_tensor("out", out, dim=3, dtype=first.dtype, device=first.device, shape=(rows, heads, dv))
    if lse is not None:
        check_tensor("lse", lse, dim=2, dtype=torch.float32, device=first.device, shape=(rows, heads))


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
