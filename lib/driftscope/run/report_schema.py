"""What a report.json must hold for ``show``, ``rejudge``, ``diff`` and the notebooks to read it: checked with
jsonschema when a report is loaded, so a report that was edited, truncated or written by something else says
what is wrong with it (a field and why) instead of failing deep inside a view."""

from __future__ import annotations

from typing import Any

VERDICTS = ["pass", "fail", "could not run", "error"]

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["schema_version", "status"],
    "properties": {
        "schema_version": {"type": "integer"},
        "status": {"enum": ["running", "complete", "error"]},
        "stopped_at": {"type": ["string", "null"]},
        "name": {"type": ["string", "null"]},
        "reference": {"type": ["string", "null"]},
        "progress": {"type": "array"},
        "verdict": {
            "type": "object",
            "required": ["status"],
            "properties": {
                "status": {"enum": VERDICTS},
                "per_candidate": {"type": "object", "additionalProperties": {"type": "string"}},
                "reasons": {"type": "array", "items": {"type": "string"}},
            },
        },
        "rows": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["stage", "status", "reference", "candidate", "position"],
                "properties": {
                    "stage": {"type": "string"},
                    "status": {"type": "string"},
                    "reference": {"type": "string"},
                    "candidate": {"type": "string"},
                    "position": {"type": "integer"},
                },
            },
        },
        "pairs": {
            "type": "array",
            "items": {"type": "object", "required": ["key", "reference", "candidate"]},
        },
        "runtimes": {"type": "array", "items": {"type": "object", "required": ["label"]}},
        "stage_plan": {"type": "array", "items": {"type": "object", "required": ["id"]}},
        "first_divergence": {"type": "object"},
        "coverage": {"type": "object"},
        # what the run read, by content (run.reuse): a reuse of the finished run checks it
        "reads": {"type": "object"},
        "checks": {"type": "object"},
        # driftscope precision's searches, by candidate label (added after the run; absent until one ran)
        "precision": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "required": ["candidate", "closes", "probes"],
                "properties": {"closes": {"type": "boolean"}, "probes": {"type": "array"}},
            },
        },
        # the reference's taps came from (or went into) the reference cache: run.refcache
        "reference_cache": {
            "type": "object",
            "required": ["status", "entry", "key"],
            "properties": {
                "label": {"type": "string"},
                "status": {"enum": ["hit", "stored", "miss"]},
                "entry": {"type": "string"},
                "key": {"type": "string"},
                "stored": {"type": ["object", "null"]},
                "refused": {"type": "string"},
            },
        },
        # the processor output every runtime was fed; ``cache``: whether it came from (or went into) the inputs
        # cache (run.inputcache), absent when that cache is off
        "inputs": {
            "type": "object",
            "properties": {
                "digest": {"type": "string"},
                "cache": {
                    "type": "object",
                    "required": ["status", "entry", "key"],
                    "properties": {
                        "status": {"enum": ["hit", "stored", "miss"]},
                        "entry": {"type": "string"},
                        "key": {"type": "string"},
                        "stored": {"type": ["object", "null"]},
                        "refused": {"type": "string"},
                        "reused_s": {"type": "number"},
                        "prepared_s": {"type": "number"},
                        "store_error": {"type": "string"},
                    },
                },
            },
        },
    },
    # a finished run has been judged: it has a verdict and rows
    "if": {"properties": {"status": {"const": "complete"}}},
    "then": {"required": ["verdict", "rows"]},
}


def schema_problem(data: object) -> str | None:
    """The first way ``data`` breaks the report schema, as ``where: what`` (None when it holds)."""
    from driftscope.core.validation import draft_2020_12

    errors = sorted(draft_2020_12()(SCHEMA).iter_errors(data), key=lambda error: list(error.path))
    if not errors:
        return None
    error = errors[0]
    where = "".join(f"[{part!r}]" if isinstance(part, str) else f"[{part}]" for part in error.path) or "the report"
    return f"{where}: {error.message}"
