"""The inputs an engine outside Python runs on, and the digest that proves it ran on them.

``driftscope stages CHECKPOINT --images ... --write-inputs inputs.safetensors`` writes the processor
output every runtime receives (``pixel_values`` F32, ``grid_thw`` I64, ``input_ids`` I64 when a prompt
is given) with its digest in the header's ``__metadata__``; the engine copies the digest into its sidecar.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

DIGEST_HEX = 16


def inputs_digest(pixel_values: np.ndarray, grid_thw: np.ndarray, input_ids: np.ndarray | None = None) -> str:
    """The first 16 hex digits of sha256 over the raw little-endian, C-order bytes of ``pixel_values`` as
    float32, then ``grid_thw`` as int64, then ``input_ids`` as int64 (only when the run follows a prompt)."""
    sha = hashlib.sha256()
    sha.update(np.ascontiguousarray(pixel_values, dtype="<f4").tobytes())
    sha.update(np.ascontiguousarray(grid_thw, dtype="<i8").tobytes())
    if input_ids is not None:
        sha.update(np.ascontiguousarray(input_ids, dtype="<i8").tobytes())
    return sha.hexdigest()[:DIGEST_HEX]


def write_inputs(path: str | Path, inputs) -> Path:
    """The processor output of ``inputs`` (a ``VisionInputs``) as one safetensors file, digest in its metadata."""
    from safetensors.numpy import save_file

    arrays = {
        "pixel_values": np.ascontiguousarray(inputs.pixel_values, dtype=np.float32),
        "grid_thw": np.ascontiguousarray(inputs.grid_thw, dtype=np.int64),
    }
    if inputs.text is not None:
        arrays["input_ids"] = np.ascontiguousarray(inputs.text.input_ids, dtype=np.int64)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    save_file(arrays, str(partial), metadata={"inputs_digest": inputs.digest, "format": "driftscope-inputs"})
    os.replace(partial, path)  # a reader sees the whole file or none
    return path
