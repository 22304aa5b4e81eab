"""A second key source beside the window (DeepSeek-V3.2 and V4): :class:`SecondKeys`, the
plan :func:`plan_second_keys` / :class:`SecondKeysPlan`, and the plan of a one-shot call
(:func:`second_keys_plan_for`).

A row (decode: a sequence's new token; extend: each new token) attends, in one softmax with
the sinks, the keys of its window over the paged cache (and, extending, over the new
tokens' k/v) and the entries of a second paged cache: those of a per-row index list
(``indices``, -1 = none: DeepSeek's lightning indexer, CSA and DSA) or every entry the
row's position has closed at a compression rate (``indices`` None: HCA). Entry ``e`` at
rate ``r`` is visible to the query at ``p`` iff ``e < (p + 1) // r`` and ``e`` is below the
sequence's entry count (window.second_limit); no other entry is read. One kernel serves
both (:func:`swattn.ops.decode.SecondKeysLaunch`).
"""

from dataclasses import dataclass

import torch

from ..ops import config as _config
from ..ops import decode as _decode
from ..ops._common import kernel_scale
from ..ops._validate import (
    FP8_DTYPES,
    check_int,
    check_lengths,
    check_num_splits,
    check_window,
    expect,
    host_ints,
)
from ..ops.merge import MergeLaunch
from ..window import MAX_POSITION, check_chunk
from ._common import (
    Plan,
    TensorArg,
    check_common,
    check_scales,
    check_tensors,
    replace_spec,
    resolve_device,
    scale_args,
    to_device,
)


@dataclass(frozen=True)
class SecondKeys:
    """A second key source, as a run takes it.

    Args:
        cache: [num_pages, page_size, Hkv, D] the second paged cache's keys (the main
            cache's dtype and head dim; its own page size).
        block_table: [B, max_pages] int32: entry ``e`` of sequence ``b`` is slot ``e %
            page_size`` of page ``block_table[b, e // page_size]``. Entries of pages no
            row reads may hold anything (-1); an entry a row must read that is not a page
            of the cache is not read, and that row comes out NaN.
        entries: [B] int32, the entries each sequence's second cache holds (none past them
            is read; a count outside ``[0, keys its table row maps]`` makes the sequence's
            rows NaN). Read on the device only.
        rate: the compression rate: the query at position ``p`` sees entry ``e`` only when
            ``e < (p + 1) // rate`` (rate 1: ordinary tokens, ``e <= p``).
        indices: [rows, K] int32, each row's entries (decode: a row a sequence; extend: a
            row a new token), -1 = none; an index at or past the row's limit is no key
            either (an indexer's pick among fewer entries than K). None: every entry up to
            the limit.
        values: [num_pages, page_size, Hkv, Dv] the entries' values, or None: the keys'
            first Dv columns (K = V, DeepSeek-V4's compressed entries; read once a tile).
        window: False: the rows attend these entries alone, no window over the main cache
            (DeepSeek-V3.2's sparse attention: the second source is then usually the main
            cache itself, at rate 1).
    """

    cache: torch.Tensor
    block_table: torch.Tensor
    entries: torch.Tensor
    rate: int = 1
    indices: torch.Tensor | None = None
    values: torch.Tensor | None = None
    window: bool = True

    @property
    def value_cache(self):
        """The values' cache: ``values``, or the keys (their first Dv columns)."""
        return self.cache if self.values is None else self.values


def _check_source(second):
    if not isinstance(second, SecondKeys):
        raise TypeError(f"second must be a swattn.SecondKeys, got {type(second).__name__}")
    check_int("second.rate", second.rate, 1)
    if not isinstance(second.window, bool):
        raise TypeError(f"second.window must be a bool, got {type(second.window).__name__}")


