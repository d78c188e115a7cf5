"""The vision tower of both Qwen families: transformers' and the tensors its forward takes, the values of the
stages both libraries' towers hold on modules of the same names (``taps.module_taps``), the axis sizes the plans
name, and a planted defect in one block."""

from __future__ import annotations

from typing import Any

import numpy as np

from driftscope.inputs.processor_output import ModelInputs
from driftscope.taps.module_taps import ModuleTap, argument, both, each, output


def visual(model: Any) -> Any:
    """The vision tower of a transformers Qwen VL model."""
    return model.model.visual


def tower_inputs(model: Any, inputs: ModelInputs):
    """(pixel_values in the tower's dtype, grid_thw) as torch tensors."""
    import torch

    dtype = next(visual(model).parameters()).dtype
    return torch.from_numpy(inputs["pixel_values"]).to(dtype), torch.from_numpy(inputs["grid_thw"])


def modalities(inputs: ModelInputs) -> dict[str, Any]:
    """The packed processor output split as a Qwen model's forward takes it: ``images`` and ``videos`` (the grids
    and pixel rows of each, numpy; None where there are none) and ``image_rows`` (how many merged rows of the
    tower's output are the images')."""
    import numpy as np

    grid = np.asarray(inputs["grid_thw"])
    videos = len(inputs.video_paths or [])
    split = len(grid) - videos
    patches = int(grid[:split].prod(axis=1).sum())
    pixels = inputs["pixel_values"]
    return {
        "image_grid": grid[:split] if split else None,
        "video_grid": grid[split:] if videos else None,
        "image_pixels": pixels[:patches] if split else None,
        "video_pixels": pixels[patches:] if videos else None,
        "image_rows": int(np.asarray(inputs.image_tokens)[:split].sum()),
    }


