"""Near-tie flips rank as noise (issue 53 item 4): an input whose answer first differs at a flip the teacher-forced
decode labels near-tie is discounted in the screen's score, below an input with a real tower deviation, and its page
row says "near-tie"; the run link says how many elements fail at the first divergence."""

from __future__ import annotations

import re

import pytest
from driftscope.screen.page import render_page
from driftscope.screen.report import rank
from driftscope.screen.score import NEAR_TIE_WEIGHT, _flip_label, divergence_score

PAIR = {"reference": "transformers:f32", "candidate": "mlx:bf16"}


def _answer(first: int, label: str) -> dict:
    """A candidate's answer terms as ``judge_input`` records them: the free-running tokens first differ at ``first``,
    where the teacher-forced decode flips with ``label``."""
    pair = {**PAIR, "first_difference": first, "forced": {"flips": [{"step": first, "label": label}]}}
    return {
        "steps": 8,
        "first_difference": first,
        "prefill_top1_agree": first != 0,
        "reference_words": {"red": True},
        "expected_words": {"red": False},
        "first_difference_label": _flip_label(pair),
    }


def test_a_near_tie_flip_is_discounted_below_a_real_tower_deviation():
    noise = divergence_score({"tower_relative_error": 0.01, "tower_failure_fraction": 0.001, **_answer(0, "near-tie")})
    confident = divergence_score(
        {"tower_relative_error": 0.01, "tower_failure_fraction": 0.001, **_answer(0, "confident")}
    )
    tower = divergence_score({"tower_relative_error": 0.2, "tower_failure_fraction": 0.1, "steps": 8})
    assert noise["terms"]["prefill"] == pytest.approx(NEAR_TIE_WEIGHT)  # 1, discounted
    assert noise["terms"]["greedy"] == pytest.approx(NEAR_TIE_WEIGHT)  # 1 - 0/8, discounted
    assert noise["terms"]["words"] == pytest.approx(NEAR_TIE_WEIGHT)
    assert confident["terms"] == {"tower": 0.01, "failures": 0.001, "prefill": 1.0, "greedy": 1.0, "words": 1.0}
    assert confident["score"] > tower["score"] > noise["score"]
    assert _flip_label({**PAIR, "first_difference": None, "forced": {"flips": []}}) is None


def test_the_page_labels_the_near_tie_and_counts_the_failing_elements(tmp_path):
    def result(key: str, candidate: dict) -> dict:
        entry = {**candidate, **divergence_score(candidate)}
        return {"key": key, "label": key, "images": [], "status": "judged", "worst": "mlx:bf16",
                "score": entry["score"], "candidates": {"mlx:bf16": entry}}  # fmt: skip

    noisy = result("noisy", {"tower_relative_error": 0.01, **_answer(3, "near-tie")})
    real = result("real", {"tower_relative_error": 0.2, "tower_failure_fraction": 0.1, "steps": 8})
    (tmp_path / "runs" / "real").mkdir(parents=True)
    (tmp_path / "runs" / "real" / "01_stage_parity.nocode.html").write_text("<p>page</p>")
    investigation = {"key": "real", "dir": "runs/real", "verdict": "fail", "pages": ["01_stage_parity.nocode.html"],
                     "first_divergence": {"mlx:bf16": "vision.block.5"},
                     "first_failures": {"mlx:bf16": [1, 65536]}}  # fmt: skip
    data = {"name": "s", "inputs": rank([noisy, real]), "investigations": [investigation]}
    page = render_page(tmp_path, data, {})
    rows = re.findall(r'<tr class="[^"]*" data-key="(\w+)">(.*?)</tr>', page, flags=re.S)
    assert [key for key, _ in rows] == ["real", "noisy"]  # the near-tie ranks below the real deviation
    cells = dict(rows)
    assert "step 3 (near-tie)" in cells["noisy"]
    assert "fail at vision.block.5 (1 of 65,536 elements)" in cells["real"]
    assert "count 5%" in page  # the score's explanation says the discount