class SecondKeysPlan(Plan):
    """One batch's rows over their window and a second key source, planned: made by
    :func:`plan_second_keys` (or a one-shot call). ``rows``: decode's sequences or an
    extend's new tokens; ``num_splits``: split-KV chunks a row (decode only); ``path`` is
    ``"triton"``. Its ``run`` reads the lengths from the plan's device buffers and the
    entry counts and index lists from the run's :class:`SecondKeys`: no host sync."""

    def __init__(self, spec, device, dtype, rows, lengths, num_indices, readable):
        super().__init__(spec, "triton", device, dtype, None, None)
        self.rows = rows
        self.lengths = lengths
        self.num_indices = num_indices
        self.num_splits = spec.num_splits
        self._readable = readable
        self._hq = hq = spec.num_kv_heads * spec.group
        kv, heads, d, dv = spec.kv_dtype, spec.num_kv_heads, spec.head_dim, spec.head_dim_v
        batch = self.batch
        # The run's tensors (plan._common.TensorArg): its checks come from here.
        self.table = (
            TensorArg("q", dtype, (rows, hq, d)),
            TensorArg("k_cache", kv, ("pages", spec.page_size, heads, d)),
            TensorArg("v_cache", kv, ("pages", spec.page_size, heads, dv)),
            TensorArg("block_table", torch.int32, (None, None)),
            *((TensorArg("k", dtype, (rows, heads, d)), TensorArg("v", dtype, (rows, heads, dv)))
              if spec.rows else ()),
            TensorArg("second.cache", kv, ("entry pages", "entry page size", heads, d)),
            TensorArg("second.values", kv, ("entry pages", "entry page size", heads, dv),
                      optional=True),
            TensorArg("second.block_table", torch.int32, (None, None)),
            TensorArg("second.entries", torch.int32, (batch,)),
            *((TensorArg("second.indices", torch.int32, (rows, num_indices)),)
              if num_indices else ()),
            TensorArg("sinks", torch.float32, (hq,), optional=True),
            TensorArg("out", dtype, (rows, hq, dv), optional=True),
            *((TensorArg("lse", torch.float32, (rows, hq), optional=True),)
              if spec.return_lse else ()))
        parts = None
        if spec.num_splits > 1:
            parts = (torch.empty(rows, self._hq, spec.num_splits, spec.head_dim_v,
                                 dtype=torch.float32, device=device),
                     torch.empty(rows, self._hq, spec.num_splits, dtype=torch.float32,
                                 device=device))
        self._parts = parts
        self._merged = (parts[0].permute(2, 0, 1, 3), parts[1].permute(2, 0, 1)) if parts else None

    @property
    def batch(self):
        """The sequences the plan's lengths describe."""
        return self.lengths[0].shape[0] if not self.spec.rows else self.lengths[2].shape[0]

    def run(self, q, k_cache, v_cache, block_table, second, *, k=None, v=None, sinks=None,
            k_scale=None, v_scale=None, out=None, lse=None):
        """The rows' attention for one layer; returns ``out`` ([rows, Hq, Dv]), or ``(out,
        lse)`` when the plan returns lse. ``k``, ``v``: an extend's new tokens' keys and
        values ([rows, Hkv, D | Dv]); ``second``: a :class:`SecondKeys` of the plan's
        mode (indexed with the planned K, or not) and rate. Other arguments as
        :func:`swattn.decode_attention`'s. No host sync; no allocation when ``out`` (and
        ``lse``) are given."""
        s = self.spec
        self._check(q, k_cache, v_cache, block_table, second, k, v, sinks, k_scale, v_scale,
                    out, lse)
        if out is None:
            out = torch.empty(self.rows, self._hq, s.head_dim_v, dtype=self.dtype,
                              device=q.device)
        if s.return_lse and lse is None:
            lse = torch.empty(self.rows, self._hq, dtype=torch.float32, device=q.device)
        if not self.rows:
            return (out, lse) if s.return_lse else out
        scales, strides = scale_args(k_scale, v_scale, self._unit)
        pairs = [(k_cache, v_cache), (second.cache, second.value_cache)]
        if s.rows:
            pairs.append((k, v))
        v_in_k = _decode.latent_widths(s.head_dim, s.head_dim_v) and all(
            a.data_ptr() == b.data_ptr() and _decode.same_steps(a, b) for a, b in pairs)
        launch, merge = self._launch(sinks is not None, strides, v_in_k)
        launch(self.rows, q, k_cache, v_cache, block_table, self.lengths,
               (k, v) if s.rows else None,
               (second.cache, second.value_cache, second.block_table, second.entries,
                second.indices), sinks, out, lse, self._parts, scales)
        if merge is not None:
            merge(*self._merged, sinks, out, lse)
        return (out, lse) if s.return_lse else out

    def _launch(self, has_sinks, scale_strides, v_in_k):
        key = (has_sinks, scale_strides, v_in_k)
        bound = self._launches.get(key)
        if bound is None:
            spec = replace_spec(self.spec, has_sinks=has_sinks, scale_strides=scale_strides,
                                v_in_k=v_in_k)
            launch = _decode.SecondKeysLaunch(spec, (self.dtype, self.kv_dtype))
            merge = None
            if spec.num_splits > 1:
                merge = MergeLaunch(spec.num_splits, spec.head_dim_v, has_sinks, spec.return_lse,
                                    True, False, (torch.float32, self.dtype))
            bound = self._launches[key] = (launch, merge)
        return bound

    def _check(self, q, k_cache, v_cache, block_table, second, k, v, sinks, k_scale, v_scale,
               out, lse):
        """The run's arguments one by one (the plan's table, then the second source's mode),
        raising the error that names what is wrong."""
        s = self.spec
        _check_source(second)
        if not s.rows and (k is not None or v is not None):
            raise ValueError("k and v are an extend's new tokens: a decode plan takes none")
        if second.values is None and s.head_dim_v > s.head_dim:
            raise ValueError(f"second.values is None (the values are the keys' first "
                             f"{s.head_dim_v} columns), but the keys have {s.head_dim}: give "
                             "second.values")
        if not self.num_indices and second.indices is not None:
            raise ValueError("second.indices given, but the plan takes every entry up to the "
                             "limit (plan with num_indices=K)")
        new = (k, v) if s.rows else ()
        indices = (second.indices,) if self.num_indices else ()
        check_tensors(self.table, (q, k_cache, v_cache, block_table, *new, second.cache,
                                    second.values, second.block_table, second.entries,
                                    *indices, sinks, out, lse)[:len(self.table)],
                      self._index)
        for name, table in (("block_table", block_table),
                            ("second.block_table", second.block_table)):
            if table.shape[0] != self.batch:
                raise ValueError(f"{name} must have {self.batch} rows (the planned sequences), "
                                 f"got shape {tuple(table.shape)}")
        if second.rate != s.second_rate:
            raise ValueError(f"second.rate must be {s.second_rate} (the plan's), got "
                             f"{second.rate}")
        if second.window != s.window_keys:
            raise ValueError(f"second.window must be {s.window_keys} (the plan's), got "
                             f"{second.window}")
        check_scales(k_scale, v_scale, self.kv_dtype, s.num_kv_heads, self._index)

    def replan(self, seq_lens=None, *, cu_seqlens=None, prefix_lens=None):
        """The next batch's lengths into the plan's buffers, in place (decode: ``seq_lens``
        of at most the planned sequences, padded with empty ones; extend: ``cu_seqlens``
        and ``prefix_lens`` of the planned sequences and no more rows). A CUDA graph
        captured from :meth:`run` replays with them."""
        if not self._readable:
            raise ValueError("this plan was made from device tensors it did not read (a "
                             "one-shot call): make one with plan_second_keys to replan")
        new = _host_lengths(self.spec.rows, seq_lens, cu_seqlens, prefix_lens)
        if self.spec.rows:
            cu, prefix = new
            if len(prefix) != self.batch or cu[-1] > self.rows:
                raise ValueError(f"replan with {len(prefix)} sequences and {cu[-1]} rows: the "
                                 f"plan holds {self.batch} and {self.rows}")
            for buffer, values in zip(self.lengths, (_row_seq(cu, self.rows), cu, prefix)):
                buffer.copy_(torch.tensor(values, dtype=torch.int32), non_blocking=True)
        else:
            lens, = new
            if len(lens) > self.rows:
                raise ValueError(f"replan with {len(lens)} sequences: the plan holds {self.rows}")
            lens = lens + [0] * (self.rows - len(lens))
            self.lengths[0].copy_(torch.tensor(lens, dtype=torch.int32), non_blocking=True)


