"""The reference's decode cache keeps every position (``transformers_taps.full_cache``).

The Idefics3 / SmolVLM testers' Llama carries ``sliding_window: 32``. transformers 5.24's ``DynamicCache(config=...)``
builds sliding-window layers from it (keeping the last 31 positions) although ``LlamaAttention`` applies no window:
on transformers' own cache the decode attends to 31 positions of a 69-token prompt, a cache quirk rather than the
model's math. A model that does slide (Idefics2's Mistral) masks the window itself, so a full cache decodes it the
same."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ROOT, SHAPES
from generic_sweep_support import investigate_sweep, rows, verdict

PROMPT = "Name every shape in the image and its colour."


def _model_and_inputs(model_type: str):
    import torch
    import transformers
    from driftscope.families.checkpoints import open_checkpoint
    from driftscope.families.generic.calls import transformers_kwargs
    from driftscope.families.generic.processor import build_text_inputs, prepare_inputs

    checkpoint = open_checkpoint(ROOT / "fixtures" / "checkpoints" / f"generic-{model_type}")
    inputs = prepare_inputs(checkpoint, [SHAPES])
    inputs.text = build_text_inputs(checkpoint, inputs, PROMPT, max_new_tokens=4)
    model = transformers.AutoModelForImageTextToText.from_pretrained(
        str(checkpoint.path), dtype=torch.float32, attn_implementation="eager"
    ).eval()
    return model, transformers_kwargs(inputs)


def _decode(model, kwargs, cache, steps: int = 5) -> np.ndarray:
    import torch

    with torch.no_grad():
        logits = [model(**kwargs, cache=cache, use_cache=True).logits[0, -1]]
        for _ in range(steps):
            token = torch.tensor([[int(logits[-1].argmax())]])
            logits.append(model(input_ids=token, cache=cache, use_cache=True).logits[0, -1])
    return torch.stack(logits).numpy()


@pytest.mark.parametrize("model_type", ["idefics3", pytest.param("smolvlm", marks=pytest.mark.slow)])  # one config
def test_a_llama_with_a_sliding_window_setting_decodes_on_every_position(model_type, tmp_path):
    """With the full cache the two runtimes' answers and caches agree: every prompt position on both sides."""
    report = investigate_sweep(model_type, tmp_path)
    found = rows(report)
    prompt = found["text.input_ids"]["reference_shape"][0]
    for stage in ("text.cache.prefill.keys", "text.cache.prefill.values"):
        assert found[stage]["reference_shape"] == found[stage]["candidate_shape"]
        assert found[stage]["reference_shape"][2] == prompt > 32  # past the window the quirk would keep
    assert found["text.generate.tokens"]["status"] == "pass"
    assert verdict(report) == "pass"


def test_a_model_that_slides_decodes_the_same_on_the_full_cache():
    """Idefics2's Mistral masks its 32-position window itself: its decode on the full cache equals its decode on
    transformers' own sliding-window cache (which keeps 31 positions of each layer)."""
    from driftscope.families.generic.transformers_taps import full_cache
    from transformers.cache_utils import DynamicCache

    model, kwargs = _model_and_inputs("idefics2")
    own, full = DynamicCache(config=model.config), full_cache(model)
    expected, found = _decode(model, kwargs, own), _decode(model, kwargs, full)
    assert [layer.keys.shape[-2] for layer in own.layers] == [31] * 3
    assert all(layer.keys.shape[-2] > 32 for layer in full.layers)
    np.testing.assert_allclose(found, expected, atol=2e-5, rtol=0)


def test_the_full_cache_keeps_a_hybrid_models_other_layers():
    """LFM2's convolution layers keep transformers' own cache layer (no keys): only sliding layers change."""
    from driftscope.families.generic.transformers_taps import full_cache
    from transformers.cache_utils import DynamicCache

    model, _ = _model_and_inputs("lfm2_vl")
    own = [type(layer).__name__ for layer in DynamicCache(config=model.config).layers]
    assert [type(layer).__name__ for layer in full_cache(model).layers] == own
    assert "LinearAttentionLayer" in own
