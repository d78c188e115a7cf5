"""Dequantized weights written as a dense checkpoint directory that every runtime already loads.

transformers (``from_pretrained``), the JAX emitter (``load_vision_weights``) and mlx-vlm read a
directory of ``config.json`` + safetensors; writing the dequantized weights there (float32, which
holds float16 and bfloat16 values exactly) gives each of them the same dense weights with no
loader of its own. The config loses its ``quantization`` keys (transformers would look for a
quantizer); ``driftscope_quant.json`` records where the weights came from.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .mlx_checkpoint import NOT_COPIED, SIDE_FILES

QUANTIZATION_KEYS = ("quantization", "quantization_config")


def write_dense_checkpoint(
    out_dir: str | Path,
    weights: Mapping[str, np.ndarray],
    config: dict,
    copy_from: str | Path | None = None,
    provenance: dict | None = None,
) -> Path:
    """Write ``weights`` (float arrays widened to float32) and ``config`` as a dense checkpoint, atomically."""
    from safetensors.numpy import save_file

    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if copy_from is not None:
        for pattern in SIDE_FILES:
            for file in sorted(Path(copy_from).glob(pattern)):
                if file.name not in NOT_COPIED:
                    shutil.copy2(file, tmp / file.name)
    stored = {
        name: np.ascontiguousarray(
            value, dtype=np.float32 if value.dtype.kind == "f" or value.dtype.name == "bfloat16" else None
        )
        for name, value in weights.items()
    }
    save_file(stored, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    dense_config = {key: value for key, value in config.items() if key not in QUANTIZATION_KEYS}
    (tmp / "config.json").write_text(json.dumps(dense_config, indent=2) + "\n")
    if provenance is not None:
        (tmp / "driftscope_quant.json").write_text(json.dumps(provenance, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir
