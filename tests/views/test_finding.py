"""The finding banner (issue 53 item 1): every family's ready patch says the defect it closes in words and what it
does (its docstring), for the generic family too; a quantized pair's finding names one module for the q, k and v a
fused linear computes; the run's own patch trial is said with its before and after (the end-to-end runs: Molmo2 in
tests/families/test_molmo2_pages.py, LLaVA in tests/families/test_generic_fix_llava.py, q4 in
tests/run/test_quant_demo.py)."""

from __future__ import annotations

import pytest
from driftscope.families import FAMILIES, get_family
from driftscope.run.report import Report


def _every_patch():
    for name in FAMILIES:
        family = get_family(name)
        for patch in getattr(family.hypothesis_module(), "CLOSES", {}):
            yield name, patch


@pytest.mark.parametrize(("family", "patch"), list(_every_patch()))
def test_every_ready_patch_says_its_defect_and_what_it_does(family, patch):
    known = get_family(family).defect_of(f"driftscope.hypotheses:{patch}")
    assert len(known["defect"].split()) >= 8, (family, patch, known)  # a sentence, not a name
    assert known["patch"] and "\n" not in known["patch"], (family, patch)  # the docstring's first paragraph
    assert get_family(family).defect_of("driftscope.hypotheses:no_such_patch") == {}


def test_the_generic_family_and_every_deep_family_with_patches_are_covered():
    families = {family for family, _ in _every_patch()}
    assert {"generic", "molmo2", "qwen2_5_vl", "qwen3_vl_moe"} <= families


def _q4_report(tmp_path) -> Report:
    """A quantized pair as the q4 demo's report holds it: the replay introduces the error at attn.q (the first of
    the fused qkv's outputs it compares); the linear controls replay the qkv linear through its v third."""
    rows = [
        {"stage": "vision.block.0.attn.v", "module": "vision_tower.blocks.0.attn.qkv", "label": "fused kernel",
         "stage_label": "introduced", "fused_vs_dequantized": 0.0044, "dequantized_vs_reference": 0.00088},
        {"stage": "vision.block.0.attn.out", "module": "vision_tower.blocks.0.attn.proj", "label": "fused kernel",
         "stage_label": "introduced", "fused_vs_dequantized": 0.004, "dequantized_vs_reference": 0.0009},
    ]  # fmt: skip
    conclusion = {"kind": "introduced", "stage": "vision.block.0.attn.q", "first_divergence": "vision.block.0.attn.q"}
    return Report(
        tmp_path / "report.json",
        {
            "family": "qwen2_5_vl",
            "reference": "transformers:q4-dequant",
            "pairs": [{"key": "mlx:q4-f16", "reference": "transformers:q4-dequant", "candidate": "mlx:q4-f16"}],
            "verdict": {"status": "fail", "per_candidate": {"mlx:q4-f16": "fail"}},
            "conclusions": {"mlx:q4-f16": conclusion},
            "linear_replay": {"mlx:q4-f16": {"activations": "float16", "rows": rows, "verdict": "..."}},
            "replay": {"mlx:q4-f16": {"labels": [{"stage": "vision.block.0.attn.q", "label": "introduced"}]}},
            "stage_plan": [{"id": "vision.block.0.attn.q", "axes": ["tokens", "heads", "head_dim"], "block": 0}],
        },
    )


def test_a_quantized_finding_names_one_module_for_its_q_k_and_v(tmp_path):
    from driftscope.views.finding import finding_markdown, one_module

    report = _q4_report(tmp_path)
    rows = report.data["linear_replay"]["mlx:q4-f16"]["rows"]
    row, stages = one_module("vision.block.0.attn.q", rows)
    assert row is rows[0] and stages == [f"vision.block.0.attn.{c}" for c in "qkv"]
    assert one_module("vision.block.0.attn.out", rows) == (rows[1], ["vision.block.0.attn.out"])
    assert one_module("vision.block.0.mlp.up", rows) == (None, [])
    said = finding_markdown(report, "mlx:q4-f16")
    assert "the fused kernel on float16 activations introduces the error at the quantized linear" in said
    assert "`vision_tower.blocks.0.attn.qkv` (`vision.block.0.attn.q`, `vision.block.0.attn.k`, " in said
    assert "so do 1 more quantized linears" in said and said.count("attn.qkv") == 1


def test_a_trial_is_said_with_its_worst_stage_before_and_after(tmp_path):
    from driftscope.views.cause import patch_text
    from driftscope.views.finding import trial_line

    report = _q4_report(tmp_path)
    trial = {
        "status": "tried",
        "patch": "driftscope.hypotheses:norm2_in_float32",
        "block": 0,
        "closes": False,
        "failing_after": ["vision.block.0.attn.q"],
        "rows": [
            {"stage": "vision.block.0.norm1", "before": "pass", "before_used": 0.1, "after": "pass", "after_used": 0.1},
            {
                "stage": "vision.block.0.attn.q",
                "before": "fail",
                "before_used": 3.0,
                "after": "fail",
                "after_used": 2.5,
            },
        ],
        "seconds": 1.25,
    }
    report.data["patch_trials"] = {"mlx:q4-f16": trial}
    line = trial_line(report, "mlx:q4-f16")
    assert line.startswith("Ready patch `norm2_in_float32` **tried on block 0** by the run (1.2 s)")
    assert "`vision.block.0.attn.q` fail -> **fail**, tolerance used 3 -> 2.5" in line
    assert "1 stage(s) still fail: `vision.block.0.attn.q`" in line
    assert patch_text(report, "mlx:q4-f16") == (
        "driftscope.hypotheses:norm2_in_float32 (tried on block 0 by the run: still fails)"
    )
    report.data["patch_trials"]["mlx:q4-f16"] = {"status": "not tried", "patch": trial["patch"], "why": "slow"}
    assert trial_line(report, "mlx:q4-f16") == "Ready patch `norm2_in_float32`: not tried (slow)."
