"""The decode plan: :func:`plan_decode` and :class:`DecodePlan` (see :mod:`swattn.plan`), and
the plan of a one-shot call (:func:`decode_plan_for`)."""

import torch

from ..ops import config as _config
from ..ops import decode as _decode
from ..ops._common import kernel_scale
from ..ops._launch import relaunch
from ..ops._validate import (
    check_int,
    check_lengths,
    check_num_splits,
    check_pages_read,
    check_sparse,
    check_window,
    expect,
    host_ints,
)
from ..ops.merge import MergeLaunch
from ..window import check_chunk, decode_bounds
from ._common import (
    ONE_SHOT,
    Plan,
    TensorArg,
    check_agree,
    check_cache_dtype,
    check_common,
    check_heads,
    check_rank,
    check_scales,
    check_tensors,
    expect_first,
    pages_needed,
    remember,
    replace_spec,
    resolve_device,
    run_key,
    scale_args,
    to_device,
)


class DecodePlan(Plan):
    """One batch's decode attention, planned: made by :func:`plan_decode`.

    Attributes: ``path`` (``"hopper"``, ``"latent"`` or ``"triton"``: the kernel every run
    launches), ``config`` (the Triton kernel's, or the Hopper path's; a latent plan's own
    tiling is ``spec.latent_config``), ``num_splits`` (the split-KV chunks per sequence and
    KV head), ``batch`` (the capacity ``replan`` keeps), and the device buffer ``seq_lens``
    the kernels read.

    The latent path (sm_90; 576/512 heads, many query heads a KV head: DeepSeek's MLA) reads
    the values as the keys' first ``head_dim_v`` columns, so its runs take ``v_cache =
    k_cache[..., :head_dim_v]`` (and the sparse pool's values likewise): a run with separate
    values raises a ValueError, never a silent change of kernel; plan with ``hopper=False``
    for them. A one-shot call (:func:`decode_plan_for`) sees its tensors and takes the latent
    path only where they are so."""

    def __init__(self, spec, path, device, dtype, batch, seq_lens, sparse_keys, host=None,
                 launches=None):
        super().__init__(spec, path, device, dtype, launches, "decode_hopper")
        self.num_splits = spec.num_splits
        self.batch = batch
        self.seq_lens = seq_lens
        self.sparse_keys = sparse_keys
        self._hq = hq = spec.num_kv_heads * spec.group
        s, kv = spec, spec.kv_dtype
        # The run's tensors (:meth:`_tensors`): the K cache's pages fix the V cache's, the
        # sparse K pool's rows the V pool's.
        self.table = (
            TensorArg("q", dtype, (batch, hq, s.head_dim)),
            TensorArg("k_cache", kv, ("pages", s.page_size, s.num_kv_heads, s.head_dim)),
            TensorArg("v_cache", kv, ("pages", s.page_size, s.num_kv_heads, s.head_dim_v)),
            TensorArg("block_table", torch.int32, (None, None)),
            TensorArg("sinks", torch.float32, (hq,), optional=True),
            TensorArg("out", dtype, (batch, hq, s.head_dim_v), optional=True),
            *((TensorArg("lse", torch.float32, (batch, hq), optional=True),)
              if s.return_lse else ()))
        self._sparse_table = (
            TensorArg("sparse k_pool", kv, ("pool", s.num_kv_heads, s.head_dim)),
            TensorArg("sparse v_pool", kv, ("pool", s.num_kv_heads, s.head_dim_v)),
            TensorArg("sparse idx", torch.int32, (batch, sparse_keys)))
        self._readable = host is not None
        self._pages_needed = self._needed(host) if host else 0
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
        tensors = self._tensors(q, k_cache, v_cache, block_table, sinks, out, lse)
        key = None
        if out is not None and (lse is not None or not self.spec.return_lse):
            # As ExtendPlan.run: the tensors of an earlier run, its launches (the sparse
            # pool's and index list's among them: their contents are the kernels' to mask).
            try:
                key = self.relaunch_key(tensors, k_scale, v_scale, sparse)
                ready = self._ready.get(key)
            except (AttributeError, RuntimeError, TypeError):
                key = ready = None  # not plain tensors: the checks below say
            if ready is not None and relaunch(*ready):
                return (out, lse) if self.spec.return_lse else out
        if sparse is not None or k_scale is not None or v_scale is not None \
                or not self._fits(tensors, block_table):
            # (scales are checked here every run that has them; a relaunch skips it all)
            self._check(tensors, q, k_cache, v_cache, block_table, sparse, k_scale, v_scale)
        s, batch = self.spec, self.batch
        if out is None:
            out = torch.empty(batch, self._hq, s.head_dim_v, dtype=self.dtype, device=q.device)
        if s.return_lse and lse is None:
            lse = torch.empty(batch, self._hq, dtype=torch.float32, device=q.device)
        if batch:
            scales, strides = scale_args(k_scale, v_scale, self._unit)
            # A latent cache's values are read from its key tiles (the latent path, or the
            # Triton kernel).
            v_in_k = self.path != "hopper" and _decode.values_in_keys(self.spec, k_cache, v_cache,
                                                                      sparse)
            if self.path == "latent" and not v_in_k:
                raise ValueError(
                    "v_cache must be the keys' first head_dim_v columns (v_cache = "
                    "k_cache[..., :head_dim_v], and the sparse pool's likewise): the plan took "
                    "the latent path, which reads the values from the key tiles; make the plan "
                    "with hopper=False for separate values")
            launch, merge = self._launch(sinks is not None, sparse is not None, strides, v_in_k)
            if self.path == "hopper":
                ready = launch(batch, q, k_cache, block_table, self.seq_lens, sinks, out, lse,
                               self._parts,
                               self._hopper.lazy_descriptors(self.spec.config, q, k_cache, v_cache),
                               scales)
            else:
                ready = launch(batch, q, k_cache, v_cache, block_table, self.seq_lens, sinks,
                               sparse, out, lse, self._parts, scales)
            ready = (ready,)
            if merge is not None:
                ready += (merge(*self._merged, sinks, out, lse),)
            if key is not None and None not in ready:
                self._remember(key, ready)
        return (out, lse) if s.return_lse else out

    def _tensors(self, q, k_cache, v_cache, block_table, sinks, out, lse):
        """A run's tensors in the order of the plan's table (the lse where the plan returns
        it)."""
        tensors = (q, k_cache, v_cache, block_table, sinks, out)
        return (tensors + (lse,)) if self.spec.return_lse else tensors

    def relaunch_key(self, tensors, k_scale, v_scale, sparse):
        """The relaunch key of a run (plan._common.run_key) of the table's ``tensors``,
        the scales, the sparse keys and the lengths' buffer."""
        return run_key(tensors + (k_scale, v_scale) + (() if sparse is None else tuple(sparse))) + (
            sparse is None, self.seq_lens.data_ptr())

    def _length_problem(self, block_table):
        """What the planned lengths need of the block table that it lacks (a sentence), or
        None."""
        if block_table.shape[0] != self.batch or block_table.shape[1] < self._pages_needed:
            return (f"block_table must be [{self.batch}, >= {self._pages_needed}] (sequences, "
                    f"pages the planned lengths need), got {tuple(block_table.shape)}")
        return None

    def _check(self, tensors, q, k_cache, v_cache, block_table, sparse, k_scale, v_scale):
        """The run's arguments one by one, raising the error that names what is wrong."""
        if not self._readable:
            # A one-shot call's plan: as ExtendPlan._check's.
            check_one_shot(q, k_cache, v_cache, block_table, self.seq_lens, sparse)
        check_sparse(sparse)
        if sparse is not None and self.sparse_keys == 0:
            raise ValueError("sparse keys given, but the plan was made with sparse_keys=0")
        self._check_tensors(tensors, block_table)
        if sparse is not None:
            check_tensors(self._sparse_table, sparse, self._index)
        check_scales(k_scale, v_scale, self.kv_dtype, self.spec.num_kv_heads, self._index)

    def _launch(self, has_sinks, has_sparse, scale_strides, v_in_k=False):
        """``(kernel launch, split merge or None)`` of a run with or without sinks and
        sparse keys, an fp8 cache's scales per tensor or per KV head, and values read from
        the key tiles or not (bound once each)."""
        key = (has_sinks, has_sparse, scale_strides, v_in_k)
        bound = self._launches.get(key)
        if bound is None:
            spec = replace_spec(self.spec, has_sinks=has_sinks, has_sparse=has_sparse,
                                scale_strides=scale_strides, v_in_k=v_in_k)
            if self.path == "hopper":
                launch = self._hopper.HopperDecodeLaunch(spec, self.dtype)
            elif self.path == "latent" and v_in_k:
                from ..ops import decode_latent
                launch = decode_latent.LatentDecodeLaunch(spec, (self.dtype, self.kv_dtype))
            else:
                launch = _decode.DecodeLaunch(spec, (self.dtype, self.kv_dtype))
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
        self._pages_needed = self._needed(lens)
        self._ready.clear()  # the runs' checks depend on the lengths

    def _needed(self, lens):
        """The block-table columns these lengths need (plan._common.pages_needed)."""
        s = self.spec
        return pages_needed([(x, x - 1) for x in lens], s.page_size,
                            (s.window_left, s.attention_chunk) if s.ring else False)


