"""Ready hypothesis patches for mlx-vlm 0.7.10's Molmo2 (``patch: driftscope.families.molmo2.hypotheses:NAME``).

Each takes mlx-vlm's loaded Molmo2 ``Model``, corrects one defect in place and returns the model, so a
run shows that defect's divergence vanish. mlx-vlm itself is never changed:

- ``tanh_gelu``: its ViT MLP uses MLX's fast GELU (``x * sigmoid(1.702 x)``) for every activation
  name; Molmo2's ``gelu_pytorch_tanh`` is the tanh approximation (first seen at ``vision.block.0.mlp.act``).
- ``layers_from_declared_depth``: for hub-layout configs it caps the ViT at 25 layers first and then
  resolves ``vit_layers: [-3, -9]`` against 25 ([22, 16]); the checkpoint means the DECLARED depth
  (27: [24, 18]) (first seen at ``vision.selected.24``).
- ``bidirectional_image_mask``: its decoder mask is always causal; transformers lets image tokens
  (``mm_token_type_ids == 1``) attend to each other both ways (first seen at ``text.attention_mask``).
- ``mlx_vlm_fixes``: all three at once, or all but those named in ``skip`` (a runtime takes one patch: with
  ``skip: [NAME]`` the run's first divergence is that one defect's stage).
"""

from __future__ import annotations

from typing import Any

from ...errors import HypothesisPatchError
from ..capabilities import HypothesesCapabilities
from .config import read_facts, resolve_layers

__all__ = ["bidirectional_image_mask", "layers_from_declared_depth", "mlx_vlm_fixes", "tanh_gelu"]

#: The patches closing mlx-vlm 0.7.10's defects, in the order the defects show along the plan.
FIXES = ("tanh_gelu", "layers_from_declared_depth", "bidirectional_image_mask")

#: Which introduced errors each ready patch closes (``Family.ready_patches``): the runtime and the stages where
#: its defect is introduced, so a failing run's first screen names the patch to try.
_DEFECT_STAGES = {
    "tanh_gelu": ("vision.block.*.mlp.act",),
    "layers_from_declared_depth": ("vision.selected.*",),
    "bidirectional_image_mask": ("text.attention_mask", "text.layer.*"),
}
#: Each defect in words: what mlx-vlm computes where the checkpoint declares otherwise (a failing run's first screen).
_DEFECTS = {
    "tanh_gelu": "mlx-vlm's ViT MLP computes MLX's fast GELU, x * sigmoid(1.702 x), where the checkpoint declares "
    "the tanh GELU (gelu_pytorch_tanh)",
    "layers_from_declared_depth": "mlx-vlm resolves the adapter's vit_layers [-3, -9] against the 25 ViT layers it "
    "keeps, not the depth the config declares, so it feeds the pooling other layers than the checkpoint names",
    "bidirectional_image_mask": "mlx-vlm's decoder mask is causal over the image tokens too, where transformers lets "
    "them attend to each other both ways (mm_token_type_ids)",
}
CLOSES = {
    name: {"runtimes": ("mlx",), "stages": stages, "defect": _DEFECTS[name]} for name, stages in _DEFECT_STAGES.items()
}
CLOSES["mlx_vlm_fixes"] = {
    "runtimes": ("mlx",),
    "stages": tuple(p for s in _DEFECT_STAGES.values() for p in s),
    "defect": "; ".join(_DEFECTS.values()),
}
CAPABILITIES = HypothesesCapabilities(closes=CLOSES)


def _mlx_vlm(model: Any, patch: str) -> Any:
    """The model, when it is mlx-vlm's Molmo2 (the patches correct mlx-vlm's code, not another runtime's)."""
    if not hasattr(getattr(model, "vision_tower", None), "image_vit"):
        raise HypothesisPatchError(
            f"{patch} corrects mlx-vlm's Molmo2 model; it was given a {type(model).__name__}",
            "apply it to a runtime: mlx entry of the parameter file",
        )
    return model


