"""write_kv: store the new tokens' keys and values into their pages of the paged cache.

``slot_mapping[t] = page * page_size + offset`` is token t's flat slot; -1 skips the token
(a padded row, or a token whose cache entry another layer owns), and so does any slot
outside the cache, which is never written (the slots are not read back to the host: a
write waits for nothing; the page such a slot names is not a page of the cache, so a read
of it through the block table comes out NaN). One program per token
copies its [Hkv, D] key and [Hkv, Dv] value rows bit for bit, so an extend that reads
them back from the cache sees exactly the k/v it was handed (the deterministic path
relies on it). An fp8 cache is written ``value / scale`` (``k_scale``, ``v_scale``: one
value or one a KV head), saturated to the format's largest finite value and rounded to
the nearest fp8 value, ties to even (:func:`._common.fp8_cached`).
"""

import torch
import triton
import triton.language as tl

from .. import window
from ._common import fp8_cached, launch_extents, new_lengths
from ._launch import Launch
from ._validate import FP8_DTYPES, check_tensor

_UNITS = {}  # device -> a float32 1.0 there: the scale of an fp8 cache given none
_TL_FP8 = {torch.float8_e4m3fn: tl.float8e4nv, torch.float8_e5m2: tl.float8e5}


def unit_scale(device):
    """A float32 tensor [1] holding 1.0 on ``device``, made once a device: what an fp8
    cache given no scale takes (write_kv, and every plan, one-shot ones too)."""
    unit = _UNITS.get(device)
    if unit is None:
        unit = _UNITS[device] = torch.ones(1, dtype=torch.float32, device=device)
    return unit


@triton.jit
def _write_kv_kernel(K, V, K_cache, V_cache, slot_mapping, k_scale, v_scale,
                     stride_kt, stride_kh, stride_vt, stride_vh,
                     stride_kcp, stride_kcs, stride_kch, stride_vcp, stride_vcs, stride_vch,
                     page_size, num_kv_heads, num_slots,
                     D: tl.constexpr, DV: tl.constexpr, BLOCK_H: tl.constexpr,
                     BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, K_SCALE_STRIDE: tl.constexpr,
                     V_SCALE_STRIDE: tl.constexpr, CODES: tl.constexpr = None):
    # CODES (NewRowsLaunch): the fp8 format whose values go to fp16 rows (else None: the
    # rows are stored in K_cache's type).
    i_t = tl.program_id(0).to(tl.int64)
    if slot_mapping is None:
        slot = i_t  # token t to slot t (NewRowsLaunch)
    else:
        slot = tl.load(slot_mapping + i_t)
    if (slot >= 0) & (slot < num_slots):
        page = slot // page_size
        offset = slot % page_size
        o_h = tl.arange(0, BLOCK_H)
        o_d = tl.arange(0, BLOCK_D)
        o_dv = tl.arange(0, BLOCK_DV)
        m_k = (o_h < num_kv_heads)[:, None] & (o_d < D)[None, :]
        m_v = (o_h < num_kv_heads)[:, None] & (o_dv < DV)[None, :]
        b_k = tl.load(K + i_t * stride_kt + o_h[:, None] * stride_kh + o_d[None, :],
                      mask=m_k)  # [BH, BD]
        b_v = tl.load(V + i_t * stride_vt + o_h[:, None] * stride_vh + o_dv[None, :],
                      mask=m_v)  # [BH, BDV]
        if K_cache.dtype.element_ty.is_fp8() or CODES is not None:
            ks = tl.load(k_scale + o_h * K_SCALE_STRIDE, mask=o_h < num_kv_heads, other=1.0)
            vs = tl.load(v_scale + o_h * V_SCALE_STRIDE, mask=o_h < num_kv_heads, other=1.0)
            fmt_k: tl.constexpr = K_cache.dtype.element_ty if CODES is None else CODES
            fmt_v: tl.constexpr = V_cache.dtype.element_ty if CODES is None else CODES
            b_k = fp8_cached(b_k, ks[:, None], fmt_k)
            b_v = fp8_cached(b_v, vs[:, None], fmt_v)
            if CODES is not None:
                b_k = b_k.to(tl.float16)
                b_v = b_v.to(tl.float16)
        tl.store(K_cache + page * stride_kcp + offset * stride_kcs + o_h[:, None] * stride_kch
                 + o_d[None, :], b_k, mask=m_k)
        tl.store(V_cache + page * stride_vcp + offset * stride_vcs + o_h[:, None] * stride_vch
                 + o_dv[None, :], b_v, mask=m_v)


