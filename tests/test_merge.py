"""merge_states against the float reference: sinks applied once, parts that saw no key
left unread, all -inf rows giving 0 and -inf; and the merge of decode partials."""

import pytest
import torch
from conftest import DEVICE

import swattn
from swattn import reference
from swattn.plan import run_decode
from swattn.verify.cases import DecodeCase, build_decode, build_sparse, rel_err


def _parts(num_parts, rows, heads, dv, dtype, seed):
    """Random partial states; about a fifth of the (part, row, head) entries saw no key
    (lse -inf, output NaN: it must not be read), and row 0 saw none in any part."""
    g = torch.Generator().manual_seed(seed)
    outs, lses = [], []
    for _ in range(num_parts):
        out = torch.randn(rows, heads, dv, generator=g).to(dtype)
        lse = torch.randn(rows, heads, generator=g) * 3.0
        empty = torch.rand(rows, heads, generator=g) < 0.2
        empty[0] = True
        lse[empty] = float("-inf")
        out[empty] = float("nan")
        outs.append(out.to(DEVICE))
        lses.append(lse.to(DEVICE))
    return outs, lses


def _check(outs, lses, sinks):
    out, lse = swattn.merge_states(outs, lses, sinks=sinks)
    ref_out, ref_lse = reference.merge_states(outs, lses, sinks=sinks)
    assert out.dtype == outs[0].dtype and lse.dtype == torch.float32
    assert not torch.isnan(out).any()
    assert rel_err(out, ref_out) < 2e-3
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    fin = torch.isfinite(ref_lse)
    assert (lse[fin] - ref_lse[fin]).abs().max().item() < 1e-5
    return out, lse


@pytest.mark.parametrize("num_parts", [1, 2, 3, 5], ids=lambda n: f"parts{n}")
@pytest.mark.parametrize("with_sinks", [False, True], ids=["no-sinks", "sinks"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_against_reference(num_parts, with_sinks, dtype):
    outs, lses = _parts(num_parts, 7, 3, 24, dtype, seed=num_parts)
    sinks = torch.randn(3).to(DEVICE) if with_sinks else None
    out, lse = _check(outs, lses, sinks)
    assert torch.all(out[0] == 0)
    assert torch.all(lse[0] == float("-inf"))


def test_large_sink_and_one_part_dominating():
    """A sink far above every part drives the output to 0; lse keeps the parts' value."""
    outs, lses = _parts(2, 5, 2, 16, torch.float32, seed=11)
    _check(outs, lses, torch.tensor([60.0, -60.0], device=DEVICE))


def test_decode_partials_merge_to_the_whole():
    """The window alone and the sparse keys alone (a sequence of length 0), each sink-free
    with its lse, merged with the sinks, equal one decode over both."""
    case = DecodeCase([33, 9, 1], num_q_heads=8, num_kv_heads=2, window_left=14, sparse_keys=7,
                      seed=3)
    q, k_cache, v_cache, block_table, seq_lens = build_decode(case, DEVICE)
    sparse = build_sparse(case, DEVICE)
    sinks = torch.randn(8).to(DEVICE)
    window_part = run_decode(q, k_cache, v_cache, block_table, seq_lens,
                                              window_left=14, return_lse=True)
    sparse_part = run_decode(q, k_cache, v_cache, block_table, torch.zeros_like(seq_lens),
                                              window_left=14, sparse=sparse, return_lse=True)
    merged, lse = swattn.merge_states([window_part[0], sparse_part[0]],
                                      [window_part[1], sparse_part[1]], sinks=sinks)
    whole, whole_lse = reference.decode_attention(q, k_cache, v_cache, block_table, seq_lens,
                                                  window_left=14, sparse=sparse, sinks=sinks,
                                                  return_lse=True)
    assert rel_err(merged, whole) < 5e-3
    assert (lse - whole_lse).abs().max().item() < 1e-2


BAD = [
    (lambda o, s: (o[0], s), TypeError, "outs must be a list"),
    (lambda o, s: ([], []), ValueError, "same length >= 1"),
    (lambda o, s: (o, s[:1]), ValueError, "same length >= 1"),
    (lambda o, s: ([o[0], o[1][:, :, :8]], s), ValueError, r"outs\[1\] must have shape"),
    (lambda o, s: ([o[0], o[1].float()], s), TypeError, r"outs\[1\] must be torch.float16"),
    (lambda o, s: (o, [s[0], s[1].half()]), TypeError, r"lses\[1\] must be torch.float32"),
    (lambda o, s: (o, [s[0], s[1][:3]]), ValueError, r"lses\[1\] must have shape"),
    (lambda o, s: ([o[0].int(), o[1]], s), TypeError, r"outs\[0\] must be one of"),
]


@pytest.mark.parametrize("bad,error,message", BAD, ids=[b[2] for b in BAD])
def test_bad_arguments(bad, error, message):
    outs, lses = _parts(2, 4, 3, 16, torch.float16, seed=0)
    with pytest.raises(error, match=message):
        swattn.merge_states(*bad(outs, lses))


def test_bad_sinks():
    outs, lses = _parts(2, 4, 3, 16, torch.float16, seed=0)
    with pytest.raises(ValueError, match="sinks must have shape"):
        swattn.merge_states(outs, lses, sinks=torch.zeros(4, device=DEVICE))


def test_custom_op_registration():
    """Schema, fake implementation and the out/lse mutation, as torch checks them."""
    outs, lses = _parts(2, 4, 3, 16, torch.float16, seed=0)
    outs = [o.nan_to_num() for o in outs]  # opcheck compares runs; NaN != NaN
    torch.library.opcheck(torch.ops.swattn.merge_states.default,
                          (outs, lses, torch.randn(3, device=DEVICE),
                           torch.zeros_like(outs[0]), torch.zeros_like(lses[0])))
