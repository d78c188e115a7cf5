"""Model families: each builds the StagePlan for a checkpoint's config."""

from __future__ import annotations

from collections.abc import Callable

from ..registry import Registry
from ..stages import StagePlan
from . import qwen2_5_vl

FAMILIES: Registry[Callable[[dict], StagePlan]] = Registry("model family")
FAMILIES.register("qwen2_5_vl", qwen2_5_vl.vision_plan)


def stage_plan(family: str, config: dict) -> StagePlan:
    """The vision StagePlan of ``family`` for a checkpoint ``config`` (its config.json as a dict)."""
    return FAMILIES.get(family)(config)