def _host_lengths(rows, seq_lens, cu_seqlens, prefix_lens):
    """The plan's lengths as host lists, checked: ``(seq_lens,)`` or ``(cu_seqlens,
    prefix_lens)``."""
    if not rows:
        if seq_lens is None or cu_seqlens is not None or prefix_lens is not None:
            raise ValueError("a decode plan takes seq_lens (and no cu_seqlens, prefix_lens)")
        lens = host_ints("seq_lens", seq_lens)
        check_lengths("seq_lens", lens)
        if any(x > MAX_POSITION for x in lens):
            raise ValueError(f"seq_lens must be at most {MAX_POSITION}")
        return (lens,)
    if seq_lens is not None or cu_seqlens is None or prefix_lens is None:
        raise ValueError("an extend plan takes cu_seqlens and prefix_lens (and no seq_lens)")
    cu = host_ints("cu_seqlens", cu_seqlens)
    prefix = host_ints("prefix_lens", prefix_lens)
    check_lengths("prefix_lens", prefix)
    if len(cu) != len(prefix) + 1 or not cu or cu[0] != 0 or any(
            b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"cu_seqlens must be [{len(prefix) + 1}] offsets from 0, "
                         f"non-decreasing, got {cu}")
    if any(p + (b - a) > MAX_POSITION for p, a, b in zip(prefix, cu, cu[1:])):
        raise ValueError(f"positions must stay below {MAX_POSITION}")
    return cu, prefix


