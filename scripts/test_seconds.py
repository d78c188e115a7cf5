"""Write tests/file_seconds.json, each test file's measured seconds, from a JUnit XML of a whole run.

    .venv/bin/python -m pytest -n 2 --dist loadfile --junitxml=/tmp/suite.xml
    .venv/bin/python scripts/test_seconds.py /tmp/suite.xml

tests/conftest.py hands the files to the xdist workers slowest first (longest-processing-time order: the long
files start while the other worker still has short ones to fill in with, so neither idles at the end). The
figures only order the files: a stale table costs some balance, never a test; a file it does not name is
scheduled after the ones it does, as the default order would.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "tests" / "file_seconds.json"


def file_seconds(junit: Path) -> dict[str, float]:
    """``tests/<layer>/test_x.py`` -> the seconds of its tests (setup, call and teardown), largest first."""
    seconds: Counter[str] = Counter()
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "")
        parts = module.split(".")
        while parts and not parts[-1].startswith("test_"):  # a test class: tests.x.test_y.TestZ
            parts.pop()
        if parts:
            seconds["/".join(parts) + ".py"] += float(case.get("time") or 0.0)
    return {name: round(value, 1) for name, value in sorted(seconds.items(), key=lambda item: -item[1])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", type=Path, help="the JUnit XML of a whole default-suite run (--junitxml)")
    args = parser.parse_args(argv)
    table = file_seconds(args.junit)
    TABLE.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{TABLE.relative_to(ROOT)}: {len(table)} files, {sum(table.values()):.0f} s of tests")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