def torch_vision_kwargs(model: Any, inputs: ModelInputs, tower: Any = None) -> dict[str, Any]:
    """The vision keyword arguments of a transformers Qwen forward: images and videos apart (``image_grid_thw``,
    ``video_grid_thw``, their pixels or, given the tower's ``output`` for the packed inputs, its merged rows split
    per image and per video as ``mm_encoder_outputs``) and a video's ``second_per_grid_ts`` where the prompt
    recorded it."""
    import torch

    parts = modalities(inputs)
    dtype = next(visual(model).parameters()).dtype
    merge = visual(model).spatial_merge_size
    kwargs: dict[str, Any] = {}
    encoded: dict[str, Any] = {}
    rows = tower.pooler_output if tower is not None else None
    for name, grid_key, pixel_key, start in (
        ("image", "image_grid_thw", "pixel_values", 0),
        ("video", "video_grid_thw", "pixel_values_videos", parts["image_rows"]),
    ):
        grid = parts[f"{name}_grid"]
        if grid is None:
            continue
        kwargs[grid_key] = torch.from_numpy(grid)
        if rows is None:
            kwargs[pixel_key] = torch.from_numpy(parts[f"{name}_pixels"]).to(dtype)
            continue
        sizes = (grid.prod(-1) // merge**2).tolist()
        mine = rows[start : start + sum(sizes)]
        encoded[name] = type(tower)(pooler_output=torch.split(mine, sizes))
    if encoded:
        kwargs["mm_encoder_outputs"] = encoded
    seconds = getattr(getattr(inputs, "text", None), "second_per_grid_ts", None)
    if parts["video_grid"] is not None and seconds:
        kwargs["second_per_grid_ts"] = torch.tensor(seconds, dtype=torch.float32)
    return kwargs


def value_heads(heads: int):
    """The values of a block's fused ``qkv`` projection output ``[rows, 3 * heads * head_dim]``, as ``[rows, heads,
    head_dim]`` (a numpy selector for ``taps.module_taps``)."""

    def select(array: np.ndarray) -> np.ndarray:
        return array.reshape(array.shape[0], 3, heads, -1)[:, 2]

    return select


def block_taps(tower: Any, mlp: tuple[ModuleTap, ...]) -> list[ModuleTap]:
    """The stages both Qwen towers hold on modules of the same names on both sides (paths from the tower): the patch
    embedding, transformers' rotary tables (its rotary module's two outputs), and each block (``{i}``) with its
    norm1, v (the fused qkv's output, v split out), attention context (the output projection's input), attention
    output, residual1 (norm2's input), norm2, and the family's ``mlp`` taps."""
    heads = next((block.attn.num_heads for block in tower.blocks), 1)
    return [
        both("vision.patch_embed", output("patch_embed")),
        ModuleTap("vision.rotary.cos", torch=output("rotary_pos_emb", item=(0,))),
        ModuleTap("vision.rotary.sin", torch=output("rotary_pos_emb", item=(1,))),
        *each(
            len(tower.blocks),
            both("vision.block.{i}", output("blocks.{i}")),
            both("vision.block.{i}.norm1", output("blocks.{i}.norm1")),
            both("vision.block.{i}.attn.v", output("blocks.{i}.attn.qkv", value_heads(heads))),
            both("vision.block.{i}.attn.context", argument("blocks.{i}.attn.proj")),
            both("vision.block.{i}.attn.out", output("blocks.{i}.attn")),
            both("vision.block.{i}.residual1", argument("blocks.{i}.norm2")),
            both("vision.block.{i}.norm2", output("blocks.{i}.norm2")),
            *mlp,
        ),
    ]


def tower_axis_sizes(vision: dict, defaults: dict[str, int], inputs: Any = None) -> dict[str, int | str]:
    """The tower's axis sizes both Qwen plans name, from a checkpoint's ``vision`` settings (the family's released
    sizes in ``defaults`` where they are silent: ``hidden_size``, ``patch_size``, ``intermediate_size``,
    ``out_hidden_size``), and the token axes (``patches``, ``merged_tokens``, ``images``) from ``inputs``' grids,
    or by name when ``inputs`` is None."""
    hidden, heads = int(vision.get("hidden_size", defaults["hidden_size"])), int(vision.get("num_heads", 16))
    merge = int(vision.get("spatial_merge_size", 2))
    patch, temporal = int(vision.get("patch_size", defaults["patch_size"])), int(vision.get("temporal_patch_size", 2))
    sizes: dict[str, int | str] = {
        "hidden": hidden,
        "heads": heads,
        "head_dim": hidden // heads,
        "intermediate": int(vision.get("intermediate_size", defaults["intermediate_size"])),
        "merged_hidden": hidden * merge * merge,
        "out_hidden": int(vision.get("out_hidden_size", defaults["out_hidden_size"])),
        "channels": int(vision.get("in_channels", vision.get("in_chans", 3))) * temporal * patch * patch,
        "thw": 3,
        "patches": "patches",
        "merged_tokens": "merged_tokens",
        "images": "images",
    }
    if inputs is not None:
        grid = np.asarray(inputs["grid_thw"], dtype=np.int64)
        patches = int(grid.prod(axis=1).sum())
        sizes.update({"patches": patches, "merged_tokens": patches // (merge * merge), "images": len(grid)})
    return sizes


class _Scaled:
    """Calls a block and multiplies its output by a constant."""

    def __init__(self, block: Any, factor: float):
        self.block = block
        self.factor = factor

    def __call__(self, *args, **kwargs):
        return self.block(*args, **kwargs) * self.factor

    def __getattr__(self, name: str) -> Any:
        return getattr(self.block, name)


def scale_block_output(model: Any, block: int, factor: float = 1.01) -> Any:
    """Multiply vision block ``block``'s output by ``factor`` (a planted defect in one block)."""
    if hasattr(model, "vision_tower"):  # mlx-vlm: its block wrapped; transformers': hooked
        blocks = model.vision_tower.blocks
        blocks[block] = _Scaled(blocks[block], factor)
    else:
        model.model.visual.blocks[block].register_forward_hook(lambda module, args, out: out * factor)
    return model
