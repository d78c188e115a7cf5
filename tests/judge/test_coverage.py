"""A gate needs coverage (issue 30 items 1 and 2): a candidate that holds only its inputs, or whose every stage is
non-finite on both sides, never passes; a stage a runtime declares it cannot produce is excused."""

from __future__ import annotations

import numpy as np
import pytest
from driftscope.judge.contract import Contract, StageRule, Tolerance
from driftscope.judge.verdict import judge
from driftscope.taps.tapset import TapSet, TapWriter

FIELDS = ("axes", "token_order", "token_unit", "integer")


def copy(source: TapSet, base, keep=lambda stage_id: True, change=None, **meta) -> TapSet:
    """A TapSet holding the ``keep`` stages of ``source`` (values through ``change``), as another engine wrote it."""
    with TapWriter(base, {"runtime": "engine", "label": base.name, **meta}) as writer:
        for stage_id in source.stage_ids():
            if keep(stage_id):
                value = np.asarray(source[stage_id])
                declared = {k: v for k, v in source.declaration(stage_id).items() if k in FIELDS}
                writer.add(stage_id, change(stage_id, value) if change else value, **declared)
    return TapSet(writer.tensor_path)


@pytest.fixture(scope="module")
def oracle(captures):
    return captures["transformers:f32"]


def data_only(plan):
    return lambda stage_id: stage_id in plan and plan[stage_id].data


def test_a_candidate_holding_only_its_inputs_fails_for_coverage(tmp_path, oracle, full_plan):
    """What `driftscope stages --write-inputs` gives (the processor inputs and the index stages), as a tap file."""
    candidate = copy(oracle, tmp_path / "inputs-only", keep=data_only(full_plan))
    data = [s for s in oracle.stage_ids() if full_plan[s].data]
    model = [s for s in oracle.stage_ids() if not full_plan[s].data]
    assert data and model and set(candidate.stage_ids()) == set(data)
    result = judge(oracle, [candidate], Contract(), full_plan)
    assert result["verdict"]["status"] == "fail"
    coverage = result["coverage"]["inputs-only"]
    assert coverage["complete"] is False
    assert coverage["compared"] == len(data) and coverage["model_stages"] == 0
    assert coverage["missing"] == {"candidate": [s for s in full_plan.ordered(model)]}
    reasons = result["verdict"]["reasons"]
    assert any(f"did not capture {len(model)} stage(s)" in reason for reason in reasons), reasons
    assert result["first_divergence"]["inputs-only"] is None  # no stage fails: coverage alone decides


def test_skipping_the_missing_stages_by_name_still_needs_a_model_stage(tmp_path, oracle, full_plan):
    candidate = copy(oracle, tmp_path / "inputs-only", keep=data_only(full_plan))
    skip_model = Contract("skip-model", Tolerance(), (StageRule("vision.*", Tolerance(skip=True)),))
    result = judge(oracle, [candidate], skip_model, full_plan)
    coverage = result["coverage"]["inputs-only"]
    assert coverage["missing"] == {} and coverage["model_stages"] == 0
    assert result["verdict"]["status"] == "fail"
    assert any("no model stage was compared" in reason for reason in result["verdict"]["reasons"])


def test_a_stage_missing_on_one_side_fails_unless_the_contract_skips_it(tmp_path, oracle, captures, full_plan):
    dropped = "vision.block.3"
    candidate = copy(captures["mlx:f32"], tmp_path / "mlx", keep=lambda s: s != dropped)
    result = judge(oracle, [candidate], Contract(), full_plan)
    assert result["coverage"]["mlx"]["missing"] == {"candidate": [dropped]}
    assert result["verdict"]["status"] == "fail"
    skipped = judge(
        oracle, [candidate], Contract("c", Tolerance(), (StageRule(dropped, Tolerance(skip=True)),)), full_plan
    )
    assert skipped["verdict"]["status"] == "pass" and skipped["coverage"]["mlx"]["complete"]
    whole = judge(oracle, [captures["mlx:f32"]], Contract(), full_plan)
    coverage = whole["coverage"]["mlx:f32"]
    assert whole["verdict"]["status"] == "pass" and coverage["complete"]
    assert coverage["compared"] == len(oracle.stage_ids()) == coverage["stages"]


def test_a_runtime_that_declares_it_does_not_decode_is_excused(tmp_path, oracle, captures, full_plan):
    """The reference decodes; the candidate is an IREE capture run with ``options.decode: false``."""
    tokens = np.arange(4, dtype=np.int64)
    with TapWriter(tmp_path / "ref", {"runtime": "transformers", "label": "ref"}) as writer:
        for stage_id in oracle.stage_ids():
            writer.add(stage_id, np.asarray(oracle[stage_id]), **oracle.declaration(stage_id))
        writer.add("text.generate.tokens", tokens, integer=True)
        writer.add("text.rope_delta", np.array([-3], dtype=np.int64), integer=True)  # the decoder's M-RoPE offset
    reference = TapSet(writer.tensor_path)
    options = {"runtime": "iree", "options": {"decode": False}}
    candidate = copy(captures["mlx:f32"], tmp_path / "no-decode", **options)
    result = judge(reference, [candidate], Contract(), full_plan)
    groups = {group["pattern"]: group for group in result["not_compared"]["no-decode"]}
    assert set(groups) == {"text.generate.tokens", "text.rope_delta"}, groups  # not text.rope_deltas' group "text"
    assert all(group["declared"] is True for group in groups.values())
    assert result["coverage"]["no-decode"]["declared_absent"] == 2
    assert result["verdict"]["status"] == "pass", result["verdict"]["reasons"]
    undeclared = copy(captures["mlx:f32"], tmp_path / "forgot", runtime="engine")
    assert judge(reference, [undeclared], Contract(), full_plan)["verdict"]["status"] == "fail"