def check_write_kv(k, v, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None):
    check_tensor("k", k, dim=3, dtypes=(torch.float16, torch.bfloat16, torch.float32), first=True)
    num_tokens, num_kv_heads, head_dim = k.shape
    check_tensor("v", v, dim=3, dtype=k.dtype, device=k.device,
                 shape=(num_tokens, num_kv_heads, None))
    cache_dtype = k_cache.dtype if k_cache.dtype in FP8_DTYPES else k.dtype
    check_tensor("k_cache", k_cache, dim=4, dtype=cache_dtype, device=k.device,
                 shape=(None, None, num_kv_heads, head_dim))
    check_tensor("v_cache", v_cache, dim=4, dtype=cache_dtype, device=k.device,
                 shape=(k_cache.shape[0], k_cache.shape[1], num_kv_heads, v.shape[2]))
    check_tensor("slot_mapping", slot_mapping, dim=1, dtype=torch.int64, device=k.device,
                 shape=(num_tokens,))
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if scale is None:
            continue
        if cache_dtype not in FP8_DTYPES:
            raise ValueError(f"{name} applies to fp8 caches; k_cache is {k_cache.dtype}")
        check_tensor(name, scale, dtype=torch.float32, device=k.device)
        if scale.dim() > 1 or scale.numel() not in (1, num_kv_heads):
            raise ValueError(f"{name} must be [] or [1] (per tensor) or [{num_kv_heads}] (per KV "
                             f"head), got shape {tuple(scale.shape)}")


