"""The screen on the tiny fixture with the ``reverse[orig] = rank`` un-reorder planted in MLX: the images whose
window permutation is not an involution rank first, their tower error checked against the TapSets with numpy and
against the geometry's own count of misplaced tokens; a screen interrupted after three captures captures only what
it lacks when run again; the page, in headless Chromium, is self-contained and sorts."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from chromium import chromium, needs_chromium, open_page
from driftscope.screen.capture import tap_base
from driftscope.screen.report import load_screen
from driftscope.screen.runner import screen
from driftscope.screen.score import divergence_score
from driftscope.taps.tapset import TapSet
from screen_support import INVOLUTION, NOT_INVOLUTION, image_folder, planted_parameters


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("screen")
    params, images, out = planted_parameters(folder), image_folder(folder / "images"), folder / "out"
    first, resumed = [], []

    def stop_after_three(label, item):
        first.append((label, item.key))
        if len(first) == 3:
            raise KeyboardInterrupt  # what SIGINT raises in the main thread

    with pytest.raises(KeyboardInterrupt):
        screen(params, images, investigate=False, out=out, log=lambda m: None, advance=stop_after_three)
    result = screen(
        params,
        images,
        investigate=False,
        out=out,
        log=lambda m: None,
        advance=lambda label, i: resumed.append((label, i.key)),
    )
    return SimpleNamespace(out=out, first=first, resumed=resumed, result=result)


def test_the_planted_unreorder_ranks_the_non_involution_images_first(planted):
    ranked = planted.result.ranking
    assert {entry["label"] for entry in ranked[:2]} == set(NOT_INVOLUTION)
    assert {entry["label"] for entry in ranked[2:]} == set(INVOLUTION)
    for entry in ranked[:2]:
        mlx = entry["candidates"]["mlx-planted"]
        assert mlx["tower_stage"] == "vision.merger" and mlx["tower_status"] == "fail" and mlx["terms"]["tower"] > 0.3
    for entry in ranked[2:]:
        mlx = entry["candidates"]["mlx-planted"]
        assert mlx["tower_status"] == "pass" and mlx["tower_relative_error"] < 1e-4 and mlx["tower_failures"] == 0
        assert entry["score"] < ranked[1]["score"]


def test_the_tower_error_is_the_misplaced_tokens(planted):
    """Independent of the comparison code: the rows of the merged output that differ are exactly the tokens the
    geometry says ``reverse[orig] = rank`` misplaces, and the relative error is numpy's."""
    from driftscope.families.qwen2_5_vl.geometry import audit_unreorder

    for entry in planted.result.ranking:
        reference = TapSet(tap_base(planted.out, entry["key"], "transformers:f32"))
        candidate = TapSet(tap_base(planted.out, entry["key"], "mlx-planted"))
        r, c = np.asarray(reference["vision.merger"], np.float64), np.asarray(candidate["vision.merger"], np.float64)
        differing = int((np.abs(c - r).max(axis=1) > 1e-3).sum())
        grid = np.asarray(reference["vision.grid_thw"]) if "vision.grid_thw" in reference else None
        from PIL import Image

        with Image.open(entry["images"][0]) as image:
            width, height = image.size
        audit = audit_unreorder([[1, height // 14, width // 14]] if grid is None else grid.tolist())
        assert differing == audit.misplaced_by_rank_scatter, entry["label"]
        relative = np.sqrt(np.mean((c - r) ** 2)) / np.sqrt(np.mean(r**2))
        assert entry["candidates"]["mlx-planted"]["tower_relative_error"] == pytest.approx(relative, rel=1e-6)


def test_an_interrupted_screen_captures_only_what_it_lacks(planted):
    everything = {
        (label, entry["key"]) for entry in planted.result.ranking for label in ("transformers:f32", "mlx-planted")
    }
    assert len(planted.first) == 3 and all(label == "transformers:f32" for label, _ in planted.first)
    assert not set(planted.first) & set(planted.resumed)  # nothing captured twice
    assert set(planted.first) | set(planted.resumed) == everything
    assert planted.result.captured == len(everything) - 3 and planted.result.judged == 4
    again = screen(
        planted.out.parent / "screen_planted.yaml",
        str(planted.out.parent / "images" / "*.png"),
        investigate=False,
        out=planted.out,
        log=lambda m: None,
        advance=lambda label, i: pytest.fail("a finished screen captured again"),
    )
    assert again.captured == 0 and again.judged == 0
    assert [e["key"] for e in again.ranking] == [e["key"] for e in planted.result.ranking]
    data = load_screen(planted.out)
    assert data["status"] == "complete" and data["ranking"] == [e["key"] for e in planted.result.ranking]
    assert (planted.out / "screen.csv").read_text().count("\n") == 5 and (planted.out / "screen.parquet").exists()


def test_the_score_terms():
    agree = divergence_score(
        {"tower_relative_error": 1e-6, "steps": 4, "reference_words": {"red": True}, "expected_words": {"red": True}}
    )
    assert agree["score"] == pytest.approx(1e-6)
    worst = divergence_score(
        {
            "tower_relative_error": 3.0,  # capped at 1
            "tower_failure_fraction": 0.5,
            "prefill_top1_agree": False,
            "first_difference": 1,
            "steps": 4,
            "reference_words": {"red": True, "blue": True, "green": False},
            "expected_words": {"red": True, "blue": False},
        }
    )
    assert worst["terms"] == {"tower": 1.0, "failures": 0.5, "prefill": 1.0, "greedy": 0.75, "words": 0.5}
    assert worst["score"] == pytest.approx(3.75)


@needs_chromium
def test_the_page_in_chromium_is_self_contained_and_sorts(planted):
    from selenium.webdriver.common.by import By

    html = (planted.out / "index.html").read_text()
    assert "http://" not in html and "https://" not in html  # nothing to fetch
    with chromium() as driver:
        open_page(driver, (planted.out / "index.html").as_uri())
        labels = "return Array.from(document.querySelectorAll('#screen tbody tr')).map(r => r.dataset.key);"
        ranking = [e["key"] for e in planted.result.ranking]
        assert driver.execute_script(labels) == ranking
        images = driver.execute_script(
            "return Array.from(document.images).map(i => [i.src.slice(0, 15), i.complete && i.naturalWidth > 0]);"
        )
        assert len(images) == 4 and all(src == "data:image/png;" and ok for src, ok in images)
        score = next(th for th in driver.find_elements(By.CSS_SELECTOR, "#screen th") if th.text.startswith("score"))
        score.click()  # ascending: the involution images first
        assert driver.execute_script(labels) == ranking[::-1]
        score.click()
        assert driver.execute_script(labels) == ranking
        top = driver.execute_script(
            "const r = document.querySelector('#screen tbody tr');"
            "return [r.className, Array.from(r.cells).map(c => c.innerText)];"
        )
        assert top[0] == "deviates" and top[1][3] == "mlx-planted"  # the worst candidate, highlighted
        assert (
            int(top[1][5].split(" / ")[0]) == planted.result.ranking[0]["candidates"]["mlx-planted"]["tower_failures"]
        )
