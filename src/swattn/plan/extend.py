"""The extend plan: :func:`plan_extend` and :class:`ExtendPlan` (see :mod:`swattn.plan`), and
the plan of a one-shot call (:func:`extend_plan_for`)."""

import torch

from ..ops import config as _config
from ..ops import extend as _extend
from ..ops._common import kernel_scale
from ..ops._launch import relaunch
from ..ops._validate import (
    FP8_DTYPES,
    KEYS,
    check_extend_lengths,
    check_int,
    check_pages_read,
    check_positions,
    check_window,
    expect,
    host_ints,
)
from ..window import check_chunk, row_key_range
from ._common import (
    ONE_SHOT,
    Plan,
    TensorArg,
    check_agree,
    check_cache_dtype,
    check_common,
    check_heads,
    check_new_dtype,
    check_rank,
    check_scales,
    expect_first,
    pages_needed,
    remember,
    replace_spec,
    resolve_device,
    run_key,
    scale_args,
    to_device,
)


class ExtendPlan(Plan):
    """One batch's extend attention, planned: made by :func:`plan_extend`.

    Attributes: ``path`` (``"hopper"``: the Gluon kernel for sm_90; ``"triton"``: the
    portable two-stage kernel; ``"single-pass"``: the deterministic kernel), ``config``
    (the Triton kernel's tiles; None on the Hopper path), ``num_seqs`` and ``max_tokens``
    (the batch capacity ``replan`` keeps), ``num_tokens`` (the current batch's), and the
    device buffers ``cu_seqlens``, ``prefix_lens`` (and ``mask_indptr``, ``key_ranges``)
    the kernels read.
    """

    def __init__(self, spec, path, device, dtype, cu_seqlens, prefix_lens, mask_indptr,
                 host=None, max_tokens=None, launches=None, ready=None, key_ranges=None,
                 positions=None):
        super().__init__(spec, path, device, dtype, launches, "extend_hopper", ready)
        self.cu_seqlens = cu_seqlens
        self.positions = positions
        self.prefix_lens = prefix_lens
        self.mask_indptr = mask_indptr
        self.key_ranges = key_ranges
        self.num_seqs = spec.num_seqs
        self.max_tokens = max_tokens
        s, kv = spec, spec.kv_dtype
        # The run's tensors (:meth:`_tensors`): q's rows fix the new rows', the K cache's
        # pages the V cache's.
        self.table = (
            TensorArg("q", dtype, ("rows", s.num_q_heads, s.head_dim)),
            TensorArg("k", dtype, ("rows", s.num_kv_heads, s.head_dim)),
            TensorArg("v", dtype, ("rows", s.num_kv_heads, s.head_dim_v)),
            TensorArg("k_cache", kv, ("pages", s.page_size, s.num_kv_heads, s.head_dim)),
            TensorArg("v_cache", kv, ("pages", s.page_size, s.num_kv_heads, s.head_dim_v)),
            TensorArg("block_table", torch.int32, (None, None)),
            TensorArg("sinks", torch.float32, (s.num_q_heads,), optional=True),
            TensorArg("out", dtype, ("rows", s.num_q_heads, s.head_dim_v), optional=True),
            *((TensorArg("lse", torch.float32, ("rows", s.num_q_heads), optional=True),)
              if s.return_lse else ()),
            *((TensorArg("mask", torch.bool, (None,), optional=True),) if s.masked else ()))
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
        self._pages_needed = pages_needed(
            [(p, p) for p, a, b in zip(prefix, cu, cu[1:]) if b > a and reads_prefix],
            s.page_size, (s.window_left, s.attention_chunk) if s.ring else False)
        self._mask_entries = indptr[-1] if indptr is not None else 0

    def run(self, q, k, v, k_cache, v_cache, block_table, *, sinks=None, mask=None, k_scale=None,
            v_scale=None, out=None, lse=None):
        """The attention of the planned batch for one layer; returns ``out``, or ``(out,
        lse)`` when the plan returns lse. Arguments as :func:`swattn.extend_attention`'s;
        ``q``/``k``/``v`` may have more rows than the batch's tokens (a batch padded to a
        captured size: rows past ``cu_seqlens[-1]`` are left alone). No host sync; no
        allocation when ``out`` (and ``lse``) are given, but for the Hopper path's buffers
        of the new rows over an fp8 cache, made at the first run of a row count, and of the
        widened prefix (config ``prefix_rows``), made at the first run."""
        tensors = self._tensors(q, k, v, k_cache, v_cache, block_table, sinks, out, lse, mask)
        key = None
        if out is not None and (lse is not None or not self.spec.return_lse) and mask is None:
            # A run on the addresses, shapes, strides and dtypes of an earlier one (an
            # engine's buffers, layer after layer; a one-shot call's lengths too) launches
            # what that one assembled.
            try:
                key = self.relaunch_key(tensors, k_scale, v_scale)
                ready = self._ready.get(key)
            except (AttributeError, RuntimeError, TypeError):
                key = ready = None  # not plain tensors: the checks below say
            if ready is not None and relaunch(*ready):
                return (out, lse) if self.spec.return_lse else out
        if (k_scale is not None or v_scale is not None
                or not self._fits(tensors, q, block_table, mask)):
            self._check(tensors, q, k, v, k_cache, v_cache, block_table, mask, k_scale, v_scale)
        s = self.spec
        rows = q.shape[0]
        if out is None:
            out = torch.empty(rows, s.num_q_heads, s.head_dim_v, dtype=self.dtype, device=q.device)
        if s.return_lse and lse is None:
            lse = torch.empty(rows, s.num_q_heads, dtype=torch.float32, device=q.device)
        scales, strides = scale_args(k_scale, v_scale, self._unit)
        ready = ()  # the launches, in order, for relaunch
        if self.num_tokens is None:
            # A one-shot call's lengths were never checked on the host: the rows no
            # well-formed sequence owns come out NaN, never stale (window.uncovered_rows).
            ready = (self._uncovered_rows()(block_table, self.cu_seqlens, self.prefix_lens,
                                            mask, self.mask_indptr, out, lse),)
        if self.path == "hopper":
            prefix = None
            if self._unit is not None and s.keys == "prefix":
                # Stage 1 alone reads no new rows: buffers of the rows' dtype stand in for
                # the copy descriptors, never written (NaN, should a read ever reach them).
                k, v = self._row_buffers(k, poison=True)
            elif self._unit is not None:
                # An fp8 cache: the kernel reads the new rows as the cache stores them.
                k, v, rows_ready = self._new_rows(k, v, scales, strides)
                ready = (rows_ready,)
            if self._unit is not None and s.config.prefix_rows:
                # (stage 1 alone too: it reads the widened prefix as the whole pass does)
                *prefix, prefix_ready = self._prefix_rows(k_cache, v_cache, block_table, rows)
                ready += (prefix_ready,)
            # A layout the copy engine cannot take raises at the launch (plan with
            # hopper=False for such tensors).
            ready += (self._launch(sinks is not None, False, False, strides)(
                q, block_table, self.cu_seqlens, self.prefix_lens, sinks, out, lse,
                self._hopper.lazy_descriptors(s.config, q, k, v, k_cache, v_cache, prefix),
                k_cache, scales, self.key_ranges),)
        else:
            descs = _extend.descriptors(s.config, k, v, k_cache, v_cache, s.masked,
                                        new=s.keys != "prefix")
            ready = (self._launch(sinks is not None, descs[0] is not None, descs[2] is not None,
                                  strides)(
                q, k, v, k_cache, v_cache, block_table, self.cu_seqlens, self.prefix_lens, sinks,
                mask, self.mask_indptr, out, lse, descs, scales, self.key_ranges,
                self.positions),)
        if key is not None and None not in ready:
            self._remember(key, ready)
        return (out, lse) if s.return_lse else out

    def _new_rows(self, k, v, scales, strides):
        """The Hopper path over an fp8 cache: ``(k rows, v rows, the launch's ready)``, the
        new rows as the cache stores them (ops.cache.NewRowsLaunch) in buffers kept for
        the run's row count and device with the plan's launches (a relaunch reuses them):
        fp16 holding the fp8 values, copied into the ring as they are, or with fp8 products
        fp8, the products' operands."""
        from ..ops.cache import NewRowsLaunch
        s = self.spec
        rows = self._row_buffers(k)
        launch = self._launches.get(("quantize", strides))
        if launch is None:
            rows_dtype = rows[0].dtype
            launch = self._launches[("quantize", strides)] = NewRowsLaunch(
                s.num_kv_heads, s.head_dim, s.head_dim_v, strides,
                (self.dtype, rows_dtype, self.kv_dtype),
                self.kv_dtype if rows_dtype == torch.float16 else None)
        return (*rows, launch(k, v, *rows, scales))

    def _row_buffers(self, k, poison=False):
        """The buffers of :meth:`_new_rows` for ``k``'s row count and device, made once and
        kept with the plan's launches, in the products' operand dtype (fp16, or with fp8
        products the cache's); ``poison``: filled with NaN when made."""
        s, key = self.spec, ("new rows", k.shape[0], k.device)
        rows = self._launches.get(key)
        if rows is None:
            dtype = self.kv_dtype if s.config.fp8_products else torch.float16
            rows = self._launches[key] = tuple(
                torch.empty(k.shape[0], s.num_kv_heads, d, dtype=dtype, device=k.device)
                for d in (s.head_dim, s.head_dim_v))
            if poison:
                for buffer in rows:
                    buffer.fill_(float("nan"))
        return rows

    def _prefix_rows(self, k_cache, v_cache, block_table, num_tokens):
        """The Hopper path over an fp8 cache with ``config.prefix_rows``: ``(k rows, v rows,
        the launch's ready)``, the window's visible prefix of every sequence widened to fp16
        rows (ops.cache.PrefixRowsLaunch) in buffers kept for the device with the plan's
        launches."""
        from ..ops.cache import PrefixRowsLaunch
        s = self.spec
        launch = self._launches.get("prefix rows")
        if launch is None:
            launch = self._launches["prefix rows"] = PrefixRowsLaunch(
                s.num_seqs, s.page_size, s.num_kv_heads, s.head_dim, s.head_dim_v,
                s.window_left, s.config.block_n, (self.kv_dtype, torch.float16))
        rows = self._launches.get(("prefix rows", k_cache.device))
        if rows is None:
            rows = self._launches[("prefix rows", k_cache.device)] = tuple(
                torch.empty(launch.capacity(), s.num_kv_heads, d, dtype=torch.float16,
                            device=k_cache.device) for d in (s.head_dim, s.head_dim_v))
        return (*rows, launch(k_cache, v_cache, block_table, self.cu_seqlens, self.prefix_lens,
                              *rows, num_tokens))

    def _tensors(self, q, k, v, k_cache, v_cache, block_table, sinks, out, lse, mask):
        """A run's tensors in the order of the plan's table (the lse and the mask where the
        plan reads them)."""
        tensors = (q, k, v, k_cache, v_cache, block_table, sinks, out)
        if self.spec.return_lse:
            tensors += (lse,)
        return (tensors + (mask,)) if self.spec.masked else tensors

    def relaunch_key(self, tensors, k_scale, v_scale):
        """The relaunch key of a run (plan._common.run_key) of the table's ``tensors``,
        the scales and the lengths' buffers."""
        return run_key(tensors + (k_scale, v_scale)) + (
            self.cu_seqlens.data_ptr(), self.prefix_lens.data_ptr(),
            None if self.positions is None else self.positions.data_ptr())

    def _length_problem(self, q, block_table, mask):
        """What the planned lengths need of a run's tensors that they lack (a sentence), or
        None."""
        s = self.spec
        if self.num_tokens is not None and q.shape[0] < self.num_tokens:
            return f"q has {q.shape[0]} rows, the planned batch has {self.num_tokens} tokens"
        if block_table.shape[0] < s.num_seqs or block_table.shape[1] < self._pages_needed:
            return (f"block_table must be at least [{s.num_seqs}, {self._pages_needed}] "
                    f"(sequences, pages the planned prefixes need), got "
                    f"{tuple(block_table.shape)}")
        if not s.masked:
            return None if mask is None else "mask given, but the plan was made without mask_indptr"
        if mask is None:
            return "mask is required: the plan was made with mask_indptr"
        if mask.shape[0] < self._mask_entries:
            return f"mask has {mask.shape[0]} entries, mask_indptr needs {self._mask_entries}"
        return None

    def _check(self, tensors, q, k, v, k_cache, v_cache, block_table, mask, k_scale, v_scale):
        """The run's arguments one by one, raising the error that names what is wrong."""
        if self.max_tokens is None:
            # A one-shot call's plan (no capacity: it read no lengths): its sizes are the
            # call's tensors', and the one that differs from the others is named, as
            # extend_plan_for names it on a call it has not seen.
            check_one_shot(q, k, v, k_cache, v_cache, block_table, self.cu_seqlens,
                           self.prefix_lens, self.mask_indptr)
        self._check_tensors(tensors, q, block_table, mask)
        check_scales(k_scale, v_scale, self.kv_dtype, self.spec.num_kv_heads, self._index)

    def tiling(self):
        """The tiles the plan's kernel walks, for the tile model (swattn.tiles): query
        rows and keys a tile, tokens a block (fewer than its rows where the query heads of
        a KV group share a block) and the heads the blocks are repeated over."""
        s = self.spec
        if self.path == "hopper":
            cfg = s.config
            return {"block_m": cfg.block_m, "block_n": cfg.block_n,
                    "tokens_per_block": cfg.block_m, "heads": s.num_q_heads}
        cfg = s.config
        if _config.packs_gqa(cfg, s.group):
            return {"block_m": cfg.block_m, "block_n": cfg.block_n,
                    "tokens_per_block": cfg.block_m // s.group, "heads": s.num_kv_heads}
        return {"block_m": cfg.block_m, "block_n": cfg.block_n, "tokens_per_block": cfg.block_m,
                "heads": s.num_q_heads}

    def _uncovered_rows(self):
        """The launch that fills a one-shot call's uncovered rows with NaN (bound once)."""
        launch = self._launches.get("uncovered rows")
        if launch is None:
            dtypes = (self.dtype, None if self.mask_indptr is None else self.mask_indptr.dtype)
            launch = self._launches["uncovered rows"] = _extend.UncoveredRowsLaunch(self.spec,
                                                                                  dtypes)
        return launch

    def _launch(self, has_sinks, tma_new, tma_cache, scale_strides=(0, 0)):
        """The kernel's launch for a run with or without sinks and the TMA loads, and an fp8
        cache's scales per tensor or per KV head (bound once each)."""
        key = (has_sinks, tma_new, tma_cache, scale_strides)
        launch = self._launches.get(key)
        if launch is None:
            spec = replace_spec(self.spec, has_sinks=has_sinks, tma_new=tma_new,
                                tma_cache=tma_cache, scale_strides=scale_strides)
            bind = (self._hopper.HopperExtendLaunch if self.path == "hopper"
                    else _extend.ExtendLaunch)
            dtypes = (self.dtype, self.kv_dtype,
                      None if self.mask_indptr is None else self.mask_indptr.dtype)
            launch = self._launches[key] = bind(spec, dtypes)
        return launch

    def replan(self, cu_seqlens, prefix_lens, mask_indptr=None, positions=None):
        """Write the next batch's lengths into this plan's buffers, in place: at most
        ``num_seqs`` sequences (the rest padded with empty ones) and ``max_tokens`` tokens;
        the rest of the plan (window, kernel, config) is kept. A CUDA graph captured from
        :meth:`run` then replays with the new lengths. ``positions``: the new tokens'
        positions, given exactly when the plan was made with them."""
        if self.max_tokens is None:
            raise ValueError("this plan was made from device tensors it did not read (a "
                             "one-shot call): make one with plan_extend to replan")
        cu = host_ints("cu_seqlens", cu_seqlens)
        prefix = host_ints("prefix_lens", prefix_lens)
        indptr = host_ints("mask_indptr", mask_indptr) if mask_indptr is not None else None
        if self.spec.masked != (indptr is not None):
            raise ValueError("mask_indptr must be given exactly when the plan was made with one")
        check_extend_lengths(cu, prefix, indptr)
        if self.spec.has_positions != (positions is not None):
            raise ValueError("positions must be given exactly when the plan was made with them")
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
        if positions is not None:
            pos = check_positions(positions, cu)
            self.positions[:len(pos)].copy_(torch.tensor(pos, dtype=torch.int32),
                                            non_blocking=True)
        self._host((cu, prefix, indptr))
        self._ready.clear()  # the runs' checks depend on the lengths


def check_fp8_products(fp8_products, kv_dtype):
    """The option ``fp8_products``: a bool, True only over an fp8 cache (``kv_dtype``)."""
    if not isinstance(fp8_products, bool):
        raise TypeError(f"fp8_products must be a bool, got {type(fp8_products).__name__}")
    if fp8_products and kv_dtype not in FP8_DTYPES:
        raise ValueError(f"fp8_products needs an fp8 cache (kv_dtype), got {kv_dtype}")


def check_key_ranges_path(num_q_heads, num_kv_heads, head_dim, head_dim_v, page_size, kv_dtype,
                          dtype, device, fp8_products=False):
    """Refuse, without making a plan, what :func:`plan_key_ranges` refuses in choosing its
    path (``fp8_products``: a bool, over an fp8 cache, on a Hopper path that takes these
    sizes on ``device``): a context-parallel rank that launches nothing calls it
    (swattn.parallel), so it raises where the launching ranks do."""
    kv_dtype = dtype if kv_dtype is None else kv_dtype
    _extend_path(resolve_device(device), dtype, kv_dtype, head_dim,
                 head_dim if head_dim_v is None else head_dim_v, page_size,
                 num_q_heads // num_kv_heads, None, False, False, None, None, fp8_products)


def _extend_path(device, dtype, kv_dtype, head_dim, head_dim_v, page_size, group, window_left,
                 masked, deterministic, hopper, config, fp8_products=False, local=False):
    """``(path, config)`` of an extend plan: the single-pass kernel when deterministic, else
    the Hopper path where the config asks for it (or ``hopper=True``) and the plan can take
    it, else the Triton kernel with the config's tiles. ``config``: a Config, or a dict of
    fields to change in the chosen one (tests walk every tiling; with ``hopper=True``, the
    Hopper path's). ``fp8_products``: the Hopper path with fp8 products, or a ValueError
    saying why the plan cannot take it. ``local``: given positions, which the Triton kernels
    take (the Hopper path takes no custom mask, which trees come with)."""
    check_fp8_products(fp8_products, kv_dtype)
    if fp8_products:
        if hopper is False or deterministic:
            raise ValueError("fp8_products=True runs on the Hopper path: it takes neither "
                             "hopper=False nor deterministic=True")
        if config is not None and not isinstance(config, dict):
            raise TypeError("with fp8_products=True, config must be a dict of the Hopper path's "
                            f"config fields, got {type(config).__name__}")
        config = dict(config or {}, fp8_products=True)
        hopper = True
    if isinstance(config, dict) and config.get("fp8_products"):  # the Hopper config's field
        check_fp8_products(True, kv_dtype)
    cfg = _config.extend_config(head_dim, head_dim_v, group, window_left, dtype, device, page_size)
    tiling_asked = config is not None
    if isinstance(config, dict) and not hopper:
        cfg = replace_spec(cfg, **config)
    elif config is not None:
        cfg = config
    if deterministic:
        if hopper:
            raise ValueError("hopper=True: the Hopper path cannot take this plan: "
                             "deterministic=True runs the single-pass kernel")
        return "single-pass", cfg
    want = (cfg.hopper and not tiling_asked) if hopper is None else hopper
    if want:
        from ..ops import extend_hopper
        reason = extend_hopper.unsupported(device, dtype, head_dim, head_dim_v, page_size, masked,
                                           deterministic, kv_dtype)
        if reason is None and local:
            reason = "positions run on the Triton kernels"
        if reason is not None and hopper:
            raise ValueError(f"{'fp8_products' if fp8_products else 'hopper'}=True: the Hopper "
                             f"path cannot take this plan: {reason}")
        if reason is None:
            hopper_cfg = _config.hopper_extend_config(head_dim, dtype)
            if isinstance(config, dict) and hopper:
                hopper_cfg = replace_spec(hopper_cfg, **config)  # hopper=True: a dict tunes it
            return "hopper", hopper_cfg
    return "triton", cfg


def chooses_prefix_rows(cfg, kv_dtype, window_left, keys, num_seqs, max_tokens,
                         attention_chunk=None, ring_table=False):
    """Whether a Hopper plan over an fp8 cache widens its window's visible prefix before the
    kernel (ops.cache.PrefixRowsLaunch; config ``prefix_rows``): under a window, with the
    default products, when the rows it keeps (``window_left + block_n`` a sequence) are at
    most twice the batch's new rows (a plan knowing its ``max_tokens``); otherwise the
    kernel widens the prefix's tiles in shared memory."""
    return (_prefix_rows_unfit(cfg, kv_dtype, window_left, keys, attention_chunk,
                               ring_table) is None
            and max_tokens is not None
            and num_seqs * (window_left + cfg.block_n) <= 2 * max_tokens)


def _prefix_rows_unfit(cfg, kv_dtype, window_left, keys, attention_chunk=None,
                       ring_table=False):
    """Why a Hopper plan cannot widen its prefix before the kernel (a sentence), or None."""
    if attention_chunk is not None:
        return "it widens a window's visible prefix, not a chunk's"
    if ring_table:
        return "it reads a linear block table"
    if kv_dtype not in FP8_DTYPES or cfg.fp8_products:
        return "it widens an fp8 cache's prefix for the default products"
    if window_left is None:
        return "it widens a window's visible prefix (window_left is None)"
    if keys == "new":
        return "keys='new' reads no prefix"
    return None


def with_prefix_rows(cfg, config, kv_dtype, window_left, keys, bounds, num_seqs, max_tokens,
                      attention_chunk=None, ring_table=False):
    """The Hopper config with ``prefix_rows`` as a config dict asks (a ValueError where the
    plan cannot take it) or as the plan's rule chooses (:func:`chooses_prefix_rows`, the tight
    bounds only: skip and none walk tiles below the window, which would read other
    sequences' rows)."""
    if isinstance(config, dict) and "prefix_rows" in config:
        if cfg.prefix_rows:
            reason = _prefix_rows_unfit(cfg, kv_dtype, window_left, keys, attention_chunk,
                                        ring_table)
            if reason is not None:
                raise ValueError(f"config prefix_rows=True: {reason}")
            if bounds != "tight":
                raise ValueError("config prefix_rows=True takes the tight bounds only")
        return cfg
    return replace_spec(cfg, prefix_rows=bounds == "tight" and chooses_prefix_rows(
        cfg, kv_dtype, window_left, keys, num_seqs, max_tokens, attention_chunk, ring_table))


def build_extend_plan(cu, prefix, indptr, cu_t, prefix_t, indptr_t, num_seqs, *, num_q_heads,
                 num_kv_heads, head_dim, head_dim_v, page_size, window_left, window_right, causal,
                 softcap, scale, keys, return_lse, deterministic, kv_dtype, dtype, device, hopper,
                 bounds, config, max_tokens, fp8_products=False, key_ranges=None,
                 attention_chunk=None, positions=None, ring_table=False):
    """The plan of :func:`plan_extend` and of a one-shot call. ``positions``: the new
    tokens' positions, an int32 device tensor of at least ``max_tokens`` entries (or None:
    after the prefix). ``key_ranges``: ``(key_lo,
    key_hi)``, int32 device tensors of at least ``max_tokens`` entries: query row ``t`` sees
    the cached keys ``[key_lo[t], key_hi[t])`` of its sequence, with ``keys="prefix"``,
    neither a window nor a causal rule (swattn.parallel's extend), on either two-stage
    kernel; the plan's owner writes them before each run."""
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    check_common(num_q_heads, num_kv_heads, head_dim, head_dim_v, page_size, softcap, scale,
                  dtype, kv_dtype, hopper, bounds)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    check_window(window_left, window_right, causal)
    check_chunk(attention_chunk)
    if keys not in KEYS:
        raise ValueError(f"keys must be one of {KEYS}, got {keys!r}")
    for name, flag in (("return_lse", return_lse), ("deterministic", deterministic)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    kv_dtype = dtype if kv_dtype is None else kv_dtype
    masked = indptr_t is not None
    if key_ranges is not None and (
            keys != "prefix" or causal or window_left is not None or window_right is not None
            or masked or deterministic or attention_chunk is not None or positions is not None):
        raise ValueError("key_ranges take keys='prefix', causal=False, no window, no mask, "
                         "no chunk, no positions and deterministic=False")
    path, cfg = _extend_path(device, dtype, kv_dtype, head_dim, head_dim_v, page_size,
                             num_q_heads // num_kv_heads, window_left, masked, deterministic,
                             hopper, config, fp8_products,
                             local=positions is not None)
    if path == "hopper":
        cfg = with_prefix_rows(cfg, config, kv_dtype, window_left, keys, bounds, num_seqs,
                                max_tokens, attention_chunk, ring_table)
    spec = _extend.ExtendSpec(
        num_seqs=num_seqs, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
        head_dim_v=head_dim_v, page_size=page_size, config=cfg, window_left=window_left,
        window_right=window_right, causal=causal, softcap=float(softcap),
        qk_scale=kernel_scale(head_dim ** -0.5 if scale is None else float(scale), softcap),
        keys=keys, return_lse=return_lse, masked=masked, deterministic=deterministic,
        bounds=bounds, kv_dtype=kv_dtype, ranges=key_ranges is not None,
        attention_chunk=attention_chunk, has_positions=positions is not None,
        ring=bool(ring_table))
    host = (cu, prefix, indptr) if cu is not None else None
    return ExtendPlan(spec, path, device, dtype, cu_t, prefix_t, indptr_t, host, max_tokens,
                      key_ranges=key_ranges, positions=positions)


def plan_extend(cu_seqlens, prefix_lens, *, num_q_heads, num_kv_heads, head_dim, head_dim_v=None,
                page_size, window_left=None, window_right=None, causal=True, softcap=0.0,
                scale=None, mask_indptr=None, keys="all", return_lse=False, deterministic=False,
                kv_dtype=None, block_table=None, num_pages=None, max_tokens=None,
                dtype=torch.bfloat16, device=None, hopper=None, bounds="tight", config=None,
                fp8_products=False, attention_chunk=None, positions=None, ring_table=False):
    """Plan the extend attention of one batch (see :class:`ExtendPlan`).

    Args:
        cu_seqlens: [B + 1] offsets of each sequence's new tokens (host list or tensor; a
            GPU tensor is read back once).
        prefix_lens: [B] cached tokens before each sequence's new ones (likewise).
        num_q_heads, num_kv_heads, head_dim, head_dim_v, page_size: the layer's sizes
            (head_dim_v defaults to head_dim).
        window_left, window_right, causal, softcap, scale, keys: as
            :func:`swattn.extend_attention`'s.
        return_lse, deterministic, attention_chunk: as :func:`swattn.extend_attention`'s.
        positions: [T] each new token's absolute position (host list or tensor; default
            ``prefix_lens[b] + i``), written in place by ``replan``; as
            :func:`swattn.extend_attention`'s.
        mask_indptr: [B + 1] offsets of each sequence's custom-mask entries (host); the mask
            itself comes with each run.
        kv_dtype: the cache's dtype where it differs from the queries': ``torch.float8_e4m3fn``
            or ``torch.float8_e5m2`` (the cache holds value / scale; ``run`` takes the scales).
        fp8_products: over an fp8 cache on sm_90, opt-in: the products in fp8 on the Hopper
            path (each query row and the weights quantized to e4m3, K and V as stored):
            less accurate than the default (products in the queries' precision; docs/api.md,
            "fp8 KV caches"), faster on some shapes and not on others (benchmarks/README.md);
            a ValueError says why a plan cannot take it.
        block_table, num_pages: a host copy of the block table and the cache's page count:
            every entry a query will read is checked here, once (a ValueError names it).
        ring_table: the block tables ``run`` takes are rings: logical page ``i`` at column
            ``i % width`` (``width`` the table's columns, fixed; swattn.window.ring_width says
            how many a window and a step's new tokens need).
        max_tokens: the token capacity ``replan`` keeps (default the batch's tokens).
        dtype, device: the queries' dtype and device (None: CUDA's current device, or
            without CUDA the CPU under TRITON_INTERPRET=1; a ValueError says what to
            pass where neither is at hand).
        hopper: None lets the plan choose the kernel; False keeps the portable Triton kernel;
            True asks for the Hopper path (a ValueError says why a plan cannot take it).
        bounds, config: verification: the loop-bound variant, and a Config (or a dict of
            Config fields to change) for the Triton kernel's tiles (with hopper=True, a dict
            changes the Hopper path's config.HopperExtendConfig).
    """
    device = resolve_device(device)
    cu = host_ints("cu_seqlens", cu_seqlens)
    prefix = host_ints("prefix_lens", prefix_lens)
    indptr = host_ints("mask_indptr", mask_indptr) if mask_indptr is not None else None
    check_extend_lengths(cu, prefix, indptr)
    max_tokens = cu[-1] if max_tokens is None else max_tokens
    check_int("max_tokens", max_tokens, cu[-1])
    check_chunk(attention_chunk)
    pos = check_positions(positions, cu) if positions is not None else None
    if block_table is not None:
        if num_pages is None:
            raise ValueError("num_pages (the cache's page count) is needed to check block_table")
        if keys != "new":
            reads = [(_first_cached_key(p, range(p, p + b - a) if pos is None else pos[a:b],
                                        window_left, attention_chunk) // page_size,
                      -(-p // page_size)) if b > a else (0, 0)
                     for p, a, b in zip(prefix, cu, cu[1:])]
            check_pages_read(block_table, num_pages, reads, ring=ring_table)
    positions_t = None
    if pos is not None:
        positions_t = torch.zeros(max_tokens, dtype=torch.int32)
        positions_t[:len(pos)] = torch.tensor(pos, dtype=torch.int32)
        positions_t = positions_t.to(device, non_blocking=True) if device.type == "cuda" \
            else positions_t
    indptr_t = None
    if indptr is not None:
        indptr_t = torch.tensor(indptr, dtype=torch.int64)
        indptr_t = indptr_t.to(device, non_blocking=True) if device.type == "cuda" else indptr_t
    return build_extend_plan(
        cu, prefix, indptr, to_device(cu, device), to_device(prefix, device), indptr_t,
        len(prefix), num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
        head_dim_v=head_dim_v, page_size=page_size, window_left=window_left,
        window_right=window_right, causal=causal, softcap=softcap, scale=scale, keys=keys,
        return_lse=return_lse, deterministic=deterministic, kv_dtype=kv_dtype, dtype=dtype,
        device=device, hopper=hopper, bounds=bounds, config=config, max_tokens=max_tokens,
        fp8_products=fp8_products, attention_chunk=attention_chunk, positions=positions_t,
        ring_table=ring_table)


def _first_cached_key(prefix_len, positions, window_left, attention_chunk):
    """The lowest cached key a sequence's new tokens at ``positions`` see (window.row_key_range
    over its prefix); ``prefix_len`` when they see none."""
    firsts = [lo for lo, hi in (
        row_key_range(p, 0, prefix_len, window_left or 0, 0, attention_chunk or 1,
                      window_left is not None, attention_chunk is not None, True, False)
        for p in positions) if max(lo, 0) < hi]
    return max(min(firsts), 0) if firsts else prefix_len


def plan_key_ranges(cu_seqlens, prefix_lens, key_ranges, *, num_q_heads, num_kv_heads,
                    head_dim, head_dim_v=None, page_size, softcap=0.0, scale=None,
                    return_lse=True, kv_dtype=None, max_tokens=None, dtype=torch.bfloat16,
                    device=None, hopper=None, bounds="tight", config=None,
                    fp8_products=False):
    """An extend plan whose query rows each see their own range of cached keys: row ``t``
    the keys ``[key_lo[t], key_hi[t])`` of its sequence's ``prefix_lens[b]`` (a rank's local
    keys under context parallelism, swattn.parallel). ``key_ranges``: ``(key_lo, key_hi)``,
    int32 device tensors of at least ``max_tokens`` entries, which the plan reads at every
    run (their owner writes them in place, before a run or a replan). No window, causal rule,
    mask or new keys: ``run`` takes ``k``/``v`` of the right shapes but reads neither. The
    rest as :func:`plan_extend`'s (``kv_dtype``: an fp8 cache, its scales given to ``run``;
    ``fp8_products`` the opt-in fp8 products); either two-stage kernel."""
    device = resolve_device(device)
    cu = host_ints("cu_seqlens", cu_seqlens)
    prefix = host_ints("prefix_lens", prefix_lens)
    check_extend_lengths(cu, prefix, None)
    max_tokens = cu[-1] if max_tokens is None else max_tokens
    check_int("max_tokens", max_tokens, cu[-1])
    for name, t in zip(("key_lo", "key_hi"), key_ranges):
        expect(name, t, torch.int32, device.index if device.type == "cuda" else -1, (), 1)
        if t.shape[0] < max_tokens:
            raise ValueError(f"{name} has {t.shape[0]} entries, the plan holds {max_tokens} "
                             "tokens")
    return build_extend_plan(
        cu, prefix, None, to_device(cu, device), to_device(prefix, device), None, len(prefix),
        num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
        head_dim_v=head_dim_v, page_size=page_size, window_left=None, window_right=None,
        causal=False, softcap=softcap, scale=scale, keys="prefix", return_lse=return_lse,
        deterministic=False, kv_dtype=kv_dtype, dtype=dtype, device=device, hopper=hopper,
        bounds=bounds, config=config, max_tokens=max_tokens, fp8_products=fp8_products,
        key_ranges=tuple(key_ranges))


def check_one_shot(q, k, v, k_cache, v_cache, block_table, cu_seqlens, prefix_lens,
                   mask_indptr):
    """The sizes a one-shot call's inputs share (check_agree): each is the value most of the
    tensors carrying it give, so the tensor named is the one that differs from the others,
    not the one checked second; of two that differ (v and v_cache on the value head dim, the
    caches on the page size) the error names both. The batch size is len(prefix_lens),
    len(cu_seqlens) - 1 and len(mask_indptr) - 1, and the block table's rows where they
    equal one of these (it may have more). q's dtype is k's and v's. The outputs, sinks,
    mask and scales are checked against these sizes afterwards: the inputs set them."""
    check_agree("token count", (("q", q, 3, 0), ("k", k, 3, 0), ("v", v, 3, 0)))
    kv_heads = check_agree("KV head count", (("k", k, 3, 1), ("v", v, 3, 1),
                                             ("k_cache", k_cache, 4, 2),
                                             ("v_cache", v_cache, 4, 2)))
    check_agree("head dim", (("q", q, 3, 2), ("k", k, 3, 2), ("k_cache", k_cache, 4, 3)))
    check_agree("value head dim", (("v", v, 3, 2), ("v_cache", v_cache, 4, 3)))
    check_agree("page size", (("k_cache", k_cache, 4, 1), ("v_cache", v_cache, 4, 1)))
    check_agree("page count", (("k_cache", k_cache, 4, 0), ("v_cache", v_cache, 4, 0)))
    check_agree("batch size", (("prefix_lens", prefix_lens, 1, 0),
                               ("cu_seqlens", cu_seqlens, 1, 0, 1),
                               ("mask_indptr", mask_indptr, 1, 0, 1),
                               ("block_table", block_table, 2, 0, 0, False)))
    check_heads(q, kv_heads, "k, v, k_cache and v_cache")
    check_new_dtype(q, k, v)


def extend_plan_for(q, k, v, k_cache, v_cache, block_table, cu_seqlens, prefix_lens, *,
                    window_left=None, window_right=None, causal=True, softcap=0.0, scale=None,
                    mask_indptr=None, keys="all", return_lse=False, deterministic=False,
                    attention_chunk=None, positions=None, ring_table=False, hopper=None,
                    bounds="tight", config=None):
    """The plan of a one-shot call: sizes from the tensors, and the lengths as the device
    tensors given, which it neither reads nor copies (no host sync: the kernels read them
    at launch). Their values are the caller's to keep consistent (as FlashAttention's
    ``cu_seqlens``); :func:`plan_extend` checks them. A Hopper plan falls back to the
    Triton kernel when the copy engine cannot take these tensors' strides."""
    options = (window_left, window_right, causal, softcap, scale, keys, return_lse,
               deterministic, hopper, bounds, attention_chunk, positions is None, ring_table)
    key = None
    if not isinstance(config, dict):
        # What the plan's choices depend on: sizes, dtype, device, the options (their types
        # too: 3 and 3.0 hash alike) and the strides (whether the copy engine takes them).
        # A call with the key of an earlier one skips the checks its run repeats.
        try:
            key = ("extend", q.shape[1:], q.dtype, q.get_device() if q.is_cuda else -1,
                   k.shape[1:], v.shape[1:], k_cache.shape[1:], k_cache.dtype, prefix_lens.shape[0],
                   None if mask_indptr is None else mask_indptr.dtype, options,
                   tuple(map(type, options)), config, q.stride(), k.stride(), v.stride(),
                   k_cache.stride(), v_cache.stride())
            hit = ONE_SHOT.get(key)
        except (AttributeError, IndexError, TypeError):
            key = hit = None  # not tensors (or options not hashable): the checks below say
    else:
        hit = None
    if hit is None or key[3] < 0:  # (non-CUDA tensors: checked every call)
        expect_first("q", q, 3)
        for name, t, dim in (("k", k, 3), ("v", v, 3), ("k_cache", k_cache, 4)):
            check_rank(name, t, dim)
    device = q.device
    dev = q.get_device()
    expect("cu_seqlens", cu_seqlens, torch.int32, dev, (), 1)
    expect("prefix_lens", prefix_lens, torch.int32, dev, (), 1)
    if mask_indptr is not None:
        check_rank("mask_indptr", mask_indptr, 1)
        if mask_indptr.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"mask_indptr must be torch.int32 or torch.int64, "
                            f"got {mask_indptr.dtype}")
        expect("mask_indptr", mask_indptr, mask_indptr.dtype, dev, (), 1)
    if positions is not None:
        # (one a row of q: read by the kernels only, as the lengths)
        expect("positions", positions, torch.int32, dev, (q.shape[0],))
    if hit is None or prefix_lens.shape[0] + 1 != cu_seqlens.shape[0] or (
            mask_indptr is not None and mask_indptr.shape[0] != cu_seqlens.shape[0]):
        # (A hit's other sizes are an earlier call's, which agreed: its run checks the rest,
        # with this check first where any fails, so a call's error is the same every time.)
        check_one_shot(q, k, v, k_cache, v_cache, block_table, cu_seqlens, prefix_lens,
                       mask_indptr)
    if hit is not None:
        spec, path, launches, ready = hit
        return ExtendPlan(spec, path, device, q.dtype, cu_seqlens, prefix_lens, mask_indptr,
                          launches=launches, ready=ready, positions=positions)
    check_cache_dtype(k_cache, q.dtype)
    kwargs = dict(num_q_heads=q.shape[1], num_kv_heads=k.shape[1], head_dim=q.shape[2],
                  head_dim_v=v.shape[2], page_size=k_cache.shape[1], window_left=window_left,
                  window_right=window_right, causal=causal, softcap=softcap, scale=scale,
                  keys=keys, return_lse=return_lse, deterministic=deterministic,
                  kv_dtype=k_cache.dtype, dtype=q.dtype, device=device, bounds=bounds,
                  config=config, max_tokens=None, attention_chunk=attention_chunk,
                  positions=positions, ring_table=ring_table)
    if k.shape[1] < 1:
        raise ValueError(f"k must have at least one head, got shape {tuple(k.shape)}")
    plan = build_extend_plan(None, None, None, cu_seqlens, prefix_lens, mask_indptr,
                        prefix_lens.shape[0], hopper=hopper, **kwargs)
    if plan.path == "hopper" and hopper is None:
        from ..ops import extend_hopper
        if isinstance(extend_hopper.descriptors(plan.spec.config, q, k, v, k_cache, v_cache), str):
            plan = build_extend_plan(None, None, None, cu_seqlens, prefix_lens, mask_indptr,
                                prefix_lens.shape[0], hopper=False, **kwargs)
    remember(key, (plan.spec, plan.path, plan._launches, plan._ready))
    return plan
