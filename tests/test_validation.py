"""Bad input to the one-shot functions raises ValueError/TypeError naming the argument,
before any launch. What needs the lengths' values (which the one-shot functions do not read
back) is checked by the plans: tests/test_plan.py."""

import pytest
import torch

import swattn

from swattn.verify.cases import ExtendCase, build_extend

from conftest import DEVICE


def _on_device(x):
    """Bad values are made on the CPU; on a GPU machine they move to it, so each test
    meets the check it is about, not the device check."""
    return x.to(DEVICE) if isinstance(x, torch.Tensor) else x


def _args():
    case = ExtendCase([9, 4], [5, 3], window_left=4, page_size=4)
    return list(build_extend(case, DEVICE))


NAMES = ["q", "k", "v", "k_cache", "v_cache", "block_table", "cu_seqlens", "prefix_lens"]


def _call(args, **kwargs):
    return swattn.extend_attention(*map(_on_device, args),
                                   **{k: _on_device(v) for k, v in kwargs.items()})


def _replace(name, value):
    args = _args()
    args[NAMES.index(name)] = value(args[NAMES.index(name)])
    return args


BAD_TENSORS = [
    ("q", lambda t: t.float().cpu().numpy(), TypeError, "q must be a torch.Tensor"),
    ("q", lambda t: t.to(torch.int32), TypeError, "q must be one of"),
    ("k", lambda t: t.to(torch.float32), TypeError, "k must be torch.float16"),
    ("k", lambda t: t[:, :, :8].contiguous(), ValueError, "k must have shape"),
    ("v", lambda t: t[:-1], ValueError, "v must have shape"),
    ("k_cache", lambda t: t[..., :8].contiguous(), ValueError, "k_cache must have shape"),
    ("v_cache", lambda t: t[:-1], ValueError, "v_cache must have shape"),
    ("block_table", lambda t: t.to(torch.int64), TypeError, "block_table must be torch.int32"),
    ("block_table", lambda t: t[:1], ValueError, "block_table must be at least"),
    ("cu_seqlens", lambda t: t[:-1], ValueError, "prefix_lens must have shape"),
    ("cu_seqlens", lambda t: t.float(), TypeError, "cu_seqlens must be torch.int32"),
    ("prefix_lens", lambda t: t.to(torch.int64), TypeError, "prefix_lens must be torch.int32"),
]


@pytest.mark.parametrize("name,bad,error,message", BAD_TENSORS, ids=[f"{b[0]}-{b[3]}" for b in BAD_TENSORS])
def test_bad_tensor(name, bad, error, message):
    with pytest.raises(error, match=message):
        _call(_replace(name, bad))


BAD_KWARGS = [
    ({"window_left": -1}, ValueError, "window_left must be >= 0"),
    ({"window_left": 3.0}, TypeError, "window_left must be an int"),
    ({"window_right": 2}, ValueError, "window_right applies only with causal=False"),
    ({"causal": 1}, TypeError, "causal must be a bool"),
    ({"softcap": -1.0}, ValueError, "softcap must be"),
    ({"scale": 0.0}, ValueError, "scale must be"),
    ({"keys": "old"}, ValueError, "keys must be one of"),
    ({"sinks": torch.zeros(3)}, ValueError, "sinks must have shape"),
    ({"sinks": torch.zeros(4, dtype=torch.float16)}, TypeError, "sinks must be torch.float32"),
    ({"mask": torch.ones(5, dtype=torch.bool)}, ValueError, "the plan was made without mask_indptr"),
    ({"mask_indptr": torch.tensor([0, 2, 5], dtype=torch.int32)}, ValueError, "mask is required"),
    ({"mask": torch.ones(5, dtype=torch.int32), "mask_indptr": torch.tensor([0, 2, 5], dtype=torch.int32)},
     TypeError, "mask must be torch.bool"),
    ({"out": torch.empty(8, 4, 15, dtype=torch.float16)}, ValueError, "out must have shape"),
]


@pytest.mark.parametrize("kwargs,error,message", BAD_KWARGS, ids=[b[2] for b in BAD_KWARGS])
def test_bad_keyword(kwargs, error, message):
    with pytest.raises(error, match=message):
        _call(_args(), **kwargs)


def test_heads_not_a_multiple():
    args = _args()
    args[0] = torch.randn(8, 3, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"num_q_heads \(3\) must be a multiple of num_kv_heads \(2\)"):
        _call(args)


def test_cpu_tensors_outside_the_interpreter(monkeypatch):
    """Without TRITON_INTERPRET=1 the kernels cannot take CPU tensors: said before launch,
    for each public function."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cpu = list(build_extend(ExtendCase([9, 4], [5, 3], window_left=4, page_size=4)))
    with pytest.raises(ValueError, match="q is on cpu: swattn's kernels take CUDA tensors"):
        swattn.extend_attention(*cpu)
    q, k, v, k_cache, v_cache = cpu[:5]
    with pytest.raises(ValueError, match="k is on cpu"):
        swattn.write_kv(k, v, k_cache, v_cache, torch.zeros(k.shape[0], dtype=torch.int64))
    with pytest.raises(ValueError, match="outs\\[0\\] is on cpu"):
        swattn.merge_states([v.float()], [torch.zeros(v.shape[:2])])


SIZES = {"num_q_heads": 4, "num_kv_heads": 2, "head_dim": 16, "page_size": 4,
         "dtype": torch.float16}
PLANS = {
    "plan_decode": lambda **kw: swattn.plan_decode([9, 4], **SIZES, **kw),
    "plan_extend": lambda **kw: swattn.plan_extend([0, 5, 8], [9, 4], **SIZES, **kw),
    "plan_key_ranges": lambda **kw: swattn.plan.plan_key_ranges(
        [0, 5, 8], [9, 4], (torch.zeros(8, dtype=torch.int32), torch.ones(8, dtype=torch.int32)),
        **SIZES, **kw),
}


@pytest.mark.parametrize("make", list(PLANS.values()), ids=list(PLANS))
def test_plan_without_device_on_a_machine_without_cuda(make, monkeypatch):
    """A plan made without device= defaulted to "cuda": on a machine without CUDA a raw
    AssertionError (Torch not compiled with CUDA enabled). Now None picks CUDA where it is,
    else the CPU under the interpreter, else a ValueError says what to pass; an explicit
    "cuda" there is a ValueError naming device."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert make().device == torch.device("cpu")
    with pytest.raises(ValueError, match="device is cuda, but CUDA is not available"):
        make(device="cuda")
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="device is None and CUDA is not available: set "
                                         "TRITON_INTERPRET=1 .* or pass device="):
        make()
