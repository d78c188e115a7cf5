"""What the generic family's ready patches are written with: the vision tower's blocks of either library's
model, found by what the model is (transformers' image encoder; mlx-vlm's vision attribute), and a module's
output changed in place without changing its identity or its path."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...errors import HypothesisPatchError

#: the attribute names mlx-vlm gives a model's vision tower
MLX_VISION = ("vision_tower", "vision_model", "visual", "vision_encoder")


def _is_list(value: Any) -> bool:
    return isinstance(value, list | tuple) or type(value).__name__ == "ModuleList"


def _longest_list(root: Any, children: Callable[[Any], list[Any]]) -> list:
    """The longest list of modules of one class under ``root`` (the repeated blocks); ``children(module)``
    gives a module's attributes that are modules, lists of modules or plain dicts of them."""
    best: list = []
    stack = [root]
    while stack:
        node = stack.pop()
        items = list(node.values()) if isinstance(node, dict) and type(node) is dict else children(node)
        for child in items:
            if _is_list(child):
                members = list(child)
                classes = {getattr(type(m), "patched_from", type(m)) for m in members}  # a patched block counts
                repeated = len(classes) == 1 and hasattr(members[0], "children")
                best = members if repeated and len(members) > len(best) else best
                stack.extend(members)
            elif child is not None:
                stack.append(child)
    return best


def vision_blocks(model: Any) -> tuple[str, list]:
    """("torch" or "mlx", the vision tower's blocks in order)."""
    if hasattr(model, "get_encoder"):  # transformers
        tower = model.get_encoder(modality="image")
        blocks = _longest_list(tower, lambda node: list(node.children()))
        side = "torch"
    else:
        tower = next((getattr(model, name) for name in MLX_VISION if hasattr(model, name)), None)
        if tower is None:
            raise HypothesisPatchError(
                f"found no vision tower in this {type(model).__name__} (looked for {', '.join(MLX_VISION)})",
                "write your own patch ('file.py:function') for this model",
            )
        blocks = _longest_list(tower, lambda node: list(node.children().values()))
        side = "mlx"
    if not blocks:
        raise HypothesisPatchError("found no list of vision blocks in this model", "write your own patch")
    return side, blocks


def torch_output(module: Any, change: Callable[[Any], Any]) -> None:
    """Every later call of the torch ``module`` returns ``change(output)`` (its first tensor, where a tuple)."""

    def hook(mod, args, out):
        if isinstance(out, tuple):
            return (change(out[0]), *out[1:])
        return change(out)

    module.register_forward_hook(hook)


def mlx_methods(module: Any, **methods: Callable[..., Any]) -> None:
    """The MLX ``module``'s class swapped for a subclass with these methods (``__call__`` among them, or any its
    port calls on it), so the module keeps its identity and its path, and the modules it holds are called as
    before."""
    base = type(module)
    original = getattr(base, "patched_from", base)
    module.__class__ = type(f"Patched{base.__name__}", (base,), {**methods, "patched_from": original})


def mlx_call(module: Any, call: Callable[..., Any]) -> None:
    """Every later call of the MLX ``module`` is ``call(module, *args, **kwargs)``."""
    mlx_methods(module, __call__=call)


def mlx_output(module: Any, change: Callable[[Any], Any]) -> None:
    """Every later call of the MLX ``module`` returns ``change(output)``."""
    base = type(module)

    def __call__(self, *args, **kwargs):
        out = base.__call__(self, *args, **kwargs)
        if isinstance(out, tuple):
            return (change(out[0]), *out[1:])
        return change(out)

    mlx_call(module, __call__)


def checkpoint_config(model: Any, patch: str) -> dict:
    """The checkpoint's config.json as transformers wrote it, kept by the generic family's loader beside mlx-vlm's
    model (whose config classes drop the fields they do not read)."""
    from .calls import CHECKPOINT_CONFIG

    found = getattr(model, CHECKPOINT_CONFIG, None)
    if found is None:
        raise HypothesisPatchError(
            f"{patch} reads the checkpoint's config, which this {type(model).__name__} was not loaded with",
            "apply it to a runtime: mlx entry of a parameter file (driftscope's loader keeps the config)",
        )
    return dict(found)


def mlx_gated_mlps(mlps: list, activation: str, patch: str) -> None:
    """Every MLX gated MLP of ``mlps`` (``gate_proj``, ``up_proj``, ``down_proj``) computes transformers' gated MLP,
    ``down(act(gate(x)) * up(x))``, with transformers' ``activation``."""
    act = mlx_activation(activation, patch)

    def __call__(self, x):
        return self.down_proj(act(self.gate_proj(x)) * self.up_proj(x))

    for mlp in mlps:
        mlx_call(mlp, __call__)


#: transformers' activation names (``ACT2FN``) -> the MLX module of the same formula: (class, GELU approximation)
ACTIVATIONS = {
    "gelu": ("GELU", "none"),
    "gelu_pytorch_tanh": ("GELU", "tanh"),
    "gelu_new": ("GELU", "tanh"),
    "gelu_fast": ("GELU", "tanh"),
    "quick_gelu": ("GELU", "fast"),  # x * sigmoid(1.702 x) on both sides
    "silu": ("SiLU", None),
    "swish": ("SiLU", None),
    "relu": ("ReLU", None),
}


def mlx_activation(name: str, patch: str) -> Any:
    """The MLX activation module computing transformers' ``name``."""
    import mlx.nn as nn

    if name not in ACTIVATIONS:
        raise HypothesisPatchError(
            f"{patch} knows no MLX activation for transformers' {name!r}", f"use one of {', '.join(ACTIVATIONS)}"
        )
    kind, approx = ACTIVATIONS[name]
    return nn.GELU(approx=approx) if kind == "GELU" else getattr(nn, kind)()


def mlx_vlm_port(model: Any, model_type: str, patch: str) -> Any:
    """``model`` when it is mlx-vlm's port of ``model_type`` (its class comes from ``mlx_vlm.models.<model_type>``);
    a fix corrects that port's code and refuses any other model."""
    where = type(model).__module__
    if not where.startswith(f"mlx_vlm.models.{model_type}."):
        raise HypothesisPatchError(
            f"{patch} corrects mlx-vlm's {model_type} port; it was given a {type(model).__name__} ({where})",
            f"apply it to the mlx runtime of a {model_type} checkpoint",
        )
    return model


def mlx_closes(defects: dict[str, tuple[tuple[str, ...], str]], whole: str, model_type: str) -> dict[str, dict]:
    """A fix module's ``CLOSES`` for mlx-vlm's port of ``model_type``: each patch by name from ``defects`` (the stages
    where its defect is introduced, and the defect in words), and ``whole``, the patch applying all of them (every
    stage, every defect said)."""
    closes = {
        name: {"runtimes": ("mlx",), "stages": stages, "model_types": (model_type,), "defect": defect}
        for name, (stages, defect) in defects.items()
    }
    every = tuple(stage for stages, _ in defects.values() for stage in stages)
    said = "; ".join(defect for _, defect in defects.values())
    closes[whole] = {"runtimes": ("mlx",), "stages": every, "model_types": (model_type,), "defect": said}
    return closes
