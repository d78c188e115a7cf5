"""Molmo2's stage plan: vision, pooling, projector and text stages in execution order, what each replay reads;
the module table both engines tap (``ModuleTap``); the replay context the replays read."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from driftscope.taps.module_taps import ModuleTap, Select, argument, decoder_taps, each, output
from driftscope.taps.sink import decode_stages
from driftscope.taps.stages import VIT_ATTENTION_INPUTS, VIT_MLP_INPUTS, Rotary, Stage, StagePlan, block_stage_id
from driftscope.taps.tapset import TapSet

from ...errors import CheckpointError, TapFileError
from .config import read_facts

# Molmo2's stage plan: vision, pooling, projector and text stages in execution order, what each replay reads.
#
# ViT stages are per crop, ``[crops, patches, ...]`` (raster order within each crop, the low-resolution crop
# first; ``plan.meta["row_axes"]`` says the two leading axes together index patch rows). Pooled stages have one
# row per pooled token (token unit ``merged``: a 2 x 2 window of patches). ``vision.selected.L`` is named by the
# layer the config selects, resolved against the DECLARED depth; the pooling indices, valid counts and the
# decoder's attention mask are integers (compared exactly).

NAME = "molmo2"

#: Substages of one ViT block, in execution order: (name, axes, meaning).
BLOCK_SUBSTAGES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("norm1", ("crops", "patches", "hidden"), "LayerNorm before attention"),
    ("attn.q", ("crops", "patches", "heads", "head_dim"), "query projection (with bias)"),
    ("attn.k", ("crops", "patches", "heads", "head_dim"), "key projection (with bias)"),
    ("attn.v", ("crops", "patches", "heads", "head_dim"), "value projection (with bias)"),
    ("attn.context", ("crops", "patches", "hidden"), "attention context over the crop, heads concatenated"),
    ("attn.out", ("crops", "patches", "hidden"), "attention output projection"),
    ("residual1", ("crops", "patches", "hidden"), "block input + attention output"),
    ("norm2", ("crops", "patches", "hidden"), "LayerNorm before the MLP"),
    ("mlp.fc1", ("crops", "patches", "mlp"), "fc1"),
    ("mlp.act", ("crops", "patches", "mlp"), "GELU (tanh approximation) of fc1"),
    ("mlp.fc2", ("crops", "patches", "hidden"), "fc2"),
)

#: What each substage reads, by substage name; "in" is the block's input.
SUBSTAGE_INPUTS: dict[str, tuple[str, ...]] = {**VIT_ATTENTION_INPUTS, **VIT_MLP_INPUTS}

#: The pooler and projector: (stage, axes, meaning, what a replay reads). Rows are pooled tokens.
HEAD: tuple[tuple[str, tuple[str, ...], str, tuple[str, ...] | None], ...] = (
    ("pool.gathered", ("tokens", "slots", "pool_dim"), "each token's patches by index, padding slots zero",
     ("vision.concatenated",)),
    ("pool.valid_counts", ("tokens",), "valid patches per token (the query's denominator)", None),
    ("pool.query", ("tokens", "pool_dim"), "mean of the valid patches", ("pool.gathered",)),
    ("pool.output", ("tokens", "adapter_hidden"), "attention over the valid patches, output projection",
     ("pool.query", "pool.gathered")),
    ("projector.gate", ("tokens", "projector_hidden"), "gate projection", ("pool.output",)),
    ("projector.act", ("tokens", "projector_hidden"), "SiLU(gate)", ("projector.gate",)),
    ("projector.up", ("tokens", "projector_hidden"), "up projection", ("pool.output",)),
    ("projector.product", ("tokens", "projector_hidden"), "SiLU(gate) * up", ("projector.act", "projector.up")),
    ("projector.output", ("tokens", "text_hidden"), "down projection: the image features", ("projector.product",)),
)  # fmt: skip

FINAL = "projector.output"


def block_input(block: int) -> str:
    return "vision.positioned" if block == 0 else block_stage_id(block - 1)


def parse_stage(stage_id: str) -> tuple[int | None, str]:
    """``vision.block.3.mlp.fc1`` -> (3, "mlp.fc1"); ``vision.block.3`` -> (3, "block"); others -> (None, id)."""
    parts = stage_id.split(".")
    if stage_id.startswith("vision.block."):
        return int(parts[2]), ".".join(parts[3:]) or "block"
    return None, stage_id


def _vit(stage_id: str, axes: tuple[str, ...], description: str, **kw) -> Stage:
    return Stage(stage_id, axes, "raster", "patch", description=description, **kw)


def vision_plan(config: dict) -> StagePlan:
    """Every image-side stage of Molmo2 for this checkpoint config (either layout), in execution order."""
    facts = read_facts(config)
    depth = facts.execution_depth
    if len(set(facts.selected_layers)) != len(facts.selected_layers):
        raise CheckpointError(
            f"vit_layers {list(facts.adapter.configured_layers)} select one layer twice "
            f"({list(facts.selected_layers)}); driftscope names the selected stages by layer",
            "list each ViT layer once in adapter_config.vit_layers",
        )
    hidden = ("crops", "patches", "hidden")
    stages = [
        _vit("inputs.pixel_values", ("crops", "patches", "pixels"), "crop pixels, 14x14x3 per patch row", data=True),
        Stage(
            "inputs.pooling",
            ("tokens", "slots"),
            integer=True,
            description="pooling indices, -1 for padding",
            data=True,
        ),
        Stage("inputs.grids", ("images", "grid"), integer=True, description="low/high-res token rows, cols", data=True),
        Stage("inputs.num_crops", ("images",), integer=True, description="crops per image", data=True),
        Stage("inputs.image_tokens", ("images",), integer=True, description="pooled tokens per image", data=True),
        _vit("vision.patch_embed", hidden, "linear patch embedding of 14x14x3 pixel rows"),
        Stage("vision.pos_embed", ("positions", "hidden"), side=True, description="learned positions of one crop"),
        _vit("vision.positioned", hidden, "patch embedding + positions (block 0 input)"),
    ]
    for block in range(depth):
        for name, axes, meaning in BLOCK_SUBSTAGES:
            stages.append(_vit(block_stage_id(block, name), axes, meaning, block=block, substage=name))
        stages.append(_vit(block_stage_id(block), hidden, "block output", block=block))
    for slot, layer in enumerate(facts.selected_layers):
        configured = facts.adapter.configured_layers[slot]
        stages.append(
            _vit(f"vision.selected.{layer}", hidden, f"ViT layer {layer} (configured {configured}), slot {slot}")
        )
    stages.append(
        _vit("vision.concatenated", ("crops", "patches", "pool_dim"), "selected layers concatenated, configured order")
    )
    for stage_id, axes, meaning, _ in HEAD:
        counts = stage_id == "pool.valid_counts"  # index math: how many pooling slots are real
        stages.append(Stage(stage_id, axes, "raster", "merged", integer=counts, description=meaning, data=counts))
    meta = {
        "layout": facts.layout,
        "declared_depth": facts.vit.declared_depth,
        "configured_layers": list(facts.adapter.configured_layers),
        "selected_layers": list(facts.selected_layers),
        "execution_depth": depth,
        "row_axes": ["crops", "patches"],  # leading axes that together index a stage's token rows
        "token_orders": {},
        "landmarks": ["vision.patch_embed", "vision.concatenated", FINAL],
        # the prompt's <im_patch> token, which the text replays read to rebuild the input embeddings
        "image_token_id": facts.image_patch_id,
    }
    return StagePlan(NAME, stages, depth, meta)


#: The whole prompt's input embeddings (``<im_patch>`` slots from ``text.embeds.image``, the rest from
#: ``text.embeds.text``), a view the replay context builds: what text layer 0 reads.
TEXT_INPUT = "text.embeds@sequence"


def text_layer_input(layer: int) -> str:
    return TEXT_INPUT if layer == 0 else f"text.layer.{layer - 1}"


def text_layers(plan: StagePlan) -> int:
    """How many decoder layers the plan follows (0 without the text stages)."""
    return sum(1 for stage in plan if stage.id.startswith("text.layer.") and stage.id.endswith(".last"))


def text_replay_inputs(stage_id: str, plan: StagePlan) -> tuple[str, ...] | None:
    """What a text stage's replay reads: a layer its predecessor's whole sequence and the decoder's mask (the
    positions are the sequence's indices); the final norm and the logits the last position."""
    parts = stage_id.split(".")
    if parts[1] == "layer":
        return (text_layer_input(int(parts[2])), "text.attention_mask")
    layers = text_layers(plan)
    return {
        "text.attention_mask": ("text.input_ids", "text.token_types"),
        "text.embeds.image": (FINAL,),
        "text.embeds.text": ("text.input_ids",),
        "text.norm.last": (f"text.layer.{layers - 1}.last",) if layers else None,
        "text.logits.last": ("text.norm.last",),
    }.get(stage_id)


