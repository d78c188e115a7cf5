"""The vision settings the emitter needs, read from a checkpoint's config.json."""

from __future__ import annotations

from dataclasses import dataclass

from ....errors import CheckpointError


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
    window_size: int
    fullatt_block_indexes: tuple[int, ...]
    rope_theta: float
    hidden_act: str = "silu"
    eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size**2

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    def is_full(self, block: int) -> bool:
        return block in self.fullatt_block_indexes

    @classmethod
    def from_config(cls, config: dict) -> VisionSpec:
        vision = dict(config.get("vision_config") or {})
        if not vision:
            raise CheckpointError(
                "config.json has no vision_config", "use a Qwen2.5-VL checkpoint saved by transformers"
            )
        rope = vision.get("rope_parameters") or {}
        act = vision.get("hidden_act", "silu")
        if act != "silu":
            raise CheckpointError(f"vision hidden_act {act!r} is not supported by the emitter", "use silu (Qwen2.5-VL)")
        return cls(
            depth=int(vision.get("depth", 32)),
            hidden_size=int(vision.get("hidden_size", 1280)),
            num_heads=int(vision.get("num_heads", 16)),
            intermediate_size=int(vision.get("intermediate_size", 3420)),
            out_hidden_size=int(vision.get("out_hidden_size", 3584)),
            in_channels=int(vision.get("in_channels", 3)),
            patch_size=int(vision.get("patch_size", 14)),
            temporal_patch_size=int(vision.get("temporal_patch_size", 2)),
            spatial_merge_size=int(vision.get("spatial_merge_size", 2)),
            window_size=int(vision.get("window_size", 112)),
            fullatt_block_indexes=tuple(int(i) for i in vision.get("fullatt_block_indexes", [7, 15, 23, 31])),
            rope_theta=float(rope.get("rope_theta", vision.get("rope_theta", 10000.0))),
        )
