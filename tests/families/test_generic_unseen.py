"""A model type nobody here has written or tried anything for: GLM-4.5V's MoE variant (``glm4v_moe``), its tiny
checkpoint built in this test from transformers' own model tester settings, investigated by the generic family at
block level, with same-input replay and answer parity, without a line of family code (issue 48)."""

from __future__ import annotations

import json

import numpy as np
from conftest import SHAPES

#: transformers tests/models/glm4v_moe/test_modeling_glm4v_moe.py, Glm4vMoeVisionText2TextModelTester; widths raised
#: where torch's grouped expert matmul wants 16-byte strides (22 -> 24) and where mlx-vlm 0.7.10's GLM-4.5V needs
#: three M-RoPE sections (hidden 16 -> 32: head_dim 16, half of it rotary, sections [2, 1, 1]); use_qk_norm, which
#: mlx-vlm's text config requires and the hub's config.json carries, is given
TEXT = {
    "hidden_size": 32,
    "intermediate_size": 24,
    "moe_intermediate_size": 24,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "hidden_act": "silu",
    "max_position_embeddings": 512,
    "rope_parameters": {"rope_type": "default", "mrope_section": [2, 1, 1], "rope_theta": 10000},
    "tie_word_embeddings": False,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "num_experts_per_tok": 8,
    "use_qk_norm": False,
}
VISION = {
    "depth": 2,
    "hidden_act": "silu",
    "hidden_size": 48,
    "out_hidden_size": 32,
    "intermediate_size": 22,
    "patch_size": 14,
    "spatial_merge_size": 1,
    "temporal_patch_size": 2,
}


def _checkpoint(folder):
    """The tiny GLM-4.5V: its own config and weights, GLM-4.1V's tokenizer and processor (the same classes)."""
    from driftscope.families.generic.testers import VOCAB
    from driftscope.families.generic.tiny import build_model, build_tokenizer
    from driftscope.families.generic.tiny_processor import save_processor
    from driftscope.families.generic.tokens import SPECS
    from transformers import AutoConfig

    tokenizer = build_tokenizer("glm4v")
    ids = {key: tokenizer.convert_tokens_to_ids(token) for key, token in SPECS["glm4v"].ids.items() if "." not in key}
    config = AutoConfig.for_model(
        "glm4v_moe", text_config={**TEXT, "vocab_size": VOCAB}, vision_config=VISION, tie_word_embeddings=False, **ids
    )
    build_model(config, seed=0).save_pretrained(folder)
    save_processor("glm4v", folder, tokenizer, SPECS["glm4v"].template)
    return folder


def test_a_model_type_nobody_tried_is_investigated_at_block_level_with_replay_and_answer(tmp_path):
    from driftscope.core.paths import REPO_ROOT
    from driftscope.families import get_family
    from driftscope.run.investigation import investigate
    from driftscope.run.params import parse_parameters

    checkpoint = _checkpoint(tmp_path / "glm4v_moe")
    assert json.loads((checkpoint / "config.json").read_text())["model_type"] == "glm4v_moe"
    assert "glm4v_moe" not in str(get_family("generic").hypothesis_module().CLOSES)  # nothing written for it
    params = {
        "name": "unseen",
        "checkpoint": str(checkpoint),
        "images": [str(SHAPES)],
        "runtimes": [{"runtime": "transformers", "policy": "f32"}, {"runtime": "mlx", "policy": "f32"}],
        "text": {"prompt": "Name every shape.", "max_new_tokens": 3},
        "notebooks": [],
    }
    report = investigate(parse_parameters(params, source=None, base=REPO_ROOT), tmp_path / "run")
    assert report.status == "complete" and report.data["family"] == "generic"
    rows = {row.stage: row for row in report.rows}
    blocks = [stage for stage in rows if stage.startswith("vision.block.") and stage.count(".") == 2]
    assert blocks == ["vision.block.0", "vision.block.1"], blocks
    assert {"text.layer.0", "text.layer.1", "text.logits.last"} <= set(rows)
    assert all(rows[stage].status in ("pass", "fail") for stage in (*blocks, "text.layer.1", "text.logits.last"))
    labels = report.data["replay"]["mlx:f32"]["labels"]
    assert {label["stage"] for label in labels} >= {"vision.block.0", "vision.block.1", "text.layer.0"}
    answer = report.data["answer"]["runtimes"]
    assert len(answer["transformers:f32"]["tokens"]) == len(answer["mlx:f32"]["tokens"]) == 3
    forced = np.asarray(report.pair_tapsets(report.pair_keys()[0])[1]["text.forced.logits"])
    assert forced.shape[0] == 3  # the candidate fed the reference's tokens, step by step
    conclusion = report.data["conclusions"]["mlx:f32"]
    assert conclusion["text"]  # one conclusion, whatever it found
