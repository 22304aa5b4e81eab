"""The bit-identity matrices: every bounds variant of a kernel gives the same bits
(``max_abs == 0.0``), and each of them is checked against the float reference, so the
equality shown is one of correct results. Three families: the two-stage extend kernel,
the deterministic single-pass one (every other row of the same matrix), and decode.

The matrix follows the first seed: windows (as ``window_left + 1``) around every tile
boundary, prefixes below, at and above the window, windows wider than the sequence,
ragged batches, every tiling the config function can return, head dims 64 to 256 (not
only powers of two), fp16 and bf16, sinks, soft-cap, causal and non-causal (with and
without ``window_right``), a custom mask under the window, and ``keys="prefix"/"new"``
with lse. Features vary per row while (head dim, dtype, tiling) come in a few groups,
so the GPU compiles tens of kernels, not hundreds.
"""

import time
from dataclasses import dataclass

import torch

from .. import plan as swattn_plan
from .. import reference
from ..ops import decode as ops_decode
from ..ops import extend as ops_extend
from ..plan import run_decode, run_extend
from .cases import (
    DecodeCase,
    ExtendCase,
    build_decode,
    build_extend,
    build_second,
    build_sparse,
    random_mask,
    random_tree,
    rel_err,
)

GPU_WINDOWS = (1, 15, 16, 63, 64, 65, 127, 128, 129, 191, 192, 255, 256, 257, 1023, 4096)
CPU_WINDOWS = (1, 2, 15, 16, 17, 33)
# (head_dim, head_dim_v, dtype, (BLOCK_M, BLOCK_N)): the GPU groups cover every tiling of
# ops.config.EXTEND_TILINGS; the CPU ones run under the interpreter (fp16 only there:
# its bf16 dot is broken).
GPU_GROUPS = ((64, 64, torch.bfloat16, (128, 64)), (128, 128, torch.float16, (64, 64)),
              (256, 256, torch.bfloat16, (32, 64)), (80, 96, torch.float16, (16, 16)),
              (192, 128, torch.bfloat16, (128, 64)))
CPU_GROUPS = ((16, 16, torch.float16, (16, 16)), (24, 8, torch.float16, (32, 16)))
FEATURES = ("plain", "sinks", "softcap", "noncausal", "noncausal-right", "mask+window",
            "keys=prefix+lse", "keys=new+lse", "full-attention-bounds")


@dataclass
class Row:
    name: str
    configs: int
    max_abs_tight_skip: float
    max_abs_tight_none: float
    err_tight: float
    err_skip: float
    seconds: float
    tol: float = 1e-2  # against the reference (TOLERANCES)

    @property
    def ok(self):
        return (self.max_abs_tight_skip == 0.0 and self.max_abs_tight_none == 0.0
                and self.err_tight < self.tol and self.err_skip < self.tol)


def _shape(window, block_m, block_n, gpu):
    """Prefixes below, at and above the window and off every tile boundary; one
    sequence shorter than the window."""
    if gpu:
        prefixes = [max(window - 1, 0), window + block_n + 1, 2 * window + block_m - 1]
        extends = [2 * block_m + 1, 17, block_m - 1 + window % 7]
    else:
        prefixes = [max(window - 1, 0), window + block_n + 1, 3]
        extends = [block_m + 1, 5, 2]
    return prefixes, extends


def extend_matrix(gpu=True):
    """(name, case, kwargs, (BLOCK_M, BLOCK_N, pack_gqa)) for every configuration of the
    two-stage matrix."""
    windows, groups = (GPU_WINDOWS, GPU_GROUPS) if gpu else (CPU_WINDOWS, CPU_GROUPS)
    page_sizes = (16, 1, 64) if gpu else (4, 1, 16)
    rows = []
    for i, w in enumerate(windows):
        head_dim, head_dim_v, dtype, tiling = groups[i % len(groups)]
        for j, feature in enumerate(FEATURES):
            prefixes, extends = _shape(w, *tiling, gpu)
            heads = (8, 2) if gpu else (4, 2)
            case = ExtendCase(prefixes, extends, num_q_heads=heads[0], num_kv_heads=heads[1],
                              head_dim=head_dim, head_dim_v=head_dim_v, dtype=dtype,
                              page_size=page_sizes[(i + j) % 3], window_left=w - 1,
                              seed=100 * i + j)
            kwargs = _feature_kwargs(feature, case, w)
            if feature == "full-attention-bounds":
                case.window_left = None
            pack = j % 2 == 1
            name = (f"W{w} {feature} d{head_dim}/{head_dim_v} {str(dtype)[6:]} "
                    f"BM{tiling[0]}xBN{tiling[1]}{' gqa-packed' if pack else ''} "
                    f"ps{case.page_size}")
            rows.append((name, case, kwargs, tiling + (pack,)))
    return rows


