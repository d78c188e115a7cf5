"""``driftscope.open_run``: a finished run's taps by name, its rows and pair differences, checked against the
raw safetensors files read independently (``safetensors.numpy``) and against the run's own comparison rows."""

from __future__ import annotations

import json

import driftscope
import numpy as np
import pytest
from conftest import write_params
from driftscope.errors import ReportError, TapFileError
from safetensors.numpy import load_file


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_checkpoint_dir):
    """transformers f32 against MLX f32 and bf16 on the checkerboard, block outputs only: bf16 diverges, so
    narrowing adds a block's substages and the replay writes op-local outputs."""
    from driftscope.run.investigation import investigate

    base = tmp_path_factory.mktemp("access")
    params = write_params(
        base / "p.yaml", "access", ["transformers:f32", "mlx:f32", "mlx:bf16"], stages={"blocks": True}, notebooks=[]
    )
    investigate(str(params), base / "out")
    return base / "out"


def raw(out, label):
    """A runtime's stored arrays, read straight from its safetensors file (no driftscope code)."""
    report = json.loads((out / "report.json").read_text())
    entry = next(r for r in report["runtimes"] if r["label"] == label)
    return load_file(out / entry["tapset"]), report


def test_taps_by_name_are_memory_mapped_and_equal_the_files(finished):
    run = driftscope.open_run(finished)
    assert run.labels == ["transformers:f32", "mlx:f32", "mlx:bf16"]
    assert run.verdict == "fail"
    for label in run.labels:
        stored, _ = raw(finished, label)
        taps = run[label]
        assert set(stored) <= set(taps)
        for stage_id, array in stored.items():
            got = taps[stage_id]
            assert isinstance(got, np.memmap), stage_id  # F32/I64 on disk: mapped, not read
            assert not got.flags.writeable
            np.testing.assert_array_equal(got, array)


def test_narrowed_substages_join_the_runtime_taps(finished):
    run = driftscope.open_run(finished)
    report = json.loads((finished / "report.json").read_text())
    added = report["narrowing"]["mlx:bf16"]["added"]
    assert added and all(".block." in stage for stage in added)
    stored = {}
    for path in report["narrowing"]["mlx:bf16"]["tapsets"]["candidate"]:
        stored.update(load_file(finished / path))
    for stage_id in added:
        np.testing.assert_array_equal(run["mlx:bf16"][stage_id], stored[stage_id])
        assert stage_id not in raw(finished, "mlx:bf16")[0]  # not in the runtime's own file


def test_pair_diff_matches_the_raw_arrays_and_the_runs_row(finished):
    run = driftscope.open_run(finished)
    pair = run.pair("mlx:bf16")
    first = run.report.data["first_divergence"]["mlx:bf16"]["stage"]
    reference, _ = raw(finished, "transformers:f32")
    candidate, _ = raw(finished, "mlx:bf16")
    report = json.loads((finished / "report.json").read_text())
    for path in report["narrowing"]["mlx:bf16"]["tapsets"]["candidate"]:
        candidate.update(load_file(finished / path))
    for path in report["narrowing"]["mlx:bf16"]["tapsets"]["reference"]:
        reference.update(load_file(finished / path))
    diff = pair.diff(first)
    expected = candidate[first].astype(np.float64) - reference[first].astype(np.float64)
    np.testing.assert_array_equal(diff.delta, expected)  # both sides share one token order: no reordering
    row = pair.row(first)
    assert diff.max_abs == pytest.approx(row.max_abs, rel=1e-6)
    assert diff.failures == row.failures > 0
    bound = 0.08 + 0.08 * np.abs(reference[first].astype(np.float64))  # the default contract
    assert diff.failures == int((np.abs(expected) > bound).sum())
    assert diff.worst["coords"] == row.worst_failing["coords"]
    page = diff._repr_html_()
    assert "fail" in page and first in page and "src='data:image/png;base64," in page  # the map inline, offline
    used = np.abs(expected) / bound
    assert float(diff.used.max()) == pytest.approx(float(used.max())) and diff.used.max() > 1
    assert len(pair.rows) == len(pair.stages) and first in pair.stages
    assert set(run.rows["pair"]) == {"mlx:f32", "mlx:bf16"}