def _row_seq(cu, rows):
    """Each row's sequence (rows past the last sequence: the last one, whose rows they are
    not: the kernel's guard makes them NaN)."""
    out = []
    for b in range(len(cu) - 1):
        out += [b] * (cu[b + 1] - cu[b])
    return out + [max(len(cu) - 2, 0)] * (rows - len(out))


def _second_plan(rows, lengths, readable, *, num_q_heads, num_kv_heads, head_dim, head_dim_v,
                 page_size, window_left, attention_chunk, softcap, scale, rate, num_indices,
                 window_keys, num_splits, max_keys, return_lse, kv_dtype, dtype, device, bounds,
                 config, extend):
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    check_common(num_q_heads, num_kv_heads, head_dim, head_dim_v, page_size, softcap, scale,
                 dtype, kv_dtype, None, bounds)
    check_window(window_left)
    check_chunk(attention_chunk)
    check_num_splits(num_splits)
    check_int("rate", rate, 1)
    check_int("num_indices", num_indices, 0)
    if not isinstance(window_keys, bool):
        raise TypeError(f"window must be a bool, got {type(window_keys).__name__}")
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    group = num_q_heads // num_kv_heads
    kv_dtype = dtype if kv_dtype is None else kv_dtype
    cfg = _config.second_keys_config(head_dim, head_dim_v, group, dtype, device, kv_dtype)
    if isinstance(config, dict):
        cfg = replace_spec(cfg, **config)
    elif config is not None:
        cfg = config
    if extend:
        if num_splits not in (None, 1):
            raise ValueError(f"num_splits: an extend's rows are not split, got {num_splits}")
        num_splits = 1
    elif num_splits is None:
        sms = (torch.cuda.get_device_properties(device).multi_processor_count
               if device.type == "cuda" else _config.DECODE_CPU_SMS)
        programs = num_kv_heads * _config.head_blocking(cfg, group)[1]
        num_splits = cfg.splits(rows, programs, max_keys, sms)
    spec = _decode.DecodeSpec(
        head_dim=head_dim, head_dim_v=head_dim_v, group=group, num_kv_heads=num_kv_heads,
        page_size=page_size, config=cfg, window_left=window_left, softcap=float(softcap),
        qk_scale=kernel_scale(head_dim ** -0.5 if scale is None else float(scale), softcap),
        num_splits=num_splits, return_lse=return_lse, bounds=bounds, kv_dtype=kv_dtype,
        attention_chunk=attention_chunk, second="indexed" if num_indices else "causal",
        second_rate=rate, rows=extend, window_keys=window_keys)
    return SecondKeysPlan(spec, device, dtype, rows, lengths, num_indices, readable)