# The Gluon fast path's matrix (ops.extend_hopper, sm_90): what it takes, D = Dv of 64 or
# 128, fp16 and bf16, pages of 16 to 128 rows; its tiles are fixed (64 x 64).
HOPPER_GROUPS = ((128, torch.bfloat16), (64, torch.float16), (128, torch.float16),
                 (64, torch.bfloat16))
HOPPER_PAGES = (16, 64, 32, 128)


def hopper_matrix(gpu=True):
    """(name, case, kwargs, None) for every configuration of the Hopper path's matrix:
    the windows and features of the two-stage matrix but the custom mask (it takes none),
    over its head dims, dtypes and page sizes."""
    rows = []
    for i, w in enumerate(GPU_WINDOWS):
        head_dim, dtype = HOPPER_GROUPS[i % len(HOPPER_GROUPS)]
        for j, feature in enumerate(f for f in FEATURES if f != "mask+window"):
            prefixes, extends = _shape(w, 64, 64, True)
            # KV groups of 4 and 3 (an odd group).
            group = 4 - j % 2
            case = ExtendCase(prefixes, extends, num_q_heads=2 * group, num_kv_heads=2,
                              head_dim=head_dim, head_dim_v=head_dim, dtype=dtype,
                              page_size=HOPPER_PAGES[(i + j) % len(HOPPER_PAGES)],
                              window_left=w - 1, seed=1000 + 100 * i + j)
            kwargs = _feature_kwargs(feature, case, w)
            if feature == "full-attention-bounds":
                case.window_left = None
            rows.append((f"W{w} {feature} d{head_dim} {str(dtype)[6:]} ps{case.page_size} "
                         f"group{group}", case, kwargs, None))
    return rows


