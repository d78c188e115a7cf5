"""Two introduced sites in one runtime (issue 50 item 6): narrowing enters every block the replay labels
introduced, within a budget the report states, and the conclusions, notebook 01's cause and ``driftscope show``
name each site with its own operator and evidence.

MLX on the tiny Qwen2.5-VL with two planted defects: block 2's attention softmax scaled (``plant_defect``) and
block 6's norm2 with a wrong epsilon (``planted_patches.wrong_eps``); the run captures block outputs only."""

from __future__ import annotations

import pytest
from conftest import ROOT, SHAPES, TINY
from driftscope.cli import main
from driftscope.run.investigation import investigate
from driftscope.run.params import parse_parameters

PLANTED = str(ROOT / "tests" / "planted_patches.py")
TWO_DEFECTS = {
    "callable": f"{PLANTED}:composed",
    "kwargs": {
        "patches": [
            {
                "callable": "driftscope.hypotheses:plant_defect",
                "kwargs": {"stage": "vision.block.2.attn.context", "factor": 1.5},
            },
            {"callable": f"{PLANTED}:wrong_eps", "kwargs": {"block": 6, "norm": "norm2", "eps": 10.0}},
        ]
    },
}
SITES = ["vision.block.2.attn.context", "vision.block.6.norm2"]


@pytest.fixture(scope="module")
def two_sites(tmp_path_factory):
    out = tmp_path_factory.mktemp("two-sites")
    data = {
        "name": "two-sites",
        "checkpoint": str(TINY),
        "images": [str(SHAPES)],
        "runtimes": ["transformers:f32", {"runtime": "mlx", "label": "two", "patch": TWO_DEFECTS}],
        "stages": {"blocks": True},
    }
    return investigate(parse_parameters(data, "test"), out), out


def test_narrowing_enters_every_block_the_replay_labels_introduced(two_sites):
    report, _ = two_sites
    narrowing = report.data["narrowing"]["two"]
    targets = [step["target"] for step in narrowing["steps"] if "error" not in step]
    assert "vision.block.2" in targets and "vision.block.6" in targets
    assert narrowing["site_budget"] >= 1 and narrowing["not_narrowed"] == []


def test_the_conclusion_names_each_site_with_its_own_operator_and_evidence(two_sites):
    report, _ = two_sites
    conclusion = report.data["conclusions"]["two"]
    assert conclusion["kind"] == "introduced" and conclusion["stage"] == SITES[0]
    assert [site["stage"] for site in conclusion["sites"]] == SITES
    labels = {label["stage"]: label for label in report.data["replay"]["two"]["labels"]}
    for site in conclusion["sites"]:
        assert site["op_local_failures"] == labels[site["stage"]]["op_local_failures"] > 0
        assert site["stage"] in conclusion["text"]
        assert site["within"] == [site["stage"].rsplit(".", 2)[0] if "attn" in site["stage"] else "vision.block.6"]
    assert "vision.block.6.norm2 introduces error too" in conclusion["text"]


def test_notebook_01_says_each_operator_in_its_own_block(two_sites):
    from driftscope.views.cause import cause_text, introduced_groups

    report, _ = two_sites
    groups = introduced_groups(report, "two")
    assert [(g["stages"], g["within"]) for g in groups] == [
        ([SITES[0]], "vision.block.2"),
        ([SITES[1]], "vision.block.6"),
    ]
    said = cause_text(report, "two")
    assert said.startswith("introduced by 2 operators: vision.block.2.attn.context (replayed whole, vision.block.2")
    assert "blocks 2, 6" not in said and "vision.block.6.norm2" in said


def test_show_names_both_sites(two_sites, capsys):
    _, out = two_sites
    assert main(["show", str(out)]) == 1
    shown = capsys.readouterr().out.replace("\\", "")
    assert SITES[0] in shown and "vision.block.6.norm2 introduces error too" in shown
