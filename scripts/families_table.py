"""The README's family table, drawn from the family registry and the sweep's own results (docs/sweep.json).

    .venv/bin/python scripts/families_table.py          # rewrite the README's table between its markers
    .venv/bin/python scripts/families_table.py --check  # exit 1 if the README's table is not this one

One row per deep family (what its folder adds: substages, geometry, mutations, the compiled path, quantized
policies), then one per model type the sweep ran through the generic family, with the sweep's verdict and, where
it failed, the first divergence and the ready patch that closes it (docs/families.md has each defect).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SWEEP = ROOT / "docs" / "sweep.json"
BEGIN, END = "<!-- families: begin -->", "<!-- families: end -->"
YES, NO = "yes", "—"

HEADER = (
    "| family | runtimes | blocks | substages | replay | answer | geometry | mutations | compiled path | quantized "
    "| transformers f32 vs mlx f32 |"
)


def _deep_rows() -> list[str]:
    from driftscope.capture.runtimes import get_runtime
    from driftscope.families import FAMILIES, GENERIC, get_family

    rows = []
    for name in FAMILIES.names():
        if name == GENERIC:
            continue
        family = get_family(name)
        engines = sorted(family.engines)
        replay = [r for r in engines if get_runtime(r).can_replay]
        decodes = [r for r in engines if get_runtime(r).decodes_with(name)]
        compiled = [r for r in engines if r in ("jax", "iree")]
        cells = [
            f"`{name}` ({', '.join(family.model_types)})",
            ", ".join(engines),
            YES,
            YES,
            ", ".join(replay) or NO,
            ", ".join(decodes) or NO,
            YES if family.geometry else NO,
            str(len(family.mutation_registry().names())),
            ", ".join(compiled) or NO,
            YES if family.quantization else NO,
            "its own tests",
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def _sweep_rows() -> list[str]:
    from driftscope.families import get_family

    if not SWEEP.exists():
        return []
    generic = get_family("generic")
    mutations = str(len(generic.mutation_registry().names()))
    rows = []
    for row in json.loads(SWEEP.read_text())["rows"]:
        result = _result(row)
        cells = [
            f"generic: `{row['model_type']}`",
            "transformers, mlx",
            YES,
            YES,
            "transformers, mlx",
            "transformers, mlx",
            NO,
            mutations,
            NO,
            NO,
            result,
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def _result(row: dict) -> str:
    """The sweep's finding for one model type, in a few words."""
    if row["verdict"] == "pass":
        return "pass at every aligned stage"
    if row["verdict"] == "could not run":
        return f"could not run: {(row.get('error') or '').splitlines()[0][:80]}"
    where = f"`{row['introduced_by'] or row['first_divergence']}`"
    fixes = row.get("fixed_by") or {}
    sides = " and ".join("mlx-vlm" if runtime == "mlx" else "transformers" for runtime in sorted(fixes)) or "a"
    found = f"{sides} defect at {where}"
    if not fixes:
        return found
    patches = ", ".join(f"`{patch}`" for patch in fixes.values())
    after = "passes" if row.get("fixed") == "pass" else f"still fails at `{row.get('fixed_divergence')}`"
    return f"{found}; with {patches} it {after}"


def table() -> str:
    lines = [HEADER, "|" + "---|" * HEADER.count(" | ") + "---|"]
    return "\n".join([*lines, *_deep_rows(), *_sweep_rows()])


def main(argv: list[str]) -> int:
    text = README.read_text()
    if BEGIN not in text or END not in text:
        print(f"README.md has no {BEGIN} ... {END} section")
        return 1
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    wanted = f"{head}{BEGIN}\n{table()}\n{END}{tail}"
    if "--check" in argv:
        if wanted != text:
            print("README.md's family table is out of date: run `.venv/bin/python scripts/families_table.py`")
            return 1
        return 0
    README.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
