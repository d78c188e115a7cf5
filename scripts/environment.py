"""Write environment.yml, the conda mirror of requirements.txt, from requirements.txt itself (the same pins).

    .venv/bin/python scripts/environment.py           # rewrite environment.yml
    .venv/bin/python scripts/environment.py --check   # exit 1 when it is out of date

requirements.txt stays the one exact pin set of this repository's .venv (`make setup`); pyproject.toml holds the
loose bounds a user's install gets. ``tests/core/test_packaging.py`` runs the check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADER = """\
# Generated from requirements.txt by scripts/environment.py (the same exact pins; do not edit by hand).
# `make setup` does not use it; it builds .venv with pip. With conda:
#   conda env create -f environment.yml && conda activate driftscope && pip install -e . --no-deps
# torch==2.13.0 is the CPU wheel: install it first on its own (pip install torch==2.13.0).
name: driftscope
channels:
  - conda-forge
dependencies:
  - python=3.11
  - pip
  - pip:
"""


def pins(requirements: str) -> list[str]:
    """Every requirement line of ``requirements.txt`` (comments kept after the pin, blank and comment lines not)."""
    lines = []
    for line in requirements.splitlines():
        pin, _, comment = line.partition("#")
        if pin.strip():
            lines.append(f"      - {pin.strip()}" + (f"  # {comment.strip()}" if comment.strip() else ""))
    return lines


def environment_yml(requirements: str) -> str:
    return HEADER + "\n".join(pins(requirements)) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that environment.yml is current")
    args = parser.parse_args(argv)
    text = environment_yml((ROOT / "requirements.txt").read_text(encoding="utf-8"))
    target = ROOT / "environment.yml"
    if args.check:
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            print("environment.yml is out of date: run `.venv/bin/python scripts/environment.py`")
            return 1
        return 0
    target.write_text(text, encoding="utf-8")
    print("wrote environment.yml")
    return 0


if __name__ == "__main__":
    sys.exit(main())
