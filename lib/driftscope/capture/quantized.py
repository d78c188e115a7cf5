"""What a runtime loads under a quantized policy: the spec, the checkpoint to load, and what the report records.

Two sources of quantized weights, and for each the two executions:

- an MLX-community directory (``config.json`` has ``quantization: {group_size, bits}``): its own codes. ``q4``
  (fused) loads it as it is in MLX; ``q4-dequant`` loads a dense checkpoint of its layers dequantized on the host
  (bit-identical to ``mx.dequantize``, scales cast to the activation dtype first);
- a dense checkpoint: ``q4`` quantizes it in MLX after loading (``nn.quantize``); ``q4-dequant`` loads a dense
  checkpoint of it quantized on the host with ``mx.quantize`` (the same codes) and dequantized.

transformers, jax, iree and MLX load the dense dequantized checkpoint unchanged, so every ``-dequant`` runtime runs
the same weights. It is written once per source, spec and activation dtype under ``$DRIFTSCOPE_CACHE/quant``
(default: the user cache folder), keyed by the content of the source's weights and config (SHA-256, remembered by
a stat key: ``core.digests``); each directory holds a sealed manifest of its files' SHA-256 (``core.seal``),
checked before every use: a dense checkpoint that does not hold is written again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from driftscope.core.atomic import write_json_atomic
from driftscope.core.digests import tree_digest
from driftscope.core.names import safe_name
from driftscope.core.paths import cache_root
from driftscope.core.seal import holds, seal
from driftscope.errors import CheckpointError, ParameterError
from driftscope.model.precision import PrecisionPolicy
from driftscope.model.quant.policy import OPTION_KEYS, QuantizedPolicy, QuantSpec, quant_spec

if TYPE_CHECKING:
    from driftscope.families.base import Family
    from driftscope.model.checkpoint import Checkpoint
    from driftscope.model.quant.profiles import QuantProfile

#: bump when the dense checkpoints written here change for the same source and spec
CACHE_FORMAT = 1
#: a dense checkpoint's sealed list of its files' SHA-256
MANIFEST = "driftscope_dense.json"


def mlx_quantization(config: Mapping[str, Any]) -> dict | None:
    """The ``quantization`` settings of an MLX-community checkpoint config (None: a dense checkpoint)."""
    settings = config.get("quantization")
    return settings if isinstance(settings, dict) and "bits" in settings and "group_size" in settings else None


def check_policy_fits(checkpoint: Checkpoint, policy: PrecisionPolicy, options: Mapping[str, Any]) -> None:
    """Raise before anything loads when ``policy`` (with ``options``) cannot run on ``checkpoint``."""
    native = mlx_quantization(checkpoint.config)
    if not isinstance(policy, QuantizedPolicy):
        if native is not None:
            bits = native["bits"]
            raise CheckpointError(
                f"checkpoint {checkpoint.path} is MLX-quantized ({bits} bits, group size {native['group_size']}), "
                f"so policy {policy.name!r} has no dense weights to run",
                f"use q{bits} (MLX's fused quantized matmul) or q{bits}-dequant (dequantized on the host)",
            )
        given = sorted(key for key in OPTION_KEYS if key in options)
        if given:
            raise ParameterError(
                f"options {given} set quantization, but policy {policy.name!r} is not quantized",
                "use a quantized policy (q4, q4-dequant, q8, ...) or drop those options",
            )
        return
    from driftscope.families import get_family

    get_family(checkpoint.family).quant_profile()  # a family without a profile says so now
    if native is None:
        quant_spec(policy, options)
    else:
        _native_settings(checkpoint, native, policy, options)


def _native_settings(
    checkpoint: Checkpoint, native: dict, policy: QuantizedPolicy, options: Mapping[str, Any]
) -> dict[str, Any]:
    settings = {"bits": int(native["bits"]), "group_size": int(native["group_size"]), "mode": native.get("mode")}
    settings["mode"] = settings["mode"] or "affine"
    if settings["bits"] != policy.bits:
        other = f"q{settings['bits']}{policy.name[2:]}"
        raise CheckpointError(
            f"checkpoint {checkpoint.path} holds {settings['bits']}-bit codes; policy {policy.name!r} asks for "
            f"{policy.bits} bits",
            f"use policy {other!r}",
        )
    for key, value in options.items():
        if key == "scope":
            raise ParameterError(
                "options.scope does not apply to an MLX-quantized checkpoint: its layers are quantized already",
                "drop options.scope (the report lists which layers the checkpoint quantizes)",
            )
        if key in settings and value != settings[key]:
            raise ParameterError(
                f"options.{key}={value!r} contradicts the checkpoint's quantization ({key} {settings[key]!r})",
                f"drop options.{key}: an MLX-quantized checkpoint's own settings apply",
            )
    return settings


@dataclass(frozen=True)
class QuantizedWeights:
    """What a runtime loads under a quantized policy."""

    spec: QuantSpec
    checkpoint: Checkpoint  # what the engine loads: the source, or the dense dequantized checkpoint
    quantize_on_load: bool  # MLX quantizes the loaded model's layers (fused policy on a dense checkpoint)
    report: dict


def quantized_weights(
    source: Checkpoint, policy: QuantizedPolicy, options: Mapping[str, Any], family: Family
) -> QuantizedWeights:
    """The weights ``policy`` runs on ``source``; a ``-dequant`` policy's dense checkpoint is written (or reused)."""
    check_policy_fits(source, policy, options)
    profile = family.quant_profile()
    native = mlx_quantization(source.config)
    if native is not None:
        from driftscope.model.quant.mlx_checkpoint import MLXQuantizedCheckpoint

        layers = MLXQuantizedCheckpoint(source.path).report(profile.mlx)
        scope = _scope(layers["quantized"])
        settings = _native_settings(source, native, policy, options)
        spec = QuantSpec(**settings, scope=scope, execution=policy.execution, activations=policy.activations)
        report = {**layers, "naming": "mlx"}
    else:
        spec = quant_spec(policy, options)
        report = _host_report(source, profile, spec)
    report.update(spec=spec.to_dict(), execution=spec.execution, activations=spec.activations)
    if spec.execution == "fused":
        return QuantizedWeights(spec, source, native is None, report)
    dense = dense_checkpoint(source, spec, profile)
    return QuantizedWeights(spec, dense, False, {**report, "dense_checkpoint": str(dense.path)})


