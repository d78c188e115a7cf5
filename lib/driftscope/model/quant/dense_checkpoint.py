"""Dequantized weights written as a dense checkpoint directory that every runtime already loads.

transformers (``from_pretrained``), the JAX emitter (``load_vision_weights``) and mlx-vlm read a
directory of ``config.json`` + safetensors; writing the dequantized weights there (float32, which
holds float16 and bfloat16 values exactly) gives each of them the same dense weights with no
loader of its own. The config loses its ``quantization`` keys (transformers would look for a
quantizer); ``driftscope_quant.json`` records where the weights came from.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from driftscope.model.quant.directory import staged_directory

QUANTIZATION_KEYS = ("quantization", "quantization_config")


def write_dense_checkpoint(
    out_dir: str | Path,
    weights: Mapping[str, np.ndarray],
    config: dict,
    copy_from: str | Path | None = None,
    provenance: dict | None = None,
    replace: bool = True,
    finish: Callable[[Path], None] | None = None,
) -> Path:
    """Write ``weights`` (float arrays widened to float32) and ``config`` as a dense checkpoint, atomically
    (``replace=False``: keep a directory another process wrote there meanwhile). ``finish``: called with the
    staged directory once its files are written, before it takes its place (e.g. to add a manifest of them)."""
    from safetensors.numpy import save_file

    stored = {
        name: np.ascontiguousarray(
            value, dtype=np.float32 if value.dtype.kind == "f" or value.dtype.name == "bfloat16" else None
        )
        for name, value in weights.items()
    }
    dense_config = {key: value for key, value in config.items() if key not in QUANTIZATION_KEYS}
    with staged_directory(out_dir, copy_from, replace) as tmp:
        save_file(stored, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(dense_config, indent=2) + "\n")
        if provenance is not None:
            (tmp / "driftscope_quant.json").write_text(json.dumps(provenance, indent=1, sort_keys=True) + "\n")
        if finish is not None:
            finish(tmp)
    return Path(out_dir)