def _feature_kwargs(feature, case, window):
    g = torch.Generator().manual_seed(case.seed)
    if feature == "sinks":
        return {"sinks": torch.randn(case.num_q_heads, generator=g)}
    if feature == "softcap":
        return {"softcap": 4.0, "sinks": torch.randn(case.num_q_heads, generator=g)}
    if feature == "noncausal":
        return {"causal": False}
    if feature == "noncausal-right":
        return {"causal": False, "window_right": window // 2}
    if feature == "mask+window":
        mask, indptr = random_mask(case.prefix_lens, case.extend_lens, case.seed)
        return {"mask": mask, "mask_indptr": indptr}
    if feature.startswith("keys="):
        return {"keys": feature[5:-4], "return_lse": True}
    return {}


def _max_abs(a, b):
    """Largest difference over every output (out, and lse where finite on both sides);
    NaN counts as a difference, an equal pair of -inf does not."""
    worst = 0.0
    for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
        if (not torch.equal(torch.isinf(x), torch.isinf(y)) or torch.isnan(x).any()
                or torch.isnan(y).any()):
            return float("inf")
        fin = torch.isfinite(x)
        if fin.any():
            worst = max(worst, (x[fin].float() - y[fin].float()).abs().max().item())
    return worst


def unified_matrix(gpu=True):
    """The deterministic single-pass kernel's matrix: every other row of the two-stage one
    (72 on the GPU: every window, every feature, every group)."""
    return extend_matrix(gpu)[::2]


def decode_matrix(gpu=True):
    """(name, case, kwargs, block_n) for every configuration of the decode matrix: the
    windows around every tile boundary, each over a ragged batch whose lengths fall below,
    at and past the window and off the tile grid; head dims 64 to 576, fp16/bf16, GQA
    groups 1 to 16 (64 on the wide heads, cut into head blocks), page sizes 1 to 64, split
    counts 1 to 8, sinks, soft-cap, sparse keys and lse, each tiling the decode config can
    return."""
    windows, groups = (GPU_WINDOWS, DECODE_GPU_GROUPS) if gpu else (CPU_WINDOWS, DECODE_CPU_GROUPS)
    page_sizes = (16, 1, 64) if gpu else (4, 1, 16)
    heads = ((8, 2), (16, 1), (8, 8), (32, 8)) if gpu else ((4, 2), (4, 1), (2, 2))
    rows = []
    for i, w in enumerate(windows):
        head_dim, head_dim_v, dtype, block_n = groups[i % len(groups)]
        for j, (feature, splits) in enumerate(DECODE_FEATURES):
            # Wide heads come as DeepSeek's: 64 query heads on one KV head, in head blocks.
            hq, hkv = (64, 1) if head_dim > 256 else heads[(i + j) % len(heads)]
            seq_lens = [w - 1 or 1, w, w + 1, w + block_n + 3, 1, 3 * w + 5]
            case = DecodeCase(seq_lens, num_q_heads=hq, num_kv_heads=hkv, head_dim=head_dim,
                              head_dim_v=head_dim_v, dtype=dtype, page_size=page_sizes[(i + j) % 3],
                              window_left=None if feature == "full-attention" else w - 1,
                              sparse_keys=(2 * block_n + 3) if "sparse" in feature else 0,
                              seed=1000 + 100 * i + j)
            kwargs = _decode_kwargs(feature, case, splits)
            name = (f"W{w} {feature} d{head_dim}/{head_dim_v} {str(dtype)[6:]} BN{block_n} "
                    f"h{hq}/{hkv} ps{case.page_size} splits {splits}")
            rows.append((name, case, kwargs, block_n))
    return rows


def _decode_kwargs(feature, case, splits, **options):
    """A decode matrix row's keyword arguments: its split count and lse, ``options``, and
    the feature's sinks (random, from the case's seed) and soft-cap."""
    g = torch.Generator().manual_seed(case.seed)
    kwargs = {"num_splits": splits, "return_lse": True, **options}
    if "sinks" in feature:
        kwargs["sinks"] = torch.randn(case.num_q_heads, generator=g)
    if "softcap" in feature:
        kwargs["softcap"] = 4.0
    return kwargs


# (head_dim, head_dim_v, dtype, BLOCK_N): every decode tiling on the GPU (128 keys up to
# d64, 64 up to d128, 32 up to d256, 16 with head blocks above; 16 is also the
# interpreter's).
DECODE_GPU_GROUPS = ((64, 64, torch.bfloat16, 128), (128, 128, torch.float16, 64),
                     (256, 256, torch.bfloat16, 32), (80, 96, torch.float16, 64),
                     (128, 128, torch.bfloat16, 16), (576, 512, torch.bfloat16, 16))
DECODE_CPU_GROUPS = ((16, 16, torch.float16, 16), (24, 8, torch.float16, 16))
DECODE_FEATURES = (("plain", 1), ("sinks", 2), ("softcap+sinks", 3), ("sparse", 1),
                   ("sparse+sinks", 8), ("full-attention", 4))


# The Gluon decode path's matrix (ops.decode_hopper, sm_90): D = Dv of 64 or 128, fp16
# and bf16, pages of 16 to 128 rows, groups 1 to 64; no sparse keys (it takes none).
HOPPER_DECODE_HEADS = ((8, 2), (16, 1), (8, 8), (32, 8), (64, 1))
HOPPER_DECODE_FEATURES = (("plain", 1), ("sinks", 2), ("softcap+sinks", 3), ("sinks", 8),
                          ("full-attention", 4), ("plain", None))


def hopper_decode_matrix(gpu=True):
    """(name, case, kwargs, None) for every configuration of the Gluon decode path's
    matrix: the decode matrix's windows and ragged lengths (below, at and past the window,
    off the 64-key tile grid) over its head dims, dtypes, page sizes, groups and split
    counts (None: the path's own choice)."""
    rows = []
    for i, w in enumerate(GPU_WINDOWS):
        head_dim, dtype = HOPPER_GROUPS[i % len(HOPPER_GROUPS)]
        for j, (feature, splits) in enumerate(HOPPER_DECODE_FEATURES):
            hq, hkv = HOPPER_DECODE_HEADS[(i + j) % len(HOPPER_DECODE_HEADS)]
            seq_lens = [w - 1 or 1, w, w + 1, w + 67, 1, 3 * w + 5]
            case = DecodeCase(seq_lens, num_q_heads=hq, num_kv_heads=hkv, head_dim=head_dim,
                              head_dim_v=head_dim, dtype=dtype,
                              page_size=HOPPER_PAGES[(i + j) % len(HOPPER_PAGES)],
                              window_left=None if feature == "full-attention" else w - 1,
                              seed=3000 + 100 * i + j)
            kwargs = _decode_kwargs(feature, case, splits, hopper=True)
            rows.append((f"W{w} {feature} d{head_dim} {str(dtype)[6:]} h{hq}/{hkv} "
                         f"ps{case.page_size} splits {splits}", case, kwargs, None))
    return rows


# The Gluon latent decode path's matrix (ops.decode_latent, sm_90): keys of 576 columns whose
# first 512 are the values, groups of 16 to 128 query heads (one head block of 64, less,
# or two), fp16/bf16 queries over a cache of their dtype, e4m3fn with one scale or e5m2
# with one a KV head; pages of 1 to 64 rows; split counts 1 to 8 and the plan's own (None).
LATENT_HOPPER_HEADS = ((64, 1), (32, 1), (128, 2), (128, 1), (40, 1), (16, 1))
LATENT_HOPPER_FEATURES = (("plain", 1), ("sinks", 2), ("softcap+sinks", 3), ("sparse", None),
                          ("sparse+sinks", 8), ("full-attention", 4))


def latent_hopper_matrix(gpu=True):
    """(name, case, kwargs, None) for every configuration of the Gluon latent decode path's
    matrix: the decode matrix's windows and ragged lengths (below, at and past the window,
    off the 32-key tile grid) over latent caches of each dtype and scale kind, the heads,
    pages and split counts above, sinks, soft-cap, sparse keys (a latent pool) and full
    attention. The plans are made with ``hopper=True`` (one the latent path cannot take
    raises) and the rows' values are their keys' first columns, which the run checks
    (:func:`_run_decode_row`), so no row passes on the Triton kernel."""
    rows = []
    for i, w in enumerate(GPU_WINDOWS if gpu else GPU_WINDOWS[:3]):
        dtype = (torch.bfloat16, torch.float16)[i % 2]
        for j, (feature, splits) in enumerate(LATENT_HOPPER_FEATURES):
            # (heads, pages and cache dtype each on their own cycle: every pairing occurs)
            hq, hkv = LATENT_HOPPER_HEADS[(i + j) % len(LATENT_HOPPER_HEADS)]
            seq_lens = [w - 1 or 1, w, w + 1, w + 35, 1, 3 * w + 5]
            case = DecodeCase(seq_lens, num_q_heads=hq, num_kv_heads=hkv, head_dim=576,
                              head_dim_v=512, dtype=dtype,
                              page_size=(16, 1, 64)[(i // 2 + j) % 3],
                              window_left=None if feature == "full-attention" else w - 1,
                              sparse_keys=67 if "sparse" in feature else 0,
                              seed=5000 + 100 * i + j)
            kwargs = _decode_kwargs(feature, case, splits, hopper=True, latent=True)
            kv = ((None,) + FP8_KINDS)[i % 3]
            label = ""
            if kv is not None:
                kwargs["kv"] = kv
                label = f" {str(kv[0])[6:]} {'per-head' if kv[1] else 'per-tensor'}"
            rows.append((f"W{w} {feature} d576/512 {str(dtype)[6:]}{label} h{hq}/{hkv} "
                         f"ps{case.page_size} splits {splits}", case, kwargs, None))
    return rows


# fp8 rows: every third configuration of a family over an fp8 cache, e4m3fn with one scale
# and e5m2 with one a KV head in turn, on each row's default path (the Triton kernels, and
# for decode rows of long windows on sm_90 the Hopper decode path).
FP8_KINDS = ((torch.float8_e4m3fn, False), (torch.float8_e5m2, True))


def _fp8_rows(matrix, config=None, period=None, keep=None):
    """Every third row of ``matrix`` over an fp8 cache, the formats and scale kinds in turn;
    ``config``: a dict tuning the Hopper path, in the place of the rows' own tiling;
    ``period``: the matrix's rows come in runs of this many features a window (a multiple
    of 3), and the third taken moves by one each run, so every feature is covered;
    ``keep``: which of the matrix's rows ``(name, case, kwargs, tiling)`` may be taken."""
    def rows(gpu=True):
        out = []
        every = [row for row in matrix(gpu) if keep is None or keep(row)]
        if period is None:
            picked = every[::3]
        else:
            picked = [row for n, row in enumerate(every) if (n + n // period) % 3 == 0]
        for n, (name, case, kwargs, tiling) in enumerate(picked):
            fp8, per_head = FP8_KINDS[n % 2]
            label = f"{str(fp8)[6:]} {'per-head' if per_head else 'per-tensor'}"
            out.append((f"{name} {label}", case, dict(kwargs, kv=(fp8, per_head)),
                        tiling if config is None else config))
        return out
    return rows


def _fp8_cache(tensors, cache_at, case, kv, kwargs, device):
    """``tensors`` with the cache (at positions ``cache_at``) quantized to ``kv = (dtype,
    per_head)`` under random scales (NaN rows stay NaN), and the scales in ``kwargs``; also
    a sparse pool."""
    fp8, per_head = kv
    g = torch.Generator().manual_seed(case.seed + 3)
    n = case.num_kv_heads if per_head else 1
    k_scale = (torch.rand(n, generator=g) * 0.05 + 0.01).to(device)
    v_scale = (torch.rand(n, generator=g) * 0.05 + 0.01).to(device)
    tensors = list(tensors)
    for i, scale in zip(cache_at, (k_scale, v_scale)):
        tensors[i] = reference.quantize(tensors[i], scale, fp8)
    if "sparse" in kwargs:
        k_pool, v_pool, idx = kwargs["sparse"]
        kwargs["sparse"] = (reference.quantize(k_pool, k_scale, fp8),
                            reference.quantize(v_pool, v_scale, fp8), idx)
    kwargs.update(k_scale=k_scale, v_scale=v_scale)
    return tuple(tensors)


def _on_device(kwargs, device):
    """The row's keyword arguments with its tensors (sinks, masks) moved to ``device``."""
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}


def _run_extend_row(row, device, deterministic):
    _name, case, kwargs, tiling = row
    tensors = build_extend(case, device)
    kwargs = _on_device(kwargs, device)
    kv = kwargs.pop("kv", None)
    if kv is not None:
        tensors = _fp8_cache(tensors, (3, 4), case, kv, kwargs, device)
    # The full-attention row keeps the window off in the kernel too.
    if tiling is None or isinstance(tiling, dict):
        # The Hopper path: its own fixed tiles (a dict: its config tuned).
        kwargs = dict(kwargs, hopper=True, config=tiling)
    else:
        kwargs = dict(kwargs, block_m=tiling[0], block_n=tiling[1], pack_gqa=tiling[2],
                      hopper=False)
    results = {b: run_extend(*tensors, window_left=case.window_left, bounds=b,
                             deterministic=deterministic, **options_for_bounds(kwargs, b))
               for b in ops_extend.BOUNDS}
    kwargs = {k: v for k, v in kwargs.items()
              if k not in ("block_m", "block_n", "pack_gqa", "hopper", "config")}
    return results, reference.extend_attention(*tensors, window_left=case.window_left, **kwargs)


def options_for_bounds(kwargs, bounds):
    """``kwargs`` for a run under ``bounds``: a config's ``prefix_rows`` (the window's prefix
    widened before the kernel, the tight bounds only) left to the plan's rule elsewhere,
    which widens in the kernel there."""
    config = kwargs.get("config")
    if bounds == "tight" or not isinstance(config, dict) or "prefix_rows" not in config:
        return kwargs
    return dict(kwargs, config={k: v for k, v in config.items() if k != "prefix_rows"})


def _latent_rows(gpu=True):
    """The decode matrix's rows whose value block is the key tile's main part, over a
    latent cache (the values the keys' first columns; the sparse pool likewise): in turn
    the queries' dtype, e4m3fn with one scale and e5m2 with one a KV head."""
    rows = [row for row in decode_matrix(gpu)
            if ops_decode.latent_widths(row[1].head_dim, row[1].head_dim_v)]
    out = []
    for n, (name, case, kwargs, block_n) in enumerate(rows):
        kv = ((None,) + FP8_KINDS)[n % 3]
        label = "" if kv is None else f" {str(kv[0])[6:]} {'per-head' if kv[1] else 'per-tensor'}"
        extra = {"latent": True} if kv is None else {"latent": True, "kv": kv}
        out.append((f"{name} latent{label}", case, dict(kwargs, **extra), block_n))
    return out


def _run_decode_row(row, device):
    _name, case, kwargs, block_n = row
    tensors = build_decode(case, device)
    kwargs = _on_device(kwargs, device)
    kv = kwargs.pop("kv", None)
    latent = kwargs.pop("latent", False)
    if case.sparse_keys:
        kwargs["sparse"] = build_sparse(case, device)
    if kv is not None:
        tensors = _fp8_cache(tensors, (1, 2), case, kv, kwargs, device)
    if latent:
        # The values are the keys' first columns (under the keys' scale over fp8).
        dv = case.head_dim_v
        tensors = tensors[:2] + (tensors[1][..., :dv],) + tensors[3:]
        if "sparse" in kwargs:
            k_pool, _, idx = kwargs["sparse"]
            kwargs["sparse"] = (k_pool, k_pool[..., :dv], idx)
        if kv is not None:
            kwargs["v_scale"] = kwargs["k_scale"]
        # (what decides, at run time, that a plan's latent or one-load kernel takes them)
        assert ops_decode.values_in_keys(case, tensors[1], tensors[2], kwargs.get("sparse"))
    results = {b: run_decode(*tensors, window_left=case.window_left, bounds=b,
                                              block_n=block_n, **kwargs)
               for b in ops_decode.BOUNDS}
    kwargs.pop("hopper", None)
    return results, reference.decode_attention(*tensors, window_left=case.window_left, **kwargs)


# The second key source's rows: (feature, compression rate, indices a row, window keys):
# DeepSeek-V4's heavily compressed entries (every closed one), its compressed sparse ones
# (an indexer's picks), V3.2's selected tokens alone (rate 1, no window), a rate past the
# tiles.
SECOND_FEATURES = (("hca", 4, 0, True), ("csa", 4, 6, True), ("dsa", 1, 5, False),
                   ("hca+sinks", 16, 0, True), ("csa+softcap+sinks", 2, 7, True))


def _second_rows(extend):
    """``(name, case, kwargs, block_n)`` a row of the second-source families: decode
    (``extend`` False) over the decode matrix's windows, groups and head counts, and
    extend over ragged chunks after prefixes below, at and past the window, each feature of
    :data:`SECOND_FEATURES` in turn; decode at 1, 2 and 3 splits."""
    def rows(gpu=True):
        windows, groups = (GPU_WINDOWS, DECODE_GPU_GROUPS) if gpu else (CPU_WINDOWS,
                                                                        DECODE_CPU_GROUPS)
        heads = ((8, 2), (16, 1), (8, 8)) if gpu else ((4, 2), (4, 1), (2, 2))
        out = []
        for i, w in enumerate(windows):
            head_dim, head_dim_v, dtype, block_n = groups[i % len(groups)]
            for j, (feature, rate, num_indices, window) in enumerate(SECOND_FEATURES):
                hq, hkv = (64, 1) if head_dim > 256 else heads[(i + j) % len(heads)]
                seed = 5000 + 100 * i + j
                common = dict(num_q_heads=hq, num_kv_heads=hkv, head_dim=head_dim,
                              head_dim_v=head_dim_v, dtype=dtype, page_size=(16, 1, 4)[j % 3],
                              window_left=w - 1, seed=seed)
                if extend:
                    case = ExtendCase(prefix_lens=[max(w - 1, 0), w + block_n + 1, 3],
                                      extend_lens=[5, 2 * block_n + 1, 1], **common)
                else:
                    case = DecodeCase([w - 1 or 1, w, w + block_n + 3, 1, 3 * w + 5], **common)
                kwargs = _decode_kwargs(feature, case, 1 if extend else 1 + (i + j) % 3,
                                        second=(rate, num_indices, window))
                name = (f"W{w} {feature} d{head_dim}/{head_dim_v} {str(dtype)[6:]} BN{block_n} "
                        f"h{hq}/{hkv} ps{case.page_size}"
                        + ("" if extend else f" splits {kwargs['num_splits']}"))
                out.append((name, case, kwargs, block_n))
        return out
    return rows


def _run_second_row(row, device, extend):
    """A second-source row under the three bounds variants (its plan), and the reference."""
    _name, case, kwargs, block_n = row
    kwargs = _on_device(kwargs, device)
    rate, num_indices, window = kwargs.pop("second")
    splits = kwargs.pop("num_splits")
    if extend:
        q, k, v, k_cache, v_cache, table, cu, prefix = build_extend(case, device)
        starts = cu.tolist()
        totals = [p + n for p, n in zip(case.prefix_lens, case.extend_lens)]
        rows = [(b, p + i) for b, p in enumerate(case.prefix_lens)
                for i in range(starts[b + 1] - starts[b])]
        lengths = dict(cu_seqlens=starts, prefix_lens=case.prefix_lens)
    else:
        q, k_cache, v_cache, table, seq_lens = build_decode(case, device)
        k = v = None
        totals = case.seq_lens
        rows = [(b, n - 1) for b, n in enumerate(totals)]
        lengths = dict(seq_lens=totals)
    second = build_second(len(totals), rows, rate, num_indices,
                          entries=[n // rate for n in totals], page_size=3,
                          num_kv_heads=case.num_kv_heads, head_dim=case.head_dim,
                          dtype=case.dtype, seed=case.seed, window=window,
                          head_dim_v=case.head_dim_v, device=device)
    results = {}
    for bounds in ops_decode.BOUNDS:
        plan = swattn_plan.plan_second_keys(
            **lengths, num_q_heads=case.num_q_heads, num_kv_heads=case.num_kv_heads,
            head_dim=case.head_dim, head_dim_v=case.head_dim_v, page_size=case.page_size,
            rate=rate, num_indices=num_indices, window=window, window_left=case.window_left,
            softcap=kwargs.get("softcap", 0.0), num_splits=splits, return_lse=True,
            dtype=case.dtype, device=device, bounds=bounds, config={"block_n": block_n})
        results[bounds] = plan.run(q, k_cache, v_cache, table, second, k=k, v=v,
                                   sinks=kwargs.get("sinks"))
    options = dict(window_left=case.window_left, sinks=kwargs.get("sinks"),
                   softcap=kwargs.get("softcap", 0.0), second=second, return_lse=True)
    if extend:
        want = reference.extend_attention(q, k, v, k_cache, v_cache, table, cu, prefix,
                                          **options)
    else:
        want = reference.decode_attention(q, k_cache, v_cache, table, seq_lens, **options)
    return results, want


def _chunk_rows(matrix):
    """``matrix``'s rows under chunked attention: each with a chunk around its window and
    its tiles in turn (half the window, the window, past it, off the tile grid), so query
    blocks straddle chunk boundaries and chunks start mid-tile."""

    def rows(gpu=True):
        out = []
        for n, (name, case, kwargs, tiling) in enumerate(matrix(gpu)):
            window = (case.window_left or 0) + 1
            chunk = (max(window // 2, 1), window, 2 * window + 3, 17)[n % 4]
            out.append((f"{name} chunk{chunk}", case, dict(kwargs, attention_chunk=chunk),
                        tiling))
        return out
    return rows


# Features a tree verify takes (its mask replaces causality and the random mask).
TREE_FEATURES = ("plain", "sinks", "softcap", "keys=prefix+lse", "keys=new+lse")


def _tree_rows(matrix):
    """``matrix``'s rows of TREE_FEATURES as speculative tree verifies: the new tokens of
    each sequence a random draft tree (verify.cases.random_tree: siblings share a position,
    its mask), windows shorter than the tree's span included; every other row chunked too."""

    def rows(gpu=True):
        out = []
        for n, (name, case, kwargs, tiling) in enumerate(matrix(gpu)):
            if name.split()[1] not in TREE_FEATURES:
                continue
            positions, mask, indptr = random_tree(case.prefix_lens, case.extend_lens,
                                                  case.seed)
            extra = dict(positions=positions, mask=mask, mask_indptr=indptr)
            if n % 2:
                extra["attention_chunk"] = max((case.window_left or 0) + 1, 2)
            out.append((f"{name} tree", case, dict(kwargs, **extra), tiling))
        return out
    return rows


# The Hopper matrix's features whose rows read a prefix under a window.
PREFIX_ROWS_FEATURES = tuple(f for f in FEATURES
                             if f not in ("mask+window", "keys=new+lse", "full-attention-bounds"))

FAMILIES = {
    "extend": (extend_matrix, lambda row, device: _run_extend_row(row, device, False)),
    "unified": (unified_matrix, lambda row, device: _run_extend_row(row, device, True)),
    "decode": (decode_matrix, _run_decode_row),
    "extend-chunk": (_chunk_rows(extend_matrix),
                     lambda row, device: _run_extend_row(row, device, False)),
    "unified-chunk": (_chunk_rows(unified_matrix),
                      lambda row, device: _run_extend_row(row, device, True)),
    "decode-chunk": (_chunk_rows(decode_matrix), _run_decode_row),
    "decode-second": (_second_rows(False), lambda row, device: _run_second_row(row, device, False)),
    "extend-second": (_second_rows(True), lambda row, device: _run_second_row(row, device, True)),
    "extend-tree": (_tree_rows(extend_matrix),
                    lambda row, device: _run_extend_row(row, device, False)),
    "unified-tree": (_tree_rows(extend_matrix),
                     lambda row, device: _run_extend_row(row, device, True)),
    "hopper": (hopper_matrix, lambda row, device: _run_extend_row(row, device, False)),
    "decode-hopper": (hopper_decode_matrix, _run_decode_row),
    "extend-fp8": (_fp8_rows(extend_matrix),
                   lambda row, device: _run_extend_row(row, device, False)),
    "unified-fp8": (_fp8_rows(unified_matrix),
                    lambda row, device: _run_extend_row(row, device, True)),
    "hopper-fp8": (_fp8_rows(hopper_matrix),
                   lambda row, device: _run_extend_row(row, device, False)),
    "decode-fp8": (_fp8_rows(decode_matrix), _run_decode_row),
    "decode-latent": (_latent_rows, _run_decode_row),
    "decode-hopper-latent": (latent_hopper_matrix, _run_decode_row),
    "decode-hopper-fp8": (_fp8_rows(hopper_decode_matrix, period=len(HOPPER_DECODE_FEATURES)),
                          _run_decode_row),
    "hopper-fp8-products": (_fp8_rows(hopper_matrix, {"fp8_products": True}),
                            lambda row, device: _run_extend_row(row, device, False)),
    # tight with the window's prefix widened before the kernel, bit-identical to skip and
    # none widening it in the kernel: the window's rows, those that read a prefix.
    "hopper-fp8-prefix-rows": (
        _fp8_rows(hopper_matrix, {"prefix_rows": True}, period=len(PREFIX_ROWS_FEATURES),
                  keep=lambda row: row[0].split()[1] in PREFIX_ROWS_FEATURES),
        lambda row, device: _run_extend_row(row, device, False)),
}
# Against the reference: 1e-2, but with fp8 products (the query rows and the weights
# quantized to e4m3: a few 1e-2, benchmarks/results/2026-12-02-h200-fp8-extend-products/).
TOLERANCES = {"hopper-fp8-products": 8e-2}
TITLES = {"extend": "two-stage extend", "hopper": "two-stage extend, Hopper path (Gluon)",
          "unified": "deterministic single-pass extend",
          "decode": "decode (split-KV, sparse)",
          "decode-hopper": "decode, Hopper path (Gluon)",
          "extend-fp8": "two-stage extend over an fp8 cache",
          "unified-fp8": "deterministic single-pass extend over an fp8 cache",
          "hopper-fp8": "two-stage extend over an fp8 cache, Hopper path (Gluon)",
          "decode-fp8": "decode over an fp8 cache",
          "decode-latent": "decode over a latent cache (values the keys' first columns), "
                           "bf16/fp16 and fp8",
          "decode-hopper-fp8": "decode over an fp8 cache, Hopper path (Gluon)",
          "decode-hopper-latent": "decode over a latent cache, Hopper latent path (Gluon), "
                                  "bf16/fp16 and fp8",
          "hopper-fp8-products": "two-stage extend over an fp8 cache, Hopper path with fp8 "
                                 "products (opt-in)",
          "hopper-fp8-prefix-rows": "two-stage extend over an fp8 cache, Hopper path, tight "
                                    "with the window's prefix widened before the kernel",
          "extend-chunk": "two-stage extend under chunked local attention",
          "unified-chunk": "deterministic single-pass extend under chunked local attention",
          "decode-chunk": "decode under chunked local attention",
          "decode-second": "decode with a second key source (DeepSeek-V3.2/V4)",
          "extend-second": "extend with a second key source, a row a new token",
          "extend-tree": "two-stage extend verifying speculative trees (given positions)",
          "unified-tree": "deterministic single-pass extend verifying speculative trees"}


def run(family, device, gpu=None, limit=None, progress=None, shard=(0, 1)):
    """Run one family's matrix (``FAMILIES``) on ``device``; one Row per configuration.
    ``shard=(i, n)`` runs every n-th configuration from the i-th (parallel compiles across
    processes)."""
    gpu = (torch.device(device).type == "cuda") if gpu is None else gpu
    matrix, run_row = FAMILIES[family]
    out = []
    for row in matrix(gpu)[:limit][shard[0]::shard[1]]:
        t0 = time.perf_counter()
        results, want = run_row(row, device)
        # Both sides against the reference: out and, where returned, lse.
        errs = {b: max(_ref_err(x, y) for x, y in zip(_tuple(results[b]), _tuple(want)))
                for b in ("tight", "skip")}
        out.append(Row(row[0], 1, _max_abs(results["tight"], results["skip"]),
                       _max_abs(results["tight"], results["none"]), errs["tight"], errs["skip"],
                       time.perf_counter() - t0, TOLERANCES.get(family, 1e-2)))
        if progress:
            progress(out[-1])
    return out


def _tuple(x):
    return x if isinstance(x, tuple) else (x,)


def _ref_err(x, want):
    """rel_err over the finite entries; inf where the infinities (an lse of -inf: no
    visible key) fall elsewhere than the reference's."""
    x, want = x.cpu(), want.cpu()
    if not torch.equal(torch.isinf(x), torch.isinf(want)):
        return float("inf")
    fin = torch.isfinite(want)
    return rel_err(x[fin], want[fin]) if fin.any() else 0.0


def format_rows(rows, title):
    lines = [f"### {title}", "",
             "| configuration | max_abs tight-skip | max_abs tight-none | rel err tight "
             "| rel err skip | ok |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.name} | {r.max_abs_tight_skip:.1e} | {r.max_abs_tight_none:.1e} | "
                     f"{r.err_tight:.1e} | {r.err_skip:.1e} | {'yes' if r.ok else 'NO'} |")
    bad = sum(not r.ok for r in rows)
    worst = max((max(r.err_tight, r.err_skip) for r in rows), default=0.0)
    tol = max((r.tol for r in rows), default=1e-2)
    lines += ["", f"{len(rows)} configurations, {len(rows) - bad} bit-identical and within {tol:g} "
              f"of the reference, {bad} failing; worst reference error {worst:.1e}"]
    return "\n".join(lines)