def tanh_gelu(model: Any) -> Any:
    """Use the tanh-approximated GELU (torch's ``gelu_pytorch_tanh``) in every ViT MLP instead of MLX's fast GELU."""
    import mlx.nn as nn

    for block in _mlx_vlm(model, "tanh_gelu").vision_tower.image_vit.transformer:
        block.feed_forward.act = nn.GELU(approx="precise")  # MLX's "precise" is the tanh formula
    return model


def layers_from_declared_depth(model: Any, declared_depth: int | None = None) -> Any:
    """Resolve the adapter's ``vit_layers`` against the ViT depth the config DECLARES (hub layout: 27), not 25.

    ``declared_depth`` defaults to the checkpoint config kept by driftscope's loader.
    """
    _mlx_vlm(model, "layers_from_declared_depth")
    if declared_depth is None:
        source = getattr(model, "driftscope_source_config", None)
        if source is None:
            raise HypothesisPatchError(
                "layers_from_declared_depth needs the declared ViT depth and the model carries no checkpoint config",
                "pass kwargs: {declared_depth: 27} (vit_config.num_hidden_layers of config.json)",
            )
        declared_depth = read_facts(source).vit.declared_depth
    vision = model.vision_tower
    resolved = resolve_layers(tuple(vision.adapter_config.vit_layers), int(declared_depth))
    loaded = len(vision.image_vit.transformer)
    if max(resolved) >= loaded:
        raise HypothesisPatchError(
            f"layers {list(resolved)} need {max(resolved) + 1} ViT layers, mlx-vlm built {loaded}",
            "check declared_depth against the checkpoint's persisted ViT layers",
        )
    vision.vit_layers[:] = list(resolved)
    return model


class _BidirectionalImages:
    """Calls mlx-vlm's decoder with a prefill mask where image tokens also see later image tokens."""

    def __init__(self, decoder: Any, image_token_ids: list[int]):
        self.decoder = decoder
        self.image_token_ids = image_token_ids

    def __call__(self, input_ids, inputs_embeds=None, mask=None, cache=None):
        import mlx.core as mx

        first = cache[0] if cache else None
        prefill = first is None or getattr(first, "offset", 0) == 0
        if mask is None and prefill and input_ids is not None and input_ids.shape[-1] > 1:
            image = mx.zeros(input_ids.shape, dtype=mx.bool_)
            for token in self.image_token_ids:
                image = image | (input_ids == token)
            length = input_ids.shape[-1]
            causal = mx.tril(mx.ones((length, length), dtype=mx.bool_))
            mask = (causal[None] | (image[:, :, None] & image[:, None, :]))[:, None]
        return self.decoder(input_ids, inputs_embeds, mask, cache)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.decoder, name)


def bidirectional_image_mask(model: Any) -> Any:
    """Let image tokens attend to each other both ways in the prefill (transformers with ``mm_token_type_ids``)."""
    config = _mlx_vlm(model, "bidirectional_image_mask").config
    ids = [
        config.image_patch_id,
        config.image_col_id,
        config.image_start_token_id,
        config.low_res_image_start_token_id,
        config.frame_start_token_id,
        config.image_end_token_id,
        config.frame_end_token_id,
        config.image_low_res_id,
    ]
    language = model.language_model
    object.__setattr__(language, "model", _BidirectionalImages(language.model, [int(i) for i in ids]))
    return model


def mlx_vlm_fixes(model: Any, skip: list[str] | tuple[str, ...] = ()) -> Any:
    """Apply every ready patch for mlx-vlm 0.7.10's Molmo2 defects except those named in ``skip``."""
    unknown = sorted(set(skip) - set(FIXES))
    if unknown:
        raise HypothesisPatchError(
            f"mlx_vlm_fixes cannot skip {unknown}: it applies {list(FIXES)}", f"skip some of {list(FIXES)}"
        )
    for name in FIXES:
        if name not in skip:
            model = globals()[name](model)
    return model
