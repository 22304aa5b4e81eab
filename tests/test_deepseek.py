"""swattn.integrations.deepseek: V4's csa, hca and sliding layers and V3.2's DSA, decode and
extend, as an engine hands them over, against the float64 reference at tiny sizes; the
errors that name what a layer kind needs."""

import pytest
import torch
from checks import assert_matches_reference
from conftest import DEVICE

from swattn import reference
from swattn.integrations import deepseek

HQ, D = 4, 32


def _paged(lens, page_size, dim, g, nan_past=True):
    """A paged cache holding ``lens`` rows a sequence (NaN past them) and its table."""
    pages_each = max(-(-max(lens) // page_size), 1)
    cache = torch.randn(len(lens) * pages_each + 1, page_size, 1, dim, generator=g)
    table = (torch.randperm(len(lens) * pages_each, generator=g) + 1).reshape(len(lens), -1)
    for b, n in enumerate(lens):
        for e in range(n, pages_each * page_size):
            cache[table[b, e // page_size], e % page_size] = float("nan")
    return cache.half().to(DEVICE), table.to(torch.int32).to(DEVICE)


def _v4_decode(layer_kind, seed=0):
    g = torch.Generator().manual_seed(seed)
    lens = [3, 29, 66]
    swa, swa_table = _paged(lens, 8, D, g)
    rate = {"csa": 4, "hca": 8}.get(layer_kind, 1)  # hca at 8: entries at these lengths
    counts = [n // rate for n in lens]
    comp, comp_table = _paged([max(c, 1) for c in counts], 4, D, g)
    args = dict(q=torch.randn(3, HQ, D, generator=g).half().to(DEVICE), swa_cache=swa,
                swa_table=swa_table,
                seq_lens=torch.tensor(lens, dtype=torch.int32, device=DEVICE))
    kw = dict(layer_kind=layer_kind, window_left=9,
              sinks=torch.randn(HQ, generator=g).to(DEVICE))
    if layer_kind != "sliding":
        args.update(compressed_cache=comp, compressed_table=comp_table,
                    compressed_counts=torch.tensor(counts, dtype=torch.int32, device=DEVICE))
    if layer_kind == "hca":
        kw["rate"] = rate
    if layer_kind == "csa":
        kw["topk_indices"] = torch.randint(-1, max(counts) + 2, (3, 5), generator=g,
                                           dtype=torch.int32).to(DEVICE)
    return args, kw


@pytest.mark.parametrize("layer_kind", deepseek.LAYER_KINDS)
def test_v4_decode_matches_reference(layer_kind):
    args, kw = _v4_decode(layer_kind)
    got = deepseek.v4_decode(**args, **kw)
    second = deepseek.v4_source(layer_kind, args.get("compressed_cache"),
                                 args.get("compressed_table"), args.get("compressed_counts"),
                                 kw.get("topk_indices"), kw.get("rate"))
    want = reference.decode_attention(args["q"], args["swa_cache"], args["swa_cache"],
                                      args["swa_table"], args["seq_lens"], window_left=9,
                                      sinks=kw["sinks"], second=second)
    assert_matches_reference(got, want)


@pytest.mark.parametrize("layer_kind", ["csa", "hca"])
def test_v4_extend_matches_reference(layer_kind):
    """A chunk after a prefix: the window over the prefix and the chunk, and the entries
    each row's position has closed (the counts include the chunk's)."""
    g = torch.Generator().manual_seed(1)
    prefix, new = [0, 13], [6, 9]
    rate = 4 if layer_kind == "csa" else 8
    swa, swa_table = _paged([max(p, 1) for p in prefix], 4, D, g)
    counts = [(p + n) // rate for p, n in zip(prefix, new)]
    comp, comp_table = _paged(counts, 2, D, g)
    cu = torch.tensor([0, 6, 15], dtype=torch.int32, device=DEVICE)
    q = torch.randn(15, HQ, D, generator=g).half().to(DEVICE)
    k = torch.randn(15, 1, D, generator=g).half().to(DEVICE)
    sinks = torch.randn(HQ, generator=g).to(DEVICE)
    indices = (torch.randint(-1, max(counts), (15, 3), generator=g, dtype=torch.int32).to(DEVICE)
               if layer_kind == "csa" else None)
    counts = torch.tensor(counts, dtype=torch.int32, device=DEVICE)
    prefix_lens = torch.tensor(prefix, dtype=torch.int32, device=DEVICE)
    got = deepseek.v4_extend(q, k, swa, swa_table, cu, prefix_lens, comp, comp_table, counts,
                             layer_kind=layer_kind, topk_indices=indices, window_left=5,
                             sinks=sinks, rate=rate)
    second = deepseek.v4_source(layer_kind, comp, comp_table, counts, indices, rate)
    want = reference.extend_attention(q, k, k, swa, swa, swa_table, cu, prefix_lens,
                                      window_left=5, sinks=sinks, second=second)
    assert_matches_reference(got, want)


def test_dsa_decode_and_extend_match_reference():
    """V3.2: the top-k tokens of a latent cache (values its first columns), no window."""
    g = torch.Generator().manual_seed(2)
    dv = 16
    lens = [7, 30]
    cache, table = _paged(lens, 4, D, g)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    q = torch.randn(2, HQ, D, generator=g).half().to(DEVICE)
    picks = torch.randint(-1, 30, (2, 6), generator=g, dtype=torch.int32).to(DEVICE)
    got = deepseek.dsa_decode(q, cache, table, seq_lens, picks, head_dim_v=dv)
    second = deepseek.dsa_source(cache, table, seq_lens, picks)
    want = reference.decode_attention(q, cache, cache[..., :dv], table, seq_lens, second=second)
    assert_matches_reference(got, want)
    # The chunk's last 5 tokens of each sequence are new (already in the cache).
    cu = torch.tensor([0, 5, 10], dtype=torch.int32, device=DEVICE)
    prefix_lens = seq_lens - 5
    rows = torch.randn(10, HQ, D, generator=g).half().to(DEVICE)
    k = torch.randn(10, 1, D, generator=g).half().to(DEVICE)
    picks = torch.randint(-1, 30, (10, 4), generator=g, dtype=torch.int32).to(DEVICE)
    got = deepseek.dsa_extend(rows, k, cache, table, cu, prefix_lens, picks, head_dim_v=dv)
    second = deepseek.dsa_source(cache, table, seq_lens, picks)
    want = reference.extend_attention(rows, k, k[..., :dv], cache, cache[..., :dv], table, cu,
                                      prefix_lens, second=second)
    assert_matches_reference(got, want)


@pytest.mark.parametrize("layer_kind, drop, match", [
    ("mla", None, "layer_kind must be one of"),
    ("csa", "topk_indices", "a csa layer needs the indexer's picks"),
    ("hca", "compressed_counts", "needs compressed_cache, compressed_table and"),
    ("sliding", None, "a sliding layer takes no compressed cache"),
])
def test_errors_name_what_the_layer_needs(layer_kind, drop, match):
    args, kw = _v4_decode("csa")
    kw["layer_kind"] = layer_kind
    if drop == "topk_indices":
        kw.pop("topk_indices")
    elif drop:
        args.pop(drop)
    with pytest.raises(ValueError, match=match):
        deepseek.v4_decode(**args, **kw)
