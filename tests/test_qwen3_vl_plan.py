"""The Qwen3-VL stage plan: execution order as transformers runs it, declarations, and complete capture."""

from __future__ import annotations

from driftscope.families.qwen3_vl.plan import replay_inputs, text_stages, vision_plan
from qwen3_vl_support import config, jax_taps, mlx_taps, reference

INTEGER = {"inputs.grid_thw", "inputs.image_tokens", "vision.cu_seqlens"}
TEXT_INTEGER = {"text.input_ids", "text.position_ids", "text.rope_deltas", "text.embeds.text_slots_changed"}


def test_plan_order_is_the_order_transformers_runs_the_stages():
    """The reference taps are recorded as the forward computes them: the plan follows that order (q, k
    before v by convention: transformers has v from the qkv projection before it rotates q and k)."""
    plan = vision_plan(config())
    fired = [k for k in reference("224") if k in plan]
    by_plan = sorted(fired, key=plan.position)
    moved_v = [k for k in fired if not k.endswith("attn.v")]
    for k in [k for k in fired if k.endswith("attn.v")]:
        moved_v.insert(moved_v.index(k.replace("attn.v", "attn.k")) + 1, k)
    assert by_plan == moved_v
    assert set(fired) == {s.id for s in plan if not s.id.startswith("inputs.")}


def test_deepstack_branches_sit_right_after_their_blocks():
    ids = vision_plan(config()).ids()
    for branch, block in enumerate([1, 3, 4]):
        start = ids.index(f"vision.block.{block}") + 1
        assert ids[start : start + 4] == [
            f"vision.deepstack.{branch}.norm",
            f"vision.deepstack.{branch}.fc1",
            f"vision.deepstack.{branch}.act",
            f"vision.deepstack.{branch}",
        ]
    assert ids[-4:] == ["vision.merger.norm", "vision.merger.fc1", "vision.merger.act", "vision.merger"]


def test_declarations():
    plan = vision_plan(config())
    assert {s.id for s in plan if s.integer} == INTEGER
    tokens = [s for s in plan if s.axes and s.axes[0] in ("tokens", "merged_tokens", "patches")]
    assert {s.token_order for s in tokens} == {"raster"}
    assert {s.id for s in tokens if s.token_unit == "merged"} == {
        s.id for s in plan if s.id.startswith(("vision.deepstack", "vision.merger.fc1", "vision.merger.act"))
    } | {"vision.merger"}
    assert plan["vision.merger.norm"].token_unit == "patch"  # the main merger normalizes before the regroup
    assert len([s for s in plan if s.block == 5]) == 12 and plan.depth == 6
    text = text_stages(config(), max_new_tokens=4)
    assert {s.id for s in text if s.integer} == TEXT_INTEGER | {"text.generate.tokens"}
    assert [s.id for s in text if s.id.endswith(".deepstack")] == [f"text.layer.{i}.deepstack" for i in range(3)]


def test_every_runtime_captures_the_whole_vision_plan_and_the_text_stages_it_computes():
    plan = vision_plan(config())
    vision = {s.id for s in plan if not s.id.startswith("inputs.")}
    text = {s.id for s in text_stages(config(), 4)} - {
        "text.input_ids",
        "text.rope_deltas",
        "text.embeds.text",
        "text.embeds.text_slots_changed",
        "text.generate.tokens",
        "text.generate.margins",
    }  # written by the engine from the prompt and the decode loop, not by the family's taps
    assert vision | text <= set(reference("224"))
    assert vision | text <= set(mlx_taps("224"))
    assert (vision - {"vision.cu_seqlens"}) | (text - {"text.embeds.image"}) <= set(jax_taps("224"))


def test_replay_inputs_name_earlier_stages_of_the_plan():
    plan = vision_plan(config())
    replayable = 0
    for stage in plan:
        sources = replay_inputs(stage.id, config())
        if sources is None:
            continue
        replayable += 1
        assert all(plan.position(s) < plan.position(stage.id) for s in sources), stage.id
    assert replay_inputs("vision.block.0.norm1", config()) == ("vision.positioned",)
    assert replay_inputs("vision.deepstack.2.norm", config()) == ("vision.block.4",)
    assert replay_inputs("vision.merger.norm", config()) == ("vision.block.5",)
    assert replayable == len(plan) - 8
