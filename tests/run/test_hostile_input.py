"""Issue 14, the data half: a gate that never passes on broken data, and inputs that cannot fool it.

One test per numbered case of the issue (6 belongs to the tap-file issue); each failed on the code before
the fix. The run-level cases (exit codes, patches, locks, killed runs) are in ``test_hostile_runs.py``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pytest
import yaml
from conftest import ROOT, TINY
from driftscope.cli import main
from driftscope.errors import CheckpointError, ContractError, InputError
from driftscope.judge.contract import Contract, load_contract
from driftscope.judge.verdict import judge
from driftscope.run.investigation import investigate
from driftscope.run.params import load_parameters, parse_parameters
from driftscope.run.report import Report
from driftscope.taps.stages import Stage, StagePlan
from driftscope.taps.tapset import TapWriter
from PIL import Image

CHECKER = ROOT / "fixtures" / "images" / "checkerboard_140.png"
RUN = {
    "checkpoint": str(TINY),
    "images": [str(CHECKER)],
    "runtimes": ["transformers:f32", "mlx:f32"],
    "stages": {"blocks": True},
    "replay": False,
    "notebooks": [],
}


def cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def taps(tmp_path: Path, label: str, stages: dict) -> object:
    """A TapSet on disk; ``stages``: stage id -> array, or (array, sidecar declaration)."""
    with TapWriter(tmp_path / label, {"runtime": label, "label": label}) as writer:
        for stage_id, value in stages.items():
            array, declaration = value if isinstance(value, tuple) else (value, {})
            writer.add(stage_id, array, **declaration)
    from driftscope.taps.tapset import TapSet

    return TapSet(tmp_path / label)


def saved_report(path: Path, reference, candidates, contract: Contract, plan: StagePlan) -> Path:
    """A complete report.json judged from real TapSets (what an investigation writes after its captures)."""
    data = {
        "schema_version": 1,
        "status": "complete",
        "stopped_at": "done",
        "name": "hostile",
        "reference": reference.label,
        "contract": contract.to_dict(),
        "stage_plan": [stage.to_dict() for stage in plan],
        **judge(reference, candidates, contract, plan),
    }
    Report(path, data).save()
    return path


@pytest.fixture(scope="module")
def finished(tmp_path_factory, captures, full_plan) -> Path:
    """A complete run's directory: transformers f32 against MLX f32, judged from the session's real captures."""
    out = tmp_path_factory.mktemp("finished")
    reference, candidate = captures["transformers:f32"], captures["mlx:f32"]
    contract = Contract()
    data = {
        "schema_version": 1,
        "status": "complete",
        "stopped_at": "done",
        "name": "finished",
        "reference": reference.label,
        "runtimes": [{"label": t.label, "tapset": str(t.tensor_path)} for t in (reference, candidate)],
        "stage_plan": [stage.to_dict() for stage in full_plan],
        "plan_meta": {"depth": full_plan.depth, **full_plan.meta},
        "contract": contract.to_dict(),
        "replay": {},
        **judge(reference, [candidate], contract, full_plan),
    }
    Report(out / "report.json", data).save()
    return out


@pytest.fixture(scope="module")
def notebook_run(tmp_path_factory, tiny_checkpoint_dir) -> tuple[Path, Path]:
    """Notebook 01 run as JupyterLab runs it (the kernel in ``notebooks/``), on a parameter file in a repository
    that names everything relatively, for a run named and a runtime labelled ``<script>alert(n)</script>``."""
    from driftscope.views.execution import execute
    from driftscope.views.pages import to_html

    base = tmp_path_factory.mktemp("jupyter")
    repo = base / "repo"
    for folder in ("parameters", "notebooks", "images"):
        (repo / folder).mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "ck").symlink_to(TINY)
    shutil.copy(CHECKER, repo / "images" / "checker.png")
    (repo / "parameters" / "c.yaml").write_text("default: {atol: 0.08, rtol: 0.08}\n")
    runtimes = ["transformers:f32", {"runtime": "mlx", "policy": "f32", "label": "<script>alert(2)</script>"}]
    relative = {"checkpoint": "ck", "images": ["images/checker.png"], "contract": "parameters/c.yaml"}
    (repo / "parameters" / "p.yaml").write_text(
        yaml.safe_dump({**RUN, **relative, "name": "<script>alert(1)</script>", "runtimes": runtimes})
    )
    try:
        execute(
            "01_stage_parity",
            base / "run",
            {"params_path": "parameters/p.yaml", "out_dir": str(base / "run")},
            cwd=repo / "notebooks",
            log_output=False,
        )
    except Exception:  # noqa: BLE001 - a cell error is in the executed notebook, which the tests read
        pass
    to_html(base / "run" / "01_stage_parity.ipynb")
    return repo, base / "run"


def test_1_contract_values_that_are_not_finite_or_negative_are_refused(tmp_path, finished, capsys):
    for text, key in (
        ("default: {atol: .nan}", "atol"),
        ("default: {rtol: .inf}", "rtol"),
        ("stages: [{pattern: 'vision.*', atol: -0.1}]", "atol"),
        ("default: {max_failure_fraction: .nan}", "max_failure_fraction"),
    ):
        path = tmp_path / "c.yaml"
        path.write_text(text)
        with pytest.raises(ContractError, match=f"{key} must be a finite, non-negative number") as caught:
            load_contract(path)
        assert caught.value.fix and key in caught.value.fix
    (tmp_path / "nan.yaml").write_text("default: {atol: .nan, rtol: .nan}\n")
    before = (finished / "report.json").read_bytes()
    code, out, err = cli(capsys, "rejudge", finished, "--contract", tmp_path / "nan.yaml", "--out", tmp_path / "r.json")
    assert code == 2 and "atol must be a finite, non-negative number" in err and "Verdict" not in out
    assert (finished / "report.json").read_bytes() == before and not (tmp_path / "r.json").exists()


def test_2_nonfinite_values_fail_whatever_max_failure_fraction_allows(tmp_path):
    rng = np.random.default_rng(0)
    finite = rng.standard_normal((8, 4)).astype(np.float32)
    nan = np.full((8, 4), np.nan, dtype=np.float32)
    plan = StagePlan("t", [Stage("a", ("x", "y")), Stage("b", ("x", "y"))])
    reference = taps(tmp_path, "ref", {"a": finite, "b": nan})
    candidate = taps(tmp_path, "cand", {"a": nan, "b": nan})
    lenient = Contract.from_dict({"default": {"max_failure_fraction": 0.5}})
    result = judge(reference, [candidate], lenient, plan)
    rows = {row["stage"]: row for row in result["rows"]}
    assert rows["a"]["status"] == "fail" and rows["a"]["nonfinite_mismatch"] == 32
    assert result["verdict"]["status"] == "fail"
    assert "a (32 non-finite value(s) the other side lacks" in result["verdict"]["reasons"][0]
    # NaN on both sides everywhere: nothing there could be judged, which is not a pass (issue 30 item 2), and
    # never a silent pass with cosine 1.0
    assert rows["b"]["nonfinite_both"] == 32 and rows["b"]["status"] == "not_judged"
    assert "every element (32) is non-finite on both sides" in rows["b"]["note"]
    assert rows["b"]["cosine"] != 1.0 and not np.isfinite(rows["b"]["cosine"])
    assert any(
        "1 stage(s) could not be judged, non-finite on both sides (b)" in r for r in result["verdict"]["reasons"]
    )


def test_3_a_sidecar_cannot_make_a_float_stage_integer(tmp_path):
    from driftscope.judge.compare import compare_tapsets

    rng = np.random.default_rng(1)
    expected = (0.05 + 0.05 * rng.random((16, 8))).astype(np.float32)  # truncated to int: all 0
    actual = expected + np.float32(0.85)  # truncated to int: still 0, but 0.85 off under atol 0.08
    window = Stage("vision.window_index", ("merged_tokens",), integer=True)
    plan = StagePlan("t", [Stage("vision.block.0", ("tokens", "hidden")), window])
    lying = {"integer": True}
    reference = taps(tmp_path, "ref", {"vision.block.0": (expected, lying), "vision.window_index": np.arange(4)})
    candidate = taps(
        tmp_path,
        "cand",
        {"vision.block.0": (actual, lying), "vision.window_index": np.array([0.0, 1.5, 2.0, 3.0], np.float32)},
    )
    rows = {row.stage: row for row in compare_tapsets(reference, candidate, Contract(), plan)}
    block = rows["vision.block.0"]
    assert not block.integer and block.status == "fail" and block.failures == 128
    assert block.max_abs == pytest.approx(0.85, abs=1e-6)
    # the plan's integer stage is compared exactly: 1.5 is not 1
    assert rows["vision.window_index"].integer and rows["vision.window_index"].status == "fail"
    assert rows["vision.window_index"].max_coords == [1]


def test_4_rejudge_of_a_run_that_did_not_complete_refuses_with_exit_2(tmp_path, tiny_checkpoint_dir, capsys):
    patch = f"{ROOT / 'tests' / 'hostile_patches.py'}:boom"
    runtimes = ["transformers:f32", {"runtime": "mlx", "policy": "f32", "patch": patch}]
    with pytest.raises(Exception, match="planted crash"):
        investigate(parse_parameters({**RUN, "name": "crash", "runtimes": runtimes}, "test"), tmp_path)
    (tmp_path / "c.yaml").write_text("default: {atol: 0.08, rtol: 0.08}\n")
    code, out, err = cli(capsys, "rejudge", tmp_path, "--contract", tmp_path / "c.yaml", "--out", tmp_path / "r.json")
    assert code == 2 and "PASS" not in out.upper()
    assert "did not complete (error: stopped at capture:mlx:f32" in err and "planted crash" in err


def test_5_summaries_name_the_first_nonfinite_element_not_a_finite_worst_one(tmp_path, capsys):
    rng = np.random.default_rng(2)
    expected = rng.standard_normal((6, 4)).astype(np.float32)
    actual = expected + np.float32(0.01)
    actual[0, 0] += np.float32(0.05)  # the finite worst element, inside the tolerance
    actual[2, 3] = np.nan
    actual[4, 1] = np.inf
    plan = StagePlan("t", [Stage("vision.block.0", ("t", "h")), Stage("vision.block.1", ("t", "h"))])
    nan = np.full((6, 4), np.nan, dtype=np.float32)
    reference = taps(tmp_path, "ref", {"vision.block.0": expected, "vision.block.1": nan})
    candidate = taps(tmp_path, "cand", {"vision.block.0": actual, "vision.block.1": nan})
    path = saved_report(tmp_path / "run" / "report.json", reference, [candidate], Contract(), plan)
    report = Report.load(path)
    first = report.data["first_divergence"]["cand"]
    assert first["stage"] == "vision.block.0" and first["max_coords"] == [2, 3]
    assert first["reference_value"] == pytest.approx(float(expected[2, 3])) and first["candidate_value"] == "nan"
    all_nan = next(row for row in report.rows if row.stage == "vision.block.1")
    assert np.isnan(all_nan.cosine) and np.isnan(all_nan.max_abs)  # never cosine 1.0 / max_abs 0
    code, out, _ = cli(capsys, "show", path.parent)
    assert code == 1
    assert f"first non-finite element at `[2, 3]`: reference {expected[2, 3]:.6g}, candidate nan" in out
    assert "could not be judged, non-finite on both sides (vision.block.1)" in out  # named, not passed silently


def test_7_contract_rules_that_match_nothing_and_skipping_everything(finished, tmp_path, capsys):
    (tmp_path / "typo.yaml").write_text("stages: [{pattern: 'vison.block.*', atol: 1.0}]\n")
    code, out, _ = cli(capsys, "rejudge", finished, "--contract", tmp_path / "typo.yaml", "--out", tmp_path / "a.json")
    assert code == 0
    assert Report.load(tmp_path / "a.json").data["warnings"] == [
        "contract rule 'vison.block.*' matches no stage of the plan"
    ]
    assert "**warning**: contract rule 'vison.block.\\*' matches no stage" in out
    (tmp_path / "skip.yaml").write_text("default: {skip: true}\n")
    code, out, _ = cli(capsys, "rejudge", finished, "--contract", tmp_path / "skip.yaml", "--out", tmp_path / "b.json")
    data = Report.load(tmp_path / "b.json").data
    assert code == 1 and data["verdict"]["status"] == "fail"
    assert "mlx:f32: no stage was compared" in data["verdict"]["reasons"][0]
    assert any("skips every stage" in warning for warning in data["warnings"])


def test_8_run_names_are_labels_and_every_output_stays_under_the_root(tmp_path, tiny_checkpoint_dir):
    from driftscope.batch.runner import run_batch
    from driftscope.run.investigation import default_out_dir

    names = ["../escaped", str(tmp_path / "absolute" / "run"), "plain#1?x=%41"]
    files = []
    for name in names:
        params = parse_parameters({**RUN, "name": name}, "test")
        out = default_out_dir(params, root=tmp_path)
        assert out.parent == tmp_path / "outputs" / "nocommit" and re.fullmatch(r"[A-Za-z0-9._-]+", out.name)
        file = tmp_path / "params" / f"p{len(files)}.yaml"
        file.parent.mkdir(exist_ok=True)
        file.write_text(yaml.safe_dump({**RUN, "name": name}))
        files.append(file)
    root = tmp_path / "outputs"
    result = run_batch(files, out_root=root, log=lambda message: None)
    assert all(summary["verdict"] == "pass" and not summary["error"] for summary in result.summaries), result.summaries
    commit_dir = root / result.commit
    for summary in result.summaries:
        run_dir = commit_dir / summary["dir"]
        assert run_dir.resolve().parent == commit_dir.resolve() and (run_dir / "report.json").is_file()
        assert re.fullmatch(r"[A-Za-z0-9._-]+", summary["dir"])
        (run_dir / "01_stage_parity.html").write_text("<html></html>")
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["outputs", "params"]  # nothing beside it
    assert not (tmp_path / "absolute").exists() and not (tmp_path.parent / "escaped").exists()
    from driftscope.batch.evidence import write_index
    from driftscope.core.storage import OutputRoot
    from driftscope.run.runrecord import commit_entries

    storage = OutputRoot(root)
    write_index(storage, result.commit, commit_entries(storage, result.commit))
    index = (commit_dir / "index.html").read_text()
    links = re.findall(r'<a href="([^"]+)">', index)
    assert len(links) == 3
    for link in links:
        assert not set("#?") & set(link)  # no raw fragment or query: special characters only as %XX
        assert (commit_dir / unquote(link)).is_file(), link


def test_9_labels_and_names_are_escaped_in_every_rendered_page(notebook_run, tmp_path):
    from driftscope.batch.evidence import write_index
    from driftscope.core.storage import OutputRoot
    from driftscope.run.runrecord import commit_entries

    _, out = notebook_run
    root = OutputRoot(tmp_path / "root")
    shutil.copytree(out, tmp_path / "root" / "c" / "run")
    entries = [dict(entry, name="<script>alert(1)</script>") for entry in commit_entries(root, "c")]
    index = Path(write_index(root, "c", entries))
    for page in (out / "01_stage_parity.html", out / "01_stage_parity.nocode.html", index):
        html = page.read_text()
        scripts = re.findall(r"<script\b[^>]*>(.*?)</script>", html, flags=re.S | re.I)
        # a plotly figure's data (hover text, trace names) may hold the label, JSON-escaped inside its script
        # (\u003c ... \u002f: it cannot close the script or run); any other occurrence in a script would run
        escaped = "\\u003cscript\\u003ealert("
        assert not [s for s in scripts if "alert(" in s.replace(escaped, "")], page.name
        assert "<script>alert(" not in html, page.name
        assert "&lt;script&gt;alert(" in html, page.name  # shown as text, not dropped
    html = (out / "01_stage_parity.html").read_text()
    assert "&lt;script&gt;alert(2)&lt;/script&gt; status" in html  # the Styler block table's column header
    assert "Verdict: PASS" in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # the run's name


def test_10_relative_paths_resolve_against_the_parameter_files_repository(notebook_run, tmp_path, monkeypatch):
    from driftscope.families.checkpoints import open_checkpoint, prepare_inputs

    repo, out = notebook_run
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for cwd, given in ((repo, "parameters/p.yaml"), (repo / "notebooks", "parameters/p.yaml"), (elsewhere, None)):
        monkeypatch.chdir(cwd)
        params = load_parameters(given or repo / "parameters" / "p.yaml")
        assert params.checkpoint == repo / "ck" and params.images == [repo / "images" / "checker.png"], cwd
        assert params.contract == repo / "parameters" / "c.yaml"
    # the notebook ran with its kernel in notebooks/ and found everything from the repository root
    cells = json.loads((out / "01_stage_parity.ipynb").read_text())["cells"]
    assert not [o for c in cells for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert Report.load(out).data["inputs"]["images"] == [str(repo / "images" / "checker.png")]
    # outside a repository: the file's own folder; the error states that rule
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({**RUN, "checkpoint": "ck", "images": ["missing.png"]}))
    params = load_parameters(tmp_path / "p.yaml")
    assert params.checkpoint == tmp_path / "ck" and params.images == [tmp_path / "missing.png"]
    with pytest.raises(InputError, match="missing.png does not exist") as caught:
        prepare_inputs(open_checkpoint(TINY), params.images)
    assert "resolve against the repository holding it, or its own folder" in caught.value.fix


def test_11_output_files_get_the_umask_permissions(tmp_path):
    from driftscope.batch.evidence import write_index, write_junit
    from driftscope.core.atomic import write_json_atomic
    from driftscope.core.storage import OutputRoot

    summary = {"params": "p.yaml", "name": "n", "verdict": "pass", "status": "complete", "commit": "c", "dir": "n"}
    previous = os.umask(0o022)
    try:
        written = [
            write_json_atomic(tmp_path / "report.json", {"a": 1}),
            Path(write_index(OutputRoot(tmp_path), "c", [summary])),
            Path(write_junit(OutputRoot(tmp_path), "c", [summary])),
        ]
        tapset = taps(tmp_path, "t", {"s": np.zeros(3, np.float32)})
        written += [tapset.sidecar_path, tapset.tensor_path]
        for path in written:
            assert path.stat().st_mode & 0o777 == 0o644, path.name
        os.umask(0o027)
        assert write_json_atomic(tmp_path / "strict.json", {}).stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(previous)


def test_14_show_rejudge_diff_and_run_never_print_a_traceback(tmp_path, finished, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "report.json").write_text('{"schema_version": 1, "rows": [')
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "report.json").write_text('{"schema_version": 99}')
    (tmp_path / "c.yaml").write_text("default: {atol: 0.1}\n")
    for target, message in (
        (tmp_path / "empty", "holds no report.json"),
        (tmp_path / "missing", "does not exist"),
        (tmp_path / "corrupt", "is not readable JSON"),
        (tmp_path / "other", "has schema_version 99"),
    ):
        for args in (["show", target], ["rejudge", target, "--contract", tmp_path / "c.yaml"]):
            code, _, err = cli(capsys, *args)
            assert code == 2 and message in err and "Traceback" not in err, (args, err)
            assert err.startswith("driftscope: error:") and len(err.strip().splitlines()) == 2  # problem, fix
    (tmp_path / "file").write_text("not a directory")
    params = tmp_path / "p.yaml"
    params.write_text(yaml.safe_dump({**RUN, "name": "x"}))
    code, _, err = cli(capsys, "run", params, "--out", tmp_path / "file")
    assert code == 2 and "is a file, not a directory" in err
    # diff: one corrupt report is named unreadable, the other runs are still compared
    for commit in ("a", "b"):
        for name in ("one", "two"):
            (tmp_path / "o" / commit / name).mkdir(parents=True)
            data = json.loads((finished / "report.json").read_text())
            (tmp_path / "o" / commit / name / "report.json").write_text(json.dumps({**data, "name": name}))
    (tmp_path / "o" / "b" / "two" / "report.json").write_text("{not json")
    code, out, err = cli(capsys, "diff", "a", "b", "--out-root", tmp_path / "o")
    assert code == 2 and "Traceback" not in err
    assert "two: unreadable (report" in out and "one: verdict pass -> pass; 0 changed stage(s)" in out


def test_15_a_truncated_or_corrupt_checkpoint_is_found_when_it_opens(tmp_path, tiny_checkpoint_dir):
    from driftscope.families.checkpoints import open_checkpoint

    copy = tmp_path / "ck"
    shutil.copytree(tiny_checkpoint_dir, copy)
    weights = copy / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="is truncated: its header describes") as caught:
        open_checkpoint(copy)
    assert str(weights) in str(caught.value) and "copy the checkpoint again" in caught.value.fix
    weights.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}" + data[24:])
    with pytest.raises(CheckpointError, match="is not a readable safetensors file"):
        open_checkpoint(copy)


def test_16_transparent_palette_and_gray_images_become_rgb_as_the_processor_makes_them(tmp_path, tiny_checkpoint):
    from driftscope.families.checkpoints import prepare_inputs
    from driftscope.families.qwen_shared.processor import load_image_processor

    processor = load_image_processor(tiny_checkpoint)
    rng = np.random.default_rng(3)
    rgb = rng.integers(0, 256, (140, 140, 3), dtype=np.uint8)
    alpha = np.where(np.arange(140)[None, :] < 70, 255, 0).astype(np.uint8).repeat(140, axis=0)
    rgba = Image.fromarray(np.dstack([rgb, alpha]), "RGBA")
    palette = Image.fromarray(rng.integers(0, 4, (140, 140), dtype=np.uint8), "P")
    palette.putpalette([200, 10, 10, 10, 200, 10, 10, 10, 200, 0, 0, 0] + [0] * 756)
    palette.info["transparency"] = 3  # index 3 (black in the palette) is transparent
    gray = Image.fromarray(rng.integers(0, 256, (140, 140), dtype=np.uint8), "L")
    white = np.full((140, 140, 3), 255, np.uint8)
    index = np.asarray(palette)
    colours = np.array([[200, 10, 10], [10, 200, 10], [10, 10, 200], [255, 255, 255]], np.uint8)
    expected = {  # composited by hand: transparent pixels become white
        "rgba.png": np.where(alpha[..., None] == 255, rgb, white),
        "palette.png": colours[index],
        "gray.png": np.repeat(np.asarray(gray)[..., None], 3, axis=-1),
    }
    for name, image in (("rgba.png", rgba), ("palette.png", palette), ("gray.png", gray)):
        image.save(tmp_path / name)
        inputs = prepare_inputs(tiny_checkpoint, [tmp_path / name])
        reference = processor(images=[Image.fromarray(expected[name])], return_tensors="np")["pixel_values"]
        np.testing.assert_array_equal(inputs["pixel_values"], np.asarray(reference, np.float32), err_msg=name)
        recorded = inputs.summary()["conversions"][0]
        assert recorded.startswith(f"{image.mode}: ")
        assert ("composited onto white" in recorded) == (name != "gray.png"), recorded
