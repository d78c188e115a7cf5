"""The storage boundary: an output root that is a local path or a URL fsspec understands, and remote inputs.

A plain path is written in place (the runs write into it directly). A URL (``file://``, ``s3://``,
``gs://``, ...) is treated as remote: a run works in a local scratch directory and :meth:`OutputRoot.upload`
puts the finished directory there; the index writer reads reports back through :meth:`OutputRoot.read_text`.
Inputs given as URLs (a checkpoint directory, an image) are copied once into a local cache by :func:`localize`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path

from driftscope.core.atomic import write_text_atomic
from driftscope.core.paths import cache_root
from driftscope.core.seal import holds, seal
from driftscope.errors import DriftscopeError

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")


class StorageError(DriftscopeError):
    """An output root or a remote input cannot be read or written."""


def is_url(location: str | Path) -> bool:
    """Whether ``location`` names a URL (``scheme://...``) rather than a local path."""
    return isinstance(location, str) and bool(_SCHEME.match(location))


def _filesystem(url: str):
    import fsspec

    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as err:
        raise StorageError(
            f"cannot open {url}: {err}", "install the fsspec back-end for this scheme (e.g. s3fs, gcsfs)"
        ) from err


class OutputRoot:
    """``outputs/`` as a local directory or a URL: join, read, write, list and upload under it."""

    def __init__(self, location: str | Path):
        self.remote = is_url(str(location))
        if self.remote:
            self.location = str(location).rstrip("/")
            self.fs, self.base = _filesystem(self.location)
        else:
            self.location = str(Path(location).expanduser().resolve())
            self.fs, self.base = None, self.location

    def __repr__(self) -> str:
        return f"OutputRoot({self.location!r})"

    def url(self, *parts: str) -> str:
        """The location of ``parts`` under the root, as the user would type it (a path or a URL)."""
        return "/".join([self.location, *parts]) if self.remote else str(Path(self.location, *parts))

    def path(self, *parts: str) -> Path:
        """The local path of ``parts`` (only for a local root)."""
        if self.remote:
            raise StorageError(f"{self.location} is not a local directory", "read it through OutputRoot")
        return Path(self.location, *parts)

    def _key(self, *parts: str) -> str:
        return "/".join([self.base.rstrip("/"), *parts])

    def read_text(self, *parts: str) -> str | None:
        """The file's text, or None when it does not exist."""
        try:
            if not self.remote:
                return self.path(*parts).read_text(encoding="utf-8")
            with self.fs.open(self._key(*parts), "rt", encoding="utf-8") as handle:
                return handle.read()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def read_json(self, *parts: str) -> dict | None:
        """The file parsed as JSON, or None when it does not exist or is not JSON."""
        text = self.read_text(*parts)
        if text is None:
            return None
        try:
            data = json.loads(text)
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    def write_text(self, *parts: str, text: str) -> str:
        """Write a whole file so that a reader sees the old one or the new one (temporary name, then move)."""
        if not self.remote:
            write_text_atomic(self.path(*parts), text)
            return self.url(*parts)
        target = self._key(*parts)
        temporary = self._key(*parts[:-1], f".{parts[-1]}.{uuid.uuid4().hex[:8]}.tmp")
        self.fs.makedirs(self._key(*parts[:-1]), exist_ok=True)
        self.fs.pipe_file(temporary, text.encode("utf-8"))
        self.fs.mv(temporary, target)
        return self.url(*parts)

    def check_writable(self) -> None:
        """Write, read back and remove a small file at the root, or raise :class:`StorageError` saying why a run
        could not keep its outputs there (a read-only folder or filesystem, a path under a file, a URL that
        refuses writes)."""
        name = f".driftscope-probe-{uuid.uuid4().hex[:8]}"
        try:
            self.write_text(name, text=name)
            readable = self.read_text(name) == name
            if self.remote:
                self.fs.rm_file(self._key(name))
            else:
                self.path(name).unlink()
        except Exception as err:  # noqa: BLE001 - every filesystem refuses in its own words
            reason = getattr(err, "problem", None) or getattr(err, "strerror", None) or f"{type(err).__name__}: {err}"
            raise StorageError(
                f"cannot keep outputs under {self.location}: {reason}",
                "pass an output root this user can write and every later reader can read (a local folder, "
                "s3://..., gs://...)",
            ) from None
        if not readable:
            raise StorageError(f"a file written under {self.location} did not read back", "pass another output root")

    def directories(self, *parts: str) -> list[str]:
        """Names of the subdirectories of ``parts`` (none when it does not exist)."""
        if not self.remote:
            folder = self.path(*parts)
            return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
        try:
            entries = self.fs.ls(self._key(*parts), detail=True)
        except FileNotFoundError:
            return []
        return sorted(e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e["type"] == "directory")

    def files(self, *parts: str) -> list[str]:
        """Names of the files directly under ``parts``."""
        if not self.remote:
            folder = self.path(*parts)
            return sorted(p.name for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []
        try:
            entries = self.fs.ls(self._key(*parts), detail=True)
        except FileNotFoundError:
            return []
        return sorted(e["name"].rsplit("/", 1)[-1] for e in entries if e["type"] == "file")

    def upload(self, local: Path, *parts: str) -> None:
        """Put the local directory ``local`` at ``parts``; files there that ``local`` lacks are removed after."""
        target = self._key(*parts)
        written = {p.relative_to(local).as_posix() for p in Path(local).rglob("*") if p.is_file()}
        for folder in sorted({f"{target}/{name}".rsplit("/", 1)[0] for name in written} | {target}):
            self.fs.makedirs(folder, exist_ok=True)
        for name in sorted(written):
            self.fs.put_file(str(Path(local, name)), f"{target}/{name}")
        for entry in self.fs.find(target):
            if entry[len(target) :].lstrip("/") not in written:
                self.fs.rm_file(entry)


def cache_dir() -> Path:
    """Where remote inputs are kept: the ``inputs`` folder of driftscope's cache."""
    return cache_root() / "inputs"


COMPLETE = ".complete"


def _manifest(folder: Path) -> dict[str, str]:
    """Relative name -> SHA-256 of every file a fetch left in ``folder`` (remembered by stat key in the cache)."""
    from driftscope.core.digests import content_sha256

    memo: dict = {}
    return {
        p.relative_to(folder).as_posix(): content_sha256(p, memo)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != COMPLETE
    }


def _fetched(folder: Path) -> bool:
    """Whether ``folder`` holds a complete fetch, as its sealed record says (``core.seal``): a local copy changed
    since it was fetched is fetched again."""
    try:
        record = json.loads((folder / COMPLETE).read_text())
        files = record["files"]
        return holds({"key": folder.name, "files": files}, record.get("seal")) and _manifest(folder) == files
    except (OSError, ValueError, KeyError, TypeError):
        return False


def localize(url: str) -> Path:
    """A local copy of the file or directory at ``url``, fetched once per version (size and time stamps)."""
    fs, path = _filesystem(url)
    try:
        found = fs.find(path, detail=True, withdirs=False) if fs.isdir(path) else {path: fs.info(path)}
    except FileNotFoundError:
        found = {}
    if not found:
        raise StorageError(f"{url} does not exist", "check the URL and that this machine can read it")
    version = json.dumps(
        sorted(
            (name, str(info.get("size")), str(info.get("mtime") or info.get("LastModified") or info.get("ETag")))
            for name, info in found.items()
        ),
    )
    key = hashlib.sha256(f"{url}\n{version}".encode()).hexdigest()[:16]
    name = path.rstrip("/").rsplit("/", 1)[-1] or "input"
    folder = cache_dir() / key
    if _fetched(folder):
        return folder / name
    shutil.rmtree(folder, ignore_errors=True)  # absent, or changed since it was fetched: fetched again
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=folder.parent))
    try:
        if len(found) == 1 and path in found:
            fs.get_file(path, str(staging / name))
        else:
            for remote in found:
                local = staging / name / remote[len(path.rstrip("/")) :].lstrip("/")
                local.parent.mkdir(parents=True, exist_ok=True)
                fs.get_file(remote, str(local))
        files = _manifest(staging)
        record = {"url": url, "files": files, "seal": seal({"key": key, "files": files})}
        (staging / COMPLETE).write_text(json.dumps(record) + "\n")
        try:
            os.replace(staging, folder)
        except OSError:  # another process fetched it first
            if not (folder / COMPLETE).exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder / name
