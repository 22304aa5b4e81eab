"""What the extend and decode plans share: argument checks, the device, the host lengths'
device copies, and the choices of one-shot calls remembered by what they depend on."""

import importlib
import os
from dataclasses import dataclass, replace
from types import MappingProxyType

import torch

from ..ops import config as _config
from ..ops._validate import FLOAT_DTYPES, FP8_DTYPES, check_device, check_int, check_scalars, expect
from ..ops.cache import unit_scale
from ..window import decode_bounds


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

    def _fits(self, tensors, *lengths):
        """Whether the run's tensors are what the plan takes: its table (:func:`fits`) and
        the sizes its host lengths set (``_length_problem(*lengths)``)."""
        return fits(self.table, tensors, self._index) and self._length_problem(*lengths) is None

    def _check_tensors(self, tensors, *lengths):
        """:meth:`_fits`, raising the error that names what is wrong."""
        check_tensors(self.table, tensors, self._index)
        problem = self._length_problem(*lengths)
        if problem is not None:
            raise ValueError(problem)

    @property
    def launches(self):
        """The launches the plan has bound, by what they depend on (read-only): one a kind
        of run it has seen (sinks or none, the scales' layout, where the values come
        from)."""
        return MappingProxyType(self._launches)

    @property
    def relaunches(self):
        """How many earlier runs' tensors the plan keeps the launches of (a run on the
        same tensors relaunches them without checks: :meth:`relaunch_key`)."""
        return len(self._ready)

    def _remember(self, key, ready):
        """Keep a run's launches (``ops._launch.relaunch``'s arguments) under its tensors'
        key: a run whose tensors have that key passed the checks that key fixes. The
        addresses are unique across devices (CUDA's unified addressing), so the key fixes
        the devices too; a replan clears them (the checks read the lengths)."""
        if len(self._ready) >= 256:
            self._ready.clear()
        self._ready[key] = ready


@dataclass(frozen=True)
class TensorArg:
    """One tensor a plan's run takes, as the plan takes it: a tensor of ``dtype`` on the
    plan's device, its last dimension contiguous, of ``shape``: ints, None for a leading
    size the plan leaves free, or the name of a size the run fixes (``"rows"``: q's rows),
    which the first tensor holding it sets and every later one must match; ``optional``: None
    is taken. A plan's table of them (:class:`Plan`'s ``_table``) is where its fit, its
    checks and its relaunch key come from (:func:`fits`, :func:`check_tensors`,
    :func:`run_key`)."""

    name: str
    dtype: torch.dtype
    shape: tuple
    optional: bool = False


def fits(table, tensors, device_index):
    """Whether ``tensors`` (in ``table``'s order) are what the table says: one pass over
    what each carries on the host, no message (a failing run gets
    :func:`check_tensors`'s)."""
    sizes = {}
    try:
        for arg, t in zip(table, tensors):
            if t is None:
                if arg.optional:
                    continue
                return False
            shape = t.shape
            if (t.dtype is not arg.dtype or len(shape) != len(arg.shape)
                    or t.get_device() != device_index or (shape[-1] > 1 and t.stride(-1) != 1)):
                return False
            for want, got in zip(arg.shape, shape):
                if want.__class__ is str:
                    want = sizes.setdefault(want, got)
                if want is not None and want != got:
                    return False
        return True
    except (AttributeError, IndexError, TypeError):
        return False


def check_tensors(table, tensors, device_index):
    """``tensors`` (in ``table``'s order) one by one (ops._validate.expect), raising the
    error that names the first that is not what the table says."""
    sizes = {}
    for arg, t in zip(table, tensors):
        if t is None and arg.optional:
            continue
        shape = [sizes.get(want, want) for want in arg.shape]
        lead = 0
        while lead < len(shape) and (shape[lead] is None or isinstance(shape[lead], str)):
            lead += 1
        expect(arg.name, t, arg.dtype, device_index, tuple(shape[lead:]), lead)
        for want, got in zip(arg.shape, t.shape):
            if isinstance(want, str):
                sizes.setdefault(want, got)


