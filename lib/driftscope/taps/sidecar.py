"""The TapSet sidecar's contract: the published JSON Schema, its format version, and the tensors it describes.

``docs/tapfile.schema.json`` is a copy of ``schemas/tapfile.schema.json`` (a test keeps them equal);
``docs/tapfile.md`` says what driftscope does with every field. A TapSet is checked when it is opened,
so a lying or unreadable one is refused before anything is compared.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np

from driftscope.errors import TapFileError
from driftscope.model.weightfile import TensorEntry

SCHEMA_FILE = Path(__file__).with_name("schemas") / "tapfile.schema.json"
FORMAT = "driftscope-tapset"
FORMAT_VERSION = 1

#: safetensors dtype -> numpy dtype of the stored bits; F16 and BF16 are widened to float32 when read.
STORED = {
    "F64": np.dtype("float64"),
    "F32": np.dtype("float32"),
    "F16": np.dtype("float16"),
    "BF16": np.dtype("uint16"),
    "I64": np.dtype("int64"),
    "I32": np.dtype("int32"),
    "BOOL": np.dtype("bool"),
}
HALF = ("F16", "BF16")
FIX_DTYPE = "store floating stages as F32, F64, F16 or BF16 and integer stages as I64 or I32 (docs/tapfile.md, Tensors)"


@functools.cache
def schema() -> dict:
    """The sidecar's JSON Schema (draft 2020-12)."""
    return json.loads(SCHEMA_FILE.read_text())


@functools.cache
def _validator():
    from driftscope.core.validation import draft_2020_12

    return draft_2020_12()(schema())


def validate_sidecar(meta: Any, path: Path) -> None:
    """Refuse a sidecar of another format version, or one that does not follow the schema (naming the field)."""
    validator = _validator()  # first: jsonschema imported without its optional IRI grammar
    from jsonschema.exceptions import best_match

    if isinstance(meta, dict) and "format_version" in meta and meta["format_version"] != FORMAT_VERSION:
        raise TapFileError(
            f"sidecar {path} has format_version {meta['format_version']!r}; this driftscope reads format_version "
            f"{FORMAT_VERSION}",
            f"write the sidecar as docs/tapfile.md describes (format_version {FORMAT_VERSION}), or use the driftscope "
            "that wrote it",
        )
    error = best_match(validator.iter_errors(meta))
    if error is not None:
        raise TapFileError(
            f"sidecar {path} does not follow docs/tapfile.schema.json: at {error.json_path}: {error.message}",
            "fix that field; docs/tapfile.md documents every one",
        )


def check_tensors(meta: dict, header: dict[str, TensorEntry], tensor_path: Path) -> None:
    """Every stored dtype is one driftscope reads; every declared stage exists with the declared shape and rows."""
    for name, entry in header.items():
        if entry.dtype not in STORED:
            raise TapFileError(
                f"stage {name!r} in {tensor_path.name} is stored as {entry.dtype}, which driftscope does not read",
                FIX_DTYPE,
            )
    declared = meta["stages"]
    missing = sorted(set(declared) - set(header))
    if missing:
        raise TapFileError(
            f"sidecar declares stages missing from {tensor_path.name}: {missing[:5]}",
            "write every declared stage into the tensor file, or drop it from the sidecar",
        )
    for stage_id, declaration in declared.items():
        shape = header[stage_id].shape
        if "shape" in declaration and tuple(declaration["shape"]) != shape:
            raise TapFileError(
                f"sidecar declares stage {stage_id!r} with shape {declaration['shape']}, but {tensor_path.name} "
                f"stores it as {list(shape)}",
                "write the tensor's own shape into the sidecar (or leave 'shape' out)",
            )
        rows = shape[0] if shape else 0
        for start, stop in declaration.get("active_rows") or ():
            if not 0 <= start <= stop <= rows:
                raise TapFileError(
                    f"stage {stage_id!r} declares active_rows [{start}, {stop}] outside its {rows} rows",
                    "declare [start, stop) ranges of the stored rows, start <= stop <= rows",
                )
