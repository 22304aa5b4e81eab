"""KV shapes of real models, as ``swattn memory-sim`` counts them: each model's layer groups,
with how many layers each holds and the bytes one token costs a layer.

Bytes per token per layer: K and V of every KV head in bf16, ``2 * heads * head_dim * 2``;
DeepSeek-V4 keeps one 512-dim vector a token that is both K and V (``512 * 2``), and its
compressed caches keep one entry every ``rate`` tokens (the CSA layers' entries carry the
indexer's 128-dim key too). The layer counts and windows are the models' configs in
transformers (``layer_types``, ``sliding_window``, ``attention_chunk_size``); a Hugging Face
``sliding_window = W`` is ``window_left = W - 1``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GroupShape:
    """One layer group of a model: ``layers`` layers of ``bytes_per_token`` each (per token
    of the sequence: a compressed cache's entry bytes divided by its rate), with the window
    and chunk of :class:`swattn.memory.LayerGroup`."""

    name: str
    layers: int
    bytes_per_token: float
    window_left: int | None = None
    attention_chunk: int | None = None

    @property
    def slides(self):
        return self.window_left is not None or self.attention_chunk is not None


@dataclass(frozen=True)
class ModelShape:
    name: str
    groups: tuple
    page_size: int
    note: str = ""

    def bytes_per_token(self, sliding=None):
        """Bytes one token costs every layer (``sliding``: only the sliding or only the
        other groups)."""
        return sum(g.layers * g.bytes_per_token for g in self.groups
                   if sliding is None or g.slides == sliding)


def _kv(heads, head_dim):
    return 2 * heads * head_dim * 2


MODELS = {
    "gpt-oss-120b": ModelShape(
        "gpt-oss-120b",
        (GroupShape("window", 18, _kv(8, 64), window_left=127),
         GroupShape("full", 18, _kv(8, 64))),
        page_size=16, note="36 layers alternating window 128 / full; 8 KV heads of 64"),
    "gemma-3-27b": ModelShape(
        "gemma-3-27b",
        (GroupShape("window", 52, _kv(16, 128), window_left=1023),
         GroupShape("full", 10, _kv(16, 128))),
        page_size=16, note="62 layers, 5 window 1024 : 1 full; 16 KV heads of 128"),
    "llama-4-scout": ModelShape(
        "llama-4-scout",
        (GroupShape("chunk", 36, _kv(8, 128), attention_chunk=8192),
         GroupShape("full", 12, _kv(8, 128))),
        page_size=16, note="48 layers, 3 chunked (8192) : 1 full; 8 KV heads of 128"),
    "deepseek-v4": ModelShape(
        "deepseek-v4",
        (GroupShape("window", 43, 512 * 2, window_left=127),
         GroupShape("csa", 20, (512 + 128) * 2 / 4),
         GroupShape("hca", 23, 512 * 2 / 128)),
        page_size=256, note="43 layers each with a 128-token window (one 512-dim K=V head), "
                            "20 CSA (4:1, with the indexer's keys) and 23 HCA (128:1) caches; "
                            "pages of 256 tokens as its engines require"),
}
