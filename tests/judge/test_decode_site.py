"""A defect in the decode phase only (``judge.decode_site``): the verdict, the conclusions and ``driftscope show``
name the step first, then the KV cache's layer and position or the position stage, never "no operator
introduces the error; it accumulates from text.generate.margins"."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ROOT, SHAPES, TINY
from driftscope.cli import main
from driftscope.run.investigation import investigate
from driftscope.run.params import parse_parameters

PLANTED = str(ROOT / "tests" / "planted_patches.py")


@pytest.fixture(scope="module")
def decoded(tmp_path_factory):
    """transformers f32 against MLX with a KV-cache entry written one slot late in layer 1 from the answer's token
    3 on (decode step 4), and MLX placing its tokens one position late from decode step 2 with the right stored
    delta; six tokens, replay on."""
    out = tmp_path_factory.mktemp("decode-site")
    runtimes = [
        "transformers:f32",
        {"runtime": "mlx", "label": "slot-off", "patch": {"callable": f"{PLANTED}:cache_one_slot_off"}},
        {
            "runtime": "mlx",
            "label": "misplaced",
            "patch": {"callable": f"{PLANTED}:misapply_decode_rope_delta", "kwargs": {"from_step": 2}},
        },
    ]
    data = {
        "name": "decode-site",
        "checkpoint": str(TINY),
        "images": [str(SHAPES)],
        "runtimes": runtimes,
        "stages": {"blocks": False},
        "text": {"max_new_tokens": 6},
    }
    return investigate(parse_parameters(data, "test"), out), out


def test_a_cache_slot_written_late_is_named_by_its_step_layer_and_position(decoded):
    report, _ = decoded
    prompt = int(np.asarray(report.tapset("transformers:f32")["text.input_ids"]).size)
    conclusion = report.data["conclusions"]["slot-off"]
    assert conclusion["kind"] == "decode" and conclusion["site"] == "cache"
    assert (conclusion["step"], conclusion["layer"], conclusion["position"]) == (4, 1, prompt + 3)
    said = f"the prefill agrees; decoding first differs at step 4: layer 1's KV cache (keys) at position {prompt + 3}"
    assert conclusion["text"].startswith(said), conclusion["text"]
    assert "accumulates" not in conclusion["text"]
    record = report.data["first_divergence"]["slot-off"]["decode"]
    assert (record["step"], record["layer"]) == (4, 1)
    assert any(reason.startswith(f"slot-off: {said}") for reason in report.data["verdict"]["reasons"])


def test_a_position_applied_late_is_named_by_its_step_and_the_position_stage(decoded):
    report, _ = decoded
    conclusion = report.data["conclusions"]["misplaced"]
    assert conclusion["kind"] == "decode" and conclusion["site"] == "positions"
    assert conclusion["step"] == 2 and conclusion["stage"] == "text.rope_delta"
    assert conclusion["text"].startswith("the prefill agrees; decoding first differs at step 2: the decoder places")


def test_show_says_the_same(decoded, capsys):
    _, out = decoded
    assert main(["show", str(out)]) == 1
    shown = capsys.readouterr().out.replace("\\", "")  # Markdown escapes
    assert "decoding first differs at step 4: layer 1's KV cache" in shown
    assert "decoding first differs at step 2: the decoder places" in shown
    assert "accumulates from text.generate" not in shown
