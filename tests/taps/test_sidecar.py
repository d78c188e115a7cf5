"""The sidecar is a versioned, published schema, and every stored dtype is read or refused when a TapSet opens."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from conftest import ROOT
from driftscope.errors import TapFileError
from driftscope.taps.tapset import TapSet
from safetensors.numpy import save_file

DOC = (ROOT / "docs" / "tapfile.md").read_text()
SCHEMA = json.loads((ROOT / "docs" / "tapfile.schema.json").read_text())


def engine(tmp_path, tensors: dict, stages: dict | None = None, name: str = "engine", **meta) -> TapSet:
    """An engine's TapSet written with plain safetensors and JSON, as docs/tapfile.md tells it to."""
    from safetensors.torch import save_file as save_torch

    if any(isinstance(value, torch.Tensor) for value in tensors.values()):
        save_torch(tensors, str(tmp_path / f"{name}.safetensors"))
    else:
        save_file(tensors, str(tmp_path / f"{name}.safetensors"))
    sidecar = {"format": "driftscope-tapset", "format_version": 1, "runtime": name, **meta}
    sidecar["stages"] = stages if stages is not None else {key: {} for key in tensors}
    (tmp_path / f"{name}.json").write_text(json.dumps(sidecar))
    return TapSet(tmp_path / name)


def test_the_published_schema_is_the_one_driftscope_validates_with():
    from driftscope.taps.sidecar import schema

    assert schema() == SCHEMA
    from jsonschema import Draft202012Validator

    Draft202012Validator.check_schema(SCHEMA)


def test_every_sidecar_driftscope_writes_follows_the_schema(captures):
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(SCHEMA)
    for tapset in captures.values():
        assert not list(validator.iter_errors(json.loads(tapset.sidecar_path.read_text())))


def test_the_docs_example_sidecar_follows_the_schema():
    from driftscope.taps.sidecar import validate_sidecar

    section = DOC[DOC.index("## 4. Sidecar") :]
    example = json.loads(section[section.index("```json\n") + 8 : section.index("```\n", section.index("```json"))])
    validate_sidecar(example, ROOT / "docs" / "tapfile.md")
    assert set(example["stages"]["vision.block.0"]) == set(SCHEMA["$defs"]["stage"]["properties"])


def test_every_schema_field_is_documented_with_what_the_tool_does():
    table = DOC[DOC.index("| field |") :]
    documented = set(re.findall(r"`([a-z_.*]+)`", table[: table.index("\n\n")]))
    fields = set(SCHEMA["properties"]) | {f"stages.*.{name}" for name in SCHEMA["$defs"]["stage"]["properties"]}
    assert fields <= documented, sorted(fields - documented)


def test_an_unknown_format_version_is_refused(tmp_path):
    with pytest.raises(TapFileError, match="format_version 2; this driftscope reads format_version 1"):
        engine(tmp_path, {"vision.merger": np.ones((4, 2), dtype=np.float32)}, format_version=2)


@pytest.mark.parametrize(
    ("stage", "meta", "message"),
    [
        ({"token_order": "rows"}, {}, r"at \$\.stages\['vision\.merger'\]\.token_order: 'rows' is not one of"),
        ({"active_rows": [[0]]}, {}, r"active_rows\[0\]"),
        ({}, {"inputs_digest": "sha256:abc"}, r"at \$\.inputs_digest: 'sha256:abc' does not match"),
        ({}, {"runtime": ""}, r"at \$\.runtime"),
    ],
)
def test_a_sidecar_that_breaks_the_schema_names_the_field(tmp_path, stage, meta, message):
    with pytest.raises(TapFileError, match=message) as err:
        engine(tmp_path, {"vision.merger": np.ones((4, 2), dtype=np.float32)}, {"vision.merger": stage}, **meta)
    assert "docs/tapfile.md documents every one" in str(err.value)


def test_a_sidecar_whose_shape_differs_from_the_tensor_is_refused(tmp_path):
    with pytest.raises(TapFileError, match=r"shape \[4, 3\], but engine.safetensors stores it as \[4, 2\]"):
        engine(tmp_path, {"vision.merger": np.ones((4, 2), dtype=np.float32)}, {"vision.merger": {"shape": [4, 3]}})
    with pytest.raises(TapFileError, match=r"active_rows \[2, 9\] outside its 4 rows"):
        engine(tmp_path, {"vision.merger": np.ones((4, 2), np.float32)}, {"vision.merger": {"active_rows": [[2, 9]]}})


def test_bf16_and_f16_stages_are_read_widened_to_float32(tmp_path):
    rng = np.random.default_rng(3)
    values = torch.from_numpy(rng.standard_normal((9, 5)).astype(np.float32))
    taps = engine(
        tmp_path, {"b": values.to(torch.bfloat16), "h": values.to(torch.float16), "s": values.to(torch.bfloat16)[0, 0]}
    )
    for name, dtype, stored in (("b", torch.bfloat16, "BF16"), ("h", torch.float16, "F16")):
        exact = values.to(dtype).to(torch.float32).numpy()  # widening is exact: the reference is torch's own
        assert taps[name].dtype == np.float32
        np.testing.assert_array_equal(taps[name], exact)
        np.testing.assert_array_equal(taps.rows(name, 2, 6), exact[2:6])
        got = taps.rows_into(name, 3, 9, np.empty(6 * 6 * 5, dtype=np.uint8))
        np.testing.assert_array_equal(got, exact[3:9])
        assert taps.stored_dtype(name) == stored
    assert taps["s"].shape == () and taps["s"] == values.to(torch.bfloat16)[0, 0].float().item()
    with pytest.raises(ValueError, match="cannot hold"):
        taps.rows_into("b", 0, 9, np.empty(9 * 5 * 4, dtype=np.uint8))  # float32 room, but no room for the bits


def test_a_bf16_candidate_is_compared_against_a_float32_reference(tmp_path):
    from driftscope.judge.compare import compare_stage
    from driftscope.judge.contract import Tolerance

    rng = np.random.default_rng(4)
    values = rng.standard_normal((300, 7)).astype(np.float32)
    reference = engine(tmp_path, {"vision.merger": values}, name="reference")
    candidate = engine(tmp_path, {"vision.merger": torch.from_numpy(values).to(torch.bfloat16)}, name="candidate")
    row = compare_stage("vision.merger", reference, candidate, Tolerance(0.08, 0.08), 0)
    rounded = torch.from_numpy(values).to(torch.bfloat16).float().numpy()
    assert row.status == "pass" and row.elements == values.size
    assert row.max_abs == pytest.approx(float(np.abs(rounded - values).max()))


@pytest.mark.parametrize("dtype", ["uint8", "int16", "int8"])
def test_other_stored_dtypes_are_refused_when_the_tapset_opens(tmp_path, dtype):
    with pytest.raises(TapFileError, match=r"stored as (U8|I16|I8), which driftscope does not read") as err:
        engine(tmp_path, {"vision.window_index": np.arange(4).astype(dtype)})
    assert "F32, F64, F16 or BF16" in str(err.value) and "I64 or I32" in str(err.value)


def test_the_doc_lists_the_stored_dtypes_driftscope_accepts():
    from driftscope.taps.sidecar import STORED

    tensors = DOC[DOC.index("## 3. Tensors") : DOC.index("### Token order")]
    for dtype in STORED:
        assert f"`{dtype}`" in tensors, dtype
