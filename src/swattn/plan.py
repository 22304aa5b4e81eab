"""Plan once per batch, run per layer: the engine path.

A plan takes a batch's metadata on the host (lists or CPU tensors; a GPU tensor is read
back once, here), checks it, chooses the kernel and its config (the one place in swattn
that decides which kernel runs), keeps the lengths in device buffers of its own and
allocates its scratch. ``plan.run`` then serves every layer that shares the batch, the
window and the dtypes: it checks only what a tensor carries on the host, never reads
device memory, never waits for the GPU, allocates nothing when ``out`` (and ``lse``) are
given, and can be captured in a CUDA graph. ``plan.replan`` writes the next batch's
lengths into the same buffers in place (the same batch size, or a smaller one padded to
it), so a captured run replays with them.

A plan's scratch (the decode split's partial states) and buffers are its own: keep the plan
alive while a graph captured from its ``run`` replays, and run one plan on one stream at a
time.
"""

import torch

from .ops import config as _config
from .ops import decode as _decode
from .ops import extend as _extend
from .ops._common import kernel_scale
from .ops._validate import (FLOAT_DTYPES, KEYS, check_device, check_extend_lengths, check_int,
                            check_lengths, check_num_splits, check_pages_read, check_scalars,
                            check_window, expect, host_ints)
from .ops.merge import MergeLaunch

PATHS = ("triton", "hopper", "single-pass")


def _device(device):
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    check_device("device", device)
    return device


