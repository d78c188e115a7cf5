"""Qwen3-VL's named, documented defects, applied to eager MLX (mlx-vlm) or to the processor, to prove a
fixture's power: DeepStack branches dropped, zeroed, swapped or added a layer late; the GELU forms of the
blocks and mergers exchanged; attention across the packed images and frames; the position table resampled in
bf16 or by nearest neighbour; the processor's resize bounds or resampler replaced.

Each mutation says which stage it should disturb first and, from the inputs and the plan alone, when the
fixture is blind to it (no text stages for a defect of the decoder, an image the processor does not resize,
a grid whose patches land on table rows, one attention segment).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from driftscope.core.registry import Registry
from driftscope.inputs.processor_output import ModelInputs
from driftscope.taps.stages import StagePlan

from ..base import Mutation
from ..qwen_shared.grids import one_segment
from ..qwen_shared.text import build_text_inputs
from .geometry import grid_side, lands_on_table_rows, nearest_indices
from .inputs import prepare_inputs
from .plan import deepstack_stage_id

MUTATIONS: Registry[Mutation] = Registry("mutation")

#: The resize bounds transformers' Qwen2-VL processor class falls back to (Qwen3-VL says 65536..16777216).
QWEN2_BOUNDS = {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280}
BRANCH = 1  # the DeepStack branch the single-branch mutations disturb


# ---- blindness ----------------------------------------------------------------------------------------


def _no_text(inputs: ModelInputs, plan: StagePlan) -> str | None:
    if not any(stage.id.startswith("text.layer.") for stage in plan):
        return "the run does not follow the prompt (no text: section): DeepStack features are added in the decoder"
    return None


def _too_few_branches(needed: int):
    def blind(inputs: ModelInputs, plan: StagePlan) -> str | None:
        branches = len(plan.meta.get("deepstack_visual_indexes", []))
        if branches < needed:
            return f"the checkpoint has {branches} DeepStack branch(es); this defect needs {needed}"
        return _no_text(inputs, plan)

    return blind


def _on_table_rows(inputs: ModelInputs, plan: StagePlan) -> str | None:
    side = int(str(inputs.facts.get("position_table", "48x48")).split("x")[0])
    if lands_on_table_rows(inputs["grid_thw"], side):
        return (
            f"every patch of these grids lands exactly on a row of the {side}x{side} position table: bilinear and "
            "nearest resampling read the same rows (use a size whose grid side - 1 does not divide the table's)"
        )
    return None


def _resized_the_same(inputs: ModelInputs, plan: StagePlan) -> str | None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    processor = inputs.facts["processor"]
    factor = processor["patch_size"] * processor["merge_size"]
    bounds = (QWEN2_BOUNDS["shortest_edge"], QWEN2_BOUNDS["longest_edge"])
    if all(
        tuple(smart_resize(h, w, factor, *bounds)) == tuple(resized)
        for (h, w), resized in zip(inputs.image_sizes, inputs.facts["resized"], strict=True)
    ):
        return (
            f"these images resize to the same sizes under Qwen2's bounds {bounds} and the checkpoint's "
            f"({processor['min_pixels']}, {processor['max_pixels']}): use an image below 256x256 pixels"
        )
    return None


def _not_resized(inputs: ModelInputs, plan: StagePlan) -> str | None:
    pairs = zip(inputs.image_sizes, inputs.facts["resized"], strict=True)
    if all(list(size) == list(resized) for size, resized in pairs):
        return "no image is resized (each is already the processor's size): the resampler is never used"
    return None


# ---- the defects --------------------------------------------------------------------------------------


def _deepstack_features(rewrite):
    """Install a rewrite of the DeepStack features mlx-vlm hands the decoder (the tower is untouched)."""

    def install(model: Any, settings: dict) -> None:
        original = model.get_input_embeddings

        def embeddings(*args, **kwargs):
            features = original(*args, **kwargs)
            if features.deepstack_visual_embeds is not None:
                features.deepstack_visual_embeds = rewrite(list(features.deepstack_visual_embeds), settings)
            return features

        object.__setattr__(model, "get_input_embeddings", embeddings)

    return install


def _drop(features: list, settings: dict) -> list:
    import mlx.core as mx

    branch = int(settings["branch"])
    return [mx.zeros_like(f) if k == branch else f for k, f in enumerate(features)]


def _swap(features: list, settings: dict) -> list:
    features[0], features[1] = features[1], features[0]
    return features


def _one_layer_late(features: list, settings: dict) -> list:
    import mlx.core as mx

    return [mx.zeros_like(features[0]), *features]


def _zero_branch(model: Any, settings: dict) -> None:
    import mlx.core as mx

    fc2 = model.vision_tower.deepstack_merger_list[int(settings["branch"])].linear_fc2
    fc2.weight = mx.zeros_like(fc2.weight)
    fc2.bias = mx.zeros_like(fc2.bias)


def _exact_gelu_in_blocks(model: Any, settings: dict) -> None:
    import mlx.nn as nn

    for block in model.vision_tower.blocks:
        block.mlp.act_fn = nn.GELU()


class _WholeBucket:
    """Calls a vision block with one attention segment over the whole bucket (every image and frame)."""

    def __init__(self, block: Any):
        self.block = block

    def __call__(self, hidden_states, cu_seqlens, rotary_pos_emb):
        import mlx.core as mx

        whole = mx.array([0, int(cu_seqlens[-1])], dtype=cu_seqlens.dtype)
        return self.block(hidden_states, cu_seqlens=whole, rotary_pos_emb=rotary_pos_emb)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.block, name)


def _cross_image_leak(model: Any, settings: dict) -> None:
    tower = model.vision_tower
    for index, block in enumerate(tower.blocks):
        tower.blocks[index] = _WholeBucket(block)


def _one_segment(inputs: ModelInputs, plan: StagePlan) -> str | None:
    return one_segment(inputs["grid_thw"], inputs["pixel_values"])


def _tanh_gelu_in_mergers(model: Any, settings: dict) -> None:
    import mlx.nn as nn

    tower = model.vision_tower
    for merger in [*tower.deepstack_merger_list, tower.merger]:
        merger.act_fn = nn.GELU(approx="tanh")


def _bf16_table(model: Any, settings: dict) -> None:
    import mlx.core as mx
    import mlx.nn as nn

    tower = model.vision_tower
    rows, hidden = tower.pos_embed.weight.shape
    table = nn.Embedding(rows, hidden)
    table.weight = tower.pos_embed.weight.astype(mx.bfloat16)  # mlx-vlm weights the rows in the table's dtype
    tower.pos_embed = table


def _nearest_table(model: Any, settings: dict) -> None:
    import mlx.core as mx

    tower = model.vision_tower

    def nearest(grid_thw):
        grids = np.array(grid_thw).astype(np.int64)
        index = nearest_indices(grids, grid_side(tower.pos_embed.weight.shape[0]), tower.spatial_merge_size)
        return tower.pos_embed.weight[mx.array(index.astype(np.int32))]

    object.__setattr__(tower, "fast_pos_embed_interpolate", nearest)


def _processor_inputs(overrides: dict):
    """The run's images (and videos) through the checkpoint's processor with ``overrides``, the prompt rebuilt
    around them."""

    def inputs(checkpoint, original: ModelInputs, settings: dict) -> ModelInputs:
        mutated = prepare_inputs(checkpoint, original.image_paths, overrides, video_paths=original.video_paths)
        if original.text is not None:
            text = original.text
            mutated.text = build_text_inputs(checkpoint, mutated, text.prompt, text.max_new_tokens, text.expect)
        return mutated

    return inputs


def _first_merger_act(plan: StagePlan) -> list[str]:
    return [deepstack_stage_id(0, "act"), "vision.merger.act"]


for mutation in (
    Mutation(
        "deepstack_branch_dropped",
        f"DeepStack branch {BRANCH} is computed but never added to the decoder's hidden states",
        lambda plan: [f"text.layer.{BRANCH}.deepstack"],
        _deepstack_features(_drop),
        _too_few_branches(BRANCH + 1),
        settings={"branch": BRANCH},
    ),
    Mutation(
        "deepstack_branch_zeroed",
        f"DeepStack branch {BRANCH}'s merger outputs zeros (its fc2 weights never loaded)",
        lambda plan: [deepstack_stage_id(BRANCH)],
        _zero_branch,
        _too_few_branches(BRANCH + 1),
        settings={"branch": BRANCH},
    ),
    Mutation(
        "deepstack_branches_swapped",
        "DeepStack branches 0 and 1 are added after each other's decoder layers",
        lambda plan: ["text.layer.0.deepstack"],
        _deepstack_features(_swap),
        _too_few_branches(2),
    ),
    Mutation(
        "deepstack_one_layer_late",
        "every DeepStack branch is added after the decoder layer following its own (branch k after layer k+1)",
        lambda plan: ["text.layer.0.deepstack"],
        _deepstack_features(_one_layer_late),
        _too_few_branches(1),
    ),
    Mutation(
        "exact_gelu_in_blocks",
        "the vision blocks' MLP uses exact (erf) GELU; the checkpoint says gelu_pytorch_tanh",
        lambda plan: ["vision.block.0.mlp.act", "vision.block.0.mlp.fc2", "vision.block.0"],
        _exact_gelu_in_blocks,
    ),
    Mutation(
        "cross_image_leak",
        "the vision blocks attend across the images and a video's frames of a packed bucket (one attention "
        "segment, not one per frame)",
        lambda plan: ["vision.block.0.attn.context", "vision.block.0"],
        _cross_image_leak,
        _one_segment,
    ),
    Mutation(
        "tanh_gelu_in_mergers",
        "the patch mergers (main and DeepStack) use the tanh GELU; they are exact (erf)",
        _first_merger_act,
        _tanh_gelu_in_mergers,
    ),
    Mutation(
        "bf16_position_interpolation",
        "the position table is resampled in bf16 (rows and weights) before the add to the f32 patch embedding",
        lambda plan: ["vision.pos_embed", "vision.positioned"],
        _bf16_table,
    ),
    Mutation(
        "nearest_position_interpolation",
        "the position table is resampled by nearest neighbour instead of bilinearly (align_corners)",
        lambda plan: ["vision.pos_embed", "vision.positioned"],
        _nearest_table,
        _on_table_rows,
    ),
    Mutation(
        "qwen2_resize_bounds",
        f"the processor resizes with Qwen2-VL's default bounds {tuple(QWEN2_BOUNDS.values())} instead of the "
        "checkpoint's (e.g. a preprocessor_config.json without size)",
        lambda plan: ["inputs.pixel_values"],
        blind=_resized_the_same,
        inputs=_processor_inputs({"size": dict(QWEN2_BOUNDS)}),
    ),
    Mutation(
        "bilinear_resampling",
        "the processor resizes images bilinearly instead of bicubically (PIL resample 2 instead of 3)",
        lambda plan: ["inputs.pixel_values"],
        blind=_not_resized,
        inputs=_processor_inputs({"resample": 2}),
    ),
):
    MUTATIONS.register(mutation.name, mutation)
