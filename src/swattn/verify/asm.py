"""`swattn verify --asm`: the extend kernel's bounds variants compiled for Hopper (sm_90)
and compared instruction by instruction, with registers and spills per variant.

No GPU is needed: Triton compiles for a named target with the ptxas it ships, and its
cuobjdump turns the cubin into SASS. What it shows:

* where the bounds cannot matter (full attention, non-causal: tight and none walk the
  same range), the tight kernel and the baseline are the same SASS, instruction for
  instruction: the window code folds away at compile time;
* where they do matter, how much code and how many registers the bounds cost (the first
  seed found a runtime lower bound raising scalar spills on MI350X).
"""

import difflib
import inspect
import re
import subprocess
import tempfile
from dataclasses import dataclass

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.tools.disasm import path_to_cuobjdump

from ..ops import extend as ops_extend
from ..ops.config import extend_config, hopper_decode_config, hopper_extend_config, packs_gqa

TARGET = GPUTarget("cuda", 90, 32)
_POINTERS = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "K_cache": "*bf16", "V_cache": "*bf16",
             "Out": "*bf16", "block_table": "*i32", "cu_seqlens": "*i32", "prefix_lens": "*i32",
             "sinks": "*fp32", "mask": "*u8", "mask_indptr": "*i32",
             "Lse": "*fp32"}
_FLOATS = {"qk_scale", "softcap"}


@dataclass(frozen=True)
class Shape:
    """One workload's compile-time shape: heads, head dims, window, features."""

    name: str
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    window_left: int | None
    causal: bool = True
    sinks: bool = False


SHAPES = (
    Shape("gpt-oss d64 W128 sinks", 16, 2, 64, 127, sinks=True),
    Shape("mistral d128 W4096", 32, 8, 128, 4095),
    Shape("full causal d128", 32, 8, 128, None),
    Shape("full non-causal d128", 32, 8, 128, None, causal=False),
)


@dataclass
class Compiled:
    sass: list
    registers: int
    stack: int
    local: int
    shared: int


