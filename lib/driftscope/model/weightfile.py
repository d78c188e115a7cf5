"""Read checkpoint tensors from safetensors files straight into aligned float32 arrays.

One read per tensor into memory the caller keeps (no memory map held open, no intermediate copy),
64-byte aligned so the IREE CPU driver can use the array in place. The safetensors layout is an
8-byte little-endian header length, a JSON header ``{name: {dtype, shape, data_offsets}}``, then the data.
"""

from __future__ import annotations

import fnmatch
import json
import mmap
import os
import struct
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from driftscope.errors import CheckpointError

#: Buffer alignment the IREE llvm-cpu kernels may assume for their bindings.
ALIGNMENT = 64
PAGE = 4096
#: Arrays from this size on get their own memory mapping.
OWN_MAPPING = 1 << 20
#: Elements a widening read converts at a time (16 MiB of float32).
CHUNK = 1 << 22

#: safetensors dtype -> (numpy dtype of the stored bits, how to widen them to float32)
DTYPES = {
    "F32": (np.float32, lambda raw: raw),
    "F16": (np.float16, lambda raw: raw.astype(np.float32)),
    "BF16": (np.uint16, lambda raw: (raw.astype(np.uint32) << 16).view(np.float32)),
    "F64": (np.float64, lambda raw: raw.astype(np.float32)),
}