def replay_inputs(stage_id: str, plan: StagePlan) -> tuple[str, ...] | None:
    """The stages a replay of ``stage_id`` reads (None: not replayable, e.g. index data and decoding)."""
    if stage_id.startswith("text."):
        return text_replay_inputs(stage_id, plan)
    block, kind = parse_stage(stage_id)
    if block is not None:
        if kind == "block":
            return (block_input(block),)
        return tuple(block_input(block) if n == "in" else block_stage_id(block, n) for n in SUBSTAGE_INPUTS[kind])
    selected = [int(layer) for layer in plan.meta.get("selected_layers", [])]
    if stage_id.startswith("vision.selected."):  # the runtime picks which block outputs it concatenates
        return tuple(block_stage_id(b) for b in range(plan.depth))
    head = {name: reads for name, _, _, reads in HEAD}
    return {
        "vision.patch_embed": ("inputs.pixel_values",),
        "vision.positioned": ("vision.patch_embed",),
        "vision.concatenated": tuple(f"vision.selected.{layer}" for layer in selected),
        **head,
    }.get(stage_id)


def text_stages(config: dict, max_new_tokens: int) -> list[Stage]:
    """After the projector: the prompt, the merged embeddings, the decoder's mask, each layer, logits, tokens."""
    facts = read_facts(config).text
    layers = facts.layers
    stages = [
        Stage("text.input_ids", ("tokens",), integer=True, description="prompt token ids", data=True),
        Stage(
            "text.token_types",
            ("tokens",),
            integer=True,
            description="1 for image tokens (mm_token_type_ids)",
            data=True,
        ),
        Stage("text.embeds.image", ("image_tokens", "text_hidden"), description="<im_patch> embeddings + features"),
        Stage("text.embeds.text", ("text_tokens", "text_hidden"), description="embeddings at the other slots"),
        Stage(
            "text.attention_mask",
            ("tokens", "tokens"),
            integer=True,
            description="1 where a prefill query row may read a key column (image tokens both ways)",
        ),
    ]
    for i in range(layers):
        stages += [
            Stage(f"text.layer.{i}", ("tokens", "text_hidden"), description=f"text layer {i} output, every position"),
            Stage(f"text.layer.{i}.last", ("text_hidden",), description=f"text layer {i} output, last position"),
        ]
    stages += [
        Stage("text.norm.last", ("text_hidden",), description="final norm, last position"),
        Stage("text.logits.last", ("vocab",), description="prefill logits, last position"),
        *decode_stages(max_new_tokens, decoder_rotary(facts)),
    ]
    return stages


