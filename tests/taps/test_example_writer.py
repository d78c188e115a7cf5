"""``examples/tapfile_writer.py``: the stdlib + numpy writer an engine author ports, round-tripped through the
``tapfile`` runtime against the oracle (as captured, in raster order, and stored as bfloat16)."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, SHAPES, TINY

EXAMPLE = ROOT / "examples" / "tapfile_writer.py"


@pytest.fixture(scope="module")
def writer_module():
    spec = importlib.util.spec_from_file_location("tapfile_writer", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_imports_only_the_standard_library_and_numpy():
    imported = set()
    for node in ast.walk(ast.parse(EXAMPLE.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported - {"__future__", "numpy"} <= set(sys.stdlib_module_names), imported


def test_bfloat16_rounding_is_round_to_nearest_even(writer_module):
    import torch

    values = np.random.default_rng(5).standard_normal(10_000).astype(np.float32) * 100
    values[:4] = [1.0 + 2**-8, 1.0 + 3 * 2**-8, -(1.0 + 2**-8), 0.0]  # exact ties
    expected = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(writer_module.bfloat16_bits(values), expected)


def engine_tapset(writer_module, oracle, base, raster=False, store=None):
    """The oracle's arrays written by the example writer, as an engine would from its own buffers."""
    index = np.asarray(oracle["vision.window_index"])
    writer = writer_module.TapSetWriter(
        str(base),
        runtime="numpy-engine",
        policy="bf16" if store == "BF16" else "f32",  # an engine that computed in bfloat16 says so (issue 30 item 4)
        inputs_digest=writer_module.inputs_digest(oracle["inputs.pixel_values"], oracle["inputs.grid_thw"]),
    )
    for stage_id in oracle.stage_ids():
        declaration = oracle.declaration(stage_id)
        value = np.asarray(oracle[stage_id])
        order = declaration["token_order"]
        if raster and order == "window":  # raster: window row i is raster merged token index[i]
            merged = declaration["token_unit"] == "merged"
            grouped = value if merged else value.reshape(len(index), -1, *value.shape[1:])
            restored = np.empty_like(grouped)
            restored[index] = grouped
            value, order = restored.reshape(value.shape), "raster"
        if raster and stage_id == "vision.window_index":
            continue  # a raster engine need not write a window index: the reference's is used
        writer.add(
            stage_id,
            value,
            store=None if declaration["integer"] or declaration.get("data") else store,  # inputs as received
            axes=declaration["axes"],
            token_order=order,
            token_unit=declaration["token_unit"],
            native_dtype="bfloat16" if store == "BF16" else "float32",
        )
    writer.close()
    return writer.tensor_path


def test_a_tapset_from_the_example_writer_passes_against_the_oracle(writer_module, captures, tmp_path):
    from driftscope.run.investigation import investigate
    from driftscope.run.params import parse_parameters

    oracle = captures["transformers:f32"]
    paths = {
        "as-captured": engine_tapset(writer_module, oracle, tmp_path / "as-captured"),
        "raster": engine_tapset(writer_module, oracle, tmp_path / "raster", raster=True),
        "bf16": engine_tapset(writer_module, oracle, tmp_path / "bf16", store="BF16"),
    }
    runtimes = ["transformers:f32"] + [
        {
            "runtime": "tapfile",
            "label": label,
            "policy": "bf16" if label == "bf16" else "f32",
            "options": {"path": path},
        }
        for label, path in paths.items()
    ]
    params = parse_parameters(
        {"name": "example", "checkpoint": str(TINY), "images": [str(SHAPES)], "runtimes": runtimes, "stages": "all"}
    )
    report = investigate(params, tmp_path / "run")
    assert report.verdict == "pass", report.data["verdict"]["reasons"]
    assert all(status == "pass" for status in report.data["verdict"]["per_candidate"].values())
    rows = {(row.candidate, row.stage): row for row in report.rows}
    assert len(rows) == 3 * len(report.data["stage_plan"])
    assert rows.pop(("raster", "vision.window_index")).status == "missing"  # a raster engine need not write it
    assert all(row.status == "pass" for row in rows.values())
    for label in ("as-captured", "raster"):
        assert max(row.max_abs for (c, _), row in rows.items() if c == label) == 0.0  # the oracle's own values
    block = rows[("bf16", "vision.block.7")]
    assert 0 < block.max_abs < 0.08 and block.relative_rms < 2**-8  # bfloat16 rounding, and nothing more
    checks = report.data["checks"]
    assert all(check["status"] == "pass" for label in paths for check in checks[label])
    bf16 = next(entry for entry in report.data["runtimes"] if entry["label"] == "bf16")
    floats = [s for s in oracle.stage_ids() if not oracle.declaration(s)["integer"] and not s.startswith("inputs.")]
    assert bf16["observed_dtypes"]["activations"] == {"bfloat16": len(floats)}  # as the engine declared


def test_the_script_reads_the_inputs_driftscope_writes_and_starts_a_tapset(capsys, tmp_path, shapes_inputs):
    from driftscope.cli import main
    from driftscope.taps.tapset import TapSet

    assert main(["stages", str(TINY), "--images", str(SHAPES), "--write-inputs", str(tmp_path / "in.safetensors")]) == 0
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), str(tmp_path / "in.safetensors"), str(tmp_path / "engine")],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},  # no PYTHONPATH: the example needs nothing of driftscope
        check=True,
    )
    assert shapes_inputs.digest in done.stdout
    taps = TapSet(tmp_path / "engine")
    assert taps.meta["inputs_digest"] == shapes_inputs.digest
    np.testing.assert_array_equal(taps["inputs.pixel_values"], shapes_inputs["pixel_values"])
    assert json.loads((tmp_path / "engine.json").read_text())["format_version"] == 1
