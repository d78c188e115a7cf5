"""Mixed precision: a half-precision policy with named operators kept in float32.

A precision policy file (what ``driftscope precision`` writes, and what a runtime entry's ``policy`` may be)::

    policy: {base: f16, f32: [vision.block.17-31.norm2]}

``f32`` lists operators by the stage they compute, with block ranges written ``a-b`` (``vision.block.17-31.norm2``
is norm2 of blocks 17 to 31) and ``*`` for every block. The runtime reads the expanded stage ids from its
``f32`` option: MLX widens those modules in place, the compiled emitters compute those operators in float32.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace

from driftscope.errors import ParameterError
from driftscope.model.precision import PrecisionPolicy

_RANGE = re.compile(r"^(?P<head>.*?\.)(?P<lo>\d+)-(?P<hi>\d+)(?P<tail>(\..*)?)$")
_EVERY = re.compile(r"^(?P<head>.*?\.)\*(?P<tail>(\..*)?)$")
_INDEXED = re.compile(r"^(?P<head>.*?\.)(?P<index>\d+)(?P<tail>\..+)$")


def expand(patterns: Iterable[str], depth: int | None = None) -> tuple[str, ...]:
    """The stage ids ``patterns`` name (``a-b`` ranges and ``*`` expanded; ``*`` needs ``depth``), sorted."""
    out: set[str] = set()
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern:
            raise ParameterError(f"f32 entry {pattern!r} is not a stage name", "write e.g. vision.block.17-31.norm2")
        ranged, every = _RANGE.match(pattern), _EVERY.match(pattern)
        if ranged:
            lo, hi = int(ranged["lo"]), int(ranged["hi"])
            if hi < lo:
                raise ParameterError(f"f32 entry {pattern!r} has an empty block range", "write the lower block first")
            out |= {f"{ranged['head']}{b}{ranged['tail']}" for b in range(lo, hi + 1)}
        elif every:
            if depth is None:
                raise ParameterError(f"f32 entry {pattern!r} needs the model's depth", "write a range, e.g. 0-31")
            out |= {f"{every['head']}{b}{every['tail']}" for b in range(depth)}
        else:
            out.add(pattern)
    return tuple(sorted(out, key=_order))


def _order(stage_id: str) -> tuple:
    indexed = _INDEXED.match(stage_id)
    if indexed:
        return (indexed["head"], indexed["tail"], int(indexed["index"]))
    return (stage_id, "", -1)


def compress(stage_ids: Iterable[str]) -> list[str]:
    """The shortest pattern list naming ``stage_ids``: consecutive blocks of one operator become ``a-b``."""
    groups: dict[tuple[str, str], list[int]] = {}
    plain: list[str] = []
    for stage_id in stage_ids:
        indexed = _INDEXED.match(stage_id)
        if indexed:
            groups.setdefault((indexed["head"], indexed["tail"]), []).append(int(indexed["index"]))
        else:
            plain.append(stage_id)
    out = sorted(set(plain))
    for (head, tail), blocks in sorted(groups.items(), key=lambda item: (item[0][1], item[0][0])):
        blocks = sorted(set(blocks))
        start = previous = blocks[0]
        for block in [*blocks[1:], None]:
            if block is not None and block == previous + 1:
                previous = block
                continue
            out.append(f"{head}{start}{tail}" if start == previous else f"{head}{start}-{previous}{tail}")
            if block is not None:
                start = previous = block
    return out


def with_float32(policy: PrecisionPolicy, stage_ids: Iterable[str]) -> PrecisionPolicy:
    """``policy`` with the operators computing ``stage_ids`` in float32 (its name says so)."""
    kept = tuple(sorted(set(stage_ids), key=_order))
    if not kept:
        return policy
    return replace(
        policy,
        name=f"{policy.name}+f32",
        description=f"{policy.description}; in float32: {', '.join(compress(kept))}",
        f32=kept,
    )


def parse_policy_entry(value: object, where: str) -> tuple[str, list[str]]:
    """A runtime entry's ``policy``: a name, or ``{base: NAME, f32: [stages]}`` -> (base name, f32 patterns)."""
    if isinstance(value, str):
        return value, []
    if isinstance(value, dict) and isinstance(value.get("base"), str):
        extra = sorted(set(value) - {"base", "f32"})
        f32 = value.get("f32", []) or []
        if isinstance(f32, str):
            f32 = [f32]
        if extra or not isinstance(f32, list) or not all(isinstance(s, str) for s in f32):
            raise ParameterError(
                f"{where} must be {{base: NAME, f32: [stage, ...]}}, got {value!r}",
                "write e.g. policy: {base: f16, f32: [vision.block.17-31.norm2]}",
            )
        return value["base"], list(f32)
    raise ParameterError(
        f"{where} must be str (a policy name) or {{base: NAME, f32: [...]}}, got {value!r}",
        "write e.g. policy: f16, or policy: {base: f16, f32: [vision.block.17-31.norm2]}",
    )
