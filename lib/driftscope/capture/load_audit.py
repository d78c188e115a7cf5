"""The load audit: every parameter a runtime loaded equals the checkpoint's tensor under the transform its family
declares (``Family.load_layout``, ``model.load_layout``), checked right after the load, before any capture and
before a hypothesis patch changes anything.

Per loaded parameter: the checkpoint tensor its family's declaration names, transformed (transposed, split,
stacked) and cast to the dtype the runtime holds, must be equal to it, bit for bit. A tensor over
``FULL_ELEMENTS`` elements is checked on ``SAMPLED_ROWS`` rows spread over its first axis (the record says so).
A parameter no checkpoint tensor makes (random values a loader filled in), a checkpoint tensor the runtime does
not hold, and a value that differs are each findings, named by tensor. On the reference a finding stops the run
(nothing can be compared against a wrongly loaded reference); on a candidate it is that candidate's finding: its
check ``load audit`` fails and its pairs with it. Weights a runtime reads only later (the compiled path's text
decoder, read at the text capture) are audited when read, under the family's ``LoadLayout.later`` declaration
(:func:`audit_later_part`), into the same record.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any

import numpy as np

from driftscope.errors import CheckpointError
from driftscope.model.load_layout import Held, LoadLayout

#: checked whole up to this many elements (1 M: 4 MB in float32); a larger tensor on sampled rows. At 4 M the 3B
#: shape's audit read 1.47 GiB of the checkpoint again right after the load, most of it from the disk: a runtime
#: holding 14 GiB leaves the page cache too little to keep the file; at 1 M it reads 0.2 GiB.
FULL_ELEMENTS = 1 << 20
SAMPLED_ROWS = 16
SHOWN = 5  # findings named in a message


class LoadAuditError(CheckpointError):
    """The reference runtime did not load what its checkpoint holds."""


def _rename(name: str, layout: LoadLayout) -> str:
    name = layout.names.get(name, name)
    for pattern, replacement in layout.renames:
        name = re.sub(pattern, replacement, name)
    return name


def declared(layout: LoadLayout, names: list[str]) -> dict[str, tuple[tuple[str, ...], Held]]:
    """Loaded name -> (the checkpoint tensors it is made of, how) for every checkpoint tensor ``names``."""
    renamed = {_rename(name, layout): name for name in names}
    out: dict[str, tuple[tuple[str, ...], Held]] = {}
    for new, original in renamed.items():
        if any(fnmatch.fnmatchcase(new, pattern) for pattern in layout.not_held):
            continue  # the runtime holds it under no name of its own
        rule = next((r for r in layout.rules if re.fullmatch(r.pattern, new)), None)
        for held in rule.held if rule is not None else (Held(),):
            target = re.sub(rule.pattern, held.name, new) if rule is not None else new
            sources = held.sources or (original,)
            out[target] = (sources, held)
    return out


def _sampled(shape: tuple[int, ...], held: Held) -> np.ndarray | None:
    """Rows of the first axis to check, or None to check the whole tensor (small, or an operation moves rows)."""
    size = int(np.prod(shape)) if shape else 1
    keeps_rows = all(
        (op[0] == "transpose" and op[1][0] == 0) or (op[0] == "half" and op[1] % len(shape) != 0) for op in held.ops
    )
    if size <= FULL_ELEMENTS or not shape or not keeps_rows or held.sources[1:]:
        return None
    return np.unique(np.linspace(0, shape[0] - 1, SAMPLED_ROWS).round().astype(np.int64))


def held_value(files, sources: tuple[str, ...], held: Held, rows: np.ndarray | None) -> np.ndarray:
    """The value a runtime holds made from the checkpoint's ``sources`` under ``held``'s operations (the whole
    tensor, or its ``rows``), read through ``files`` (``read``, ``read_rows``: ``TensorFiles`` or a memory map)."""
    if rows is not None:
        value = files.read_rows(sources[0], rows)
    elif len(sources) == 1:
        value = files.read(sources[0])
    else:
        value = np.concatenate([files.read(source) for source in sources], axis=0)
    for op in held.ops:
        if op[0] == "transpose":
            value = value.transpose(op[1])
        elif op[0] == "half":
            axis, which = op[1], op[2]
            size = value.shape[axis] // 2
            value = np.take(value, np.arange(which * size, (which + 1) * size), axis=axis)
        elif op[0] == "rows":
            value = value[op[1] : op[2]]
        elif op[0] == "reshape":
            value = value.reshape(op[1])
    return value


def _cast(value: np.ndarray, dtype: str) -> np.ndarray:
    """``value`` rounded to the runtime's dtype (as its loader casts: round to nearest even), as float64."""
    if dtype == "bfloat16":
        import ml_dtypes

        return value.astype(ml_dtypes.bfloat16).astype(np.float64)
    return value.astype(dtype).astype(np.float64) if dtype in ("float16", "float32", "float64") else value


def tensors_of(arrays: dict[str, np.ndarray]) -> dict:
    """``arrays`` as a runtime's ``loaded_tensors`` gives them: ``{name: (shape, dtype, rows -> array)}``."""
    return {
        name: (tuple(value.shape), str(value.dtype), lambda rows, v=value: v if rows is None else v[rows])
        for name, value in arrays.items()
    }


