"""What quantization needs to know about a model family: its tensor groups in both namings, and the map.

One :class:`QuantProfile` per family, registered by family name. (Family knowledge: each profile
moves into its family's package once families are folders.)
"""

from __future__ import annotations

from dataclasses import dataclass

from ..registry import Registry
from .names import NameMap
from .select import TensorGroups


@dataclass(frozen=True)
class QuantProfile:
    family: str
    checkpoint: TensorGroups  # names in the family's dense checkpoints (what transformers saves)
    mlx: TensorGroups  # names of mlx-vlm's modules, and of MLX-community checkpoints
    mlx_names: NameMap  # MLX -> checkpoint


PROFILES: Registry[QuantProfile] = Registry("quantization profile")

PROFILES.register(
    "qwen2_5_vl",
    QuantProfile(
        "qwen2_5_vl",
        checkpoint=TensorGroups(vision=("visual.", "model.visual."), text=("model.", "lm_head.")),
        mlx=TensorGroups(vision=("vision_tower.",), text=("language_model.",)),
        mlx_names=NameMap(
            renames=(
                ("vision_tower.", "visual."),
                ("language_model.model.", "model."),
                ("language_model.lm_head.", "lm_head."),
            ),
            # MLX's Conv3d weight is (out, t, h, w, in); the checkpoint's (out, in, t, h, w)
            permutes=(("patch_embed.proj.weight", (0, 4, 1, 2, 3)),),
        ),
    ),
)


def get_profile(family: str) -> QuantProfile:
    """The quantization profile of ``family`` (an unknown family lists the known ones)."""
    return PROFILES.get(family)