def _check_common(num_q_heads, num_kv_heads, head_dim, head_dim_v, page_size, softcap, scale,
                  dtype, kv_dtype, hopper, bounds):
    for name, value in (("num_q_heads", num_q_heads), ("num_kv_heads", num_kv_heads),
                        ("head_dim", head_dim), ("head_dim_v", head_dim_v), ("page_size", page_size)):
        check_int(name, value, 1)
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads ({num_q_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    check_scalars(softcap, scale)
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be one of {FLOAT_DTYPES}, got {dtype}")
    if kv_dtype is not None and kv_dtype != dtype:
        raise ValueError(f"kv_dtype {kv_dtype}: a cache dtype other than the query's ({dtype}) is "
                         "not supported yet")
    if hopper not in (None, True, False):
        raise TypeError(f"hopper must be None or a bool, got {hopper!r}")
    if bounds not in _config.BOUNDS:
        raise ValueError(f"bounds must be one of {_config.BOUNDS}, got {bounds!r}")


def _no_fp8(k_scale, v_scale):
    if k_scale is not None or v_scale is not None:
        raise ValueError("k_scale/v_scale apply to fp8 caches, which are not supported yet")


def _to_device(values, device):
    """An int32 device tensor of host ints: copied without waiting for the GPU."""
    host = torch.tensor(values, dtype=torch.int32)
    return host.to(device, non_blocking=True) if device.type == "cuda" else host


# --------------------------------------------------------------------------------------
# Extend.
# --------------------------------------------------------------------------------------

class ExtendPlan:
    """One batch's extend attention, planned: made by :func:`plan_extend`.

    Attributes: ``path`` (``"hopper"``: the Gluon kernel for sm_90; ``"triton"``: the
    portable two-stage kernel; ``"single-pass"``: the deterministic kernel), ``config``
    (the Triton kernel's tiles; None on the Hopper path), ``num_seqs`` and ``max_tokens``
    (the batch capacity ``replan`` keeps), ``num_tokens`` (the current batch's), and the
    device buffers ``cu_seqlens``, ``prefix_lens`` (and ``mask_indptr``) the kernels read.
    """

    def __init__(self, spec, path, device, dtype, cu_seqlens, prefix_lens, mask_indptr,
                 host=None, max_tokens=None, launches=None):
        self.spec = spec
        self.path = path
        self.config = spec.config
        self.device = device
        self.dtype = dtype
        self.cu_seqlens = cu_seqlens
        self.prefix_lens = prefix_lens
        self.mask_indptr = mask_indptr
        self.num_seqs = spec.num_seqs
        self.max_tokens = max_tokens
        self._index = device.index if device.type == "cuda" else -1
        # The bound launches: the plan's own, or shared by the one-shot calls of one choice.
        self._launches = {} if launches is None else launches
        s = spec
        self._tails = ((s.num_q_heads, s.head_dim), (s.num_kv_heads, s.head_dim),
                       (s.num_kv_heads, s.head_dim_v), (s.page_size, s.num_kv_heads, s.head_dim),
                       (s.page_size, s.num_kv_heads, s.head_dim_v), (s.num_q_heads, s.head_dim_v))
        self._sinks_shape = (s.num_q_heads,)
        self._hopper = None
        if path == "hopper":
            from .ops import extend_hopper
            self._hopper = extend_hopper
        self._host(host)

    def _host(self, host):
        """Keep what the run checks need of the host metadata (None: not known)."""
        if host is None:
            self.num_tokens, self._pages_needed, self._mask_entries = None, 0, 0
            return
        cu, prefix, indptr = host
        s = self.spec
        self.num_tokens = cu[-1]
        reads_prefix = s.keys != "new"
        self._pages_needed = max((-(-p // s.page_size) for p, a, b in zip(prefix, cu, cu[1:])
                                  if b > a and reads_prefix), default=0)
        self._mask_entries = indptr[-1] if indptr is not None else 0

    def run(self, q, k, v, k_cache, v_cache, block_table, *, sinks=None, mask=None, k_scale=None,
            v_scale=None, out=None, lse=None):
        """The attention of the planned batch for one layer; returns ``out``, or ``(out,
        lse)`` when the plan returns lse. Arguments as :func:`swattn.extend_attention`'s;
        ``q``/``k``/``v`` may have more rows than the batch's tokens (a batch padded to a
        captured size: rows past ``cu_seqlens[-1]`` are left alone). No host sync; no
        allocation when ``out`` (and ``lse``) are given."""
        if not self._fits(q, k, v, k_cache, v_cache, block_table, sinks, mask, out, lse) \
                or k_scale is not None or v_scale is not None:
            self._check(q, k, v, k_cache, v_cache, block_table, sinks, mask, k_scale, v_scale,
                        out, lse)
        s = self.spec
        rows = q.shape[0]
        if out is None:
            out = torch.empty(rows, s.num_q_heads, s.head_dim_v, dtype=self.dtype, device=q.device)
        if s.return_lse and lse is None:
            lse = torch.empty(rows, s.num_q_heads, dtype=torch.float32, device=q.device)
        if self.path == "hopper":
            # A layout the copy engine cannot take raises at the launch (plan with
            # hopper=False for such tensors).
            self._launch(sinks is not None, False, False)(
                q, block_table, self.cu_seqlens, self.prefix_lens, sinks, out, lse,
                self._hopper.lazy_descriptors(q, k, v, k_cache, v_cache), k_cache)
        else:
            descs = _extend.descriptors(s.config, k, v, k_cache, v_cache, s.masked)
            self._launch(sinks is not None, descs[0] is not None, descs[2] is not None)(
                q, k, v, k_cache, v_cache, block_table, self.cu_seqlens, self.prefix_lens, sinks,
                mask, self.mask_indptr, out, lse, descs)
        return (out, lse) if s.return_lse else out

    def _fits(self, q, k, v, k_cache, v_cache, block_table, sinks, mask, out, lse):
        """Whether the run's tensors are what the plan takes: one expression over what each
        tensor carries on the host (a failing run gets :meth:`_check`'s error)."""
        dt, dev, (qt, kt, vt, kct, vct, ot) = self.dtype, self._index, self._tails
        try:
            qs, ks, vs, kcs, vcs, bts = (q.shape, k.shape, v.shape, k_cache.shape, v_cache.shape,
                                         block_table.shape)
            rows = qs[0]
            ok = (q.dtype is dt and k.dtype is dt and v.dtype is dt and k_cache.dtype is dt
                  and v_cache.dtype is dt and block_table.dtype is torch.int32
                  and qs[1:] == qt and ks[0] == rows and ks[1:] == kt and vs[0] == rows
                  and vs[1:] == vt and kcs[1:] == kct and vcs[0] == kcs[0] and vcs[1:] == vct
                  and len(bts) == 2 and bts[0] >= self.num_seqs and bts[1] >= self._pages_needed
                  and (self.num_tokens is None or rows >= self.num_tokens)
                  and q.get_device() == dev and k.get_device() == dev and v.get_device() == dev
                  and k_cache.get_device() == dev and v_cache.get_device() == dev
                  and block_table.get_device() == dev
                  and q.stride(2) == 1 and k.stride(2) == 1 and v.stride(2) == 1
                  and k_cache.stride(3) == 1 and v_cache.stride(3) == 1
                  and block_table.stride(1) == 1)
            if ok and sinks is not None:
                ok = (sinks.dtype is torch.float32 and sinks.shape == self._sinks_shape
                      and sinks.get_device() == dev)
            if ok and out is not None:
                ok = (out.dtype is dt and out.shape[0] == rows and out.shape[1:] == ot
                      and out.get_device() == dev and out.stride(2) == 1)
            if ok and self.spec.return_lse and lse is not None:
                ok = (lse.dtype is torch.float32 and lse.shape == (rows, self.spec.num_q_heads)
                      and lse.get_device() == dev)
            if ok and (mask is not None) != self.spec.masked:
                ok = False
            if ok and mask is not None:
                ok = (mask.dtype is torch.bool and mask.dim() == 1
                      and mask.shape[0] >= self._mask_entries and mask.get_device() == dev)
            return ok
        except (AttributeError, IndexError, TypeError):
            return False

    def _check(self, q, k, v, k_cache, v_cache, block_table, sinks, mask, k_scale, v_scale, out,
               lse):
        """The run's arguments one by one, raising the error that names what is wrong."""
        s, dev = self.spec, self._index
        dtype = self.dtype
        expect("q", q, dtype, dev, (s.num_q_heads, s.head_dim), 1)
        rows = q.shape[0]
        if self.num_tokens is not None and rows < self.num_tokens:
            raise ValueError(f"q has {rows} rows, the planned batch has {self.num_tokens} tokens")
        expect("k", k, dtype, dev, (rows, s.num_kv_heads, s.head_dim))
        expect("v", v, dtype, dev, (rows, s.num_kv_heads, s.head_dim_v))
        expect("k_cache", k_cache, dtype, dev, (s.page_size, s.num_kv_heads, s.head_dim), 1)
        expect("v_cache", v_cache, dtype, dev, (k_cache.shape[0], s.page_size, s.num_kv_heads,
                                                s.head_dim_v))
        expect("block_table", block_table, torch.int32, dev, (), 2)
        if block_table.shape[0] < s.num_seqs or block_table.shape[1] < self._pages_needed:
            raise ValueError(f"block_table must be at least [{s.num_seqs}, {self._pages_needed}] "
                             f"(sequences, pages the planned prefixes need), got "
                             f"{tuple(block_table.shape)}")
        if sinks is not None:
            expect("sinks", sinks, torch.float32, dev, (s.num_q_heads,))
        if s.masked:
            if mask is None:
                raise ValueError("mask is required: the plan was made with mask_indptr")
            expect("mask", mask, torch.bool, dev, (), 1)
            if mask.shape[0] < self._mask_entries:
                raise ValueError(f"mask has {mask.shape[0]} entries, mask_indptr needs {self._mask_entries}")
        elif mask is not None:
            raise ValueError("mask given, but the plan was made without mask_indptr")
        _no_fp8(k_scale, v_scale)
        if out is not None:
            expect("out", out, dtype, dev, (rows, s.num_q_heads, s.head_dim_v))
        if s.return_lse and lse is not None:
            expect("lse", lse, torch.float32, dev, (rows, s.num_q_heads))

    def tiling(self):
        """The tiles the plan's kernel walks, for the tile model (swattn.tiles): query
        rows and keys a tile, tokens a block (fewer than its rows where the query heads of
        a KV group share a block) and the heads the blocks are repeated over."""
        s = self.spec
        if self.path == "hopper":
            from .ops import extend_hopper
            return {"block_m": extend_hopper.BLOCK_M, "block_n": extend_hopper.BLOCK_N,
                    "tokens_per_block": extend_hopper.BLOCK_M, "heads": s.num_q_heads}
        cfg = s.config
        if _config.packs_gqa(cfg, s.group):
            return {"block_m": cfg.block_m, "block_n": cfg.block_n,
                    "tokens_per_block": cfg.block_m // s.group, "heads": s.num_kv_heads}
        return {"block_m": cfg.block_m, "block_n": cfg.block_n, "tokens_per_block": cfg.block_m,
                "heads": s.num_q_heads}

    def _launch(self, has_sinks, tma_new, tma_cache):
        """The kernel's launch for a run with or without sinks and the TMA loads (bound
        once each)."""
        key = (has_sinks, tma_new, tma_cache)
        launch = self._launches.get(key)
        if launch is None:
            spec = _replace(self.spec, has_sinks=has_sinks, tma_new=tma_new, tma_cache=tma_cache)
            bind = self._hopper.HopperExtendLaunch if self.path == "hopper" else _extend.ExtendLaunch
            dtypes = (self.dtype, None if self.mask_indptr is None else self.mask_indptr.dtype)
            launch = self._launches[key] = bind(spec, dtypes)
        return launch

    def replan(self, cu_seqlens, prefix_lens, mask_indptr=None):
        """Write the next batch's lengths into this plan's buffers, in place: at most
        ``num_seqs`` sequences (the rest padded with empty ones) and ``max_tokens`` tokens;
        the rest of the plan (window, kernel, config) is kept. A CUDA graph captured from
        :meth:`run` then replays with the new lengths."""
        if self.max_tokens is None:
            raise ValueError("this plan was made from device tensors it did not read (a "
                             "one-shot call): make one with plan_extend to replan")
        cu = host_ints("cu_seqlens", cu_seqlens)
        prefix = host_ints("prefix_lens", prefix_lens)
        indptr = host_ints("mask_indptr", mask_indptr) if mask_indptr is not None else None
        if self.spec.masked != (indptr is not None):
            raise ValueError("mask_indptr must be given exactly when the plan was made with one")
        check_extend_lengths(cu, prefix, indptr)
        if len(prefix) > self.num_seqs:
            raise ValueError(f"replan with {len(prefix)} sequences: the plan holds {self.num_seqs}")
        if cu[-1] > self.max_tokens:
            raise ValueError(f"replan with {cu[-1]} tokens: the plan holds {self.max_tokens}")
        pad = self.num_seqs - len(prefix)
        cu, prefix = cu + [cu[-1]] * pad, prefix + [0] * pad
        self.cu_seqlens.copy_(torch.tensor(cu, dtype=torch.int32), non_blocking=True)
        self.prefix_lens.copy_(torch.tensor(prefix, dtype=torch.int32), non_blocking=True)
        if indptr is not None:
            indptr = indptr + [indptr[-1]] * pad
            self.mask_indptr.copy_(torch.tensor(indptr, dtype=self.mask_indptr.dtype),
                                   non_blocking=True)
        self._host((cu, prefix, indptr))


def _replace(spec, **changes):
    from dataclasses import replace
    return replace(spec, **changes)


def _extend_path(device, dtype, head_dim, head_dim_v, page_size, group, window_left, masked,
                 deterministic, hopper, config):
    """``(path, config)`` of an extend plan: the single-pass kernel when deterministic, else
    the Hopper path where the config asks for it (or ``hopper=True``) and the plan can take
    it, else the Triton kernel with the config's tiles. ``config``: a Config, or a dict of
    fields to change in the chosen one (tests walk every tiling)."""
    cfg = _config.extend_config(head_dim, head_dim_v, group, window_left, dtype, device, page_size)
    tiling_asked = config is not None
    if isinstance(config, dict):
        from dataclasses import replace
        cfg = replace(cfg, **config)
    elif config is not None:
        cfg = config
    if deterministic:
        if hopper:
            raise ValueError("hopper=True: the Hopper path cannot take this plan: "
                             "deterministic=True runs the single-pass kernel")
        return "single-pass", cfg
    want = (cfg.hopper and not tiling_asked) if hopper is None else hopper
    if want:
        from .ops import extend_hopper
        reason = extend_hopper.unsupported(device, dtype, head_dim, head_dim_v, page_size, masked,
                                           deterministic)
        if reason is not None and hopper:
            raise ValueError(f"hopper=True: the Hopper path cannot take this plan: {reason}")
        if reason is None:
            return "hopper", None
    return "triton", cfg


def _extend_plan(cu, prefix, indptr, cu_t, prefix_t, indptr_t, num_seqs, *, num_q_heads,
                 num_kv_heads, head_dim, head_dim_v, page_size, window_left, window_right, causal,
                 softcap, scale, keys, return_lse, deterministic, kv_dtype, dtype, device, hopper,
                 bounds, config, max_tokens):
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    _check_common(num_q_heads, num_kv_heads, head_dim, head_dim_v, page_size, softcap, scale,
                  dtype, kv_dtype, hopper, bounds)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    check_window(window_left, window_right, causal)
    if keys not in KEYS:
        raise ValueError(f"keys must be one of {KEYS}, got {keys!r}")
    for name, flag in (("return_lse", return_lse), ("deterministic", deterministic)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    masked = indptr_t is not None
    path, cfg = _extend_path(device, dtype, head_dim, head_dim_v, page_size,
                             num_q_heads // num_kv_heads, window_left, masked, deterministic,
                             hopper, config)
    spec = _extend.ExtendSpec(
        num_seqs=num_seqs, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
        head_dim_v=head_dim_v, page_size=page_size, config=cfg, window_left=window_left,
        window_right=window_right, causal=causal, softcap=float(softcap),
        qk_scale=kernel_scale(head_dim ** -0.5 if scale is None else float(scale), softcap),
        keys=keys, return_lse=return_lse, masked=masked, deterministic=deterministic,
        bounds=bounds)
    host = (cu, prefix, indptr) if cu is not None else None
    return ExtendPlan(spec, path, device, dtype, cu_t, prefix_t, indptr_t, host, max_tokens)


def plan_extend(cu_seqlens, prefix_lens, *, num_q_heads, num_kv_heads, head_dim, head_dim_v=None,
                page_size, window_left=None, window_right=None, causal=True, softcap=0.0,
                scale=None, mask_indptr=None, keys="all", return_lse=False, deterministic=False,
                kv_dtype=None, block_table=None, num_pages=None, max_tokens=None,
                dtype=torch.bfloat16, device="cuda", hopper=None, bounds="tight", config=None):
    """Plan the extend attention of one batch (see :class:`ExtendPlan`).

    Args:
        cu_seqlens: [B + 1] offsets of each sequence's new tokens (host list or tensor; a
            GPU tensor is read back once).
        prefix_lens: [B] cached tokens before each sequence's new ones (likewise).
        num_q_heads, num_kv_heads, head_dim, head_dim_v, page_size: the layer's sizes
            (head_dim_v defaults to head_dim).
        window_left, window_right, causal, softcap, scale, keys, return_lse, deterministic:
            as :func:`swattn.extend_attention`'s.
        mask_indptr: [B + 1] offsets of each sequence's custom-mask entries (host); the mask
            itself comes with each run.
        kv_dtype: the cache's dtype where it differs from the queries' (not supported yet).
        block_table, num_pages: a host copy of the block table and the cache's page count:
            every entry a query will read is checked here, once (a ValueError names it).
        max_tokens: the token capacity ``replan`` keeps (default the batch's tokens).
        dtype, device: the queries' dtype and device.
        hopper: None lets the plan choose the kernel; False keeps the portable Triton kernel;
            True asks for the Hopper path (a ValueError says why a plan cannot take it).
        bounds, config: verification: the loop-bound variant, and a Config (or a dict of
            Config fields to change) for the Triton kernel's tiles.
    """
    device = _device(device)
    cu = host_ints("cu_seqlens", cu_seqlens)
    prefix = host_ints("prefix_lens", prefix_lens)
    indptr = host_ints("mask_indptr", mask_indptr) if mask_indptr is not None else None
    check_extend_lengths(cu, prefix, indptr)
    max_tokens = cu[-1] if max_tokens is None else max_tokens
    check_int("max_tokens", max_tokens, cu[-1])
    if block_table is not None:
        if num_pages is None:
            raise ValueError("num_pages (the cache's page count) is needed to check block_table")
        if keys != "new":
            reads = [((max(p - window_left, 0) if window_left is not None else 0) // page_size,
                      -(-p // page_size)) if b > a else (0, 0)
                     for p, a, b in zip(prefix, cu, cu[1:])]
            check_pages_read(block_table, num_pages, reads)
    indptr_t = None
    if indptr is not None:
        indptr_t = torch.tensor(indptr, dtype=torch.int64)
        indptr_t = indptr_t.to(device, non_blocking=True) if device.type == "cuda" else indptr_t
    return _extend_plan(
        cu, prefix, indptr, _to_device(cu, device), _to_device(prefix, device), indptr_t,
        len(prefix), num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
        head_dim_v=head_dim_v, page_size=page_size, window_left=window_left,
        window_right=window_right, causal=causal, softcap=softcap, scale=scale, keys=keys,
        return_lse=return_lse, deterministic=deterministic, kv_dtype=kv_dtype, dtype=dtype,
        device=device, hopper=hopper, bounds=bounds, config=config, max_tokens=max_tokens)


def extend_plan_for(q, k, v, k_cache, v_cache, block_table, cu_seqlens, prefix_lens, *,
                    window_left=None, window_right=None, causal=True, softcap=0.0, scale=None,
                    mask_indptr=None, keys="all", return_lse=False, deterministic=False,
                    hopper=None, bounds="tight", config=None):
    """The plan of a one-shot call: sizes from the tensors, and the lengths as the device
    tensors given, which it neither reads nor copies (no host sync: the kernels read them
    at launch). Their values are the caller's to keep consistent (as FlashAttention's
    ``cu_seqlens``); :func:`plan_extend` checks them. A Hopper plan falls back to the
    Triton kernel when the copy engine cannot take these tensors' strides."""
    expect_first("q", q, 3)
    device = q.device
    dev = device.index if device.type == "cuda" else -1
    for name, t, dim in (("k", k, 3), ("v", v, 3), ("k_cache", k_cache, 4)):
        _rank(name, t, dim)
    expect("cu_seqlens", cu_seqlens, torch.int32, dev, (), 1)
    expect("prefix_lens", prefix_lens, torch.int32, dev, (cu_seqlens.shape[0] - 1,))
    if mask_indptr is not None:
        _rank("mask_indptr", mask_indptr, 1)
        if mask_indptr.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"mask_indptr must be torch.int32 or torch.int64, got {mask_indptr.dtype}")
        expect("mask_indptr", mask_indptr, mask_indptr.dtype, dev, (cu_seqlens.shape[0],))
    options = (window_left, window_right, causal, softcap, scale, keys, return_lse,
               deterministic, hopper, bounds)
    key = None
    if not isinstance(config, dict):
        # What the plan's choices depend on: sizes, dtype, device, the options (their types
        # too: 3 and 3.0 hash alike) and the strides (whether the copy engine takes them).
        key = ("extend", q.shape[1:], q.dtype, dev, k.shape[1:], v.shape[1:], k_cache.shape[1:],
               prefix_lens.shape[0], None if mask_indptr is None else mask_indptr.dtype, options,
               tuple(map(type, options)),
               config, q.stride(), k.stride(), v.stride(), k_cache.stride(), v_cache.stride())
        hit = _ONE_SHOT.get(key)
        if hit is not None:
            spec, path, launches = hit
            return ExtendPlan(spec, path, device, q.dtype, cu_seqlens, prefix_lens, mask_indptr,
                              launches=launches)
    kwargs = dict(num_q_heads=q.shape[1], num_kv_heads=k.shape[1], head_dim=q.shape[2],
                  head_dim_v=v.shape[2], page_size=k_cache.shape[1], window_left=window_left,
                  window_right=window_right, causal=causal, softcap=softcap, scale=scale,
                  keys=keys, return_lse=return_lse, deterministic=deterministic, kv_dtype=None,
                  dtype=q.dtype, device=device, bounds=bounds, config=config, max_tokens=None)
    if k.shape[1] < 1:
        raise ValueError(f"k must have at least one head, got shape {tuple(k.shape)}")
    plan = _extend_plan(None, None, None, cu_seqlens, prefix_lens, mask_indptr,
                        prefix_lens.shape[0], hopper=hopper, **kwargs)
    if plan.path == "hopper" and hopper is None:
        from .ops import extend_hopper
        if isinstance(extend_hopper.descriptors(q, k, v, k_cache, v_cache), str):
            plan = _extend_plan(None, None, None, cu_seqlens, prefix_lens, mask_indptr,
                                prefix_lens.shape[0], hopper=False, **kwargs)
    _remember(key, (plan.spec, plan.path, plan._launches))
    return plan


# The choices of one-shot calls (their plans' spec, path and bound launches), by what they
# depend on: a model calls the one-shot functions layer after layer with the same sizes.
_ONE_SHOT = {}


def _remember(key, choice):
    if key is not None:
        if len(_ONE_SHOT) >= 512:
            _ONE_SHOT.clear()
        _ONE_SHOT[key] = choice


def _rank(name, t, dim):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dim:
        raise ValueError(f"{name} must have {dim} dimensions, got shape {tuple(t.shape)}")


def expect_first(name, t, dim):
    """The first tensor of a one-shot call: its type and rank, and a device the kernels
    run on."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dim:
        raise ValueError(f"{name} must have {dim} dimensions, got shape {tuple(t.shape)}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be one of {FLOAT_DTYPES}, got {t.dtype}")
    check_device(name, t.device)


# --------------------------------------------------------------------------------------
# Decode.
# --------------------------------------------------------------------------------------

class DecodePlan:
    """One batch's decode attention, planned: made by :func:`plan_decode`.

    Attributes: ``path`` (``"hopper"`` or ``"triton"``), ``config``, ``num_splits`` (the
    split-KV chunks per sequence and KV head), ``batch`` (the capacity ``replan`` keeps),
    and the device buffer ``seq_lens`` the kernels read."""

    def __init__(self, spec, path, device, dtype, batch, seq_lens, sparse_keys, host=None,
                 launches=None):
        self.spec = spec
        self.path = path
        self.config = spec.config
        self.num_splits = spec.num_splits
        self.device = device
        self.dtype = dtype
        self.batch = batch
        self.seq_lens = seq_lens
        self.sparse_keys = sparse_keys
        self._index = device.index if device.type == "cuda" else -1
        # The bound launches: the plan's own, or shared by the one-shot calls of one choice.
        self._launches = {} if launches is None else launches
        self._hq = spec.num_kv_heads * spec.group
        self._shapes = ((batch, self._hq, spec.head_dim),
                        (spec.page_size, spec.num_kv_heads, spec.head_dim),
                        (spec.page_size, spec.num_kv_heads, spec.head_dim_v))
        self._out_shape = (batch, self._hq, spec.head_dim_v)
        self._sinks_shape = (self._hq,)
        self._hopper = None
        if path == "hopper":
            from .ops import decode_hopper
            self._hopper = decode_hopper
        self._readable = host is not None
        self._pages_needed = max((-(-x // spec.page_size) for x in host), default=0) if host else 0
        parts = None
        if spec.num_splits > 1:
            # [B, Hq, S, Dv] seen as S parts of [B, Hq, Dv]: the merge reads them in place.
            hq = spec.num_kv_heads * spec.group
            part_o = torch.empty(batch, hq, spec.num_splits, spec.head_dim_v, dtype=torch.float32,
                                 device=device)
            part_lse = torch.empty(batch, hq, spec.num_splits, dtype=torch.float32, device=device)
            parts = (part_o, part_lse)
        self._parts = parts
        # [B, Hq, S, Dv] seen as S parts of [B, Hq, Dv]: the merge reads them in place.
        self._merged = (parts[0].permute(2, 0, 1, 3), parts[1].permute(2, 0, 1)) if parts else None

    def run(self, q, k_cache, v_cache, block_table, *, sinks=None, sparse=None, k_scale=None,
            v_scale=None, out=None, lse=None):
        """The decode attention of the planned batch for one layer; returns ``out``, or
        ``(out, lse)`` when the plan returns lse. Arguments as
        :func:`swattn.decode_attention`'s. No host sync; no allocation when ``out`` (and
        ``lse``) are given."""
        if sparse is not None or k_scale is not None or v_scale is not None \
                or not self._fits(q, k_cache, v_cache, block_table, sinks, out, lse):
            self._check(q, k_cache, v_cache, block_table, sinks, sparse, k_scale, v_scale, out, lse)
        s, batch = self.spec, self.batch
        if out is None:
            out = torch.empty(batch, self._hq, s.head_dim_v, dtype=self.dtype, device=q.device)
        if s.return_lse and lse is None:
            lse = torch.empty(batch, self._hq, dtype=torch.float32, device=q.device)
        if batch:
            launch, merge = self._launch(sinks is not None, sparse is not None)
            if self.path == "hopper":
                launch(batch, q, k_cache, block_table, self.seq_lens, sinks, out, lse, self._parts,
                       self._hopper.lazy_descriptors(q, k_cache, v_cache))
            else:
                launch(batch, q, k_cache, v_cache, block_table, self.seq_lens, sinks, sparse, out,
                       lse, self._parts)
            if merge is not None:
                merge(*self._merged, sinks, out, lse)
        return (out, lse) if s.return_lse else out

    def _fits(self, q, k_cache, v_cache, block_table, sinks, out, lse):
        """Whether the run's tensors are what the plan takes (see ExtendPlan._fits)."""
        dt, dev, (qt, kct, vct) = self.dtype, self._index, self._shapes
        try:
            kcs, vcs, bts = k_cache.shape, v_cache.shape, block_table.shape
            ok = (q.dtype is dt and k_cache.dtype is dt and v_cache.dtype is dt
                  and block_table.dtype is torch.int32 and q.shape == qt and kcs[1:] == kct
                  and vcs[0] == kcs[0] and vcs[1:] == vct and len(bts) == 2
                  and bts[0] == self.batch and bts[1] >= self._pages_needed
                  and q.get_device() == dev and k_cache.get_device() == dev
                  and v_cache.get_device() == dev and block_table.get_device() == dev
                  and q.stride(2) == 1 and k_cache.stride(3) == 1 and v_cache.stride(3) == 1
                  and block_table.stride(1) == 1)
            if ok and sinks is not None:
                ok = (sinks.dtype is torch.float32 and sinks.shape == self._sinks_shape
                      and sinks.get_device() == dev)
            if ok and out is not None:
                ok = (out.dtype is dt and out.shape == self._out_shape and out.get_device() == dev
                      and out.stride(2) == 1)
            if ok and self.spec.return_lse and lse is not None:
                ok = (lse.dtype is torch.float32 and lse.shape == self._out_shape[:2]
                      and lse.get_device() == dev)
            return ok
        except (AttributeError, IndexError, TypeError):
            return False

    def _check(self, q, k_cache, v_cache, block_table, sinks, sparse, k_scale, v_scale, out, lse):
        """The run's arguments one by one, raising the error that names what is wrong."""
        s, dev, dtype, batch = self.spec, self._index, self.dtype, self.batch
        expect("q", q, dtype, dev, (batch, self._hq, s.head_dim))
        expect("k_cache", k_cache, dtype, dev, (s.page_size, s.num_kv_heads, s.head_dim), 1)
        expect("v_cache", v_cache, dtype, dev, (k_cache.shape[0], s.page_size, s.num_kv_heads,
                                                s.head_dim_v))
        expect("block_table", block_table, torch.int32, dev, (), 2)
        if block_table.shape[0] != batch or block_table.shape[1] < self._pages_needed:
            raise ValueError(f"block_table must be [{batch}, >= {self._pages_needed}] (sequences, "
                             f"pages the planned lengths need), got {tuple(block_table.shape)}")
        if sinks is not None:
            expect("sinks", sinks, torch.float32, dev, (self._hq,))
        if sparse is not None:
            self._check_sparse(sparse)
        _no_fp8(k_scale, v_scale)
        if out is not None:
            expect("out", out, dtype, dev, (batch, self._hq, s.head_dim_v))
        if s.return_lse and lse is not None:
            expect("lse", lse, torch.float32, dev, (batch, self._hq))

    def _check_sparse(self, sparse):
        s, dev = self.spec, self._index
        if not isinstance(sparse, (tuple, list)) or len(sparse) != 3:
            raise TypeError("sparse must be a tuple (k_pool, v_pool, idx) or None, got "
                            f"{type(sparse).__name__}" + (f" of length {len(sparse)}"
                                                          if isinstance(sparse, (tuple, list)) else ""))
        if self.sparse_keys == 0:
            raise ValueError("sparse keys given, but the plan was made with sparse_keys=0")
        k_pool, v_pool, idx = sparse
        expect("sparse k_pool", k_pool, self.dtype, dev, (s.num_kv_heads, s.head_dim), 1)
        expect("sparse v_pool", v_pool, self.dtype, dev, (k_pool.shape[0], s.num_kv_heads,
                                                         s.head_dim_v))
        expect("sparse idx", idx, torch.int32, dev, (self.batch, self.sparse_keys))

    def _launch(self, has_sinks, has_sparse):
        """``(kernel launch, split merge or None)`` of a run with or without sinks and
        sparse keys (bound once each)."""
        key = (has_sinks, has_sparse)
        bound = self._launches.get(key)
        if bound is None:
            spec = _replace(self.spec, has_sinks=has_sinks, has_sparse=has_sparse)
            if self.path == "hopper":
                launch = self._hopper.HopperDecodeLaunch(spec, self.dtype)
            else:
                launch = _decode.DecodeLaunch(spec, self.dtype)
            merge = None
            if spec.num_splits > 1:
                merge = MergeLaunch(spec.num_splits, spec.head_dim_v, has_sinks, spec.return_lse,
                                    True, spec.pdl, (torch.float32, self.dtype))
            bound = self._launches[key] = (launch, merge)
        return bound

    def replan(self, seq_lens):
        """Write the next batch's lengths into this plan's buffer, in place: at most
        ``batch`` sequences (the rest padded with empty ones, whose output is 0); the rest
        of the plan (window, kernel, split count) is kept. A CUDA graph captured from
        :meth:`run` then replays with the new lengths."""
        if not self._readable:
            raise ValueError("this plan was made from device tensors it did not read (a "
                             "one-shot call): make one with plan_decode to replan")
        lens = host_ints("seq_lens", seq_lens)
        check_lengths("seq_lens", lens)
        if len(lens) > self.batch:
            raise ValueError(f"replan with {len(lens)} sequences: the plan holds {self.batch}")
        lens = lens + [0] * (self.batch - len(lens))
        self.seq_lens.copy_(torch.tensor(lens, dtype=torch.int32), non_blocking=True)
        self._pages_needed = max((-(-x // self.spec.page_size) for x in lens), default=0)


def _decode_plan(lens, seq_lens_t, batch, *, num_q_heads, num_kv_heads, head_dim, head_dim_v,
                 page_size, window_left, softcap, scale, num_splits, return_lse, kv_dtype,
                 sparse_keys, max_keys, dtype, device, hopper, bounds, config):
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    _check_common(num_q_heads, num_kv_heads, head_dim, head_dim_v, page_size, softcap, scale,
                  dtype, kv_dtype, hopper, bounds)
    check_window(window_left)
    check_num_splits(num_splits)
    check_int("sparse_keys", sparse_keys, 0)
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    group = num_q_heads // num_kv_heads
    cfg = _config.decode_config(head_dim, head_dim_v, group, dtype, device)
    if isinstance(config, dict):
        cfg = _replace(cfg, **config)
    elif config is not None:
        cfg = config
    want = hopper
    if hopper is None:
        # Short windows keep the Triton kernel (C-A, 129 keys: see config.HOPPER_MIN_KEYS).
        want = cfg.hopper and config is None and max_keys >= _config.HOPPER_MIN_KEYS
    path = "triton"
    if want:
        from .ops import decode_hopper
        reason = decode_hopper.unsupported(device, dtype, head_dim, head_dim_v, group, page_size)
        if reason is None and sparse_keys:
            reason = "it takes no sparse keys"
        if reason is not None and hopper:
            raise ValueError(f"hopper=True: the Hopper path cannot take this plan: {reason}")
        if reason is None:
            path = "hopper"
            cfg = _replace(cfg, block_n=decode_hopper.BLOCK_N, block_h=decode_hopper.BLOCK_M,
                           hopper=True)
    if num_splits is None:
        sms = (torch.cuda.get_device_properties(device).multi_processor_count
               if device.type == "cuda" else _config.DECODE_CPU_SMS)
        programs = num_kv_heads * (1 if path == "hopper" else _config.head_blocking(cfg, group)[1])
        chooser = _config.hopper_decode_splits if path == "hopper" else _config.decode_splits
        num_splits = chooser(batch, programs, max_keys + sparse_keys, sms, cfg.block_n)
    # The split merge by PDL where the launch can take it: CUDA (not HIP) on sm_90 or later.
    pdl = (num_splits > 1 and device.type == "cuda" and torch.version.hip is None
           and torch.cuda.get_device_capability(device)[0] >= 9)
    spec = _decode.DecodeSpec(
        head_dim=head_dim, head_dim_v=head_dim_v, group=group, num_kv_heads=num_kv_heads,
        page_size=page_size, config=cfg, window_left=window_left, softcap=float(softcap),
        qk_scale=kernel_scale(head_dim ** -0.5 if scale is None else float(scale), softcap),
        num_splits=num_splits, return_lse=return_lse, pdl=pdl, bounds=bounds)
    return DecodePlan(spec, path, device, dtype, batch, seq_lens_t, sparse_keys, lens)


def plan_decode(seq_lens, *, num_q_heads, num_kv_heads, head_dim, head_dim_v=None, page_size,
                window_left=None, softcap=0.0, scale=None, num_splits=None, return_lse=False,
                kv_dtype=None, sparse_keys=0, block_table=None, num_pages=None,
                dtype=torch.bfloat16, device="cuda", hopper=None, bounds="tight", config=None):
    """Plan the decode attention of one batch (see :class:`DecodePlan`).

    Args:
        seq_lens: [B] tokens in each sequence's cache, the new one included (host list or
            tensor; a GPU tensor is read back once).
        num_q_heads, num_kv_heads, head_dim, head_dim_v, page_size: the layer's sizes.
        window_left, softcap, scale, return_lse: as :func:`swattn.decode_attention`'s.
        num_splits: split-KV chunks per sequence and KV head; None chooses from the batch,
            the keys the window (or, without one, the longest sequence) holds, and the GPU's
            SM count. ``replan`` keeps it.
        sparse_keys: K of the ``sparse`` index list each run will pass (0: none).
        kv_dtype: the cache's dtype where it differs from the queries' (not supported yet).
        block_table, num_pages: a host copy of the block table and the cache's page count:
            every entry a query will read is checked here, once.
        dtype, device: the queries' dtype and device.
        hopper, bounds, config: as :func:`plan_extend`'s.
    """
    device = _device(device)
    lens = host_ints("seq_lens", seq_lens)
    check_lengths("seq_lens", lens)
    if block_table is not None:
        if num_pages is None:
            raise ValueError("num_pages (the cache's page count) is needed to check block_table")
        check_window(window_left)
        reads = [((max(x - 1 - window_left, 0) if window_left is not None else 0) // page_size,
                  -(-x // page_size)) for x in lens]
        check_pages_read(block_table, num_pages, reads)
    longest = max(lens, default=0)
    max_keys = longest if window_left is None else min(window_left + 1, longest)
    return _decode_plan(
        lens, _to_device(lens, device), len(lens), num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads, head_dim=head_dim, head_dim_v=head_dim_v, page_size=page_size,
        window_left=window_left, softcap=softcap, scale=scale, num_splits=num_splits,
        return_lse=return_lse, kv_dtype=kv_dtype, sparse_keys=sparse_keys, max_keys=max_keys,
        dtype=dtype, device=device, hopper=hopper, bounds=bounds, config=config)


def decode_plan_for(q, k_cache, v_cache, block_table, seq_lens, *, window_left=None, softcap=0.0,
                    scale=None, sparse=None, num_splits=None, return_lse=False, hopper=None,
                    bounds="tight", config=None):
    """The plan of a one-shot call: sizes from the tensors, ``seq_lens`` the device tensor
    given, neither read nor copied (no host sync); the split count from the window, or the
    block table's capacity without one. Lengths are the caller's to keep consistent with
    the block table; :func:`plan_decode` checks them. A Hopper plan falls back to the
    Triton kernel when the copy engine cannot take these tensors' strides."""
    expect_first("q", q, 3)
    dev = q.device.index if q.device.type == "cuda" else -1
    for name, t, dim in (("k_cache", k_cache, 4), ("v_cache", v_cache, 4),
                         ("block_table", block_table, 2)):
        _rank(name, t, dim)
    expect("seq_lens", seq_lens, torch.int32, dev, (q.shape[0],))
    sparse_keys = 0
    if sparse is not None:
        if not isinstance(sparse, (tuple, list)) or len(sparse) != 3:
            raise TypeError("sparse must be a tuple (k_pool, v_pool, idx) or None, got "
                            f"{type(sparse).__name__}" + (f" of length {len(sparse)}"
                                                          if isinstance(sparse, (tuple, list)) else ""))
        _rank("sparse idx", sparse[2], 2)
        sparse_keys = sparse[2].shape[1]
    options = (window_left, softcap, scale, num_splits, return_lse, hopper, bounds)
    key = None
    if not isinstance(config, dict):
        # As extend_plan_for's; the block table's width sets the keys of a full window.
        key = ("decode", q.shape, q.dtype, dev, k_cache.shape[1:], v_cache.shape[1:],
               block_table.shape[1], sparse_keys, options, tuple(map(type, options)), config,
               q.stride(), k_cache.stride(), v_cache.stride())
        hit = _ONE_SHOT.get(key)
        if hit is not None:
            spec, path, launches = hit
            return DecodePlan(spec, path, q.device, q.dtype, q.shape[0], seq_lens, sparse_keys,
                              launches=launches)
    capacity = block_table.shape[1] * k_cache.shape[1]
    max_keys = capacity if window_left is None or not isinstance(window_left, int) \
        else min(window_left + 1, capacity)
    num_kv_heads = k_cache.shape[2]
    kwargs = dict(num_q_heads=q.shape[1], num_kv_heads=num_kv_heads, head_dim=q.shape[2],
                  head_dim_v=v_cache.shape[3], page_size=k_cache.shape[1], window_left=window_left,
                  softcap=softcap, scale=scale, num_splits=num_splits, return_lse=return_lse,
                  kv_dtype=None, sparse_keys=sparse_keys, max_keys=max_keys, dtype=q.dtype,
                  device=q.device, bounds=bounds, config=config)
    if num_kv_heads < 1:
        raise ValueError(f"k_cache must have at least one head, got shape {tuple(k_cache.shape)}")
    plan = _decode_plan(None, seq_lens, q.shape[0], hopper=hopper, **kwargs)
    if plan.path == "hopper" and hopper is None:
        from .ops import decode_hopper
        if isinstance(decode_hopper.descriptors(q, k_cache, v_cache), str):
            plan = _decode_plan(None, seq_lens, q.shape[0], hopper=False, **kwargs)
    _remember(key, (plan.spec, plan.path, plan._launches))
    return plan


# --------------------------------------------------------------------------------------
# One plan, one run: the one-shot calls (swattn.extend_attention and friends are these
# without the verification options).
# --------------------------------------------------------------------------------------

def _tiling(config, **fields):
    """``config`` with the tile fields given (not None) changed: a dict of Config fields."""
    fields = {k: v for k, v in fields.items() if v is not None}
    if not fields:
        return config
    if config is not None and not isinstance(config, dict):
        return _replace(config, **fields)
    return {**(config or {}), **fields}


def run_extend(q, k, v, k_cache, v_cache, block_table, cu_seqlens, prefix_lens, *, sinks=None,
               mask=None, out=None, lse=None, block_m=None, block_n=None, pack_gqa=None,
               config=None, **options):
    """:func:`extend_plan_for` and its run on these tensors. ``block_m``, ``block_n``,
    ``pack_gqa`` change those fields of the config (the Triton kernel's tiling)."""
    plan = extend_plan_for(q, k, v, k_cache, v_cache, block_table, cu_seqlens, prefix_lens,
                           config=_tiling(config, block_m=block_m, block_n=block_n,
                                          pack_gqa=pack_gqa), **options)
    return plan.run(q, k, v, k_cache, v_cache, block_table, sinks=sinks, mask=mask, out=out, lse=lse)


def run_decode(q, k_cache, v_cache, block_table, seq_lens, *, sinks=None, sparse=None, out=None,
               lse=None, block_n=None, config=None, **options):
    """:func:`decode_plan_for` and its run on these tensors. ``block_n`` changes the
    config's key tile."""
    plan = decode_plan_for(q, k_cache, v_cache, block_table, seq_lens, sparse=sparse,
                           config=_tiling(config, block_n=block_n), **options)
    return plan.run(q, k_cache, v_cache, block_table, sinks=sinks, sparse=sparse, out=out, lse=lse)
