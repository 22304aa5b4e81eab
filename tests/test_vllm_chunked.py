"""Chunked local attention as vLLM's Llama 4 path calls its attention backend: every
sequence cut at the chunk boundaries into "virtual batches" of one chunk each (its block
table row starting at the chunk's first page), then the ordinary unified attention. Our
vLLM-signature drop-in over those batches gives what swattn's own attention_chunk gives
over the original batch."""

import torch
from checks import assert_matches_reference
from conftest import DEVICE

import swattn
from swattn import reference
from swattn.integrations.vllm import unified_attention


def virtual_batches(q_lens, seq_lens, block_table, chunk, page_size):
    """vLLM's chunked-local metadata, written from its description: each sequence's queries
    split where a chunk starts; a piece sees the keys from its chunk's first position to
    its last query (``seqused_k``), through the block-table row shifted to the chunk's
    first page (the chunk a multiple of the page size). Returns ``(cu_seqlens_q,
    seqused_k, block_table)`` of the pieces, in the queries' order."""
    assert chunk % page_size == 0
    cu, used, rows = [0], [], []
    for b, (n, s) in enumerate(zip(q_lens, seq_lens)):
        first = s - n  # position of the sequence's first query
        pos = first
        while pos < s:
            start = pos // chunk * chunk
            end = min(start + chunk, s)
            cu.append(cu[-1] + end - pos)
            used.append(end - start)
            shift = start // page_size
            row = torch.full_like(block_table[b], -1)
            row[:block_table.shape[1] - shift] = block_table[b, shift:]
            rows.append(row)
            pos = end
    return (torch.tensor(cu, dtype=torch.int32), torch.tensor(used, dtype=torch.int32),
            torch.stack(rows).to(torch.int32))


def test_vllm_virtual_batches_equal_chunked_attention():
    """A prefill chunk crossing chunk boundaries, one inside a chunk, a decode token at a
    chunk's first position: the drop-in on vLLM's virtual batches equals attention_chunk."""
    g = torch.Generator().manual_seed(31)
    chunk, page, hq, hkv, d = 16, 4, 4, 2, 16
    q_lens, seq_lens = [23, 5, 1], [40, 12, 33]
    pages = 64
    k_cache = torch.randn(pages, page, hkv, d, generator=g)
    v_cache = torch.randn(pages, page, hkv, d, generator=g)
    table = torch.randperm(pages, generator=g)[:3 * 12].view(3, 12).to(torch.int32)
    q = torch.randn(sum(q_lens), hq, d, generator=g)
    cu = torch.tensor([0, 23, 28, 29], dtype=torch.int32)
    vcu, vused, vtable = virtual_batches(q_lens, seq_lens, table, chunk, page)
    out = torch.full_like(q, float("nan"))
    unified_attention(q.to(DEVICE), k_cache.to(DEVICE), v_cache.to(DEVICE), out, vcu.to(DEVICE),
                      max(q_lens), vused.to(DEVICE), int(vused.max()), d ** -0.5, True, (-1, -1),
                      vtable.to(DEVICE), 0.0, None, None, None)
    # The same through swattn's own chunk: the new tokens' keys read back from the cache.
    prefix = torch.tensor([s - n for n, s in zip(q_lens, seq_lens)], dtype=torch.int32)
    rows = [(table[b, (p // page)], p % page) for b, (n, s) in enumerate(zip(q_lens, seq_lens))
            for p in range(s - n, s)]
    k_new = torch.stack([k_cache[pg, sl] for pg, sl in rows])
    v_new = torch.stack([v_cache[pg, sl] for pg, sl in rows])
    want = reference.extend_attention(q, k_new, v_new, k_cache, v_cache, table, cu,
                                             prefix, attention_chunk=chunk)
    assert_matches_reference(out, want)
    got = swattn.extend_attention(*(t.to(DEVICE) for t in (q, k_new, v_new, k_cache, v_cache,
                                                           table, cu, prefix)),
                                  attention_chunk=chunk)
    assert_matches_reference(got, want)
