"""What each aligned module's stage compares, read from the two models: the output a module computed last where it
returns several arrays (on both sides), the first arrays where only those compare; a scale one side applies inside
the module and the other after it; a tensor one side holds in one module and the other in two (a tied head)."""

from __future__ import annotations

import math

import pytest
from conftest import ROOT


def _entries(model_type: str) -> dict[str, dict]:
    from driftscope.families.checkpoints import open_checkpoint
    from driftscope.families.generic.plan import generic_plan
    from driftscope.families.generic.reading import structure_of

    checkpoint = open_checkpoint(ROOT / "fixtures" / "checkpoints" / f"generic-{model_type}")
    return generic_plan(structure_of(checkpoint), 1).meta["generic"]["stages"]


def test_a_tower_returning_its_merger_beside_its_hidden_states_is_compared_at_the_merger():
    """transformers' GLM-4.1V tower returns ``last_hidden_state`` (before the merger) and ``pooler_output`` (the
    merger's); mlx-vlm's returns the merger's alone. Both have the tester's shape [25, 16]: the first arrays would be
    compared as the same thing. The stage takes what each tower computed last."""
    entry = _entries("glm4v")["vision.output"]
    assert entry["torch_item"] == ["pooler_output"] and entry["mlx_item"] is None
    assert entry["refusal"] is None


def test_a_merged_tower_output_becomes_comparable():
    """Qwen2-VL: [6, 32] merged tokens on both sides where the first arrays were [24, 32] against [6, 32]."""
    entry = _entries("qwen2_vl")["vision.output"]
    assert entry["torch_item"] == ["pooler_output"] and entry["refusal"] is None


def test_a_pooling_head_only_one_side_returns_falls_back_to_the_first_arrays():
    """LLaVA-OneVision's SigLIP: transformers' tower computes its pooling head last ([2, 32]), mlx-vlm's returns no
    head output: the last-computed arrays cannot be compared, the first ones ([2, 4, 32] each) can."""
    entry = _entries("llava_onevision")["vision.output"]
    assert entry["torch_item"] is None and entry["mlx_item"] is None
    assert entry["refusal"] is None and entry["layout"] is not None


@pytest.mark.parametrize("model_type", ["paligemma", "gemma3"])
def test_a_scaled_embedding_is_compared_with_its_scale(model_type):
    """transformers' Gemma embeddings multiply by sqrt(hidden) inside the module, mlx-vlm's after it: the stage
    compares the MLX rows times that scale (Gemma 3's head, tied to the embedding, is a module of its own in mlx-vlm:
    the embedding still pairs with the embedding)."""
    entry = _entries(model_type)["text.embed_tokens"]
    assert entry["mlx"] == "language_model.model.embed_tokens"
    assert entry["scale"] == pytest.approx(math.sqrt(32), rel=1e-6)
