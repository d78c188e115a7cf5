"""The inputs an engine outside Python runs on, and the digest that proves it ran on them.

``driftscope stages CHECKPOINT --images ... --write-inputs inputs.safetensors`` writes the processor
output every runtime receives (the family's arrays, and ``input_ids`` I64 when a prompt is given) with its
digest in the header's ``__metadata__``; the engine copies the digest into its sidecar.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

DIGEST_HEX = 16


def inputs_digest(arrays: dict[str, np.ndarray], input_ids: np.ndarray | None = None) -> str:
    """The first 16 hex digits of sha256 over the raw little-endian, C-order bytes of each processor array in
    the family's order (``driftscope stages`` lists them and their dtypes), then ``input_ids`` as int64 (only
    when the run follows a prompt)."""
    sha = hashlib.sha256()
    for array in arrays.values():
        array = np.asarray(array)
        sha.update(np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes())
    if input_ids is not None:
        sha.update(np.ascontiguousarray(input_ids, dtype="<i8").tobytes())
    return sha.hexdigest()[:DIGEST_HEX]


def write_inputs(path: str | Path, inputs) -> Path:
    """The processor output of ``inputs`` (a ``ModelInputs``) as one safetensors file, digest in its metadata,
    written atomically with the umask's permissions (safetensors' own ``save_file`` makes it 0600: an engine run
    by another user could not read it)."""
    from safetensors.numpy import save

    from driftscope.core.atomic import write_bytes_atomic

    arrays = {name: np.ascontiguousarray(array) for name, array in inputs.arrays.items()}
    if inputs.text is not None:
        arrays["input_ids"] = np.ascontiguousarray(inputs.text.input_ids, dtype=np.int64)
    metadata = {"inputs_digest": inputs.digest, "digest_order": ",".join(arrays), "format": "driftscope-inputs"}
    data = save(arrays, metadata=metadata)  # safetensors sorts its keys: the order is in metadata
    return write_bytes_atomic(Path(path), data)  # a reader sees the whole file or none
