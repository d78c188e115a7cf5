"""Checkpoint directories: validation (safetensors only). Opening one, which also detects its family, is
``driftscope.families.checkpoints.open_checkpoint``."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from driftscope.errors import CheckpointError, some

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


@dataclass(frozen=True)
class Checkpoint:
    """A validated local checkpoint directory."""

    path: Path
    config: dict
    family: str

    @property
    def name(self) -> str:
        return self.path.name


def _check_weights(file: Path) -> dict:
    """Refuse a safetensors file whose header is unreadable or describes more bytes than the file holds; its
    tensors (name -> header entry)."""
    from driftscope.model.weightfile import read_header

    fix = f"re-save or copy the checkpoint again: {file.name} is incomplete or damaged"
    try:
        entries = read_header(file)
    except (OSError, ValueError, UnicodeDecodeError, struct.error, KeyError, TypeError, IndexError) as err:
        raise CheckpointError(f"{file} is not a readable safetensors file ({type(err).__name__}: {err})", fix) from None
    size = file.stat().st_size
    end = max((entry.start + entry.nbytes for entry in entries.values()), default=0)
    if end > size:
        raise CheckpointError(f"{file} is truncated: its header describes {end} bytes, the file has {size}", fix)
    return entries


#: safetensors dtypes of weights stored as 8-bit integers: a quantized format (e.g. int8) no runtime here reads as
#: it is (MLX-community 4/8-bit checkpoints pack their codes into U32 next to float scales, and load)
INTEGER_WEIGHTS = ("I8", "U8")


def _refuse_integer_weights(path: Path, tensors: dict[str, dict]) -> None:
    """Refuse a checkpoint whose weights are 8-bit integers: every runtime would fail at capture, or worse, cast."""
    found = sorted(
        name for entries in tensors.values() for name, entry in entries.items() if entry.dtype in INTEGER_WEIGHTS
    )
    if found:
        shown = some(found)
        raise CheckpointError(
            f"checkpoint {path} stores weights as 8-bit integers ({shown}): driftscope loads float weights (or "
            "MLX-community quantized directories)",
            "point at the float checkpoint, and run a quantized policy (q8, q8-dequant, ...) on it",
        )


def _check_index(path: Path, tensors: dict[str, set[str]]) -> None:
    """Refuse a sharded checkpoint whose index does not list every tensor its shards hold, or lists one that its
    shard lacks: a loader that follows the index would leave the unlisted ones at their random initialisation."""
    index_path = path / "model.safetensors.index.json"
    if not index_path.exists():
        return
    try:
        weight_map = dict(json.loads(index_path.read_text())["weight_map"])
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointError(
            f"{index_path} is not a safetensors index ({type(err).__name__}: {err})",
            "re-save the checkpoint with save_pretrained (or remove the index of an unsharded checkpoint)",
        ) from None
    held = {name: file for file, names in tensors.items() for name in names}
    unlisted = sorted(set(held) - set(weight_map))
    dangling = sorted(name for name, file in weight_map.items() if name not in tensors.get(str(file), ()))
    for names, what in (
        (unlisted, "are in the shards but not in its index"),
        (dangling, "are in its index but not in the shard it names"),
    ):
        if names:
            shown = some(names)
            raise CheckpointError(
                f"checkpoint {path}: tensors {shown} {what}",
                "re-save the checkpoint with save_pretrained, or rewrite model.safetensors.index.json from its shards",
            )


def validate_checkpoint(path: str | Path) -> tuple[Path, dict]:
    """Validate ``path`` as a safetensors checkpoint: its resolved path and its config."""
    path = Path(path).expanduser()
    if not path.exists():
        raise CheckpointError(
            f"checkpoint path {path} does not exist",
            "point 'checkpoint' at a local directory with config.json and *.safetensors "
            "(for the tiny fixture run `make fixtures`; relative paths in a parameter file resolve against the "
            "repository holding it, or its own folder outside a repository)",
        )
    if not path.is_dir():
        raise CheckpointError(f"checkpoint path {path} is a file, not a directory", "pass the directory that holds it")
    config_path = path / "config.json"
    safetensors = sorted(path.glob("*.safetensors"))
    pickles = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if not safetensors:
        if pickles:
            raise CheckpointError(
                f"checkpoint {path} has only pickle weights ({', '.join(pickles[:3])}); "
                "driftscope loads safetensors only",
                "convert once with transformers: model = AutoModel...from_pretrained(dir); "
                "model.save_pretrained(new_dir, safe_serialization=True)",
            )
        raise CheckpointError(
            f"checkpoint {path} has no *.safetensors weights",
            "save the model with save_pretrained(..., safe_serialization=True) into this directory",
        )
    tensors = {file.name: _check_weights(file) for file in safetensors}
    _check_index(path, tensors)
    _refuse_integer_weights(path, tensors)
    if not config_path.exists():
        raise CheckpointError(f"checkpoint {path} has no config.json", "save the model's config with save_pretrained")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{config_path} is not valid JSON: {err}", "re-save the config") from err
    return path.resolve(), config
