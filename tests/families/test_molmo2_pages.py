"""The Molmo2 GELU-defect run as a reviewer opens it (issue 31 items 5 and 8): a failing run renders its
drill-down by default, and the first screen names the introduced operator and the ready patch that closes it,
in Molmo2's own words (no other family's windows or M-RoPE, no contract rule naming another family's stage)."""

from __future__ import annotations

import re

from conftest import ROOT


def _words(html: str) -> str:
    words = re.sub(r"<style.*?</style>|<script.*?</script>|<[^>]+>", " ", html, flags=re.S)
    return re.sub(r"\s+", " ", words)


def test_the_gelu_defect_run_names_its_patch_on_the_first_screen(tmp_path):
    from driftscope.cli import main

    out = tmp_path / "run"
    params = ROOT / "parameters" / "molmo2_gelu_defect.yaml"
    assert "02_layer_drilldown" not in params.read_text()  # it lists notebook 01 only
    assert main(["run", str(params), "--out", str(out)]) == 1  # the defect fails the gate
    first = _words((out / "01_stage_parity.nocode.html").read_text())
    screen = first[: first.index("Stage table")]
    # the headline table's suspected cause and ready patch (issue 34 item 1)
    # every block replay labels introduced is narrowed within the site budget (issue 50 item 6): the first ones to
    # their GELU, the rest named as blocks
    assert "introduced by 2 operators: vision.block.*.mlp.act (blocks 0-4;" in screen
    assert "vision.block.* (blocks 5-24)" in screen
    assert "driftscope.hypotheses:tanh_gelu (try on block 0 in notebook 02)" in screen
    assert "driftscope.hypotheses:mlx_vlm_fixes" not in screen  # the candidate runs it already (skip: tanh_gelu)
    drill = _words((out / "02_layer_drilldown.nocode.html").read_text())
    assert "Ready patch" in drill and "driftscope.hypotheses:tanh_gelu" in drill
    for page in (first, drill):
        assert "matches no stage" not in page and "Traceback" not in page
        assert not re.search(r"\bwindows?\b|M-RoPE|DeepStack", page, re.IGNORECASE), re.findall(
            r".{60}(?:window|M-RoPE|DeepStack).{60}", page, re.IGNORECASE
        )