def _decode_plan(lens, seq_lens_t, batch, *, num_q_heads, num_kv_heads, head_dim, head_dim_v,
                 page_size, window_left, softcap, scale, num_splits, return_lse, kv_dtype,
                 sparse_keys, max_keys, dtype, device, hopper, bounds, config,
                 attention_chunk=None, ring_table=False, latent_path=True):
    """The plan of :func:`plan_decode` and of a one-shot call; ``latent_path`` False: not the
    latent path (a one-shot call whose values are not its keys' columns)."""
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    check_common(num_q_heads, num_kv_heads, head_dim, head_dim_v, page_size, softcap, scale,
                  dtype, kv_dtype, hopper, bounds)
    check_window(window_left)
    check_chunk(attention_chunk)
    if attention_chunk is not None:
        max_keys = min(max_keys, attention_chunk)
    check_num_splits(num_splits)
    check_int("sparse_keys", sparse_keys, 0)
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    group = num_q_heads // num_kv_heads
    cfg = _config.decode_config(head_dim, head_dim_v, group, dtype, device, kv_dtype)
    if isinstance(config, dict) and not hopper:
        cfg = replace_spec(cfg, **config)
    elif config is not None and not isinstance(config, dict):
        cfg = config
    want = hopper
    if hopper is None:
        # Short windows keep the Triton kernel (C-A, 129 keys: HopperDecodeConfig.min_keys).
        want = (cfg.hopper and config is None
                and max_keys >= _config.hopper_decode_config(head_dim, dtype).min_keys)
    path = "triton"
    kv_dtype = dtype if kv_dtype is None else kv_dtype
    latent = None
    if hopper is not False and config is None and latent_path:
        # A latent cache's many query heads a KV head: the Gluon latent path, whose runs
        # read the values as the keys' first columns (DecodePlan.run refuses others).
        from ..ops import decode_latent
        tiling = _config.LatentDecodeConfig()
        if decode_latent.unsupported(device, dtype, head_dim, head_dim_v, group, kv_dtype,
                                     tiling) is None:
            path, latent, want = "latent", tiling, False
    if want:
        from ..ops import decode_hopper
        reason = decode_hopper.unsupported(device, dtype, head_dim, head_dim_v, group, page_size,
                                           kv_dtype)
        if reason is None and sparse_keys:
            reason = "it takes no sparse keys"
        if reason is not None and hopper:
            raise ValueError(f"hopper=True: the Hopper path cannot take this plan: {reason}")
        if reason is None:
            path = "hopper"
            cfg = _config.hopper_decode_config(head_dim, dtype, kv_dtype)
            if hopper and isinstance(config, dict):
                cfg = replace_spec(cfg, **config)  # (hopper=True: the dict is this path's)
                problem = decode_hopper.config_problem(cfg, head_dim, head_dim_v, group,
                                                       page_size, kv_dtype)
                if problem is not None:
                    raise ValueError(f"config: {problem}")
    sms = (torch.cuda.get_device_properties(device).multi_processor_count
           if device.type == "cuda" else _config.DECODE_CPU_SMS)
    tiling = cfg if latent is None else latent
    programs = num_kv_heads * _config.head_blocking(tiling, group)[1]
    if num_splits is None:
        num_splits = tiling.splits(batch, programs, max_keys + sparse_keys, sms)
    if (path == "hopper" and _config.is_fp8(kv_dtype, dtype)
            and not (isinstance(config, dict) and "items" in config)):
        cfg = replace_spec(cfg, items=cfg.items_for(batch * programs * num_splits, sms))
    # The split merge by PDL where the launch can take it: CUDA (not HIP) on sm_90 or later.
    pdl = (num_splits > 1 and device.type == "cuda" and torch.version.hip is None
           and torch.cuda.get_device_capability(device)[0] >= 9)
    spec = _decode.DecodeSpec(
        head_dim=head_dim, head_dim_v=head_dim_v, group=group, num_kv_heads=num_kv_heads,
        page_size=page_size, config=cfg, window_left=window_left, softcap=float(softcap),
        qk_scale=kernel_scale(head_dim ** -0.5 if scale is None else float(scale), softcap),
        num_splits=num_splits, return_lse=return_lse, pdl=pdl, bounds=bounds, kv_dtype=kv_dtype,
        latent_config=latent, attention_chunk=attention_chunk, ring=bool(ring_table))
    return DecodePlan(spec, path, device, dtype, batch, seq_lens_t, sparse_keys, lens)


