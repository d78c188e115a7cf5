"""How transformers and mlx-vlm hold a checkpoint the generic family reads (``Family.load_layout``, audited by
``capture.load_audit``), declared from each library's own published renaming, never from the loaded model.

transformers: the checkpoint's names under the renamings transformers applies to the model's checkpoints
(``get_model_conversion_mapping``, as ``from_pretrained`` does, on a model built on ``meta``), values unchanged; a head
tied to the embedding and absent from the checkpoint is not read from it. Tensors transformers converts on load
(merges, splits) and tensors it loads into buffers rather than parameters are left out, named in the notes.

mlx-vlm: each checkpoint tensor's name after mlx-vlm's ``sanitize`` (read on unevaluated placeholders, no value
read), and its value unchanged except where the module that holds it says otherwise: a convolution's kernel
is channels-last in MLX (``[out, *spatial, in]`` of torch's ``[out, in, *spatial]``), and a tensor sanitize gives
another shape of the same size holds the same values in that shape. So a loader that transposes what it should not
(or fails to transpose what it should) is found by value, whatever sanitize does. A tensor sanitize drops is not
held; one it merges with others or splits is left out and named in the notes.
"""

from __future__ import annotations

import math
import re

from driftscope.model.load_layout import Held, LoadLayout, TensorRule

from .align import is_conv
from .reading import model_class


def generic_layout(runtime: str, checkpoint) -> LoadLayout | None:
    """The layout ``runtime`` holds ``checkpoint`` in (None where nothing is declared)."""
    if runtime == "transformers":
        return transformers_layout(checkpoint)
    if runtime == "mlx":
        return mlx_layout(checkpoint)
    return None


def _names(checkpoint) -> dict[str, tuple[int, ...]]:
    from driftscope.model.weightfile import TensorFiles

    files = TensorFiles(checkpoint.path)
    return {name: tuple(files.shape(name)) for name in files.names()}


def transformers_layout(checkpoint) -> LoadLayout:
    """transformers' names for the checkpoint's tensors, values unchanged (module docstring)."""
    import torch
    import transformers
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    cls = getattr(transformers, model_class(checkpoint.config))
    config = transformers.AutoConfig.from_pretrained(str(checkpoint.path))
    with torch.device("meta"):
        model = cls._from_config(config)
    mapping = get_model_conversion_mapping(model)
    renamings = [entry for entry in mapping if isinstance(entry, WeightRenaming)]
    converters = [entry for entry in mapping if isinstance(entry, WeightConverter)]
    loaded = model.state_dict()
    stored = _names(checkpoint)
    names: dict[str, str] = {}
    converted: list[str] = []
    for name in stored:
        target, converter = rename_source_key(name, renamings, converters, model.base_model_prefix, loaded)
        if target not in loaded and name in loaded:
            target, converter = name, None
        if converter is not None:
            converted.append(name)
        elif target != name:
            names[name] = target
    held = set(names.values()) | (set(stored) - set(names) - set(converted))
    buffer_names = set(loaded) - {name for name, _ in model.named_parameters()}
    buffers = [name for name in stored if names.get(name, name) in buffer_names]
    tied = tuple(name for name in (getattr(cls, "_tied_weights_keys", None) or {}) if name not in held)
    notes = [f"names: transformers' renaming for {cls.__name__} ({len(renamings)} renamings); values unchanged"]
    if tied:
        notes.append(f"{', '.join(tied)}: tied to the embedding, not read from the checkpoint")
    if converted:
        notes.append(f"{len(converted)} tensors transformers converts (merges, splits) not audited: {converted[0]} ...")
    if buffers:
        notes.append(
            f"{len(buffers)} tensors transformers loads into buffers (not parameters) not audited: {buffers[0]} ..."
        )
    made = sorted(set(loaded) - held - set(tied)) if converted else []  # what the conversions make
    return LoadLayout(
        names=names,
        not_held=tuple(_glob(names.get(name, name)) for name in buffers) + tuple(_glob(name) for name in converted),
        not_from_checkpoint=tied + tuple(_glob(name) for name in made),
        notes=tuple(notes),
    )


def _channels_last(rank: int) -> tuple[int, ...]:
    return (0, *range(2, rank), 1)


