"""What the extend and decode plans share: argument checks, the device, the host lengths'
device copies, and the choices of one-shot calls remembered by what they depend on."""

import importlib
import os
from dataclasses import replace

import torch

from ..ops import config as _config
from ..ops._validate import FLOAT_DTYPES, FP8_DTYPES, check_device, check_int, check_scalars
from ..ops.cache import unit_scale


class Plan:
    """What every plan holds: its spec, the kernel path and config it chose, the device and
    the queries' dtype, its bound launches and the launches of its earlier runs, by their
    tensors (its own, or those the one-shot calls of one choice share: ``launches``,
    ``ready``); ``hopper_module``: the ``swattn.ops`` module of its Hopper path."""

    def __init__(self, spec, path, device, dtype, launches, hopper_module, ready=None):
        self.spec = spec
        self.path = path
        self.config = spec.config
        self.device = device
        self.dtype = dtype
        # The cache's dtype, and for an fp8 cache the 1.0 a run without scales takes.
        self.kv_dtype = spec.kv_dtype
        self._unit = unit_scale(device) if spec.kv_dtype in FP8_DTYPES else None
        self._index = device.index if device.type == "cuda" else -1
        self._launches = {} if launches is None else launches
        self._ready = {} if ready is None else ready
        self._hopper = _module(hopper_module) if path == "hopper" else None

    def _remember(self, key, ready):
        """Keep a run's launches (``ops._launch.relaunch``'s arguments) under its tensors'
        key: a run whose tensors have that key passed the checks that key fixes. The
        addresses are unique across devices (CUDA's unified addressing), so the key fixes
        the devices too; a replan clears them (the checks read the lengths)."""
        if len(self._ready) >= 256:
            self._ready.clear()
        self._ready[key] = ready


_MODULES = {}


def _module(name):
    """The ``swattn.ops`` module ``name``, imported when a plan first needs it."""
    module = _MODULES.get(name)
    if module is None:
        module = _MODULES[name] = importlib.import_module(f"swattn.ops.{name}")
    return module


def resolve_device(device):
    """A plan's device, ``device`` given or None: CUDA's current device where CUDA is
    available, else the CPU under Triton's interpreter (``TRITON_INTERPRET=1``); a bare
    ``"cuda"`` is CUDA's current device. A ValueError naming ``device`` says what to pass
    where neither is at hand."""
    if device is None:
        if torch.cuda.is_available():
            device = "cuda"
        elif os.environ.get("TRITON_INTERPRET") == "1":
            device = "cpu"
        else:
            raise ValueError("device is None and CUDA is not available: set TRITON_INTERPRET=1 "
                             "to run on the CPU under Triton's interpreter, or pass device=")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device must be a torch.device or a device string, got {device!r} "
                         f"({error})") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device is {device}, but CUDA is not available here: pass "
                             "device='cpu' (or None) with TRITON_INTERPRET=1 set to run on the "
                             "CPU under Triton's interpreter")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    check_device("device", device)
    return device


def check_common(num_q_heads, num_kv_heads, head_dim, head_dim_v, page_size, softcap, scale,
                  dtype, kv_dtype, hopper, bounds):
    for name, value in (("num_q_heads", num_q_heads), ("num_kv_heads", num_kv_heads),
                        ("head_dim", head_dim), ("head_dim_v", head_dim_v), ("page_size", page_size)):
        check_int(name, value, 1)
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads ({num_q_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    check_scalars(softcap, scale)
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be one of {FLOAT_DTYPES}, got {dtype}")
    if kv_dtype is not None and kv_dtype != dtype and kv_dtype not in FP8_DTYPES:
        raise ValueError(f"kv_dtype must be None, the queries' dtype ({dtype}) or one of "
                         f"{FP8_DTYPES}, got {kv_dtype}")
    if hopper is not None and not isinstance(hopper, bool):
        raise TypeError(f"hopper must be None or a bool, got {hopper!r}")
    if bounds not in _config.BOUNDS:
        raise ValueError(f"bounds must be one of {_config.BOUNDS}, got {bounds!r}")


def check_cache_dtype(k_cache, q_dtype):
    """A one-shot call's cache: the queries' dtype or fp8 (a TypeError naming k_cache)."""
    if k_cache.dtype != q_dtype and k_cache.dtype not in FP8_DTYPES:
        raise TypeError(f"k_cache must be {q_dtype} (the queries' dtype) or one of {FP8_DTYPES}, "
                        f"got {k_cache.dtype}")


def check_scales(k_scale, v_scale, kv_dtype, num_kv_heads, device_index):
    """An fp8 cache's scales: None (1) or float32 tensors of one value ([] or [1]) or one a
    KV head ([Hkv], contiguous) on the plan's device; none for a cache of the queries'
    dtype."""
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if scale is None:
            continue
        if kv_dtype not in FP8_DTYPES:
            raise ValueError(f"{name} applies to fp8 caches; this plan's cache is {kv_dtype}")
        if not isinstance(scale, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor or None, got {type(scale).__name__}")
        if scale.dtype != torch.float32:
            raise TypeError(f"{name} must be float32, got {scale.dtype}")
        if scale.dim() > 1 or scale.numel() not in (1, num_kv_heads):
            raise ValueError(f"{name} must be [] or [1] (per tensor) or [{num_kv_heads}] (per KV "
                             f"head), got shape {tuple(scale.shape)}")
        if scale.numel() > 1 and scale.stride(0) != 1:  # the kernels step one element a head
            raise ValueError(f"{name} must be contiguous, got stride {scale.stride(0)}")
        if scale.get_device() != device_index:
            raise ValueError(f"{name} must be on the plan's device")


def scale_args(k_scale, v_scale, unit):
    """``((k_scale, v_scale), (k stride, v stride))`` a launch takes: a missing scale is the
    plan's ``unit`` (a device 1.0); the stride between KV heads is 0 for one value. A plan
    of a 16-bit cache (``unit`` None) takes none."""
    if unit is None:
        return (None, None), (0, 0)
    k = unit if k_scale is None else k_scale
    v = unit if v_scale is None else v_scale
    return (k, v), (int(k.numel() > 1), int(v.numel() > 1))


def to_device(values, device):
    """An int32 device tensor of host ints: copied without waiting for the GPU."""
    host = torch.tensor(values, dtype=torch.int32)
    return host.to(device, non_blocking=True) if device.type == "cuda" else host


def check_rank(name, t, dim):
    """A tensor of rank ``dim`` (a TypeError, or a ValueError naming ``name``)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dim:
        raise ValueError(f"{name} must have {dim} dimensions, got shape {tuple(t.shape)}")


def expect_first(name, t, dim):
    """The first tensor of a one-shot call: its type and rank, a float dtype, and a device
    the kernels run on."""
    check_rank(name, t, dim)
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be one of {FLOAT_DTYPES}, got {t.dtype}")
    check_device(name, t.device)


# The choices of one-shot calls (their plans' spec, path and bound launches), by what they
# depend on: a model calls the one-shot functions layer after layer with the same sizes.
ONE_SHOT = {}


def remember(key, choice):
    """Keep a one-shot call's choice under ``key`` (None: not kept)."""
    if key is not None:
        if len(ONE_SHOT) >= 512:
            ONE_SHOT.clear()
        ONE_SHOT[key] = choice


def replace_spec(spec, **changes):
    """``spec`` (a frozen dataclass) with ``changes``."""
    return replace(spec, **changes)
