"""A checkpoint opened as a family's: validated, its family detected (or checked), and its processor output."""

from __future__ import annotations

from pathlib import Path

from driftscope.errors import InputError
from driftscope.families import FAMILIES, detect_family, get_family
from driftscope.inputs.processor_output import ModelInputs
from driftscope.model.checkpoint import Checkpoint, validate_checkpoint


def open_checkpoint(path: str | Path, family: str | None = None) -> Checkpoint:
    """Validate ``path`` as a safetensors checkpoint, detect (or check) its family, and let the family refuse a
    config its runtimes cannot run."""
    resolved, config = validate_checkpoint(path)
    name = detect_family(config, family)
    check = get_family(name).check_config
    if check is not None:
        check(config)
    return Checkpoint(resolved, config, name)


def prepare_inputs(
    checkpoint: Checkpoint, image_paths: list[str | Path], video_paths: list[str | Path] = ()
) -> ModelInputs:
    """The checkpoint family's processor output for the images and the videos (``Family.prepare_inputs``); a
    family that takes no video refuses videos, naming the families that do."""
    family = get_family(checkpoint.family)
    if not video_paths:
        return family.prepare_inputs(checkpoint, image_paths)
    if not family.videos:
        takers = sorted(name for name in FAMILIES.names() if get_family(name).videos)
        raise InputError(
            f"model family {family.name!r} takes no video input in driftscope "
            f"(videos: {[str(p) for p in video_paths]})",
            f"pass the frames you mean as still images under 'images', or compare a video on a family that takes "
            f"videos ({', '.join(takers)})",
        )
    return family.prepare_inputs(checkpoint, image_paths, video_paths=list(video_paths))
