import numpy as np
import pytest
from driftscope.judge import accumulator, compare
from driftscope.judge.compare import compare_stage, compare_tapsets, first_divergence, growth_stages
from driftscope.judge.contract import Contract, Tolerance
from driftscope.taps.stages import Stage, TokenOrder
from driftscope.taps.tapset import TapWriter


def write(tmp_path, name, stages: dict, label=None):
    writer = TapWriter(tmp_path / name, {"runtime": name, "label": label or name})
    for stage_id, value in stages.items():
        declaration = value[1] if isinstance(value, tuple) else None
        array = value[0] if isinstance(value, tuple) else value
        writer.add(declaration or stage_id, array)
    return writer.close()


def test_metrics_match_a_direct_numpy_computation(tmp_path):
    rng = np.random.default_rng(1)
    expected = rng.standard_normal((64, 16)).astype(np.float32) * 3
    actual = expected + rng.standard_normal((64, 16)).astype(np.float32) * 0.05
    actual[10, 3] += 1.0
    ref = write(tmp_path, "ref", {"s": expected})
    cand = write(tmp_path, "cand", {"s": actual})
    row = compare_stage("s", ref, cand, Tolerance(0.08, 0.08), 0)
    e, a = expected.astype(np.float64), actual.astype(np.float64)
    diff = np.abs(a - e)
    assert row.failures == int((diff > 0.08 + 0.08 * np.abs(e)).sum())
    assert row.elements == e.size
    assert row.max_abs == pytest.approx(diff.max())
    assert row.rms == pytest.approx(np.sqrt((diff**2).mean()))
    assert row.mean_abs == pytest.approx(diff.mean())
    assert row.cosine == pytest.approx((a * e).sum() / np.linalg.norm(a) / np.linalg.norm(e))
    assert row.max_coords == [10, 3]
    assert row.max_reference_value == pytest.approx(e[10, 3]) and row.max_candidate_value == pytest.approx(a[10, 3])
    assert row.status == "fail"


def test_chunked_comparison_equals_whole(tmp_path, monkeypatch):
    rng = np.random.default_rng(2)
    expected = rng.standard_normal((100, 7)).astype(np.float32)
    actual = expected + rng.standard_normal((100, 7)).astype(np.float32) * 0.1
    ref, cand = write(tmp_path, "ref", {"s": expected}), write(tmp_path, "cand", {"s": actual})
    whole = compare_stage("s", ref, cand, Tolerance(), 0)
    monkeypatch.setattr(compare, "CHUNK_ELEMENTS", 13)
    monkeypatch.setattr(accumulator, "CHUNK_ELEMENTS", 13)
    chunked = compare_stage("s", ref, cand, Tolerance(), 0)
    for field in ("failures", "elements", "max_abs", "max_index", "max_coords"):
        assert getattr(chunked, field) == getattr(whole, field), field
    assert chunked.rms == pytest.approx(whole.rms) and chunked.cosine == pytest.approx(whole.cosine)


def test_non_finite_values_are_counted_and_fail(tmp_path):
    expected = np.ones(8, dtype=np.float32)
    actual = expected.copy()
    actual[2] = np.inf
    actual[5] = np.nan
    row = compare_stage("s", write(tmp_path, "r", {"s": expected}), write(tmp_path, "c", {"s": actual}), Tolerance(), 0)
    assert row.nonfinite_candidate == 2 and row.nonfinite_reference == 0
    assert row.failures == 2 and row.status == "fail"


def test_integer_stages_must_be_equal(tmp_path):
    integer = Stage("vision.window_index", ("merged_tokens",), integer=True)
    ref = write(tmp_path, "r", {"i": (np.arange(6), integer)})
    cand = write(tmp_path, "c", {"i": (np.array([0, 1, 2, 4, 3, 5]), integer)})
    row = compare_stage("vision.window_index", ref, cand, Tolerance(atol=10), 0, integer=True)
    assert row.status == "fail" and row.failures == 2 and row.max_coords == [3]


