"""The Qwen3-VL stage plan: execution order as transformers runs it, declarations, what replays read, what
the text side reads of the tower, and ``driftscope stages`` for a Qwen3-VL checkpoint."""

from __future__ import annotations

import json

import numpy as np
from driftscope.families.qwen3_vl.plan import replay_inputs, text_stages, vision_plan
from qwen3_vl_support import capture, checkpoint, config, image_paths

INTEGER = {"inputs.grid_thw", "inputs.image_tokens", "vision.cu_seqlens"}
TEXT_INTEGER = {
    "text.input_ids",
    "text.position_ids",
    "text.rope_deltas",
    "text.rope_delta",
    "text.embeds.text_slots_changed",
}


def test_plan_order_is_the_order_transformers_computes_the_stages():
    """transformers' taps are written as its forward computes them; the plan follows that order (v after q and
    k by convention: transformers has v from the qkv projection before it rotates q and k)."""
    plan = vision_plan(config())
    fired = [k for k in capture("transformers", "224").stage_ids() if k in plan and not k.startswith("inputs.")]
    moved_v = [k for k in fired if not k.endswith("attn.v")]
    for k in [k for k in fired if k.endswith("attn.v")]:
        moved_v.insert(moved_v.index(k.replace("attn.v", "attn.k")) + 1, k)
    assert sorted(fired, key=plan.position) == moved_v
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
    assert plan.meta["token_orders"] == {}
    assert plan.meta["tower_outputs"] == [
        "vision.merger",
        "vision.deepstack.0",
        "vision.deepstack.1",
        "vision.deepstack.2",
    ]
    text = text_stages(config(), max_new_tokens=4)
    assert {s.id for s in text if s.integer} == TEXT_INTEGER | {"text.generate.tokens", "text.forced.tokens"}
    ids = [s.id for s in text]
    assert [i for i in ids if i.endswith(".deepstack")] == [f"text.layer.{i}.deepstack" for i in range(3)]
    assert ids.index("text.layer.0.last") < ids.index("text.layer.0.deepstack") < ids.index("text.layer.1.last")


def test_replays_read_earlier_stages_and_every_vision_operator_replays():
    plan = vision_plan(config())
    replayable = [s.id for s in plan if replay_inputs(s.id, plan)]
    for stage_id in replayable:
        assert all(plan.position(s) < plan.position(stage_id) for s in replay_inputs(stage_id, plan)), stage_id
    assert replay_inputs("vision.pos_embed", plan) == ("inputs.grid_thw",)
    assert replay_inputs("vision.block.0.norm1", plan) == ("vision.positioned",)
    assert replay_inputs("vision.block.2.residual1", plan) == ("vision.block.1", "vision.block.2.attn.out")
    assert replay_inputs("vision.deepstack.2.norm", plan) == ("vision.block.4",)
    assert replay_inputs("vision.deepstack.2", plan) == ("vision.deepstack.2.act",)
    assert replay_inputs("vision.merger.norm", plan) == ("vision.block.5",)
    not_replayed = {s.id for s in plan} - set(replayable)
    assert not_replayed == INTEGER | {"inputs.pixel_values", "vision.rotary.cos", "vision.rotary.sin"}


def test_each_text_layer_reads_its_predecessor_after_the_deepstack_add_and_each_add_is_a_stage():
    """Layer k+1 reads layer k's whole output with the image rows after branch k's add (a view); the add itself
    reads layer k's image rows and branch k, so a wrong injection is introduced at ``text.layer.k.deepstack``."""
    from driftscope.taps.stages import StagePlan

    vision = vision_plan(config())
    plan = StagePlan(vision.family, vision.stages + text_stages(config(), 4), vision.depth, vision.meta)
    assert replay_inputs("text.layer.0", plan) == ("text.embeds@sequence",)
    assert replay_inputs("text.layer.0.image", plan) == ("text.embeds@sequence",)
    assert replay_inputs("text.layer.0.deepstack", plan) == ("text.layer.0.image", "vision.deepstack.0")
    assert replay_inputs("text.layer.1.last", plan) == ("text.layer.0.deepstack@sequence",)
    assert replay_inputs("text.layer.3", plan) == ("text.layer.2.deepstack@sequence",)  # 3 branches, 4 layers
    assert "text.layer.3.image" not in plan and "text.layer.3.deepstack" not in plan
    assert replay_inputs("text.norm.last", plan) == ("text.layer.3.last",)
    assert replay_inputs("text.logits.last", plan) == ("text.norm.last",)
    assert replay_inputs("text.input_ids", plan) is None and replay_inputs("text.generate.tokens", plan) is None
    ids = plan.ids()
    assert ids.index("text.layer.0") < ids.index("text.layer.0.image") < ids.index("text.layer.0.deepstack")


def test_driftscope_stages_gives_every_stage_the_shape_the_oracle_writes():
    from driftscope.capture.stage_listing import list_stages

    listed = json.loads(list_stages(str(checkpoint().path), [str(p) for p in image_paths("224")], as_json=True))
    taps = capture("transformers", "224")
    assert listed["inputs"]["grid_thw"] == [[1, 16, 16]]
    for row in listed["stages"]:
        assert all(isinstance(size, int) for size in row["shape"]), row
        assert row["shape"] == list(np.asarray(taps[row["stage"]]).shape), row["stage"]
