"""Decode attention: one new token per sequence over its window of the paged cache.

The query of sequence b sits at ``seq_lens[b] - 1`` and sees the keys
``[window.decode_first_key(S, L), S)``: exactly ``L + 1`` once the sequence is long enough.
Keys are gathered row by row through the block table, so the tiles start at the window's
first key, unaligned: a window of L + 1 keys costs ``ceil((L + 1) / BLOCK_N)`` tiles, and
no block-table entry below the window or past the end is loaded (the page-index load is
masked with the keys).

One program owns (sequence, KV head, split) and every query head of the KV group: the
q block is [BLOCK_H, D] (rows past the group masked), so each K/V tile is read once for
the group and both products are tensor-core dots with the group as M. With split-KV
(flash-decoding) the program's key tiles are one contiguous chunk of the sequence's tiles,
the chunking computed in the kernel from ``seq_lens`` (no host sync, CUDA-graph safe): each
split writes a sink-free partial (out, lse) to scratch and ``merge.launch_merge`` combines
them, applying the sinks once; on sm_90 the merge is launched as a programmatic dependent
(PDL) of this kernel, so it can start as soon as every program of this one has.
``sparse=(k_pool, v_pool, idx)`` adds up to K pool rows per sequence to the same softmax as
extra key tiles after the window's, chunked over the splits with them.

``bounds="skip"``/``"none"`` let the chunk of split 0 start at position 0 (on the grid of
the window's first key) and skip, or compute under the mask, the tiles below the window;
the chunking is the same in all three, so they are bit-identical for every split count.

On sm_90, :func:`prepare` hands long windows and full attention to the Gluon path
(:mod:`.decode_hopper`: the pages by TMA, a producer warp, two programs an SM) where the
launch can take it; ``hopper=`` overrides the choice.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra import cuda as tl_cuda

from ._common import decode_first_key, finish, kernel_scale, load_rows, scores_log2, softmax_step
from ._validate import DecodeArgs, check_decode
from .config import (DECODE_CPU_SMS, HOPPER_MIN_KEYS, decode_config, decode_splits, dot_side,
                     head_blocking, hopper_decode_splits, split_width)
from .merge import launch_merge

BOUNDS = ("tight", "skip", "none")
# The window loop carries the next tile's block-table entries (CARRY, _window_tiles) with
# 3 stages or more, where it buys the K/V copies a second buffer; with 2 they have one
# either way and the entries are loaded where they are used. None: that rule; True/False
# force it (scripts/probes/decode_probe.py).
CARRY_PAGES = None
# The split-KV merge is launched by PDL where the GPU takes it (sm_90+); False: without
# (scripts/probes/decode_probe.py).
MERGE_PDL = None


@triton.jit
def _attend(b_q, b_k, b_q2, b_k2, b_v, m_key, m_i, l_i, acc, qk_scale, softcap,
            USE_SOFTCAP: tl.constexpr, SPLIT_D: tl.constexpr):
    """Fold one key tile into the state; keys outside ``m_key`` get logit -inf (their rows
    were loaded as 0, so unwritten cache rows never reach the row max). With SPLIT_D the
    head's tail columns (b_q2, b_k2) add a second product."""
    qk = tl.dot(b_q, tl.trans(b_k))  # [BH, BN]
    if SPLIT_D:
        qk = tl.dot(b_q2, tl.trans(b_k2), qk)
    s, scale = scores_log2(qk, qk_scale, softcap, USE_SOFTCAP)
    s = tl.where(m_key[None, :], s, float("-inf"))
    return softmax_step(s, scale, b_v, m_i, l_i, acc)


@triton.jit
def _load_key(p, rows, o_d, m_d, o_d2, m_d2, EVEN_D: tl.constexpr, EVEN_D2: tl.constexpr,
              SPLIT_D: tl.constexpr):
    """A key tile's rows (``p``: [BN] row pointers) as its main columns and, with SPLIT_D,
    its tail columns (else the main part again, unused)."""
    b_k = load_rows(p[:, None] + o_d[None, :], rows, m_d, EVEN_D)  # [BN, BD]
    if SPLIT_D:
        b_k2 = load_rows(p[:, None] + o_d2[None, :], rows, m_d2, EVEN_D2)  # [BN, BD2]
    else:
        b_k2 = b_k
    return b_k, b_k2


