"""Molmo2: a SigLIP-style ViT read at several layers, an attention pooler driven by index tensors, a SwiGLU
projector whose output is added to the ``<im_patch>`` embeddings, and a decoder in which image tokens attend
to each other both ways. Everything driftscope knows about the family is in this folder:

- ``config``: the config facts of both layouts (hub and transformers-native), layers resolved against the
  declared depth, and mlx-vlm's loader (config adapted in memory);
- ``plan``: the stage plan (ViT per crop, selected layers, pooler, projector, text), what each replay reads;
- ``geometry`` / ``processor`` / ``text``: crops and pooling indices (numpy, property-tested against
  mlx-vlm's processor), the processor's arrays, the prompt;
- ``transformers_taps``, ``mlx_taps``, ``emitter/``: where each runtime taps and how it replays;
- ``replay``: the side inputs every replay needs (pooling indices, selected layers);
- ``mutations``, ``hypotheses``: planted defects for fixture power; the patches closing mlx-vlm's defects;
- ``quantization``: what quantized policies need (tensor groups, MLX names, the linear layers behind stages);
- ``hooks`` (+ ``geometry_plots``): what the generic views and the geometry CLI ask of a family;
- ``synthetic``: the tiny random-weight checkpoints (hub and native layouts).
"""

from __future__ import annotations

from pathlib import Path

from driftscope.core.paths import REPO_ROOT as _ROOT

from ..base import Family, TinyFixture
from .held import molmo2_layout
from .plan import NAME, replay_inputs, text_stages, vision_plan
from .processor import prepare_inputs
from .replay import ReplayContext
from .text import build_text_inputs

CHECKPOINTS = _ROOT / "fixtures" / "checkpoints"


def _build_tiny(directory: Path) -> Path:
    """The hub-layout tiny checkpoint in ``directory`` (its native-layout twin next to it)."""
    from .synthetic import make_checkpoints

    directory = Path(directory)
    hub, _ = make_checkpoints(directory, directory.with_name(directory.name.replace("-hub", "") + "-native"))
    return hub


FAMILY = Family(
    name=NAME,
    model_types=(NAME,),
    vision_plan=vision_plan,
    text_stages=text_stages,
    replay_inputs=replay_inputs,
    replay_context=ReplayContext.from_plan,
    prepare_inputs=prepare_inputs,
    text_inputs=build_text_inputs,
    engines={
        "transformers": f"{__name__}.transformers_taps",
        "mlx": f"{__name__}.mlx_taps",
        "jax": f"{__name__}.emitter.program",
        "iree": f"{__name__}.emitter.program",
    },
    mutations=f"{__name__}.mutations",
    mutation_runtime="mlx",
    hypotheses=f"{__name__}.hypotheses",
    prose=f"{__name__}.prose",
    hooks=f"{__name__}.hooks",
    tiny=TinyFixture(
        directory=CHECKPOINTS / "tiny-molmo2-hub",
        build=_build_tiny,
        images=(_ROOT / "fixtures" / "images" / "shapes_224.png",),  # 2 crops, 392 tokens, 27 padded
        q4_group_size=32,  # the tiny ViT is 32 wide; group size 64 would leave its attention dense
    ),
    quantization=f"{__name__}.quantization",
    precision=f"{__name__}.precision",
    known_defects={"mlx": "driftscope.hypotheses:mlx_vlm_fixes"},  # mlx-vlm 0.7.10's three (hypotheses.py)
    text_weights=("model.transformer.*", "lm_head.weight"),  # the decoder (both layouts)
    load_layout=molmo2_layout,
)
