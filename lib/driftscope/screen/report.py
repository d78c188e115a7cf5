"""The screen's results on disk: ``screen.json`` (versioned, checked against :data:`SCHEMA` when read) and the
ranked table beside it, ``screen.csv`` and ``screen.parquet`` (one row per input and candidate), all written
atomically."""

from __future__ import annotations

import io
from pathlib import Path

from driftscope.core.atomic import write_bytes_atomic, write_json_atomic, write_text_atomic
from driftscope.errors import ReportError
from driftscope.screen.score import SCORE_TERMS

SCREEN_SCHEMA_VERSION = 1
SCREEN_NAME = "screen.json"

SCHEMA = {
    "type": "object",
    "required": ["schema_version", "kind", "status", "inputs", "ranking"],
    "properties": {
        "schema_version": {"const": SCREEN_SCHEMA_VERSION},
        "kind": {"const": "screen"},
        "status": {"enum": ["running", "complete"]},
        "parameters_digest": {"type": "string"},
        "reference": {"type": "string"},
        "candidates": {"type": "array", "items": {"type": "string"}},
        "score": {"type": "object"},
        "inputs": {
            "type": "array",
            "items": {"type": "object", "required": ["key", "images", "status", "score", "candidates"]},
        },
        "ranking": {"type": "array", "items": {"type": "string"}},
        "investigations": {"type": "array", "items": {"type": "object", "required": ["key", "dir"]}},
    },
}

#: the table's columns, in order: the input, then one candidate's metrics on it
COLUMNS = (
    "rank",
    "key",
    "input",
    "input_score",
    "candidate",
    "score",
    *(f"score_{term}" for term in SCORE_TERMS),
    "tower_stage",
    "tower_status",
    "tower_relative_error",
    "tower_max_abs",
    "tower_failures",
    "tower_elements",
    "tower_tolerance_used",
    "prefill_top1_agree",
    "prefill_margin_reference",
    "prefill_margin_candidate",
    "first_difference",
    "forced_first_divergence",
    "dropped_words",
    "reference_text",
    "candidate_text",
)


def rank(results: list[dict]) -> list[dict]:
    """Judged inputs by score (highest first; ties by the tower's share of its tolerance, then key), then the rest."""
    judged = [r for r in results if r.get("score") is not None]
    judged.sort(key=lambda r: (-r["score"], -(r.get("tie_break") or 0.0), r["key"]))
    return judged + sorted((r for r in results if r.get("score") is None), key=lambda r: r["key"])


def table_rows(ranked: list[dict]) -> list[dict]:
    rows = []
    for position, result in enumerate(ranked, 1):
        for label, entry in result["candidates"].items() or [(None, {})]:
            row = {
                "rank": position,
                "key": result["key"],
                "input": result["label"],
                "input_score": result.get("score"),
                "candidate": label,
            }
            for column in COLUMNS[len(row) :]:
                if column.startswith("score_"):
                    row[column] = (entry.get("terms") or {}).get(column.removeprefix("score_"))
                elif column == "dropped_words":
                    row[column] = " ".join(entry.get("dropped_words") or [])
                else:
                    row[column] = entry.get(column)
            rows.append(row)
    return rows


def write_table(out: Path, ranked: list[dict]) -> list[Path]:
    """``screen.csv`` and, where pyarrow is installed, ``screen.parquet``."""
    import pandas as pd

    frame = pd.DataFrame(table_rows(ranked), columns=list(COLUMNS))
    written = [write_text_atomic(Path(out) / "screen.csv", frame.to_csv(index=False))]
    try:
        buffer = io.BytesIO()
        frame.to_parquet(buffer, index=False)
    except ImportError:
        return written
    written.append(write_bytes_atomic(Path(out) / "screen.parquet", buffer.getvalue()))
    return written


def write_screen(out: Path, data: dict) -> Path:
    return write_json_atomic(
        Path(out) / SCREEN_NAME, {"schema_version": SCREEN_SCHEMA_VERSION, "kind": "screen", **data}
    )


def load_screen(path: Path) -> dict:
    """A ``screen.json`` (or its folder), checked against the schema."""
    import json

    from driftscope.core.validation import draft_2020_12

    path = Path(path)
    path = path / SCREEN_NAME if path.is_dir() else path
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ReportError(f"cannot read the screen report {path}: {err}", "run `driftscope screen` again") from None
    errors = sorted(draft_2020_12()(SCHEMA).iter_errors(data), key=lambda e: list(e.path))
    if errors:
        where = "".join(f"[{p!r}]" for p in errors[0].path) or "the report"
        raise ReportError(f"{path}: {where}: {errors[0].message}", "run `driftscope screen` again to rewrite it")
    return data
