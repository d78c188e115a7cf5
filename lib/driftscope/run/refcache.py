"""The reference is computed once: the reference runtime's TapSet, cached by what its taps depend on.

A run of the same parameter file at another commit, or ``driftscope batch`` over commits, finds the reference's
taps in the cache and re-runs only the candidates. An entry is content-addressed: its key is the SHA-256 of
the capture's identity (:func:`identity`): the checkpoint's content digest, the inputs digest (and the text
side's settings), the runtime, its package versions and the source of driftscope's code that runs it, the
precision policy, the options, the selected stage plan, the hypothesis patch (its source too), the platform
and this cache's format. Anything else that differs (the label, the output directory, the commit of the
engines under test) does not change the reference's taps, so it does not change the key.

Where: ``$DRIFTSCOPE_REFERENCE_CACHE`` (a directory, or ``off``), else ``$DRIFTSCOPE_CACHE/reference``, else
the ``reference`` folder of the user cache folder (``core.paths.cache_root``); ``driftscope run|batch
--reference-cache DIR|off`` sets it.
An entry ``<root>/<key>/`` holds ``taps.safetensors``, ``taps.json`` and, written last and atomically,
``entry.json`` (the identity, the tensor file's size and SHA-256, who stored it), sealed (``core.seal``: an HMAC
under a key kept outside the cache), so data rewritten together with its recorded digests is refused too. An entry
is read and written only under its ``flock`` (``run.runlock``): concurrent batch workers that need the same
reference wait for the first one's capture and then reuse it instead of computing it twice. An entry whose
identity, seal, size, digest or sidecar does not hold is refused (logged, removed) and the reference captured and
stored again.
Nothing is ever evicted: remove the directory to reclaim its space.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import platform
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from driftscope.core.atomic import place_file_atomic, write_json_atomic
from driftscope.core.digests import file_sha256, tree_digest
from driftscope.core.paths import cache_root as driftscope_cache
from driftscope.core.seal import holds, seal
from driftscope.core.seal import key_path as seal_key_path
from driftscope.errors import DriftscopeError, ParameterError
from driftscope.run.runlock import run_lock
from driftscope.taps.sidecar import FORMAT_VERSION, validate_sidecar
from driftscope.taps.tapset import TapSet, tap_paths

if TYPE_CHECKING:
    from driftscope.capture.runtimes.base import Runtime
    from driftscope.inputs.processor_output import ModelInputs
    from driftscope.taps.stages import StagePlan

ENV = "DRIFTSCOPE_REFERENCE_CACHE"
OFF = ("off", "none", "no", "false", "0")
#: bump when something outside the identity changes what a reference capture writes
CACHE_VERSION = 1
ENTRY = "entry.json"
TAPS = "taps"


def cache_root() -> Path | None:
    """The cache's directory, or None when it is turned off (``$DRIFTSCOPE_REFERENCE_CACHE=off``)."""
    value = os.environ.get(ENV, "").strip()  # unset or empty: the default place
    if value and value.lower() in OFF:
        return None
    if value:
        return Path(value).expanduser()
    return driftscope_cache() / "reference"


def set_cache_option(value: str | None) -> None:
    """Apply a ``--reference-cache DIR|off`` option (the variable reaches the runs a batch starts too)."""
    if value is None:
        return
    if not value.strip():
        raise ParameterError("--reference-cache is empty", "pass a directory, or off to recompute the reference")
    os.environ[ENV] = value if value.lower() in OFF else str(Path(value).expanduser().resolve())


