"""Host time of one call on tiny problems (GPU): what the CPU spends issuing a plan's run, a
one-shot call and a plan, at the heads of workloads A (gpt-oss: 64/8 heads of 64, window 128,
sinks) and C-A (its decode), with four sequences of a few tokens so the GPU waits on the host.
Seven rounds of 500 calls each, back to back after 20 warm-up calls; min and median of the
rounds' means, in microseconds a call; then a profile of the one-shot extend call. First, the
host's own speed (one tiny torch op) to compare machines.

    PYTHONPATH=src python3 scripts/host_time.py
"""

import cProfile
import pstats
import time

import torch

import swattn
from swattn.verify.cases import DecodeCase, ExtendCase, build_decode, build_extend


def host_us(fn, n=500):
    for _ in range(20): fn()
    res = []
    for _ in range(7):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n): fn()
        res.append((time.perf_counter() - t) / n * 1e6)
    torch.cuda.synchronize()
    res.sort()
    return f"min {res[0]:.1f} med {res[3]:.1f}"

sinks = torch.randn(64, device="cuda")
# The host's own speed, for comparing machines: one tiny torch op, and one tensor attribute.
one = torch.zeros(1, device="cuda")
print("host baseline: torch add_ on one element, host us", host_us(lambda: one.add_(1)))
print("host baseline: 100 x tensor.stride(), host us", host_us(lambda: [one.stride() for _ in range(100)]))
dc = DecodeCase([100, 50, 129, 7], num_q_heads=64, num_kv_heads=8, head_dim=64, head_dim_v=64, page_size=16, window_left=None, dtype=torch.bfloat16, seed=1)
q, kc, vc, bt, sl = build_decode(dc, "cuda")
plan = swattn.plan_decode(sl.tolist(), num_q_heads=64, num_kv_heads=8, head_dim=64, page_size=16, window_left=127)
out = torch.empty(4, 64, 64, dtype=torch.bfloat16, device="cuda")
print("C-A heads (64/8 d64, window 128, sinks), batch 4: path", plan.path)
print("  plan.run host us", host_us(lambda: plan.run(q, kc, vc, bt, sinks=sinks, out=out)))
print("  one-shot host us", host_us(lambda: swattn.decode_attention(q, kc, vc, bt, sl, window_left=127, sinks=sinks, out=out)))
print("  plan_decode host us", host_us(lambda: swattn.plan_decode([100, 50, 129, 7], num_q_heads=64, num_kv_heads=8, head_dim=64, page_size=16, window_left=127)))
ec = ExtendCase([30, 40, 50, 60], [4, 4, 4, 4], num_q_heads=64, num_kv_heads=8, head_dim=64, head_dim_v=64, page_size=16, window_left=None, dtype=torch.bfloat16, seed=2)
t = build_extend(ec, "cuda")
out = torch.empty(16, 64, 64, dtype=torch.bfloat16, device="cuda")
for hop in (None, False):
    plan = swattn.plan_extend(t[6].tolist(), t[7].tolist(), num_q_heads=64, num_kv_heads=8, head_dim=64, page_size=16, window_left=127, hopper=hop)
    print(f"A heads (64/8 d64, window 128, sinks), 4 x 4 tokens: path {plan.path}")
    print("  plan.run host us", host_us(lambda: plan.run(*t[:6], sinks=sinks, out=out)))
print("  one-shot host us", host_us(lambda: swattn.extend_attention(*t, window_left=127, sinks=sinks, out=out)))
print("  one-shot deterministic host us", host_us(lambda: swattn.extend_attention(*t, window_left=127, sinks=sinks, out=out, deterministic=True)))
print("  plan_extend host us", host_us(lambda: swattn.plan_extend([0, 4, 8, 12, 16], [30, 40, 50, 60], num_q_heads=64, num_kv_heads=8, head_dim=64, page_size=16, window_left=127)))
# Where the Hopper path's run spends its host time: the whole run, the bound launch on
# descriptors made beforehand, and the compiled kernel's launcher on arguments assembled
# beforehand (the driver's part).
from swattn.ops import _launch
plan = swattn.plan_extend(t[6].tolist(), t[7].tolist(), num_q_heads=64, num_kv_heads=8, head_dim=64, page_size=16, window_left=127, hopper=True)
plan.run(*t[:6], sinks=sinks, out=out)
bound = plan._launch(True, False, False)
descs = plan._hopper.lazy_descriptors(plan.spec.config, *t[:5])
call = lambda: bound(t[0], t[5], plan.cu_seqlens, plan.prefix_lens, sinks, out, None, descs, t[3])
print("Hopper path breakdown: plan.run host us", host_us(lambda: plan.run(*t[:6], sinks=sinks, out=out)))
print("  bound launch (descriptors made) host us", host_us(call))
launch = bound.launch
key = next(k for k in _launch._COMPILED if k[0] == launch.id)
compiled = _launch._COMPILED[key]
num_tokens = t[0].shape[0]
grid = (64, -(-num_tokens // 128) + 4, 1)
lse_t = out
tensors = (*descs, t[5], plan.cu_seqlens, plan.prefix_lens, sinks, out, lse_t)
ints = (t[5].stride(0), out.stride(0), out.stride(1), lse_t.stride(0), t[3].shape[0] * t[3].shape[1])
print("  assemble + expand host us", host_us(lambda: compiled.expand(launch.assemble(tensors, ints)[1])))
args = compiled.expand(launch.assemble(tensors, ints)[1])
stream = torch.cuda.current_stream().cuda_stream
raw = lambda: compiled.launch(grid[0], grid[1], grid[2], stream, compiled.function, compiled.cooperative, compiled.pdl, None, None, compiled.metadata, None, None, None, *args)
print("  compiled launcher alone host us", host_us(raw))
print(f"  the launcher takes {len(args)} arguments")
pr = cProfile.Profile(); pr.enable()
for _ in range(2000): swattn.extend_attention(*t, window_left=127, sinks=sinks, out=out)
pr.disable(); torch.cuda.synchronize(); pstats.Stats(pr).sort_stats("tottime").print_stats(16)
# The host drifts over a run: its own speed again, at the end.
print("host baseline again: torch add_ on one element, host us", host_us(lambda: one.add_(1)))
