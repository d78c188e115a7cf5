"""Where driftscope finds what it ships and where it writes, with no repository assumed around the package.

- What ships in the package: the notebooks, the default tolerance contracts, the demo's small inputs.
- Outputs: ``outputs/`` of the git repository that holds the parameter file (its commit names the run's folder),
  else ``./outputs`` of the current folder; ``--out`` on the command line puts a run anywhere.
- Caches (compiled artifacts, the reference's taps, prepared inputs, JAX executables): the platform's user cache
  folder (``~/.cache/driftscope`` on Linux, ``~/Library/Caches/driftscope`` on macOS), or ``$DRIFTSCOPE_CACHE``.
"""

from __future__ import annotations

import os
from pathlib import Path

#: the installed package's own folder
PACKAGE = Path(__file__).resolve().parents[1]
#: the parameterized notebooks (a repository's top-level ``notebooks/`` links here)
NOTEBOOKS = PACKAGE / "notebooks"
#: the default tolerance contracts (``default``, ``strict``, ``q4_f16``; a repository's ``parameters/contracts``
#: links here)
CONTRACTS = PACKAGE / "contracts"
#: the demo's small inputs: its images
DEMO_IMAGES = PACKAGE / "demo" / "images"

#: the variable that moves every cache of driftscope
CACHE_VARIABLE = "DRIFTSCOPE_CACHE"

#: The source checkout's root when the package runs from one (``lib/driftscope`` two folders below it): only the
#: repository's own fixtures (the families' tiny test checkpoints) are found through it; nothing a run writes.
REPO_ROOT = PACKAGE.parents[1]


def contract_file(value: str) -> Path:
    """A contract named by a parameter file or ``--contract``: a contract driftscope ships, by its name (``default``,
    ``strict``, ``q4_f16``), else the path as given."""
    shipped = CONTRACTS / f"{value}.yaml"
    return shipped if "/" not in value and shipped.is_file() else Path(value)


def cache_root() -> Path:
    """driftscope's cache folder: ``$DRIFTSCOPE_CACHE``, else the platform's user cache folder for driftscope."""
    given = os.environ.get(CACHE_VARIABLE, "").strip()
    if given:
        return Path(given).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("driftscope", appauthor=False))


def repository_of(path: str | Path) -> Path | None:
    """The nearest folder holding ``path`` (a file or folder) that holds a ``.git``: its git repository."""
    folder = Path(path).resolve()
    for candidate in (folder, *folder.parents):
        if (candidate / ".git").exists():
            return candidate
    return None


def project_root(anchor: str | Path | None = None) -> Path:
    """The folder a run's outputs and commit belong to: the git repository holding ``anchor`` (a parameter file),
    else the one holding the current folder, else the current folder itself."""
    for start in (Path(anchor).resolve().parent if anchor else None, Path.cwd()):
        found = repository_of(start) if start is not None else None
        if found is not None:
            return found
    return Path.cwd()


def outputs_root(anchor: str | Path | None = None) -> Path:
    """``outputs/`` of :func:`project_root` (the default root of every run, batch, screen, diff and trend)."""
    return project_root(anchor) / "outputs"