def test_shape_disagreement_is_reported_on_its_row_and_the_rest_compared(tmp_path):
    ref = write(tmp_path, "r", {"a": np.zeros((4, 2), np.float32), "b": np.ones(3, np.float32)})
    cand = write(tmp_path, "c", {"a": np.zeros((4, 3), np.float32), "b": np.ones(3, np.float32)})
    rows = {row.stage: row for row in compare_tapsets(ref, cand, Contract())}
    assert rows["a"].status == "shape_mismatch" and "[4, 2]" in rows["a"].note and "[4, 3]" in rows["a"].note
    assert rows["b"].status == "pass"


def test_window_ordered_stages_are_restored_with_each_sides_window_index(tmp_path):
    """Two runtimes with different window orders agree once each is put back in raster order."""
    rng = np.random.default_rng(3)
    raster = rng.standard_normal((6 * 4, 3)).astype(np.float32)  # 6 merged tokens x 4 patches
    index_a, index_b = np.array([0, 2, 4, 1, 3, 5]), np.arange(6)

    def windowed(index):
        return raster.reshape(6, 4, 3)[index].reshape(24, 3)

    stage = Stage("vision.block.0", ("tokens", "hidden"), "window", "patch")
    integer = Stage("vision.window_index", ("merged_tokens",), integer=True)
    ref = write(tmp_path, "r", {"w": (index_a, integer), "s": (windowed(index_a), stage)})
    cand = write(tmp_path, "c", {"w": (index_b, integer), "s": (windowed(index_b), stage)})
    order = TokenOrder("vision.window_index", {"patch": 4, "merged": 1})  # as the family's plan declares it
    row = compare_stage("vision.block.0", ref, cand, Tolerance(), 1, {"window": order})
    assert row.status == "pass" and row.max_abs == 0.0 and "restored to raster" in row.note
    assert compare_stage("vision.block.0", ref, cand, Tolerance(), 1).status == "fail"  # compared as stored


def test_first_divergence_and_growth(tmp_path):
    base = np.linspace(1, 2, 50, dtype=np.float32)
    stages_r = {f"s{i}": base for i in range(4)}
    stages_c = {"s0": base, "s1": base + 1e-3, "s2": base + 2e-2, "s3": base + 0.5}
    rows = compare_tapsets(write(tmp_path, "r", stages_r), write(tmp_path, "c", stages_c), Contract())
    assert first_divergence(rows).stage == "s3"
    grown = [g["stage"] for g in growth_stages(rows, 10.0)]
    assert grown == ["s1", "s2", "s3"]


def test_the_worst_failing_element_is_the_one_furthest_over_its_own_bound(tmp_path):
    """The largest |difference| (0.5 at a reference of 100: bound 8.08) passes; the element to look at is the
    small one (0.2 at a reference of 0: bound 0.08, 2.5x over), and its failure is atol-bound."""
    expected = np.array([100.0, 0.0, 1.0], dtype=np.float32)
    actual = np.array([100.5, 0.2, 1.0], dtype=np.float32)
    row = compare_stage("s", write(tmp_path, "r", {"s": expected}), write(tmp_path, "c", {"s": actual}), Tolerance(), 0)
    assert row.status == "fail" and row.failures == 1 and row.max_coords == [0]  # the largest |diff| passes
    worst = row.worst_failing
    assert worst["coords"] == [1] and worst["reference"] == 0.0 and abs(worst["candidate"] - 0.2) < 1e-7
    assert abs(worst["tolerance"] - 0.08) < 1e-9 and abs(worst["excess"] - 0.2 / 0.08) < 1e-5
    assert row.atol_bound_failures == 1


def test_a_data_stage_is_compared_exactly_and_says_so(tmp_path):
    """Data (inputs, index math) has no tolerance: a float input off by one ulp fails, and the row says why."""
    from driftscope.judge.compare import DATA_NOTE
    from driftscope.taps.stages import StagePlan

    pixels = np.random.default_rng(3).standard_normal((8, 6)).astype(np.float32)
    nudged = pixels.copy()
    nudged[2, 1] = np.nextafter(nudged[2, 1], np.float32(10))
    data = Stage("inputs.pixels", ("patches", "channels"), data=True)
    activation = Stage("hidden", ("patches", "channels"))
    plan = StagePlan("f", [data, activation])
    ref = write(tmp_path, "ref", {"inputs.pixels": (pixels, data), "hidden": (pixels, activation)})
    cand = write(tmp_path, "cand", {"inputs.pixels": (nudged, data), "hidden": (nudged, activation)})
    rows = {row.stage: row for row in compare_tapsets(ref, cand, Contract(), plan)}
    assert rows["inputs.pixels"].status == "fail" and rows["inputs.pixels"].failures == 1
    assert rows["inputs.pixels"].max_coords == [2, 1] and DATA_NOTE in rows["inputs.pixels"].note
    assert rows["hidden"].status == "pass"  # the same difference on an activation is within its tolerance
    same = write(tmp_path, "same", {"inputs.pixels": (pixels, data), "hidden": (pixels, activation)})
    row = compare_tapsets(ref, same, Contract(), plan)[0]
    assert row.status == "pass" and row.note == DATA_NOTE


