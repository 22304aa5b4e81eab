"""Bad input to the one-shot functions raises ValueError/TypeError naming the argument,
before any launch; so does a plan made without a device where there is neither CUDA nor the
interpreter. What needs the lengths' values (which the one-shot functions do not read back)
is checked by the plans: tests/test_plan.py."""

import pytest
import torch
from conftest import DEVICE

import swattn
from swattn.verify.cases import (
    DecodeCase,
    ExtendCase,
    build_decode,
    build_extend,
    build_sparse,
    random_mask,
)


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
    ("q", lambda t: t.float(), TypeError, "q must be torch.float16"),
    ("k", lambda t: t.to(torch.float32), TypeError, "k must be torch.float16"),
    ("k", lambda t: t[:, :, :8].contiguous(), ValueError, "k must have shape"),
    ("v", lambda t: t[:-1], ValueError, "v must have shape"),
    ("k_cache", lambda t: t[..., :8].contiguous(), ValueError, "k_cache must have shape"),
    ("v_cache", lambda t: t[:-1], ValueError, "k_cache and v_cache disagree on the page count"),
    ("block_table", lambda t: t.to(torch.int64), TypeError, "block_table must be torch.int32"),
    ("block_table", lambda t: t[:1], ValueError, "block_table must have shape"),
    ("cu_seqlens", lambda t: t[:-1], ValueError, "cu_seqlens must have shape"),
    ("cu_seqlens", lambda t: t.float(), TypeError, "cu_seqlens must be torch.int32"),
    ("prefix_lens", lambda t: t.to(torch.int64), TypeError, "prefix_lens must be torch.int32"),
]


