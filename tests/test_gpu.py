"""GPU-only checks (run by scripts/gpu_check.sh): real sizes, bf16, torch.compile."""

import pytest
import torch

import swattn
from swattn import reference
from swattn.verify.cases import ExtendCase, build_extend, rel_err

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_extend_gpt_oss_shape_against_reference(dtype):
    case = ExtendCase([0, 128, 1000, 8192], [700, 513, 64, 1100], num_q_heads=16, num_kv_heads=2,
                      head_dim=64, head_dim_v=64, page_size=16, window_left=127, dtype=dtype)
    tensors = build_extend(case, "cuda")
    sinks = torch.randn(16, device="cuda")
    out = swattn.extend_attention(*tensors, window_left=127, sinks=sinks)
    assert rel_err(out, reference.extend_attention(*tensors, window_left=127, sinks=sinks)) < 1e-2


def test_extend_under_torch_compile():
    case = ExtendCase([300, 40], [129, 77], num_q_heads=8, num_kv_heads=2, head_dim=128,
                      head_dim_v=128, page_size=16, window_left=63, dtype=torch.bfloat16)
    tensors = build_extend(case, "cuda")

    def layer(q, k, v, k_cache, v_cache, block_table, cu, prefix):
        out, lse = swattn.extend_attention(q * 1.0, k, v, k_cache, v_cache, block_table, cu, prefix,
                                           window_left=63, return_lse=True)
        return out.float() * 2.0, lse

    compiled = torch.compile(layer, fullgraph=True)
    out, lse = compiled(*tensors)
    eager_out, eager_lse = layer(*tensors)
    assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse)
    assert rel_err(out / 2.0, reference.extend_attention(*tensors, window_left=63)) < 1e-2
