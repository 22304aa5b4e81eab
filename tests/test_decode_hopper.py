"""The Hopper decode path (ops.decode_hopper): off the GPU it compiles for sm_90 in every
feature combination (Triton's ptxas, in a fresh process: Gluon does not run under the
interpreter) and a launch that cannot take it says why; on the GPU, against the reference
with its three bounds variants bit-identical, and a plan's run replayed from a CUDA graph
after replan."""

import pytest
import torch
from checks import assert_bounds_identical, assert_matches_reference, replay_after, run_fresh
from conftest import DEVICE

import swattn
from swattn import reference
from swattn.ops import decode as ops_decode
from swattn.plan import run_decode
from swattn.verify.cases import DecodeCase, build_decode, rel_err

SCRIPT = """
import torch
from swattn.ops.config import hopper_decode_config
from swattn.verify import asm
variants = [dict(), dict(bounds="skip"), dict(bounds="none"), dict(head_dim=64, dtype="fp16"),
            dict(page_size=64, group=1), dict(page_size=128, group=64, USE_WINDOW=False),
            dict(page_size=32, HAS_SINKS=True, USE_SOFTCAP=True, RETURN_LSE=True),
            dict(WRITE_PARTIAL=True, bounds="skip"), dict(WRITE_PARTIAL=True, PDL=True),
            dict(kv_dtype=torch.float8_e4m3fn), dict(kv_dtype=torch.float8_e4m3fn, bounds="none"),
            dict(kv_dtype=torch.float8_e5m2, head_dim=64, dtype="fp16", WRITE_PARTIAL=True,
                 bounds="skip"),
            dict(kv_dtype=torch.float8_e4m3fn, page_size=128, group=64, HAS_SINKS=True,
                 USE_SOFTCAP=True, RETURN_LSE=True),
            dict(kv_dtype=torch.float8_e4m3fn, ITEMS=2, WRITE_PARTIAL=True)]
for flags in variants:
    c, ptx = asm.compile_hopper_decode(**flags)
    assert c.local == 0 and c.stack == 0, (flags, c)
    assert "cp.async.bulk.tensor" in ptx, flags
    fp8 = flags.get("kv_dtype")
    if fp8 is None:
        assert ptx.count("wgmma.mma_async") > 0, flags
    else:
        # An fp8 cache's tiles widen to fp16 in registers by the packed conversion (none
        # through fp32) for mma.sync products, and no widened tile is written back: in the
        # tile loop the only shared-memory accesses are the fp8 tiles' reads: at d128 two
        # 16-byte reads a K row and one a V row, at d64 one 16-byte read a K row and one of 8
        # bytes a V row, each thread 2 K rows and 4 V rows of each 64-key sub-tile
        # (ops.decode_hopper._k_read), a tile holding block_n / 64 of them.
        name = "e4m3" if fp8 == torch.float8_e4m3fn else "e5m2"
        assert f"cvt.rn.f16x2.{name}x2" in ptx and "wgmma" not in ptx, flags
        assert "mma.sync.aligned.m16n8k16" in ptx, flags
        # (one tile loop a work item: the items' loop is unrolled)
        subs = hopper_decode_config(128, torch.bfloat16, fp8).block_n // 64
        reads = (["LDS.128"] * 8 * subs if flags.get("head_dim", 128) == 128
                 else ["LDS.128"] * 2 * subs + ["LDS.64"] * 4 * subs)
        assert len(asm.mma_loops(c.sass)) == flags.get("ITEMS", 1), flags
        for body in asm.mma_loops(c.sass):
            assert not [i for i in body if i.startswith("F2F.")], flags
            shared = [i.split()[0] for i in body if i.startswith(("LDS", "STS", "LDSM", "STSM"))]
            assert sorted(shared) == reads, (flags, shared)
    # The split merge's PDL trigger exactly where asked for.
    assert ("griddepcontrol.launch_dependents" in ptx) == flags.get("PDL", False), flags
    # The tile loop's branches warp-uniform to ptxas: no divergence handling around its
    # products and waits (a branch on a per-thread value, such as a reduction's, puts
    # WARPSYNC/ENDCOLLECTIVE there).
    loops = asm.mma_loops(c.sass)
    assert loops, flags
    assert not [i for i in sum(loops, []) if "WARPSYNC" in i or "ENDCOLLECTIVE" in i], flags
    # Two programs an SM at d128: the registers (setmaxnreg moves them between the
    # partitions) and the shared memory (the ring, the query tile and, over an fp8 cache,
    # the two widened tiles).
    assert c.registers <= 128 and "setmaxnreg" in ptx, (flags, c.registers)
    if flags.get("head_dim", 128) == 128:
        assert 2 * (c.shared + 1024) <= 233472, (flags, c.shared)
    print(flags, len(c.sass), "instructions", c.registers, "registers", c.shared, "shared")
print("compiled")
"""


