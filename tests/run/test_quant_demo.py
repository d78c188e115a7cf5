"""``parameters/demo_q4.yaml`` end to end through ``driftscope run`` (slow: MLX's fused half kernel is slow on the CPU).

The wide Qwen2.5-VL q4 fixture with float16 activations: MLX's fused quantized matmul diverges from the oracle at the
first quantized linear (the fused q/k/v projection of block 0) and the stage replay says it is introduced there; the
same codes dequantized, float16 activations, stay inside the contract; the linear controls name the fused kernel at
that linear; the attribution names the fused kernel; notebook 02 renders the quantized section with its plot.
"""

from __future__ import annotations

import json

import pytest
from conftest import ROOT
from driftscope.cli import main

pytestmark = pytest.mark.slow

FIRST_LINEAR = "vision_tower.blocks.0.attn.qkv"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from make_tiny_qwen25vl_wide import DEFAULT_DIR, build

    if not (DEFAULT_DIR / "config.json").exists():
        build(DEFAULT_DIR)
    out = tmp_path_factory.mktemp("demo-q4") / "run"
    code = main(["run", str(ROOT / "parameters" / "demo_q4.yaml"), "--out", str(out)])
    return code, out, json.loads((out / "report.json").read_text())


def test_the_fused_half_path_diverges_at_the_first_quantized_linear_and_the_dequantized_one_passes(demo):
    code, _, report = demo
    assert code == 1  # the gate fails on the fused half path
    assert report["verdict"]["per_candidate"] == {
        "mlx:q4": "pass",
        "mlx:q4-f16": "fail",
        "mlx:q4-dequant-f16": "pass",
        "iree:q4-dequant": "pass",
    }
    first = report["first_divergence"]["mlx:q4-f16"]["stage"]
    assert first in {"vision.block.0.attn.q", "vision.block.0.attn.k", "vision.block.0.attn.v"}  # qkv's outputs
    labels = {row["stage"]: row["label"] for row in report["replay"]["mlx:q4-f16"]["labels"]}
    assert labels[first] == "introduced" and labels["vision.block.0.norm1"] == "clean"
    assert set(r["label"] for r in report["replay"]["mlx:q4-dequant-f16"]["labels"]) == {"clean"}


def test_the_linear_controls_and_the_attribution_name_the_fused_kernel(demo):
    _, _, report = demo
    controls = report["linear_replay"]["mlx:q4-f16"]
    first = controls["rows"][0]
    assert (first["module"], first["label"], first["stage_label"]) == (FIRST_LINEAR, "fused kernel", "introduced")
    assert first["fused_vs_dequantized"] > 4 * first["dequantized_vs_reference"]
    assert controls["verdict"].startswith(
        f"mlx:q4-f16: the first quantized linear whose error is introduced is {FIRST_LINEAR}"
    )
    assert "by the fused kernel" in controls["verdict"]
    attribution = report["attribution"]
    assert attribution["winner"] == "mlx:q4-dequant-f16", attribution["verdict"]
    assert attribution["verdict"].startswith(
        "iree:q4-dequant is closer to mlx:q4-dequant-f16 than to mlx:q4-f16 at 2/2"
    )
    assert attribution["verdict"].endswith("the fused kernel's accumulation, not the compiled graph")
    quantized = {r["label"]: r["quantization"] for r in report["runtimes"]}
    assert quantized["iree:q4-dequant"]["dense_checkpoint"] == quantized["transformers:q4-dequant"]["dense_checkpoint"]


def test_notebook_02_shows_the_quantized_section(demo):
    _, out, _ = demo
    notebook = json.loads((out / "02_layer_drilldown.ipynb").read_text())
    outputs = [o for cell in notebook["cells"] if cell["cell_type"] == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"]
    html = (out / "02_layer_drilldown.html").read_text()
    assert "Closer-to attribution" in html and "Same-input linear replay" in html
    assert FIRST_LINEAR.replace("_", "\\_") in html or FIRST_LINEAR in html
    section = [cell for cell in notebook["cells"] if "quantized_items" in "".join(cell["source"])][0]
    assert any("image/png" in o.get("data", {}) for o in section["outputs"])  # the attribution plot


def test_the_first_screens_give_one_answer_for_the_fused_qkv(demo):
    """Issue 53 item 1: notebook 01's first screen and notebook 02's top name the module the replay and the linear
    controls both speak of once, with the q, k and v it computes, and the closer-to attribution beside it; the
    quantized section of 02 says the same (no "attn.v" for a module 01 calls "attn.q")."""
    import html
    import re

    _, out, report = demo

    def words(name: str) -> str:
        page = (out / f"{name}.nocode.html").read_text()
        said = re.sub(r"\s+", " ", re.sub(r"<style.*?</style>|<script.*?</script>|<[^>]+>", " ", page, flags=re.S))
        return html.unescape(re.sub(r"\s+([:;,.)])", r"\1", re.sub(r"\(\s+", "(", said)))

    stages = ", ".join(f"vision.block.0.attn.{c}" for c in "qkv")
    one = f"introduces the error at the quantized linear {FIRST_LINEAR} ({stages})"
    first = words("01_stage_parity")
    screen = first[: first.index("Stage table")]
    assert "the fused kernel on float16 activations " + one in screen
    assert "Closer-to attribution: " + report["attribution"]["verdict"] in screen
    drill = words("02_layer_drilldown")
    top = drill[: drill.index("Introduced, inherited or amplified")]
    assert one in top and "Closer-to attribution" in top
    assert f"Same-input linear replay, mlx:q4-f16: the fused kernel on float16 activations {one}" in drill
    assert f"{FIRST_LINEAR} (vision.block.0.attn.v)" not in drill.split("Progress log")[0]  # the log is the run's
