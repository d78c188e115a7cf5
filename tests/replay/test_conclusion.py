"""The conclusion in words (issue 21 item 4): introduced names the operator; when every op-local replay passes while
accumulated stages fail, the text says no operator introduces the error, from where it accumulates and which stages
amplify it (the chain, strongest first named, in execution order), instead of a bare ``first_introduced: null``."""

from __future__ import annotations

from driftscope.judge.rows import ComparisonRow
from driftscope.replay.conclusion import conclude
from driftscope.replay.drilldown import Drilldown
from driftscope.taps.stages import Stage, StagePlan

IDS = ["inputs.pixels", "patch_embed", "block.0", "block.0.norm2", "block.1", "block.2", "merger"]
PLAN = StagePlan("f", [Stage(i, ("tokens", "hidden"), data=i.startswith("inputs.")) for i in IDS], depth=3)


def rows(failing: set[str], relative: dict[str, float]) -> list[ComparisonRow]:
    return [
        ComparisonRow(
            stage,
            "ref",
            "cand",
            position,
            "fail" if stage in failing else "pass",
            failures=5 if stage in failing else 0,
            relative_rms=relative.get(stage, 0.0),
        )
        for position, stage in enumerate(IDS)
    ]


def label(stage: str, kind: str, factor: float | None = None, own_failures: int = 0) -> dict:
    return {
        "stage": stage,
        "label": kind,
        "amplification": factor,
        "op_local_failures": own_failures,
        "op_local_relative_rms": 0.3 if own_failures else 1e-6,
    }


def test_accumulation_names_the_onset_and_the_amplification_chain():
    drifting = {"patch_embed": 2e-3, "block.0": 3e-3, "block.0.norm2": 0.04, "block.1": 0.05, "block.2": 0.2}
    drill = Drilldown(
        "cand",
        "ref",
        "cand",
        [],
        [
            label("patch_embed", "inherited"),
            label("block.0.norm2", "amplified", 12.0),
            label("block.2", "amplified", 30.4),
            label("merger", "amplified", 99.0),  # after the first divergence: not part of the chain
        ],
    )
    conclusion = conclude(drill, rows({"block.2", "merger"}, drifting), PLAN)
    assert conclusion["kind"] == "accumulation" and conclusion["onset"] == "patch_embed"
    assert conclusion["amplified"] == [{"stage": "block.0.norm2", "factor": 12.0}, {"stage": "block.2", "factor": 30.4}]
    assert conclusion["text"] == (
        "no operator introduces the error; it accumulates from patch_embed on and is amplified by "
        "block.0.norm2 (x12), block.2 (x30.4); it first breaks the contract at block.2"
    )


def test_an_operator_that_fails_on_the_reference_input_is_named():
    drill = Drilldown("cand", "ref", "cand", [], [label("block.0.norm2", "introduced", own_failures=7)])
    conclusion = conclude(drill, rows({"block.0.norm2", "block.1"}, {}), PLAN)
    assert conclusion["kind"] == "introduced" and conclusion["stage"] == "block.0.norm2"
    assert conclusion["text"].startswith("block.0.norm2 introduces the error") and "7 elements" in conclusion["text"]


def test_data_agreement_and_no_replay_say_so():
    assert conclude(None, rows(set(), {}), PLAN)["kind"] == "agreement"
    data = conclude(None, rows({"inputs.pixels"}, {}), PLAN)
    assert data["kind"] == "data" and "nothing to replay" in data["text"]
    assert conclude(None, rows({"block.1"}, {}), PLAN)["kind"] == "not replayed"


def test_a_first_divergence_no_replay_reaches_after_stages_that_all_agree_is_put_between_them():
    """A tied head's logits (no module to replay) or a decoder input of another length: the error comes from what
    computes that stage after the last one that agrees, not from accumulation."""
    drill = Drilldown("cand", "ref", "cand", [], [label("block.1", "inherited")])
    found = rows({"merger"}, {"block.2": 1e-6})
    conclusion = conclude(drill, found, PLAN)
    assert conclusion["kind"] == "unreplayed" and conclusion["agrees"] == "block.2"
    assert conclusion["text"].startswith("merger differs while every stage before it agrees (block.2 the last)")
    found[-1].status, found[-1].reference_shape, found[-1].candidate_shape = "shape_mismatch", [5, 8], [9, 8]
    assert "differs in shape (reference [5, 8], candidate [9, 8])" in conclude(drill, found, PLAN)["text"]
    drifting = conclude(drill, rows({"merger"}, {"block.1": 2e-3}), PLAN)  # drift before it: accumulation
    assert drifting["kind"] == "accumulation"


def test_error_entering_before_the_divergence_at_a_stage_nothing_replays_is_put_there():
    """The first drift above round-off at a stage no replay labels (a module's captured input: a merge, a scale made
    by the model's own code) while every operator replays clean and the contract breaks later: it enters there,
    not an accumulation from a later operator."""
    drifting = {"block.0": 2e-3, "block.0.norm2": 2e-3, "block.1": 0.05, "block.2": 0.2}
    drill = Drilldown("cand", "ref", "cand", [], [label("block.0.norm2", "inherited"), label("block.1", "inherited")])
    conclusion = conclude(drill, rows({"block.1", "block.2"}, drifting), PLAN)
    assert conclusion["kind"] == "unreplayed" and conclusion["stage"] == "block.0"
    assert conclusion["text"] == (
        "no operator introduces the error: it enters at block.0 (relative RMS 0.002), which nothing replays (the "
        "model's own code between operators: a merge, a scale) and which stages that agree feed; it first breaks "
        "the contract at block.1"
    )
    # the first drifting stage is an operator's output: accumulation, as before
    replayed = Drilldown("cand", "ref", "cand", [], [label("block.0", "inherited"), label("block.1", "inherited")])
    assert conclude(replayed, rows({"block.1", "block.2"}, drifting), PLAN)["kind"] == "accumulation"