def plan_decode(seq_lens, *, num_q_heads, num_kv_heads, head_dim, head_dim_v=None, page_size,
                window_left=None, softcap=0.0, scale=None, num_splits=None, return_lse=False,
                kv_dtype=None, sparse_keys=0, block_table=None, num_pages=None,
                dtype=torch.bfloat16, device=None, hopper=None, bounds="tight", config=None,
                attention_chunk=None, ring_table=False):
    """Plan the decode attention of one batch (see :class:`DecodePlan`).

    Args:
        seq_lens: [B] tokens in each sequence's cache, the new one included (host list or
            tensor; a GPU tensor is read back once).
        num_q_heads, num_kv_heads, head_dim, head_dim_v, page_size: the layer's sizes.
        window_left, softcap, scale, return_lse, attention_chunk: as
            :func:`swattn.decode_attention`'s.
        num_splits: split-KV chunks per sequence and KV head; None chooses from the batch,
            the keys the window (or, without one, the longest sequence) holds, and the GPU's
            SM count. ``replan`` keeps it.
        sparse_keys: K of the ``sparse`` index list each run will pass (0: none).
        kv_dtype: the cache's dtype where it differs from the queries': ``torch.float8_e4m3fn``
            or ``torch.float8_e5m2`` (the cache holds value / scale; ``run`` takes the scales).
        block_table, num_pages: a host copy of the block table and the cache's page count:
            every entry a query will read is checked here, once.
        ring_table: ring block tables, as :func:`plan_extend`'s.
        dtype, device: the queries' dtype and device (``device`` as
            :func:`plan_extend`'s: None picks CUDA, or the CPU under the interpreter).
        hopper, bounds, config: as :func:`plan_extend`'s.
    """
    device = resolve_device(device)
    lens = host_ints("seq_lens", seq_lens)
    check_lengths("seq_lens", lens)
    if block_table is not None:
        if num_pages is None:
            raise ValueError("num_pages (the cache's page count) is needed to check block_table")
        check_window(window_left)
        check_chunk(attention_chunk)
        reads = [(decode_bounds(x, window_left, attention_chunk)[0] // page_size,
                  -(-x // page_size)) for x in lens]
        check_pages_read(block_table, num_pages, reads, ring=ring_table)
    longest = max(lens, default=0)
    max_keys = longest if window_left is None else min(window_left + 1, longest)
    return _decode_plan(
        lens, to_device(lens, device), len(lens), num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads, head_dim=head_dim, head_dim_v=head_dim_v, page_size=page_size,
        window_left=window_left, softcap=softcap, scale=scale, num_splits=num_splits,
        return_lse=return_lse, kv_dtype=kv_dtype, sparse_keys=sparse_keys, max_keys=max_keys,
        dtype=dtype, device=device, hopper=hopper, bounds=bounds, config=config,
        attention_chunk=attention_chunk, ring_table=ring_table)


def check_one_shot(q, k_cache, v_cache, block_table, seq_lens, sparse):
    """The sizes a one-shot call's inputs share, as extend's ``check_one_shot``: the batch
    size is q's, seq_lens', the block table's and the sparse index's rows; the sparse pool
    shares the cache's heads and head dims."""
    pool = tuple(sparse) if isinstance(sparse, (tuple, list)) and len(sparse) == 3 else (None,) * 3
    k_pool, v_pool, idx = pool
    check_agree("batch size", (("q", q, 3, 0), ("seq_lens", seq_lens, 1, 0),
                               ("block_table", block_table, 2, 0), ("sparse idx", idx, 2, 0)))
    kv_heads = check_agree("KV head count", (("k_cache", k_cache, 4, 2), ("v_cache", v_cache, 4, 2),
                                             ("sparse k_pool", k_pool, 3, 1),
                                             ("sparse v_pool", v_pool, 3, 1)))
    check_agree("head dim", (("q", q, 3, 2), ("k_cache", k_cache, 4, 3),
                             ("sparse k_pool", k_pool, 3, 2)))
    check_agree("value head dim", (("v_cache", v_cache, 4, 3), ("sparse v_pool", v_pool, 3, 2)))
    check_agree("page size", (("k_cache", k_cache, 4, 1), ("v_cache", v_cache, 4, 1)))
    check_agree("page count", (("k_cache", k_cache, 4, 0), ("v_cache", v_cache, 4, 0)))
    check_agree("pool size", (("sparse k_pool", k_pool, 3, 0), ("sparse v_pool", v_pool, 3, 0)))
    names = "k_cache, v_cache and the sparse pool" if sparse is not None else "k_cache and v_cache"
    check_heads(q, kv_heads, names)


def decode_plan_for(q, k_cache, v_cache, block_table, seq_lens, *, window_left=None, softcap=0.0,
                    scale=None, sparse=None, num_splits=None, return_lse=False, hopper=None,
                    bounds="tight", config=None, attention_chunk=None, ring_table=False):
    """The plan of a one-shot call: sizes from the tensors, ``seq_lens`` the device tensor
    given, neither read nor copied (no host sync); the split count from the window, or the
    block table's capacity without one. Lengths are the caller's to keep consistent with
    the block table; :func:`plan_decode` checks them. A Hopper plan falls back to the
    Triton kernel when the copy engine cannot take these tensors' strides."""
    options = (window_left, softcap, scale, num_splits, return_lse, hopper, bounds,
               attention_chunk, ring_table)
    key = hit = None
    if not isinstance(config, dict) and (sparse is None or type(sparse) is tuple):
        # As extend_plan_for's; the block table's width sets the keys of a full window.
        try:
            key = ("decode", q.shape, q.dtype, q.get_device() if q.is_cuda else -1, k_cache.dtype,
                   k_cache.shape[1:],
                   v_cache.shape[1:], block_table.shape[1],
                   0 if sparse is None else sparse[2].shape[1], options,
                   tuple(map(type, options)), config, q.stride(), k_cache.stride(),
                   v_cache.stride(), _latent_views(k_cache, v_cache, sparse))
            hit = ONE_SHOT.get(key)
        except (AttributeError, IndexError, TypeError, ValueError):
            key = hit = None  # the checks below say what is wrong
    if hit is None or key[3] < 0:  # (non-CUDA tensors: checked every call)
        expect_first("q", q, 3)
        for name, t, dim in (("k_cache", k_cache, 4), ("v_cache", v_cache, 4),
                             ("block_table", block_table, 2)):
            check_rank(name, t, dim)
    dev = q.get_device()
    expect("seq_lens", seq_lens, torch.int32, dev, (), 1)
    sparse_keys = 0
    check_sparse(sparse)
    if sparse is not None:
        check_rank("sparse idx", sparse[2], 2)
        sparse_keys = sparse[2].shape[1]
    if hit is None or seq_lens.shape[0] != q.shape[0]:
        # (As extend_plan_for's: a hit's run checks the rest, this check first.)
        check_one_shot(q, k_cache, v_cache, block_table, seq_lens, sparse)
    if hit is not None:
        spec, path, launches, _ = hit
        return DecodePlan(spec, path, q.device, q.dtype, q.shape[0], seq_lens, sparse_keys,
                          launches=launches)
    check_cache_dtype(k_cache, q.dtype)
    capacity = block_table.shape[1] * k_cache.shape[1]
    max_keys = capacity if window_left is None or not isinstance(window_left, int) \
        else min(window_left + 1, capacity)
    num_kv_heads = k_cache.shape[2]
    kwargs = dict(num_q_heads=q.shape[1], num_kv_heads=num_kv_heads, head_dim=q.shape[2],
                  head_dim_v=v_cache.shape[3], page_size=k_cache.shape[1], window_left=window_left,
                  softcap=softcap, scale=scale, num_splits=num_splits, return_lse=return_lse,
                  kv_dtype=k_cache.dtype, sparse_keys=sparse_keys, max_keys=max_keys, dtype=q.dtype,
                  device=q.device, bounds=bounds, config=config, attention_chunk=attention_chunk,
                  ring_table=ring_table)
    if num_kv_heads < 1:
        raise ValueError(f"k_cache must have at least one head, got shape {tuple(k_cache.shape)}")
    plan = _decode_plan(None, seq_lens, q.shape[0], hopper=hopper, **kwargs)
    if plan.path == "latent" and not _decode.values_in_keys(plan.spec, k_cache, v_cache, sparse):
        # The latent path reads the values from the key tiles: these are not there.
        plan = _decode_plan(None, seq_lens, q.shape[0], hopper=hopper, latent_path=False,
                            **kwargs)
    if plan.path == "hopper" and hopper is None:
        from ..ops import decode_hopper
        if isinstance(decode_hopper.descriptors(plan.spec.config, q, k_cache, v_cache), str):
            plan = _decode_plan(None, seq_lens, q.shape[0], hopper=False, **kwargs)
    # (its runs' launches are not shared: each one-shot plan has its own split scratch)
    remember(key, (plan.spec, plan.path, plan._launches, None))
    return plan


def _latent_views(k_cache, v_cache, sparse):
    """What of a one-shot call's tensors decides whether its values are its keys' columns
    (ops.decode.values_in_keys) beside the shapes and strides its key holds: the addresses
    of the values against the keys', and the sparse pool's strides."""
    pairs = ((k_cache, v_cache),) if sparse is None else ((k_cache, v_cache), sparse[:2])
    return tuple((k.data_ptr() == v.data_ptr(), k.stride(), v.stride()) for k, v in pairs)
