"""Qwen2.5-VL's named, documented defects, applied to eager MLX (mlx-vlm), to prove a fixture's power.

Each mutation says which stage it should disturb first and, from the inputs' geometry alone,
when the fixture is blind to it (one window, one image, an involutive permutation). Mutations
register by name, like runtimes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from driftscope.core.registry import Registry
from driftscope.inputs.processor_output import ModelInputs
from driftscope.taps.mlx_hooks import module_attr, use_manual_rmsnorm
from driftscope.taps.stages import StagePlan

from ..base import Mutation
from ..qwen_shared.grids import one_segment
from .geometry import is_involution, window_layout
from .mlx import rms_norms

MUTATIONS: Registry[Mutation] = Registry("mutation")


def _grids(inputs: ModelInputs) -> list[list[int]]:
    return [list(map(int, g)) for g in np.asarray(inputs["grid_thw"]).reshape(-1, 3)]


def _windows_per_image(inputs: ModelInputs) -> list[int]:
    return [window_layout([g]).windows_per_image[0] for g in _grids(inputs)]


def _window_blocks(plan: StagePlan) -> list[int]:
    full = set(plan.meta.get("fullatt_block_indexes", []))
    return [b for b in range(plan.depth) if b not in full]


def _full_blocks(plan: StagePlan) -> list[int]:
    return sorted(plan.meta.get("fullatt_block_indexes", []))


def _one_window(inputs: ModelInputs, plan: StagePlan) -> str | None:
    counts = _windows_per_image(inputs)
    if all(n == 1 for n in counts):
        return f"every image has a single attention window ({counts}): the window permutation is the identity"
    return None


def _identity(inputs: ModelInputs, plan: StagePlan) -> str | None:
    if np.array_equal(index := window_layout(_grids(inputs)).window_index, np.arange(len(index))):
        return "window order is raster order in every image (one window across each): the permutation is the identity"
    return None


def _involution(inputs: ModelInputs, plan: StagePlan) -> str | None:
    index = window_layout(_grids(inputs)).window_index
    if is_involution(index):
        return (
            "the window permutation of these images is an involution: applying it twice restores the order, "
            "so a wrong un-reorder looks right (use e.g. 336x336)"
        )
    return None


def _one_image(inputs: ModelInputs, plan: StagePlan) -> str | None:
    return one_segment(inputs["grid_thw"], inputs["pixel_values"])


class _Rewire:
    """Calls a block with rewritten keyword arguments (cu_seqlens or rotary angles)."""

    def __init__(self, block: Any, rewrite: Callable[[dict], dict]):
        self.block, self.rewrite = block, rewrite

    def __call__(self, hidden_states, cu_seqlens, rotary_pos_emb):
        kwargs = self.rewrite({"cu_seqlens": cu_seqlens, "rotary_pos_emb": rotary_pos_emb})
        return self.block(hidden_states, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.block, name)


def _identity_permutation(model, settings):
    import mlx.core as mx

    tower = model.vision_tower
    original = tower.get_window_index

    def identity(grid_thw):
        index, bounds = original(grid_thw)
        return mx.arange(index.shape[0]), bounds

    object.__setattr__(tower, "get_window_index", identity)


def _full_everywhere(model, settings):
    tower = model.vision_tower
    tower.fullatt_block_indexes = list(range(len(tower.blocks)))


@contextmanager
def _rank_scatter(model, settings) -> Iterator[None]:
    import mlx.core as mx
    from mlx_vlm.models.qwen2_5_vl import vision as vision_module

    class _Core:
        def __getattr__(self, name):
            return getattr(mx, name)

        @staticmethod
        def argsort(index, axis=0):  # the shipped construction: reverse[orig] = rank, i.e. the index itself
            return index

    with module_attr(vision_module, "mx", _Core()):
        yield


def _tanh_gelu(model, settings):
    import mlx.nn as nn

    merger = model.vision_tower.merger
    merger.mlp[1] = nn.GELU(approx="tanh")


@contextmanager
def _silu_by_division(model, settings) -> Iterator[None]:
    import mlx.core as mx
    import mlx.nn as nn

    with module_attr(nn, "silu", lambda x: x / (1 + mx.exp(-x))):
        yield


def _manual_rmsnorm(model, settings):
    use_manual_rmsnorm(rms_norms(model))


def _drop_rotary(model, settings):
    import mlx.core as mx

    tower = model.vision_tower
    block = int(settings.get("block", 1))
    tower.blocks[block] = _Rewire(
        tower.blocks[block], lambda kw: dict(kw, rotary_pos_emb=mx.zeros_like(kw["rotary_pos_emb"]))
    )


def _cross_image_leak(model, settings):
    import mlx.core as mx

    tower = model.vision_tower
    for block in tower.fullatt_block_indexes:
        tower.blocks[block] = _Rewire(
            tower.blocks[block], lambda kw: dict(kw, cu_seqlens=mx.array([0, int(kw["cu_seqlens"][-1])]))
        )


def _block_stages(blocks: Callable[[StagePlan], list[int]], *substages: str) -> Callable[[StagePlan], list[str]]:
    def stages(plan: StagePlan) -> list[str]:
        chosen = blocks(plan)
        if not chosen:
            return []
        b = chosen[0]
        return [f"vision.block.{b}.{s}" for s in substages] + [f"vision.block.{b}"]

    return stages


for mutation in (
    Mutation(
        "identity_window_permutation",
        "window_index replaced by the identity: windows are formed from consecutive raster tokens instead of 2-D tiles",
        lambda plan: ["vision.window_index"],
        _identity_permutation,
        _identity,
    ),
    Mutation(
        "full_attention_everywhere",
        "every block attends over the whole image (Qwen2-VL style), ignoring the window schedule",
        _block_stages(_window_blocks, "attn.context"),
        _full_everywhere,
        _one_window,
    ),
    Mutation(
        "rank_scatter_unreorder",
        "the final un-reorder uses reverse[orig] = rank (the permutation applied twice) instead of argsort",
        lambda plan: ["vision.merger"],
        None,
        _involution,
        during=_rank_scatter,
    ),
    Mutation(
        "tanh_gelu",
        "the merger's exact-erf GELU computed with the tanh approximation",
        lambda plan: ["vision.merger.hidden", "vision.merger.window", "vision.merger"],
        _tanh_gelu,
    ),
    Mutation(
        "silu_by_division",
        "SiLU computed as x / (1 + exp(-x)) instead of x * sigmoid(x)",
        _block_stages(lambda plan: [0], "mlp.act"),
        during=_silu_by_division,
    ),
    Mutation(
        "manual_f16_rmsnorm",
        "RMSNorm written out in the activation dtype instead of the fused kernel "
        "(squares overflow F16 above |x| = 256)",
        _block_stages(lambda plan: [0], "norm1"),
        _manual_rmsnorm,
        precision="float16",
    ),
    Mutation(
        "drop_rotary_block_1",
        "block 1 skips the rotary embedding",
        _block_stages(lambda plan: [1], "attn.q"),
        _drop_rotary,
        settings={"block": 1},
    ),
    Mutation(
        "cross_image_leak",
        "full-attention blocks attend across the images (and a video's frames) of a packed bucket",
        _block_stages(_full_blocks, "attn.context"),
        _cross_image_leak,
        _one_image,
    ),
):
    MUTATIONS.register(mutation.name, mutation)
