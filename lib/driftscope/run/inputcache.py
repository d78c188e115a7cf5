"""The prepared inputs are computed once: a run's processor output and prompt ids, cached by what they depend on.

Every runtime of a run is fed the oracle's processor output (``Family.prepare_inputs``) and prompt ids
(``Family.text_inputs``); making them imports transformers' image processor and tokenizer, and with them torch
(4-9 s on a 2-core machine). They do not change between runs of the same parameter file, so a second run
reads them from this cache and imports neither before its first capture (with the reference's taps from
``run.refcache`` too, not until a runtime that needs them runs).

An entry is content-addressed: its key is the SHA-256 of :func:`identity`: the family, each image's and video's
path and SHA-256 (a folder of frames: each frame's), the SHA-256 of every file of the checkpoint directory but
its weights (config.json, preprocessor and processor configs, tokenizer files, chat template: whatever the
processor and tokenizer read), the ``text`` parameters (prompt, max_new_tokens, expect, ...), the versions of
the packages that compute inputs (read with ``importlib.metadata``, importing none of them), Python and the
platform, and the source of driftscope's code that computes them (``inputs/``, ``families/``,
``model/checkpoint.py`` and this module), so a code change misses.

Where: ``<reference cache>/inputs/`` (``run.refcache.cache_root``): ``$DRIFTSCOPE_REFERENCE_CACHE``, else
``$DRIFTSCOPE_CACHE/reference``, else ``reference`` of the user cache folder; ``off`` (or ``--reference-cache off``)
turns both off. An entry ``<root>/inputs/<key>/`` holds ``inputs.safetensors`` (the arrays) and, written last
and atomically, ``entry.json`` (the identity, the other fields as JSON, the tensor file's size and SHA-256,
the inputs' digest and summary, who stored it; sealed as the reference cache's entries are); no pickle. An entry
is read and written under its ``flock``. On load the record's seal, the tensor file's size and SHA-256, and the
decoded inputs' digest and summary are checked; an entry that does not hold is refused (logged, removed) and the
inputs prepared and stored again.
Inputs that JSON cannot hold faithfully (a NaN, a numpy scalar in the facts) are not stored.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import platform
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from driftscope.core.atomic import write_bytes_atomic, write_text_atomic
from driftscope.core.digests import file_sha256, tree_digest
from driftscope.errors import DriftscopeError
from driftscope.families import get_family
from driftscope.families.checkpoints import prepare_inputs
from driftscope.inputs.processor_output import ModelInputs
from driftscope.inputs.text_inputs import TextInputs
from driftscope.run.refcache import StaleEntry, cache_root, entry_record, sealed_record
from driftscope.run.runlock import run_lock

if TYPE_CHECKING:
    from driftscope.model.checkpoint import Checkpoint

#: the folder under the reference cache's root
FOLDER = "inputs"
#: bump when the entry's layout or what the identity leaves out changes
CACHE_VERSION = 1
ENTRY = "entry.json"
TENSORS = "inputs.safetensors"
#: the installed packages whose code computes the inputs (pillow decodes and resizes, av decodes videos)
PACKAGES = ("transformers", "tokenizers", "pillow", "numpy", "av", "safetensors", "huggingface-hub")
#: files of a checkpoint directory that hold weights, which no processor or tokenizer reads
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".npz", ".h5", ".msgpack")
_LIB = Path(__file__).resolve().parents[1]  # lib/driftscope
#: driftscope's code that computes inputs (folders are read recursively)
SOURCES = ("inputs", "families", "model/checkpoint.py", "run/inputcache.py")


def inputs_root() -> Path | None:
    """The inputs cache's directory (``<reference cache>/inputs``), or None when the cache is turned off."""
    root = cache_root()
    return None if root is None else root / FOLDER


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


