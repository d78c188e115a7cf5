"""A TapSet writer in plain Python and numpy: the template to port into an engine's own language.

It imports nothing from driftscope; everything it does is specified in docs/tapfile.md and
docs/tapfile.schema.json. A TapSet is ``NAME.safetensors`` (one tensor per stage) and ``NAME.json``
(the sidecar). Typical use, after ``driftscope stages CHECKPOINT --images IMG --write-inputs inputs.safetensors``:

    inputs, metadata = read_safetensors("inputs.safetensors")   # what the engine must run on
    order = metadata["digest_order"].split(",")                  # e.g. pixel_values,grid_thw[,input_ids]
    digest = inputs_digest(*(inputs[name] for name in order))
    writer = TapSetWriter("taps/my-engine", runtime="my-engine", policy="bf16", inputs_digest=digest)
    writer.add("vision.patch_embed", patch_embed, token_order="raster", token_unit="patch")
    writer.add("vision.block.0", block0, token_order="window", token_unit="patch", store="BF16")
    writer.add("vision.window_index", window_index, integer=True)
    writer.close()                       # or writer.close(complete=False, error="what went wrong")

Run as a script it reads such an inputs file and writes a TapSet holding the inputs stages (a start to
add the engine's own stages to): ``python examples/tapfile_writer.py inputs.safetensors taps/my-engine``.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys

import numpy as np

FORMAT, FORMAT_VERSION = "driftscope-tapset", 1
#: safetensors dtype -> little-endian numpy dtype of the stored bits (BF16: the upper 16 bits of a float32)
STORED = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4"}
READ = {**STORED, "BOOL": "|b1"}
ALIGN = 8  # the header is padded with spaces so the data starts on an 8-byte boundary


def inputs_digest(*arrays: np.ndarray) -> str:
    """First 16 hex digits of sha256 over the inputs in ``digest_order`` (the inputs file's metadata): each
    array's raw little-endian bytes as stored (e.g. pixel_values float32, grid_thw int64, input_ids int64)."""
    sha = hashlib.sha256()
    for array in arrays:
        array = np.asarray(array)
        sha.update(np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes())
    return sha.hexdigest()[:16]


def bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (nearest, ties to even), as the 16 stored bits."""
    bits = np.ascontiguousarray(values, dtype="<f4").view("<u4").astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype("<u2")


def encode(array: np.ndarray, store: str) -> bytes:
    """The bytes of ``array`` stored as the safetensors dtype ``store``."""
    if store not in STORED:
        raise ValueError(f"store must be one of {sorted(STORED)}, got {store!r}")
    if store == "BF16":
        return bfloat16_bits(array).tobytes()
    return np.ascontiguousarray(array, dtype=STORED[store]).tobytes()


class TapSetWriter:
    """Writes one TapSet: stage data streams to ``NAME.safetensors.data`` as it is added; ``close`` writes
    the safetensors header in front of it and the sidecar next to it."""

    def __init__(self, base: str, runtime: str, label: str | None = None, policy=None, inputs_digest=None, **meta):
        self.tensor_path, self.sidecar_path = base + ".safetensors", base + ".json"
        os.makedirs(os.path.dirname(os.path.abspath(base)), exist_ok=True)
        self.meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "runtime": runtime, "label": label or runtime}
        if policy is not None:
            self.meta["policy"] = policy
        if inputs_digest is not None:
            self.meta["inputs_digest"] = inputs_digest
        self.meta.update(meta)
        self.header: dict[str, dict] = {}
        self.stages: dict[str, dict] = {}
        self.data_path = self.tensor_path + ".data"
        self.data = open(self.data_path, "wb")  # noqa: SIM115 - closed by close()
        self.offset = 0

    def add(self, stage_id: str, array, store: str | None = None, **declaration) -> None:
        """Write one stage. ``store``: F32 (default for floats), F64, F16, BF16, or I64 (default for integers),
        I32. ``declaration``: axes, token_order, token_unit, integer, native_dtype, active_rows."""
        array = np.asarray(array)
        integer = array.dtype.kind in "iub"
        store = store or ("I64" if integer else "F32")
        raw = encode(array, store)
        self.data.write(raw)
        self.header[stage_id] = {
            "dtype": store,
            "shape": list(array.shape),
            "data_offsets": [self.offset, self.offset + len(raw)],
        }
        self.offset += len(raw)
        entry = {"shape": list(array.shape), "integer": integer, **declaration}
        entry.setdefault("native_dtype", str(array.dtype))
        self.stages[stage_id] = entry

    def close(self, complete: bool = True, error: str | None = None) -> None:
        """Finish ``NAME.safetensors`` and write ``NAME.json``."""
        self.data.close()
        header = dict(self.header, __metadata__={"format": FORMAT})
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-(len(raw) + 8) % ALIGN)
        with open(self.tensor_path, "wb") as out, open(self.data_path, "rb") as data:
            out.write(struct.pack("<Q", len(raw)))
            out.write(raw)
            while chunk := data.read(1 << 24):
                out.write(chunk)
        os.remove(self.data_path)
        sidecar = dict(self.meta, complete=complete, error=error, stage_order=list(self.stages), stages=self.stages)
        with open(self.sidecar_path, "w", encoding="utf-8") as handle:
            json.dump(sidecar, handle, indent=1)


def read_safetensors(path: str) -> tuple[dict[str, np.ndarray], dict]:
    """Every tensor of a safetensors file (BF16 widened to float32) and the header's ``__metadata__``."""
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
        data = handle.read()
    metadata = header.pop("__metadata__", {}) or {}
    arrays = {}
    for name, entry in header.items():
        start, stop = entry["data_offsets"]
        values = np.frombuffer(data[start:stop], dtype=READ[entry["dtype"]]).reshape(entry["shape"])
        if entry["dtype"] == "BF16":
            values = (values.astype("<u4") << 16).view("<f4")
        arrays[name] = values
    return arrays, metadata


def main(argv: list[str]) -> int:
    """Write a TapSet with the inputs stages of an inputs file (``driftscope stages ... --write-inputs``)."""
    if len(argv) != 2:
        print("usage: python examples/tapfile_writer.py INPUTS.safetensors OUT_BASE", file=sys.stderr)
        return 2
    inputs, metadata = read_safetensors(argv[0])
    digest = inputs_digest(*(inputs[name] for name in metadata["digest_order"].split(",")))
    if metadata.get("inputs_digest") not in (None, digest):
        print(f"digest {digest} differs from the file's {metadata['inputs_digest']}", file=sys.stderr)
        return 1
    writer = TapSetWriter(argv[1], runtime="example-engine", policy="f32", inputs_digest=digest)
    writer.add("inputs.pixel_values", inputs["pixel_values"], token_order="raster", token_unit="patch")
    writer.add("inputs.grid_thw", inputs["grid_thw"])
    writer.close()
    print(f"wrote {writer.tensor_path} and {writer.sidecar_path} (inputs_digest {digest})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
