"""Molmo2: a SigLIP-style ViT read at several layers, an attention pooler driven by index tensors, a SwiGLU
projector whose output is added to the ``<im_patch>`` embeddings, and a decoder in which image tokens attend
to each other both ways. Everything driftscope knows about the family is in this folder:

- ``config``: the config facts of both layouts (hub and transformers-native), layers resolved against the
  declared depth, what mlx-vlm's port reads (config adapted in memory) and cannot represent;
- ``plan``: the stage plan (ViT per crop, selected layers, pooler, projector, text), what each replay reads, the
  modules both engines tap, the replay context (pooling indices, selected layers);
- ``inputs``: images -> crops, patches and pooling indices (the processor's arrays), the prompt;
- ``geometry``: crops and pooling indices (numpy, property-tested against mlx-vlm's processor);
- ``torch``, ``mlx``, ``jax/``: where transformers, mlx-vlm and the compiled path tap and how each replays
  (``jax/model`` the tower, ``jax/weights`` its spec and weights, ``jax/text`` the decoder, ``jax/program`` what
  the compiled runtimes ask);
- ``mutations``, ``hypotheses``: planted defects for fixture power; the patches closing mlx-vlm's defects;
- ``policies``: what quantized and mixed-precision policies need (tensor groups, MLX names, the linear layers
  behind stages, float32 operators);
- ``pages``: what the generic views, ``driftscope geometry`` and ``driftscope stages`` ask of a family;
- ``held``: how each runtime holds the checkpoint's tensors (the load audit);
- ``fixture``: the tiny random-weight checkpoints (hub and native layouts).
"""

from __future__ import annotations

from pathlib import Path

from driftscope.core.paths import REPO_ROOT as _ROOT

from ..base import Family, TinyFixture
from .held import molmo2_layout
from .inputs import build_text_inputs, prepare_inputs
from .plan import NAME, ReplayContext, replay_inputs, text_stages, vision_plan

CHECKPOINTS = _ROOT / "fixtures" / "checkpoints"


def _build_tiny(directory: Path) -> Path:
    """The hub-layout tiny checkpoint in ``directory`` (its native-layout twin next to it)."""
    from .fixture import make_checkpoints

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
        "transformers": f"{__name__}.torch",
        "mlx": f"{__name__}.mlx",
        "jax": f"{__name__}.jax.program",
        "iree": f"{__name__}.jax.program",
    },
    mutations=f"{__name__}.mutations",
    mutation_runtime="mlx",
    hypotheses=f"{__name__}.hypotheses",
    prose=f"{__name__}.pages",
    hooks=f"{__name__}.pages",
    tiny=TinyFixture(
        directory=CHECKPOINTS / "tiny-molmo2-hub",
        build=_build_tiny,
        images=(_ROOT / "fixtures" / "images" / "shapes_224.png",),  # 2 crops, 392 tokens, 27 padded
        q4_group_size=32,  # the tiny ViT is 32 wide; group size 64 would leave its attention dense
    ),
    quantization=f"{__name__}.policies",
    precision=f"{__name__}.policies",
    known_defects={"mlx": "driftscope.hypotheses:mlx_vlm_fixes"},  # mlx-vlm 0.7.10's three (hypotheses.py)
    text_weights=("model.transformer.*", "lm_head.weight"),  # the decoder (both layouts)
    load_layout=molmo2_layout,
)
