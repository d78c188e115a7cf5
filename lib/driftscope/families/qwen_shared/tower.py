"""The transformers vision tower of both Qwen families and the tensors its forward takes."""

from __future__ import annotations

from typing import Any

from driftscope.inputs.processor_output import ModelInputs


def visual(model: Any) -> Any:
    """The vision tower of a transformers Qwen VL model."""
    return model.model.visual


def tower_inputs(model: Any, inputs: ModelInputs):
    """(pixel_values in the tower's dtype, grid_thw) as torch tensors."""
    import torch

    dtype = next(visual(model).parameters()).dtype
    return torch.from_numpy(inputs["pixel_values"]).to(dtype), torch.from_numpy(inputs["grid_thw"])
