"""The Hopper fast path (ops.extend_hopper) off the GPU: it compiles for sm_90 in every
feature combination (Triton's ptxas, in a fresh process: Gluon does not run under the
interpreter), and a launch that cannot take it says why. Its results are tested on the GPU
(tests/test_gpu.py, `swattn verify --family hopper`)."""

import pytest
import torch
from checks import run_fresh
from conftest import DEVICE

from swattn.ops import extend_hopper
from swattn.plan import run_extend
from swattn.verify.cases import ExtendCase, build_extend

SCRIPT = """
import torch
from dataclasses import replace
from swattn.ops.config import HOPPER_EXTEND_128_ROWS, hopper_extend_config
from swattn.verify import asm
e4m3, e5m2 = torch.float8_e4m3fn, torch.float8_e5m2
variants = [dict(), dict(bounds="skip"),
            dict(bounds="none", head_dim=64, dtype="fp16", page_size=64),
            dict(page_size=128, HAS_SINKS=True, USE_SOFTCAP=True, RETURN_LSE=True),
            dict(page_size=32, IS_CAUSAL=False, USE_RIGHT=True, DO_PREFIX=False),
            dict(WARP_SPECIALIZED=False), dict(WARP_SPECIALIZED=False, head_dim=64, page_size=64),
            # Over an fp8 cache (warp-specialized with converter warps, every bounds).
            dict(kv_dtype=e4m3), dict(kv_dtype=e5m2, bounds="skip", head_dim=64, dtype="fp16"),
            dict(kv_dtype=e4m3, bounds="none", page_size=128, HAS_SINKS=True, USE_SOFTCAP=True,
                 RETURN_LSE=True)]
# 128 rows a program (two warpgroups): 16-bit and fp8, warp-specialized and not.
rows128 = lambda d: replace(hopper_extend_config(d, torch.bfloat16), **HOPPER_EXTEND_128_ROWS)
variants += [dict(config=rows128(128)), dict(config=rows128(128), kv_dtype=e5m2, bounds="skip"),
             dict(config=rows128(64), head_dim=64, WARP_SPECIALIZED=False, HAS_SINKS=True)]
# fp8 products (e4m3 query rows and weights against the cache's e4m3 or e5m2 tiles).
f8p = lambda d, **kw: replace(hopper_extend_config(d, torch.bfloat16), fp8_products=True, **kw)
variants += [dict(config=f8p(128), kv_dtype=e4m3),
             dict(config=f8p(64), kv_dtype=e5m2, head_dim=64, bounds="none", HAS_SINKS=True,
                  USE_SOFTCAP=True, RETURN_LSE=True),
             dict(config=f8p(128, **HOPPER_EXTEND_128_ROWS), kv_dtype=e5m2, bounds="skip",
                  page_size=128)]
# Over an fp8 cache with the window's prefix widened before the kernel: every tile 16-bit.
prefix_rows = lambda d: replace(hopper_extend_config(d, torch.bfloat16), prefix_rows=True)
# Warp-specialized for long windows; for short ones (WARP_SPECIALIZED=False) and skip/none the
# warpgroup issues the copies itself, as over a 16-bit cache.
variants += [dict(config=prefix_rows(128), kv_dtype=e4m3),
             dict(config=prefix_rows(128), kv_dtype=e4m3, WARP_SPECIALIZED=False, HAS_SINKS=True),
             dict(config=prefix_rows(64), kv_dtype=e5m2, head_dim=64, bounds="none",
                  HAS_SINKS=True, RETURN_LSE=True)]
# key_ranges (stage 1 alone, each row its own keys): warp-specialized and not, every bounds.
ranges = dict(RANGES=True, USE_WINDOW=False, IS_CAUSAL=False, DO_NEW=False, RETURN_LSE=True)
variants += [dict(ranges, HAS_SINKS=True), dict(ranges, bounds="skip", head_dim=64)]
for flags in variants:
    c, ptx = asm.compile_hopper(**flags)
    assert c.local == 0 and c.stack == 0, (flags, c.stack)
    # Both products asynchronous, the overlap's waits as written.
    assert ptx.count("wgmma.mma_async") > 0 and "cp.async.bulk.tensor" in ptx, flags
    # The loops holding warpgroup products.
    loops = asm.mma_loops(c.sass)
    assert loops, flags
    # The loops' bounds and branches warp-uniform to ptxas (_uniform): no divergence
    # handling around the warpgroup products and copies (with it, B ran ~5% slower).
    # Warp-specialized, the sequence look-up before the partitions keeps a cold
    # fallback for its shuffles (ptxas cannot see the partition's warps converged); under
    # key_ranges the block's reductions of its rows' ranges leave one before the barriers'
    # set-up (once a program, outside the loops).
    whole = "setmaxnreg" not in ptx and not flags.get("RANGES")
    divergent = [i for i in (c.sass if whole else sum(loops, []))
                 if "WARPSYNC" in i or "ENDCOLLECTIVE" in i]
    assert not divergent, (flags, divergent[:4])
    if not flags:
        # The new-token loop (the smallest loop holding warpgroup products) moves no
        # register halves: carried as bf16 across the two loops, the weights were swapped
        # and swapped back every step (32 PRMT; 4% of B's time).
        assert not any("PRMT" in i for i in min(loops, key=len)), flags
    if getattr(flags.get("config"), "prefix_rows", False):
        # Nothing widened in the kernel: the prefix's rows and the new ones come as fp16.
        assert "cvt.rn.f16x2.e" not in ptx, flags
    elif "kv_dtype" in flags and not getattr(flags.get("config"), "fp8_products", False):
        # The widening: packed conversions, a pair of fp8 values to fp16 an instruction.
        assert "cvt.rn.f16x2.e" in ptx, flags
    elif "kv_dtype" in flags:
        # fp8 products: e4m3 against the cache's format, nothing widened, and the weights
        # the P @ V operand in their own registers (no index shuffles in the loops).
        fmt = "e4m3" if flags["kv_dtype"] == e4m3 else "e5m2"
        assert f"f32.e4m3.{fmt}" in ptx and "cvt.rn.f16x2.e" not in ptx, flags
        assert not any("SHFL.IDX" in i for i in sum(loops, [])), flags
    print(flags, len(c.sass), "instructions", c.registers, "registers")
print("compiled")
"""


