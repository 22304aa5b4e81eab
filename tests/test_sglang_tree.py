"""SGLang's speculative verify path with a draft tree over a window layer, through the
SGLang-signature drop-in: with the drafts' positions the window is measured between
positions (the reference's tree); without them the drop-in keeps SGLang's own semantics
(the window from the row index), which a tree shows to differ."""

import torch
from checks import assert_matches_reference
from conftest import DEVICE

from swattn import reference
from swattn.integrations import sglang as sg
from swattn.verify.cases import random_tree


def test_sglang_tree_verify_over_a_window(seed):
    g = torch.Generator().manual_seed(40 + seed)
    hq, hkv, dim, window = 4, 2, 16, 3
    prefix, drafts = [12, 7], [10, 8]
    positions, mask, indptr = random_tree(prefix, drafts, seed=41 + seed)
    pool = sum(prefix) + 5
    k_buffer = torch.randn(pool, hkv, dim, generator=g)
    v_buffer = torch.randn(pool, hkv, dim, generator=g)
    lists = torch.randperm(pool, generator=g)[:sum(prefix)]
    kv_indptr = torch.tensor([0, prefix[0], sum(prefix)], dtype=torch.int32)
    qo_indptr = torch.tensor([0, drafts[0], sum(drafts)], dtype=torch.int32)
    q = torch.randn(sum(drafts), hq, dim, generator=g)
    k = torch.randn(sum(drafts), hkv, dim, generator=g)
    v = torch.randn(sum(drafts), hkv, dim, generator=g)

    def call(**kw):
        out = torch.full_like(q, float("nan")).to(DEVICE)
        sg.extend_attention_fwd(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), out,
                                k_buffer.to(DEVICE), v_buffer.to(DEVICE), qo_indptr.to(DEVICE),
                                kv_indptr.to(DEVICE), lists.to(DEVICE), mask.to(DEVICE), True,
                                indptr.to(DEVICE), max(drafts), sliding_window_size=window, **kw)
        return out

    # The reference over the same keys as a paged cache of one-token pages.
    table = torch.full((2, max(prefix)), -1, dtype=torch.int32)
    table[0, :prefix[0]] = lists[:prefix[0]].to(torch.int32)
    table[1, :prefix[1]] = lists[prefix[0]:].to(torch.int32)
    want = reference.extend_attention(q, k, v, k_buffer[:, None], v_buffer[:, None], table,
                                      qo_indptr, torch.tensor(prefix), window_left=window,
                                      mask=mask, mask_indptr=indptr, positions=positions)
    assert_matches_reference(call(positions=positions.to(DEVICE)), want)
    by_row = reference.extend_attention(q, k, v, k_buffer[:, None], v_buffer[:, None], table,
                                        qo_indptr, torch.tensor(prefix), window_left=window,
                                        mask=mask, mask_indptr=indptr)
    assert_matches_reference(call(), by_row)
    assert (by_row - want).abs().max() > 1e-3  # the tree makes the two differ
