"""The sections of a parameter file, each checked on its own: the shapes of values, ``stages``, ``text``,
``power``, ``relative``, ``attribution`` and ``family`` (``params`` assembles them into :class:`Parameters`)."""

from __future__ import annotations

from typing import Any

from driftscope.core.numeric import checked_floor, checked_ratio
from driftscope.errors import ParameterError
from driftscope.taps.stages import StageSelection

#: Each section's keys and what they do: the parser refuses any other key, and docs/parameters.md is generated
#: from these tables (``run.param_reference``; a test fails when the page is out of date).
STAGE_KEYS = {
    "blocks": "capture every block's output (default true)",
    "substages": "blocks whose substages (norms, q/k/v, attention, residuals, MLP pieces) are captured too: a "
    "list of block indices (negative counts from the end) or `all` (default none: narrowing adds what it needs)",
    "include": "stage id patterns (globs) to capture besides, e.g. `['vision.block.7.*']`",
    "exclude": "stage id patterns (globs) to leave out, e.g. `['vision.block.0.*']`",
}
TEXT_KEYS = {
    "prompt": "the prompt the image is asked with (default: a question about the image)",
    "max_new_tokens": "greedy tokens each runtime decodes (default 16, at least 1)",
    "expect": "words the reference's answer should contain, e.g. `[square, circle]` (default none)",
    "forced": "`auto` (default): a candidate is teacher-forced on the reference's tokens, with its top-k maps and KV-"
    "cache taps, where its answer is in question (tokens differ, a margin within its policy's band or out of "
    "tolerance); `always`: every candidate that decodes",
}
POWER_KEYS = {
    "mutations": "the family's registered mutations to run: `all` (default) or a list of names",
    "policy": "precision policy the mutated runtime runs in (default f32)",
    "require": "mutations the fixture must detect: one it cannot fails the run's verdict (default none)",
}
RELATIVE_KEYS = {
    "high": "label of the float64 runtime (e.g. `transformers:f64`), with `oracle`",
    "oracle": "label of the float32 oracle (e.g. `transformers:f32`) whose own error against `high` is the yardstick",
    "factor": "a candidate passes a stage when its error is at most factor x the oracle's (default 4)",
    "floor": "plus this absolute floor (default 1e-6)",
    "peer": "label of a trusted peer: every other candidate is judged relative to its error against the reference",
}
ATTRIBUTION_KEYS = {
    "candidate": "label of the runtime whose drift is attributed",
    "references": "two or more other runtime labels: per stage, the one the candidate is closer to",
}


def checked(value: Any, kind: type | tuple[type, ...], where: str, example: str) -> Any:
    kinds = _as_tuple(kind)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise ParameterError(f"{where} must be {names}, got {type(value).__name__} {value!r}", f"write e.g. {example}")
    return value


def _as_tuple(kind):
    return kind if isinstance(kind, tuple) else (kind,)


def refuse_unknown(data: dict, valid: set[str] | dict, where: str) -> None:
    unknown = sorted(set(data) - set(valid))
    if unknown:
        raise ParameterError(f"{where} has unknown keys {unknown}", f"valid keys: {', '.join(sorted(valid))}")


def stage_selection(data: Any) -> StageSelection:
    if data is None:
        return StageSelection()
    if data == "all":
        return StageSelection.everything()
    if data == "blocks":
        return StageSelection()
    checked(data, dict, "stages", "{substages: [3, 7]} or 'all' or 'blocks'")
    refuse_unknown(data, STAGE_KEYS, "stages")
    substages = data.get("substages", [])
    if substages != "all":
        checked(substages, list, "stages.substages", "[3, 7] or all")
        for index in substages:
            checked(index, int, "stages.substages entries", "block indices like 3 or -1")
        substages = tuple(substages)
    include = tuple(checked(data.get("include", []), list, "stages.include", "['vision.block.7.*']"))
    exclude = tuple(checked(data.get("exclude", []), list, "stages.exclude", "['vision.block.0.*']"))
    for where, patterns in (("include", include), ("exclude", exclude)):
        for pattern in patterns:
            checked(pattern, str, f"stages.{where} entries", "stage id patterns like 'vision.block.7.*'")
    return StageSelection(
        bool(checked(data.get("blocks", True), bool, "stages.blocks", "true")), substages, include, exclude
    )


def section(data: Any, where: str, keys: set[str] | dict, example: str) -> dict | None:
    """An optional mapping section: absent or false -> None, true -> {} (its defaults), else checked keys."""
    if data is None or data is False:
        return None
    if data is True:
        return {}
    checked(data, dict, where, example)
    refuse_unknown(data, keys, where)
    return data