def test_nothing_judged_is_not_a_pass(tmp_path, oracle, full_plan):
    """A checkpoint of NaN weights: every float stage NaN on both sides, the data stages still equal."""

    def nan(stage_id, value):
        floating = np.issubdtype(value.dtype, np.floating)
        return np.full_like(value, np.nan) if floating and not full_plan[stage_id].data else value

    reference = copy(oracle, tmp_path / "nan-ref", change=nan)
    candidate = copy(oracle, tmp_path / "nan-cand", change=nan)
    result = judge(reference, [candidate], Contract(), full_plan)
    assert result["verdict"]["status"] == "fail"
    statuses = {row["stage"]: row["status"] for row in result["rows"]}
    model = [s for s in oracle.stage_ids() if not full_plan[s].data and statuses[s] != "pass"]
    assert model and all(statuses[s] == "not_judged" for s in model)
    coverage = result["coverage"]["nan-cand"]
    assert coverage["not_judged"] == full_plan.ordered(model) and coverage["model_stages"] == 0
    assert any("could not be judged" in reason for reason in result["verdict"]["reasons"])


def test_a_stage_partly_non_finite_on_both_sides_is_judged_on_the_rest(tmp_path, oracle, full_plan):
    stage = "vision.block.2"

    def hole(stage_id, value):
        if stage_id != stage:
            return value
        value = value.copy()
        value[0] = np.inf
        return value

    result = judge(
        copy(oracle, tmp_path / "a", change=hole), [copy(oracle, tmp_path / "b", change=hole)], Contract(), full_plan
    )
    row = next(row for row in result["rows"] if row["stage"] == stage)
    assert row["status"] == "pass" and "not judged" in row["warning"]
    assert result["coverage"]["b"]["complete"]


def _holes(plan, share: float, at_least: int = 1):
    """A ``change`` that makes ``share`` of a model stage's float elements NaN (the same places on every side; at
    least ``at_least`` of them, and never every element)."""

    def change(stage_id, value):
        if value.dtype.kind != "f" or value.size < 2 or plan[stage_id].data:
            return value
        out = value.astype(np.float32).copy().reshape(-1)
        out[: max(at_least, min(out.size - 1, int(share * out.size)))] = np.nan
        return out.reshape(value.shape)

    return change


def test_49_3_nan_at_the_same_places_on_both_sides_is_not_judged_and_cannot_pass(tmp_path, oracle, full_plan):
    """Both sides NaN in all but one element of every float stage, then in half of them: nothing there was judged,
    so those stages are "not judged" and the pair fails; the verdict says how much was judged. Below the floor
    (``judge.coverage.JUDGED_FLOOR``) a stage is not judged; above it the NaN are a warning and the coverage says
    how much was judged."""
    from driftscope.judge.coverage import JUDGED_FLOOR

    floats = [s for s in oracle.stage_ids() if not full_plan[s].data and not full_plan[s].integer]
    for share, name in ((1.0, "all-but-one"), (0.5, "half")):
        reference = copy(oracle, tmp_path / f"ref-{name}", change=_holes(full_plan, share))
        candidate = copy(oracle, tmp_path / name, change=_holes(full_plan, share))
        result = judge(reference, [candidate], Contract(), full_plan)
        rows = {row["stage"]: row for row in result["rows"]}
        assert all(rows[s]["status"] == "not_judged" for s in floats), {s: rows[s]["status"] for s in floats}
        assert result["verdict"]["status"] == "fail"
        coverage = result["coverage"][name]
        assert coverage["judged_fraction"] < JUDGED_FLOOR and not coverage["complete"]
        assert result["verdict"]["judged"][name] == coverage["judged_fraction"]
        assert any("could be judged" in reason for reason in result["verdict"]["reasons"])
    # a few NaN on both sides (under 1 - floor of each stage): judged everywhere else, a warning, the share said
    few = _holes(full_plan, (1 - JUDGED_FLOOR) / 4, at_least=0)
    reference, candidate = copy(oracle, tmp_path / "ref-few", change=few), copy(oracle, tmp_path / "few", change=few)
    result = judge(reference, [candidate], Contract(), full_plan)
    rows = {row["stage"]: row for row in result["rows"]}
    assert result["verdict"]["status"] == "pass", result["verdict"]["reasons"]
    assert JUDGED_FLOOR < result["coverage"]["few"]["judged_fraction"] < 1
    assert any(rows[s]["warning"] for s in floats)