def compare(files, layout: LoadLayout, loaded: dict) -> tuple[int, list[str], list[str]]:
    """(how many parameters were checked, the names checked on sampled rows, the findings) of ``loaded``
    (``{name: (shape, dtype, rows -> array)}``) against the checkpoint ``files`` under ``layout``."""
    wanted = declared(layout, files.names())
    findings, checked, sampled = [], 0, []
    for name, (shape, dtype, rows_of) in loaded.items():
        if name not in wanted:
            if not any(fnmatch.fnmatchcase(name, p) for p in layout.not_from_checkpoint):
                findings.append(f"{name}: loaded, but no checkpoint tensor makes it (random values a loader filled?)")
            continue
        sources, held = wanted[name]
        rows = _sampled(shape, held)
        expected = held_value(files, sources, held, rows)
        if tuple(expected.shape) != (tuple(shape) if rows is None else (len(rows), *shape[1:])):
            made = list(expected.shape)
            findings.append(f"{name}: held as {list(shape)}, the checkpoint's {sources[0]} makes {made}")
            continue
        actual = rows_of(rows)
        checked += 1
        if rows is not None:
            sampled.append(name)
        if not np.array_equal(_cast(expected, dtype), np.asarray(actual, dtype=np.float64)):
            differ = int(np.count_nonzero(_cast(expected, dtype) != np.asarray(actual, dtype=np.float64)))
            findings.append(
                f"{name}: {differ} of {expected.size} values differ from the checkpoint's {sources[0]} "
                f"under the declared transform {list(held.ops) or 'none'}"
            )
    for name in sorted(set(wanted) - set(loaded)):
        findings.append(f"{name}: the checkpoint holds {wanted[name][0][0]}, the runtime does not hold it")
    return checked, sampled, findings


def audit(runtime: Any) -> dict:
    """The audit record of ``runtime``'s loaded model: what was checked, how, and every finding."""
    from driftscope.model.weightfile import TensorFiles

    layout = runtime.family.load_layout(runtime.name, runtime.checkpoint)
    if layout is None:
        return {"status": "not declared", "detail": f"the {runtime.family.name} family declares no layout for "
                f"{runtime.name}: its load was not audited"}  # fmt: skip
    checked, sampled, findings = compare(TensorFiles(runtime.checkpoint.path), layout, runtime.loaded_tensors())
    return {
        **_outcome(runtime, checked, len(sampled), findings),
        "corrected": list(runtime.load_corrections),
        "notes": list(layout.notes),
    }


def audit_later_part(runtime: Any, part: str, loaded: dict) -> None:
    """Add to ``runtime.load_audit`` the audit of the weights it read after its load (``loaded``: ``part``, e.g.
    the compiled path's text side, read at the text capture) under its family's ``LoadLayout.later[part]``; on the
    reference a finding stops it. Nothing where the family declares no such part or the load was not audited."""
    from driftscope.model.weightfile import TensorFiles

    record = runtime.load_audit
    if record is None or record.get("status") not in ("pass", "fail") or part in record.get("parts", []):
        return  # not audited at load (quantized, undeclared), or this part already was
    layout = runtime.family.load_layout(runtime.name, runtime.checkpoint)
    if layout is None or part not in layout.later:
        return
    checked, sampled, findings = compare(TensorFiles(runtime.checkpoint.path), layout.later[part], loaded)
    record.update(
        _outcome(
            runtime,
            record["checked"] + checked,
            record["sampled"]["tensors"] + len(sampled),
            [*record["findings"], *findings],
        ),
        notes=[*record["notes"], *layout.later[part].notes],
        parts=[*record.get("parts", []), part],
    )
    if runtime.strict_audit:
        refuse_reference(record, runtime)


def _outcome(runtime: Any, checked: int, sampled: int, findings: list[str]) -> dict:
    """The record's verdict fields: status, what was checked (``sampled``: how many tensors on sampled rows), the
    findings and the detail that says it."""
    return {
        "status": "fail" if findings else "pass",
        "checked": checked,
        "sampled": {"tensors": sampled, "rows": SAMPLED_ROWS, "over_elements": FULL_ELEMENTS},
        "findings": findings,
        "detail": _detail(runtime, checked, sampled, findings),
    }


def _detail(runtime: Any, checked: int, sampled: int, findings: list[str]) -> str:
    how = f"{checked} parameters equal the checkpoint's tensors under the declared transforms" + (
        f" ({sampled} over {FULL_ELEMENTS} elements on {SAMPLED_ROWS} sampled rows each)" if sampled else ""
    )
    if not findings:
        return how
    more = f" and {len(findings) - SHOWN} more" if len(findings) > SHOWN else ""
    return f"{runtime.label} did not load what the checkpoint holds: " + "; ".join(findings[:SHOWN]) + more


def refuse_reference(record: dict, runtime: Any) -> None:
    """Stop the run when the reference's load audit has findings (nothing can be compared against it)."""
    if record.get("findings"):
        raise LoadAuditError(
            record["detail"],
            "the reference must hold exactly the checkpoint's weights: check the family's declared layout and the "
            "loader (transformers' own load: options.load_fixes), or make another runtime the reference",
        )


def audit_runtime(runtime: Any) -> dict:
    """``runtime``'s load audit record (a quantized policy's weights are the quantization checks' own); on the
    reference (``runtime.strict_audit``) a finding stops it."""
    if runtime.quantized is not None:
        return {"status": "not audited", "detail": "quantized weights: the quantization checks own them"}
    record = audit(runtime)
    if runtime.strict_audit:
        refuse_reference(record, runtime)
    return record


def audit_summary(record: dict) -> dict:
    """The load audit as a sidecar keeps it (so a cached reference capture still says how it was loaded)."""
    keep = ("status", "checked", "sampled", "corrected", "notes", "detail", "parts")
    return {key: record[key] for key in keep if key in record} | {"findings": list(record.get("findings") or [])[:20]}
