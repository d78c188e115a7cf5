"""A checkpoint opened as a family's: validated, its family detected (or checked), and its processor output."""

from __future__ import annotations

from pathlib import Path

from driftscope.families import detect_family, get_family
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


def prepare_inputs(checkpoint: Checkpoint, image_paths: list[str | Path]) -> ModelInputs:
    """The checkpoint family's processor output for the images (``Family.prepare_inputs``)."""
    return get_family(checkpoint.family).prepare_inputs(checkpoint, image_paths)