def decoder_rotary(text) -> Rotary | None:
    """How the decoder rotates its keys (``rotate_half`` over the whole head, a position its index); None for a
    scaled RoPE, whose frequencies are not ``theta ** (-2i / d)`` (the contract alone judges it)."""
    return Rotary.default(text.rope_theta, text.head_dim) if text.rope_type == "default" else None


# Molmo2's stages that are a module's output or input, declared for both sides (``taps.module_taps``): paths from
# transformers' ``model.model`` and mlx-vlm's ``vision_tower`` (the names differ), ``{i}`` each ViT layer; and the
# decoder's. What no module gives is written by ``torch`` and ``mlx``: the position table (a
# parameter), and on MLX the selected layers' features (what a method returns), the pooler's valid slots (from the
# indices) and the projector's SiLU (a function its module calls).

TORCH_VIT, MLX_VIT = "vision_tower.layers.{i}", "image_vit.transformer.{i}"
TORCH_ADAPTER = "multi_modal_projector"


def heads(head_dim: int) -> Select:
    """A projection's output ``[..., heads * head_dim]`` split into ``[..., heads, head_dim]``."""

    def select(array: np.ndarray) -> np.ndarray:
        return array.reshape(*array.shape[:-1], -1, head_dim)

    return select


def selected_slot(slot: int, count: int) -> Select:
    """Slot ``slot`` of the ``count`` selected layers' features concatenated on the last axis (a numpy or an MLX
    array)."""

    def select(features: np.ndarray) -> np.ndarray:
        width = features.shape[-1] // count
        return features[..., slot * width : (slot + 1) * width]

    return select


