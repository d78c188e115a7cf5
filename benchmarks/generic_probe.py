"""Each tester-config tiny checkpoint (``driftscope.families.generic``) built, loaded and run in transformers and in
mlx-vlm, with the max |difference| of their last-position prefill logits (f32), one image at a time.

    .venv/bin/python benchmarks/generic_probe.py [MODEL_TYPE ...] [--images PNG ...] [--out DIR] [--json FILE]
                                                 [--unadjusted]

Prints a Markdown table (the one in docs/families.md) and, with ``--json``, writes the rows. A library that cannot
load or run a checkpoint leaves its own error in the row; ``benchmarks/generic_probe.py MODEL_TYPE`` reproduces it.
``--unadjusted`` builds the testers' settings as they are, without the changes ``testers.ADJUSTMENTS`` makes (what
mlx-vlm does with the testers' own configs).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ("shapes_448.png", "shapes_448x672.png")


def cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1e}"
    return str(value).replace("|", "/")


def table(rows: list[dict]) -> str:
    lines = [
        "| model type | image | builds | loads (transformers / mlx-vlm) | runs (transformers / mlx-vlm) "
        "| image tokens | max abs logits diff | max abs logit | inputs from |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        loads = f"{cell(row['transformers_load'])} / {cell(row['mlx_load'])}"
        runs = f"{cell(row['transformers_run'])} / {cell(row['mlx_run'])}"
        lines.append(
            f"| {row['model_type']} | {row['image']} | {'yes' if row['built'] else 'no'} | {loads} | {runs} "
            f"| {sum(row['image_tokens'])} | {cell(row['max_abs'])} | {cell(row['logits_max'])} | {row['processor']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    from driftscope.model.blas import mlx_blas

    mlx_blas()  # before the first `import mlx.core`
    from driftscope.families.generic.testers import model_types
    from driftscope.families.generic.tiny_probe import probe

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_types", nargs="*", default=model_types())
    parser.add_argument("--images", nargs="*", default=[str(ROOT / "fixtures" / "images" / name) for name in IMAGES])
    parser.add_argument("--out", help="where the checkpoints are built (default: a temporary folder)")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--unadjusted", action="store_true", help="the testers' settings without our adjustments")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(args.out or scratch)
        for model_type in args.model_types:
            for image in args.images:
                row = probe(model_type, out / f"generic-{model_type}", [image], adjusted=not args.unadjusted).as_dict()
                row["image"] = Path(image).name
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