@triton.jit
def _pages(p_table, k_pos, lo, seq_len, page_size):
    """The block-table entries of the keys at ``k_pos``; only those of visible keys
    ``[lo, seq_len)`` are loaded (0 for the others)."""
    return tl.load(p_table + k_pos // page_size, mask=(k_pos >= lo) & (k_pos < seq_len), other=0)


@triton.jit
def _window_tiles(start, stop, b_q, b_q2, m_i, l_i, acc, i_seq, i_kvh, lo, seq_len, block_table,
                  stride_bt, page_size, K_cache, V_cache, stride_kcp, stride_kcs, stride_kch,
                  stride_vcp, stride_vcs, stride_vch, qk_scale, softcap, o_n, o_d, o_d2, o_dv,
                  m_d, m_d2, m_dv, BLOCK_N: tl.constexpr, USE_SOFTCAP: tl.constexpr,
                  SKIP: tl.constexpr, EVEN_D: tl.constexpr, EVEN_D2: tl.constexpr,
                  EVEN_DV: tl.constexpr, SPLIT_D: tl.constexpr, CARRY: tl.constexpr):
    """Window tiles [start, stop): cached keys at absolute positions, the visible ones
    ``[lo, seq_len)`` loaded through the block table.

    With CARRY each iteration loads the block-table entries of the next tile and carries
    them: the K/V row addresses then come from the loop's own state, not from a load in
    the same iteration, so with ``num_stages`` s the pipeliner gives the K/V copies s - 1
    shared buffers and issues them s - 1 tiles ahead (entries loaded in the iteration
    that uses them hold each copy to one buffer, waited on before its tile's products).
    Either way only the entries of visible keys are loaded: the masks are the keys'.
    """
    p_table = block_table + i_seq * stride_bt
    if CARRY:
        page = _pages(p_table, start + o_n, lo, seq_len, page_size)
    for start_n in range(start, stop, BLOCK_N):
        k_pos = start_n + o_n
        m_key = (k_pos >= lo) & (k_pos < seq_len)
        if CARRY:
            page_next = _pages(p_table, k_pos + BLOCK_N, lo, seq_len, page_size)
        if SKIP:
            needed = tl.max(m_key.to(tl.int32), 0) > 0
        else:
            needed = True
        if needed:
            if not CARRY:
                page = _pages(p_table, k_pos, lo, seq_len, page_size)
            row = page.to(tl.int64)
            offset = k_pos % page_size
            slot_k = row * stride_kcp + offset * stride_kcs + i_kvh * stride_kch
            slot_v = row * stride_vcp + offset * stride_vcs + i_kvh * stride_vch
            b_k, b_k2 = _load_key(K_cache + slot_k, m_key, o_d, m_d, o_d2, m_d2, EVEN_D, EVEN_D2,
                                  SPLIT_D)
            b_v = load_rows(V_cache + slot_v[:, None] + o_dv[None, :], m_key, m_dv, EVEN_DV)  # [BN, BDV]
            m_i, l_i, acc = _attend(b_q, b_k, b_q2, b_k2, b_v, m_key, m_i, l_i, acc, qk_scale,
                                    softcap, USE_SOFTCAP, SPLIT_D)
        if CARRY:
            page = page_next
    return m_i, l_i, acc


@triton.jit
def _sparse_tiles(start, stop, b_q, b_q2, m_i, l_i, acc, i_seq, i_kvh, Idx, stride_ib, num_sparse,
                  K_pool, V_pool, stride_kpn, stride_kph, stride_vpn, stride_vph, qk_scale, softcap,
                  o_n, o_d, o_d2, o_dv, m_d, m_d2, m_dv, BLOCK_N: tl.constexpr,
                  USE_SOFTCAP: tl.constexpr, EVEN_D: tl.constexpr, EVEN_D2: tl.constexpr,
                  EVEN_DV: tl.constexpr, SPLIT_D: tl.constexpr):
    """Sparse tiles [start, stop) of ``idx[i_seq]``: pool rows ``idx >= 0``; -1 (and the
    entries past K) are never dereferenced."""
    for start_n in range(start, stop, BLOCK_N):
        o_i = start_n + o_n
        row = tl.load(Idx + i_seq * stride_ib + o_i, mask=o_i < num_sparse, other=-1)
        m_key = row >= 0
        row = row.to(tl.int64)
        b_k, b_k2 = _load_key(K_pool + row * stride_kpn + i_kvh * stride_kph, m_key, o_d, m_d,
                              o_d2, m_d2, EVEN_D, EVEN_D2, SPLIT_D)
        b_v = load_rows(V_pool + (row * stride_vpn + i_kvh * stride_vph)[:, None] + o_dv[None, :],
                         m_key, m_dv, EVEN_DV)  # [BN, BDV]
        m_i, l_i, acc = _attend(b_q, b_k, b_q2, b_k2, b_v, m_key, m_i, l_i, acc, qk_scale,
                                softcap, USE_SOFTCAP, SPLIT_D)
    return m_i, l_i, acc


@triton.jit
def _decode_kernel(
    Q, K_cache, V_cache, block_table, seq_lens, sinks, K_pool, V_pool, Idx, Out, Lse,
    Part_o, Part_lse,
    stride_qb, stride_qh, stride_kcp, stride_kcs, stride_kch, stride_vcp, stride_vcs, stride_vch,
    stride_bt, stride_kpn, stride_kph, stride_vpn, stride_vph, stride_ib,
    stride_ob, stride_oh, stride_lb, stride_pb, stride_ph, stride_ps, stride_plb, stride_plh,
    page_size, num_sparse, num_splits, head_programs, qk_scale, softcap, window_left,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr,
    SPLIT_D: tl.constexpr, BLOCK_DV: tl.constexpr, GROUP: tl.constexpr, BLOCK_H: tl.constexpr, HEAD_BLOCKS: tl.constexpr, BLOCK_N: tl.constexpr,
    USE_WINDOW: tl.constexpr, HAS_SINKS: tl.constexpr, USE_SOFTCAP: tl.constexpr,
    HAS_SPARSE: tl.constexpr, WRITE_PARTIAL: tl.constexpr, RETURN_LSE: tl.constexpr,
    TIGHT: tl.constexpr, SKIP: tl.constexpr, CARRY: tl.constexpr, HEADS_FIRST: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        # The merge, launched as this kernel's programmatic dependent, may start once every
        # program has: its programs wait for this kernel's end before reading the parts.
        tl_cuda.gdc_launch_dependents()
    # SPLIT_D: the head is BLOCK_D columns and a tail of at most BLOCK_D2 (576 = 512 + 64),
    # two products instead of one padded to the next power of two.
    EVEN_D: tl.constexpr = BLOCK_D <= D
    EVEN_D2: tl.constexpr = BLOCK_D + BLOCK_D2 == D
    EVEN_DV: tl.constexpr = DV == BLOCK_DV
    # HEADS_FIRST: axis 0 runs over (sequence, head block), the head block fastest, so a
    # sequence's programs start side by side and read its pages' rows (every KV head of a
    # token is one contiguous run) together; else the sequence is axis 0. A group wider
    # than BLOCK_H (a wide head: q and the K/V tiles would not fit in shared memory) is cut
    # into HEAD_BLOCKS blocks of query heads, each its own program.
    if HEADS_FIRST:
        i_seq = (tl.program_id(0) // head_programs).to(tl.int64)
        i_head = tl.program_id(0) % head_programs
        i_split = tl.program_id(1)
    else:
        i_seq = tl.program_id(0).to(tl.int64)
        i_head = tl.program_id(1)
        i_split = tl.program_id(2)
    i_kvh = i_head.to(tl.int64) // HEAD_BLOCKS
    i_hb = i_head % HEAD_BLOCKS
    o_h = i_hb * BLOCK_H + tl.arange(0, BLOCK_H)  # rows: query heads within the group
    o_n = tl.arange(0, BLOCK_N)
    o_d = tl.arange(0, BLOCK_D)
    o_d2 = BLOCK_D + tl.arange(0, BLOCK_D2)
    o_dv = tl.arange(0, BLOCK_DV)
    m_h = o_h < GROUP
    m_d = o_d < D
    m_d2 = o_d2 < D
    m_dv = o_dv < DV
    head = i_kvh * GROUP + o_h  # [BH]

    seq_len = tl.load(seq_lens + i_seq)
    lo = 0
    if USE_WINDOW:
        lo = decode_first_key(seq_len, window_left)
    # The sequence's key tiles: the window's, then the sparse keys'; split i_split owns
    # the contiguous run [t_start, t_stop) of them.
    window_tiles = (seq_len - lo + BLOCK_N - 1) // BLOCK_N
    total_tiles = window_tiles
    if HAS_SPARSE:
        total_tiles = window_tiles + (num_sparse + BLOCK_N - 1) // BLOCK_N
    per_split = (total_tiles + num_splits - 1) // num_splits
    t_start = tl.minimum(i_split * per_split, total_tiles)
    t_stop = tl.minimum(t_start + per_split, total_tiles)

    p_q = Q + i_seq * stride_qb + head[:, None] * stride_qh
    b_q = load_rows(p_q + o_d[None, :], m_h, m_d, EVEN_D)  # [BH, BD]
    b_q2 = b_q
    if SPLIT_D:
        b_q2 = load_rows(p_q + o_d2[None, :], m_h, m_d2, EVEN_D2)  # [BH, BD2]
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], tl.float32)

    start = lo + tl.minimum(t_start, window_tiles) * BLOCK_N
    stop = lo + tl.minimum(t_stop, window_tiles) * BLOCK_N
    if not TIGHT:
        # Split 0 walks from the tile holding position 0 on the grid of lo (nothing
        # below lo is visible: those tiles are skipped or computed fully masked).
        if t_start == 0:
            start = lo - (lo + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    m_i, l_i, acc = _window_tiles(
        start, stop, b_q, b_q2, m_i, l_i, acc, i_seq, i_kvh, lo, seq_len, block_table, stride_bt,
        page_size, K_cache, V_cache, stride_kcp, stride_kcs, stride_kch, stride_vcp, stride_vcs,
        stride_vch, qk_scale, softcap, o_n, o_d, o_d2, o_dv, m_d, m_d2, m_dv, BLOCK_N,
        USE_SOFTCAP, SKIP, EVEN_D, EVEN_D2, EVEN_DV, SPLIT_D, CARRY)
    if HAS_SPARSE:
        sparse_start = (tl.maximum(t_start, window_tiles) - window_tiles) * BLOCK_N
        sparse_stop = (tl.maximum(t_stop, window_tiles) - window_tiles) * BLOCK_N
        m_i, l_i, acc = _sparse_tiles(
            sparse_start, sparse_stop, b_q, b_q2, m_i, l_i, acc, i_seq, i_kvh, Idx, stride_ib,
            num_sparse, K_pool, V_pool, stride_kpn, stride_kph, stride_vpn, stride_vph, qk_scale,
            softcap, o_n, o_d, o_d2, o_dv, m_d, m_d2, m_dv, BLOCK_N, USE_SOFTCAP, EVEN_D, EVEN_D2,
            EVEN_DV, SPLIT_D)

    if WRITE_PARTIAL:
        # A sink-free partial state; the merge applies the sinks once.
        o, lse = finish(acc, m_i, l_i, 0.0, False)
        p_o = Part_o + i_seq * stride_pb + head[:, None] * stride_ph + i_split * stride_ps + o_dv[None, :]
        tl.store(p_o, o, mask=m_h[:, None] & m_dv[None, :])
        tl.store(Part_lse + i_seq * stride_plb + head * stride_plh + i_split, lse, mask=m_h)
    else:
        sink_log2 = 0.0
        if HAS_SINKS:
            sink_log2 = tl.load(sinks + head, mask=m_h, other=0.0) * 1.4426950408889634
        o, lse = finish(acc, m_i, l_i, sink_log2, HAS_SINKS)
        p_o = Out + i_seq * stride_ob + head[:, None] * stride_oh + o_dv[None, :]
        tl.store(p_o, o.to(Out.dtype.element_ty), mask=m_h[:, None] & m_dv[None, :])
        if RETURN_LSE:
            tl.store(Lse + i_seq * stride_lb + head, lse, mask=m_h)


def decode_attention(q, k_cache, v_cache, block_table, seq_lens, **kwargs):
    """Launcher of the decode kernel (see swattn.decode_attention for the arguments, and
    :func:`prepare` for the launcher-only ones)."""
    launch, out, lse = prepare(q, k_cache, v_cache, block_table, seq_lens, **kwargs)
    launch()
    return (out, lse) if kwargs.get("return_lse") else out


def prepare(q, k_cache, v_cache, block_table, seq_lens, *, window_left=None, sinks=None,
            softcap=0.0, scale=None, sparse=None, num_splits=None, return_lse=False, out=None,
            lse=None, bounds="tight", block_n=None, config=None, hopper=None):
    """Validate once (one small host sync), allocate what is missing (``out``, ``lse``, the
    split scratch) and return ``(launch, out, lse)``: ``launch()`` runs the kernel(s) on
    these tensors with no host sync and no allocation, so it can be called again or
    captured in a CUDA graph, with ``seq_lens`` (and the block table) changed in place as
    long as every length still fits the block table and the pages it names.

    ``lse`` is an optional [B, Hq] float32 buffer for ``return_lse``; ``bounds`` picks the
    loop-bound variant; ``block_n`` or a whole ``config`` override the config function.
    Keep ``launch`` as long as a graph captured from it is replayed: it owns the split
    scratch, which the graph does not keep alive.

    ``hopper`` overrides the config's choice of the Gluon fast path
    (:mod:`.decode_hopper`, sm_90): True demands it (a ValueError says why a launch cannot
    take it), False keeps the Triton kernel; by default the config's ``hopper`` where the
    launch can take it.
    """
    if bounds not in BOUNDS:
        raise ValueError(f"bounds must be one of {BOUNDS}, got {bounds!r}")
    if hopper not in (None, True, False):
        raise TypeError(f"hopper must be None or a bool, got {hopper!r}")
    a = check_decode(q, k_cache, v_cache, block_table, seq_lens, window_left=window_left,
                     sinks=sinks, softcap=softcap, scale=scale, sparse=sparse,
                     num_splits=num_splits, out=out)
    cfg = config or decode_config(a.head_dim, a.head_dim_v, a.group, q.dtype, q.device)
    capacity = block_table.shape[1] * a.page_size
    max_keys = capacity if window_left is None else min(window_left + 1, capacity)
    use_hopper = hopper
    if hopper is None:
        # Short windows keep the Triton kernel (C-A, 129 keys: 8.9 us against 9.2).
        use_hopper = cfg.hopper and block_n is None and max_keys >= HOPPER_MIN_KEYS
    if use_hopper:
        from . import decode_hopper
        reason = decode_hopper.unsupported(q, k_cache, v_cache,
                                           sparse if a.sparse_keys > 0 else None, a.group)
        if reason is not None and hopper:
            raise ValueError(f"hopper=True: the Hopper path cannot take this launch: {reason}")
        use_hopper = reason is None
    if use_hopper:
        block_n = decode_hopper.BLOCK_N
        blocking = (decode_hopper.BLOCK_M, 1)
    else:
        block_n = block_n or cfg.block_n
        blocking = head_blocking(cfg, a.group)  # (BLOCK_H, head blocks), once for every launch
    on_gpu = q.device.type == "cuda"
    if num_splits is None:
        sms = (torch.cuda.get_device_properties(q.device).multi_processor_count
               if on_gpu else DECODE_CPU_SMS)
        programs = a.num_kv_heads * blocking[1]
        chooser = hopper_decode_splits if use_hopper else decode_splits
        num_splits = chooser(a.batch, programs, max_keys + a.sparse_keys, sms, block_n)
    if out is None:
        out = torch.empty(a.batch, a.num_q_heads, a.head_dim_v, dtype=q.dtype, device=q.device)
    if return_lse and lse is None:
        lse = torch.empty(a.batch, a.num_q_heads, dtype=torch.float32, device=q.device)
    elif not return_lse:
        lse = None
    # PDL where the launch can take it: CUDA (not HIP) on sm_90 or later.
    pdl = (num_splits > 1 and on_gpu and torch.version.hip is None and MERGE_PDL is not False
           and torch.cuda.get_device_capability(q.device)[0] >= 9)
    parts = None
    if num_splits > 1:
        part_o = torch.empty(a.batch, a.num_q_heads, num_splits, a.head_dim_v, dtype=torch.float32,
                             device=q.device)
        part_lse = torch.empty(a.batch, a.num_q_heads, num_splits, dtype=torch.float32, device=q.device)
        parts = (part_o, part_lse)

    qk_scale = kernel_scale(a.scale, softcap)
    descs = decode_hopper.descriptors(q, k_cache, v_cache) if use_hopper else None
    # [B, Hq, S, Dv] seen as S parts of [B, Hq, Dv]: the merge reads them in place; a split
    # that saw no key wrote a finite 0.
    merged = (parts[0].permute(2, 0, 1, 3), parts[1].permute(2, 0, 1)) if parts else None

    def launch():
        if a.batch == 0:
            return
        if use_hopper:
            decode_hopper.launch(a, q, k_cache, block_table, seq_lens, window_left, sinks,
                                 softcap, qk_scale, (num_splits, pdl), out, lse, parts, bounds,
                                 descs)
        else:
            _launch(a, q, k_cache, v_cache, block_table, seq_lens, window_left, sinks, softcap,
                    sparse, (num_splits, pdl), out, lse, parts, bounds, block_n, cfg, blocking,
                    qk_scale)
        if merged is not None:
            launch_merge(*merged, sinks, out, lse, finite=True, pdl=pdl)

    return launch, out, lse


def _launch(a: DecodeArgs, q, k_cache, v_cache, block_table, seq_lens, window_left, sinks,
            softcap, sparse, splitting, out, lse, parts, bounds, block_n, cfg, blocking, qk_scale):
    """The Triton kernel's launch on validated arguments, batch > 0 (the caller launches
    the split merge): no host sync, no allocation. ``splitting``: (splits, whether the
    merge is launched by PDL)."""
    num_splits, pdl = splitting
    use_softcap = softcap > 0
    has_sparse = sparse is not None and a.sparse_keys > 0
    k_pool, v_pool, idx = sparse if has_sparse else (q, q, seq_lens)
    part_o, part_lse = parts if parts is not None else (out, out)
    block_h, head_blocks = blocking
    block_d, block_d2 = split_width(a.head_dim)
    head_programs = a.num_kv_heads * head_blocks
    grid = ((a.batch * head_programs, num_splits) if cfg.heads_first
            else (a.batch, head_programs, num_splits))
    _decode_kernel[grid](
        Q=q, K_cache=k_cache, V_cache=v_cache, block_table=block_table, seq_lens=seq_lens,
        sinks=sinks if sinks is not None else q, K_pool=k_pool, V_pool=v_pool, Idx=idx,
        Out=out, Lse=lse if lse is not None else out, Part_o=part_o, Part_lse=part_lse,
        stride_qb=q.stride(0), stride_qh=q.stride(1),
        stride_kcp=k_cache.stride(0), stride_kcs=k_cache.stride(1), stride_kch=k_cache.stride(2),
        stride_vcp=v_cache.stride(0), stride_vcs=v_cache.stride(1), stride_vch=v_cache.stride(2),
        stride_bt=block_table.stride(0), stride_kpn=k_pool.stride(0), stride_kph=k_pool.stride(1),
        stride_vpn=v_pool.stride(0), stride_vph=v_pool.stride(1), stride_ib=idx.stride(0),
        stride_ob=out.stride(0), stride_oh=out.stride(1),
        stride_lb=lse.stride(0) if lse is not None else 0,
        stride_pb=part_o.stride(0), stride_ph=part_o.stride(1), stride_ps=part_o.stride(2),
        stride_plb=part_lse.stride(0), stride_plh=part_lse.stride(1),
        page_size=a.page_size, num_sparse=a.sparse_keys, num_splits=num_splits,
        head_programs=head_programs,
        qk_scale=qk_scale, softcap=float(softcap), window_left=window_left or 0,
        D=a.head_dim, DV=a.head_dim_v, BLOCK_D=block_d, BLOCK_D2=block_d2 or 16,
        SPLIT_D=block_d2 > 0, BLOCK_DV=dot_side(a.head_dim_v), GROUP=a.group, BLOCK_H=block_h,
        HEAD_BLOCKS=head_blocks, BLOCK_N=block_n, USE_WINDOW=window_left is not None,
        HAS_SINKS=sinks is not None,
        USE_SOFTCAP=use_softcap, HAS_SPARSE=has_sparse, WRITE_PARTIAL=parts is not None,
        RETURN_LSE=lse is not None, TIGHT=bounds == "tight", SKIP=bounds == "skip",
        CARRY=cfg.num_stages > 2 if CARRY_PAGES is None else CARRY_PAGES,
        HEADS_FIRST=cfg.heads_first, PDL=pdl, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