def _first(array: np.ndarray) -> np.ndarray:  # mlx-vlm's projector runs on [batch, tokens, ...]
    return array[0]


def _first_query(array: np.ndarray) -> np.ndarray:
    return array[:, 0]


def _valid_counts(pooling: np.ndarray) -> np.ndarray:
    return (pooling >= 0).sum(-1)


def _vit_tap(stage: str, torch: tuple[str, bool], mlx: tuple[str, bool], select: Select | None = None) -> ModuleTap:
    """A ViT layer's stage: each side's module under its layer and whether the stage is that module's input."""

    def port(layer: str, path: str, is_input: bool):
        where = f"{layer}.{path}" if path else layer
        return argument(where, select) if is_input else output(where, select)

    return ModuleTap(f"vision.block.{{i}}{stage}", port(TORCH_VIT, *torch), port(MLX_VIT, *mlx))


def vit_taps(depth: int, head_dim: int) -> list[ModuleTap]:
    """The ViT's stages on one side's ``depth`` layers (each side builds the table with its own depth)."""
    split = heads(head_dim)
    return [
        ModuleTap("vision.patch_embed", output("vision_tower.patch_embedding"), output("image_vit.patch_embedding")),
        ModuleTap("vision.positioned", argument("vision_tower.layers.0"), argument("image_vit.transformer.0")),
        *each(
            depth,
            _vit_tap(".norm1", ("layer_norm1", False), ("attention_norm", False)),
            _vit_tap(".attn.q", ("self_attn.q_proj", False), ("attention.wq", False), split),
            _vit_tap(".attn.k", ("self_attn.k_proj", False), ("attention.wk", False), split),
            _vit_tap(".attn.v", ("self_attn.v_proj", False), ("attention.wv", False), split),
            _vit_tap(".attn.context", ("self_attn.o_proj", True), ("attention.wo", True)),
            _vit_tap(".attn.out", ("self_attn.o_proj", False), ("attention.wo", False)),
            _vit_tap(".residual1", ("layer_norm2", True), ("ffn_norm", True)),
            _vit_tap(".norm2", ("layer_norm2", False), ("ffn_norm", False)),
            _vit_tap(".mlp.fc1", ("mlp.fc1", False), ("feed_forward.w1", False)),
            _vit_tap(".mlp.act", ("mlp.fc2", True), ("feed_forward.act", False)),
            _vit_tap(".mlp.fc2", ("mlp.fc2", False), ("feed_forward.w2", False)),
            _vit_tap("", ("", False), ("", False)),
        ),
    ]


