"""Other projects' model-tester configs (issue 32 item 10), built as tiny checkpoints by
``fixtures/make_tester_configs.py`` (their settings, our seeded weights), run through every runtime that can load
them under the strict f32 contract (IREE under ``-m slow``: see ``_pairs``). A runtime that cannot represent a
config is skipped with the reason below.

Each config is captured once per module and runtime, on the 56x56 shapes image, with a two-token answer; mlx-vlm's
Molmo2 runs with the family's known-defect patch, as in the shared family tests.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ROOT
from driftscope.capture.patches import parse_patch
from driftscope.capture.runtimes import get_runtime
from driftscope.families import get_family
from driftscope.judge.compare import compare_tapsets
from driftscope.judge.contract import load_contract
from driftscope.taps.stages import StagePlan, StageSelection
from make_tester_configs import TESTER_CONFIGS, get

IMAGE = ROOT / "fixtures" / "images" / "shapes_56.png"
STRICT = load_contract(ROOT / "parameters" / "contracts" / "strict.yaml")
ORACLE = "transformers"
#: (config, runtime) -> why that runtime cannot represent the config, naming the setting
KNOWN_LIMITS = {
    ("tester-qwen2_5-vl-transformers", "mlx"): (
        "vision_config.spatial_merge_size 1: mlx-vlm's Qwen2.5-VL PatchMerger is built for 2x2 merges whatever the "
        "config says (PatchMerger(dim, context_dim) leaves spatial_merge_size at its default 2), so the merger's "
        "weights do not load"
    ),
}


def _pairs() -> list:
    """Every config with every runtime its family supports but the oracle. The IREE cases (~15-28 s of compiles
    each) are ``-m slow``: by default the same emitted StableHLO runs on XLA (``[<config>-jax]``, the same config,
    the 1x1-merge Qwen2.5-VL one included, whose merge only the compiled path runs) and each family's emitter goes
    through iree-compile and iree.runtime in tests/families/test_families.py
    (``test_every_runtime_captures_the_whole_plan[<family>-iree]``)."""
    return [
        pytest.param(
            config.name,
            runtime,
            marks=[pytest.mark.slow] if runtime == "iree" else [],
            id=f"{config.name}-{runtime}",
        )
        for config in TESTER_CONFIGS
        for runtime in sorted(get_family(config.family).engines)
        if runtime != ORACLE
    ]


@pytest.fixture(scope="module")
def case():
    """name -> (checkpoint, inputs with a two-token prompt, the whole plan), built once."""
    from driftscope.families.checkpoints import open_checkpoint

    built = {}

    def get_case(name: str):
        if name not in built:
            checkpoint = open_checkpoint(get(name).ensure())
            family = get_family(checkpoint.family)
            inputs = family.prepare_inputs(checkpoint, [IMAGE])
            inputs.text = family.text_inputs(checkpoint, inputs, max_new_tokens=2)
            plan = family.vision_plan(checkpoint.config).select(StageSelection.everything())
            plan = StagePlan(plan.family, plan.stages + family.text_stages(checkpoint.config, 2), plan.depth, plan.meta)
            built[name] = (checkpoint, inputs, plan)
        return built[name]

    return get_case


@pytest.fixture(scope="module")
def capture(case, tmp_path_factory):
    """(name, runtime) -> the TapSet of the whole plan in f32, captured once."""
    out = tmp_path_factory.mktemp("tester-configs")
    done = {}

    def get_tapset(name: str, runtime_name: str):
        if (name, runtime_name) not in done:
            checkpoint, inputs, plan = case(name)
            patch = get_family(plan.family).known_defects.get(runtime_name)  # a port's known defects: not round-off
            runtime = get_runtime(runtime_name)(checkpoint, "f32", parse_patch(patch))
            done[(name, runtime_name)] = runtime.capture(inputs, plan, out / name / runtime_name)
            runtime.release()
        return done[(name, runtime_name)]

    return get_tapset


@pytest.mark.parametrize("name,runtime_name", _pairs())
def test_every_runtime_agrees_with_the_oracle_on_the_tester_config(name, runtime_name, case, capture):
    if (name, runtime_name) in KNOWN_LIMITS:
        pytest.skip(KNOWN_LIMITS[(name, runtime_name)])
    _, _, plan = case(name)
    oracle, candidate = capture(name, ORACLE), capture(name, runtime_name)
    decodes = get_runtime(runtime_name).decodes_with(plan.family)
    expected = {stage.id for stage in plan if decodes or not stage.id.startswith("text.generate.")}
    assert set(candidate.stage_ids()) == expected
    rows = [row for row in compare_tapsets(oracle, candidate, STRICT, plan) if row.stage in expected]
    failing = [(row.stage, row.status, row.max_abs) for row in rows if row.status != "pass"]
    assert not failing, failing
    assert np.asarray(oracle["text.logits.last"]).size > 0


def test_a_known_limit_is_real(case):
    """The skipped pair is refused for the stated reason, before loading: the family names the setting its MLX
    port cannot represent (a port-limit error, not a checkpoint error: config.json is right)."""
    from driftscope.errors import PortLimitError

    checkpoint, _, _ = case("tester-qwen2_5-vl-transformers")
    with pytest.raises(PortLimitError, match=r"vision_config\.spatial_merge_size is 1") as caught:
        get_runtime("mlx")(checkpoint, "f32").load()
    assert "config.json is right" in caught.value.fix


def test_a_tower_without_full_attention_blocks_still_gives_replay_its_side_stages(case, capture, tmp_path):
    """transformers' Qwen2.5-VL tester: depth 2, full attention at [7, 15, 23, 31] (none within the depth). The
    full-attention bounds (one segment per image: 4 x 4 patches) are captured anyway, and replay runs on them."""
    from driftscope.replay.drilldown import replay_tapset

    name = "tester-qwen2_5-vl-transformers"
    checkpoint, _, plan = case(name)
    reference = capture(name, ORACLE)
    assert plan.meta["fullatt_block_indexes"] == [7, 15, 23, 31] and plan.depth == 2
    assert np.asarray(reference["vision.cu_seqlens"]).tolist() == [0, 16]
    assert np.asarray(reference["vision.cu_window_seqlens"]).tolist() == [0, 16]  # one 8x8-patch window
    runtime = get_runtime("jax")(checkpoint, "f32")
    replayed = replay_tapset(reference, runtime, plan, tmp_path / "replay")
    runtime.release()
    family = get_family(plan.family)
    replayable = {stage.id for stage in plan if family.replay_inputs(stage.id, plan)}
    assert "vision.block.1" in replayable and set(replayed.stage_ids()) == replayable
    for row in compare_tapsets(reference, replayed, STRICT, plan):
        if row.stage in replayable:  # the reference's own inputs, the candidate's operator, f32: round-off only
            assert row.status == "pass" and row.max_abs < 1e-4, (row.stage, row.max_abs)


def test_qwen3_vl_without_deepstack_prefills_in_the_compiled_path(case, capture):
    """mlx-vlm's Qwen3-VL test config has ``deepstack_visual_indexes: []``: no branch stage in the plan, and the
    JAX prefill's last logits are transformers' within the strict contract's 1e-4."""
    name = "tester-qwen3-vl-mlx"
    _, _, plan = case(name)
    assert not [stage.id for stage in plan if "deepstack" in stage.id]
    oracle, emitted = capture(name, ORACLE), capture(name, "jax")
    expected, got = np.asarray(oracle["text.logits.last"]), np.asarray(emitted["text.logits.last"])
    assert got.shape == expected.shape and np.abs(got - expected).max() < 1e-4
    assert np.asarray(emitted["text.generate.tokens"]).tolist() == np.asarray(oracle["text.generate.tokens"]).tolist()
