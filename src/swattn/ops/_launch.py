"""Kernel launches at the cost of the launch itself.

Triton's ``kernel[grid](**kwargs)`` binds and specializes every argument at every call (for the
60-argument extend and decode kernels, several times what the compiled kernel's own launcher
costs: benchmarks/results/2026-12-01-h200-engine-path/). A plan knows at plan time every
argument but its tensors, so a :class:`Launch` keeps those fixed values in kernel order, and at
run time fills in the tensors' addresses and strides and calls the compiled kernel's launcher
directly, the pointers as integers (the launcher then asks the driver nothing about them) and
host TMA descriptors encoded once per tensor layout (:func:`_tensor_map`).

The first launch with a given specialization goes through the JIT (which compiles the
kernel, or finds it in its caches) and keeps the compiled kernel under a key that holds
everything Triton specializes on: the fixed values, the tensors' dtypes (which the plan
fixes), the run-time integers (strides) and whether every tensor is 16-byte aligned. Launch
hooks (profilers), the interpreter and any misaligned tensor take the JIT's own path every
time; so does everything on a Triton whose launcher is not laid out as 3.6's (the direct path
checks it once).
"""

import os

import torch
from triton import knobs

_COMPILED = {}  # (fixed-values id, device, run-time ints) -> _Compiled
_FIXED_IDS = {}  # fixed values (kernel, constexprs, scalars, options, dtypes) -> small int
_TENSOR_MAPS = {}  # (address, shape, strides, descriptor metadata) -> launcher arguments
_TENSOR_MAPS_MAX = 1024


def _key_of(value):
    """What Triton specializes on in a fixed argument: a tensor's dtype and alignment
    (its address changes nothing else), a float nothing (never specialized), anything
    else its value."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, value.data_ptr() % 16 == 0)
    if isinstance(value, float):
        return "float"
    return value


class _Compiled:
    """A compiled kernel's raw launcher and what it takes besides the kernel's arguments;
    ``descs``: the positions of host TMA descriptors among the arguments and their
    metadata (None: the kernel takes none)."""

    def __init__(self, compiled):
        runner = compiled.run  # CudaLauncher
        launch = runner.launch
        descs = None
        if getattr(launch, "__closure__", None):
            # wrap_handle_tensordesc's inner(): the raw launcher, the descriptors'
            # positions and metadata are its free variables.
            cells = dict(zip(launch.__code__.co_freevars,
                             (c.cell_contents for c in launch.__closure__)))
            launch = cells["launcher"]
            positions = sorted(cells["tensordesc_indices"])
            metas = cells["tensordesc_meta"]
            if len(metas) != len(positions) or any(m is None for m in metas):
                raise TypeError("tensor descriptors without metadata")
            descs = dict(zip(positions, metas))
        if runner.global_scratch_size or runner.profile_scratch_size:
            raise TypeError("a kernel with global scratch")
        self.launch = launch
        self.descs = descs
        if descs:
            # The arguments between the descriptors, as slices, and each descriptor's
            # position and metadata: expand() splices the encoded tensor maps in.
            positions = sorted(descs)
            starts = [0] + [p + 1 for p in positions[:-1]]
            self.pieces = [(a, p, descs[p]) for a, p in zip(starts, positions)]
            self.rest = positions[-1] + 1
        self.function = compiled.function
        self.metadata = compiled.packed_metadata
        self.cooperative = runner.launch_cooperative_grid
        self.pdl = runner.launch_pdl

    def run(self, grid, stream, args):
        """The compiled kernel on ``grid`` and ``stream`` with the launcher's ``args``."""
        self.launch(grid[0], grid[1], grid[2], stream, self.function, self.cooperative, self.pdl,
                    None, None, self.metadata, None, None, None, *args)

    def expand(self, args):
        """``args`` with each host TMA descriptor replaced by its launcher arguments."""
        out = []
        for start, stop, meta in self.pieces:
            out += args[start:stop]
            out += _tensor_map(args[stop], meta)
        out += args[self.rest:]
        return out


class Descriptor:
    """A host TMA descriptor of ``tensor`` made only when a launch needs one: ``make()``
    builds it (``build(tensor, *args)``, None where the copy engine cannot take the
    tensor's strides: then a ValueError), and a launch of a compiled kernel skips even
    that for a tensor layout whose tensor map it has encoded before (:func:`_tensor_map`)."""

    __slots__ = ("tensor", "build", "args")

    def __init__(self, tensor, build, *args):
        self.tensor, self.build, self.args = tensor, build, args

    def attempt(self):
        """The descriptor, or None where the copy engine cannot take the tensor."""
        return self.build(self.tensor, *self.args)

    def make(self):
        desc = self.attempt()
        if desc is None:
            raise ValueError("the copy engine cannot take these tensors' strides (rows of "
                             "heads * dim, 16-byte aligned): make the plan with hopper=False "
                             "for them")
        return desc


def _tensor_map(desc, meta):
    """The launcher arguments of a host TMA descriptor (the encoded tensor map, shapes and
    strides; ``desc`` a descriptor or a :class:`Descriptor`), encoded once per tensor
    layout: an engine hands over the same caches, and activation buffers at the same
    addresses, layer after layer."""
    # The metadata is the compiled kernel's for this argument: it fixes the box and the
    # element type; the padding of an argument is always the one its launcher gives it;
    # the tensor's address, shape and strides do the rest.
    if type(desc) is Descriptor:
        t = desc.tensor
        key = (t.data_ptr(), t.shape, t.stride(), id(meta))
    else:
        key = (desc.base.data_ptr(), tuple(desc.shape), tuple(desc.strides), id(meta))
    args = _TENSOR_MAPS.get(key)
    if args is None:
        if len(_TENSOR_MAPS) >= _TENSOR_MAPS_MAX:
            _TENSOR_MAPS.clear()
        from triton.backends.nvidia.driver import make_tensordesc_arg
        made = desc.make() if type(desc) is Descriptor else desc
        args = _TENSOR_MAPS[key] = make_tensordesc_arg(made, meta)
    return args