def plan_second_keys(*, seq_lens=None, cu_seqlens=None, prefix_lens=None, num_q_heads,
                     num_kv_heads, head_dim, head_dim_v=None, page_size, rate=1,
                     num_indices=0, max_entries=None, window=True, window_left=None,
                     attention_chunk=None, softcap=0.0, scale=None, num_splits=None,
                     return_lse=False, kv_dtype=None, dtype=torch.bfloat16, device=None,
                     bounds="tight", config=None):
    """Plan one batch's rows over their window and a second key source (see
    :class:`SecondKeysPlan`): decode with ``seq_lens`` ([B], the new token included), or
    extend with ``cu_seqlens`` ([B + 1]) and ``prefix_lens`` ([B]) (host lists or tensors;
    a GPU tensor is read back once).

    Args:
        num_q_heads, num_kv_heads, head_dim, head_dim_v, page_size: the layer's sizes (the
            main cache's page size; the second cache's is its own).
        rate, window: the second source's, as :class:`SecondKeys`'s (every run's must
            agree).
        num_indices: K of each run's ``second.indices`` ([rows, K]); 0: the runs take every
            entry up to the limit (no index list).
        max_entries: the most entries a sequence's second cache will hold (decode's split
            count; default: as many as a full-rate source of the longest sequence).
        window_left, attention_chunk, softcap, scale, return_lse: as
            :func:`swattn.decode_attention`'s (the window applies to the main cache's keys,
            not to the second source's).
        num_splits: decode's split-KV chunks a row (None: chosen from the batch and the
            keys); an extend's rows are not split.
        kv_dtype, dtype, device, bounds, config: as :func:`swattn.plan_decode`'s.
    """
    device = resolve_device(device)
    extend = seq_lens is None
    host = _host_lengths(extend, seq_lens, cu_seqlens, prefix_lens)
    if extend:
        cu, prefix = host
        rows = cu[-1]
        lengths = tuple(_on(device, x) for x in (_row_seq(cu, rows), cu, prefix))
        longest = max((p + b - a for p, a, b in zip(prefix, cu, cu[1:])), default=0)
    else:
        lens, = host
        rows = len(lens)
        lengths = (_on(device, lens),)
        longest = max(lens, default=0)
    window_keys = 0 if not window else (longest if window_left is None
                                        else min(window_left + 1, longest))
    second_keys = num_indices or (longest // rate if max_entries is None else max_entries)
    return _second_plan(
        rows, lengths, True, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
        head_dim=head_dim, head_dim_v=head_dim_v, page_size=page_size, window_left=window_left,
        attention_chunk=attention_chunk, softcap=softcap, scale=scale, rate=rate,
        num_indices=num_indices, window_keys=window, num_splits=num_splits,
        max_keys=window_keys + second_keys, return_lse=return_lse, kv_dtype=kv_dtype,
        dtype=dtype, device=device, bounds=bounds, config=config, extend=extend)


def _on(device, values):
    return to_device(values, device)


def second_keys_plan_for(q, k_cache, v_cache, block_table, second, *, seq_lens=None,
                         cu_seqlens=None, prefix_lens=None, window_left=None,
                         attention_chunk=None, softcap=0.0, scale=None, num_splits=None,
                         return_lse=False, bounds="tight", config=None):
    """The plan of a one-shot call: sizes from the tensors, the lengths the device tensors
    given (neither read nor copied: no host sync; an extend's rows' sequences are found on
    the device). Lengths the kernel's guard finds ill-formed give NaN rows."""
    _check_source(second)
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache),
                    ("block_table", block_table), ("second.cache", second.cache)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 3 or k_cache.dim() != 4 or v_cache.dim() != 4:
        raise ValueError(f"q must be [rows, Hq, D] and k_cache, v_cache [pages, page_size, Hkv, "
                         f"D | Dv], got {tuple(q.shape)}, {tuple(k_cache.shape)}, "
                         f"{tuple(v_cache.shape)}")
    extend = seq_lens is None
    dev = q.get_device()
    if extend:
        expect("cu_seqlens", cu_seqlens, torch.int32, dev, (), 1)
        expect("prefix_lens", prefix_lens, torch.int32, dev, (cu_seqlens.shape[0] - 1,))
        batch = prefix_lens.shape[0]
        positions = torch.arange(q.shape[0], device=q.device, dtype=torch.int32)
        row_seq = torch.searchsorted(cu_seqlens[1:], positions, right=True)
        row_seq = row_seq.clamp_(max=max(batch - 1, 0)).to(torch.int32)
        lengths = (row_seq, cu_seqlens, prefix_lens)
    else:
        if cu_seqlens is not None or prefix_lens is not None:
            raise ValueError("a decode call takes seq_lens (and no cu_seqlens, prefix_lens)")
        expect("seq_lens", seq_lens, torch.int32, dev, (q.shape[0],))
        lengths = (seq_lens,)
    num_kv_heads = k_cache.shape[2]
    if num_kv_heads < 1 or q.shape[1] % num_kv_heads:
        raise ValueError(f"q must have a multiple of {num_kv_heads} heads (k_cache's), got "
                         f"shape {tuple(q.shape)}")
    if k_cache.dtype != q.dtype and k_cache.dtype not in FP8_DTYPES:
        raise TypeError(f"k_cache must be {q.dtype} (the queries' dtype) or fp8, got "
                        f"{k_cache.dtype}")
    indices = second.indices
    num_indices = 0
    if indices is not None:
        if not isinstance(indices, torch.Tensor) or indices.dim() != 2:
            raise ValueError("second.indices must be a [rows, K] int32 tensor or None")
        num_indices = indices.shape[1]
    capacity = block_table.shape[1] * k_cache.shape[1] if block_table.dim() == 2 else 0
    window_keys = 0 if not second.window else (
        capacity if window_left is None or not isinstance(window_left, int)
        else min(window_left + 1, capacity))
    entries = num_indices or (second.block_table.shape[-1] * second.cache.shape[1]
                              if second.cache.dim() == 4 else 0)
    return _second_plan(
        q.shape[0], lengths, False, num_q_heads=q.shape[1], num_kv_heads=num_kv_heads,
        head_dim=q.shape[2], head_dim_v=v_cache.shape[3], page_size=k_cache.shape[1],
        window_left=window_left, attention_chunk=attention_chunk, softcap=softcap, scale=scale,
        rate=second.rate, num_indices=num_indices, window_keys=second.window,
        num_splits=num_splits, max_keys=window_keys + entries, return_lse=return_lse,
        kv_dtype=k_cache.dtype, dtype=q.dtype, device=q.device, bounds=bounds, config=config,
        extend=extend)
