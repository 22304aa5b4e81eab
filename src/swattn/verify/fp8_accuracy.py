"""``swattn verify --fp8-accuracy``: how far an fp8 KV cache moves attention's output (GPU; CPU
under the interpreter with fp16 queries). For each kernel (decode and two-stage extend: the
default path, the Hopper one on sm_90, and the Triton kernel; deterministic extend; on sm_90
the Hopper extend path with fp8 products, opt-in, and with the window's prefix widened before
the kernel and in it), fp8 format and scale granularity, on random keys and on keys with
outlier channels (a few channels twenty times the others, as LLM keys have), the relative error
(||out - ref|| / ||ref||) of:

  * the kernel over the fp8 cache against the float64 reference over the same fp8 cache
    (the kernel's own error: the products in the queries' precision, or with fp8 products
    the query rows' and the weights' quantization to e4m3 as well), and
  * the kernel over the fp8 cache against swattn over the unquantized cache (what the
    quantization costs).

Scales are calibrated as engines do (swattn.bench.peers.fp8_cache): the largest finite
magnitude (of the tensor, or of each KV head) maps to the format's largest value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

import swattn
from swattn import reference
from swattn.bench.peers import fp8_cache
from swattn.plan import run_decode, run_extend

from .cases import DecodeCase, ExtendCase, build_decode, build_extend, rel_err

FORMATS = (torch.float8_e4m3fn, torch.float8_e5m2)
KEYS = ("random", "outlier channels")


@dataclass(frozen=True)
class Row:
    """One kernel, keys, format and scale granularity: ``own_error`` against the reference
    over the same fp8 cache, ``cost`` against swattn over the unquantized cache."""

    kernel: str
    keys: str
    format: torch.dtype
    per_head: bool
    own_error: float
    cost: float


def with_outliers(x, seed):
    """``x`` with 4 channels of every head scaled by 20 (the same channels in every row)."""
    g = torch.Generator().manual_seed(seed)
    channels = torch.randperm(x.shape[-1], generator=g)[:4].to(x.device)
    x = x.clone()
    x[..., channels] = x[..., channels] * 20
    return x


def cases(device, dtype):
    """``(decode case, extend case)``: real sizes on a GPU, small odd ones on the CPU."""
    if device.type == "cuda":
        decode = DecodeCase([5000, 4097, 900, 64], num_q_heads=32, num_kv_heads=8, head_dim=128,
                            head_dim_v=128, page_size=16, window_left=4095, dtype=dtype, seed=51)
        extend = ExtendCase([4100, 300], [700, 129], num_q_heads=64, num_kv_heads=8, head_dim=64,
                            head_dim_v=64, page_size=16, window_left=127, dtype=dtype, seed=52)
    else:
        decode = DecodeCase([70, 33], num_q_heads=4, num_kv_heads=2, head_dim=32, head_dim_v=32,
                            page_size=16, window_left=40, dtype=dtype, seed=51)
        extend = ExtendCase([40, 3], [21, 9], num_q_heads=4, num_kv_heads=2, head_dim=32,
                            head_dim_v=32, page_size=16, window_left=20, dtype=dtype, seed=52)
    return decode, extend


def opt_in_paths(device):
    """The Hopper extend path's opt-in variants, on sm_90 only: ``{name: run_extend options}``."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device) != (9, 0):
        return {}
    return {"extend, Hopper path, fp8 products": {"hopper": True, "config": {"fp8_products": True}},
            "extend, Hopper path, prefix widened before the kernel": {
                "hopper": True, "config": {"prefix_rows": True}},
            "extend, Hopper path, prefix widened in the kernel": {
                "hopper": True, "config": {"prefix_rows": False}}}


def measure(device, formats=None, keys=None):
    """Every :class:`Row` on ``device``, bf16 queries on a GPU and fp16 on the CPU, for the
    ``formats`` (default :data:`FORMATS`) and ``keys`` (default :data:`KEYS`)."""
    device = torch.device(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float16
    decode, extend = cases(device, dtype)
    opt_in = opt_in_paths(device)
    rows = []
    for data in keys or KEYS:
        dt = list(build_decode(decode, device))
        et = list(build_extend(extend, device))
        if data != "random":
            dt[1] = with_outliers(dt[1], 1)
            et[3], et[1] = with_outliers(et[3], 2), with_outliers(et[1], 2)
        sinks = torch.randn(64, generator=torch.Generator().manual_seed(5)).to(device)
        kw_d = dict(window_left=decode.window_left, sinks=sinks[:decode.num_q_heads])
        kw_e = dict(window_left=extend.window_left, sinks=sinks[:extend.num_q_heads])
        exact = {"decode": swattn.decode_attention(*dt, **kw_d),
                 "decode, Triton kernel": run_decode(*dt, hopper=False, **kw_d),
                 "extend, two-stage": swattn.extend_attention(*et, **kw_e),
                 "extend, two-stage, Triton kernel": run_extend(*et, hopper=False, **kw_e),
                 "extend, deterministic": swattn.extend_attention(*et, deterministic=True, **kw_e)}
        exact.update({name: exact["extend, two-stage"] for name in opt_in})
        for fp8 in formats or FORMATS:
            for per_head in (False, True):
                k8, v8, ks, vs = fp8_cache(dt[1], dt[2], fp8, per_head)
                d8 = dt[:1] + [k8, v8] + dt[3:]
                want = reference.decode_attention(*d8, k_scale=ks, v_scale=vs, **kw_d)
                got = [("decode", swattn.decode_attention(*d8, k_scale=ks, v_scale=vs, **kw_d),
                        want),
                       ("decode, Triton kernel",
                        run_decode(*d8, k_scale=ks, v_scale=vs, hopper=False, **kw_d), want)]
                k8, v8, ks, vs = fp8_cache(et[3], et[4], fp8, per_head)
                e8 = et[:3] + [k8, v8] + et[5:]
                want = reference.extend_attention(*e8, k_scale=ks, v_scale=vs, **kw_e)
                for name, kw in (("extend, two-stage", {}),
                                 ("extend, two-stage, Triton kernel", {"hopper": False}),
                                 ("extend, deterministic", {"deterministic": True}),
                                 *opt_in.items()):
                    got.append((name, run_extend(*e8, k_scale=ks, v_scale=vs, **kw, **kw_e),
                                want))
                rows += [Row(name, data, fp8, per_head, rel_err(out, ref),
                             rel_err(out, exact[name])) for name, out, ref in got]
    return rows


def format_table(rows, where):
    """The rows as a markdown table, titled with ``where`` they ran."""
    lines = [f"fp8 KV cache accuracy, {where}; relative error of the output",
             "| kernel | keys | format | scales | vs reference over the fp8 cache | "
             "vs the unquantized cache |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r.kernel} | {r.keys} | {str(r.format)[6:]} | "
              f"{'per KV head' if r.per_head else 'per tensor'} | {r.own_error:.2e} | "
              f"{r.cost:.2e} |" for r in rows]
    return "\n".join(lines)


def run(device):
    """Print the table; the exit status is 1 where an error is not finite (a NaN output),
    else 0: the errors are reported, not judged."""
    device = torch.device(device)
    rows = measure(device)
    where = (f"{torch.cuda.get_device_name(device)}, bf16 queries" if device.type == "cuda"
             else "CPU interpreter, fp16 queries")
    print(format_table(rows, where))
    return 0 if all(math.isfinite(r.own_error) and math.isfinite(r.cost) for r in rows) else 1