def _assembler(names, fixed, tensor_names, int_names):
    """A function ``(tensors, ints) -> (misaligned, args)``: the kernel's arguments in
    order, the tensors as their addresses (None and TMA descriptors as they are), the fixed
    values in place; ``misaligned`` is nonzero when a tensor's address is not 16-byte
    aligned. Generated as straight-line code, once per kernel and plan: a loop over 60
    arguments costs more than the launch."""
    namespace = {"Tensor": torch.Tensor}
    body, items = [], []
    tensor_vars = {n: f"t{i}" for i, n in enumerate(tensor_names)}
    int_index = {n: i for i, n in enumerate(int_names)}
    if tensor_vars:
        body.append(f"    {', '.join(tensor_vars.values())}, = tensors")
    for var in tensor_vars.values():
        body.append(f"    if type({var}) is Tensor:")
        body.append(f"        {var} = {var}.data_ptr()")
        body.append(f"        misaligned |= {var} & 15")
    for i, name in enumerate(names):
        if name in tensor_vars:
            items.append(tensor_vars[name])
        elif name in int_index:
            items.append(f"ints[{int_index[name]}]")
        else:
            value = fixed[name]
            namespace[f"c{i}"] = value.data_ptr() if isinstance(value, torch.Tensor) else value
            items.append(f"c{i}")
    source = ("def assemble(tensors, ints):\n    misaligned = 0\n" + "\n".join(body)
              + f"\n    return misaligned, [{', '.join(items)}]\n")
    exec(compile(source, "<swattn launch>", "exec"), namespace)  # noqa: S102
    return namespace["assemble"]


class Launch:
    """One kernel's launches for one plan: ``fixed`` maps every argument not given at run
    time to its value (constexprs, scalars; launch options such as ``num_warps`` go in
    ``options``), ``tensors`` and ``ints`` name the arguments given at run time, in the
    order :meth:`__call__` takes them. ``dtypes``: the dtypes of the run-time tensors
    (whatever the plan fixes of them: they are part of the kernel's specialization, and one
    Launch serves every plan of its fixed values)."""

    def __init__(self, kernel, fixed, options, tensors, ints=(), dtypes=()):
        self.kernel = kernel
        self.fixed = fixed
        self.options = options
        self.tensor_names = tuple(tensors)
        self.int_names = tuple(ints)
        names = kernel.arg_names
        given = set(fixed) | set(self.tensor_names) | set(self.int_names)
        missing = [n for n in names if n not in given]
        extra = sorted(given - set(names))
        if missing or extra:
            raise TypeError(f"{kernel.__name__}: arguments missing {missing}, unknown {extra}")
        self.assemble = _assembler(names, fixed, self.tensor_names, self.int_names)
        fixed_key = (kernel, tuple((n, _key_of(fixed[n])) for n in names if n in fixed),
                     tuple(sorted(options.items())), tuple(dtypes))
        self.id = _FIXED_IDS.setdefault(fixed_key, len(_FIXED_IDS))
        self.interpreted = os.environ.get("TRITON_INTERPRET") == "1"

    def __call__(self, grid, tensors, ints=()):
        """Launch on ``grid`` (three ints) with ``tensors`` (tensors, TMA descriptors or
        None) and ``ints`` (a tuple) in the order of the names given at construction.
        Returns what :func:`relaunch` takes to launch the same again where the launch went
        straight to the compiled kernel's launcher, else None."""
        if (not self.interpreted and not knobs.runtime.launch_enter_hook.calls
                and not knobs.runtime.launch_exit_hook.calls):
            device = torch._C._cuda_getDevice()
            key = (self.id, device, ints)
            compiled = _COMPILED.get(key)
            if compiled is not None:
                misaligned, args = self.assemble(tensors, ints)
                if not misaligned:  # else: specialized for aligned tensors, the JIT's path
                    if compiled.descs:
                        args = compiled.expand(args)
                    compiled.run(grid, torch._C._cuda_getCurrentRawStream(device), args)
                    return compiled, grid, device, args
        else:
            key = None
        kwargs = dict(self.fixed)
        kwargs.update(zip(self.tensor_names, (t.make() if type(t) is Descriptor else t
                                              for t in tensors)))
        kwargs.update(zip(self.int_names, ints))
        compiled = self.kernel[tuple(grid)](**kwargs, **self.options)
        aligned = all(t.data_ptr() % 16 == 0 for t in tensors if type(t) is torch.Tensor)
        if key is not None and aligned and compiled is not None and key not in _COMPILED:
            try:
                _COMPILED[key] = _Compiled(compiled)
            except (AttributeError, KeyError, TypeError):
                pass  # not a launcher this module knows: the JIT's path every time


def relaunch(*ready):
    """Launch again what :class:`Launch` calls returned (each: the compiled kernel, grid,
    device and the launcher's arguments), in order, on the current stream: the same
    kernels on the same addresses, shapes and strides, at the cost of the launchers alone.
    False, launching nothing, where a launch hook has been set since or another device is
    current."""
    device = ready[0][2]
    if (knobs.runtime.launch_enter_hook.calls or knobs.runtime.launch_exit_hook.calls
            or torch._C._cuda_getDevice() != device):
        return False
    stream = torch._C._cuda_getCurrentRawStream(device)
    for compiled, grid, _, args in ready:
        compiled.run(grid, stream, args)
    return True