def _scope(counts: Mapping[str, int]) -> str:
    sides = [side for side in ("vision", "text") if counts.get(side)]
    return "all" if len(sides) != 1 else sides[0]


def _host_report(source: Checkpoint, profile: QuantProfile, spec: QuantSpec) -> dict:
    from driftscope.model.quant.host import select_checkpoint
    from driftscope.model.weightfile import TensorFiles

    files = TensorFiles(source.path)
    selection = select_checkpoint(files, profile.checkpoint, spec, profile.mlx_names, profile.mlx)
    counts: dict[str, int] = {}
    for name in selection.quantized:  # a joined tensor's parts (MLX names) count one module each, as MLX's
        group = profile.checkpoint.group(profile.mlx_names.to_checkpoint(name)) or "other"
        counts[group] = counts.get(group, 0) + 1
    return {
        "source": "dense checkpoint, quantized by driftscope",
        "group_size": spec.group_size,
        "bits": spec.bits,
        "mode": spec.mode,
        "quantized": counts,
        "left_dense": [layer.to_dict() for layer in selection.left_dense],
        "naming": "checkpoint",
    }


def cache_dir() -> Path:
    """The ``quant`` folder of driftscope's cache (``$DRIFTSCOPE_CACHE``, else the user cache folder)."""
    return cache_root() / "quant"


def cache_key(source: Checkpoint, spec: QuantSpec) -> str:
    """What the dense checkpoint depends on: the content of the source's weights and config, the quantization
    and the activation dtype."""
    files = sorted([*source.path.glob("*.safetensors"), source.path / "config.json"])
    memo = _memo()
    content = [(file.name, tree_digest(file, memo)) for file in files]
    identity = {"format": CACHE_FORMAT, "source": str(source.path), "files": content, "spec": spec.to_dict()}
    identity["spec"].pop("execution")  # fused and dequant share the codes
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def _memo() -> Path:
    return cache_dir() / "checkpoint-digests.json"


def _manifest(folder: Path) -> dict:
    """Name -> SHA-256 of every file of a dense checkpoint directory but its manifest."""
    memo = _memo()
    return {file.name: tree_digest(file, memo) for file in sorted(folder.iterdir()) if file.name != MANIFEST}


def _holds(folder: Path) -> bool:
    """Whether a cached dense checkpoint holds what its sealed manifest says (every file, no other)."""
    try:
        written = json.loads((folder / MANIFEST).read_text())
        sealed = {"key": folder.name, "files": written["files"]}
        return holds(sealed, written.get("seal")) and _manifest(folder) == written["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return False


def dense_checkpoint(source: Checkpoint, spec: QuantSpec, profile: QuantProfile) -> Checkpoint:
    """The dense checkpoint of ``source``'s quantized layers dequantized in ``spec.activations`` (cached)."""
    from driftscope.families.checkpoints import open_checkpoint
    from driftscope.model.quant.dense_checkpoint import write_dense_checkpoint

    name = f"{safe_name(source.name)}-q{spec.bits}-g{spec.group_size}-{spec.scope}-{spec.activations}"
    out = cache_dir() / f"{name}-{cache_key(source, spec)}"

    def manifest(staged: Path) -> None:
        files = _manifest(staged)
        write_json_atomic(staged / MANIFEST, {"files": files, "seal": seal({"key": out.name, "files": files})})

    if not _holds(out):
        weights = _dequantized(source, spec, profile)
        provenance = {"source": str(source.path), "spec": spec.to_dict(), "format": CACHE_FORMAT}
        config = profile.dense_config(source.config)
        # a directory there that does not hold (changed, or of an older driftscope) is written again
        write_dense_checkpoint(out, weights, config, source.path, provenance, out.exists(), manifest)
    return open_checkpoint(out, source.family)


def _dequantized(source: Checkpoint, spec: QuantSpec, profile: QuantProfile) -> dict:
    """Every tensor of ``source`` by its checkpoint name, the quantized layers dequantized."""
    if mlx_quantization(source.config) is not None:
        from driftscope.model.quant.mlx_checkpoint import MLXQuantizedCheckpoint

        dense = MLXQuantizedCheckpoint(source.path).dense_weights(spec.activations)
        return profile.mlx_names.weights_to_checkpoint(dense)
    from driftscope.model.quant.host import quantize_checkpoint
    from driftscope.model.weightfile import TensorFiles

    host = quantize_checkpoint(source.path, profile.checkpoint, spec, profile.mlx_names, profile.mlx)
    files = TensorFiles(source.path)
    return host.dense_weights({name: files.read(name) for name in files.names()}, spec.activations)
