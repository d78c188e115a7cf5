"""Environment fingerprint and the current commit, recorded in every report."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path

PACKAGES = ("driftscope", "numpy", "torch", "transformers", "mlx", "mlx-vlm", "safetensors", "papermill", "pandas")


def fingerprint() -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "packages": versions,
    }


def current_commit(repo: Path | None = None) -> str:
    """Short hash of HEAD (``-dirty`` when tracked files changed); ``nocommit`` outside a repository."""
    cwd = str(repo or Path.cwd())
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "nocommit"
    return f"{head}-dirty" if dirty else head