def run_key(tensors):
    """The relaunch key of a run's tensors: each one's address, shape, strides and dtype
    (None for one not given). A run whose tensors give the key of an earlier run passed
    the checks that run passed, and its launch reads them as that one's did."""
    return tuple(None if t is None else (t.data_ptr(), t.shape, t.stride(), t.dtype)
                 for t in tensors)


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
                        ("head_dim", head_dim), ("head_dim_v", head_dim_v),
                        ("page_size", page_size)):
        check_int(name, value, 1)
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads ({num_q_heads}) must be a multiple of "
                         f"num_kv_heads ({num_kv_heads})")
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


def pages_needed(reads, page_size, ring=False):
    """The block-table columns a launch needs, the widest row it reads: ``reads`` a
    ``(seq_len, query position)`` a sequence (keys ``[0, seq_len)``, the lowest query); every
    page up to ``seq_len``, or in a ring table (``ring``: ``(window_left, chunk)``) the
    pages from the one holding the first key that query sees (window.decode_bounds) on."""
    def span(seq_len, query):
        last = -(-seq_len // page_size)
        if not ring:
            return last
        return last - decode_bounds(query + 1, *ring)[0] // page_size
    return max((span(*read) for read in reads), default=0)


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


def _and(names):
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def check_agree(label, holders):
    """One size that several tensors of a one-shot call carry; returns it (None where no
    tensor carries it). ``holders``: ``(name, tensor, rank, dim[, offset[, exact]])``, the
    tensor carrying the size as ``shape[dim] - offset`` (one of another rank, or not a
    tensor, is left to its own check); ``exact`` False: it holds at least the size (a block
    table's rows), a vote for a value it equals, blamed only for holding less.

    No tensor defines a size alone: the value most holders give is the size, and a ValueError
    names the first that gives another, with the shape it must have. With no such value (two
    holders that differ, or two against two) none is taken for the wrong one: the error names
    each and what it gives."""
    given = []
    for name, t, rank, dim, *rest in holders:
        if isinstance(t, torch.Tensor) and t.dim() == rank:
            offset = rest[0] if rest else 0
            exact = rest[1] if len(rest) > 1 else True
            given.append((name, tuple(t.shape), dim, offset, exact, t.shape[dim] - offset))
    exact_values = {value for *_, exact, value in given if exact}
    if not exact_values:
        return None
    votes = {}
    for *_, exact, value in given:
        if exact or value in exact_values:
            votes[value] = votes.get(value, 0) + 1
    ranked = sorted(votes.values(), reverse=True)
    if len(ranked) > 1 and ranked[0] == ranked[1]:
        names = [name for name, *_, exact, _ in given if exact]
        said = ", ".join(f"{name}.shape[{dim}]" + (f" - {offset}" if offset else "") + f" = {value}"
                         for name, _, dim, offset, exact, value in given if exact)
        raise ValueError(f"{_and(names)} disagree on the {label}: {said}")
    size = max(votes, key=votes.get)
    for name, shape, dim, offset, exact, value in given:
        if value < size or (exact and value != size):
            want = list(shape)
            want[dim] = size + offset if exact else f">= {size + offset}"
            agree = [other for other, *_, v in given if v == size]
            raise ValueError(f"{name} must have shape [{', '.join(map(str, want))}], got {shape} "
                             f"({label}: {size} in {_and(agree)})")
    return size


def check_new_dtype(q, k, v):
    """A one-shot extend's q, k and v share a dtype; q's is the one named when k and v agree
    on another (a TypeError)."""
    dtypes = [getattr(t, "dtype", None) for t in (q, k, v)]
    if dtypes[0] != dtypes[1] == dtypes[2] and dtypes[1] is not None:
        raise TypeError(f"q must be {dtypes[1]} (as k and v), got {dtypes[0]}")


def check_heads(q, num_kv_heads, kv_names):
    """A one-shot call's query heads: a multiple of the KV heads the tensors ``kv_names``
    agree on (None: none to check against)."""
    if num_kv_heads and isinstance(q, torch.Tensor) and q.dim() == 3 and q.shape[1] % num_kv_heads:
        raise ValueError(f"q must have a multiple of {num_kv_heads} heads (the KV heads of "
                         f"{kv_names}), got shape {tuple(q.shape)}")


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
