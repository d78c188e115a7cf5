"""Tolerance contracts: per-stage-pattern tolerances, the failure rule and the verdict rule.

Failure rule (elementwise): ``|a - e| > atol + rtol * |e|`` with ``e`` the reference.
Integer stages (declared so by the stage plan) must be equal. A stage passes when its failures do not
exceed ``max_failure_fraction`` of its elements and no side has non-finite values the other lacks.
Every tolerance is a finite number >= 0 (NaN would make every comparison pass), and none judges nothing: ``rtol``
is below 1 (at 1 a candidate of zeros passes every element), ``atol``, ``peer_floor`` and ``peer_factor`` are at most
:data:`CEILING` (beyond any stage's scale; 1e308 overflows the bound to inf), ``max_failure_fraction`` at most
:data:`MAX_FAILURE_FRACTION` (a stage most of whose elements may fail is not judged).
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from driftscope.core.yamlfile import load_yaml
from driftscope.errors import ContractError

DEFAULT_ATOL = 0.08
DEFAULT_RTOL = 0.08


#: the teacher-forced answer's top-k tolerance keys (``judge.forced``): k -> contract key (None: every token).
#: They are not stages of a plan; a contract sets them like stage patterns, and a rule naming one never warns
#: "matches no stage".
FORCED_KEYS = {5: "text.forced.top5", 50: "text.forced.top50", 1000: "text.forced.top1000", None: "text.forced.all"}
#: the KV cache's stages (``judge.cache``): only a run that decodes has them, so their rule never warns either
CACHE_KEYS = (
    "text.cache.prefill.keys",
    "text.cache.prefill.values",
    "text.cache.forced.keys",
    "text.cache.forced.values",
)

DEFAULT_PEER_FACTOR = 4.0
DEFAULT_PEER_FLOOR = 1e-6
#: the largest ``atol``, ``peer_floor`` and ``peer_factor`` a contract may set: past it a tolerance judges nothing
CEILING = 1e3
MAX_FAILURE_FRACTION = 0.5
#: key -> (the largest value it may take, whether that value itself is allowed, why larger ones judge nothing)
_CEILINGS = {
    "atol": (CEILING, True, f"an absolute tolerance over {CEILING:g} is past any stage's scale"),
    "peer_floor": (CEILING, True, f"a floor over {CEILING:g} is past any stage's scale"),
    "peer_factor": (CEILING, True, f"a factor over {CEILING:g} lets any error through"),
    "rtol": (1.0, False, "at rtol >= 1 a candidate that outputs zeros passes every element"),
    "max_failure_fraction": (MAX_FAILURE_FRACTION, True, "a stage most of whose elements may fail is not judged"),
}


@dataclass(frozen=True)
class Tolerance:
    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    max_failure_fraction: float = 0.0
    skip: bool = False
    #: the peer-relative verdict (parameters ``relative: {peer: LABEL}``): a candidate's RMS error against the
    #: reference may be at most ``peer_factor`` times the trusted peer's, plus ``peer_floor``
    peer_factor: float = DEFAULT_PEER_FACTOR
    peer_floor: float = DEFAULT_PEER_FLOOR

    def bound(self, expected):
        """The largest error allowed at each reference value: ``atol + rtol * |expected|`` (array or scalar)."""
        return self.atol + self.rtol * np.abs(expected)


@dataclass(frozen=True)
class StageRule:
    pattern: str
    tolerance: Tolerance


@dataclass(frozen=True)
class Contract:
    """Tolerances per stage pattern; the first matching rule wins, else ``default``."""

    name: str = "default"
    default: Tolerance = Tolerance()
    rules: tuple[StageRule, ...] = ()
    growth_factor: float = 10.0
    source: str | None = None

    def tolerance(self, stage_id: str) -> Tolerance:
        for rule in self.rules:
            if fnmatch.fnmatchcase(stage_id, rule.pattern):
                return rule.tolerance
        return self.default

    def warnings(self, stage_ids: Iterable[str]) -> list[str]:
        """What a run should be told about this contract on these stages: rules that match none of them,
        and stages the contract skips (all of them: nothing is compared)."""
        stage_ids = list(stage_ids)
        out = [
            f"contract rule {rule.pattern!r} matches no stage of the plan"
            for rule in self.rules
            if not any(fnmatch.fnmatchcase(stage_id, rule.pattern) for stage_id in stage_ids)
            and not any(fnmatch.fnmatchcase(key, rule.pattern) for key in (*FORCED_KEYS.values(), *CACHE_KEYS))
        ]
        skipped = [stage_id for stage_id in stage_ids if self.tolerance(stage_id).skip]
        if stage_ids and len(skipped) == len(stage_ids):
            out.append(f"the contract skips every stage ({len(skipped)}): nothing is compared")
        elif skipped:
            out.append(f"the contract skips {len(skipped)} of {len(stage_ids)} stages (e.g. {skipped[0]})")
        return out

    def to_dict(self) -> dict:
        def tol(t: Tolerance) -> dict:
            return {
                "atol": t.atol,
                "rtol": t.rtol,
                "max_failure_fraction": t.max_failure_fraction,
                "skip": t.skip,
                "peer_factor": t.peer_factor,
                "peer_floor": t.peer_floor,
            }

        return {
            "name": self.name,
            "source": self.source,
            "rule": "|a - e| > atol + rtol * |e|",
            "default": tol(self.default),
            "stages": [{"pattern": r.pattern, **tol(r.tolerance)} for r in self.rules],
            "growth_factor": self.growth_factor,
        }

    @classmethod
    def from_dict(cls, data: dict, source: str | None = None) -> Contract:
        where = source or "contract"
        if not isinstance(data, dict):
            raise ContractError(f"{where} must be a mapping", "see parameters/contracts/default.yaml")
        known = {"name", "default", "stages", "growth_factor", "rule"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ContractError(f"{where} has unknown keys {unknown}", f"use only: {sorted(known)}")
        default = _tolerance(data.get("default") or {}, Tolerance(), f"{where}: default")
        rules = []
        for position, entry in enumerate(data.get("stages") or []):
            if not isinstance(entry, dict) or "pattern" not in entry:
                raise ContractError(
                    f"{where}: stages[{position}] needs a 'pattern'",
                    "write e.g. {pattern: 'vision.block.*', atol: 0.1}",
                )
            body = {k: v for k, v in entry.items() if k != "pattern"}
            rules.append(StageRule(str(entry["pattern"]), _tolerance(body, default, f"{where}: stages[{position}]")))
        growth = data.get("growth_factor", 10.0)
        if isinstance(growth, bool) or not isinstance(growth, (int, float)) or not math.isfinite(growth) or growth <= 1:
            raise ContractError(f"{where}: growth_factor must be a number > 1, got {growth!r}", "use e.g. 10")
        return cls(
            str(data.get("name", Path(source).stem if source else "contract")),
            default,
            tuple(rules),
            float(growth),
            source,
        )


def _tolerance(data: dict, base: Tolerance, where: str) -> Tolerance:
    if not isinstance(data, dict):
        raise ContractError(f"{where} must be a mapping", "write e.g. {atol: 0.08, rtol: 0.08}")
    fields = {
        "atol": float,
        "rtol": float,
        "max_failure_fraction": float,
        "skip": bool,
        "peer_factor": float,
        "peer_floor": float,
    }
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ContractError(f"{where} has unknown keys {unknown}", f"use only: {sorted(fields)}")
    values = {
        "atol": base.atol,
        "rtol": base.rtol,
        "max_failure_fraction": base.max_failure_fraction,
        "skip": False,
        "peer_factor": base.peer_factor,
        "peer_floor": base.peer_floor,
    }
    for key, kind in fields.items():
        if key in data:
            value = data[key]
            if kind is float and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0
            ):
                example = "0.0 (no failure allowed) up to 0.5" if key == "max_failure_fraction" else "0.08"
                raise ContractError(
                    f"{where}: {key} must be a finite, non-negative number, got {value!r}",
                    f"set {key} to a number such as {example} (.nan, .inf and negative values would judge nothing)",
                )
            if key in _CEILINGS:
                ceiling, inclusive, why = _CEILINGS[key]
                if value > ceiling or (value == ceiling and not inclusive):
                    bound = f"at most {ceiling:g}" if inclusive else f"below {ceiling:g}"
                    raise ContractError(
                        f"{where}: {key} {value!r} judges nothing ({why})",
                        f"set {key} {bound}, e.g. {Tolerance.__dataclass_fields__[key].default!r}",
                    )
            if kind is bool and not isinstance(value, bool):
                raise ContractError(f"{where}: {key} must be true or false, got {value!r}", f"set {key}: true")
            values[key] = kind(value)
    return Tolerance(**values)


def load_contract(path: str | Path | None) -> Contract:
    """Read a contract YAML; ``None`` gives the default contract (atol 0.08, rtol 0.08)."""
    if path is None:
        return Contract()
    path = Path(path)
    if not path.exists():
        raise ContractError(f"contract file {path} does not exist", "point 'contract' at a YAML file or remove it")
    try:
        data = load_yaml(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ContractError(f"contract {path} is not valid YAML: {err}", "fix the YAML syntax") from err
    return Contract.from_dict(data, str(path))
