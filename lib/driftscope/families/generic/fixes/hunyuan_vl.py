"""mlx-vlm 0.7.10's HunYuan-VL, two defects:

- ``hunyuan_vl_vision_hidden_act``: its vision tower reads ``vision_config.hidden_act`` into its config
  (``hunyuan_vl/config.py:28``) and never uses it: the block MLP applies ``nn.gelu`` (``hunyuan_vl/vision.py:22``) and
  the patch merger's convolutions are joined by ``nn.GELU()`` (``hunyuan_vl/vision.py:221``); transformers applies
  ``ACT2FN[hidden_act]`` in both (``HunYuanVLVisionMLP.activation_fn``, ``HunYuanVLVisionPatchMerger.proj_act``).
- ``hunyuan_vl_xdrope_positions``: where the processor hands no ``position_ids`` (transformers' does not: its model
  computes them), ``get_input_embeddings`` (``hunyuan_vl/hunyuan_vl.py:95``) takes the XD-RoPE positions from
  ``LanguageModel.get_xdrope_input_positions`` (``hunyuan_vl/language.py:352``), which starts an image at EVERY image
  token (the merge at ``hunyuan_vl.py:55`` needs one token per vision row: ``(w + 1) * h + 2`` per image), and stacks
  the axes ``[p, t, h, w]`` where transformers' ``get_rope_index`` and mlx-vlm's own processor
  (``processing_hunyuan_vl.py:458``) order them ``[p, w, h, t]``.

``hunyuan_vl_fixes`` applies both (a runtime takes one patch).

And one where transformers 5.24 departs from the model's original code, for its runtime:

- ``hunyuan_vl_xdrope_sections`` (transformers): ``HunYuanVLRotaryEmbedding.recomposition_frequencies``
  (``models/hunyuan_vl/modeling_hunyuan_vl.py:181``) gives each XD-RoPE axis ``2 * section`` contiguous channels of the
  duplicated frequency vector, so ``rotate_half``'s partners (channels ``d`` and ``d + head_dim / 2``) take different
  axes' positions wherever the axes differ (image tokens); Tencent's original ``apply_rotary_pos_emb_xdrope`` repeats
  the section list (``xdrope_section * 2``: each half split alike), as mlx-vlm does (``hunyuan_vl/language.py:81``)."""

from __future__ import annotations

from typing import Any

from ....errors import HypothesisPatchError
from ..patching import mlx_activation, mlx_call, mlx_closes, mlx_methods

__all__ = [
    "hunyuan_vl_fixes",
    "hunyuan_vl_vision_hidden_act",
    "hunyuan_vl_xdrope_positions",
    "hunyuan_vl_xdrope_sections",
]

CLOSES = mlx_closes(
    {
        "hunyuan_vl_vision_hidden_act": (
            ("vision.block.*.mlp", "vision.patch_merger.proj_act"),
            "mlx-vlm's vision tower reads vision_config.hidden_act and never uses it: its "
            "block MLP and patch merger apply the exact GELU where transformers applies hidden_act",
        ),
        "hunyuan_vl_xdrope_positions": (
            ("text.layer.*.self_attn",),
            "mlx-vlm's XD-RoPE positions start an image at every image token and stack the "
            "axes [p, t, h, w] where transformers orders them [p, w, h, t]",
        ),
    },
    "hunyuan_vl_fixes",
    "hunyuan_vl",
)
CLOSES["hunyuan_vl_xdrope_sections"] = {
    "runtimes": ("transformers",),
    "stages": ("text.layer.*.self_attn",),
    "model_types": ("hunyuan_vl",),
    "defect": "transformers gives each XD-RoPE axis 2 * section contiguous channels of the duplicated frequencies, so "
    "rotate_half's partner channels take different axes' positions; the original code splits each half alike",
}

#: model type -> runtime -> the ready patch that closes every defect found in that runtime's port of it (the
#: sweep runs each failing model type again with these)
WHOLE = {"hunyuan_vl": {"mlx": "hunyuan_vl_fixes", "transformers": "hunyuan_vl_xdrope_sections"}}


