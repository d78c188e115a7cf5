"""Where the checkout this package runs from keeps its notebooks, fixtures and outputs."""

from __future__ import annotations

from pathlib import Path

#: The repository root: ``lib/driftscope/core/paths.py`` is three folders below it.
REPO_ROOT = Path(__file__).resolve().parents[3]