def write_kv(k, v, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None):
    """Store ``k [T, Hkv, D]`` and ``v [T, Hkv, Dv]`` at ``slot_mapping [T] int64`` (flat slots
    ``page * page_size + offset``, -1 or a slot outside the cache skips) of
    ``k_cache``/``v_cache`` ``[num_pages, page_size, Hkv, D | Dv]``; an fp8 cache is written
    ``value / scale`` (``k_scale``/``v_scale`` float32 [] or [1] or [Hkv]; None = 1),
    saturated, rounded to nearest even. Checks the tensors' shapes and dtypes first; reads
    no value back."""
    check_write_kv(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    if k.shape[0] == 0:
        return
    fp8 = k_cache.dtype in FP8_DTYPES
    if fp8:
        k_scale = unit_scale(k.device) if k_scale is None else k_scale
        v_scale = unit_scale(k.device) if v_scale is None else v_scale
    _write_kv_kernel[(k.shape[0],)](
        K=k, V=v, K_cache=k_cache, V_cache=v_cache, slot_mapping=slot_mapping, k_scale=k_scale,
        v_scale=v_scale, K_SCALE_STRIDE=int(fp8 and k_scale.numel() > 1),
        V_SCALE_STRIDE=int(fp8 and v_scale.numel() > 1),
        stride_kt=k.stride(0), stride_kh=k.stride(1), stride_vt=v.stride(0), stride_vh=v.stride(1),
        stride_kcp=k_cache.stride(0), stride_kcs=k_cache.stride(1), stride_kch=k_cache.stride(2),
        stride_vcp=v_cache.stride(0), stride_vcs=v_cache.stride(1), stride_vch=v_cache.stride(2),
        page_size=k_cache.shape[1], num_kv_heads=k.shape[1],
        num_slots=k_cache.shape[0] * k_cache.shape[1], D=k.shape[2], DV=v.shape[2],
        BLOCK_H=triton.next_power_of_2(k.shape[1]), BLOCK_D=triton.next_power_of_2(k.shape[2]),
        BLOCK_DV=triton.next_power_of_2(v.shape[2]),
    )


class NewRowsLaunch:
    """The new tokens' ``k``/``v`` ``[T, Hkv, D | Dv]`` as an fp8 cache stores them, into
    ``[T, Hkv, D | Dv]`` buffers (row t: token t): write_kv's kernel, for an extend whose
    kernel then reads the new keys as it reads the cache's (the Hopper path). The buffers
    are of the cache's dtype, or with ``codes`` (the cache's fp8 dtype) fp16 holding the
    same values (exact: every e4m3 and e5m2 value is an fp16 one); ``dtypes``: the
    tensors' dtypes, part of the launch's key. Bound once for a plan's shape and scale
    strides; a call launches without a host sync and returns what ``ops._launch.relaunch``
    takes, or None."""

    def __init__(self, num_kv_heads, head_dim, head_dim_v, scale_strides, dtypes, codes=None):
        fixed = dict(slot_mapping=None, page_size=1, num_kv_heads=num_kv_heads, D=head_dim,
                     DV=head_dim_v, BLOCK_H=triton.next_power_of_2(num_kv_heads),
                     BLOCK_D=triton.next_power_of_2(head_dim),
                     BLOCK_DV=triton.next_power_of_2(head_dim_v),
                     K_SCALE_STRIDE=scale_strides[0], V_SCALE_STRIDE=scale_strides[1],
                     CODES=None if codes is None else _TL_FP8[codes])
        self.launch = Launch(_write_kv_kernel, fixed, {},
                             ("K", "V", "K_cache", "V_cache", "k_scale", "v_scale"),
                             ("stride_kt", "stride_kh", "stride_vt", "stride_vh", "stride_kcp",
                              "stride_kcs", "stride_kch", "stride_vcp", "stride_vcs",
                              "stride_vch", "num_slots"), dtypes)

    def __call__(self, k, v, k_rows, v_rows, scales):
        tokens = k.shape[0]
        if tokens == 0:
            return None
        ks, vs, kr, vr = k.stride(), v.stride(), k_rows.stride(), v_rows.stride()
        return self.launch((tokens, 1, 1), (k, v, k_rows, v_rows, *scales),
                           (ks[0], ks[1], vs[0], vs[1], kr[0], 0, kr[1], vr[0], 0, vr[1], tokens))


def prefix_rows_base(prefix_len, window_left, block_n):
    """The first position of a sequence's prefix that PrefixRowsLaunch widens: the first
    key tile (tiles of ``block_n`` aligned to 0) holding a key its first new token sees
    (window.first_key_tile at the prefix end). The Hopper extend kernel computes the same
    in its own dialect."""
    return window.first_key_tile(prefix_len, window_left, block_n)


@triton.jit
def _prefix_rows_kernel(K_cache, V_cache, block_table, cu_seqlens, prefix_lens, K_rows, V_rows,
                        stride_bt, stride_kcp, stride_kcs, stride_kch, stride_vcp, stride_vcs,
                        stride_vch, num_seqs, num_pages, window_left, num_tokens, prefix_keys,
                        PAGE: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
                        DV: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr,
                        BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BN: tl.constexpr,
                        SEQS_POW2: tl.constexpr):
    # Program (b, i): rows [b * BLOCK_R, (b + 1) * BLOCK_R) of sequence i's widened prefix,
    # positions base_i + r. A sequence with no new tokens has none (the kernel reads none of
    # its keys; its block-table row need not cover its prefix), nor has one whose lengths
    # are not well formed (_common.new_lengths, as the extend kernel takes them).
    i_s = tl.program_id(1)
    o_s = tl.arange(0, SEQS_POW2)
    m_s = o_s < num_seqs
    new = new_lengths(cu_seqlens, prefix_lens, o_s, m_s, num_tokens, prefix_keys)
    p_all = tl.where(new > 0, tl.load(prefix_lens + o_s, mask=m_s, other=0), 0)
    # window.first_key_tile of every sequence (its primitives take scalars: written out
    # for the vector).
    base_all = tl.maximum(p_all - window_left, 0) // BN * BN
    first = tl.sum(tl.where(o_s < i_s, p_all - base_all, 0))  # the sequence's first row
    p = tl.sum(tl.where(o_s == i_s, p_all, 0))
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    pos = tl.sum(tl.where(o_s == i_s, base_all, 0)) + r
    rows = pos < p
    # A row below the first new token's window (its tile's head) is never seen: its
    # block-table entry is not read, and it is written as a page not read.
    read = rows & (pos >= p - window_left)
    page = tl.load(block_table + i_s.to(tl.int64) * stride_bt + pos // PAGE, mask=read, other=-1)
    ok = ((page >= 0) & (page < num_pages))[:, None, None]
    page = page.to(tl.int64)[:, None, None]
    slot = (pos % PAGE)[:, None, None]
    o_h = tl.arange(0, BLOCK_H)[None, :, None]
    o_d = tl.arange(0, BLOCK_D)[None, None, :]
    o_dv = tl.arange(0, BLOCK_DV)[None, None, :]
    m_k = rows[:, None, None] & (o_h < HKV) & (o_d < D)
    m_v = rows[:, None, None] & (o_h < HKV) & (o_dv < DV)
    b_k = tl.load(K_cache + page * stride_kcp + slot * stride_kcs + o_h * stride_kch + o_d,
                  mask=m_k & ok)
    b_v = tl.load(V_cache + page * stride_vcp + slot * stride_vcs + o_h * stride_vch + o_dv,
                  mask=m_v & ok)
    # A page not read: K NaN (the rows seeing it come out NaN), V 0 (a zero weight times
    # NaN would be NaN), as the kernel's copies of a page left out read.
    b_k = tl.where(ok, b_k.to(tl.float16), float("nan"))
    b_v = tl.where(ok, b_v.to(tl.float16), 0.0)
    row = (first + r).to(tl.int64)[:, None, None]
    tl.store(K_rows + (row * HKV + o_h) * D + o_d, b_k, mask=m_k)
    tl.store(V_rows + (row * HKV + o_h) * DV + o_dv, b_v, mask=m_v)


class PrefixRowsLaunch:
    """The visible prefix of every sequence of an extend under a window, widened from an fp8
    cache into fp16 rows ``[rows, Hkv, D | Dv]`` (the same values, exactly): sequence i's
    positions ``[prefix_rows_base(P_i), P_i)`` one after another, sequence after sequence (none
    for a sequence with no new tokens), for the Hopper extend kernel to copy as 16-bit tiles
    (its prefix's tiles otherwise widened in shared memory, half as much traffic again as a
    16-bit tile's). At most ``window_left + block_n`` rows a sequence (:meth:`capacity`), up to
    8 rows a program. Bound once for a plan; a call launches on the plan's device lengths
    without a host sync and returns what ``ops._launch.relaunch`` takes."""

    def __init__(self, num_seqs, page_size, num_kv_heads, head_dim, head_dim_v, window_left,
                 block_n, dtypes):
        self.num_seqs, self.rows_per_seq = num_seqs, window_left + block_n
        self.window_left = window_left
        block_h = triton.next_power_of_2(num_kv_heads)
        widest = triton.next_power_of_2(max(head_dim, head_dim_v))
        # Rows a program: up to 8, about 8K elements of K and of V in registers (the
        # sequences' row offsets are summed once for them).
        self.block_r = max(1, min(8, 8192 // (block_h * widest)))
        fixed = dict(PAGE=page_size, HKV=num_kv_heads, D=head_dim, DV=head_dim_v,
                     BLOCK_R=self.block_r, BLOCK_H=block_h,
                     BLOCK_D=triton.next_power_of_2(head_dim),
                     BLOCK_DV=triton.next_power_of_2(head_dim_v), BN=block_n,
                     SEQS_POW2=max(triton.next_power_of_2(num_seqs), 2))
        self.launch = Launch(_prefix_rows_kernel, fixed, {},
                             ("K_cache", "V_cache", "block_table", "cu_seqlens", "prefix_lens",
                              "K_rows", "V_rows"),
                             ("stride_bt", "stride_kcp", "stride_kcs", "stride_kch", "stride_vcp",
                              "stride_vcs", "stride_vch", "num_seqs", "num_pages", "window_left",
                              "num_tokens", "prefix_keys"),
                             dtypes)
        self.page_size = page_size

    def capacity(self):
        """The rows the buffers need for any lengths of the plan's sequences."""
        return self.num_seqs * self.rows_per_seq

    def __call__(self, k_cache, v_cache, block_table, cu_seqlens, prefix_lens, k_rows, v_rows,
                 num_tokens):
        """``num_tokens``: the rows of the run's q, which bound its sequences' new tokens."""
        kc, vc = k_cache.stride(), v_cache.stride()
        return self.launch((triton.cdiv(self.rows_per_seq, self.block_r), self.num_seqs, 1),
                           (k_cache, v_cache, block_table, cu_seqlens, prefix_lens, k_rows,
                            v_rows),
                           (block_table.stride(0), kc[0], kc[1], kc[2], vc[0], vc[1], vc[2],
                            self.num_seqs, k_cache.shape[0], self.window_left,
                            *launch_extents(num_tokens, block_table, self.page_size)[:2]))