def aligned_empty(shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on an ``ALIGNMENT``-byte boundary.

    Large arrays get their own anonymous mapping (page aligned): numpy would ask for transparent huge
    pages, and on a fragmented machine the kernel's compaction for them cost seconds per GiB of weights.
    """
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes >= OWN_MAPPING:
        # faulted in by the one call where the platform can (Linux); elsewhere page by page
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
        return np.frombuffer(mmap.mmap(-1, nbytes, flags=flags), dtype=dtype).reshape(shape)
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    offset = (-raw.ctypes.data) % ALIGNMENT
    return raw[offset : offset + nbytes].view(dtype).reshape(shape)


def is_aligned(array: np.ndarray) -> bool:
    return array.flags.c_contiguous and array.ctypes.data % ALIGNMENT == 0


@dataclass(frozen=True)
class TensorEntry:
    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    nbytes: int


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object whose keys are each given once (``object_pairs_hook``): a name listed twice would be read as
    its last entry, silently, whichever entry the writer meant."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"{key!r} is listed twice")
        out[key] = value
    return out


def read_header(file: Path) -> dict[str, TensorEntry]:
    """The tensors a safetensors file's header describes (a header longer than the file, or naming a tensor
    twice, is a ``ValueError`` saying so)."""
    with open(file, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        (length,) = struct.unpack("<Q", handle.read(8))
        if length > size - 8:
            raise ValueError(f"its header length says {length} bytes, and the whole file has {size}")
        header = json.loads(handle.read(length), object_pairs_hook=unique_keys)
    base = 8 + length
    return {
        name: TensorEntry(
            file,
            entry["dtype"],
            tuple(entry["shape"]),
            base + entry["data_offsets"][0],
            entry["data_offsets"][1] - entry["data_offsets"][0],
        )
        for name, entry in header.items()
        if name != "__metadata__"
    }


def matching(names: Iterable[str], patterns: Iterable[str]) -> set[str]:
    """The names that match any of the fnmatch ``patterns``."""
    patterns = tuple(patterns)
    return {name for name in names if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)}


#: (checkpoint directory, the set that records its tensors' names as they are read): ``recording_reads``
_LEDGERS: list[tuple[Path, set[str]]] = []


@contextmanager
def recording_reads(path: str | Path, into: set[str]) -> Iterator[set[str]]:
    """While active, the name of every tensor any ``TensorFiles`` of ``path`` reads is added to ``into``."""
    entry = (Path(path).resolve(), into)
    _LEDGERS.append(entry)
    try:
        yield into
    finally:
        _LEDGERS.remove(entry)


#: (checkpoint directory, fnmatch patterns of the tensors it reads in float16): ``half_reads``
_HALVES: list[tuple[Path, tuple[str, ...]]] = []


@contextmanager
def half_reads(path: str | Path, patterns: Iterable[str]) -> Iterator[None]:
    """While active, every tensor of ``path`` whose name matches one of ``patterns`` is read as float16 (rounded to
    nearest even from its float32 value, as a graph's ``astype`` rounds it): a policy whose dot operands are
    float16 holds those weights in half the memory, never as float32 all at once."""
    entry = (Path(path).resolve(), tuple(patterns))
    _HALVES.append(entry)
    try:
        yield
    finally:
        _HALVES.remove(entry)


def _read_exactly(handle, buffer: np.ndarray, entry: TensorEntry, name: str) -> None:
    """Fill ``buffer`` from ``handle``'s position; a file that ends first is a checkpoint error naming ``name``."""
    if handle.readinto(memoryview(buffer).cast("B")) != buffer.nbytes:
        raise CheckpointError(f"checkpoint file {entry.file} ends inside {name!r}", "re-save the checkpoint")


def _widen_into(flat: np.ndarray, entry: TensorEntry, name: str) -> None:
    """Read ``entry`` into ``flat`` a :data:`CHUNK` of elements at a time, each widened to float32 (and rounded to
    ``flat``'s float16 where it is one): never the stored bits or a float32 copy of the whole tensor besides
    ``flat`` (at a 7B vocabulary 1 GiB and 2 GiB, on top of the weights already held)."""
    stored, widen = DTYPES[entry.dtype]
    raw = np.empty(min(flat.size, CHUNK), dtype=stored)
    with open(entry.file, "rb") as handle:
        handle.seek(entry.start)
        for at in range(0, flat.size, CHUNK):
            part = raw[: min(CHUNK, flat.size - at)]
            _read_exactly(handle, part, entry, name)
            flat[at : at + part.size] = widen(part)


class TensorFiles:
    """Every tensor of a checkpoint directory (one file or a sharded index), read on demand."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._root = self.path.resolve()
        files = sorted(self.path.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"checkpoint {self.path} has no *.safetensors files", "point at a saved checkpoint")
        self.entries: dict[str, TensorEntry] = {}
        for file in files:
            self.entries.update(read_header(file))

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def names(self) -> list[str]:
        return list(self.entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name].shape

    def read(self, name: str) -> np.ndarray:
        """The tensor as an aligned float32 array (bfloat16/float16 widened exactly)."""
        entry = self.entries[name]
        for root, names in _LEDGERS:
            if root == self._root:
                names.add(name)
        if entry.dtype not in DTYPES:
            raise CheckpointError(
                f"checkpoint tensor {name!r} is stored as {entry.dtype}", f"store it as one of {', '.join(DTYPES)}"
            )
        stored, _ = DTYPES[entry.dtype]
        half = any(root == self._root and matching([name], patterns) for root, patterns in _HALVES)
        if stored is np.float32 and not half:
            out = aligned_empty(entry.shape, np.float32)
            out.reshape(-1).view(np.uint8)[::PAGE] = 0  # fault the pages in first: ~5x faster than inside readinto
            with open(entry.file, "rb") as handle:
                handle.seek(entry.start)
                _read_exactly(handle, out.reshape(-1), entry, name)
            return out
        out = aligned_empty(entry.shape, np.float16 if half else np.float32)
        _widen_into(out.reshape(-1), entry, name)
        return out

    def read_checked(self, name: str, shape: tuple[int, ...] | None, note: str = "") -> np.ndarray:
        """:meth:`read`, a tensor the config implies: one missing (``note`` follows the name in the message) or of
        another ``shape`` than the config's (None: any) is refused as the weights and config.json disagreeing."""
        if name not in self:
            raise CheckpointError(
                f"checkpoint tensor {name!r} is missing{note}",
                "the weights and config.json disagree: re-save the checkpoint or fix the config",
            )
        if shape is not None and self.shape(name) != shape:
            raise CheckpointError(
                f"checkpoint tensor {name!r} has shape {list(self.shape(name))}, the config implies {list(shape)}",
                "the weights and config.json disagree: re-save the checkpoint or fix the config",
            )
        return self.read(name)

    def read_rows(self, name: str, rows) -> np.ndarray:
        """Rows ``rows`` (indices along the first axis) of the tensor, float32: a sample of a large tensor, each row
        read on its own."""
        entry = self.entries[name]
        stored, widen = DTYPES[entry.dtype]
        rows = [int(row) for row in rows]
        outside = [row for row in rows if not 0 <= row < entry.shape[0]]
        if outside:
            raise CheckpointError(
                f"{name!r} has {entry.shape[0]} rows: no row {outside[0]}", "ask for rows of the tensor's first axis"
            )
        per_row = entry.nbytes // max(entry.shape[0], 1)
        raw = np.empty((len(rows), *entry.shape[1:]), dtype=stored)
        with open(entry.file, "rb") as handle:
            for at, row in enumerate(rows):
                handle.seek(entry.start + row * per_row)
                _read_exactly(handle, raw[at : at + 1], entry, name)
        return raw if stored is np.float32 else widen(raw).astype(np.float32)