def _held(source: tuple[int, ...], target: tuple[int, ...], conv_kernel: bool) -> Held | None:
    """How a tensor of shape ``source`` is held as ``target`` (None: no declared way makes it)."""
    if conv_kernel and len(source) >= 3:
        moved = tuple(source[axis] for axis in _channels_last(len(source)))
        return Held(ops=(("transpose", _channels_last(len(source))),)) if moved == target else None
    if source == target:
        return Held()
    if math.prod(source) == math.prod(target):
        return Held(ops=(("reshape", target),))
    return None


def _sanitize_targets(
    checkpoint, shapes: dict[str, tuple[int, ...]]
) -> tuple[dict[str, list[tuple[str, tuple[int, ...]]]], set[str], dict[str, str]]:
    """Checkpoint name -> the names and shapes mlx-vlm's sanitize gives it (several: a head it ties to the
    embedding; none: it drops it; a tensor sanitize merges or splits is absent), with every name sanitize gives and
    the skeleton's modules' class names. Read on
    placeholders (``mx.zeros``, never evaluated): a tensor sanitize only renames is the same array under its new name;
    one it changes keeps its name or is read alone."""
    import mlx.core as mx

    from .calls import mlx_sanitized, mlx_skeleton

    module, model, model_config, _ = mlx_skeleton(checkpoint.config)
    placeholders = {name: mx.zeros(shape) for name, shape in shapes.items()}
    every = mlx_sanitized(module, model, model_config, dict(placeholders))
    source_of = {id(value): name for name, value in placeholders.items()}
    targets: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
    changed = []
    for target, value in every.items():
        source = source_of.get(id(value))
        if source is None and target in shapes:  # the same name, a new value (a transposed kernel)
            source = target
        if source is not None:
            targets.setdefault(source, []).append((target, tuple(value.shape)))
        else:
            changed.append(target)
    for name, shape in shapes.items():
        if name in targets:
            continue
        try:
            alone = mlx_sanitized(module, model, model_config, {name: mx.zeros(shape)})
        except Exception:  # noqa: BLE001 - sanitize reads it with other tensors: left out, said in the notes
            continue
        if not alone or (len(alone) == 1 and next(iter(alone)) in changed):
            targets[name] = [(target, tuple(value.shape)) for target, value in alone.items()]
    classes = {path: type(owner).__name__ for path, owner in model.named_modules()}
    return targets, set(every), classes


def mlx_layout(checkpoint) -> LoadLayout:
    """mlx-vlm's names for the checkpoint's tensors, values as the holding module declares (module docstring)."""
    shapes = _names(checkpoint)
    targets, every, classes = _sanitize_targets(checkpoint, shapes)
    names: dict[str, str] = {}
    rules: list[TensorRule] = []
    held_names: set[str] = set()
    dropped = [name for name, made in targets.items() if not made]
    left_out = [name for name in shapes if name not in targets]
    for name, shape in shapes.items():
        if not targets.get(name):
            continue
        helds = []
        for target, held_shape in targets[name]:
            owner, _, leaf = target.rpartition(".")
            held = _held(shape, held_shape, is_conv(classes.get(owner, "")) and leaf == "weight")
            helds.append(None if held is None else Held(name=target, ops=held.ops))
        if None in helds:
            left_out.append(name)
            continue
        names[name] = targets[name][0][0]
        held_names.update(target for target, _ in targets[name])
        if len(helds) > 1 or helds[0].ops:
            rules.append(TensorRule(re.escape(names[name]), tuple(helds)))
    notes = ["names: mlx-vlm's sanitize; values: as the checkpoint's, a convolution's kernel channels-last"]
    if dropped:
        notes.append(f"{len(dropped)} checkpoint tensors mlx-vlm does not hold (sanitize drops them): {dropped[0]} ...")
    if left_out:
        notes.append(f"{len(left_out)} tensors not audited (sanitize merges, splits or reshapes them in a way not "
                     f"declared here): {left_out[0]} ...")  # fmt: skip
    return LoadLayout(
        names=names,
        rules=tuple(rules),
        not_held=tuple(_glob(name) for name in dropped + left_out),
        not_from_checkpoint=tuple(_glob(name) for name in sorted(every - held_names)),
        notes=tuple(notes),
    )


def _glob(name: str) -> str:
    """``name`` as an fnmatch pattern that matches it alone."""
    return re.sub(r"([\[\]*?])", r"[\1]", name)
