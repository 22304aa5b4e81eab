"""How far an fp8 KV cache moves attention's output (GPU; CPU under the interpreter with fp16
queries). For each kernel (decode and two-stage extend: the default path, the Hopper one on
sm_90, and the Triton kernel; deterministic extend; on sm_90 the Hopper extend path with fp8
products, opt-in, and with the window's prefix widened before the kernel and in it), fp8
format and scale granularity, on random keys and on keys with outlier channels (a few channels 20x the
others, as LLM keys have), the relative error (||out - ref|| / ||ref||) of:

  * the kernel over the fp8 cache against the float64 reference over the same fp8 cache
    (the kernel's own error: the products in the queries' precision, or with fp8 products
    the query rows' and the weights' quantization to e4m3 as well), and
  * the kernel over the fp8 cache against swattn over the unquantized cache (what the
    quantization costs).

Scales are calibrated as engines do (swattn.bench.peers.fp8_cache): the largest finite
magnitude (of the tensor, or of each KV head) maps to the format's largest value.

    PYTHONPATH=src python3 scripts/fp8_accuracy.py
"""

import torch

import swattn
from swattn import reference
from swattn.bench.peers import fp8_cache
from swattn.plan import run_decode, run_extend
from swattn.verify.cases import DecodeCase, ExtendCase, build_decode, build_extend, rel_err

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
DTYPE = torch.bfloat16 if GPU else torch.float16


def with_outliers(x, seed):
    """``x`` with 4 channels of every head scaled by 20 (the same channels in every row)."""
    g = torch.Generator().manual_seed(seed)
    channels = torch.randperm(x.shape[-1], generator=g)[:4].to(x.device)
    x = x.clone()
    x[..., channels] = x[..., channels] * 20
    return x


def cases():
    if GPU:
        decode = DecodeCase([5000, 4097, 900, 64], num_q_heads=32, num_kv_heads=8, head_dim=128,
                            head_dim_v=128, page_size=16, window_left=4095, dtype=DTYPE, seed=51)
        extend = ExtendCase([4100, 300], [700, 129], num_q_heads=64, num_kv_heads=8, head_dim=64,
                            head_dim_v=64, page_size=16, window_left=127, dtype=DTYPE, seed=52)
    else:
        decode = DecodeCase([70, 33], num_q_heads=4, num_kv_heads=2, head_dim=32, head_dim_v=32,
                            page_size=16, window_left=40, dtype=DTYPE, seed=51)
        extend = ExtendCase([40, 3], [21, 9], num_q_heads=4, num_kv_heads=2, head_dim=32,
                            head_dim_v=32, page_size=16, window_left=20, dtype=DTYPE, seed=52)
    return decode, extend


def main():
    decode, extend = cases()
    print(f"fp8 KV cache accuracy, {torch.cuda.get_device_name() if GPU else 'CPU interpreter'}, "
          f"{str(DTYPE)[6:]} queries; relative error of the output")
    print("| kernel | keys | format | scales | vs reference over the fp8 cache | "
          "vs the unquantized cache |")
    print("|---|---|---|---|---|---|")
    for data in ("random", "outlier channels"):
        dt = list(build_decode(decode, DEVICE))
        et = list(build_extend(extend, DEVICE))
        if data != "random":
            dt[1] = with_outliers(dt[1], 1)
            et[3], et[1] = with_outliers(et[3], 2), with_outliers(et[1], 2)
        sinks = torch.randn(64, generator=torch.Generator().manual_seed(5)).to(DEVICE)
        kw_d = dict(window_left=decode.window_left, sinks=sinks[:decode.num_q_heads])
        kw_e = dict(window_left=extend.window_left, sinks=sinks[:extend.num_q_heads])
        exact = {"decode": swattn.decode_attention(*dt, **kw_d),
                 "decode, Triton kernel": run_decode(*dt, hopper=False, **kw_d),
                 "extend, two-stage": swattn.extend_attention(*et, **kw_e),
                 "extend, two-stage, Triton kernel": run_extend(*et, hopper=False, **kw_e),
                 "extend, deterministic": swattn.extend_attention(*et, deterministic=True, **kw_e)}
        hopper_rows = {}
        if GPU and torch.cuda.get_device_capability() == (9, 0):
            hopper_rows = {"extend, Hopper path, fp8 products": {
                "hopper": True, "config": {"fp8_products": True}},
                "extend, Hopper path, prefix widened before the kernel": {
                "hopper": True, "config": {"prefix_rows": True}},
                "extend, Hopper path, prefix widened in the kernel": {
                "hopper": True, "config": {"prefix_rows": False}}}
            exact.update({name: exact["extend, two-stage"] for name in hopper_rows})
        for fp8 in (torch.float8_e4m3fn, torch.float8_e5m2):
            for per_head in (False, True):
                k8, v8, ks, vs = fp8_cache(dt[1], dt[2], fp8, per_head)
                d8 = dt[:1] + [k8, v8] + dt[3:]
                got = swattn.decode_attention(*d8, k_scale=ks, v_scale=vs, **kw_d)
                want = reference.decode_attention(*d8, k_scale=ks, v_scale=vs, **kw_d)
                rows = [("decode", got, want),
                        ("decode, Triton kernel",
                         run_decode(*d8, k_scale=ks, v_scale=vs, hopper=False, **kw_d),
                         want)]
                k8, v8, ks, vs = fp8_cache(et[3], et[4], fp8, per_head)
                e8 = et[:3] + [k8, v8] + et[5:]
                want = reference.extend_attention(*e8, k_scale=ks, v_scale=vs, **kw_e)
                for name, kw in (("extend, two-stage", {}),
                                 ("extend, two-stage, Triton kernel", {"hopper": False}),
                                 ("extend, deterministic", {"deterministic": True}),
                                 *hopper_rows.items()):
                    rows.append((name, run_extend(*e8, k_scale=ks, v_scale=vs, **kw, **kw_e),
                                 want))
                for name, got, want in rows:
                    print(f"| {name} | {data} | {str(fp8)[6:]} | "
                          f"{'per KV head' if per_head else 'per tensor'} | "
                          f"{rel_err(got, want):.2e} | {rel_err(got, exact[name]):.2e} |")


if __name__ == "__main__":
    main()
