"""The suspected cause in notebook 01's headline table (issue 34 item 1): each introducing operator once, with
where it recurs, and the family's ready patch for each (the one the candidate runs left out), from the report's
replay labels and the family's declared ``CLOSES``."""

from __future__ import annotations

from driftscope.families import get_family
from driftscope.run.report import Report
from driftscope.views.cause import cause_text, introduced_groups, operator_of, patch_text


def _report(tmp_path, labels: list[tuple[str, str]], kind: str = "introduced", patch=None) -> Report:
    stages = [stage for stage, _ in labels]
    conclusion = {"kind": kind, "first_divergence": stages[0], "text": "..."}
    if kind == "introduced":
        conclusion["stage"] = next(stage for stage, label in labels if label == "introduced")
    spec = {"runtime": "mlx", "policy": "f32", "label": "mlx:f32", **({"patch": patch} if patch else {})}
    plan = [
        {"id": s, "axes": ["tokens", "hidden"], **({"block": int(s.split(".")[2])} if ".block." in s else {})}
        for s in stages
    ]
    return Report(
        tmp_path / "report.json",
        {
            "family": "molmo2",
            "parameters": {"runtimes": [{"runtime": "transformers", "policy": "f32", "label": "t"}, spec]},
            "conclusions": {"mlx:f32": conclusion, "t": {"kind": "agreement", "text": "..."}},
            "replay": {"mlx:f32": {"labels": [{"stage": s, "label": label} for s, label in labels]}},
            "stage_plan": plan,
        },
    )


def test_an_operator_introduced_in_many_blocks_is_one_entry_and_each_other_operator_its_own(tmp_path):
    """Molmo2's shipped MLX: the fast GELU in every block and the wrong selected layer, grouped by operator."""
    labels = [(f"vision.block.{b}.mlp.act", "introduced") for b in (0, 1, 2, 3, 7)]
    labels += [("vision.block.0.attn.out", "inherited"), ("vision.selected.24", "introduced")]
    report = _report(tmp_path, labels)
    groups = introduced_groups(report, "mlx:f32")
    assert [(g["operator"], g["where"]) for g in groups] == [
        ("vision.block.*.mlp.act", "blocks 0-3, 7"),
        ("vision.selected.*", "vision.selected.24"),
    ]
    closes = get_family("molmo2").hypothesis_module().CLOSES  # the family's own declaration, read here
    assert "mlx" in closes["tanh_gelu"]["runtimes"] and "vision.block.*.mlp.act" in closes["tanh_gelu"]["stages"]
    assert groups[0]["patches"] == ["driftscope.hypotheses:tanh_gelu", "driftscope.hypotheses:mlx_vlm_fixes"]
    assert groups[1]["patches"] == [
        "driftscope.hypotheses:layers_from_declared_depth",
        "driftscope.hypotheses:mlx_vlm_fixes",
    ]
    assert cause_text(report, "mlx:f32") == (
        "introduced by 2 operators: vision.block.*.mlp.act (blocks 0-3, 7); vision.selected.24"
    )
    # mlx_vlm_fixes closes both: that one is offered (tanh_gelu and layers_from_declared_depth close one each)
    assert patch_text(report, "mlx:f32") == "driftscope.hypotheses:mlx_vlm_fixes (try on block 0 in notebook 02)"
    report.data["parameters"]["runtimes"][1]["patch"] = "driftscope.hypotheses:mlx_vlm_fixes"  # runs it already
    assert patch_text(report, "mlx:f32") == (
        "driftscope.hypotheses:tanh_gelu, driftscope.hypotheses:layers_from_declared_depth "
        "(try on block 0 in notebook 02)"
    )
    assert cause_text(report, "t") == patch_text(report, "t") == ""  # a pair that agrees says nothing


def test_whole_blocks_around_an_operator_are_where_it_shows_not_a_second_cause(tmp_path):
    """The GELU-defect run: block 0's substages name the GELU; every whole-block replay fails too."""
    labels = [("vision.block.0.mlp.act", "introduced")] + [(f"vision.block.{b}", "introduced") for b in range(25)]
    report = _report(tmp_path, labels, patch={"callable": "driftscope.hypotheses:mlx_vlm_fixes", "kwargs": {}})
    assert cause_text(report, "mlx:f32") == (
        "introduced at vision.block.0.mlp.act (replayed whole, blocks 0-24 introduce error too)"
    )
    # the candidate runs mlx_vlm_fixes already: only the patch it lacks is offered
    assert patch_text(report, "mlx:f32") == "driftscope.hypotheses:tanh_gelu (try on block 0 in notebook 02)"


def test_accumulation_and_data_say_so_without_a_patch(tmp_path):
    report = _report(tmp_path, [("vision.block.5", "inherited")], kind="accumulation")
    report.data["conclusions"]["mlx:f32"].update(
        onset="vision.patch_embed", amplified=[{"stage": "vision.block.3", "factor": 12.5}]
    )
    assert cause_text(report, "mlx:f32") == (
        "accumulated drift from vision.patch_embed, amplified most at vision.block.3 (x12.5); "
        "no single operator introduces it"
    )
    assert patch_text(report, "mlx:f32") == ""
    report.data["conclusions"]["mlx:f32"] = {"kind": "data", "first_divergence": "vision.window_index"}
    assert cause_text(report, "mlx:f32").startswith("vision.window_index is data")
    assert operator_of("text.layer.3.mlp") == ("text.layer.*.mlp", (3,))
