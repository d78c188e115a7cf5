"""``driftscope stages``: every stage as an engine author needs it, checked against what the oracle captures."""

from __future__ import annotations

import json

import numpy as np
from conftest import ROOT, SHAPES, TINY
from driftscope.cli import main
from safetensors import safe_open

DOC = ROOT / "docs" / "tapfile.md"


def _stages(capsys, *args) -> str:
    assert main(["stages", str(TINY), *args]) == 0
    return capsys.readouterr().out


def test_every_stage_shape_dtype_and_order_match_the_oracles_capture(capsys, captures, full_plan, shapes_inputs):
    listing = json.loads(_stages(capsys, "--images", str(SHAPES), "--json"))
    oracle = captures["transformers:f32"]
    rows = listing["stages"]
    assert [row["stage"] for row in rows] == full_plan.ids()  # execution order, every stage
    assert listing["inputs"]["grid_thw"] == [[1, 32, 32]] and listing["inputs"]["inputs_digest"] == shapes_inputs.digest
    assert listing["inputs"]["arrays"] == {
        "pixel_values": {"shape": [1024, 1176], "dtype": "float32"},
        "grid_thw": {"shape": [1, 3], "dtype": "int64"},
    }
    for row in rows:
        stage = row["stage"]
        assert tuple(row["shape"]) == oracle.shape(stage), stage
        assert row["integer"] == oracle.declaration(stage)["integer"] == (row["dtype"] == "I64"), stage
        assert row["token_order"] == oracle.declaration(stage)["token_order"], stage
        assert row["token_unit"] == oracle.declaration(stage)["token_unit"], stage
        if row["token_order"] != "none":
            assert row["active_rows"] == [[0, oracle.shape(stage)[0]]], stage
        assert row["axes"] and row["description"], stage


def test_without_images_the_token_axes_stay_symbolic(capsys):
    text = _stages(capsys)
    assert "| `vision.block.0` | tokens, hidden | [patches, 64] |" in text
    assert "| `vision.merger` | merged_tokens, out_hidden | [merged_tokens, 64] |" in text


def test_the_table_in_docs_tapfile_md_is_the_commands_output(capsys):
    text = DOC.read_text()
    begin, end = "<!-- stages:begin -->\n", "<!-- stages:end -->"
    documented = text[text.index(begin) + len(begin) : text.index(end)]
    printed = _stages(capsys, "--images", "fixtures/images/shapes_448.png")
    assert "driftscope stages fixtures/checkpoints/tiny-qwen2_5-vl --images fixtures/images/shapes_448.png" in text
    assert documented == printed, "regenerate the table in docs/tapfile.md with the command above it"


def test_write_inputs_gives_the_engine_the_runs_processor_output_and_digest(capsys, tmp_path, shapes_inputs):
    from driftscope.inputs.engine_inputs import inputs_digest

    _stages(capsys, "--images", str(SHAPES), "--write-inputs", str(tmp_path / "inputs.safetensors"))
    with safe_open(str(tmp_path / "inputs.safetensors"), framework="numpy") as handle:
        np.testing.assert_array_equal(handle.get_tensor("pixel_values"), shapes_inputs["pixel_values"])
        np.testing.assert_array_equal(handle.get_tensor("grid_thw"), shapes_inputs["grid_thw"])
        digest = handle.metadata()["inputs_digest"]
        assert digest == shapes_inputs.digest and handle.metadata()["digest_order"] == "pixel_values,grid_thw"
        stored = {name: handle.get_tensor(name) for name in handle.metadata()["digest_order"].split(",")}
        assert inputs_digest(stored) == digest


def test_write_inputs_without_images_says_what_to_add(capsys, tmp_path):
    assert main(["stages", str(TINY), "--write-inputs", str(tmp_path / "x.safetensors")]) == 2
    assert "--write-inputs needs --images or --videos" in capsys.readouterr().err


def test_write_inputs_of_a_video_packs_its_frames_as_one_grid_with_time(capsys, tmp_path, tiny_checkpoint):
    from driftscope.families.checkpoints import prepare_inputs

    gif = ROOT / "fixtures" / "videos" / "shapes_4f.gif"
    out = _stages(capsys, "--videos", str(gif), "--write-inputs", str(tmp_path / "video.safetensors"))
    assert "shapes for videos [[2, 16, 16]], 512 patches" in out
    expected = prepare_inputs(tiny_checkpoint, [], [gif])
    with safe_open(str(tmp_path / "video.safetensors"), framework="numpy") as handle:
        assert handle.get_tensor("grid_thw").tolist() == [[2, 16, 16]]
        np.testing.assert_array_equal(handle.get_tensor("pixel_values"), expected["pixel_values"])
        assert handle.metadata()["inputs_digest"] == expected.digest


def test_49_13_the_inputs_file_gets_the_umasks_permissions(capsys, tmp_path):
    """``--write-inputs`` wrote mode 0600 (safetensors' own writer): an engine run by another user could not read
    it. Like every output file, it gets the umask's permissions."""
    import os
    import stat

    for umask, mode in ((0o022, 0o644), (0o002, 0o664)):
        previous = os.umask(umask)
        try:
            path = tmp_path / f"inputs-{umask:o}.safetensors"
            _stages(capsys, "--images", str(SHAPES), "--write-inputs", str(path))
        finally:
            os.umask(previous)
        assert stat.S_IMODE(path.stat().st_mode) == mode
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith((".partial", ".tmp"))]
