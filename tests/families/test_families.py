"""Shared tests every registered model family passes; a new family folder is picked up from the registry.

Each family's tiny checkpoint (its ``TinyFixture``) runs through every runtime the family supports: the
plan is captured completely by each, every replayable stage has an operator in every replaying runtime
(and replays the oracle's own stage to within 1e-4 in f32), the JAX emitter matches the transformers
oracle within 1e-4, and the family's mutations first disturb the stages they declare.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import ROOT, family_power_capture
from driftscope.capture.patches import parse_patch
from driftscope.capture.runtimes import get_runtime
from driftscope.families import FAMILIES, GENERIC, detect_family, get_family
from driftscope.judge.compare import compare_tapsets
from driftscope.judge.contract import Contract
from driftscope.taps.stages import StagePlan

FAMILY_NAMES = FAMILIES.names()
ORACLE = "transformers"
#: Names only a family's own folder may use (family names, their model knowledge and module paths).
FAMILY_KNOWLEDGE = re.compile(
    r"qwen|molmo|deepstack|fullatt|window_index|mlx_vlm\.models|grid_thw|pixel_values|merger|image_pad|vision_start",
    re.IGNORECASE,
)


def _engines(name: str) -> list[tuple[str, str]]:
    return [(name, runtime) for runtime in sorted(get_family(name).engines)]


def test_nothing_outside_families_names_a_family():
    package = ROOT / "lib" / "driftscope"
    files = [p for p in package.rglob("*.py") if (package / "families") not in p.parents]
    files += sorted((ROOT / "notebooks").glob("*.ipynb"))
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}"
        for path in files
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if FAMILY_KNOWLEDGE.search(line)
    ]
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_the_family_is_detected_from_its_model_types_and_an_override_must_agree(name):
    from driftscope.errors import CheckpointError, RegistryError

    family = get_family(name)
    for model_type in family.model_types:
        assert detect_family({"model_type": model_type}) == name
        assert detect_family({"model_type": model_type}, name) == name
        assert detect_family({"model_type": model_type}, GENERIC) == GENERIC  # any checkpoint reads generically
    assert detect_family({"model_type": "a-model-nobody-registered"}, name) == name  # family: overrides
    assert detect_family({"model_type": "a-model-nobody-registered"}) == GENERIC  # no folder claims it
    others = [other for other in FAMILY_NAMES if other not in (name, GENERIC)]
    for other in others if family.model_types else ():
        with pytest.raises(CheckpointError, match="does not match"):
            detect_family({"model_type": family.model_types[0]}, other)
    with pytest.raises(RegistryError, match="unknown model family"):
        detect_family({"model_type": "a-model-nobody-registered"}, "no-such-family")


def _vision(plan: StagePlan) -> list[str]:
    return [stage.id for stage in plan if not stage.id.startswith("text.")]


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_the_plan_is_ordered_and_its_declarations_hold_together(name, tiny):
    checkpoint, _, plan = tiny(name)
    ids = plan.ids()
    assert len(ids) == len(set(ids))
    assert all(stage.block is None or 0 <= stage.block < plan.depth for stage in plan)
    for order in (plan.meta.get("token_orders") or {}).values():
        assert order["index"] in plan and plan[order["index"]].integer, order
    assert all(landmark in plan for landmark in plan.meta.get("landmarks", []))
    family = get_family(name)
    for stage in plan:
        for needed in family.replay_inputs(stage.id, plan) or ():
            # a view (stage@view) is built from that stage, or from the stages under that prefix (text.embeds@sequence:
            # text.embeds.image and text.embeds.text)
            prefix = needed.split("@")[0]
            sources = [prefix] if prefix in plan else [s.id for s in plan if s.id.startswith(prefix + ".")]
            assert sources, (stage.id, needed)
            assert all(plan.position(source) < plan.position(stage.id) for source in sources), (stage.id, needed)


@pytest.mark.parametrize("side", ["vision", "text"])
@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_every_stage_is_replayable_or_declared_data(name, side, tiny):
    """A stage computed by the model's operators from earlier captured stages has a replay (so narrowing and the
    introduced/inherited labels reach it); data (inputs, index math) is compared exactly instead; only a side
    output (e.g. decoding margins) may be neither. A block output's declared pieces are stages of the plan."""
    _, _, plan = tiny(name)
    family = get_family(name)
    for stage in plan:
        if stage.id.startswith("text.") != (side == "text"):
            continue
        replayable = family.replay_inputs(stage.id, plan) is not None
        assert not (replayable and stage.data), f"{stage.id} is data and replayable"
        assert replayable or stage.data or stage.side, f"{stage.id} is neither replayable nor data"
        pieces = family.substages_of(stage.id, plan)
        assert all(piece in plan and plan.position(piece) < plan.position(stage.id) for piece in pieces), stage.id
    blocks = [stage.id for stage in plan if stage.block is not None and stage.substage is None]
    assert all(family.substages_of(block, plan) for block in blocks), "a block declares no substages to narrow into"