def compile_extend(shape, bounds, deterministic=False, **flags):
    """The extend kernel of ``shape`` under ``bounds``, compiled for sm_90 with the config
    the launcher would pick on an H200; ``flags`` override its feature constexprs
    (USE_MASK, USE_SOFTCAP, RETURN_LSE, ...)."""
    group = shape.num_q_heads // shape.num_kv_heads
    cfg = extend_config(shape.head_dim, shape.head_dim, group, shape.window_left, "bfloat16",
                        "cuda")
    constexprs = dict(
        D=shape.head_dim, DV=shape.head_dim, BLOCK_D=shape.head_dim, BLOCK_DV=shape.head_dim,
        GROUP=group, PACK_GQA=packs_gqa(cfg, group), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        SEQS_POW2=8, USE_WINDOW=shape.window_left is not None, USE_RIGHT=False,
        IS_CAUSAL=shape.causal, HAS_SINKS=shape.sinks, USE_SOFTCAP=False, USE_MASK=False,
        DO_PREFIX=True, DO_NEW=True, RETURN_LSE=False, TIGHT=bounds == "tight",
        SKIP=bounds == "skip", SPLIT_FULL=cfg.split_full, UNIFIED=deterministic,
        TMA_NEW=cfg.tma and cfg.split_full, TMA_CACHE=False, desc_kc=None, desc_vc=None,
        k_scale=None, v_scale=None, K_SCALE_STRIDE=0, V_SCALE_STRIDE=0, RANGES=False,
        USE_CHUNK=False, HAS_POSITIONS=False, RING=False)
    constexprs.update(flags)
    if not constexprs["RING"]:
        constexprs["ring"] = 1  # as the launch passes it for a linear table
    pointers = dict(_POINTERS)
    if constexprs["HAS_POSITIONS"]:
        pointers["positions"] = "*i32"
    else:
        constexprs["positions"] = None
    _ranges_arguments(constexprs, pointers)
    if constexprs["USE_MASK"]:
        constexprs["TMA_NEW"] = False  # a masked launch has no mask-free tiles to copy
    # As the benchmarks launch it: new k/v by tensor-memory copy, the cache (pages of 16,
    # smaller than a key tile) through pointers.
    descriptor = f"tensordesc<bf16[{cfg.block_n}, {shape.head_dim}]>"
    if not constexprs["TMA_NEW"]:
        constexprs.update(desc_k=None, desc_v=None)
    compiled, _kernel = _compile(
        ASTSource, ops_extend._extend_kernel, constexprs,
        lambda name: descriptor if name.startswith("desc_") else
        pointers.get(name, "fp32" if name in _FLOATS else "i32"), pointers,
        {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    return compiled


def _ranges_arguments(constexprs, pointers):
    """key_ranges' arrays as the launch passes them: int32 pointers under RANGES (added to
    ``pointers``), else left out (None)."""
    if constexprs["RANGES"]:
        pointers.update(key_lo="*i32", key_hi="*i32")
    else:
        constexprs.update(key_lo=None, key_hi=None)


def _compile(source_class, fn, constexprs, arg_type, pointers, options):
    """``fn`` compiled for sm_90 with Triton's ptxas: ``(Compiled, kernel)``. Every
    argument not in ``constexprs`` gets ``arg_type(name)``; ``pointers`` and strides are
    marked 16-divisible."""
    names = list(inspect.signature(fn.fn).parameters)
    signature = {name: "constexpr" if name in constexprs else arg_type(name) for name in names}
    # A launch marks every 16-byte aligned pointer and every integer divisible by 16 (the
    # strides of these shapes) so; without the marks loads are not vectorised and no
    # loop is pipelined, and the registers would be those of another kernel.
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(names)
             if name in pointers or name.startswith("stride_")}
    source = source_class(fn=fn, signature=signature, attrs=attrs,
                          constexprs={(names.index(k),): v for k, v in constexprs.items()})
    kernel = triton.compile(source, target=TARGET, options=options)
    cubin = kernel.asm["cubin"]
    usage = _resource_usage(cubin)
    compiled = Compiled(_instructions(_cuobjdump(cubin, "-sass")), usage.get("REG", -1),
                        usage.get("STACK", -1), usage.get("LOCAL", -1), kernel.metadata.shared)
    return compiled, kernel


def compile_decode(head_dim=128, group=4, window=True, dtype="bf16", split=False, sinks=True,
                   bounds="tight", kv_dtype=None, maxnreg=None, **flags):
    """The Triton decode kernel (ops.decode) compiled for sm_90 with Triton's ptxas, one
    head block of ``group`` query heads a KV head, keys in tiles of 64; ``flags`` override
    its constexprs (HAS_SPARSE, CARRY, SPLIT_D with BLOCK_D and BLOCK_D2, ...).
    ``kv_dtype``: the cache's and pool's Triton type where it is not ``dtype`` (``"fp8e4nv"``:
    an fp8 cache with one scale a KV head); ``maxnreg``: a register cap for the launch."""
    from ..ops import decode as ops_decode
    constexprs = dict(D=head_dim, DV=head_dim, BLOCK_D=head_dim, BLOCK_D2=16, SPLIT_D=False,
                      BLOCK_DV=head_dim, GROUP=group, BLOCK_H=max(group, 16), HEAD_BLOCKS=1,
                      BLOCK_N=64, USE_WINDOW=window, HAS_SINKS=sinks, USE_SOFTCAP=False,
                      HAS_SPARSE=False, WRITE_PARTIAL=split, RETURN_LSE=False,
                      TIGHT=bounds == "tight", SKIP=bounds == "skip", CARRY=False,
                      FLAG_UNREAD=False, V_IN_K=False, HEADS_FIRST=False, PDL=False, k_scale=None,
                      v_scale=None, K_SCALE_STRIDE=0, V_SCALE_STRIDE=0, USE_CHUNK=False,
                      RING=False)
    pointers = {n: f"*{dtype}" for n in ("Q", "K_cache", "V_cache", "K_pool", "V_pool", "Out")}
    pointers.update({"block_table": "*i32", "seq_lens": "*i32", "Idx": "*i32",
                     "sinks": "*fp32", "Lse": "*fp32", "Part_o": "*fp32", "Part_lse": "*fp32"})
    if kv_dtype is not None:
        pointers.update({n: f"*{kv_dtype}" for n in ("K_cache", "V_cache", "K_pool", "V_pool")})
        pointers.update(k_scale="*fp32", v_scale="*fp32")
        for name in ("k_scale", "v_scale"):
            del constexprs[name]
        constexprs.update(K_SCALE_STRIDE=1, V_SCALE_STRIDE=1)
    constexprs.update(flags)
    if not constexprs["RING"]:
        constexprs["ring"] = 1  # as the launch passes it for a linear table
    options = {"num_warps": 4, "num_stages": 2}
    if maxnreg is not None:
        options["maxnreg"] = maxnreg
    compiled, _ = _compile(ASTSource, ops_decode._decode_kernel, constexprs,
                           lambda name: pointers.get(name, "fp32" if name in _FLOATS else "i32"),
                           pointers, options)
    return compiled


def compile_second_keys(head_dim=512, head_dim_v=512, group=64, block_h=16, block_n=32,
                        dtype="bf16", indexed=True, rows=False, bounds="tight", kv_dtype=None,
                        **flags):
    """The second-source kernel (ops.decode, DeepSeek-V4's shape by default: 64 query heads
    on one KV head of 512 columns, K = V, in head blocks of ``block_h``) compiled for sm_90
    with Triton's ptxas; ``indexed``: an index list a row (else the causal limit);
    ``rows``: extend's rows; ``flags`` override its constexprs."""
    from ..ops import decode as ops_decode
    from ..ops.config import split_width
    block_d, block_d2 = split_width(head_dim)
    constexprs = dict(D=head_dim, DV=head_dim_v, BLOCK_D=block_d, BLOCK_D2=block_d2 or 16,
                      SPLIT_D=block_d2 > 0, BLOCK_DV=head_dim_v, GROUP=group, BLOCK_H=block_h,
                      HEAD_BLOCKS=-(-group // block_h), BLOCK_N=block_n, USE_WINDOW=True,
                      WINDOW_KEYS=True, HAS_SINKS=True, USE_SOFTCAP=False, INDEXED=indexed,
                      ROWS=rows, WRITE_PARTIAL=False, RETURN_LSE=False,
                      TIGHT=bounds == "tight", SKIP=bounds == "skip", FLAG_UNREAD=True,
                      V_IN_K=head_dim_v <= head_dim, k_scale=None, v_scale=None,
                      K_SCALE_STRIDE=0, V_SCALE_STRIDE=0, USE_CHUNK=False)
    names = ("Q", "K_cache", "V_cache", "K_new", "V_new", "X_cache", "X_values", "Out")
    pointers = {n: f"*{dtype}" for n in names}
    pointers.update({n: "*i32" for n in ("block_table", "seq_lens", "row_seq", "cu_seqlens",
                                         "prefix_lens", "X_table", "X_entries", "X_idx")})
    pointers.update({"sinks": "*fp32", "Lse": "*fp32", "Part_o": "*fp32", "Part_lse": "*fp32"})
    if kv_dtype is not None:
        pointers.update({n: f"*{kv_dtype}" for n in ("K_cache", "V_cache", "X_cache",
                                                     "X_values")})
        pointers.update(k_scale="*fp32", v_scale="*fp32")
        for name in ("k_scale", "v_scale"):
            del constexprs[name]
    constexprs.update(flags)
    compiled, _ = _compile(ASTSource, ops_decode._second_keys_kernel, constexprs,
                           lambda name: pointers.get(name, "fp32" if name in _FLOATS else "i32"),
                           pointers, {"num_warps": 4, "num_stages": 2})
    return compiled


def fingerprint_kernels():
    """``[(name, compile)]``: each Triton kernel at the shapes of :data:`SHAPES` (extend:
    two-stage and deterministic) and four decode shapes, the Gluon (Hopper) kernels at five,
    and the variants those leave out; ``compile()`` returns the kernel compiled for sm_90."""
    kernels = [(f"extend {shape.name}{', deterministic' if det else ''}",
                lambda shape=shape, det=det: compile_extend(shape, "tight", det))
               for shape in SHAPES for det in (False, True)]
    kernels += [(f"decode d{d} group {g}{' window' if w else ''} {dt}{' split' if sp else ''}",
                 lambda d=d, g=g, w=w, dt=dt, sp=sp: compile_decode(d, g, w, dt, sp))
                for d, g, w, dt, sp in ((64, 8, True, "bf16", False),
                                        (128, 4, True, "bf16", False),
                                        (128, 4, False, "bf16", False),
                                        (64, 8, True, "fp16", True))]
    kernels += [(f"hopper extend d{d}{' sinks' if sk else ''}{' softcap' if sc else ''}",
                 lambda d=d, sk=sk, sc=sc: compile_hopper(d, HAS_SINKS=sk, USE_SOFTCAP=sc)[0])
                for d, sk, sc in ((64, True, False), (128, False, False), (128, True, True))]
    kernels += [(f"hopper decode d{d}{' split' if sp else ''}",
                 lambda d=d, sp=sp: compile_hopper_decode(d, HAS_SINKS=True, WRITE_PARTIAL=sp)[0])
                for d, sp in ((64, False), (128, True))]
    # The variants the launches above leave out: the bounds checks, a custom mask, soft-capping
    # and the lse, sparse keys, the carried page walk, a split head dim, the short-window
    # (not warp-specialized) Hopper extend, a latent cache's values from the key tiles.
    mistral = next(shape for shape in SHAPES if shape.name.startswith("mistral"))
    kernels += [(f"extend {mistral.name} {bounds}", lambda b=bounds: compile_extend(mistral, b))
                for bounds in ("skip", "none")]
    kernels += [("extend mistral masked softcap lse", lambda: compile_extend(
        mistral, "tight", USE_MASK=True, USE_SOFTCAP=True, RETURN_LSE=True))]
    kernels += [(f"decode d128 group 4 window bf16 {b}", lambda b=b: compile_decode(bounds=b))
                for b in ("skip", "none")]
    kernels += [("decode d128 sparse split carry", lambda: compile_decode(
        split=True, HAS_SPARSE=True, CARRY=True)),
                ("decode d576 split head", lambda: compile_decode(
        576, 16, dtype="bf16", D=576, DV=512, BLOCK_D=512, BLOCK_D2=64, SPLIT_D=True,
        BLOCK_DV=512, BLOCK_H=16)),
                ("decode d576 split head sparse flag-unread", lambda: compile_decode(
        576, 16, dtype="bf16", D=576, DV=512, BLOCK_D=512, BLOCK_D2=64, SPLIT_D=True,
        BLOCK_DV=512, BLOCK_H=16, HAS_SPARSE=True, FLAG_UNREAD=True)),
                ("decode d576 split head sparse latent", lambda: compile_decode(
        576, 16, dtype="bf16", D=576, DV=512, BLOCK_D=512, BLOCK_D2=64, SPLIT_D=True,
        BLOCK_DV=512, BLOCK_H=16, HAS_SPARSE=True, FLAG_UNREAD=True, V_IN_K=True))]
    kernels += [(f"hopper extend d128 window 127 {b}", lambda b=b: compile_hopper(
        128, bounds=b, WARP_SPECIALIZED=False)[0]) for b in ("tight", "skip", "none")]
    kernels += [(f"hopper decode d128 {b}", lambda b=b: compile_hopper_decode(
        128, bounds=b, HAS_SINKS=True)[0]) for b in ("skip", "none")]
    kernels += [(f"hopper latent decode {kv or 'bf16'}{' sparse' if sp else ''}",
                 lambda kv=kv, sp=sp: compile_latent_decode(kv_dtype=kv, sparse=sp)[0])
                for kv, sp in ((None, True), (None, False), ("float8_e4m3fn", True))]
    return kernels


def fingerprints(kernels=None, progress=None):
    """``{name: "digest registers"}``: a digest of the SASS and the register count of each
    of ``kernels`` (default :func:`fingerprint_kernels`). Two trees' fingerprints compared
    (:func:`compare_fingerprints`, ``swattn verify --asm --fingerprints``) show a change
    leaves those kernels' code as it was."""
    import hashlib
    out = {}
    for name, compile_one in kernels or fingerprint_kernels():
        c = compile_one()
        digest = hashlib.sha1("\n".join(c.sass).encode()).hexdigest()[:16]
        out[name] = f"{digest} {c.registers} registers"
        if progress:
            progress(f"{name}: {out[name]}")
    return out


def compare_fingerprints(now, before):
    """``(summary line, names of the kernels whose fingerprint differs)``: ``now`` against
    ``before`` (two :func:`fingerprints`); a kernel ``before`` lacks differs."""
    changed = [name for name in now if before.get(name) != now[name]]
    line = f"{len(now) - len(changed)} of {len(now)} kernels' SASS identical"
    return line + (f"; differing: {', '.join(changed)}" if changed else ""), changed


def compile_hopper(head_dim=128, dtype="bf16", page_size=16, bounds="tight", kv_dtype=None,
                   config=None, **flags):
    """The Gluon fast path of the extend kernel (ops.extend_hopper) compiled for sm_90
    with Triton's ptxas, no GPU needed; ``kv_dtype``: an fp8 cache's torch dtype (None:
    the queries'); ``config``: a config.HopperExtendConfig in the place of the plan's;
    ``flags`` override its feature constexprs (USE_WINDOW, IS_CAUSAL,
    HAS_SINKS, ...). Returns (Compiled, the kernel's PTX)."""
    import torch
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    from ..ops import extend_hopper as hopper

    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float16
    cfg = config or hopper_extend_config(head_dim, torch_dtype)
    t = torch.empty(4 * cfg.block_m, 2, head_dim, dtype=torch_dtype)
    cache = torch.empty(8, page_size, 2, head_dim, dtype=kv_dtype or torch_dtype)
    # The new rows as the plan hands them over: fp16 holding the fp8 values, or with fp8
    # products fp8.
    new = t if kv_dtype is None else t.to(kv_dtype if cfg.fp8_products else torch.float16)
    prefix = None
    if cfg.prefix_rows:
        prefix = (torch.empty(4 * cfg.block_n, 2, head_dim, dtype=torch.float16),) * 2
    descs = hopper.descriptors(cfg, t, new, new, cache, cache, prefix)
    assert isinstance(descs, tuple), descs
    fp8 = kv_dtype is not None
    constexprs = dict(D=head_dim, GROUP=2, PAGE=page_size, BM=cfg.block_m, BN=cfg.block_n,
                      STAGES=cfg.stages, SEQS_POW2=8, USE_WINDOW=True, USE_RIGHT=False,
                      IS_CAUSAL=True, HAS_SINKS=False, USE_SOFTCAP=False, DO_PREFIX=True,
                      DO_NEW=True, RETURN_LSE=False, TIGHT=bounds == "tight",
                      SKIP=bounds == "skip", HEADS_FIRST=cfg.heads_first,
                      Q_REGS=cfg.q_regs,
                      WARP_SPECIALIZED=cfg.warp_specialized(bounds, None, fp8),
                      PRODUCER_REGS=cfg.producer_regs, K_SCALE_STRIDE=0, V_SCALE_STRIDE=0,
                      CONVERT_WARPS=cfg.convert_warps, CONVERT_REGS=cfg.convert_regs,
                      FP8_PRODUCTS=cfg.fp8_products, PREFIX_ROWS=cfg.prefix_rows, RANGES=False,
                      CHUNK=0, RING=False, ring_width=1)
    pointers = {"block_table": "*i32", "cu_seqlens": "*i32", "prefix_lens": "*i32",
                "sinks": "*fp32", "Out": f"*{dtype}", "Lse": "*fp32"}
    desc_names = ("q_desc", "k_desc", "v_desc", "kc_desc", "vc_desc", "poison")
    if fp8:
        pointers.update(k_scale="*fp32", v_scale="*fp32")
    else:
        constexprs.update(poison=None, k_scale=None, v_scale=None)
    constexprs.update(flags)
    if constexprs["RING"]:
        del constexprs["ring_width"]  # a ring's width: a run-time int
    _ranges_arguments(constexprs, pointers)
    compiled, kernel = _compile(
        GluonASTSource, hopper.hopper_extend_kernel, constexprs,
        lambda name: mangle_type(descs[desc_names.index(name)]) if name in desc_names else
        pointers.get(name, "fp32" if name in _FLOATS else "i32"), pointers,
        dict(cfg.launch_options(constexprs["WARP_SPECIALIZED"]), num_stages=1))
    return compiled, kernel.asm["ptx"]


def compile_hopper_decode(head_dim=128, dtype="bf16", page_size=16, group=4, bounds="tight",
                          kv_dtype=None, **flags):
    """The Gluon fast path of the decode kernel (ops.decode_hopper) compiled for sm_90
    with Triton's ptxas, no GPU needed; ``kv_dtype``: an fp8 cache's torch dtype (None:
    the queries'); ``flags`` override its feature constexprs (USE_WINDOW, HAS_SINKS,
    WRITE_PARTIAL, STAGES, ...). Returns (Compiled, the PTX)."""
    import torch
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    from ..ops import decode_hopper as hopper

    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float16
    q = torch.empty(2, 2 * group, head_dim, dtype=torch_dtype)
    cache = torch.empty(8, page_size, 2, head_dim, dtype=kv_dtype or torch_dtype)
    cfg = hopper_decode_config(head_dim, torch_dtype, kv_dtype)
    layouts = hopper.shared_layouts(torch_dtype, head_dim, page_size, cfg.block_h, cfg.block_n,
                                    kv_dtype)
    kc, vc, poison = hopper.descriptors(cfg, q, cache, cache)
    constexprs = dict(D=head_dim, GROUP=group, PAGE=page_size, BM=cfg.block_h,
                      HEAD_BLOCKS=-(-group // cfg.block_h),
                      BN=cfg.block_n, STAGES=cfg.num_stages, Q_LAYOUT=layouts[1],
                      USE_WINDOW=True, HAS_SINKS=False, USE_SOFTCAP=False, WRITE_PARTIAL=False,
                      RETURN_LSE=False, TIGHT=bounds == "tight", SKIP=bounds == "skip",
                      PRODUCER_REGS=cfg.producer_regs, PDL=False, K_SCALE_STRIDE=0,
                      V_SCALE_STRIDE=0, ITEMS=cfg.items, USE_CHUNK=False, RING=False,
                      ring_width=1)
    pointers = {"Q": f"*{dtype}", "block_table": "*i32", "seq_lens": "*i32", "sinks": "*fp32",
                "Out": f"*{dtype}", "Lse": "*fp32", "Part_o": "*fp32", "Part_lse": "*fp32"}
    descs = {"kc_desc": kc, "vc_desc": vc}
    if kv_dtype is None:
        constexprs.update(poison=None, k_scale=None, v_scale=None)
    else:
        descs["poison"] = poison
        pointers.update(k_scale="*fp32", v_scale="*fp32")
    constexprs.update(flags)
    if constexprs["RING"]:
        del constexprs["ring_width"]  # a ring's width: a run-time int
    compiled, kernel = _compile(
        GluonASTSource, hopper._hopper_decode_kernel, constexprs,
        lambda name: mangle_type(descs[name]) if name in descs else
        pointers.get(name, "fp32" if name in _FLOATS else "i32"), pointers,
        dict(num_warps=cfg.num_warps, maxnreg=cfg.maxnreg, num_stages=1))
    return compiled, kernel.asm["ptx"]


def compile_latent_decode(dtype="bf16", kv_dtype=None, sparse=True, bounds="tight", group=64,
                          page_size=16, **flags):
    """The Gluon latent-cache decode path (ops.decode_latent) compiled for sm_90 with
    Triton's ptxas, no GPU needed: queries of ``dtype`` over a cache of theirs or of
    ``kv_dtype`` (an fp8 torch dtype), with a sparse pool or not; ``flags`` override its
    feature constexprs (HAS_SINKS, WRITE_PARTIAL, ...). Returns (Compiled, the PTX)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from ..ops import decode_latent as latent
    from ..ops.config import LatentDecodeConfig

    cfg = LatentDecodeConfig()
    kv = {None: dtype, "float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5"}[
        None if kv_dtype is None else str(kv_dtype).removeprefix("torch.")]
    constexprs = dict(PAGE=page_size, DV=latent.HEAD_DIM_V,
                      DT=latent.HEAD_DIM - latent.HEAD_DIM_V, GROUP=group,
                      HEAD_BLOCKS=-(-group // latent.BLOCK_H), BN=cfg.block_n, USE_WINDOW=True,
                      HAS_SINKS=True, USE_SOFTCAP=False, HAS_SPARSE=sparse, WRITE_PARTIAL=False,
                      RETURN_LSE=False, TIGHT=bounds == "tight", SKIP=bounds == "skip",
                      PDL=False, K_SCALE_STRIDE=0, V_SCALE_STRIDE=0, USE_CHUNK=False,
                      RING=False, ring_width=1)
    pointers = {"Q": f"*{dtype}", "K_cache": f"*{kv}", "block_table": "*i32", "seq_lens": "*i32",
                "sinks": "*fp32", "Out": f"*{dtype}", "Lse": "*fp32", "Part_o": "*fp32",
                "Part_lse": "*fp32"}
    if sparse:
        pointers.update(K_pool=f"*{kv}", Idx="*i32")
    else:
        constexprs.update(K_pool=None, Idx=None)
    if kv_dtype is None:
        constexprs.update(k_scale=None, v_scale=None)
    else:
        pointers.update(k_scale="*fp32", v_scale="*fp32")
    constexprs.update(flags)
    if constexprs["RING"]:
        del constexprs["ring_width"]  # a ring's width: a run-time int
    compiled, kernel = _compile(
        GluonASTSource, latent._latent_decode_kernel, constexprs,
        lambda name: pointers.get(name, "fp32" if name in _FLOATS else "i32"), pointers,
        dict(num_warps=cfg.num_warps, num_stages=1))
    return compiled, kernel.asm["ptx"]


def mma_loops(sass):
    """The loops of ``sass`` (Compiled.sass) holding tensor-core products: the bodies of
    conditional backward branches with an HGMMA (warpgroup, 16-bit operands), QGMMA
    (warpgroup, fp8) or HMMA (one warp's mma.sync) in them (the spin-waits' returns are
    unconditional)."""
    loops = []
    for end, ins in enumerate(sass):
        m = re.search(r"^@!?U?P\d+ BRA (0x[0-9a-f]+)", ins)
        if m and int(m.group(1), 16) // 16 < end:
            body = sass[int(m.group(1), 16) // 16:end + 1]
            if any("HGMMA" in i or "QGMMA" in i or "HMMA" in i for i in body):
                loops.append(body)
    return loops


def _cuobjdump(cubin, flag):
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.check_output([path_to_cuobjdump(), flag, f.name]).decode()


def _instructions(text):
    """The instructions of ``cuobjdump -sass``, addresses and encodings stripped (Triton's
    own SASS reader drops some lines, tensor-memory copies among them)."""
    return [m.group(1).strip() for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+([^;]*;)", text)]


def _resource_usage(cubin):
    text = _cuobjdump(cubin, "--dump-resource-usage")
    return {key: int(value) for key, value in re.findall(r"\b(REG|STACK|LOCAL|SHARED):(\d+)", text)}


def differing(a, b):
    """Instructions of ``b`` that are not matched in ``a`` by a longest-common-subsequence
    alignment (difflib), plus those of ``a`` left unmatched: 0 means the same code."""
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    same = sum(block.size for block in matcher.get_matching_blocks())
    return (len(a) - same) + (len(b) - same)


VARIANTS = (("tight", "tight", False), ("skip", "skip", False), ("none", "none", False),
            ("deterministic", "tight", True))


def run(progress=None, shapes=SHAPES, variants=VARIANTS):
    """Compile every shape under every variant; the markdown report and whether every
    comparison that must be identical is. (Needs the compiler, not the interpreter: run it
    in a process without TRITON_INTERPRET.)"""
    lines = ["### Extend kernel SASS (sm_90, Triton's ptxas), bounds variants", "",
             "| shape | variant | SASS instructions | registers | stack | local | shared bytes | "
             "instructions differing from tight |", "|---|---|---|---|---|---|---|---|"]
    ok = True
    verdicts = []
    for shape in shapes:
        compiled = {}
        for variant, bounds, det in variants:
            compiled[variant] = c = compile_extend(shape, bounds, det)
            diff = differing(compiled["tight"].sass, c.sass)
            lines.append(f"| {shape.name} | {variant} | {len(c.sass)} | {c.registers} | "
                         f"{c.stack} | {c.local} | {c.shared} | {diff} |")
            if progress:
                progress(f"{shape.name} {variant}: {len(c.sass)} instructions, "
                         f"{c.registers} registers")
        if shape.window_left is None and not shape.causal:
            same = compiled["tight"].sass == compiled["none"].sass
            ok = ok and same
            verdicts.append(f"- {shape.name}: tight and none walk the same range; their SASS is "
                            f"{'identical, instruction for instruction' if same else 'DIFFERENT'} "
                            f"({len(compiled['tight'].sass)} instructions).")
    lines += [""] + verdicts
    return "\n".join(lines), ok


def kernel(name):
    """The Triton jit function of one of swattn's kernels by name (``"decode"``,
    ``"merge"``, ``"second-keys"``, ``"extend"``), for compiles outside a launch (this
    module's, a test's): the one place that reaches into the kernel modules for them."""
    from ..ops import decode as ops_decode
    from ..ops import extend as ops_extend
    from ..ops import merge as ops_merge
    kernels = {"decode": ops_decode._decode_kernel, "merge": ops_merge._merge_kernel,
               "second-keys": ops_decode._second_keys_kernel,
               "extend": ops_extend._extend_kernel}
    if name not in kernels:
        raise ValueError(f"kernel must be one of {sorted(kernels)}, got {name!r}")
    return kernels[name]
