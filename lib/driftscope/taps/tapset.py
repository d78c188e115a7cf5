"""TapSet: stage id -> array, plus metadata, stored as safetensors with a JSON sidecar.

``TapWriter`` streams each stage to disk as it is captured (memory holds one stage at a time).
``TapSet`` opens the pair memory-mapped. The format is documented in ``docs/tapfile.md`` so
engines outside Python can write it.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open

from driftscope.core.atomic import write_json_atomic
from driftscope.core.names import partial_path
from driftscope.errors import OutputError, TapFileError, output_error
from driftscope.model.weightfile import read_header, unique_keys
from driftscope.taps.background import BackgroundWrites, owned
from driftscope.taps.sidecar import FORMAT, FORMAT_VERSION, HALF, STORED, check_tensors, validate_sidecar
from driftscope.taps.stages import Stage

__all__ = ["FORMAT", "FORMAT_VERSION", "TapSet", "TapWriter", "storage_array", "tap_paths"]

_DTYPES = {
    np.dtype("float64"): "F64",
    np.dtype("float32"): "F32",
    np.dtype("float16"): "F16",
    np.dtype("int64"): "I64",
    np.dtype("int32"): "I32",
    np.dtype("bool"): "BOOL",
}
_ALIGN = 8
#: how a TapWriter writes stage bytes: "background" (one writer thread, bounded; see ``taps.background``) or
#: "inline" (in the capture's thread, as each stage arrives); the file is byte-identical either way
WRITES = ("background", "inline")


def tap_paths(base: Path) -> tuple[Path, Path]:
    """``(tensor file, sidecar)`` for a TapSet named by ``base`` (``x`` -> ``x.safetensors``, ``x.json``)."""
    base = Path(base)
    if base.suffix in (".safetensors", ".json"):
        base = base.with_suffix("")
    # appended, not swapped in: a name with a dot of its own (a label "v1.2") keeps it
    return base.with_name(base.name + ".safetensors"), base.with_name(base.name + ".json")


def storage_array(value: Any) -> tuple[np.ndarray, str]:
    """A stage value as stored (floats widened to float32 unless float64, ints to int64) and its native dtype."""
    array = np.asarray(value)
    native = str(array.dtype)
    if array.dtype.kind == "f":
        array = array.astype(np.float64 if array.dtype == np.float64 else np.float32, copy=False)
    elif array.dtype.kind in "iu":
        array = array.astype(np.int64, copy=False)
    elif array.dtype.kind == "b":
        array = array.astype(np.bool_, copy=False)
    else:
        raise TapFileError(f"cannot store a {array.dtype} array", "convert it to a float or integer array")
    return np.ascontiguousarray(array), native


class TapWriter:
    """Streams stage arrays into ``<base>.safetensors``; writes the sidecar on ``close``.

    Data goes to disk as each stage arrives, after a reserved header region. If the final header
    outgrows the reservation, the file is rewritten once with a larger header (chunked copy). ``writes``
    (see :data:`WRITES`): "background" hands each stage's bytes to a writer thread (offsets are fixed when the
    stage arrives, so the file is the same as "inline" writes it); a failed write is raised by the next
    ``add``/``add_rows``/``drain``/``close``, after the partial file is removed.
    """

    def __init__(self, base: Path, meta: dict, reserve_header: int = 1 << 16, writes: str = "background"):
        if writes not in WRITES:
            raise TapFileError(f"unknown tap writes {writes!r}", f"use one of {', '.join(WRITES)}")
        self.tensor_path, self.sidecar_path = tap_paths(base)
        self.tensor_path.parent.mkdir(parents=True, exist_ok=True)
        self.meta = dict(meta)
        self.stages: dict[str, dict] = {}
        self._entries: dict[str, dict] = {}
        self._reserve = reserve_header
        self._partial = partial_path(self.tensor_path)
        self._handle = open(self._partial, "wb")
        self._handle.write(b"\0" * (8 + reserve_header))
        self._offset = 0
        self.closed = False
        self._background = BackgroundWrites(self._handle) if writes == "background" else None

    def _write(self, array: np.ndarray, source: np.ndarray) -> None:
        """Write (or hand the writer thread) ``array``, ``source`` in its stored dtype; a failed write removes
        the partial file and raises what the user reads (:func:`output_error` for the disk's refusal)."""
        with self._abandoned_on_failure():
            if self._background is None:
                self._handle.write(memoryview(array.reshape(-1)).cast("B"))  # no copy of the array's bytes
            else:
                self._background.submit(owned(array, source))

    def drain(self) -> None:
        """Wait until every stage handed over is on its way to disk (raises a failed write's error)."""
        if self._background is None or self.closed:
            return
        with self._abandoned_on_failure():
            self._background.drain()

    @contextlib.contextmanager
    def _abandoned_on_failure(self) -> Iterator[None]:
        """Remove the partial file when the block fails; the disk's refusal becomes :func:`output_error`."""
        try:
            yield
        except OSError as err:
            self.abandon()
            raise output_error(err, self.tensor_path) from err
        except BaseException:
            self.abandon()
            raise

    def __contains__(self, stage_id: str) -> bool:
        return stage_id in self._entries

    def add(self, stage: Stage | str, value: Any, **declaration: Any) -> None:
        """Write one stage now. ``declaration`` overrides the stage's declared fields."""
        stage_id = stage if isinstance(stage, str) else stage.id
        if stage_id in self._entries:
            raise TapFileError(f"stage {stage_id!r} captured twice", "capture each stage once per run")
        source = np.asarray(value)
        array, native = storage_array(source)
        self._write(array, source)
        self._entries[stage_id] = {
            "dtype": _DTYPES[array.dtype],
            "shape": list(array.shape),
            "data_offsets": [self._offset, self._offset + array.nbytes],
        }
        self._offset += array.nbytes
        info = stage.to_dict() if isinstance(stage, Stage) else {"id": stage_id}
        info.update(declaration)
        info["native_dtype"] = declaration.get("native_dtype", native)  # a runtime may say what it computed in
        info["shape"] = list(array.shape)
        self.stages[stage_id] = info

    def add_rows(self, stage: Stage | str, rows: Iterable[Any], **declaration: Any) -> int:
        """Write one stage row by row as ``rows`` yields them (e.g. one decode step's logits at a time), so the
        whole ``[rows, ...]`` array is never held; returns how many rows were written (none: no stage)."""
        stage_id = stage if isinstance(stage, str) else stage.id
        if stage_id in self._entries:
            raise TapFileError(f"stage {stage_id!r} captured twice", "capture each stage once per run")
        start, count, shape, dtype, native = self._offset, 0, None, None, None
        try:
            for row in rows:
                source = np.asarray(row)
                array, native = storage_array(source)
                if shape is None:
                    shape, dtype = array.shape, array.dtype
                elif array.shape != shape or array.dtype != dtype:
                    raise TapFileError(
                        f"stage {stage_id!r}: row {count} is {array.dtype}{list(array.shape)}, "
                        f"the first {dtype}{list(shape)}",
                        "yield rows of one shape and dtype",
                    )
                self._write(array, source)
                self._offset += array.nbytes
                count += 1
        finally:  # the rows written so far are a stage (a decode that raised midway leaves no hole in the file)
            if shape is not None and not self.closed:
                full = [count, *shape]
                self._entries[stage_id] = {
                    "dtype": _DTYPES[dtype],
                    "shape": full,
                    "data_offsets": [start, self._offset],
                }
                info = stage.to_dict() if isinstance(stage, Stage) else {"id": stage_id}
                info.update(declaration)
                info["native_dtype"] = declaration.get("native_dtype", native)
                info["shape"] = full
                self.stages[stage_id] = info
        return count

    def close(self, complete: bool = True, error: str | None = None) -> TapSet:
        """Finish the tensor file, write the sidecar atomically, return the TapSet."""
        if self.closed:
            return TapSet(self.tensor_path)
        if self._background is not None:
            self.drain()
            self._background.stop()
        try:
            self._handle.flush()
            header = self._header()
            if len(header) <= self._reserve:
                self._handle.seek(0)
                self._handle.write(struct.pack("<Q", self._reserve))
                self._handle.write(header + b" " * (self._reserve - len(header)))
                self._handle.close()
            else:
                self._handle.close()
                self._rewrite_with_header(header)
        except OSError as err:
            self.abandon()
            raise output_error(err, self.tensor_path) from err
        os.replace(self._partial, self.tensor_path)
        self.meta.update(
            format=FORMAT,
            format_version=FORMAT_VERSION,
            tensor_file=self.tensor_path.name,
            complete=complete,
            error=error,
            written=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            stage_order=list(self.stages),
            stages=self.stages,
        )
        validate_sidecar(self.meta, self.sidecar_path)  # what driftscope writes follows the published schema
        write_json_atomic(self.sidecar_path, self.meta)
        self.closed = True
        return TapSet(self.tensor_path)

    def _header(self) -> bytes:
        header = dict(self._entries)
        header["__metadata__"] = {"format": FORMAT}
        raw = json.dumps(header, separators=(",", ":")).encode()
        return raw + b" " * (-(len(raw) + 8) % _ALIGN)

    def _rewrite_with_header(self, header: bytes) -> None:
        moved = self._partial.with_name(self._partial.name + ".old")
        os.replace(self._partial, moved)
        with open(moved, "rb") as source, open(self._partial, "wb") as target:
            target.write(struct.pack("<Q", len(header)))
            target.write(header)
            source.seek(8 + self._reserve)
            while chunk := source.read(1 << 24):
                target.write(chunk)
        moved.unlink()

    def abandon(self) -> None:
        """Remove what was written (the ``.partial`` file): a write failed, so no file takes the final name."""
        if self._background is not None:
            self._background.discard()
        with contextlib.suppress(OSError):
            self._handle.close()
        for leftover in (self._partial, self._partial.with_name(self._partial.name + ".old")):
            leftover.unlink(missing_ok=True)
        self.closed = True

    def __enter__(self) -> TapWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is None:
            self.close()
        elif isinstance(exc, OSError | OutputError):
            self.abandon()  # the disk refused a write: nothing of this capture is kept under its name
        else:
            self.close(complete=False, error=f"{exc_type.__name__}: {exc}")


class TapSet:
    """A TapSet on disk: memory-mapped stage arrays and the sidecar's metadata."""

    def __init__(self, path: Path):
        self.tensor_path, self.sidecar_path = tap_paths(path)
        if not self.sidecar_path.exists():
            raise TapFileError(
                f"TapSet sidecar {self.sidecar_path} does not exist",
                "pass the path of a TapSet written by driftscope or by an engine following docs/tapfile.md",
            )
        if not self.tensor_path.exists():
            raise TapFileError(f"TapSet tensors {self.tensor_path} do not exist", "write the .safetensors file")
        try:
            self.meta = json.loads(self.sidecar_path.read_text(), object_pairs_hook=unique_keys)
        except json.JSONDecodeError as err:
            raise TapFileError(f"sidecar {self.sidecar_path} is not JSON: {err}", "rewrite the sidecar") from err
        except ValueError as err:
            raise TapFileError(f"sidecar {self.sidecar_path}: {err}", "write each stage once") from err
        try:
            self._file = safe_open(str(self.tensor_path), framework="numpy")
            self._layout = read_header(self.tensor_path)
        except Exception as err:  # safetensors raises its own error types
            raise TapFileError(
                f"{self.tensor_path} is not a readable safetensors file: {err}", "re-capture or rewrite it"
            ) from err
        validate_sidecar(self.meta, self.sidecar_path)
        check_tensors(self.meta, self._layout, self.tensor_path)
        self._keys = set(self._layout)
        self._raw = None  # the tensor file, opened on the first direct read

    @property
    def runtime(self) -> str:
        return str(self.meta.get("runtime", "unknown"))

    @property
    def label(self) -> str:
        return str(self.meta.get("label") or self.runtime)

    def stage_ids(self) -> list[str]:
        order = self.meta.get("stage_order") or sorted(self._keys)
        return [stage_id for stage_id in order if stage_id in self._keys]

    def declaration(self, stage_id: str) -> dict:
        return dict(self.meta.get("stages", {}).get(stage_id, {"id": stage_id}))

    def __contains__(self, stage_id: object) -> bool:
        return stage_id in self._keys

    def __getitem__(self, stage_id: str) -> np.ndarray:
        if stage_id not in self._keys:
            raise KeyError(stage_id)
        if self._layout[stage_id].dtype in HALF:
            return self.rows(stage_id, 0, self.shape(stage_id)[0]) if self.shape(stage_id) else self._scalar(stage_id)
        return self._file.get_tensor(stage_id)

    def mapped(self, stage_id: str) -> np.ndarray:
        """A stage as a read-only array memory-mapped from the tensor file: nothing is read until it is used.
        F16/BF16 stages have no float32 bytes on disk to map: they are widened into memory, as ``[]`` does."""
        if stage_id not in self._keys:
            raise KeyError(stage_id)
        entry = self._layout[stage_id]
        if entry.dtype in HALF or entry.nbytes == 0:
            return self[stage_id]
        return np.memmap(self.tensor_path, STORED[entry.dtype], "r", entry.start, tuple(entry.shape))

    def rows(self, stage_id: str, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of a stage, read without loading the rest (F16/BF16 widened to float32)."""
        if self._layout[stage_id].dtype in HALF:
            entry = self._layout[stage_id]
            inner = int(np.prod(entry.shape[1:], dtype=np.int64))
            buffer = np.empty(max(stop - start, 0) * inner * 6, dtype=np.uint8)
            return self.rows_into(stage_id, start, stop, buffer).copy()
        return self._file.get_slice(stage_id)[start:stop]

    def rows_into(self, stage_id: str, start: int, stop: int, buffer: np.ndarray) -> np.ndarray:
        """Rows ``start:stop`` read into ``buffer`` (a uint8 array the caller reuses: no allocation and no
        page faults per read); the result is a view of it, valid until the buffer is filled again.

        F16 and BF16 rows are widened to float32 in the buffer (6 bytes per element: the stored bits
        after the widened values)."""
        if self._raw is None:
            self._raw = open(self.tensor_path, "rb", buffering=0)  # noqa: SIM115 - lives as long as the TapSet
        entry = self._layout[stage_id]
        stored = STORED[entry.dtype]
        row_bytes = entry.nbytes // entry.shape[0] if entry.shape and entry.shape[0] else entry.nbytes
        nbytes = (stop - start) * row_bytes
        count = nbytes // stored.itemsize
        widened = 4 * count if entry.dtype in HALF else 0
        if buffer.size < widened + nbytes:
            raise ValueError(f"a buffer of {buffer.size} bytes cannot hold {widened + nbytes}")
        view = buffer[widened : widened + nbytes]
        if os.preadv(self._raw.fileno(), [view], entry.start + start * row_bytes) != nbytes:
            raise TapFileError(f"{self.tensor_path} ends inside stage {stage_id!r}", "re-capture or rewrite it")
        shape = (stop - start, *entry.shape[1:])
        if entry.dtype == "F16":
            out = buffer[:widened].view(np.float32)
            np.copyto(out, view.view(np.float16))
            return out.reshape(shape)
        if entry.dtype == "BF16":  # bfloat16 is the upper half of a float32: shift the bits into place
            out = buffer[:widened].view(np.uint32)
            np.copyto(out, view.view(np.uint16))
            out <<= 16
            return out.view(np.float32).reshape(shape)
        return view.view(stored).reshape(shape)

    def _scalar(self, stage_id: str) -> np.ndarray:
        """A zero-dimensional half-precision stage, widened."""
        return self.rows_into(stage_id, 0, 1, np.empty(6, dtype=np.uint8)).reshape(()).copy()

    def stored_dtype(self, stage_id: str) -> str:
        """The safetensors dtype a stage is stored as (``F32``, ``BF16``, ...)."""
        return self._layout[stage_id].dtype

    def shape(self, stage_id: str) -> tuple[int, ...]:
        return tuple(self._layout[stage_id].shape)

    def items(self) -> Iterator[tuple[str, np.ndarray]]:
        for stage_id in self.stage_ids():
            yield stage_id, self[stage_id]