def hunyuan_vl_vision_hidden_act(model: Any) -> Any:
    """The vision MLPs and the patch merger's activation computed with the vision config's ``hidden_act``."""
    from mlx_vlm.models.hunyuan_vl.vision import PatchMerger, VisionMLP

    name = "hunyuan_vl_vision_hidden_act"
    tower = getattr(model, "vision_tower", None)
    mlps = [m for _, m in tower.named_modules() if isinstance(m, VisionMLP)] if tower is not None else []
    merger = getattr(tower, "perceive", None)
    if not mlps or not isinstance(merger, PatchMerger):
        raise HypothesisPatchError(
            f"{name} corrects mlx-vlm's HunYuan-VL vision tower; it was given a {type(model).__name__}",
            "apply it to the mlx runtime of a hunyuan_vl checkpoint",
        )
    wanted = model.config.vision_config.hidden_act
    if wanted == "gelu":
        raise HypothesisPatchError(
            f"{name}: the vision config's hidden_act is 'gelu', which mlx-vlm already computes",
            "leave the patch out for this checkpoint",
        )
    act = mlx_activation(wanted, name)

    def __call__(self, x):
        return self.dense_4h_to_h(act(self.dense_h_to_4h(x)))

    for mlp in mlps:
        mlx_call(mlp, __call__)
    merger.proj[1] = mlx_activation(wanted, name)  # the list the merger's call runs: its place (proj.1) kept
    return model


def _xdrope_positions(self, input_tokens, image_grid_thw, image_token_id: int, spatial_merge_size: int):
    """transformers' ``get_rope_index`` for one prompt: sequential positions on every axis, then in each run of image
    tokens (an image's begin row, its ``(w + 1) * h`` grid, its end row) the grid's width, height and image index on
    the last three axes."""
    import mlx.core as mx
    import numpy as np

    axes = len(self.args.rope_scaling["xdrope_section"])
    tokens = np.asarray(input_tokens)
    positions = np.tile(np.arange(len(tokens)), (axes, 1))
    image = tokens == image_token_id
    starts = np.flatnonzero(image & ~np.r_[False, image[:-1]])
    ends = np.flatnonzero(image & ~np.r_[image[1:], False]) + 1
    grids = [] if image_grid_thw is None else np.asarray(image_grid_thw).reshape(-1, 3).tolist()
    for index, (start, end, (_, height, width)) in enumerate(zip(starts, ends, grids, strict=False)):
        rows, cols = np.meshgrid(
            np.arange(height // spatial_merge_size), np.arange(width // spatial_merge_size + 1), indexing="ij"
        )
        first = start if end - start == rows.size else start + 1  # past the begin row where the span has one
        positions[axes - 3 : axes - 1, first : first + rows.size] = [cols.ravel(), rows.ravel()]
        positions[axes - 1, first : first + rows.size] = index
    return mx.array(positions)


def hunyuan_vl_xdrope_positions(model: Any) -> Any:
    """XD-RoPE positions computed as transformers does where the processor gives none."""
    from mlx_vlm.models.hunyuan_vl.language import LanguageModel

    language = getattr(model, "language_model", None)
    if not isinstance(language, LanguageModel):
        raise HypothesisPatchError(
            f"hunyuan_vl_xdrope_positions corrects mlx-vlm's HunYuan-VL language model; it was given a "
            f"{type(model).__name__}",
            "apply it to the mlx runtime of a hunyuan_vl checkpoint",
        )
    mlx_methods(language, get_xdrope_input_positions=_xdrope_positions)
    language._position_ids = None  # what an earlier prompt left (its prefill reuses it)
    return model


def hunyuan_vl_fixes(model: Any) -> Any:
    """Both: the vision activation and the XD-RoPE positions."""
    return hunyuan_vl_xdrope_positions(hunyuan_vl_vision_hidden_act(model))


def hunyuan_vl_xdrope_sections(model: Any) -> Any:
    """(transformers' model) XD-RoPE frequencies recomposed as the original code does: each half of the rotary
    channels split by the section list, channel ``d`` and ``d + head_dim / 2`` on the same axis."""
    import torch
    from transformers.models.hunyuan_vl.modeling_hunyuan_vl import HunYuanVLRotaryEmbedding

    found = [m for m in model.modules() if isinstance(m, HunYuanVLRotaryEmbedding)] if hasattr(model, "modules") else []
    if not found:
        raise HypothesisPatchError(
            f"hunyuan_vl_xdrope_sections corrects transformers' HunYuan-VL rotary embedding; it was given a "
            f"{type(model).__name__}",
            "apply it to the transformers runtime of a hunyuan_vl checkpoint",
        )

    def recompose(rotary):
        def recomposition_frequencies(freq):
            sections = list(rotary.mrope_section) * 2
            parts = torch.cat((freq, freq), dim=-1).split(sections, dim=-1)
            return torch.cat([part[i % len(rotary.mrope_section)] for i, part in enumerate(parts)], dim=-1)

        return recomposition_frequencies

    for rotary in found:
        rotary.recomposition_frequencies = recompose(rotary)  # the method its forward calls, on this instance
    return model
