"""attn_implementation="swattn" applies every argument and mask it is handed or refuses it by
name: one regression test for each way something used to be taken and not applied (each
failed before the fix). On the CPU (interpreter) with tiny random-weight models."""

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")
import hf_models  # noqa: E402
from transformers.masking_utils import causal_mask_function  # noqa: E402

import swattn.integrations.transformers as swattn_hf  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32
TOL = 3e-2 if DEVICE == "cuda" else 1e-5


def _model(family="mistral"):
    model = hf_models.build(family, dtype=DTYPE, device=DEVICE)
    model.set_attn_implementation("swattn")
    return model


def _qkv(batch=3, queries=11, keys=11, heads=4, kv_heads=2, dim=16):
    """Random query/key/value in transformers' layout, [B, H, S, D]."""
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(batch, h, n, dim, generator=g).to(DEVICE, DTYPE)
                 for h, n in ((heads, queries), (kv_heads, keys), (kv_heads, keys)))


def _attention(module, mask=None, **kwargs):
    q, k, v = _qkv()
    return swattn_hf.swattn_attention(module, q, k, v, mask, scaling=0.25, **kwargs)


def test_an_unknown_keyword_is_refused_not_dropped():
    """A keyword argument the model passed down (here a caller's own, which transformers
    forwards to every layer) vanished into ``**kwargs``: it is refused by name. The harmless
    ones transformers passes (position_ids, use_cache, output_hidden_states) still run."""
    model = _model()
    ids, mask = hf_models.padded_batch(device=DEVICE)
    with torch.no_grad():
        assert model(ids, attention_mask=mask, output_hidden_states=True).hidden_states
        with pytest.raises(NotImplementedError, match="foo_bar"):
            model(ids, attention_mask=mask, foo_bar=3)
    with pytest.raises(NotImplementedError, match="foo_bar"):
        swattn_hf.swattn_mask(3, 11, 11, mask_function=causal_mask_function, foo_bar=3)


def test_sparse_indices_are_refused():
    """DeepSeek-V3.2-style sparse attention passes its indexer's top-k as ``indices=``: it
    was swallowed, and the call ran dense attention over every key. Served for DeepSeek-V3.2
    (its own test); any other model's layer refuses it."""
    module = _model().model.layers[0].self_attn
    top_k = torch.zeros(3, 11, 2, dtype=torch.int64, device=DEVICE)
    with pytest.raises(NotImplementedError, match="indices"):
        _attention(module, indices=top_k)


def test_output_attentions_is_refused():
    """``output_attentions=True`` returned an empty tuple of attention weights, silently."""
    model = _model()
    ids, mask = hf_models.padded_batch(device=DEVICE)
    with torch.no_grad(), pytest.raises(NotImplementedError, match="output_attentions"):
        model(ids, attention_mask=mask, output_attentions=True)


def test_packed_sequence_lengths_are_refused():
    """``cu_seq_lens_q``/``cu_seq_lens_k`` (packed sequences) were dropped: every row ran as
    one sequence, attending across the packed boundaries."""
    module = _model().model.layers[0].self_attn
    cu = torch.tensor([0, 5, 11], dtype=torch.int32, device=DEVICE)
    with pytest.raises(NotImplementedError, match="cu_seq_lens_q"):
        _attention(module, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=6, max_length_k=6)


def test_sinks_the_layer_does_not_pass_are_refused():
    """A layer holding attention sinks that its eager attention reads from ``module.sinks``
    ran without them when it passed no ``s_aux``."""
    module = _model("gpt-oss").model.layers[0].self_attn
    with pytest.raises(NotImplementedError, match="sinks"):
        _attention(module)


def test_a_padding_mask_wider_than_the_tokens_is_refused():
    """A 2D attention_mask with more columns than tokens was cut to its last columns (eager
    reads the first ones): a shifted padding, answered without a word."""
    model = _model()
    ids, mask = hf_models.padded_batch(device=DEVICE)
    wider = torch.cat([mask, torch.zeros_like(mask[:, :2])], 1)
    with torch.no_grad(), pytest.raises(ValueError, match="one column a token"):
        model(ids, attention_mask=wider)