@pytest.mark.parametrize("name,runtime_name", [pair for name in FAMILY_NAMES for pair in _engines(name)])
def test_every_runtime_captures_the_whole_plan(name, runtime_name, tiny, runs):
    _, _, plan = tiny(name)
    runtime, tapset = runs(name, runtime_name)
    decodes = type(runtime).decodes_with(name)
    expected = {stage.id for stage in plan if decodes or not stage.id.startswith("text.generate.")}
    declared = dict(tapset.meta.get("declared_absent") or {})  # stages it says it cannot compare, and why
    assert all("not comparable" in why for why in declared.values()), declared
    assert set(tapset.stage_ids()) == expected - set(declared)
    for stage in plan:  # declared integer stages are integers, and every stage has a row per declared axis
        if stage.id in expected and stage.id not in declared:
            assert len(tapset.shape(stage.id)) == len(stage.axes), stage.id
            assert np.issubdtype(np.asarray(tapset[stage.id]).dtype, np.integer) == stage.integer, stage.id


def _replaying(name: str, runtime: str):
    """IREE replays the jax runtime's per-kind functions, compiled: every family's IREE replay is ``-m slow``
    (~50 s of compiles each). The default suite replays through IREE in tests/replay/test_replay.py
    (``test_op_local_errors_of_each_candidate[iree-f32]``: every vision stage kind of Qwen2.5-VL's tiny tower,
    compiled and run by iree.runtime), and every family's replay functions here on XLA (``[<family>-jax]``)."""
    slow = runtime == "iree"
    return pytest.param(name, runtime, marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize(
    "name,runtime_name",
    [_replaying(*pair) for name in FAMILY_NAMES for pair in _engines(name) if get_runtime(pair[1]).can_replay],
)
def test_every_replayable_stage_has_an_operator_in_every_replaying_runtime(name, runtime_name, tiny, runs, tmp_path):
    from driftscope.replay.drilldown import replay_tapset

    checkpoint, _, plan = tiny(name)
    _, reference = runs(name, ORACLE)
    family = get_family(name)
    replayable = {stage.id for stage in plan if family.replay_inputs(stage.id, plan)}
    assert replayable, "a family with nothing to replay cannot tell introduced from inherited error"
    patch = family.known_defects.get(runtime_name)  # a port's known defects are not round-off
    runtime = get_runtime(runtime_name)(checkpoint, "f32", parse_patch(patch))
    replayed = replay_tapset(reference, runtime, plan, tmp_path / "replay")
    runtime.release()
    assert set(replayed.stage_ids()) == replayable
    for row in compare_tapsets(reference, replayed, Contract(), plan):
        if row.stage in replayable:  # the reference's own input, the candidate's operator, f32: round-off only
            assert row.status == "pass" and row.max_abs < 1e-4, (row.stage, row.max_abs)


@pytest.mark.parametrize("name", [name for name in FAMILY_NAMES if get_family(name).supports("jax")])
def test_the_emitter_matches_the_oracle_in_f32(name, tiny, runs):
    _, _, plan = tiny(name)
    _, oracle = runs(name, ORACLE)
    _, emitted = runs(name, "jax")
    vision = set(_vision(plan))
    rows = [row for row in compare_tapsets(oracle, emitted, Contract(), plan) if row.stage in vision]
    assert {row.stage for row in rows} == vision
    for row in rows:
        assert row.status == "pass" and (row.failures == 0 if row.integer else row.max_abs < 1e-4), (
            row.stage,
            row.max_abs,
        )


COMPILED = ("jax", "iree")


@pytest.mark.parametrize(
    "name,runtime_name",
    [(name, runtime) for name in FAMILY_NAMES for runtime in COMPILED if get_family(name).supports(runtime)],
)
def test_the_compiled_path_decodes_the_oracles_greedy_tokens(name, runtime_name, runs):
    """The compiled runtimes decode greedily past the prefill (one compiled decode-step graph, a fixed-capacity
    cache) and pick, step by step, the tokens transformers f32 picks on the tiny fixture."""
    if not get_runtime(runtime_name).decodes_with(name):
        pytest.skip(f"the {runtime_name} runtime does not decode {name} yet (its program declares no decodes)")
    _, oracle = runs(name, ORACLE)
    _, compiled = runs(name, runtime_name)
    expected = np.asarray(oracle["text.generate.tokens"])
    assert len(expected) == 4  # the tiny fixture's max_new_tokens
    np.testing.assert_array_equal(np.asarray(compiled["text.generate.tokens"]), expected)
    np.testing.assert_allclose(compiled["text.logits.last"], oracle["text.logits.last"], rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_mutations_first_disturb_the_stages_they_declare(name, tiny, runs, tmp_path):
    from driftscope.replay.power import fixture_power

    checkpoint, inputs, plan = tiny(name)  # the full plan: a defect of the decoder is seen at a text stage
    family = get_family(name)
    _, oracle = runs(name, ORACLE)
    # the mutated captures are shared with the family's own power tests (the same inputs, judged under f32 there)
    power = fixture_power(
        oracle, checkpoint, inputs, plan, Contract(), tmp_path, policy="f32", capture=family_power_capture(name)
    )
    assert power["runtime"] == f"{family.mutation_runtime}:f32"
    results = {entry["mutation"]: entry for entry in power["mutations"]}
    assert sorted(results) == family.mutation_registry().names()
    assert any(entry["detected"] for entry in results.values()), "the tiny fixture detects none of the mutations"
    for mutation, entry in results.items():
        assert entry["declared_stage"] is not None, f"{mutation} declares no stage the full plan has"
        if entry["detected"]:
            assert entry["at_declared_stage"], (mutation, entry["first_divergence"], entry["declared_stage"])
        else:
            assert entry["blind_reason"], mutation


def test_a_runtime_the_family_does_not_support_says_which_do():
    from driftscope.errors import RuntimeUnavailableError

    family = get_family(FAMILY_NAMES[0])
    with pytest.raises(RuntimeUnavailableError, match=f"does not support model family '{family.name}'") as err:
        family.engine("no-such-runtime")
    assert all(runtime in err.value.fix for runtime in family.engines)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_the_geometry_cli_and_notebook_ask_the_family(name, tiny, capsys):
    from driftscope.cli import main
    from driftscope.views.geometry import family_for

    checkpoint, _, _ = tiny(name)
    assert family_for(checkpoint.path).name == name  # detected from the checkpoint's config.json
    if name == GENERIC:  # no geometry of its own: said, with where geometry is
        assert main(["geometry", "448x448", "--family", name]) == 2
        assert "no geometry of its own" in capsys.readouterr().err
    else:
        assert main(["geometry", "448x448", "--family", name]) == 0 and capsys.readouterr().out.strip()
    assert main(["geometry", "448x448", "--family", "no-such-family"]) == 2
    assert "unknown model family 'no-such-family'" in capsys.readouterr().err