def test_replayed_outputs_and_html(finished):
    run = driftscope.open_run(finished)
    replay = json.loads((finished / "report.json").read_text())["replay"]["mlx:bf16"]
    stored = load_file(finished / replay["tapset"])
    replayed = run.replayed("mlx:bf16")
    for stage_id, array in stored.items():
        np.testing.assert_array_equal(replayed[stage_id], array)
    assert "mlx:bf16" in run._repr_html_() and "<table>" in run["mlx:f32"]._repr_html_()


def test_wrong_names_say_what_exists(finished, tmp_path):
    run = driftscope.open_run(finished)
    with pytest.raises(TapFileError, match="(?s)no runtime 'mlx:f16'.*use one of"):
        run["mlx:f16"]
    with pytest.raises(KeyError):  # a Mapping: .get() and `in` work as usual
        run["mlx:f32"]["vision.block.99"]
    assert run["mlx:f32"].get("vision.block.99") is None
    with pytest.raises(TapFileError, match="(?s)captured no stage .vision.nope.*use a stage both sides captured"):
        run.pair("mlx:bf16").diff("vision.nope")
    with pytest.raises(ReportError, match="judged no pair 'iree:f32'"):
        run.pair("iree:f32")
    with pytest.raises(ReportError, match="holds no report.json"):
        driftscope.open_run(tmp_path)


def test_a_mistyped_name_gets_a_did_you_mean(finished):
    """Issue 53 item 10: a stage, runtime or pair one typo away from a real one is named in the fix."""
    run = driftscope.open_run(finished)
    with pytest.raises(TapFileError, match=r"(?s)no stage 'vision.block.5.mlp.acts'.*did you mean 'vision.block.5"):
        run["mlx:f32"]["vision.block.5.mlp.acts"]
    with pytest.raises(TapFileError, match=r"(?s)no runtime 'mlx:fp32'.*did you mean 'mlx:f32'"):
        run["mlx:fp32"]
    with pytest.raises(ReportError, match=r"(?s)no pair 'mlx:bf61'.*did you mean 'mlx:bf16'"):
        run.pair("mlx:bf61")
    with pytest.raises(TapFileError, match=r"(?s)no stage 'vision.blok.3'.*did you mean 'vision.block.3'"):
        run.pair("mlx:bf16").diff("vision.blok.3")
    with pytest.raises(TapFileError) as nothing_close:
        run["mlx:f32"]["zzz"]
    assert "did you mean" not in str(nothing_close.value)


def test_taps_and_differences_by_their_axis_names(finished):
    """``sel`` indexes by the sidecar's declared axis names (checked against the raw file with numpy), an unknown
    name says the names there are; a difference keeps its names; treescope shows both where it is installed."""
    run = driftscope.open_run(finished)
    taps = run["mlx:f32"]
    arrays, _ = raw(finished, "mlx:f32")
    assert taps.axes("vision.block.3") == ("tokens", "hidden")
    np.testing.assert_array_equal(taps.sel("vision.block.3", tokens=7), arrays["vision.block.3"][7])
    np.testing.assert_array_equal(taps.sel("vision.block.3", hidden=slice(2, 5)), arrays["vision.block.3"][:, 2:5])
    with pytest.raises(TapFileError, match=r"(?s)no axis 'token'.*did you mean 'tokens'"):
        taps.sel("vision.block.3", token=7)
    diff = run.pair("mlx:bf16").diff("vision.block.3")
    assert diff.axes == ("tokens", "hidden")
    row = diff.sel(tokens=7)
    assert row.axes == ("hidden",) and np.array_equal(row.delta, diff.delta[7])
    pytest.importorskip("treescope")
    assert type(taps.view("vision.block.3")).__name__ == "TreescopeFigure"
    assert type(diff.view()).__name__ == "TreescopeFigure"


def test_without_treescope_the_view_says_how_to_get_it(finished, monkeypatch):
    import sys

    from driftscope.errors import RuntimeUnavailableError

    monkeypatch.setitem(sys.modules, "treescope", None)  # as a machine without it: `import treescope` fails
    run = driftscope.open_run(finished)
    with pytest.raises(RuntimeUnavailableError, match="(?s)treescope is not installed.*pip install treescope"):
        run["mlx:f32"].view("vision.block.3")