@pytest.mark.parametrize("name,bad,error,message", BAD_TENSORS,
                         ids=[f"{b[0]}-{b[3]}" for b in BAD_TENSORS])
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
    ({"mask": torch.ones(5, dtype=torch.bool)}, ValueError,
     "the plan was made without mask_indptr"),
    ({"mask_indptr": torch.tensor([0, 2, 5], dtype=torch.int32)}, ValueError, "mask is required"),
    ({"mask": torch.ones(5, dtype=torch.int32),
      "mask_indptr": torch.tensor([0, 2, 5], dtype=torch.int32)},
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
    with pytest.raises(ValueError, match=r"q must have a multiple of 2 heads \(the KV heads"):
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


# ---- the argument named is the one that differs ---------------------------------------

EXTEND_NAMES = ("q", "k", "v", "k_cache", "v_cache", "block_table", "cu_seqlens", "prefix_lens")
DECODE_NAMES = ("q", "k_cache", "v_cache", "block_table", "seq_lens")
FP8 = torch.float8_e4m3fn


def _one_shot_call(kind):
    """``(function, positional arguments by name, keyword arguments)`` of a good one-shot
    call with every argument of its kind (Dv 8 beside D 16, so the two head dims differ):
    "extend" with a custom mask, sinks and out; "extend-fp8" an fp8 cache and its scales a
    KV head; "decode" sinks and out; "decode-fp8-sparse" the sparse keys, fp8 and scales."""
    sizes = {"window_left": 4, "page_size": 4, "head_dim_v": 8}
    if kind.startswith("extend"):
        case = ExtendCase([9, 4], [5, 3], **sizes)
        args = dict(zip(EXTEND_NAMES, build_extend(case, DEVICE)))
        kwargs = {"sinks": torch.zeros(4), "out": torch.zeros(8, 4, 8, dtype=torch.float16)}
        if kind == "extend":
            kwargs["mask"], kwargs["mask_indptr"] = random_mask([9, 4], [5, 3], 0)
        function = swattn.extend_attention
    else:
        case = DecodeCase([9, 4], sparse_keys=3, **sizes)
        args = dict(zip(DECODE_NAMES, build_decode(case, DEVICE)))
        kwargs = {"sinks": torch.zeros(4), "out": torch.zeros(2, 4, 8, dtype=torch.float16)}
        if kind.endswith("sparse"):
            kwargs["sparse"] = build_sparse(case, DEVICE)
        function = swattn.decode_attention
    if "fp8" in kind:
        args["k_cache"], args["v_cache"] = args["k_cache"].to(FP8), args["v_cache"].to(FP8)
        kwargs["k_scale"], kwargs["v_scale"] = torch.ones(2), torch.ones(2)
        if "sparse" in kwargs:
            k_pool, v_pool, idx = kwargs["sparse"]
            kwargs["sparse"] = (k_pool.to(FP8), v_pool.to(FP8), idx)
    kwargs = {name: _on_device(t) for name, t in kwargs.items()}
    if "sparse" in kwargs:
        kwargs["sparse"] = tuple(map(_on_device, kwargs["sparse"]))
    return function, args, kwargs


SPARSE_PARTS = ("sparse k_pool", "sparse v_pool", "sparse idx")


def _grown(kind, name, dim):
    """The kind's call with dimension ``dim`` of argument ``name`` one larger."""
    function, args, kwargs = _one_shot_call(kind)
    if name in SPARSE_PARTS:
        parts = list(kwargs["sparse"])
        t = parts[SPARSE_PARTS.index(name)]
    else:
        t = args[name] if name in args else kwargs[name]
    shape = list(t.shape)
    shape[dim] += 1
    bigger = torch.zeros(shape, dtype=t.dtype, device=t.device)
    if name in SPARSE_PARTS:
        parts[SPARSE_PARTS.index(name)] = bigger
        kwargs["sparse"] = tuple(parts)
    elif name in args:
        args[name] = bigger
    else:
        kwargs[name] = bigger
    return function, args, kwargs


# Where the argument grown is not the one named. Of two inputs alone in carrying a size
# (the caches' pages, page size and (decode) KV heads; v and v_cache's value head dim; q and
# k_cache's head dim in decode without sparse keys) neither is taken for the wrong one: both
# are named ("disagree"). An output follows the inputs: out is named when v_cache alone sets
# the value head dim. None: a size that may be larger (the block table's rows in extend and
# its width, a custom mask's entries, the sparse index's width).
PAIRS = {("k_cache", 0): ("k_cache", "v_cache"), ("k_cache", 1): ("k_cache", "v_cache"),
         ("v_cache", 0): ("k_cache", "v_cache"), ("v_cache", 1): ("k_cache", "v_cache")}
NAMED = {
    "extend": {**PAIRS, ("v", 2): ("v", "v_cache"), ("v_cache", 3): ("v", "v_cache"),
               ("block_table", 0): None, ("block_table", 1): None, ("mask", 0): None},
    "decode": {**PAIRS, ("q", 2): ("q", "k_cache"), ("k_cache", 3): ("q", "k_cache"),
               ("k_cache", 2): ("k_cache", "v_cache"), ("v_cache", 2): ("k_cache", "v_cache"),
               ("v_cache", 3): "out", ("block_table", 1): None},
    "decode-fp8-sparse": {**PAIRS, ("v_cache", 3): ("v_cache", "sparse v_pool"),
                          ("sparse v_pool", 2): ("v_cache", "sparse v_pool"),
                          ("sparse k_pool", 0): ("sparse k_pool", "sparse v_pool"),
                          ("sparse v_pool", 0): ("sparse k_pool", "sparse v_pool"),
                          ("block_table", 1): None, ("sparse idx", 1): None},
}
NAMED["extend-fp8"] = NAMED["extend"]


def _grow_cases():
    """``(kind, argument, dimension)`` of every tensor argument of every kind's call."""
    for kind in NAMED:
        _, args, kwargs = _one_shot_call(kind)
        tensors = {**args, **{n: t for n, t in kwargs.items() if isinstance(t, torch.Tensor)}}
        tensors.update(zip(SPARSE_PARTS, kwargs.get("sparse", ())))
        for name, t in tensors.items():
            for dim in range(t.dim()):
                yield kind, name, dim


GROW_CASES = list(_grow_cases())


def _error(function, args, kwargs):
    try:
        function(*args.values(), **kwargs)
    except ValueError as error:
        return str(error)
    return None


@pytest.mark.parametrize("kind,name,dim", GROW_CASES,
                         ids=[f"{kind}-{name.replace(' ', '-')}-dim{dim}"
                              for kind, name, dim in GROW_CASES])
def test_errors_name_the_argument_that_differs(kind, name, dim):
    """A one-shot call named the argument checked against the first tensor: a q of another
    head dim was reported as a wrong k (extend) or k_cache (decode) shape, a cu_seqlens of
    another length as a wrong prefix_lens shape. Each argument grown in turn: the error names
    it, as the one the other inputs disagree with, the same on a call of sizes the one-shot
    path has not seen and on one it has (its checks are then the run's)."""
    expected = NAMED[kind].get((name, dim), name)
    function, args, kwargs = _grown(kind, name, dim)
    swattn.plan.forget_one_shot()
    first = _error(function, args, kwargs)
    _, good_args, good_kwargs = _one_shot_call(kind)
    # The good call's choice, remembered: a call with its sizes skips the checks it made.
    plan_for = (swattn.plan.extend_plan_for if kind.startswith("extend")
                else swattn.plan.decode_plan_for)
    plan_for(*good_args.values(), **{k: v for k, v in good_kwargs.items()
                                     if k in ("mask_indptr", "sparse")})
    later = _error(function, args, kwargs)
    assert first == later
    if expected is None:
        assert first is None
    elif isinstance(expected, tuple):
        assert first is not None and first.startswith(f"{expected[0]} and {expected[1]} disagree")
    else:
        assert first is not None and first.startswith(f"{expected} must"), first


def test_the_block_table_breaks_no_tie_it_cannot_tell():
    """A block table of more rows than sequences says nothing of the batch size: a
    prefix_lens one short of cu_seqlens names both."""
    function, args, kwargs = _one_shot_call("extend-fp8")
    args["block_table"] = torch.cat([args["block_table"]] * 3)
    args["prefix_lens"] = args["prefix_lens"][:1]
    with pytest.raises(ValueError, match=r"^prefix_lens and cu_seqlens disagree on the batch "
                                         r"size: prefix_lens.shape\[0\] = 1, "
                                         r"cu_seqlens.shape\[0\] - 1 = 2$"):
        function(*args.values(), **kwargs)
