"""Which on-disk layout a Qwen3-VL-MoE checkpoint's stacked experts are in, and what each runtime must hold.

Two layouts exist: the **released** one (the hub's checkpoints, saved by transformers 4.57, whose modules held
``gate_up_proj`` [experts, hidden, 2 x intermediate] and ``down_proj`` [experts, intermediate, hidden]) and
transformers 5's (**v5**: its ``save_pretrained`` writes its modules' [experts, 2 x intermediate, hidden] and
[experts, hidden, intermediate]: any fine-tune re-saved by it). Where the two shapes differ the shape says which;
where they are the same (``2 x intermediate == hidden`` for ``gate_up_proj``, ``intermediate == hidden`` for
``down_proj``: both testers' configs) only the transformers version config.json was written by can: 5 or later is
v5. transformers 5.24 decides by shape alone and so keeps a square released expert untransposed (wrong);
:func:`correct_transformers` puts it right, and the load audit checks every runtime against :func:`expert_layout`.
"""

from __future__ import annotations

import re

import numpy as np

from .plan import text_config

EXPERTS = re.compile(r"^(model\.language_model\.layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)$")
#: what the released checkpoints' config.json says (the fixtures' builder writes it with the released layout)
RELEASED_VERSION = "4.57.0.dev0"


def _shapes(config: dict, kind: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """(v5, released) shapes of one expert's ``kind`` matrix."""
    text = text_config(config)
    hidden, intermediate = int(text["hidden_size"]), int(text["moe_intermediate_size"])
    width = 2 * intermediate if kind == "gate_up_proj" else intermediate
    v5 = (width, hidden) if kind == "gate_up_proj" else (hidden, width)
    return v5, (v5[1], v5[0])


def saved_by_v5(config: dict) -> bool:
    version = str(config.get("transformers_version") or "")
    major = version.split(".", 1)[0]
    return major.isdigit() and int(major) >= 5


def expert_layout(config: dict, name: str, shape) -> str | None:
    """``"released"`` or ``"v5"`` for the stacked-experts tensor ``name`` of ``shape`` (None: not one, or a shape
    neither layout has)."""
    found = EXPERTS.match(name)
    if found is None:
        return None
    v5, released = _shapes(config, found.group(2))
    held = tuple(int(n) for n in shape[1:])
    if v5 == released == held:
        return "v5" if saved_by_v5(config) else "released"
    return "v5" if held == v5 else "released" if held == released else None


def to_v5(config: dict, name: str, value):
    """``value`` of tensor ``name`` in transformers 5's layout (transposed from the released one)."""
    return value.transpose(0, 2, 1) if expert_layout(config, name, value.shape) == "released" else value


def to_released(config: dict, name: str, value):
    """``value`` of tensor ``name`` in the released layout (the one mlx-vlm's sanitizing expects)."""
    return value.transpose(0, 2, 1) if expert_layout(config, name, value.shape) == "v5" else value


def correct_transformers(model, checkpoint) -> list[str]:
    """Hold every stacked expert as transformers 5 computes with it (the v5 layout), read from the checkpoint;
    the names of those transformers' own load had left otherwise (a square released expert it did not transpose)."""
    import torch

    from driftscope.model.weightfile import TensorFiles

    files = TensorFiles(checkpoint.path)
    corrected = []
    params = dict(model.named_parameters())
    for name in files.names():
        if name not in params or expert_layout(checkpoint.config, name, files.shape(name)) is None:
            continue
        wanted = np.ascontiguousarray(to_v5(checkpoint.config, name, files.read(name)))
        param = params[name]
        if tuple(param.shape) == wanted.shape and not np.array_equal(param.detach().float().numpy(), wanted):
            with torch.no_grad():
                param.copy_(torch.from_numpy(wanted).to(param.dtype))
            corrected.append(name)
    return corrected


def moe_layout(runtime: str, checkpoint):
    """Qwen3-VL's layout (``qwen_shared.held``) with each stacked expert as ``runtime`` holds it: transformers 5
    in its own layout (the released one transposed), mlx-vlm with ``gate_up_proj`` split into its gate and up
    halves, each [experts, intermediate, hidden], and ``down_proj`` [experts, hidden, intermediate]."""
    import re as _re

    from driftscope.model.load_layout import Held, TensorRule
    from driftscope.model.weightfile import TensorFiles

    from ..qwen_shared.held import qwen_layout

    files = TensorFiles(checkpoint.path)
    rules: dict[str, list[TensorRule]] = {"transformers": [], "mlx": [], "text": []}
    notes = []
    for name in files.names():
        layout = expert_layout(checkpoint.config, name, files.shape(name))
        if layout is None:
            continue
        notes.append(f"{name}: {layout} layout")
        flip = (("transpose", (0, 2, 1)),) if layout == "released" else ()
        rules["transformers"].append(TensorRule(_re.escape(name), (Held(ops=flip),)))
        text = name.removeprefix("model.language_model.")  # the emitter's: layers.N.mlp.{gate_up,down}
        emitted = text.split(".experts.")[0] + (".gate_up" if name.endswith("gate_up_proj") else ".down")
        rules["text"].append(TensorRule(_re.escape(text), (Held(emitted, flip),)))
        mlx = name.replace("model.language_model.", "language_model.model.", 1)
        experts = mlx.rsplit(".", 1)[0].replace(".mlp.experts", ".mlp.switch_mlp")  # mlx-vlm's SwitchGLU
        if name.endswith("gate_up_proj"):
            axis = 2 if layout == "released" else 1  # the 2 x intermediate axis
            halves = tuple(
                Held(f"{experts}.{part}.weight", (("half", axis, which), *flip))
                for which, part in enumerate(("gate_proj", "up_proj"))
            )
            rules["mlx"].append(TensorRule(_re.escape(mlx), halves))
        else:
            rules["mlx"].append(TensorRule(_re.escape(mlx), (Held(f"{experts}.down_proj.weight", flip),)))
    routers = TensorRule(r"(layers\.\d+\.mlp\.gate)\.weight", (Held(r"\1"),))  # the emitter's router names
    rules["text"].append(routers)
    held = qwen_layout(runtime, checkpoint, {key: tuple(value) for key, value in rules.items()})
    if held is None:
        return None
    from dataclasses import replace

    return replace(held, notes=(*held.notes, *notes[:4]))
