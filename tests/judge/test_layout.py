"""Rows that line up: raster against window order, padded rows, and window traversals in another order.

Every candidate here holds the oracle's own values, only laid out differently, so every float stage must
compare with max_abs exactly 0 once the layouts are reconciled, and the verdict must pass.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ROOT
from driftscope.judge.compare import compare_tapsets, first_divergence
from driftscope.judge.contract import Contract
from driftscope.taps.tapset import TapSet, TapWriter

CHECKER = ROOT / "fixtures" / "images" / "checkerboard_140.png"  # 5x5 merged tokens: windows of 16, 4, 4 and 1


@pytest.fixture(scope="module")
def oracle(tmp_path_factory, tiny_checkpoint, full_plan):
    from driftscope.capture.runtimes import get_runtime
    from driftscope.families.checkpoints import prepare_inputs

    inputs = prepare_inputs(tiny_checkpoint, [CHECKER])
    out = tmp_path_factory.mktemp("layout")
    return get_runtime("transformers")(tiny_checkpoint, "f32").capture(inputs, full_plan, out / "oracle")


def to_raster(window_rows: np.ndarray, window_index: np.ndarray, unit: str) -> np.ndarray:
    """Scatter (not the library's argsort gather): window row i is raster merged token window_index[i]."""
    grouped = window_rows if unit == "merged" else window_rows.reshape(len(window_index), 4, *window_rows.shape[1:])
    raster = np.empty_like(grouped)
    raster[window_index] = grouped
    return raster.reshape(window_rows.shape)


def to_window(raster_rows: np.ndarray, window_index: np.ndarray, unit: str) -> np.ndarray:
    grouped = raster_rows if unit == "merged" else raster_rows.reshape(len(window_index), 4, *raster_rows.shape[1:])
    return grouped[window_index].reshape(raster_rows.shape)


def rewrite(source: TapSet, base, change, drop=()) -> TapSet:
    """A copy of ``source`` whose stages ``change(stage_id, value, declaration)`` rewrites."""
    with TapWriter(base, {"runtime": "engine", "label": base.name}) as writer:
        for stage_id in source.stage_ids():
            if stage_id in drop:
                continue
            declaration = {
                key: value
                for key, value in source.declaration(stage_id).items()
                if key in ("axes", "token_order", "token_unit", "integer")
            }
            value, declaration = change(stage_id, np.asarray(source[stage_id]), declaration)
            writer.add(stage_id, value, **declaration)
    return TapSet(writer.tensor_path)


def assert_identical(rows):
    assert first_divergence(rows) is None, [(r.stage, r.status, r.note) for r in rows if r.failed][:3]
    assert all(row.status == "pass" for row in rows)
    assert max(row.max_abs for row in rows if not row.integer) == 0.0


def raster_engine(oracle: TapSet):
    index = np.asarray(oracle["vision.window_index"])

    def change(stage_id, value, declaration):
        if declaration["token_order"] == "window":
            declaration["token_order"] = "raster"
            return to_raster(value, index, declaration["token_unit"]), declaration
        return value, declaration

    return change


def test_a_raster_candidate_is_reordered_with_the_permutation_the_inputs_imply(oracle, full_plan, tmp_path):
    """A correct engine that writes raster order where the reference holds window order passes."""
    raster = rewrite(oracle, tmp_path / "raster", raster_engine(oracle))
    rows = compare_tapsets(oracle, raster, Contract(), full_plan)
    assert_identical(rows)
    block0 = next(row for row in rows if row.stage == "vision.block.0")
    assert "candidate raster, reference window" in block0.note
    # an engine that writes no window index at all: the reference's own is the permutation of these inputs
    no_index = rewrite(oracle, tmp_path / "no-index", raster_engine(oracle), drop=("vision.window_index",))
    assert_identical([row for row in compare_tapsets(oracle, no_index, Contract(), full_plan) if row.elements])


def test_raster_against_window_without_any_window_index_is_a_layout_mismatch(oracle, full_plan, tmp_path):
    keep = lambda stage_id, value, declaration: (value, declaration)  # noqa: E731
    reference = rewrite(oracle, tmp_path / "reference", keep, drop=("vision.window_index",))
    raster = rewrite(oracle, tmp_path / "raster", raster_engine(oracle), drop=("vision.window_index",))
    rows = {row.stage: row for row in compare_tapsets(reference, raster, Contract(), full_plan)}
    row = rows["vision.block.0"]
    assert row.status == "layout_mismatch" and row.failed
    assert row.note.startswith("layout mismatch: candidate raster, reference window")
    assert rows["vision.patch_embed"].status == "pass"  # raster on both sides: compared as stored


def test_only_the_declared_active_rows_are_compared(oracle, full_plan, tmp_path):
    """Padding before, between and after the real rows, declared: compared on the active rows only."""

    def padded(stage_id, value, declaration):
        if declaration["token_order"] == "none" or value.ndim == 0:
            return value, declaration
        split = value.shape[0] // 3
        pad = np.full((3, *value.shape[1:]), 1e6 if value.dtype.kind == "f" else -7, dtype=value.dtype)
        rows = np.concatenate([pad, value[:split], pad, value[split:], pad[:1]])
        declaration["active_rows"] = [[3, 3 + split], [6 + split, 6 + value.shape[0]]]
        return rows, declaration

    engine = rewrite(oracle, tmp_path / "padded", padded)
    assert engine.shape("vision.block.0")[0] == oracle.shape("vision.block.0")[0] + 7
    assert_identical(compare_tapsets(oracle, engine, Contract(), full_plan))
    undeclared = rewrite(oracle, tmp_path / "undeclared", lambda s, v, d: (padded(s, v, dict(d))[0], d))
    rows = {row.stage: row for row in compare_tapsets(oracle, undeclared, Contract(), full_plan)}
    assert rows["vision.block.0"].status == "shape_mismatch"


def traversal_engine(oracle: TapSet, reorder):
    """The oracle's values under another window traversal: ``reorder(windows)`` gives the new list of windows."""
    index = np.asarray(oracle["vision.window_index"])
    edges = np.asarray(oracle["vision.cu_window_seqlens"]) // 4
    windows = [index[a:b] for a, b in zip(edges[:-1], edges[1:], strict=True)]
    new_windows = reorder(windows)
    new_index = np.concatenate(new_windows)
    new_bounds = np.concatenate([[0], np.cumsum([4 * len(w) for w in new_windows])])

    def change(stage_id, value, declaration):
        if stage_id == "vision.window_index":
            return new_index, declaration
        if stage_id == "vision.cu_window_seqlens":
            return new_bounds, declaration
        if declaration["token_order"] == "window":
            raster = to_raster(value, index, declaration["token_unit"])
            return to_window(raster, new_index, declaration["token_unit"]), declaration
        return value, declaration

    return change


def test_windows_visited_in_another_order_are_an_equivalent_traversal(oracle, full_plan, tmp_path):
    def reverse_and_shuffle(windows):
        out = [w.copy() for w in windows[::-1]]
        out[-1] = out[-1][::-1]  # and the tokens of one window in another order
        return out

    engine = rewrite(oracle, tmp_path / "reversed", traversal_engine(oracle, reverse_and_shuffle))
    assert not np.array_equal(engine["vision.window_index"], oracle["vision.window_index"])
    assert not np.array_equal(engine["vision.cu_window_seqlens"], oracle["vision.cu_window_seqlens"])
    rows = compare_tapsets(oracle, engine, Contract(), full_plan)
    assert_identical(rows)
    by_stage = {row.stage: row for row in rows}
    for stage in ("vision.window_index", "vision.cu_window_seqlens"):
        assert by_stage[stage].note.startswith("equivalent traversal"), by_stage[stage].note
        assert by_stage[stage].extra["traversal"] == "equivalent"


def test_a_window_with_other_tokens_fails_the_traversal(oracle, full_plan, tmp_path):
    def swap_across_windows(windows):
        out = [w.copy() for w in windows]
        out[0][0], out[1][0] = windows[1][0], windows[0][0]  # still a permutation, other window membership
        return out

    engine = rewrite(oracle, tmp_path / "swapped", traversal_engine(oracle, swap_across_windows))
    rows = {row.stage: row for row in compare_tapsets(oracle, engine, Contract(), full_plan)}
    assert rows["vision.window_index"].status == "fail"
    assert "segment membership differs: 2 of the reference's 4 segments" in rows["vision.window_index"].note

    def repeat_a_token(windows):
        out = [w.copy() for w in windows]
        out[0][1] = out[0][0]
        return out

    broken = rewrite(oracle, tmp_path / "repeated", traversal_engine(oracle, repeat_a_token))
    row = next(r for r in compare_tapsets(oracle, broken, Contract(), full_plan) if r.stage == "vision.window_index")
    assert row.status == "fail" and "does not restore raster order" in row.note


def test_row_axes_merge_into_token_rows_and_the_row_ranges_follow():
    """A stage over [crops, patches, hidden] (plan meta row_axes [crops, patches]) has one row per patch in the
    views; ranges of crops become ranges of patch rows."""
    from driftscope.views.errormaps import _token_rows

    array = np.arange(3 * 4 * 2).reshape(3, 4, 2)
    merged, rows = _token_rows(array, ["crops", "patches", "hidden"], ["crops", "patches"], [(1, 3)])
    assert merged.shape == (12, 2) and rows == [(4, 12)]
    np.testing.assert_array_equal(merged[4:8], array[1])
    same, rows = _token_rows(array, ["tokens", "x", "hidden"], ["crops", "patches"], [(0, 3)])
    assert same is array and rows == [(0, 3)]