def adapter_taps(selected_layers: list[int]) -> list[ModuleTap]:
    """The adapter's stages: the selected layers' features and their concatenation (transformers: the adapter's
    input), the pooler's query, gathered patches and output, the projector's pieces."""
    pool, projector = f"{TORCH_ADAPTER}.image_pooling_2d", f"{TORCH_ADAPTER}.image_projector"
    count = len(selected_layers)
    return [
        *(
            ModuleTap(f"vision.selected.{layer}", argument(TORCH_ADAPTER, selected_slot(slot, count)))
            for slot, layer in enumerate(selected_layers)
        ),
        ModuleTap("vision.concatenated", argument(TORCH_ADAPTER)),
        ModuleTap("pool.valid_counts", argument(TORCH_ADAPTER, _valid_counts, index=1)),
        ModuleTap("pool.query", argument(pool, _first_query), argument("image_pooling_2d", _first_query)),
        ModuleTap("pool.gathered", argument(pool, index=1), argument("image_pooling_2d", index=1)),
        ModuleTap("pool.output", output(pool, _first_query, item=(0,)), output("image_pooling_2d", _first_query)),
        ModuleTap("projector.gate", output(f"{projector}.gate_proj"), output("image_projector.w1", _first)),
        ModuleTap("projector.act", output(f"{projector}.act_fn")),
        ModuleTap("projector.up", output(f"{projector}.up_proj"), output("image_projector.w3", _first)),
        ModuleTap("projector.product", argument(f"{projector}.down_proj"), argument("image_projector.w2", _first)),
        ModuleTap("projector.output", output(f"{projector}.down_proj"), output("image_projector.w2", _first)),
    ]


def text_taps(layers: int) -> list[ModuleTap]:
    """The decoder's stages: transformers' ``model.model.language_model`` layers and norm, mlx-vlm's decoder's
    blocks and final norm."""
    return decoder_taps(layers, torch=("layers", "norm"), mlx=("blocks", "ln_f"))


# What every replayed Molmo2 stage needs besides its inputs: the pooling indices and the selected layers; for
# the text stages the prompt's token ids and where its ``<im_patch>`` slots are.


@dataclass
class ReplayContext:
    """Side inputs taken from the reference run."""

    pooling: np.ndarray  # [tokens, slots] int64, -1 for padding
    selected_layers: tuple[int, ...]  # resolved, configured order (the plan's)
    input_ids: np.ndarray | None = None  # the prompt (text stages only)
    image_token_id: int | None = None  # <im_patch>

    @property
    def valid(self) -> np.ndarray:
        return self.pooling >= 0

    @property
    def image_slots(self) -> np.ndarray:
        """Where the prompt's ``<im_patch>`` tokens are (a [tokens] mask)."""
        return self.input_ids == self.image_token_id

    def flat_pooling(self) -> np.ndarray:
        """Indices that gather ``pool.gathered`` rows back in order: row ``t * slots + s``, -1 where padded."""
        tokens, slots = self.pooling.shape
        return np.where(self.valid, np.arange(tokens * slots).reshape(tokens, slots), -1).astype(np.int64)

    def slot(self, layer: int) -> int:
        return self.selected_layers.index(layer)

    @classmethod
    def from_plan(cls, reference: TapSet, plan: StagePlan) -> ReplayContext:
        if "inputs.pooling" not in reference:
            raise TapFileError(
                f"the reference TapSet {reference.tensor_path.name} lacks inputs.pooling, needed to replay the pooler",
                "capture the inputs stages (they are in every default stage selection)",
            )
        ctx = cls(
            np.asarray(reference["inputs.pooling"]).astype(np.int64),
            tuple(int(layer) for layer in plan.meta.get("selected_layers", [])),
        )
        if "text.input_ids" in reference:
            ctx.input_ids = np.asarray(reference["text.input_ids"]).astype(np.int64)
            ctx.image_token_id = int(plan.meta.get("image_token_id", -1))
        return ctx

    def stage(self, reference: TapSet, stage_id: str) -> np.ndarray | None:
        """A reference stage as a replay input (``text.embeds@sequence``: the whole prompt's embeddings)."""
        if stage_id == TEXT_INPUT:
            return self.text_sequence(reference)
        return np.asarray(reference[stage_id]) if stage_id in reference else None

    def text_sequence(self, reference: TapSet) -> np.ndarray | None:
        """The whole prompt's input embeddings: image slots from ``text.embeds.image``, the rest from
        ``text.embeds.text``."""
        if self.input_ids is None or not {"text.embeds.image", "text.embeds.text"} <= set(reference.stage_ids()):
            return None
        image, text = np.asarray(reference["text.embeds.image"]), np.asarray(reference["text.embeds.text"])
        sequence = np.zeros((len(self.input_ids), image.shape[-1]), dtype=np.float32)
        sequence[self.image_slots] = image
        sequence[~self.image_slots] = text
        return sequence
