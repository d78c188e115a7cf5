"""Write docs/parameters.md, every key a parameter file may hold, from the parser's own key tables.

    .venv/bin/python scripts/parameters_doc.py           # rewrite the page
    .venv/bin/python scripts/parameters_doc.py --check   # exit 1 when the page is out of date

The page is ``driftscope.run.param_reference.parameters_markdown()``; ``tests/run/test_param_reference.py`` runs
the check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from driftscope.run.param_reference import PAGE, parameters_markdown  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help=f"only check that {PAGE} is current")
    args = parser.parse_args(argv)
    page = ROOT / PAGE
    text = parameters_markdown()
    if args.check:
        if not page.exists() or page.read_text(encoding="utf-8") != text:
            print(f"{PAGE} is out of date: run `.venv/bin/python scripts/parameters_doc.py`")
            return 1
        return 0
    page.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