def _sha(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def source_digest(objects: list[Any]) -> str:
    """SHA-256 of the source files defining ``objects`` (modules, classes, functions), each read once."""
    files = []
    for obj in objects:
        try:
            name = inspect.getsourcefile(obj)
        except TypeError:
            name = None
        if name and name not in files:
            files.append(name)
    digest = hashlib.sha256()
    for name in files:
        digest.update(Path(name).name.encode() + b"\0")
        digest.update(Path(name).read_bytes())
    return digest.hexdigest()


def code_objects(runtime: Runtime) -> list[Any]:
    """driftscope's code a capture of ``runtime`` runs: its class's modules and its family's module for it."""
    classes = [cls for cls in type(runtime).__mro__ if cls.__module__.startswith("driftscope.")]
    objects: list[Any] = [sys.modules[cls.__module__] for cls in classes]
    objects.append(runtime.taps)
    return objects


def checkpoint_digest(path: Path, root: Path | None) -> str:
    """The checkpoint directory's content digest (file hashes remembered under the cache by their ``stat``)."""
    return tree_digest(Path(path), None if root is None else root / "checkpoint-digests.json")


def _patch_identity(runtime: Runtime) -> dict | None:
    if runtime.patch is None:
        return None
    function = runtime.patch.resolve()
    return {"target": runtime.patch.target, "kwargs": runtime.patch.kwargs, "source": source_digest([function])}


def _array_digest(array: Any) -> str | None:
    if array is None:
        return None
    import numpy as np

    array = np.ascontiguousarray(array)
    return hashlib.sha256(f"{array.dtype}{array.shape}".encode() + array.tobytes()).hexdigest()


def _text_identity(inputs: ModelInputs) -> dict | None:
    """The text side's settings beyond the prompt's ids (which the inputs digest covers): how many tokens are
    decoded, and the tokens or image rows a teacher-forced or substituted capture is fed."""
    text = inputs.text
    if text is None:
        return None
    weighed = {}  # a capture weighing its answer against the reference's takes evidence where it is in question
    if text.evidence_rule:
        answer = {name: _array_digest(array) for name, array in sorted(text.reference_answer.items())}
        weighed = {"evidence_rule": text.evidence_rule, "reference_answer": answer}
    return {
        "max_new_tokens": text.max_new_tokens,
        "image_token_id": text.image_token_id,
        "token_types": _array_digest(text.token_types),
        "forced": _array_digest(text.forced),
        "image_embeds": _array_digest(text.image_embeds),
        **weighed,
    }


def identity(runtime: Runtime, inputs: ModelInputs, plan: StagePlan, root: Path | None = None, **extra) -> dict:
    """Everything a capture's taps depend on (``extra``: more, e.g. a mutation's name, settings and source)."""
    return {
        "cache_version": CACHE_VERSION,
        "tap_format": FORMAT_VERSION,
        "runtime": runtime.name,
        "versions": {**runtime.versions(), "numpy": _version("numpy"), "python": platform.python_version()},
        "code": source_digest(code_objects(runtime)),
        "policy": runtime.policy.to_dict(),
        "options": {key: value for key, value in sorted(runtime.options.items()) if key != "label"},
        "patch": _patch_identity(runtime),
        "checkpoint": checkpoint_digest(runtime.source.path, root),
        "family": runtime.checkpoint.family,
        "inputs": inputs.digest,
        "text": _text_identity(inputs),
        "stages": [stage.to_dict() for stage in plan],
        "platform": {"system": platform.system(), "machine": platform.machine()},
        **extra,
    }


def mutation_capture(log: Callable[[str], None], stored_by: dict, outcomes: list[dict]) -> Callable:
    """A ``capture`` for ``replay.power.fixture_power``: each mutated capture (the family's mutation runtime with
    a planted defect) through the cache, its outcome appended to ``outcomes``."""

    def capture(runtime: Runtime, inputs: ModelInputs, plan: StagePlan, base: Path, mutation: Any) -> TapSet:
        tapset, _, outcome = capture_cached(runtime, inputs, plan, base, log, stored_by, **mutation_identity(mutation))
        if outcome is not None:
            outcomes.append({"mutation": mutation.name, **outcome})
        return tapset

    return capture


def mutation_identity(mutation: Any) -> dict:
    """What a power mutation adds to a capture's identity: its name, settings and the source of its functions."""
    functions = [f for f in (mutation.install, mutation.during, mutation.inputs) if f is not None]
    return {"mutation": {"name": mutation.name, "settings": mutation.settings, "code": source_digest(functions)}}


def _version(name: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


class StaleEntry(DriftscopeError):
    """A cache entry that does not hold what its ``entry.json`` says."""


def entry_record(folder: Path, key: str, identity: Any, whose: str) -> dict | None:
    """A cache entry's ``entry.json`` (None: there is none), checked against its key and identity (``whose``: what
    the identity is, for the message); raises :class:`StaleEntry` when it does not hold."""
    path = folder / ENTRY
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise StaleEntry(f"{ENTRY} is unreadable ({err})") from None
    if not isinstance(record, dict) or record.get("key") != key:
        raise StaleEntry("its record names another key")
    if record.get("identity") != identity:
        raise StaleEntry(f"its recorded identity is not {whose}")
    if not holds({k: v for k, v in record.items() if k != "seal"}, record.get("seal")):
        raise StaleEntry(
            f"its seal does not hold: {ENTRY} was not written by driftscope under this machine's key "
            f"({seal_key_path()}), or was changed since"
        )
    return record


def sealed_record(record: dict) -> dict:
    """``record`` as ``entry.json`` holds it (plain JSON) with its seal (``core.seal``): the digests it records
    vouch for the entry's files only together with a key that does not live in the cache."""
    plain = json.loads(json.dumps(record, default=str))
    return {**plain, "seal": seal(plain)}


class Entry:
    """One cache entry, held under its lock: :meth:`reuse` it into a run's directory, or :meth:`store` a capture."""

    def __init__(self, root: Path, ident: dict, log: Callable[[str], None]):
        self.key = _sha(ident)
        self.identity = ident
        self.dir = root / self.key
        self.log = log
        self.outcome: dict = {"status": "miss", "entry": str(self.dir), "key": self.key}

    @property
    def tensor_path(self) -> Path:
        return tap_paths(self.dir / TAPS)[0]

    @property
    def sidecar_path(self) -> Path:
        return tap_paths(self.dir / TAPS)[1]

    def _verified(self) -> dict | None:
        """The entry's record when the entry holds (None: there is none); raises :class:`StaleEntry`."""
        record = entry_record(self.dir, self.key, json.loads(json.dumps(self.identity, default=str)), "this capture's")
        if record is None:
            return None
        for what, file, field in (("tensor", self.tensor_path, "tensor"), ("sidecar", self.sidecar_path, "sidecar")):
            if not file.exists():
                raise StaleEntry(f"its {what} file is missing")
            if file.stat().st_size != record.get(field, {}).get("bytes"):
                raise StaleEntry(f"its {what} file is {file.stat().st_size} bytes, not the recorded size")
            if file_sha256(file) != record.get(field, {}).get("sha256"):
                raise StaleEntry(f"its {what} file's SHA-256 is not the recorded one")
        try:
            tapset = TapSet(self.tensor_path)
        except DriftscopeError as err:
            raise StaleEntry(f"its TapSet is unreadable ({err.problem})") from None
        if tapset.meta.get("complete") is not True or tapset.meta.get("error"):
            raise StaleEntry("its TapSet is incomplete")
        return record

    def lookup(self) -> dict | None:
        """The entry's record when it can be reused; a stale or corrupt entry is refused and removed (and so are
        the temporaries of a store that was killed: under the entry's lock nobody else is writing them)."""
        for leftover in self.dir.glob(".*.tmp"):
            leftover.unlink(missing_ok=True)
        try:
            return self._verified()
        except StaleEntry as err:
            self.log(f"refusing the cached reference taps in {self.dir}: {err.problem}; capturing them again")
            self.outcome["refused"] = err.problem
            for name in (ENTRY, self.tensor_path.name, self.sidecar_path.name):
                (self.dir / name).unlink(missing_ok=True)
            return None

    def reuse(self, record: dict, runtime: Runtime, inputs: ModelInputs, out_base: Path) -> TapSet:
        """The entry's taps as this run's TapSet at ``out_base`` (hard-linked, else copied; the sidecar rewritten
        with this run's label, checkpoint path and options)."""
        start = time.perf_counter()
        tensor, sidecar = tap_paths(out_base)
        place_file_atomic(self.tensor_path, tensor)
        meta = json.loads(self.sidecar_path.read_text())
        ours = runtime.metadata(inputs)
        ours.pop("inputs_digest")  # the captured one (a mutation may have run on inputs of its own)
        meta.update(ours, tensor_file=tensor.name)
        self.outcome.update(status="hit", stored=record.get("stored"), reused_s=round(time.perf_counter() - start, 3))
        meta["reference_cache"] = dict(self.outcome)
        validate_sidecar(meta, sidecar)
        write_json_atomic(sidecar, meta)
        return TapSet(tensor)

    def store(self, tapset: TapSet, weight_dtypes: dict, stored_by: dict) -> None:
        """Put a complete capture into the entry: the files first, ``entry.json`` (what makes it an entry) last."""
        if tapset.meta.get("complete") is not True:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        place_file_atomic(tapset.tensor_path, self.tensor_path)
        meta = dict(tapset.meta, tensor_file=self.tensor_path.name, weight_dtypes=weight_dtypes)
        write_json_atomic(self.sidecar_path, meta)
        record = {
            "key": self.key,
            "identity": self.identity,
            "tensor": {"bytes": self.tensor_path.stat().st_size, "sha256": file_sha256(self.tensor_path)},
            "sidecar": {"bytes": self.sidecar_path.stat().st_size, "sha256": file_sha256(self.sidecar_path)},
            "stored": {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **stored_by},
        }
        write_json_atomic(self.dir / ENTRY, sealed_record(record))
        self.outcome.update(status="stored", stored=record["stored"])
        self.log(f"  stored the reference taps in the cache: {self.dir}")


@contextmanager
def reference_entry(
    runtime: Runtime, inputs: ModelInputs, plan: StagePlan, log: Callable[[str], None], **extra
) -> Iterator[Entry | None]:
    """The cache entry of this capture, held (locked) for the block; None where the cache is off or does not
    apply (an external engine's taps are a file already)."""
    root = cache_root()
    if root is None or runtime.external:
        yield None
        return
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        log(f"the reference cache {root} cannot be used ({err.strerror}): capturing the reference")
        yield None
        return
    entry = Entry(root, identity(runtime, inputs, plan, root, **extra), log)
    with run_lock(entry.dir, wait=True, log=log, what="reference capture"):
        yield entry


def capture_cached(
    runtime: Runtime,
    inputs: ModelInputs,
    plan: StagePlan,
    out_base: Path,
    log: Callable[[str], None],
    stored_by: dict | None = None,
    progress: Callable[[str], None] | None = None,
    **extra,
) -> tuple[TapSet, dict, dict | None]:
    """``runtime.capture`` through the cache: (TapSet at ``out_base``, the weights' dtypes, the cache outcome).

    The outcome (None when the cache is off) is what the report records: ``status`` hit/stored/miss, ``entry``,
    ``key``, ``stored`` (when and by which commit and directory), ``refused`` (why a stale entry was refused)."""
    with reference_entry(runtime, inputs, plan, log, **extra) as entry:
        record = entry.lookup() if entry is not None else None
        if entry is not None and record is not None:
            tapset = entry.reuse(record, runtime, inputs, Path(out_base))
            log(f"  {runtime.label}: reused the cached reference taps from {entry.dir}")
            return tapset, dict(json.loads(entry.sidecar_path.read_text()).get("weight_dtypes") or {}), entry.outcome
        tapset = runtime.capture(inputs, plan, out_base, progress=progress)
        dtypes = runtime.weight_dtypes()
        if entry is not None:
            by = {"host": socket.gethostname(), "pid": os.getpid(), **(stored_by or {})}
            try:
                entry.store(tapset, dtypes, by)
            except (OSError, DriftscopeError) as err:  # a full cache disk costs the reuse, never the run
                log(f"  could not store the reference taps in {entry.dir}: {err}")
                entry.outcome.update(status="miss", store_error=str(err))
        return tapset, dtypes, None if entry is None else entry.outcome
