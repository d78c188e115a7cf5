"""MLX-community quantized checkpoint directories: read them without MLX, write them with MLX.

The layout ``mlx_vlm.convert -q`` and ``nn.quantize`` + ``mlx_vlm.utils.save_weights`` produce:
``config.json`` with ``quantization: {group_size, bits, mode}`` (and the same as
``quantization_config``), where a module path key overrides one layer (a dict of those settings, or
``false`` for a dense layer); tensors in MLX's module naming, each quantized layer as
``<path>.weight`` (uint32 codes), ``<path>.scales`` and ``<path>.biases``. A layer without
``.scales`` is dense (mlx-vlm's loader leaves it so).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from driftscope.errors import CheckpointError
from driftscope.model.quant.affine import NUMPY_DTYPES, QuantizedTensor, check_layout, mlx_core
from driftscope.model.quant.directory import staged_directory
from driftscope.model.quant.policy import QuantSpec
from driftscope.model.quant.select import (
    LeftDense,
    Selection,
    TensorGroups,
    is_matrix_weight,
    module_predicate,
    select_weights,
)
from driftscope.model.weightfile import TensorEntry, read_header

#: safetensors dtype -> numpy dtype of the stored values
STORED = {
    "U32": np.dtype(np.uint32),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": NUMPY_DTYPES["bfloat16"],
    "F64": np.dtype(np.float64),
}


@dataclass(frozen=True)
class LayerSettings:
    group_size: int
    bits: int
    mode: str = "affine"


def _settings(value: dict, where: str) -> LayerSettings:
    try:
        return LayerSettings(int(value["group_size"]), int(value["bits"]), str(value.get("mode", "affine")))
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(
            f"{where} has no usable group_size/bits ({value!r})", "write it as {group_size: 64, bits: 4, mode: affine}"
        ) from err


def read_stored(entry: TensorEntry) -> np.ndarray:
    """One tensor in its stored dtype (uint32 codes, float32, float16 or bfloat16 values)."""
    if entry.dtype not in STORED:
        raise CheckpointError(
            f"tensor in {entry.file.name} is stored as {entry.dtype}", f"store it as one of {', '.join(STORED)}"
        )
    dtype = STORED[entry.dtype]
    with open(entry.file, "rb") as handle:
        handle.seek(entry.start)
        data = handle.read(entry.nbytes)
    if len(data) != entry.nbytes:
        raise CheckpointError(f"checkpoint file {entry.file} ends inside a tensor", "re-save the checkpoint")
    return np.frombuffer(data, dtype=dtype).reshape(entry.shape).copy()


class MLXQuantizedCheckpoint:
    """An MLX-community quantized checkpoint directory, read tensor by tensor."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        config_path = self.path / "config.json"
        if not config_path.exists():
            raise CheckpointError(f"{self.path} has no config.json", "point at a quantized checkpoint directory")
        self.config = json.loads(config_path.read_text())
        quantization = self.config.get("quantization") or self.config.get("quantization_config")
        if not isinstance(quantization, dict) or "bits" not in quantization:
            raise CheckpointError(
                f"{config_path} has no 'quantization: {{group_size, bits}}': the checkpoint is not MLX-quantized",
                "load it as a dense checkpoint, or quantize it (mlx_vlm.convert -q, or a q4/q8 policy)",
            )
        self.default = _settings(quantization, f"{config_path} quantization")
        self.overrides: dict[str, LayerSettings | None] = {
            key: None if value is False else _settings(value, f"{config_path} quantization.{key}")
            for key, value in quantization.items()
            if isinstance(value, dict) or value is False
        }
        files = sorted(self.path.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"{self.path} has no *.safetensors files", "point at a saved checkpoint")
        self.entries: dict[str, TensorEntry] = {}
        for file in files:
            self.entries.update(read_header(file))
        self.layers = {
            name[: -len(".scales")]: self.settings(name[: -len(".scales")])
            for name in self.entries
            if name.endswith(".scales")
        }
        for path, settings in self.layers.items():
            if settings is None:
                raise CheckpointError(
                    f"layer {path!r} has quantization scales but config.json marks it dense (false)",
                    "drop its entry from config.json's quantization or re-save the layer dense",
                )
            for part in (".weight", ".biases"):
                if path + part not in self.entries:
                    raise CheckpointError(
                        f"quantized layer {path!r} has no {part[1:]!r} tensor", "re-save the checkpoint"
                    )

    def settings(self, path: str) -> LayerSettings | None:
        """The layer's override (also under mlx-vlm's alias without ``language_model.``), or the default."""
        for alias in (path, path.removeprefix("language_model.")):
            if alias in self.overrides:
                return self.overrides[alias]
        return self.default

    def names(self) -> list[str]:
        return sorted(self.entries)

    def read(self, name: str) -> np.ndarray:
        return read_stored(self.entries[name])

    def tensor(self, path: str) -> QuantizedTensor:
        """The quantized layer at module ``path``; a layout that does not fit its settings is named."""
        settings = self.layers[path]
        packed, scales, biases = (self.read(f"{path}.{part}") for part in ("weight", "scales", "biases"))
        if settings.mode != "affine":
            raise CheckpointError(f"layer {path!r} uses mode {settings.mode!r}", "only affine quantization is read")
        try:
            check_layout(packed, scales, biases, settings.group_size, settings.bits)
        except ValueError as err:
            raise CheckpointError(
                f"quantized layer {path!r} does not fit config.json's settings: {err}", "re-save it"
            ) from err
        return QuantizedTensor(packed, scales, biases, settings.group_size, settings.bits, settings.mode)

    def dense_weights(self, activations: Any = None) -> dict[str, np.ndarray]:
        """Every tensor by its name, quantized layers dequantized (scales cast to ``activations`` first, if given).

        Without ``activations`` a layer dequantizes exactly as ``mx.dequantize`` of its stored tensors;
        dense tensors come as stored.
        """
        dense = {}
        for name in self.names():
            path, _, part = name.rpartition(".")
            if path in self.layers and part == "weight":
                tensor = self.tensor(path)
                dense[name] = (tensor if activations is None else tensor.with_scale_dtype(activations)).dequantize()
            elif path not in self.layers or part not in ("scales", "biases"):
                dense[name] = self.read(name)
        return dense

    def left_dense(self, groups: TensorGroups) -> list[LeftDense]:
        """Dense matrix layers whose input width the default group size does not divide (why they stay dense)."""
        size = self.default.group_size
        return [
            LeftDense(name, groups.group(name) or "other", entry.shape[-1], size)
            for name, entry in sorted(self.entries.items())
            if name[: -len(".weight")] not in self.layers
            and is_matrix_weight(name, entry.shape, groups.stacked)
            and entry.shape[-1] % size
        ]

    def report(self, groups: TensorGroups) -> dict[str, Any]:
        """The checkpoint's quantization as a report records it."""
        by_group: dict[str, int] = {}
        for path in self.layers:
            group = groups.group(path + ".weight") or "other"
            by_group[group] = by_group.get(group, 0) + 1
        return {
            "source": "checkpoint",
            "group_size": self.default.group_size,
            "bits": self.default.bits,
            "mode": self.default.mode,
            "quantized": by_group,
            "left_dense": [layer.to_dict() for layer in self.left_dense(groups)],
        }


