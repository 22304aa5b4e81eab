"""Probe (not part of the library): how fast is workload B's window loop (prefix 0, causal,
window 4095, d128) when the P @ V product of one key tile runs on the tensor cores while the
softmax of the next runs beside it (FlashAttention-3's intra-warpgroup overlap)? Triton 3.6
waits for a score product right after issuing it, so the library's kernel cannot express
this; Gluon (Triton's lower-level language, shipped with 3.6) can: asynchronous warpgroup
MMAs with explicit waits, TMA copies into multi-buffered shared memory, mbarriers.

One query head per 64-row block, 4 warps; k/v dense, or from shuffled pages of 16 rows (one
TMA copy per page into row slices of the tile). Timed in one run (CUDA-graph replay, L2
flushed) against the same Gluon loop without the overlap, scripts/probes/tma_probe.py's
Triton kernel, the library's kernel and FlashInfer on workload B at prefix 0, with a
same-variant control; the probes' outputs checked against a float64 reference on eight rows.
Results: benchmarks/results/2026-12-01-h200-session5/README.md.

    export PYTHONPATH=src; source scripts/peers_path.sh; python3 scripts/probes/gluon_probe.py
"""

import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, "scripts/probes")
import tma_probe  # noqa: E402

from swattn.bench import harness, peers, workloads  # noqa: E402
from swattn.ops import extend  # noqa: E402
from swattn.ops.extend_hopper import _add, _uniform  # noqa: E402


@gluon.jit
def _scores_to_weights(s, m_i, l_i, q_pos, k_pos, window, qk_scale, MASKED: gl.constexpr):
    """Softmax half of one tile: (m, l, p, alpha); rows with nothing visible stay at -inf."""
    if MASKED:
        keep = (k_pos[None, :] <= q_pos[:, None]) & (k_pos[None, :] >= q_pos[:, None] - window)
        s = gl.where(keep, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_safe)
    p = gl.exp2(s * qk_scale - m_safe[:, None])
    l_i = l_i * alpha + gl.sum(p, 1)
    return m_new, l_i, p, alpha


@gluon.jit
def _tile_pages(bt_row, start_n, ok, PAGE: gl.constexpr, PAGED: gl.constexpr):
    """The block-table entries of the 4 pages of the 64-key tile at ``start_n`` (0 where
    not ``ok``), loaded ahead of the copies that use them so their latency is hidden."""
    if PAGED:
        base = bt_row + start_n // PAGE
        pages = (gl.load(base, mask=ok, other=0), gl.load(base + 1, mask=ok, other=0),
                 gl.load(base + 2, mask=ok, other=0), gl.load(base + 3, mask=ok, other=0))
    else:
        pages = (0, 0, 0, 0)
    return pages