def text_section(data: Any) -> dict | None:
    from driftscope.inputs.text_inputs import DEFAULT_PROMPT

    data = section(
        data,
        "text",
        TEXT_KEYS,
        "{prompt: 'Name the shapes.', max_new_tokens: 16, expect: [square]}",
    )
    if data is None:
        return None
    tokens = checked(data.get("max_new_tokens", 16), int, "text.max_new_tokens", "16")
    if tokens < 1:
        raise ParameterError(f"text.max_new_tokens must be at least 1, got {tokens}", "write e.g. 16")
    expect = checked(data.get("expect", []), list, "text.expect", "[square, circle, triangle]")
    forced = checked(data.get("forced", "auto"), str, "text.forced", "auto")
    if forced not in ("auto", "always"):
        raise ParameterError(f"text.forced must be auto or always, got {forced!r}", "write auto or always")
    return {
        "prompt": checked(data.get("prompt", DEFAULT_PROMPT), str, "text.prompt", "'Name the shapes.'"),
        "max_new_tokens": tokens,
        "expect": [str(word) for word in expect],
        "forced": forced,
    }


def video_section(data: Any) -> list:
    """The ``videos`` entries (paths, resolved by the caller): each video's frames become one grid with t > 1,
    packed after the images, and with ``text`` its tokens follow the images' in the prompt."""
    return checked(data if data is not None else [], list, "videos", "[fixtures/videos/shapes_4f.gif]")


def power_section(data: Any) -> dict | None:
    from driftscope.families import known_mutations
    from driftscope.model.policies import get_policy  # an unknown name lists the registered ones

    data = section(data, "power", POWER_KEYS, "{require: [identity_window_permutation]}")
    if data is None:
        return None
    names = data.get("mutations", "all")
    names = "all" if names == "all" else list(checked(names, list, "power.mutations", "[tanh_gelu]"))
    required = list(checked(data.get("require", []), list, "power.require", "[identity_window_permutation]"))
    known = known_mutations()
    for name in (names if names != "all" else []) + required:
        known.get(name)  # an unknown name lists the valid ones (the checkpoint's family is checked at run time)
    missing = [name for name in required if names != "all" and name not in names]
    return {
        "mutations": names if names == "all" else names + missing,
        "policy": get_policy(checked(data.get("policy", "f32"), str, "power.policy", "f32")).name,
        "require": required,
    }


def relative_section(relative: Any, labels: list[str], reference: str) -> dict | None:
    """The relative verdicts asked for: against a float64 run (high, oracle), against a trusted peer, or both."""
    if relative is None:
        return None
    example = "{high: transformers:f64, oracle: transformers:f32} or {peer: mlx:f32}"
    checked(relative, dict, "relative", example)
    refuse_unknown(relative, RELATIVE_KEYS, "relative")
    if "peer" not in relative and not {"high", "oracle"} & set(relative):
        raise ParameterError("relative names neither a float64 run (high, oracle) nor a peer", f"write {example}")
    out: dict = {}
    if {"high", "oracle"} & set(relative):
        for key in ("high", "oracle"):
            if relative.get(key) not in labels:
                raise ParameterError(
                    f"relative.{key} must name one of the runtimes {labels}",
                    "e.g. relative: {high: transformers:f64, oracle: transformers:f32}",
                )
        out.update(
            high=relative["high"],
            oracle=relative["oracle"],
            factor=checked_ratio(relative.get("factor", 4.0), "relative.factor", "4"),
            floor=checked_floor(relative.get("floor", 1e-6), "relative.floor", "1e-6"),
        )
    if "peer" in relative:
        if relative["peer"] not in labels or relative["peer"] == reference:
            raise ParameterError(
                f"relative.peer must name a runtime other than the reference {reference!r}: one of {labels}",
                "e.g. relative: {peer: mlx:f32} (its error against the reference is the yardstick)",
            )
        out["peer"] = relative["peer"]
    return out


def attribution_section(data: Any, labels: list[str]) -> dict | None:
    example = "{candidate: iree:q4-dequant, references: [mlx:q4, mlx:q4-dequant]}"
    data = section(data, "attribution", ATTRIBUTION_KEYS, example)
    if data is None:
        return None
    candidate = data.get("candidate")
    references = checked(data.get("references", []), list, "attribution.references", "[mlx:q4, mlx:q4-dequant]")
    named = [candidate, *references]
    if candidate not in labels or any(label not in labels for label in references):
        unknown = [label for label in named if label not in labels]
        raise ParameterError(
            f"attribution names runtimes {unknown} this run does not have", f"use labels from {labels}"
        )
    if len(set(references)) < 2 or candidate in references or len(set(references)) != len(references):
        raise ParameterError(
            f"attribution needs a candidate and at least two other, distinct references (got {candidate!r}, "
            f"{references})",
            f"write e.g. {example}",
        )
    return {"candidate": candidate, "references": list(references)}


def family_name(name: Any) -> str:
    from driftscope.families import get_family

    checked(name, str, "family", "a family name such as the checkpoint's model_type")
    return get_family(name).name  # an unknown name lists the registered ones


#: When set, relative paths of every parameter file resolve against this directory instead of the file's
#: repository: a batch runs a copy of a commit's parameter file (saved in the run's directory) in that
#: commit's worktree, and the notebooks' kernels inherit the variable.
