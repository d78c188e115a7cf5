"""Whether a finished run still stands for a parameter file: judged under the contract and runtimes the file names
today, on the bytes the file names today.

A run records what it read (:func:`reads`, the report's ``reads``): the content digest of the checkpoint directory,
of every image and video, of an external engine's TapSet (``tapfile``), the source of each hypothesis patch, the
source of driftscope's package that judged it and the versions of the packages that computed it. Before a finished
run is reused (``driftscope run``, a notebook's ``investigate(reuse=True)``, ``batch``), :func:`stale_reason` says
why it cannot be: another parameters digest, another contract (a ``rejudge`` in place), other runtimes, or any of
those bytes changed since (weights rewritten at the same path, a tap file replaced). The digests are hashed once
per content (``core.digests``: remembered by a stat key that ``cp -p`` cannot restore), so a check of an unchanged
run costs a few ``stat`` calls.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from driftscope.core.digests import content_sha256, tree_digest
from driftscope.errors import DriftscopeError
from driftscope.taps.tapset import tap_paths

if TYPE_CHECKING:
    from driftscope.run.params import Parameters

#: the packages whose code computes a run's numbers (versions read from their metadata, importing none)
PACKAGES = (
    "numpy",
    "torch",
    "transformers",
    "tokenizers",
    "pillow",
    "mlx",
    "mlx-vlm",
    "jax",
    "jaxlib",
    "iree-base-compiler",
    "iree-base-runtime",
    "safetensors",
    "av",
)
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # lib/driftscope


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _is_code(relative: Path) -> bool:
    """Whether a file under the package is its code or data: not a compiled cache, not hidden."""
    return "__pycache__" not in relative.parts and not any(part.startswith(".") for part in relative.parts)


def code_digest(package: Path = PACKAGE_DIR) -> str:
    """SHA-256 of driftscope's package source (``package``: the one that runs the parameters): every file's
    relative name and bytes, compiled caches and hidden files left out (the lab's ``.ipynb_checkpoints`` beside
    the package's notebooks is the lab's copy, not code)."""
    digest = hashlib.sha256()
    for file in sorted(p for p in Path(package).rglob("*") if p.is_file() and _is_code(p.relative_to(package))):
        digest.update(file.relative_to(package).as_posix().encode() + b"\0" + content_sha256(file).encode() + b"\n")
    return digest.hexdigest()


def _memo() -> Path | None:
    from driftscope.run.refcache import cache_root

    root = cache_root()
    return None if root is None else root / "checkpoint-digests.json"


def _content(path: Path, memo: Path | None) -> str | None:
    """A file's or directory's content digest; None when it is not there (the run then says so itself)."""
    try:
        return tree_digest(Path(path), memo)
    except OSError:
        return None


def reads(params: Parameters, package: Path = PACKAGE_DIR) -> dict[str, Any]:
    """What a run of ``params`` reads, by content (see the module's docstring)."""
    from driftscope.run.refcache import source_digest

    memo = _memo()
    tapfiles, patches = {}, {}
    for spec in params.runtimes:
        if spec.runtime == "tapfile" and isinstance(spec.options.get("path"), str):
            tapfiles[spec.display] = [_content(p, memo) for p in tap_paths(Path(spec.options["path"]))]
        if spec.patch is not None:
            try:
                patches[spec.display] = source_digest([spec.patch.resolve()])
            except DriftscopeError:
                patches[spec.display] = None  # the parameters step names the patch that does not import
    return {
        "checkpoint": _content(params.checkpoint, memo),
        "images": [_content(path, memo) for path in params.images],
        "videos": [_content(path, memo) for path in params.videos],
        "tapfiles": tapfiles,
        "patches": patches,
        "code": code_digest(package),
        "packages": {name: _version(name) for name in PACKAGES},
    }


def _changed(recorded: dict, now: dict) -> list[str]:
    """What differs between two :func:`reads` records, in words."""
    names = {
        "checkpoint": "the checkpoint's content",
        "images": "an image's bytes",
        "videos": "a video's bytes",
        "tapfiles": "an external engine's TapSet",
        "patches": "a hypothesis patch's source",
        "code": "driftscope's code",
        "packages": "the installed packages' versions",
    }
    return [what for key, what in names.items() if recorded.get(key) != now.get(key)]


def judged_under(data: dict, params: Parameters, contract: Any) -> str | None:
    """Why a report was not judged as ``params`` asks today (None: it was): its parameters digest, its contract
    (``contract``: the file's, loaded now; a report re-judged in place under another holds that one) or runtimes."""
    if data.get("parameters_digest") != params.digest:
        return "it is of other parameters"
    written = {k: v for k, v in (data.get("contract") or {}).items() if k != "source"}
    if written != {k: v for k, v in contract.to_dict().items() if k != "source"}:
        via = f" (re-judged from {data['rejudged_from']})" if data.get("rejudged_from") else ""
        return f"it was judged under another contract{via} than the parameter file's {params.contract or 'default'}"
    labels = [runtime.get("label") for runtime in data.get("runtimes") or []]
    if labels != [spec.display for spec in params.runtimes] or data.get("reference") != params.reference_label:
        return "its runtimes are not the parameter file's"
    return None


def stale_reason(
    data: dict, params: Parameters, recorded: dict | None = None, package: Path = PACKAGE_DIR
) -> str | None:
    """Why the finished report ``data`` cannot be reused for ``params`` now (None: it can). ``recorded``: what the
    run read, when it is kept elsewhere than the report (a batch's run record); ``package``: driftscope's package
    that would run the parameters."""
    from driftscope.judge.contract import load_contract

    if data.get("status") != "complete":
        return f"it did not complete ({data.get('status')})"
    try:
        why = judged_under(data, params, load_contract(params.contract))
    except DriftscopeError as err:
        return f"its parameters cannot be checked now ({err.problem})"
    if why:
        return why
    recorded = data.get("reads") if recorded is None else recorded
    if not isinstance(recorded, dict):
        return "it records no digests of what it read (an older driftscope wrote it)"
    changed = _changed(recorded, reads(params, package))
    return f"{', '.join(changed)} changed since it ran" if changed else None