def source_digest() -> str:
    """SHA-256 of driftscope's source that computes inputs (:data:`SOURCES`), each file's name and bytes."""
    digest = hashlib.sha256()
    for source in SOURCES:
        path = _LIB / source
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in files:
            digest.update(file.relative_to(_LIB).as_posix().encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()


def processor_files(path: Path) -> dict[str, str]:
    """Name -> SHA-256 of every file of the checkpoint directory that is not a weight file (the configs, the
    preprocessor and processor configs, the tokenizer and its chat template: what ``prepare_inputs`` and
    ``text_inputs`` may read; a new or changed one misses)."""
    return {
        file.name: file_sha256(file)
        for file in sorted(Path(path).iterdir())
        if file.is_file() and not file.name.endswith(WEIGHT_SUFFIXES) and not file.name.startswith(".")
    }


def _content(path: str | Path) -> str:
    """SHA-256 of an image's or video's bytes (a video given as a folder of frames: every frame's name and bytes)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    return tree_digest(path)


def identity(checkpoint: Checkpoint, images: list, videos: list, text: dict | None) -> dict:
    """Everything the prepared inputs depend on (raises ``OSError`` when a file cannot be read)."""
    return {
        "cache_version": CACHE_VERSION,
        "family": checkpoint.family,
        "images": [{"path": str(p), "sha256": _content(p)} for p in images],
        "videos": [{"path": str(p), "sha256": _content(p)} for p in videos],
        "checkpoint_files": processor_files(checkpoint.path),
        "text": json.loads(json.dumps(text, sort_keys=True, default=str)) if text else None,
        "versions": {name: _version(name) for name in PACKAGES},
        "python": platform.python_version(),
        "platform": {"system": platform.system(), "machine": platform.machine()},
        "code": source_digest(),
    }


def _key(ident: dict) -> str:
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


def _split(obj: Any, prefix: str, tensors: dict[str, np.ndarray]) -> dict:
    """A dataclass's fields: arrays into ``tensors`` (named ``prefix`` + field), the rest as plain values."""
    plain, arrays, named = {}, [], {}
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        if isinstance(value, np.ndarray):
            tensors[prefix + field.name] = np.ascontiguousarray(value)
            arrays.append(field.name)
        elif field.name in ("arrays", "text"):
            continue
        elif isinstance(value, dict) and value and all(isinstance(v, np.ndarray) for v in value.values()):
            for name, array in value.items():  # a dict of arrays (e.g. a prompt's per-token arrays)
                tensors[f"{prefix}{field.name}/{name}"] = np.ascontiguousarray(array)
            named[field.name] = list(value)
        else:
            plain[field.name] = value
    return {"plain": plain, "arrays": arrays, "named_arrays": named}


def _rebuilt(tensors: dict[str, np.ndarray], record: dict, prefix: str) -> dict:
    """The array fields of a :func:`_split` record: plain arrays and dicts of arrays."""
    out = {name: tensors[prefix + name] for name in record["arrays"]}
    for field, names in (record.get("named_arrays") or {}).items():
        out[field] = {name: tensors[f"{prefix}{field}/{name}"] for name in names}
    return out


def encode(inputs: ModelInputs) -> tuple[dict[str, np.ndarray], dict]:
    """(tensors, JSON-able record) of prepared inputs; raises ``TypeError``/``ValueError`` where JSON cannot
    hold a field faithfully."""
    tensors: dict[str, np.ndarray] = {}
    record = _split(inputs, "", tensors)
    record["named"] = list(inputs.arrays)  # the digest's order
    for name, array in inputs.arrays.items():
        tensors[f"arrays/{name}"] = np.ascontiguousarray(array)
    record["text"] = None if inputs.text is None else _split(inputs.text, "text/", tensors)
    json.dumps(record, allow_nan=False)  # strict: no numpy scalar, NaN or other object
    return tensors, record


def decode(tensors: dict[str, np.ndarray], record: dict) -> ModelInputs:
    """The prepared inputs an :func:`encode` record and its tensors hold."""
    plain = dict(record["plain"])
    plain["image_sizes"] = [tuple(size) for size in plain.get("image_sizes", [])]
    inputs = ModelInputs(
        arrays={name: tensors[f"arrays/{name}"] for name in record["named"]},
        **plain,
        **_rebuilt(tensors, record, ""),
    )
    text = record.get("text")
    if text is not None:
        inputs.text = TextInputs(**text["plain"], **_rebuilt(tensors, text, "text/"))
    return inputs


def _normal(data: Any) -> Any:
    return json.loads(json.dumps(data, sort_keys=True, default=str))


class InputsEntry:
    """One inputs cache entry, held under its lock: :meth:`lookup` its inputs, or :meth:`store` prepared ones."""

    def __init__(self, root: Path, ident: dict, log: Callable[[str], None]):
        self.identity = ident
        self.key = _key(ident)
        self.dir = root / self.key
        self.log = log
        self.outcome: dict = {"status": "miss", "entry": str(self.dir), "key": self.key}

    def _verified(self) -> ModelInputs | None:
        """The entry's inputs (None: there is no entry); raises :class:`StaleEntry` when it does not hold."""
        record = entry_record(self.dir, self.key, self.identity, "these inputs'")
        if record is None:
            return None
        try:
            data = (self.dir / TENSORS).read_bytes()
        except OSError:
            raise StaleEntry("its tensor file is missing") from None
        expected = record.get("tensors") or {}
        if len(data) != expected.get("bytes"):
            raise StaleEntry(f"its tensor file is {len(data)} bytes, not the recorded {expected.get('bytes')}")
        if hashlib.sha256(data).hexdigest() != expected.get("sha256"):
            raise StaleEntry("its tensor file's SHA-256 is not the recorded one")
        try:
            from safetensors.numpy import load

            inputs = decode(load(data), record["inputs"])
        except Exception as err:  # noqa: BLE001 - any failure to rebuild the inputs refuses the entry
            raise StaleEntry(f"its inputs cannot be rebuilt ({type(err).__name__}: {err})") from None
        if inputs.digest != record.get("digest"):
            raise StaleEntry(f"its inputs' digest {inputs.digest} is not the recorded {record.get('digest')}")
        if _normal(inputs.summary()) != record.get("summary"):
            raise StaleEntry("its inputs' summary is not the recorded one")
        self.outcome["stored"] = record.get("stored")
        return inputs

    def lookup(self) -> ModelInputs | None:
        """The entry's inputs when they can be reused; a stale or corrupt entry is refused and removed (and so
        are the temporaries of a store that was killed: under the entry's lock nobody else is writing them)."""
        for leftover in self.dir.glob(".*.tmp"):
            leftover.unlink(missing_ok=True)
        start = time.perf_counter()
        try:
            inputs = self._verified()
        except StaleEntry as err:
            self.log(f"refusing the cached inputs in {self.dir}: {err.problem}; preparing them again")
            self.outcome["refused"] = err.problem
            for name in (ENTRY, TENSORS):
                (self.dir / name).unlink(missing_ok=True)
            return None
        if inputs is not None:
            self.outcome.update(status="hit", reused_s=round(time.perf_counter() - start, 3))
        return inputs

    def store(self, inputs: ModelInputs, stored_by: dict) -> None:
        """Put prepared inputs into the entry: the tensor file first, ``entry.json`` (what makes it an entry)
        last. Raises ``TypeError``/``ValueError`` for inputs JSON cannot hold faithfully (nothing written)."""
        from safetensors.numpy import save

        tensors, fields = encode(inputs)
        data = save(tensors)
        record = {
            "key": self.key,
            "identity": self.identity,
            "inputs": fields,
            "tensors": {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()},
            "digest": inputs.digest,
            "summary": _normal(inputs.summary()),
            "stored": {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **stored_by},
        }
        json.dumps(record, allow_nan=False)  # inputs JSON cannot hold faithfully raise here, before any write
        text = json.dumps(sealed_record(record), indent=1) + "\n"
        write_bytes_atomic(self.dir / TENSORS, data)
        write_text_atomic(self.dir / ENTRY, text)
        self.outcome.update(status="stored", stored=record["stored"])


def cached_inputs(
    checkpoint: Checkpoint,
    images: list,
    videos: list,
    text: dict | None,
    log: Callable[[str], None],
    stored_by: dict | None = None,
) -> tuple[ModelInputs, dict | None]:
    """The run's prepared inputs (``prepare_inputs``, then the family's ``text_inputs`` when ``text`` is given)
    through the cache, and the cache's outcome for the report (None when the cache is off or cannot be used):
    ``status`` hit/stored/miss, ``entry``, ``key``, ``stored`` (when, by which commit and directory),
    ``refused`` (why an entry was refused), ``reused_s`` or ``prepared_s``."""

    def prepare() -> ModelInputs:
        inputs = prepare_inputs(checkpoint, images, videos)
        if text:
            inputs.text = get_family(checkpoint.family).text_inputs(checkpoint, inputs, **text)
        return inputs

    root = inputs_root()
    if root is None:
        return prepare(), None
    try:
        ident = identity(checkpoint, list(images), list(videos), text)
        root.mkdir(parents=True, exist_ok=True)
    except FileNotFoundError:  # a missing image or video: preparing the inputs says so, naming the fix
        return prepare(), None
    except OSError as err:
        log(f"the inputs cache {root} cannot be used ({err.strerror or err}): preparing the inputs")
        return prepare(), None
    entry = InputsEntry(root, ident, log)
    with run_lock(entry.dir, wait=True, log=log, what="inputs preparation"):
        inputs = entry.lookup()
        if inputs is not None:
            log(f"inputs: reused the prepared inputs from {entry.dir}")
            return inputs, entry.outcome
        start = time.perf_counter()
        inputs = prepare()
        entry.outcome["prepared_s"] = round(time.perf_counter() - start, 3)
        by = {"host": socket.gethostname(), "pid": os.getpid(), **(stored_by or {})}
        try:
            entry.store(inputs, by)
        except (OSError, TypeError, ValueError, DriftscopeError) as err:  # costs the reuse, never the run
            log(f"could not store the prepared inputs in {entry.dir}: {err}")
            entry.outcome.update(status="miss", store_error=str(err))
        return inputs, entry.outcome
