"""``driftscope run``: the notebook executes through papermill and renders to HTML with its figures."""

from __future__ import annotations

import json
import re

from conftest import ROOT, write_params
from driftscope.cli import main


def test_run_writes_report_notebook_and_html(rendered):
    code, out = rendered
    report = json.loads((out / "report.json").read_text())
    # bf16 diverges on the tiny fixture, so the gate fails the run (exit 1) and says so in the report
    assert report["verdict"]["per_candidate"] == {
        "mlx:f32": "pass",
        "mlx:bf16": "fail",
        "iree:f32": "pass",
        "iree:f32 vs mlx:f32": "pass",
    }
    assert code == 1
    for name in (
        "01_stage_parity.ipynb",
        "01_stage_parity.html",
        "01_stage_parity.nocode.html",
        "02_layer_drilldown.html",
        "02_layer_drilldown.nocode.html",
    ):
        assert (out / name).exists(), name


def test_executed_notebook_has_no_errors_and_shows_the_figures(rendered):
    _, out = rendered
    notebook = json.loads((out / "01_stage_parity.ipynb").read_text())
    outputs = [o for cell in notebook["cells"] if cell["cell_type"] == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 2  # the curves and the inputs
    html = (out / "01_stage_parity.html").read_text()
    assert len(re.findall(r"<img[^>]+src=\"data:image/png;base64", html)) >= 2
    assert "Verdict: FAIL" in html and "first divergence at" in html
    first = json.loads((out / "report.json").read_text())["first_divergence"]["mlx:bf16"]["stage"]
    assert first in html
    # three runtimes in one table: every pair has a status column in the stage table
    for pair in ("mlx:f32 status", "mlx:bf16 status", "iree:f32 status", "iree:f32 vs mlx:f32 status"):
        assert pair in html, pair


def test_nocode_html_hides_the_code(rendered):
    _, out = rendered
    with_code = (out / "01_stage_parity.html").read_text()
    nocode = (out / "01_stage_parity.nocode.html").read_text()
    assert with_code.count("hl-ipython3") >= 5  # one highlighted block per code cell
    assert "hl-ipython3" not in nocode
    assert "<img" in nocode


def test_bad_parameter_file_exits_2_with_the_fix(tmp_path, capsys):
    params = tmp_path / "bad.yaml"
    params.write_text("checkpoint: x\nimages: []\nruntimes: [transformers, mlx]\ncolour: red\n")
    assert main(["run", str(params), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "unknown keys ['colour']" in err and "valid keys" in err


def test_a_crashed_investigation_shows_in_the_notebook_and_the_rest_are_not_run(crashed):
    """The CLI runs the investigation next to the notebook's kernel: its error is what the notebook shows."""
    code, _, out = crashed  # conftest's run: MLX's patch raises "planted crash" while it loads; notebooks 01, 02
    assert code == 2
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "error" and report["stopped_at"] == "capture:mlx:f32"
    notebook = json.loads((out / "01_stage_parity.ipynb").read_text())
    errors = [o for c in notebook["cells"] for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert len(errors) == 1 and "planted crash" in errors[0]["evalue"]
    assert "planted crash" in (out / "01_stage_parity.html").read_text()
    assert not (out / "02_layer_drilldown.ipynb").exists()  # it would only have run the crash again


def test_a_forced_run_of_several_notebooks_investigates_once(tmp_path, tiny_checkpoint_dir):
    """``reuse=False`` (batch --force) re-runs the investigation in the first notebook; the next one reuses it."""
    from driftscope.run.investigation import investigate
    from driftscope.views.render import run_notebooks

    # the block outputs alone and no replay: the claim is how often the investigation runs, not what it finds
    params = write_params(
        tmp_path / "p.yaml", "forced", ["transformers:f32", "mlx:f32"], stages={"blocks": True}, replay=False
    )
    out = tmp_path / "out"
    names = ["01_stage_parity", "04_negative_controls"]
    created = investigate(params, out).data["created"]  # a finished run of these parameters, here in-process
    assert json.loads((out / "report.json").read_text())["created"] == created
    assert run_notebooks(names, out, params, False, ROOT) == {}  # forced again: a new run, made once
    assert json.loads((out / "report.json").read_text())["created"] != created

    def investigate_output(name: str) -> str:
        """What the investigation printed: the progress log a notebook shows (collapsed) at its end."""
        cells = json.loads((out / f"{name}.ipynb").read_text())["cells"]
        outputs = [o for c in cells if c["cell_type"] == "code" for o in c["outputs"]]
        return "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", "")) for o in outputs)

    assert "capture mlx:f32" in investigate_output("01_stage_parity")
    assert "reusing the finished run" in investigate_output("04_negative_controls")


def test_window_geometry_notebook_renders_every_figure_and_the_audit(tmp_path):
    from driftscope.views.execution import execute
    from driftscope.views.pages import to_html

    executed = execute(
        "03_window_geometry",
        tmp_path,
        {"image_path": str(ROOT / "fixtures/images/shapes_336.png")},
        cwd=ROOT,
        log_output=False,
    )
    notebook = json.loads(executed.read_text())
    outputs = [o for cell in notebook["cells"] if cell["cell_type"] == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 4  # windows, permutation, misplaced, masks
    html, _ = to_html(executed)
    text = html.read_text()
    assert "misplaces <strong>120</strong> tokens" in text  # 336x336: not an involution
    assert "padding_to_active" in text and "cross_media" in text


def test_window_geometry_says_an_involution_once_instead_of_an_empty_panel(tmp_path):
    """448x448 (issue 19 item 12): a wrong un-reorder misplaces nothing, so the page says so once and draws no
    picture of zero misplaced tokens."""
    from driftscope.views.execution import execute
    from driftscope.views.pages import to_html

    executed = execute(
        "03_window_geometry",
        tmp_path,
        {"image_path": str(ROOT / "fixtures/images/shapes_448.png")},
        cwd=ROOT,
        log_output=False,
    )
    outputs = [o for c in json.loads(executed.read_text())["cells"] if c["cell_type"] == "code" for o in c["outputs"]]
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 3  # windows, permutation, masks
    text = to_html(executed)[1].read_text()
    assert text.count("window permutation is an involution") == 1 and "misplaces <strong>0</strong> tokens" in text


def test_layer_drilldown_renders_every_figure_for_the_first_divergent_block(rendered):
    _, out = rendered
    report = json.loads((out / "report.json").read_text())
    assert list(report["replay"]) == ["mlx:bf16"]
    labels = {x["stage"]: x["label"] for x in report["replay"]["mlx:bf16"]["labels"]}
    # the stem (patch embedding, rotary tables), 8 blocks, the merger's four operators, and what narrowing added
    added = (report["narrowing"].get("mlx:bf16") or {}).get("added", [])
    text = {"text.embeds.image", "text.embeds.text", "text.norm.last", "text.logits.last"}
    text |= {f"text.layer.{i}{last}" for i in range(2) for last in ("", ".last")}  # the tiny decoder's 2 layers
    assert {stage for stage in labels if stage.startswith("text.")} == text  # the text side is replayed too
    assert len(labels) == 3 + 8 + 4 + len(added) + len(text)
    assert set(labels.values()) <= {"clean", "inherited", "amplified", "introduced"}
    notebook = json.loads((out / "02_layer_drilldown.ipynb").read_text())
    outputs = [o for cell in notebook["cells"] if cell["cell_type"] == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"]
    # the curve, the row lineage, the channel map, the magnitude scatter and the spatial map
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 5
    html = (out / "02_layer_drilldown.html").read_text()
    first = report["first_divergence"]["mlx:bf16"]["stage"]
    assert f"<code>{first}</code>" in html and "mlx:bf16 vs transformers:f32" in html
    assert "worst token" in html  # the top-channel table
    conclusion = report["conclusions"]["mlx:bf16"]["text"]
    assert conclusion.split(";")[0] in html  # the conclusion in words
    lineage = report["lineage"]["mlx:bf16"]
    assert f"token row {lineage['raster_row']}" in html  # the row followed back through the tower
    # the run compared only block outputs: narrowing captured the first divergent block's substages for the pair,
    # every one a row of the notebook's substage table (nothing captured again by the notebook)
    block = int(first.split(".")[2])
    assert report["narrowing"]["mlx:bf16"]["steps"][0]["target"] == f"vision.block.{block}"
    substages = set(re.findall(rf">(vision\.block\.{block}\.[a-z_.0-9]+)<", html))
    assert len(substages) > 8, substages
    assert not (out / "recapture").exists()


def test_negative_controls_notebook_shows_the_power_table(rendered):
    _, out = rendered
    power = json.loads((out / "report.json").read_text())["power"]
    assert power["gate"] == "pass"
    assert {m["mutation"]: m["detected"] for m in power["mutations"]} == {
        "identity_window_permutation": True,
        "cross_image_leak": False,
        "manual_f16_rmsnorm": False,
        "drop_rotary_block_1": True,
    }
    notebook = json.loads((out / "04_negative_controls.ipynb").read_text())
    outputs = [o for cell in notebook["cells"] if cell["cell_type"] == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 1
    html = (out / "04_negative_controls.html").read_text()
    assert "identity_window_permutation" in html and "one image of one frame: there is nothing to leak across" in html
    by_name = {m["mutation"]: m for m in power["mutations"]}
    # a precision defect under an f32 policy is not "inside the contract": it cannot exist there
    assert by_name["manual_f16_rmsnorm"]["blind_reason"].startswith("needs a half-precision policy")
    assert "needs a half-precision policy" in html and "stays inside the contract" not in html
    # a detected mutation has a margin (an exact stage: how many entries differ), never NaN
    exact = by_name["identity_window_permutation"]["exact_failures"]
    assert exact and 0 < exact[0] <= exact[1]
    words = re.sub(r"<style.*?</style>|<script.*?</script>|<[^>]+>", " ", html, flags=re.S)  # not the images' base64
    assert f"exact stage: {exact[0]} of {exact[1]} entries differ" in words and "NaN" not in words
    assert "Fixture power" in (out / "01_stage_parity.html").read_text()