@gluon.jit
def _load_tile(desc, row0, start_n, col, bar, dest, ok, pages, PAGE: gl.constexpr,
               BN: gl.constexpr, PAGED: gl.constexpr):
    """One key tile into ``dest``, completing on ``bar``: one copy of BN rows, or PAGED, one
    copy per page of PAGE rows (``desc`` boxes of PAGE rows) into row slices of the tile,
    ``pages`` from :func:`_tile_pages` (BN = 4 pages)."""
    if PAGED:
        for i in gl.static_range(BN // PAGE):
            tma.async_copy_global_to_shared(desc, [pages[i] * PAGE, col], bar,
                                            dest.slice(i * PAGE, PAGE), pred=ok)
    else:
        tma.async_copy_global_to_shared(desc, [row0 + start_n, col], bar, dest, pred=ok)


@gluon.jit
def _window_fwd(q_desc, k_desc, v_desc, O, N, qk_scale, window, block_table, stride_bt,
                cu_seqlens, num_seqs, H: gl.constexpr, HKV: gl.constexpr, BM: gl.constexpr,
                BN: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr,
                MASK_ALL: gl.constexpr, PAGED: gl.constexpr, PAGE: gl.constexpr,
                LOOKUP: gl.constexpr = False):
    pid_m = gl.program_id(0)
    pid_bh = gl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    kvh = h // (H // HKV)
    m0 = pid_m * BM
    row0 = b * N
    if LOOKUP:
        # The library's prologue (ops.extend_hopper): the block's sequence, start and first
        # row found from cu_seqlens by dependent loads and a scan (the same values).
        seq_layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        o_seq = gl.arange(0, 8, layout=seq_layout)
        m_seq = o_seq < num_seqs
        seq_blocks = (gl.load(cu_seqlens + 1 + o_seq, mask=m_seq, other=0)
                      - gl.load(cu_seqlens + o_seq, mask=m_seq, other=0) + BM - 1) // BM
        ends = gl.where(m_seq, gl.associative_scan(seq_blocks, 0, _add), 2147483647)
        i_block = b * (N // BM) + pid_m
        i_seq = _uniform(gl.sum((ends <= i_block).to(gl.int32), 0))
        m0 = _uniform((i_block - gl.sum(gl.where(o_seq < i_seq, seq_blocks, 0), 0)) * BM)
        row0 = _uniform(gl.load(cu_seqlens + i_seq))
        b = i_seq
    bt_row = block_table + b * stride_bt

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    col_o: gl.constexpr = gl.SliceLayout(0, o_layout)

    q_smem = gl.allocate_shared_memory(q_desc.dtype, [BM, D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BN, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BN, D], v_desc.layout)
    bar_q = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    bar_k = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    bar_v = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(bar_q, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(bar_k.index(i), count=1)
        mbarrier.init(bar_v.index(i), count=1)

    lo = gl.maximum(m0 - window, 0) // BN * BN
    n_tiles = (m0 + BM - lo) // BN
    # Tiles every row sees whole: first key >= last row's lowest, last key <= first row.
    full_lo = lo + (gl.maximum(m0 + BM - 1 - window - lo, 0) + BN - 1) // BN * BN
    full_hi = lo + (m0 + 1 - lo) // BN * BN
    tile_bytes: gl.constexpr = BN * D * 2

    mbarrier.expect(bar_q, BM * D * 2)
    tma.async_copy_global_to_shared(q_desc, [row0 + m0, h * D], bar_q, q_smem)
    for i in gl.static_range(STAGES):
        ok = i < n_tiles
        mbarrier.expect(bar_k.index(i), tile_bytes, pred=ok)
        pages = _tile_pages(bt_row, lo + i * BN, ok, PAGE, PAGED)
        _load_tile(k_desc, row0, lo + i * BN, kvh * D, bar_k.index(i), k_smem.index(i), ok, pages,
                   PAGE, BN, PAGED)
        mbarrier.expect(bar_v.index(i), tile_bytes, pred=ok)
        _load_tile(v_desc, row0, lo + i * BN, kvh * D, bar_v.index(i), v_smem.index(i), ok, pages,
                   PAGE, BN, PAGED)
    mbarrier.wait(bar_q, 0)

    q_pos = m0 + gl.arange(0, BM, layout=row_s)
    o_n = gl.arange(0, BN, layout=col_s)
    m_i = gl.full([BM], float("-inf"), gl.float32, layout=row_s)
    l_i = gl.zeros([BM], gl.float32, layout=row_s)
    acc = gl.zeros([BM, D], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BM, BN], gl.float32, layout=s_layout)

    if OVERLAP:
        # Tile 0's scores and softmax; then per tile j: scores of j, product of j - 1 with
        # V issued behind them, wait for the scores only, softmax of j beside the product.
        mbarrier.wait(bar_k.index(0), 0)
        s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False,
                              is_async=True)
        s = warpgroup_mma_wait(0, deps=(s_tok, ))
        ok = STAGES < n_tiles
        mbarrier.expect(bar_k.index(0), tile_bytes, pred=ok)
        _load_tile(k_desc, row0, lo + STAGES * BN, kvh * D, bar_k.index(0), k_smem.index(0), ok,
                   _tile_pages(bt_row, lo + STAGES * BN, ok, PAGE, PAGED), PAGE, BN, PAGED)
        m_i, l_i, p, alpha = _scores_to_weights(s, m_i, l_i, q_pos, lo + o_n, window, qk_scale,
                                                True)
        p_op = gl.convert_layout(p.to(gl.bfloat16), p_layout)
        for j in range(1, n_tiles):
            st = j % STAGES
            prev = (j - 1) % STAGES
            start_n = lo + j * BN
            pages_k = _tile_pages(bt_row, start_n + STAGES * BN, j + STAGES < n_tiles, PAGE, PAGED)
            pages_v = _tile_pages(bt_row, start_n + (STAGES - 1) * BN, j - 1 + STAGES < n_tiles,
                                  PAGE, PAGED)
            mbarrier.wait(bar_k.index(st), (j // STAGES) & 1)
            s_tok = warpgroup_mma(q_smem, k_smem.index(st).permute((1, 0)), s_zero, use_acc=False,
                                  is_async=True)
            mbarrier.wait(bar_v.index(prev), ((j - 1) // STAGES) & 1)
            acc_tok = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
            s = warpgroup_mma_wait(1, deps=(s_tok, ))
            ok = j + STAGES < n_tiles
            mbarrier.expect(bar_k.index(st), tile_bytes, pred=ok)
            _load_tile(k_desc, row0, start_n + STAGES * BN, kvh * D, bar_k.index(st),
                       k_smem.index(st), ok, pages_k, PAGE, BN, PAGED)
            if MASK_ALL:
                m_i, l_i, p, alpha = _scores_to_weights(s, m_i, l_i, q_pos, start_n + o_n, window,
                                                        qk_scale, True)
            elif (start_n >= full_lo) & (start_n < full_hi):
                m_i, l_i, p, alpha = _scores_to_weights(s, m_i, l_i, q_pos, start_n + o_n, window,
                                                        qk_scale, False)
            else:
                m_i, l_i, p, alpha = _scores_to_weights(s, m_i, l_i, q_pos, start_n + o_n, window,
                                                        qk_scale, True)
            acc = warpgroup_mma_wait(0, deps=(acc_tok, ))
            ok = j - 1 + STAGES < n_tiles
            mbarrier.expect(bar_v.index(prev), tile_bytes, pred=ok)
            _load_tile(v_desc, row0, start_n + (STAGES - 1) * BN, kvh * D, bar_v.index(prev),
                       v_smem.index(prev), ok, pages_v, PAGE, BN, PAGED)
            acc = acc * gl.convert_layout(alpha, row_o)[:, None]
            p_op = gl.convert_layout(p.to(gl.bfloat16), p_layout)
        last = (n_tiles - 1) % STAGES
        mbarrier.wait(bar_v.index(last), ((n_tiles - 1) // STAGES) & 1)
        acc_tok = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc_tok, ))
    else:
        # The schedule Triton gives: scores, wait, softmax, product, wait, per tile.
        for j in range(0, n_tiles):
            st = j % STAGES
            start_n = lo + j * BN
            pages = _tile_pages(bt_row, start_n + STAGES * BN, j + STAGES < n_tiles, PAGE, PAGED)
            mbarrier.wait(bar_k.index(st), (j // STAGES) & 1)
            s_tok = warpgroup_mma(q_smem, k_smem.index(st).permute((1, 0)), s_zero, use_acc=False,
                                  is_async=True)
            s = warpgroup_mma_wait(0, deps=(s_tok, ))
            ok = j + STAGES < n_tiles
            mbarrier.expect(bar_k.index(st), tile_bytes, pred=ok)
            _load_tile(k_desc, row0, start_n + STAGES * BN, kvh * D, bar_k.index(st),
                       k_smem.index(st), ok, pages, PAGE, BN, PAGED)
            m_i, l_i, p, alpha = _scores_to_weights(s, m_i, l_i, q_pos, start_n + o_n, window,
                                                    qk_scale, True)
            acc = acc * gl.convert_layout(alpha, row_o)[:, None]
            p_op = gl.convert_layout(p.to(gl.bfloat16), p_layout)
            mbarrier.wait(bar_v.index(st), (j // STAGES) & 1)
            acc_tok = warpgroup_mma(p_op, v_smem.index(st), acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=(acc_tok, ))
            mbarrier.expect(bar_v.index(st), tile_bytes, pred=ok)
            _load_tile(v_desc, row0, start_n + STAGES * BN, kvh * D, bar_v.index(st),
                       v_smem.index(st), ok, pages, PAGE, BN, PAGED)

    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bar_k.index(i))
        mbarrier.invalidate(bar_v.index(i))
    mbarrier.invalidate(bar_q)
    o = acc / gl.convert_layout(l_i, row_o)[:, None]
    rows = (row0 + m0 + gl.arange(0, BM, layout=row_o)).to(gl.int64)
    cols = gl.arange(0, D, layout=col_o)
    gl.store(O + rows[:, None] * (H * D) + h * D + cols[None, :], o.to(gl.bfloat16))


def gluon_launch(q, k, v, out, N, H, HKV, D, W, BM, BN, stages, overlap, mask_all, paged=None,
                 cu_seqlens=None):
    """The launch of one variant; ``paged=(k_cache, v_cache, block_table)`` reads k/v from
    pages of 16 rows instead (the same keys)."""
    rows = q.shape[0]
    layout = gl.NVMMASharedLayout.get_default_for([BM, D], gl.bfloat16)
    kv_layout = gl.NVMMASharedLayout.get_default_for([BN, D], gl.bfloat16)
    qd = GluonDescriptor(q.view(rows, H * D), [rows, H * D], [H * D, 1], [BM, D], layout)
    page, block_table = 16, q
    if paged is None:
        kd, vd = (GluonDescriptor(t.view(rows, HKV * D), [rows, HKV * D], [HKV * D, 1], [BN, D],
                                  kv_layout) for t in (k, v))
    else:
        k_cache, v_cache, block_table = paged
        page = k_cache.shape[1]
        n = k_cache.shape[0] * page
        kd, vd = (GluonDescriptor(c.view(n, HKV * D), [n, HKV * D], [HKV * D, 1], [page, D],
                                  kv_layout) for c in (k_cache, v_cache))
    B = rows // N

    def call():
        _window_fwd[(N // BM, B * H)](qd, kd, vd, out, N, D ** -0.5 * 1.4426950408889634, W,
                                      block_table, block_table.stride(0),
                                      block_table if cu_seqlens is None else cu_seqlens, B, H,
                                      HKV, BM, BN, D, stages, overlap, mask_all, paged is not None,
                                      page, cu_seqlens is not None, num_warps=4)
    return call


def paged_copy(k, v, B, N, page):
    """k/v as a paged cache [pages, page, heads, dim] in shuffled pages, with the block
    table [B, N / page] that maps them back."""
    pages = B * N // page
    perm = torch.randperm(pages, device=k.device)
    k_cache = torch.empty(pages, page, *k.shape[1:], dtype=k.dtype, device=k.device)
    v_cache = torch.empty_like(k_cache)
    k_cache[perm] = k.view(pages, page, *k.shape[1:])
    v_cache[perm] = v.view(pages, page, *v.shape[1:])
    return k_cache, v_cache, perm.view(B, N // page).to(torch.int32).contiguous()


def reference_rows(q, k, v, N, H, HKV, D, W, b, h, rows):
    """float64 attention of query rows ``rows`` of (sequence b, head h)."""
    kvh = h // (H // HKV)
    out = []
    for r in rows:
        lo = max(r - W, 0)
        qr = q[b * N + r, h].double()
        kk = k[b * N + lo:b * N + r + 1, kvh].double()
        vv = v[b * N + lo:b * N + r + 1, kvh].double()
        w = torch.softmax(kk @ qr * D ** -0.5, 0)
        out.append(w @ vv)
    return torch.stack(out)


def main():
    B, N, H, HKV, D, W = 4, 8192, 32, 8, 128, 4095
    torch.manual_seed(0)
    q = torch.randn(B * N, H, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B * N, HKV, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B * N, HKV, D, device="cuda", dtype=torch.bfloat16)
    flush = harness.Flush()
    rows = [0, 1, 63, 64, 4095, 4096, 4159, 8191]
    ref = reference_rows(q, k, v, N, H, HKV, D, W, 1, 5, rows)
    pairs = B * H * (N * (W + 1) - W * (W + 1) // 2)
    variants = {}
    for stages in (2, 3):
        for overlap, mask_all in ((True, False), (True, True), (False, True)):
            name = f"gluon overlap={int(overlap)} mask_all={int(mask_all)} stages={stages} 64x64 4w"
            out = torch.full_like(q, float("nan"))
            variants[name] = (gluon_launch(q, k, v, out, N, H, HKV, D, W, 64, 64, stages, overlap,
                                           mask_all), out)
    paged = paged_copy(k, v, B, N, 16)
    for overlap, stages in ((True, 2), (True, 3), (False, 2)):
        name = f"gluon overlap={int(overlap)} mask_all=0 stages={stages} 64x64 4w, pages of 16"
        out = torch.full_like(q, float("nan"))
        variants[name] = (gluon_launch(q, k, v, out, N, H, HKV, D, W, 64, 64, stages, overlap,
                                       False, paged), out)
    dk = TensorDescriptor(k.view(B * N, HKV * D), [B * N, HKV * D], [HKV * D, 1], [64, D])
    dv = TensorDescriptor(v.view(B * N, HKV * D), [B * N, HKV * D], [HKV * D, 1], [64, D])
    for bm, warps in ((128, 8), (64, 4)):
        out = torch.full_like(q, float("nan"))

        def call(out=out, bm=bm, warps=warps):
            tma_probe._probe[(N // bm, B * H)](q, k, v, out, dk, dv, N, H, HKV, D ** -0.5, W, bm,
                                               64, D, True, False, num_warps=warps, num_stages=3)
        variants[f"triton probe {bm}x64 {warps}w 3 stages"] = (call, out)
    # The library's kernel and FlashInfer on workload B at prefix 0 (the same visible pairs;
    # their own inputs, paged, GQA-packed), for scale: their outputs are not the probes'.
    case = workloads.extend_cases("B", cases=[(0, N)])[0]
    inputs = harness.build_inputs(case)
    lib_fn, lib_out, _ = extend.prepare(inputs.q, inputs.k, inputs.v, inputs.k_pool, inputs.v_pool,
                                  inputs.block_table_window, inputs.cu_seqlens, inputs.prefix_lens,
                                  window_left=case.window_left)
    results = {}
    for name, (fn, out) in variants.items():
        try:
            fn()
            torch.cuda.synchronize()
            got = out[[N + r for r in rows], 5].double()
            err = ((got - ref).norm() / ref.norm()).item()
            nan = bool(out.isnan().any())
            results[name] = (fn, out, err, nan)
            print(f"{name}: rel err {err:.1e} on the reference rows, NaN anywhere: {nan}",
                  flush=True)
        except Exception as exc:
            print(f"{name}: failed {type(exc).__name__}: {str(exc)[:300]}", flush=True)
    graphs = {name: harness.capture(r[0])[0] for name, r in results.items()}
    graphs["swattn extend, B P0 E8192 (library config)"] = harness.capture(lib_fn)[0]
    # The same-variant control: the first variant's launch captured a second time.
    first = next(iter(results))
    graphs[first + " (control)"] = harness.capture(results[first][0])[0]
    # FlashInfer's prefill on the library's inputs (pages of 16), where it runs.
    try:
        fi = peers.flashinfer(inputs)
        fi.fn()
        lib_fn()
        torch.cuda.synchronize()
        agree = ((fi.result().float() - lib_out.float()).norm() / lib_out.float().norm()).item()
        print("FlashInfer against the library kernel on the library's inputs: "
              f"rel diff {agree:.1e}")
        graphs["FlashInfer prefill, B P0 E8192 (pages of 16)"] = harness.capture(fi.fn)[0]
    except Exception as exc:  # noqa: BLE001 - a peer that does not run is reported, not fatal
        print(f"FlashInfer: not run ({type(exc).__name__}: {str(exc)[:200]})")
    times = {name: [] for name in graphs}
    for _ in range(3):
        for name, replay in graphs.items():
            times[name] += harness.measure(replay, 20, flush)
    base = next(iter(results.values()))[1]
    for name in graphs:
        t = float(torch.tensor(times[name]).median())
        diff = 0.0
        if name in results:
            diff = (results[name][1].float() - base.float()).abs().max().item()
        print(f"{name}: {t:9.1f} us  {4 * pairs * D / t / 1e6:6.1f} TFLOP/s  "
              f"max diff to first {diff:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