def test_a_mask_extended_over_keys_it_was_not_built_for_is_refused():
    """DeepSeek-V4 extends the layer's mask over the compressed entries it appends after the
    window's keys: the added columns were read as padding of the queries' own keys, and every
    row after the first compressed entry came out zeros. A mask the mask function did not
    build for the layer's keys is refused, as is a 4D mask of the caller's (DeepSeek-V4's
    extension is now placed by the model's own layers, its own test)."""
    module = _model().model.layers[0].self_attn
    _, mask = hf_models.padded_batch(device=DEVICE)
    built = swattn_hf.swattn_mask(3, 11, 11, mask_function=causal_mask_function,
                                  attention_mask=mask.bool(), device=DEVICE)
    extended = F.pad(built, (0, 2), value=False)  # two entries past the layer's keys
    q, k, v = _qkv(keys=13)
    with pytest.raises(ValueError, match="did not build"):
        swattn_hf.swattn_attention(module, q, k, v, extended, scaling=0.25)
    custom = torch.ones(3, 1, 11, 11, dtype=torch.bool, device=DEVICE).tril()
    with pytest.raises(ValueError, match="did not build"):
        _attention(module, custom)
    # The mask as built, and a slice of its last queries (Gemma 4's KV-shared layers), run.
    assert _attention(module, built)[0].isfinite().all()
    q, k, v = _qkv(queries=1)
    out, _ = swattn_hf.swattn_attention(module, q, k, v, built[:, :, -1:], scaling=0.25)
    assert out.isfinite().all()


def _deepseek(family):
    why = hf_models.missing(family)
    if why:
        pytest.skip(why)
    return _model(family)


@pytest.mark.parametrize("family,named", [
    ("deepseek-v3.2", "DeepSeek-V3.2"), ("deepseek-v4", "DeepSeek-V4")])
def test_continuous_batching_refuses_the_deepseeks_by_name(family, named):
    """DeepSeek-V3.2 (indexer top-k) and DeepSeek-V4 (compressed keys) are served by 'swattn'
    through swattn's second key source; 'paged|swattn' has none and would run them as plain
    window attention over the paged cache (V3.2's top-k swallowed, V4's entries read as
    keys): it refuses them by name."""
    module = _deepseek(family).model.layers[-1].self_attn
    q, k, v = _qkv(batch=1)
    with pytest.raises(NotImplementedError, match=named):
        swattn_hf.swattn_paged_attention(module, q, k, v, None, cache=object(), read_index=[],
                                         write_index=[])


def test_deepseek_v4_positions_that_count_the_padding_are_refused():
    """DeepSeek-V4's compressed entries are causal by position. A left-padded forward without
    position_ids counts each row's padding (the model's arange): eager's mask then shows a
    row other entries than swattn's positions, counted from the row's first token as
    generate counts them, would. Refused, naming position_ids; with generate's positions
    it runs."""
    model = _deepseek("deepseek-v4")
    ids, mask = hf_models.padded_batch(device=DEVICE)
    with torch.no_grad():
        with pytest.raises(NotImplementedError, match="position_ids"):
            model(ids, attention_mask=mask)
        positions = hf_models.positions(mask)
        assert model(ids, attention_mask=mask, position_ids=positions).logits.isfinite().all()


def test_paged_refuses_what_it_does_not_apply():
    """``paged|swattn`` dropped unknown keyword arguments unread and never looked at the
    attention_mask it was handed."""
    module = _model().model.layers[0].self_attn
    q, k, v = _qkv(batch=1)
    with pytest.raises(NotImplementedError, match="foo_bar"):
        swattn_hf.swattn_paged_attention(module, q, k, v, None, foo_bar=1)
    cu = torch.tensor([0, 11], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="attention_mask"):
        swattn_hf.swattn_paged_attention(module, q, k, v, torch.zeros(1, 1, 11, 11, device=DEVICE),
                                         cache=object(), read_index=[], write_index=[],
                                         cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_seqlen_q=11,
                                         max_seqlen_k=11)


def test_deterministic_reaches_the_kernel(monkeypatch):
    """``deterministic=True`` is applied (swattn's single-pass kernel), not dropped."""
    module = _model().model.layers[0].self_attn
    seen = []
    extend = swattn_hf.extend_attention

    def spy(*args, **kwargs):
        seen.append(kwargs["deterministic"])
        return extend(*args, **kwargs)

    monkeypatch.setattr(swattn_hf, "extend_attention", spy)
    plain = _attention(module)[0]
    single_pass = _attention(module, deterministic=True)[0]
    assert ((single_pass - plain).abs().max() / plain.abs().max()).item() < TOL
    assert seen == [False, True]
