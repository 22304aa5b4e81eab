"""The SGLang- and vLLM-signature drop-ins, tested the way those projects test their own
Triton kernels: random ragged batches over a shuffled token pool (SGLang) or a paged cache
with shuffled blocks (vLLM), against a dense float64 attention written here; on the GPU,
also against the peers' own kernels where they are importable (scripts/peers_path.sh)."""

import math

import pytest
import torch

from swattn.integrations import sglang as sg
from swattn.integrations import vllm as vl

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32
TOL = 2e-2 if DEVICE == "cuda" else 1e-4


def _dense(q, k, v, q_pos, k_pos, *, scale, window=None, right=None, causal=True, mask=None,
           sinks=None, cap=0.0):
    """One sequence: q [E, H, D] at positions q_pos, k/v [N, Hkv, D] at k_pos (float64)."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = torch.einsum("ehd,nhd->hen", q, k) * scale
    if cap:
        s = cap * torch.tanh(s / cap)
    d = q_pos[:, None] - k_pos[None, :]
    keep = torch.ones_like(d, dtype=torch.bool)
    if mask is not None:
        keep &= mask
    elif causal:
        keep &= d >= 0
    if window is not None:
        keep &= d <= window
    if right is not None:
        keep &= -d <= right
    s = s.masked_fill(~keep[None], -math.inf)
    if sinks is not None:
        s = torch.cat([s, sinks.double()[:, None, None].expand(-1, s.shape[1], 1)], -1)
    p = torch.softmax(s, -1)[..., :k.shape[0]]
    lse = torch.logsumexp(s[..., :k.shape[0]], -1).transpose(0, 1)
    return torch.einsum("hen,nhd->ehd", p, v), lse


def _sglang_case(seed, heads=(4, 2), dim=16, batch=3):
    g = torch.Generator().manual_seed(seed)
    hq, hkv = heads
    prefix = torch.randint(0, 40, (batch,), generator=g).tolist()
    extend = torch.randint(1, 20, (batch,), generator=g).tolist()
    pool = sum(prefix) + 50
    k_buffer = torch.randn(pool, hkv, dim, generator=g).to(DTYPE).to(DEVICE)
    v_buffer = torch.randn(pool, hkv, dim, generator=g).to(DTYPE).to(DEVICE)
    perm = torch.randperm(pool, generator=g)
    lists, at = [], 0
    for p in prefix:
        lists.append(perm[at:at + p])
        at += p
    kv_indptr = torch.tensor([0] + list(torch.tensor(prefix).cumsum(0)), dtype=torch.int32)
    qo_indptr = torch.tensor([0] + list(torch.tensor(extend).cumsum(0)), dtype=torch.int32)
    total = sum(extend)
    q = torch.randn(total, hq, dim, generator=g).to(DTYPE).to(DEVICE)
    k = torch.randn(total, hkv, dim, generator=g).to(DTYPE).to(DEVICE)
    v = torch.randn(total, hkv, dim, generator=g).to(DTYPE).to(DEVICE)
    sinks = torch.randn(hq, generator=g).to(DEVICE)
    masks = [torch.rand(e, p + e, generator=g) < 0.6 for p, e in zip(prefix, extend)]
    return dict(prefix=prefix, extend=extend, k_buffer=k_buffer, v_buffer=v_buffer, lists=lists,
                kv_indptr=kv_indptr.to(DEVICE),
                kv_indices=torch.cat(lists).to(torch.int64).to(DEVICE),
                qo_indptr=qo_indptr.to(DEVICE), q=q, k=k, v=v, sinks=sinks, masks=masks)


def _sglang_want(c, *, window=None, causal=True, mask=False, skip_prefix_mask=True, sinks=False,
                 cap=0.0):
    outs, lses = [], []
    scale = c["q"].shape[-1] ** -0.5
    for b, (p, e) in enumerate(zip(c["prefix"], c["extend"])):
        rows = slice(int(c["qo_indptr"][b]), int(c["qo_indptr"][b + 1]))
        idx = c["lists"][b].to(DEVICE)
        keys = torch.cat([c["k_buffer"][idx], c["k"][rows]])
        vals = torch.cat([c["v_buffer"][idx], c["v"][rows]])
        m = None
        if mask:
            m = c["masks"][b].clone().to(DEVICE)
            if skip_prefix_mask:
                m[:, :p] = True
        q_pos = torch.arange(p, p + e, device=DEVICE)
        o, lse = _dense(c["q"][rows], keys, vals, q_pos, torch.arange(p + e, device=DEVICE),
                        scale=scale, window=window, right=None if causal else window,
                        causal=causal, mask=m, sinks=c["sinks"] if sinks else None, cap=cap)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def _rel(got, want):
    return ((got.double() - want).abs().max() / want.abs().max()).item()


SGLANG_CASES = [
    dict(),
    dict(window=7),
    dict(window=7, sinks=True, cap=5.0),
    dict(causal=False, window=5),
    dict(mask=True),
    dict(mask=True, skip_prefix_mask=False, window=9),
    dict(mask=True, causal=False, window=6),  # the window bounds the new keys both ways
]


@pytest.mark.parametrize("opts", SGLANG_CASES,
                         ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "plain")
def test_sglang_extend_against_dense(opts, seed):
    c = _sglang_case(seed)
    out = torch.full_like(c["q"], float("nan"))
    lse = torch.full(c["q"].shape[:2], float("nan"), device=DEVICE)
    mask = mask_indptr = None
    if opts.get("mask"):
        mask = torch.cat([m.flatten() for m in c["masks"]]).to(torch.int8).to(DEVICE)
        sizes = [m.numel() for m in c["masks"]]
        mask_indptr = torch.tensor([0] + list(torch.tensor(sizes).cumsum(0)),
                                   dtype=torch.int64).to(DEVICE)
    window = opts.get("window")
    sg.extend_attention_fwd(
        c["q"], c["k"], c["v"], out, c["k_buffer"], c["v_buffer"], c["qo_indptr"], c["kv_indptr"],
        c["kv_indices"], mask, opts.get("causal", True), mask_indptr, max(c["extend"]), 1.0, 1.0,
        logit_cap=opts.get("cap", 0.0), skip_prefix_custom_mask=opts.get("skip_prefix_mask", True),
        sliding_window_size=-1 if window is None else window,
        sinks=c["sinks"] if opts.get("sinks") else None, lse_extend=lse)
    want, want_lse = _sglang_want(c, **opts)
    assert _rel(out, want) < TOL
    assert (lse.double() - want_lse).abs().max().item() < 1e-2


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3fn", "e5m2"])
def test_sglang_over_an_fp8_pool(fp8, seed):
    """An fp8 pool under k_scale/v_scale (a float for K, a one-value tensor for V): extend and
    decode against the dense attention over the pool as stored times its scale, the new keys
    taken as the pool will store them."""
    c = _sglang_case(seed)
    scales = (0.05, 0.08)

    def stored(x, s):
        return (x.float() / s).to(fp8)

    c8 = dict(c, k_buffer=stored(c["k_buffer"], scales[0]),
              v_buffer=stored(c["v_buffer"], scales[1]))
    read = dict(c, **{n: (stored(c[n], s).float() * s).to(DTYPE)
                      for n, s in (("k_buffer", scales[0]), ("v_buffer", scales[1]),
                                   ("k", scales[0]), ("v", scales[1]))})
    out = torch.full_like(c["q"], float("nan"))
    sg.extend_attention_fwd(c["q"], c["k"], c["v"], out, c8["k_buffer"], c8["v_buffer"],
                            c["qo_indptr"], c["kv_indptr"], c["kv_indices"], None, True, None,
                            max(c["extend"]), scales[0], torch.tensor([scales[1]], device=DEVICE),
                            sliding_window_size=7, sinks=c["sinks"])
    assert _rel(out, _sglang_want(read, window=7, sinks=True)[0]) < TOL
    # Decode: the first sequence's list, its first query.
    n = c["prefix"][0] or 1
    idx = c["lists"][0][:n] if c["prefix"][0] else torch.tensor([0])
    q = c["q"][:1].contiguous()
    out = torch.full_like(q, float("nan"))
    sg.decode_attention_fwd(q, c8["k_buffer"], c8["v_buffer"], out,
                            torch.tensor([0, n], dtype=torch.int32, device=DEVICE),
                            idx.to(torch.int64).to(DEVICE), sm_scale=q.shape[-1] ** -0.5,
                            k_scale=scales[0], v_scale=torch.tensor(scales[1], device=DEVICE))
    idx = idx.to(DEVICE)
    want, _ = _dense(q, read["k_buffer"][idx], read["v_buffer"][idx],
                     torch.tensor([n - 1], device=DEVICE), torch.arange(n, device=DEVICE),
                     scale=q.shape[-1] ** -0.5)
    assert _rel(out, want) < TOL
    with pytest.raises(NotImplementedError, match="one for the cache"):
        sg.decode_attention_fwd(q, c8["k_buffer"], c8["v_buffer"], out,
                                torch.tensor([0, n], dtype=torch.int32, device=DEVICE),
                                idx.to(torch.int64), k_scale=torch.ones(2, device=DEVICE))


def _sglang_call(c, **kwargs):
    out = torch.full_like(c["q"], float("nan"))
    args = dict(kv_indices=c["kv_indices"], sliding_window_size=-1)
    args.update(kwargs)
    sg.extend_attention_fwd(c["q"], c["k"], c["v"], out, c["k_buffer"], c["v_buffer"],
                            c["qo_indptr"], c["kv_indptr"], args.pop("kv_indices"), None, True,
                            None, max(c["extend"]), 1.0, 1.0, **args)
    return out


def test_sglang_window_zero_is_none_and_identity_indices(seed):
    """SGLang reads sliding_window_size 0 as no window; identity_kv_indices reads each
    prefix densely from kv_indptr[b] and never the index list."""
    c = _sglang_case(seed)
    assert torch.equal(_sglang_call(c, sliding_window_size=0), _sglang_call(c))
    c["kv_indices"] = torch.arange(int(c["kv_indptr"][-1]), device=DEVICE)
    c["lists"] = [c["kv_indices"][int(a):int(b)].cpu()
                  for a, b in zip(c["kv_indptr"][:-1], c["kv_indptr"][1:])]
    dense = _sglang_call(c)
    assert _rel(dense, _sglang_want(c)[0]) < TOL
    garbage = torch.zeros_like(c["kv_indices"])
    assert torch.equal(_sglang_call(c, kv_indices=garbage, identity_kv_indices=True), dense)


def test_sglang_decode_against_dense(seed):
    c = _sglang_case(seed)
    batch = len(c["prefix"])
    lens = torch.tensor(c["prefix"]) + 1  # every list at least one key
    g = torch.Generator().manual_seed(seed)
    pool = c["k_buffer"].shape[0]
    lists = [torch.randperm(pool, generator=g)[:n] for n in lens.tolist()]
    kv_indptr = torch.tensor([0] + list(lens.cumsum(0)), dtype=torch.int32).to(DEVICE)
    q = c["q"][:batch].contiguous()
    out = torch.full_like(q, float("nan"))
    logits = torch.empty(batch, q.shape[1], 8, q.shape[2], device=DEVICE)
    sg.decode_attention_fwd(q, c["k_buffer"], c["v_buffer"], out, kv_indptr,
                            torch.cat(lists).to(DEVICE), logits, logits[..., 0], None, 8,
                            q.shape[-1] ** -0.5, 1.0, 1.0, logit_cap=3.0, sinks=c["sinks"])
    for b in range(batch):
        idx = lists[b].to(DEVICE)
        n = len(idx)
        want, _ = _dense(q[b:b + 1], c["k_buffer"][idx], c["v_buffer"][idx],
                         torch.tensor([n - 1], device=DEVICE), torch.arange(n, device=DEVICE),
                         scale=q.shape[-1] ** -0.5, sinks=c["sinks"], cap=3.0)
        assert _rel(out[b:b + 1], want) < TOL


def test_sglang_mla_decode_takes_the_values_from_the_keys():
    """``has_mla=True``: the values are the keys' first Lv columns (SGLang's MLA decode), not
    what ``v_buffer`` holds (NaN here)."""
    g = torch.Generator().manual_seed(5)
    pool, d, dv, lens = 30, 40, 32, [7, 1, 12]
    k_buffer = torch.randn(pool, 1, d, generator=g).to(DTYPE).to(DEVICE)
    v_buffer = torch.full((pool, 1, dv), float("nan"), dtype=DTYPE, device=DEVICE)
    q = torch.randn(len(lens), 4, d, generator=g).to(DTYPE).to(DEVICE)
    lists = [torch.randperm(pool, generator=g)[:n] for n in lens]
    kv_indptr = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32).to(DEVICE)
    out = torch.full((len(lens), 4, dv), float("nan"), dtype=DTYPE, device=DEVICE)
    sg.decode_attention_fwd(q, k_buffer, v_buffer, out, kv_indptr, torch.cat(lists).to(DEVICE),
                            sm_scale=d ** -0.5, has_mla=True)
    for b, n in enumerate(lens):
        idx = lists[b].to(DEVICE)
        want, _ = _dense(q[b:b + 1], k_buffer[idx], k_buffer[idx][..., :dv],
                         torch.tensor([n - 1], device=DEVICE), torch.arange(n, device=DEVICE),
                         scale=d ** -0.5)
        assert _rel(out[b:b + 1], want) < TOL


def _vllm_case(seed, block=16, batch=3, heads=(4, 2), dim=16):
    g = torch.Generator().manual_seed(seed)
    hq, hkv = heads
    q_lens = [1] + torch.randint(1, 20, (batch - 1,), generator=g).tolist()  # a decode and prefills
    ctx = torch.randint(0, 50, (batch,), generator=g).tolist()
    seqused = [c + n for c, n in zip(ctx, q_lens)]
    pages_each = [-(-s // block) for s in seqused]
    blocks = sum(pages_each) + 4
    k = torch.randn(blocks, block, hkv, dim, generator=g).to(DTYPE).to(DEVICE)
    v = torch.randn(blocks, block, hkv, dim, generator=g).to(DTYPE).to(DEVICE)
    perm = torch.randperm(blocks, generator=g)
    width = max(pages_each) + 2
    table = torch.zeros(batch, width, dtype=torch.int32)
    at = 0
    for b, n in enumerate(pages_each):
        table[b, :n] = perm[at:at + n]
        at += n
    total = sum(q_lens)
    q = torch.randn(total, hq, dim, generator=g).to(DTYPE).to(DEVICE)
    cu = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32).to(DEVICE)
    return dict(q=q, k=k, v=v, table=table.to(DEVICE), cu=cu, q_lens=q_lens, seqused=seqused,
                seqused_t=torch.tensor(seqused, dtype=torch.int32).to(DEVICE),
                sinks=torch.randn(hq, generator=g).to(DEVICE))


def _vllm_want(c, window, softcap, sinks):
    outs = []
    block = c["k"].shape[1]
    for b, (n, s) in enumerate(zip(c["q_lens"], c["seqused"])):
        pos = torch.arange(s, device=DEVICE)
        pages = c["table"][b].long()[pos // block]
        keys, vals = c["k"][pages, pos % block], c["v"][pages, pos % block]
        rows = slice(int(c["cu"][b]), int(c["cu"][b + 1]))
        o, _ = _dense(c["q"][rows], keys, vals, torch.arange(s - n, s, device=DEVICE), pos,
                      scale=c["q"].shape[-1] ** -0.5, window=window,
                      sinks=c["sinks"] if sinks else None, cap=softcap)
        outs.append(o)
    return torch.cat(outs)


@pytest.mark.parametrize("window,softcap,sinks",
                         [(None, 0.0, False), (9, 0.0, True), (20, 4.0, True)])
def test_vllm_unified_against_dense(window, softcap, sinks, seed):
    c = _vllm_case(seed)
    pad = 3  # rows past the batch (a padded CUDA-graph size) are left alone
    q = torch.cat([c["q"], torch.randn(pad, *c["q"].shape[1:]).to(c["q"])])
    out = torch.full_like(q, float("nan"))
    ones = torch.ones(1, device=DEVICE)
    vl.unified_attention(q, c["k"], c["v"], out, c["cu"], max(c["q_lens"]), c["seqused_t"],
                         max(c["seqused"]), q.shape[-1] ** -0.5, True,
                         (-1, -1) if window is None else (window, 0), c["table"], softcap, None,
                         ones, ones, sinks=c["sinks"] if sinks else None)
    total = c["q"].shape[0]
    assert _rel(out[:total], _vllm_want(c, window, softcap, sinks)) < TOL
    assert out[total:].isnan().all()


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3fn", "e5m2"])
@pytest.mark.parametrize("mode", [1, 0], ids=["fp8-per-tensor", "none"])
def test_vllm_unified_over_an_fp8_cache(fp8, mode, seed):
    """vLLM's fp8 cache conventions: FP8_PER_TENSOR (1), the cache holding value / scale and the
    descales one value expanded to [num_seqs, Hkv] as vLLM passes them; NONE (0), the stored
    values taken as they are and the descales ignored. Against the dense attention over the
    cache as those conventions read it."""
    c = _vllm_case(seed)
    scales = (0.05, 0.08) if mode == 1 else (1.0, 1.0)
    stored = {n: (c[n].float() / s).to(fp8) for n, s in zip("kv", scales)}
    read = dict(c, **{n: (stored[n].float() * s).to(DTYPE) for n, s in zip("kv", scales)})
    shape = (len(c["q_lens"]), c["k"].shape[2])
    descales = [torch.tensor(s if mode == 1 else 3.0, device=DEVICE).expand(shape) for s in scales]
    out = torch.full_like(c["q"], float("nan"))
    vl.unified_attention(c["q"], stored["k"], stored["v"], out, c["cu"], max(c["q_lens"]),
                         c["seqused_t"], max(c["seqused"]), c["q"].shape[-1] ** -0.5, True, (9, 0),
                         c["table"], 0.0, None, *descales, sinks=c["sinks"], kv_quant_mode=mode)
    assert _rel(out, _vllm_want(read, 9, 0.0, True)) < TOL


def test_drop_ins_refuse_what_they_cannot_serve():
    c = _vllm_case(0)
    ones = torch.ones(1, device=DEVICE)
    out = torch.empty_like(c["q"])
    args = (c["q"], c["k"], c["v"], out, c["cu"], 1, c["seqused_t"], 1, 1.0)
    with pytest.raises(NotImplementedError, match="causal"):
        vl.unified_attention(*args, False, (-1, -1), c["table"], 0, None, ones, ones)
    with pytest.raises(NotImplementedError, match="ALiBi"):
        vl.unified_attention(*args, True, (-1, -1), c["table"], 0, None, ones, ones,
                             alibi_slopes=ones)
    with pytest.raises(NotImplementedError, match="kv_quant_mode 3"):
        vl.unified_attention(*args, True, (-1, -1), c["table"], 0, None, ones, ones,
                             kv_quant_mode=3)
    with pytest.raises(NotImplementedError, match="cache with"):
        vl.unified_attention(c["q"], c["k"].to(torch.float16 if DTYPE != torch.float16 else
                                               torch.float32), c["v"], *args[3:], True, (-1, -1),
                             c["table"], 0, None, ones, ones)
    s = _sglang_case(0)
    with pytest.raises(NotImplementedError, match="fp8"):
        sg.extend_attention_fwd(s["q"], s["k"], s["v"], torch.empty_like(s["q"]), s["k_buffer"],
                                s["v_buffer"], s["qo_indptr"], s["kv_indptr"], s["kv_indices"],
                                None, True, None, 19, 0.5, 1.0)


# ------------------------------------------------------------------------------------------
# On the GPU: against the peers' own kernels, same inputs (scripts/peers_path.sh).
# ------------------------------------------------------------------------------------------

def _peer(name):
    if DEVICE != "cuda":
        pytest.skip("needs a CUDA GPU (scripts/gpu_check.sh runs these)")
    try:
        return __import__(name, fromlist=["_"])
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"{name} not importable: {exc}")


@pytest.mark.parametrize("opts", SGLANG_CASES[:4], ids=str)
def test_sglang_extend_equals_sglang(opts, seed):
    mod = _peer("sglang.kernels.ops.attention.extend_attention")
    c = _sglang_case(seed, heads=(8, 2), dim=64)
    window = opts.get("window")
    outs = []
    for fn in (sg.extend_attention_fwd, mod.extend_attention_fwd):
        out = torch.zeros_like(c["q"])
        fn(c["q"], c["k"], c["v"], out, c["k_buffer"], c["v_buffer"], c["qo_indptr"],
           c["kv_indptr"], c["kv_indices"], None, opts.get("causal", True), None,
           max(c["extend"]), 1.0, 1.0, sm_scale=0.125, logit_cap=opts.get("cap", 0.0),
           sliding_window_size=-1 if window is None else window,
           sinks=c["sinks"] if opts.get("sinks") else None)
        outs.append(out)
    assert _rel(outs[0], outs[1].double()) < 1e-2


def test_vllm_equals_vllm(seed):
    mod = _peer("vllm.v1.attention.ops.triton_unified_attention")
    c = _vllm_case(seed, heads=(8, 2), dim=64)
    ones = torch.ones(1, device=DEVICE)
    outs = []
    for fn in (vl.unified_attention, mod.unified_attention):
        out = torch.zeros_like(c["q"])
        fn(c["q"], c["k"], c["v"], out, c["cu"], max(c["q_lens"]), c["seqused_t"],
           max(c["seqused"]), 0.125, True, (9, 0), c["table"], 0, None, ones, ones,
           sinks=c["sinks"])
        outs.append(out)
    assert _rel(outs[0], outs[1].double()) < 1e-2


def test_vllm_equals_vllm_over_an_fp8_cache(seed):
    """The drop-in and vLLM's own kernel over the same e4m3 cache under one scale for the
    tensor (FP8_PER_TENSOR, the descales expanded as vLLM passes them)."""
    mod = _peer("vllm.v1.attention.ops.triton_unified_attention")
    mode = _peer("vllm.v1.kv_cache_interface").KVQuantMode.FP8_PER_TENSOR
    c = _vllm_case(seed, heads=(8, 2), dim=64)
    k8, v8 = ((c[n].float() / 0.05).to(torch.float8_e4m3fn) for n in "kv")
    descale = torch.tensor(0.05, device=DEVICE).expand(len(c["q_lens"]), 2)
    outs = []
    for fn in (vl.unified_attention, mod.unified_attention):
        out = torch.zeros_like(c["q"])
        fn(c["q"], k8, v8, out, c["cu"], max(c["q_lens"]), c["seqused_t"], max(c["seqused"]),
           0.125, True, (9, 0), c["table"], 0, None, descale, descale, sinks=c["sinks"],
           kv_quant_mode=mode)
        outs.append(out)
    assert _rel(outs[0], outs[1].double()) < 1e-2


def test_drop_ins_refuse_arguments_they_do_not_apply():
    """vLLM's drop-in took any keyword argument into ``**kwargs`` and dropped it (a later
    vLLM's argument ran as if absent), and read a per-sequence ``causal`` tensor as a truth
    value; SGLang's decode dropped ``uneven_batch``. Each is refused by name."""
    c = _vllm_case(0)
    ones = torch.ones(1, device=DEVICE)
    out = torch.empty_like(c["q"])
    args = (c["q"], c["k"], c["v"], out, c["cu"], 1, c["seqused_t"], 1, 1.0)
    with pytest.raises(NotImplementedError, match="some_future_flag"):
        vl.unified_attention(*args, True, (-1, -1), c["table"], 0, None, ones, ones,
                             some_future_flag=True)
    per_seq = torch.ones(len(c["q_lens"]), dtype=torch.bool, device=DEVICE)
    with pytest.raises(NotImplementedError, match="per-sequence causal"):
        vl.unified_attention(*args, per_seq, (-1, -1), c["table"], 0, None, ones, ones)
    s = _sglang_case(0)
    q = s["q"][:3].contiguous()
    with pytest.raises(NotImplementedError, match="uneven_batch"):
        sg.decode_attention_fwd(q, s["k_buffer"], s["v_buffer"], torch.empty_like(q),
                                s["kv_indptr"], s["kv_indices"], uneven_batch=True)