def quantize_model(model: Any, selection: Selection, spec: QuantSpec) -> None:
    """``nn.quantize`` the selected layers of an MLX model in place (names in MLX's module naming)."""
    mlx_core()
    import mlx.nn as nn

    predicate = module_predicate(selection)
    nn.quantize(model, spec.group_size, spec.bits, mode=spec.mode, class_predicate=predicate)
    missed = sorted({name[: -len(".weight")] for name in selection.quantized} - predicate.hits)
    if missed:
        raise CheckpointError(
            f"{len(missed)} selected weights belong to modules MLX cannot quantize: {missed[:3]}",
            "exclude them from the family's tensor groups",
        )


def quantize_loaded(model: Any, groups: TensorGroups, spec: QuantSpec) -> Selection:
    """Quantize a loaded MLX model's ``spec.scope`` layers in place (``groups`` in MLX's naming); the selection."""
    mlx_core()
    from mlx.utils import tree_flatten

    shapes = {name: tuple(value.shape) for name, value in tree_flatten(model.parameters())}
    selection = select_weights(shapes, groups, spec.group_size, spec.scope)
    quantize_model(model, selection, spec)
    return selection


def save_mlx_checkpoint(
    model: Any,
    config: dict,
    out_dir: str | Path,
    spec: QuantSpec,
    copy_from: str | Path | None = None,
    extra: dict | None = None,
) -> Path:
    """Save a quantized MLX model as an MLX-community directory (mlx-vlm's own writers), atomically.

    ``config`` is the checkpoint config in mlx-vlm's layout; ``copy_from`` a directory whose tokenizer
    and processor files are copied; ``extra`` is written as ``driftscope_quant.json`` (provenance).
    """
    mlx_core()
    from mlx_vlm.utils import save_config, save_weights

    settings = {"group_size": spec.group_size, "bits": spec.bits, "mode": spec.mode}
    with staged_directory(out_dir, copy_from) as tmp:
        save_weights(tmp, model)
        save_config(
            {**config, "quantization": dict(settings), "quantization_config": dict(settings)}, tmp / "config.json"
        )
        if extra is not None:
            (tmp / "driftscope_quant.json").write_text(json.dumps(extra, indent=1, sort_keys=True) + "\n")
    return Path(out_dir)
