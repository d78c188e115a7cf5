"""A checkpoint's structure as the generic family reads it: both libraries' probes, the alignment, and where
the vision tower, projector and decoder are. Made once per checkpoint (both models loaded one after the other,
each probed on a small input), kept in memory and in the cache folder (keyed by the checkpoint's files and the
libraries' versions)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from driftscope.core.atomic import write_json_atomic

from .align import Alignment
from .probe import SideProbe

#: bumped when what a structure holds or how it is made changes (older cached ones are then made again)
VERSION = 1


@dataclass
class Structure:
    """Both probes, their alignment, the transformers model's regions, and the processor's arrays."""

    torch: SideProbe
    mlx: SideProbe | None  # None when mlx-vlm could not load or run the checkpoint (``mlx_error`` says why)
    alignment: Alignment
    regions: dict[str, str | None]
    inputs: dict[str, dict] = field(default_factory=dict)  # processor array name -> {"rank", "integer"}
    mlx_error: str | None = None
    prompt: list[str] = field(default_factory=lambda: ["input_ids"])  # the prompt's per-token arrays

    def to_dict(self) -> dict:
        return {
            "version": VERSION,
            "torch": self.torch.to_dict(),
            "mlx": self.mlx.to_dict() if self.mlx else None,
            "alignment": self.alignment.to_dict(),
            "regions": self.regions,
            "inputs": self.inputs,
            "mlx_error": self.mlx_error,
            "prompt": self.prompt,
        }

    @classmethod
    def from_dict(cls, data: dict) -> Structure:
        return cls(
            SideProbe.from_dict(data["torch"]),
            SideProbe.from_dict(data["mlx"]) if data.get("mlx") else None,
            Alignment.from_dict(data["alignment"]),
            dict(data["regions"]),
            dict(data.get("inputs") or {}),
            data.get("mlx_error"),
            list(data.get("prompt") or ["input_ids"]),
        )


def structure_key(path: Path) -> str:
    """What the structure depends on: config.json, the weight files' headers and sizes, the libraries' versions."""
    digest = hashlib.sha256(f"generic-structure-{VERSION}".encode())
    for name in sorted(os.listdir(path)):
        file = path / name
        if name.endswith(".json"):
            digest.update(name.encode() + file.read_bytes())
        elif name.endswith(".safetensors"):
            with open(file, "rb") as handle:
                size = int.from_bytes(handle.read(8), "little")
                digest.update(name.encode() + handle.read(min(size, 1 << 26)))
            digest.update(str(file.stat().st_size).encode())
    digest.update(json.dumps(versions()).encode())
    for source in sorted(Path(__file__).parent.glob("*.py")):  # how a structure is read is part of what it is
        digest.update(source.read_bytes())
    return digest.hexdigest()[:24]


def versions() -> dict[str, str]:
    """The versions of the libraries a structure is read from."""
    import importlib.metadata

    found = {}
    for name in ("torch", "transformers", "mlx", "mlx-vlm"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "missing"
    return found


def cache_folder() -> Path:
    """``$DRIFTSCOPE_CACHE/generic``, else ``~/.cache/driftscope/generic``."""
    root = os.environ.get("DRIFTSCOPE_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "driftscope") / "generic"


_MEMO: dict[str, Structure] = {}


def cached(path: Path, make) -> Structure:
    """The structure of the checkpoint at ``path``: from memory, else the cache folder, else ``make()`` (then
    kept in both). A cache file that cannot be read is made again."""
    key = structure_key(path)
    if key in _MEMO:
        return _MEMO[key]
    file = cache_folder() / f"{key}.json"
    found = None
    if file.exists():
        try:
            data = json.loads(file.read_text())
            found = Structure.from_dict(data) if data.get("version") == VERSION else None
        except (ValueError, KeyError, TypeError):
            found = None
    if found is None:
        found = make()
        write_json_atomic(file, found.to_dict())
    _MEMO[key] = found
    return found
