"""The bit-identity matrices of `swattn verify` (swattn.verify.identity): every family's
reduced matrix passes (in the interpreter, or on the GPU where there is one), and a
variant that differs by one bit, or a result off the reference, is reported."""

import pytest
import torch
from conftest import DEVICE

from swattn.verify import identity


@pytest.mark.parametrize("family", sorted(identity.FAMILIES))
def test_family_rows_pass(family):
    if family.startswith(("hopper", "decode-hopper")) and DEVICE != "cuda":
        pytest.skip("the Hopper path (Gluon) runs on an sm_90 GPU only")
    rows = identity.run(family, DEVICE, gpu=False, limit=6)
    assert len(rows) == 6
    bad = [r.name for r in rows if not r.ok]
    assert not bad, bad


def test_every_family_has_a_title():
    """`swattn verify` titles each family's table (a family without one ended the run)."""
    assert set(identity.TITLES) == set(identity.FAMILIES)


def test_decode_matrix_covers_the_issue():
    gpu = identity.decode_matrix(gpu=True)
    windows = {int(name.split()[0][1:]) for name, *_ in gpu}
    assert windows == set(identity.GPU_WINDOWS)
    assert {c.head_dim for _, c, _, _ in gpu} >= {64, 128, 256}
    assert {kw["num_splits"] for _, _, kw, _ in gpu} >= {1, 2, 8}
    assert any(c.sparse_keys for _, c, _, _ in gpu)
    assert any(c.window_left is None for _, c, _, _ in gpu)
    assert len(identity.extend_matrix(gpu=True)) >= 139
    assert len(identity.unified_matrix(gpu=True)) >= 68


def test_fp8_matrices_take_both_formats_and_both_scale_kinds():
    for family in ("extend-fp8", "unified-fp8", "decode-fp8", "hopper-fp8", "decode-hopper-fp8",
                   "hopper-fp8-products", "hopper-fp8-prefix-rows"):
        rows = identity.FAMILIES[family][0](gpu=True)
        assert {kw["kv"] for _, _, kw, _ in rows} == set(identity.FP8_KINDS)
        assert len(rows) >= 24, (family, len(rows))
    # The Hopper rows keep the path forced, so they check it and not the Triton kernel.
    assert all(kw["hopper"] for _, _, kw, _ in identity.FAMILIES["decode-hopper-fp8"][0](gpu=True))
    assert all(tiling is None for *_, tiling in identity.FAMILIES["hopper-fp8"][0](gpu=True))
    assert all(tiling == {"fp8_products": True}
               for *_, tiling in identity.FAMILIES["hopper-fp8-products"][0](gpu=True))
    # The prefix widened before the kernel: the tight bounds only, on every feature that
    # reads a prefix under a window; skip and none widen in the kernel, the plan's rule.
    rows = identity.FAMILIES["hopper-fp8-prefix-rows"][0](gpu=True)
    assert {name.split()[1] for name, *_ in rows} == set(identity.PREFIX_ROWS_FEATURES)
    assert all(c.window_left is not None for _, c, _, _ in rows)
    kw = {"config": {"prefix_rows": True}, "hopper": True}
    assert identity.options_for_bounds(kw, "tight") is kw
    assert identity.options_for_bounds(kw, "skip") == {"config": {}, "hopper": True}
    # A tolerance of its own names a family, and loosens the others' 1e-2 (the fp8
    # products': the query rows and the weights rounded to e4m3).
    row = dict(name="r", configs=1, max_abs_tight_skip=0.0, max_abs_tight_none=0.0,
               err_tight=5e-2, err_skip=5e-2, seconds=0.0)
    assert set(identity.TOLERANCES) <= set(identity.FAMILIES)
    assert all(tol > identity.Row(**row).tol for tol in identity.TOLERANCES.values())
    assert identity.Row(**row, tol=8e-2).ok and not identity.Row(**row).ok
    assert not identity.Row(**dict(row, max_abs_tight_none=1e-7), tol=8e-2).ok


def test_latent_matrix_takes_wide_heads_and_every_cache_kind():
    rows = identity.FAMILIES["decode-latent"][0](gpu=True)
    assert all(kw["latent"] for _, _, kw, _ in rows)
    assert {(c.head_dim, c.head_dim_v) for _, c, _, _ in rows} >= {(576, 512), (64, 64)}
    assert {kw.get("kv") for _, _, kw, _ in rows} == {None, *identity.FP8_KINDS}
    assert any(c.sparse_keys for _, c, _, _ in rows) and len(rows) >= 24
    assert identity.FAMILIES["decode-latent"][0](gpu=False)


def test_hopper_decode_matrix_covers_the_path():
    rows = identity.hopper_decode_matrix(gpu=True)
    assert {int(name.split()[0][1:]) for name, *_ in rows} == set(identity.GPU_WINDOWS)
    assert {c.head_dim for _, c, _, _ in rows} == {64, 128}
    assert {c.page_size for _, c, _, _ in rows} == {16, 32, 64, 128}
    assert {c.num_q_heads // c.num_kv_heads for _, c, _, _ in rows} == {1, 4, 16, 64}
    assert {kw["num_splits"] for _, _, kw, _ in rows} == {1, 2, 3, 4, 8, None}
    assert all(kw["hopper"] for _, _, kw, _ in rows)


def test_hopper_decode_fp8_rows_cover_every_feature():
    """A third of the Hopper decode matrix over fp8, the third moving by one each window, so
    soft-cap, full attention and every split count run over fp8 too."""
    rows = identity.FAMILIES["decode-hopper-fp8"][0](gpu=True)
    assert len(rows) == len(identity.hopper_decode_matrix(gpu=True)) // 3
    assert {kw["num_splits"] for _, _, kw, _ in rows} == {1, 2, 3, 4, 8, None}
    assert any("softcap" in kw for _, _, kw, _ in rows)
    assert any(c.window_left is None for _, c, _, _ in rows)
    assert {kw["kv"] for _, _, kw, _ in rows} == set(identity.FP8_KINDS)


def test_a_one_bit_difference_fails_the_row(monkeypatch):
    real = identity.run_decode

    def off_by_one_bit(*args, bounds="tight", **kwargs):
        out = real(*args, bounds=bounds, **kwargs)
        if bounds == "none":
            o, lse = out
            o = o.clone()
            o.view(torch.int16)[0, 0, 0] += 1
            return o, lse
        return out

    monkeypatch.setattr(identity, "run_decode", off_by_one_bit)
    row = identity.run("decode", DEVICE, gpu=False, limit=1)[0]
    assert row.max_abs_tight_skip == 0.0 and row.max_abs_tight_none > 0.0 and not row.ok


def test_a_wrong_result_fails_the_row(monkeypatch):
    real = identity.reference.decode_attention
    monkeypatch.setattr(identity.reference, "decode_attention",
                        lambda *a, **kw: tuple(x * 1.1 for x in real(*a, **kw)))
    row = identity.run("decode", DEVICE, gpu=False, limit=1)[0]
    assert row.max_abs_tight_skip == 0.0 and row.err_tight > 1e-2 and not row.ok