def test_hopper_path_compiles_for_sm90_without_spills_or_divergence_handling():
    """Regression: the block's sequence, found from loads and a reduction, was per-thread to
    ptxas, which wrapped the warpgroup products in WARPSYNC/ENDCOLLECTIVE (c2127d4 fixed it:
    B P0 3940.7 -> 3745.7 us)."""
    result = run_fresh(SCRIPT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "compiled" in result.stdout


def _tensors(**kw):
    case = ExtendCase([5], [3], num_q_heads=4, num_kv_heads=2, head_dim=64, head_dim_v=64,
                      page_size=16, window_left=3, **kw)
    return build_extend(case, DEVICE)


@pytest.mark.skipif(DEVICE == "cuda", reason="off the GPU only")
def test_hopper_true_off_the_gpu_names_the_reason():
    with pytest.raises(ValueError, match="hopper=True.*CUDA"):
        run_extend(*_tensors(), window_left=3, hopper=True)


def test_hopper_must_be_a_bool():
    with pytest.raises(TypeError, match="hopper"):
        run_extend(*_tensors(), window_left=3, hopper="yes")


def test_config_takes_the_hopper_path_for_d64_and_d128():
    """Mistral-style d128 and gpt-oss's d64 go to the Gluon path on sm_90 (where the launch
    can take it; both measured faster there); other widths and the CPU do not; the loop
    is warp-specialized for long windows and full attention only (tight bounds)."""
    from swattn.ops.config import extend_config
    for page in (16, 64):
        assert extend_config(128, 128, 4, 4095, torch.bfloat16, "cuda", page).hopper
    assert extend_config(64, 64, 8, 127, torch.bfloat16, "cuda", 16).hopper
    assert not extend_config(256, 256, 4, 127, torch.bfloat16, "cuda", 16).hopper
    assert not extend_config(128, 128, 4, 4095, torch.float16, "cpu", 16).hopper
    from swattn.ops.config import hopper_extend_config
    cfg = hopper_extend_config(128, torch.bfloat16)
    assert cfg.q_regs and not hopper_extend_config(64, torch.bfloat16).q_regs
    assert cfg.warp_specialized("tight", 4095) and cfg.warp_specialized("tight", None)
    assert not any(cfg.warp_specialized(*a) for a in (("tight", 127), ("skip", 4095),
                                                      ("none", None)))
    # Over an fp8 cache every launch is (the converter warps are a partition), but with the
    # window's prefix widened before the kernel, which is taken as a 16-bit launch is.
    assert all(cfg.warp_specialized(b, 127, True) for b in ("tight", "skip", "none"))
    from dataclasses import replace
    rows = replace(cfg, prefix_rows=True)
    assert rows.warp_specialized("tight", 4095, True)
    assert not any(rows.warp_specialized(*a, True) for a in (("tight", 127), ("skip", 4095),
                                                            ("none", 127)))
    assert extend_hopper.takes_shape(128, 128, 16) and extend_hopper.takes_shape(64, 64, 128)
    assert not any(extend_hopper.takes_shape(*s)
                   for s in ((128, 64, 16), (96, 96, 16), (128, 128, 8), (128, 128, 48),
                             (128, 128, 96)))


def test_unsupported_plans_say_why(monkeypatch):
    """On a pretend sm_90 GPU, each thing the Gluon path does not take is named; the
    tensors' strides are the run's to check (descriptors)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    cuda = torch.device("cuda", 0)

    def why(dtype=torch.bfloat16, d=64, dv=64, page=16, masked=False, det=False):
        return extend_hopper.unsupported(cuda, dtype, d, dv, page, masked, det)

    assert why() is None
    assert "deterministic" in why(det=True)
    assert "mask" in why(masked=True)
    assert "fp16 or bf16" in why(dtype=torch.float32)
    assert "D = Dv" in why(d=48, dv=48)
    assert "page_size" in why(page=8)
    assert "CUDA" in extend_hopper.unsupported(torch.device("cpu"), torch.bfloat16, 64, 64, 16,
                                               False, False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert "sm_90" in why()


def test_descriptors_say_when_the_copy_engine_cannot_take_the_strides():
    from swattn.ops.config import hopper_extend_config
    q, k, v, kc, vc, *_ = _tensors(dtype=torch.bfloat16)
    cfg = hopper_extend_config(q.shape[-1], torch.bfloat16)
    # A head dim that is a slice of a wider row: rows 72 elements apart, off 16 bytes.
    assert isinstance(extend_hopper.descriptors(cfg, q.cpu(), k.cpu(), v.cpu(), kc.cpu(),
                                                vc.cpu()), tuple)
    # Two heads of three: rows of heads * dim still, 3 * 64 apart.
    heads = torch.zeros(k.shape[0], 3, 64, dtype=torch.bfloat16)[:, :2]
    assert isinstance(extend_hopper.descriptors(cfg, q.cpu(), heads, v.cpu(), kc.cpu(),
                                                vc.cpu()), tuple)
    odd = torch.zeros(k.shape[0], 2, 72, dtype=torch.bfloat16)[..., :64]
    assert "strides" in extend_hopper.descriptors(cfg, q.cpu(), odd, v.cpu(), kc.cpu(), vc.cpu())


def test_fp8_plans_widen_a_windows_prefix_before_the_kernel_when_it_is_small():
    """Over an fp8 cache under a window (default products) the plan widens each sequence's
    visible prefix into fp16 rows before the kernel when those rows (window + a tile a
    sequence) are at most twice its new rows; full attention, fp8 products, new keys only
    and a one-shot plan (no max_tokens) keep the kernel's widening."""
    from dataclasses import replace

    from swattn.ops.config import hopper_extend_config
    from swattn.plan.extend import chooses_prefix_rows
    cfg = hopper_extend_config(128, torch.bfloat16)
    e4m3 = torch.float8_e4m3fn
    assert chooses_prefix_rows(cfg, e4m3, 4095, "all", 4, 4 * 8192)  # B: 4 x 4159 rows
    # Short chunks under a long window:
    assert not chooses_prefix_rows(cfg, e4m3, 4095, "all", 64, 64 * 128)
    assert not chooses_prefix_rows(cfg, e4m3, None, "all", 4, 4 * 8192)
    assert not chooses_prefix_rows(cfg, torch.bfloat16, 4095, "all", 4, 4 * 8192)
    assert not chooses_prefix_rows(replace(cfg, fp8_products=True), e4m3, 4095, "all", 4, 4 * 8192)
    assert not chooses_prefix_rows(cfg, e4m3, 4095, "new", 4, 4 * 8192)
    assert not chooses_prefix_rows(cfg, e4m3, 4095, "all", 4, None)
    # Under chunked attention a window's prefix is not what the kernel reads.
    assert not chooses_prefix_rows(cfg, e4m3, 4095, "all", 4, 4 * 8192, attention_chunk=8192)
    # The rule takes the tight bounds only; a config dict's prefix_rows is checked.
    from swattn.plan.extend import with_prefix_rows
    assert with_prefix_rows(cfg, None, e4m3, 4095, "all", "tight", 4, 4 * 8192).prefix_rows
    assert not with_prefix_rows(cfg, None, e4m3, 4095, "all", "skip", 4, 4 * 8192).prefix_rows
    asked = replace(cfg, prefix_rows=True)
    assert with_prefix_rows(asked, {"prefix_rows": True}, e4m3, 4095, "all", "tight", 64,
                             64).prefix_rows  # asked for: no size rule
    for args, match in (((torch.bfloat16, 4095, "all", "tight"), "fp8"),
                        ((e4m3, None, "all", "tight"), "window"),
                        ((e4m3, 4095, "new", "tight"), "keys"),
                        ((e4m3, 4095, "all", "none"), "tight")):
        with pytest.raises(ValueError, match=f"prefix_rows=True.*{match}"):
            with_prefix_rows(asked, {"prefix_rows": True}, *args, 4, 4 * 8192)
