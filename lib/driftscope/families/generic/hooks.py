"""What the generic pages ask of the generic family: it knows no geometry of its own (no token grid, no window
index), so the pages show what the processor made and the stages the two models gave."""

from __future__ import annotations

from pathlib import Path

from ...errors import ParameterError
from ..base import GeometryClaim, ImageTokens, Section


def input_overlay(inputs: dict, image: int) -> tuple[int | None, str]:
    """No patch grid is drawn: the generic family does not know where a token sits in the image."""
    return None, "as the processor resized it"


def token_layout(reference, unit: str | None, plan_meta: dict) -> list[ImageTokens]:
    """Where image tokens sit is a deep family's knowledge: none here (maps are drawn as rows)."""
    return []


def axis_sizes(config: dict, inputs=None) -> dict[str, int | str]:
    """Axes are named by position (``batch``, ``tokens``, ``hidden``, ``axisN``): sized by the capture itself."""
    return {}


def shapes_note(config: dict) -> str:
    return "the generic family reads every stage's shape from the two models' own forward (no formula per axis)"


def _no_geometry(*args, **kwargs):
    raise ParameterError(
        "the generic family has no geometry of its own (window index, crops, pooling are a deep family's knowledge)",
        "run `driftscope geometry` on a checkpoint of a deep family (qwen2_5_vl, qwen3_vl, molmo2), or compare "
        "stages with `driftscope run`",
    )


def geometry_claims(image_paths: list[Path], checkpoint: str | Path | None = None) -> list[GeometryClaim]:
    return []


def geometry_sections(image_paths: list[Path], checkpoint: str | Path | None = None, **options) -> list[Section]:
    _no_geometry()
    return []


def geometry_report(*args, **kwargs) -> str:
    _no_geometry()
    return ""
