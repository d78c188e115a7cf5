"""Qwen2.5-VL: a windowed-attention ViT (full attention in a few blocks), a 2x2 patch merger, and a
Qwen2 decoder with M-RoPE. Everything driftscope knows about the family is in this folder:

- ``plan``: the stage plan (vision and text), substages, what each replay reads, the modules both engines tap,
  the replay context (rotary tables, attention bounds, window order);
- ``inputs``: images -> pixel values and grids (the checkpoint's processor; smart resize and patchify);
- ``geometry``: window index, packing, masks, M-RoPE positions (numpy, property-tested);
- ``torch``, ``mlx``, ``jax/``: where transformers, mlx-vlm and the compiled path tap and how each replays
  (``jax/model`` the JAX model, ``jax/text`` its decoder, ``jax/program`` what the compiled runtimes ask);
- ``mutations``, ``hypotheses``: the family's defects for fixture power, ready "what if" patches;
- ``policies``: what quantized and mixed-precision policies need (tensor groups, MLX names, float32 operators);
- ``pages``: what the generic views, the geometry notebook and the geometry CLI ask of a family, with its figures;
- ``fixture``: the tiny random-weight checkpoints and whole checkpoints at a released model's shapes.

Modules that import torch, MLX or JAX when used (``torch``, ``mlx``, ``jax/``, ``mutations``, ``hypotheses``,
``policies``, ``pages``, ``fixture``) are named below by import path and imported on first use; this module and
what it imports stay light (numpy, the standard library, driftscope's core).
"""

from __future__ import annotations

from pathlib import Path

from driftscope.core.paths import REPO_ROOT as _ROOT

from ..base import Family, TinyFixture
from ..qwen_shared.held import qwen_layout
from ..qwen_shared.plan import text_layers
from ..qwen_shared.text import TEXT_WEIGHTS, build_text_inputs, tied_head
from .inputs import prepare_inputs
from .plan import NAME, ReplayContext, check_config, replay_inputs, substages_of, text_stages, vision_plan


def _build_tiny(directory: Path) -> Path:
    from .fixture import TINY_SPEC, make_checkpoint

    return make_checkpoint(directory, TINY_SPEC)


FAMILY = Family(
    name=NAME,
    model_types=(NAME,),
    vision_plan=vision_plan,
    text_stages=text_stages,
    replay_inputs=lambda stage_id, plan: replay_inputs(stage_id, plan.depth, text_layers(plan)),
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
        directory=_ROOT / "fixtures" / "checkpoints" / "tiny-qwen2_5-vl",
        build=_build_tiny,
        images=(_ROOT / "fixtures" / "images" / "shapes_448.png",),
    ),
    substages_of=substages_of,
    quantization=f"{__name__}.policies",
    derived_weights=tied_head,
    load_layout=qwen_layout,
    text_weights=TEXT_WEIGHTS,
    check_config=check_config,
    videos=True,
    precision=f"{__name__}.policies",
)