def test_hopper_decode_compiles_for_sm90():
    result = run_fresh(SCRIPT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "compiled" in result.stdout


@pytest.mark.skipif(DEVICE == "cuda", reason="off the GPU only")
def test_hopper_true_off_the_gpu_names_the_reason():
    case = DecodeCase([5, 9], num_q_heads=4, num_kv_heads=2, page_size=16, window_left=3)
    with pytest.raises(ValueError, match="hopper=True.*CUDA"):
        run_decode(*build_decode(case, DEVICE), window_left=3, hopper=True)


def test_hopper_must_be_a_bool():
    case = DecodeCase([5], num_q_heads=4, num_kv_heads=2, page_size=16, window_left=3)
    with pytest.raises(TypeError, match="hopper"):
        run_decode(*build_decode(case, DEVICE), window_left=3, hopper="yes")


def test_hopper_decode_pages_fit_the_tile():
    # A tile's pages: a page size divides the tile (64 keys, 128 over an fp8 cache) or is
    # divided by it; pages of 192 fit 64-key tiles only.
    from swattn.ops import decode_hopper
    from swattn.ops.config import hopper_decode_config
    fp8 = hopper_decode_config(128, torch.bfloat16, torch.float8_e4m3fn).block_n
    assert fp8 == 128 and hopper_decode_config(128, torch.bfloat16).block_n == 64
    for page, fits64, fits128 in ((16, True, True), (128, True, True), (192, True, False),
                                  (256, True, True), (24, False, False)):
        assert decode_hopper.takes_shape(128, 128, 4, page) == fits64, page
        assert decode_hopper.takes_shape(128, 128, 4, page, fp8) == fits128, page
    # Over an fp8 cache a tile is one or two 64-key sub-tiles.
    e4m3 = torch.float8_e4m3fn
    assert decode_hopper.takes_shape(128, 128, 4, 32, 64, e4m3)
    assert decode_hopper.takes_shape(128, 128, 4, 32, 128, e4m3)
    assert not decode_hopper.takes_shape(128, 128, 4, 32, 256, e4m3)
    assert decode_hopper.takes_shape(128, 128, 4, 32, 256)


def test_hopper_decode_config_problems_are_named():
    # What the plan's ValueError says of a config (hopper=True with a dict): a tile that
    # does not fit, several work items a program over a 16-bit cache, a count not an int.
    from dataclasses import replace

    from swattn.ops import decode_hopper
    from swattn.ops.config import hopper_decode_config
    e4m3 = torch.float8_e4m3fn
    fp8 = hopper_decode_config(128, torch.bfloat16, e4m3)
    bf16 = hopper_decode_config(128, torch.bfloat16)
    assert decode_hopper.config_problem(fp8, 128, 128, 4, 16, e4m3) is None
    assert decode_hopper.config_problem(replace(fp8, items=3), 128, 128, 4, 16, e4m3) is None
    assert "block_n=256" in decode_hopper.config_problem(replace(fp8, block_n=256), 128, 128, 4,
                                                         32, e4m3)
    assert "items=2" in decode_hopper.config_problem(replace(bf16, items=2), 128, 128, 4, 16)
    assert "items=0" in decode_hopper.config_problem(replace(fp8, items=0), 128, 128, 4, 16, e4m3)
    assert "items=1.5" in decode_hopper.config_problem(replace(fp8, items=1.5), 128, 128, 4, 16,
                                                       e4m3)


def _case(lens, hq, hkv, d, page, window, dtype=torch.bfloat16, seed=0, **kwargs):
    case = DecodeCase(lens, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, head_dim_v=d,
                      page_size=page, window_left=window, dtype=dtype, seed=seed)
    case.kwargs = kwargs
    return case


# Windows starting mid-page and mid-tile, sequences shorter than the window and of one
# key, page sizes below, at and above the 64-key tile, groups of 1 to 64, splits 1 to 8
# (uneven chunks, splits that start past the sequence), sinks, soft-cap, lse, fp16.
GPU_CASES = [
    _case([1, 63, 64, 65, 200, 4133], 32, 8, 128, 16, 127, seed=1, num_splits=1),
    _case([1, 63, 64, 65, 200, 4133], 32, 8, 128, 16, None, seed=2, num_splits=3, return_lse=True),
    _case([4097, 5000, 17], 8, 1, 64, 32, 4095, dtype=torch.float16, seed=3, num_splits=2,
          sinks=True, softcap=20.0),
    _case([300, 1, 129], 64, 1, 128, 64, 100, seed=4, num_splits=None, return_lse=True),
    _case([1000, 77], 4, 4, 64, 128, 63, seed=5, num_splits=8, sinks=True, return_lse=True),
    _case([513, 2], 16, 2, 128, 16, 0, dtype=torch.float16, seed=6, num_splits=1),
    _case([9000, 31, 4096], 16, 4, 128, 16, 4095, seed=7, num_splits=5, sinks=True),
    _case([8000, 1, 300], 16, 2, 64, 16, None, seed=8, num_splits=None, sinks=True,
          return_lse=True),
    # Chunked attention: the query's chunk starts mid-tile, past the window, or at 0.
    _case([9000, 31, 4096, 1500], 16, 4, 128, 16, 4095, seed=9, num_splits=3,
          attention_chunk=1000),
    _case([9000, 8193, 2049], 8, 2, 64, 64, None, seed=10, num_splits=None, sinks=True,
          attention_chunk=4096),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=[f"{c.id()}-{sorted(c.kwargs)}" for c in GPU_CASES])
def test_gpu_hopper_decode_against_reference_and_bounds(case):
    tensors = build_decode(case, "cuda")
    kw = dict(case.kwargs, window_left=case.window_left)
    if kw.pop("sinks", False):
        kw["sinks"] = torch.randn(case.num_q_heads, generator=torch.Generator().manual_seed(
            case.seed)).to("cuda")
    got = assert_bounds_identical([run_decode(*tensors, bounds=b, hopper=True, **kw)
                                   for b in ops_decode.BOUNDS])
    want = reference.decode_attention(*tensors, **kw)
    assert_matches_reference(got, want)


@pytest.mark.gpu
def test_gpu_hopper_decode_at_c_b_size_and_cuda_graph():
    """C-B's size (batch 64, 32/8 heads of 128, window 4096 in pages of 16, bf16) in one
    split and three, against the reference; each plan's run captured in a CUDA graph and
    replayed after replan (one length 0)."""
    batch, window_left = 64, 4095
    gen = torch.Generator().manual_seed(72)
    lens = torch.randint(1, 8193, (batch,), generator=gen)
    lens[:5] = torch.tensor([1, 4095, 4096, 4097, 8192])
    case = DecodeCase(lens.tolist(), num_q_heads=32, num_kv_heads=8, head_dim=128, head_dim_v=128,
                      page_size=16, window_left=None, dtype=torch.bfloat16, seed=72)
    tensors = build_decode(case, "cuda")
    seq_lens = tensors[4]
    kw = dict(window_left=window_left, return_lse=True)

    def check(out, lse):
        ref_out, ref_lse = reference.decode_attention(*tensors, **kw)
        assert rel_err(out, ref_out) < 1e-2
        assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
        fin = torch.isfinite(ref_lse)
        assert (lse[fin] - ref_lse[fin]).abs().max().item() < 1e-2

    q, k_cache, v_cache, block_table, seq_lens = tensors
    for splits in (None, 3):
        seq_lens.copy_(lens.to(torch.int32))
        plan = swattn.plan_decode(lens.tolist(), num_q_heads=32, num_kv_heads=8, head_dim=128,
                                  page_size=16, num_splits=splits, hopper=True, **kw)
        assert plan.path == "hopper"
        out, lse = plan.run(q, k_cache, v_cache, block_table)
        torch.cuda.synchronize()
        check(out, lse)
        new_lens = (lens * 2 // 3).clamp(min=1)
        new_lens[0] = 0  # an empty sequence: output 0, lse -inf
        replay_after(lambda: plan.run(q, k_cache, v_cache, block_table, out=out, lse=lse),
                     lambda: plan.replan(new_lens.tolist()), out)
        seq_lens.copy_(new_lens.to(torch.int32))
        check(out, lse)


@pytest.mark.gpu
def test_gpu_default_path_long_windows_only():
    """The plan takes the Gluon path for C-B's window (4097 keys, d128) and C-F's full
    attention (d64, 32k keys), the Triton kernel for C-A's 129 keys."""
    for window, d, hq, hkv, want in ((4095, 128, 32, 8, "hopper"), (None, 64, 16, 2, "hopper"),
                                     (128, 64, 16, 2, "triton")):
        plan = swattn.plan_decode([4200, 32768], num_q_heads=hq, num_kv_heads=hkv, head_dim=d,
                                  page_size=16, window_left=window)
        assert plan.path == want, (window, d)
