"""The vision and text settings the emitter needs, read from a checkpoint's config.json."""

from __future__ import annotations

from dataclasses import dataclass

from ....errors import CheckpointError

#: The vision MLP activations the emitter computes, by the config's ``hidden_act``: approximate (tanh) or not.
GELU_FORMS = {"gelu_pytorch_tanh": True, "gelu": False}


def _section(config: dict, key: str, fix: str) -> dict:
    section = dict(config.get(key) or {})
    if not section:
        raise CheckpointError(f"config.json has no {key}", fix)
    return section


@dataclass(frozen=True)
class VisionSpec:
    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    out_hidden_size: int
    in_channels: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    num_position_embeddings: int
    deepstack_visual_indexes: tuple[int, ...]
    rope_theta: float = 10000.0
    hidden_act: str = "gelu_pytorch_tanh"
    eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size**2

    @property
    def merged_hidden(self) -> int:
        return self.hidden_size * self.merge_unit

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def grid_side(self) -> int:
        return int(round(self.num_position_embeddings**0.5))

    @property
    def tanh_gelu(self) -> bool:
        return GELU_FORMS[self.hidden_act]

    def branch(self, block: int) -> int | None:
        """The DeepStack branch fed by ``block`` (None: that block feeds none)."""
        indexes = self.deepstack_visual_indexes
        return indexes.index(block) if block in indexes else None

    @classmethod
    def from_config(cls, config: dict) -> VisionSpec:
        vision = _section(config, "vision_config", "use a Qwen3-VL checkpoint saved by transformers")
        act = vision.get("hidden_act", "gelu_pytorch_tanh")
        if act not in GELU_FORMS:
            raise CheckpointError(
                f"vision hidden_act {act!r} is not supported by the Qwen3-VL emitter",
                f"use one of {sorted(GELU_FORMS)} (Qwen3-VL checkpoints say gelu_pytorch_tanh)",
            )
        depth = int(vision.get("depth", 27))
        indexes = tuple(int(i) for i in vision.get("deepstack_visual_indexes", (8, 16, 24)))
        if any(not 0 <= i < depth for i in indexes):
            raise CheckpointError(
                f"deepstack_visual_indexes {list(indexes)} reach outside the {depth} vision blocks",
                "fix vision_config.deepstack_visual_indexes or depth",
            )
        rope = vision.get("rope_parameters") or {}
        return cls(
            depth=depth,
            hidden_size=int(vision.get("hidden_size", 1152)),
            num_heads=int(vision.get("num_heads", 16)),
            intermediate_size=int(vision.get("intermediate_size", 4304)),
            out_hidden_size=int(vision.get("out_hidden_size", 3584)),
            in_channels=int(vision.get("in_channels", 3)),
            patch_size=int(vision.get("patch_size", 16)),
            temporal_patch_size=int(vision.get("temporal_patch_size", 2)),
            spatial_merge_size=int(vision.get("spatial_merge_size", 2)),
            num_position_embeddings=int(vision.get("num_position_embeddings", 2304)),
            deepstack_visual_indexes=indexes,
            rope_theta=float(rope.get("rope_theta", 10000.0)),
            hidden_act=act,
        )


@dataclass(frozen=True)
class TextSpec:
    layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float
    mrope_section: tuple[int, ...]  # always interleaved: transformers and mlx-vlm ignore mrope_interleaved
    eps: float
    tie_word_embeddings: bool

    @classmethod
    def from_config(cls, config: dict) -> TextSpec:
        text = _section(config, "text_config", "use a full Qwen3-VL checkpoint to follow the prompt past the tower")
        rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
        heads = int(text["num_attention_heads"])
        return cls(
            layers=int(text["num_hidden_layers"]),
            hidden_size=int(text["hidden_size"]),
            num_heads=heads,
            num_kv_heads=int(text.get("num_key_value_heads") or heads),
            head_dim=int(text.get("head_dim") or int(text["hidden_size"]) // heads),
            intermediate_size=int(text["intermediate_size"]),
            vocab_size=int(text["vocab_size"]),
            rope_theta=float(rope.get("rope_theta", text.get("rope_theta", 5e6))),
            mrope_section=tuple(int(s) for s in rope.get("mrope_section", (24, 20, 20))),
            eps=float(text.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        )
