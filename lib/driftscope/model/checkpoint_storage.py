"""What a checkpoint stores, as shipped: dtypes per tensor group, shards and the index file that lists them.

Recorded in every report so a policy can be checked against the weights it started from (a ``bf16``
checkpoint run under ``f32`` must be cast, and the report shows both sides of that).
"""

from __future__ import annotations

import json
import struct
from collections import Counter
from pathlib import Path

from driftscope.errors import CheckpointError
from driftscope.model.weightfile import read_header

#: tensor groups, by where the tensor lives (first match wins)
GROUPS = (("vision", ("visual.",)), ("embeddings", ("embed_tokens", "lm_head", "wte", "embeddings.")))


FIXTURE_MARKER = "driftscope_fixture.json"  # written by every family's tiny-checkpoint builder


def tensor_group(name: str) -> str:
    """``vision``, ``embeddings`` or ``text`` for a checkpoint tensor name."""
    for group, marks in GROUPS:
        if any(mark in name for mark in marks):
            return group
    return "text"


def index_file(path: Path) -> Path | None:
    """The sharded checkpoint's index (``*.safetensors.index.json``), if there is one."""
    found = sorted(Path(path).glob("*.safetensors.index.json"))
    return found[0] if found else None


def checkpoint_storage(path: str | Path) -> dict:
    """Stored dtypes per group (``{"vision": {"BF16": 40}, ...}``), the shard files and the index file, and
    whether it is a random-weight fixture (its builder leaves ``driftscope_fixture.json``: no real answers).

    A shard the index names but the directory lacks is refused, naming it.
    """
    path = Path(path)
    index = index_file(path)
    if index is not None:
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise CheckpointError(
                f"{index} is not a safetensors index ({err})", "re-save the checkpoint with save_pretrained"
            ) from err
        shards = sorted(set(weight_map.values()))
        missing = [name for name in shards if not (path / name).exists()]
        if missing:
            raise CheckpointError(
                f"{index.name} lists shards that {path} lacks: {missing[:3]}",
                "copy every shard of the checkpoint into the directory (or re-download it)",
            )
        files = [path / name for name in shards]
    else:
        files = sorted(path.glob("*.safetensors"))
    dtypes: dict[str, Counter] = {}
    for file in files:
        try:
            header = read_header(file)
        except (OSError, ValueError, struct.error) as err:  # a truncated file or a header that is not JSON
            raise CheckpointError(
                f"{file} is not a readable safetensors file ({err})", "re-save the checkpoint"
            ) from err
        for name, entry in header.items():
            dtypes.setdefault(tensor_group(name), Counter())[entry.dtype] += 1
    return {
        "shards": len(files),
        "files": [file.name for file in files],
        "index_file": index.name if index is not None else None,
        "dtypes": {group: dict(sorted(counts.items())) for group, counts in sorted(dtypes.items())},
        "random_weights": (path / FIXTURE_MARKER).exists(),
    }
