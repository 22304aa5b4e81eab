"""The peers of a tree verify over a window layer (T), each called as its engine calls it
(``docs/peers.md``):

* SGLang's verify path: ``extend_attention_fwd`` with the draft tree's custom mask and
  ``sliding_window_size``, over its token pool, as its Triton backend hands a target-verify
  batch to a window layer. Its kernel measures the window from the row index (the i-th
  new token at ``P + i``), not from the tree's positions (``P + depth``): on a tree deeper
  rows lose keys the model's function keeps, so it computes another function. It is
  checked against the reference of what it computes and marked so, never called the
  fastest peer.
* FlexAttention with a block mask of the tree (ancestors and positions) and the window
  between positions; no sinks.

Each returns a :class:`~.peers.Prepared` or raises :class:`~.peers.Skip` saying why.
"""

from __future__ import annotations

import torch

from .decode_inputs import need_device
from .extend_inputs import reference_first
from .extend_peers import flex_dense, sglang_extend
from .peers import Skip, need_cuda
from .workloads import tree_ancestors, tree_depths

# What SGLang's kernel computes on a tree, beside the case's function.
ROW_INDEX_WINDOW = "window from the row index, not the tree's positions"


def _need_tree(inputs):
    if inputs.mask is None:
        raise Skip("the case is not a tree verify (no custom mask)")


def sglang_verify(inputs, *, layout="window"):
    """SGLang ``extend_attention_fwd`` as its Triton backend runs a target verify on a window
    layer: the tree's custom mask (``custom_mask``, ``mask_indptr``: its layout is the
    conventions', ``E * (P + E)`` entries a sequence), ``is_causal=True`` (the mask replaces
    causality among the new tokens), ``sliding_window_size=W-1``, sinks. Window layout: the
    last ``W-1`` prefix tokens in ``kv_indices`` and ``window_kv_offsets`` the prefix tokens
    left out (its kernel reads a mask row over the whole prefix from there); full layout:
    the whole prefix. The new tokens come from ``k``/``v``."""
    need_device(inputs)
    _need_tree(inputs)
    note = (f"; the tree's custom mask; its {ROW_INDEX_WINDOW}: checked against the reference "
            "with the window measured so")
    return sglang_extend(inputs, layout=layout, verify=(
        inputs.mask, inputs.mask_indptr.to(torch.int64), note,
        lambda: reference_first(inputs, positions=False), ROW_INDEX_WINDOW))


def tree_mask_mod(prefix, parents, window_left, chunk, device):
    """FlexAttention's ``mask_mod`` of a tree verify over dense keys ``[0, P + E)``: a cached
    key (``kv < P``) is seen under the window and chunk between positions, a new key (the
    ``kv - P``-th new token) when it is the query's ancestor or itself and within the window
    and chunk; the query ``q`` (the q-th new token) sits at ``P + depth[q]``."""
    depth = torch.tensor(tree_depths(parents), dtype=torch.int64, device=device)
    seen = torch.zeros(len(parents), len(parents), dtype=torch.bool)
    for i, nodes in enumerate(tree_ancestors(parents)):
        seen[i, list(nodes)] = True
    seen = seen.to(device)

    def mask_mod(b, h, q_idx, kv_idx):
        q_pos = prefix + depth[q_idx]
        is_new = kv_idx >= prefix
        node = (kv_idx - prefix).clamp(min=0)
        k_pos = torch.where(is_new, prefix + depth[node], kv_idx)
        keep = torch.where(is_new, seen[q_idx, node], kv_idx < prefix)
        if window_left is not None:
            keep = keep & (q_pos - k_pos <= window_left)
        if chunk is not None:
            keep = keep & (k_pos // chunk == q_pos // chunk)
        return keep

    return mask_mod


def flex_tree(inputs):
    """FlexAttention (``torch.compile``d), dense and unpaged: Q ``[B, Hq, E, D]``, K/V
    ``[B, Hkv, P + E, D]`` gathered from the pool outside the timed region, the block mask
    of :func:`tree_mask_mod` (one tree for every sequence), ``enable_gqa``. No sinks: a
    different function where the workload has them."""
    need_cuda(inputs)
    _need_tree(inputs)
    case = inputs.case
    new = case.seqs[0][1]
    return flex_dense(inputs, lambda prefix: tree_mask_mod(
        prefix, case.tree[:new], case.window_left, case.attention_chunk, inputs.q.device),
        "block mask of the tree, window between positions")