def test_tolerance_used_is_the_largest_share_of_each_elements_own_bound(tmp_path, monkeypatch):
    """Over every element, max |a - e| / (atol + rtol|e|): below 1 on a passing stage (how close it came),
    the worst failing element's excess on a failing one; chunking does not change it."""
    rng = np.random.default_rng(3)
    expected = rng.standard_normal((50, 9)).astype(np.float32) * 4
    close = expected + rng.standard_normal((50, 9)).astype(np.float32) * 0.01
    far = close.copy()
    far[7, 2] = expected[7, 2] + 0.5
    ref = write(tmp_path, "ref", {"close": expected, "far": expected})
    cand = write(tmp_path, "cand", {"close": close, "far": far})
    tolerance = Tolerance(0.08, 0.08)
    e = expected.astype(np.float64)
    for stage, actual in (("close", close), ("far", far)):
        share = (np.abs(actual.astype(np.float64) - e) / (0.08 + 0.08 * np.abs(e))).max()
        row = compare_stage(stage, ref, cand, tolerance, 0)
        assert row.tolerance_used == pytest.approx(share, rel=1e-9), stage
        monkeypatch.setattr(compare, "CHUNK_ELEMENTS", 17)
        monkeypatch.setattr(accumulator, "CHUNK_ELEMENTS", 17)
        assert compare_stage(stage, ref, cand, tolerance, 0).tolerance_used == pytest.approx(share, rel=1e-9)
        monkeypatch.undo()
    assert compare_stage("close", ref, cand, tolerance, 0).status == "pass"
    failing = compare_stage("far", ref, cand, tolerance, 0)
    assert failing.status == "fail" and failing.tolerance_used == pytest.approx(failing.worst_failing["excess"])


def test_a_stage_one_side_lacks_is_not_a_perfect_match(tmp_path):
    ref = write(tmp_path, "ref", {"a": np.ones(4, np.float32), "b": np.ones(4, np.float32)})
    cand = write(tmp_path, "cand", {"a": np.ones(4, np.float32)})
    row = compare_tapsets(ref, cand, Contract())[1]
    assert row.stage == "b" and row.status == "missing" and row.note == "not captured by the candidate"
    assert np.isnan(row.cosine) and np.isnan(row.max_abs) and row.tolerance_used is None


def test_stages_a_runtime_cannot_capture_are_said_why_and_never_a_verdict_reason(tmp_path):
    """A compiled runtime that does not decode lacks text.generate.*: the report says so in words, per pair."""
    from driftscope.judge.verdict import judge
    from driftscope.taps.stages import StagePlan

    values = {
        "vision.x": np.ones(4, np.float32),
        "text.generate.tokens": np.arange(3),
        "text.generate.margins": np.ones(3),
    }
    oracle = write(tmp_path, "transformers", values, label="transformers:f32")
    compiled = write(tmp_path, "iree", {"vision.x": np.ones(4, np.float32)}, label="iree:f32")
    stages = [
        Stage("vision.x", ("n",)),
        Stage("text.generate.tokens", ("n",), integer=True),
        Stage("text.generate.margins", ("n",)),
    ]
    judged = judge(oracle, [compiled], Contract(), StagePlan("any", stages))
    assert judged["verdict"]["status"] == "pass" and judged["verdict"]["reasons"] == []
    (group,) = judged["not_compared"]["iree:f32"]
    assert group["pattern"] == "text.generate.*" and group["side"] == "candidate"
    assert group["why"] == "iree does not decode" and group["stages"] == [
        "text.generate.tokens",
        "text.generate.margins",
    ]
