"""Qwen2.5-VL: a windowed-attention ViT (full attention in a few blocks), a 2x2 patch merger, and a
Qwen2 decoder with M-RoPE. Everything driftscope knows about the family is in this folder:

- ``plan``: the stage plan (vision and text), substages, what each replay reads;
- ``processor`` and ``text``: images -> pixel values and grids; the chat prompt around the images;
- ``geometry/``: window index, smart resize, packing, masks, M-RoPE positions (numpy, property-tested);
- ``transformers_taps``, ``mlx_taps``, ``emitter/``: where each runtime taps and how it replays;
- ``replay``: the side inputs every replay needs (rotary tables, attention bounds, window order);
- ``mutations``, ``hypotheses``: the family's defects for fixture power, ready "what if" patches;
- ``quantization``: what quantized policies need (tensor groups, MLX names, the linear layers behind stages);
- ``hooks``: what the generic views and the geometry CLI ask of a family;
- ``synthetic``: the tiny random-weight checkpoints.
"""

from __future__ import annotations

from pathlib import Path

from driftscope.core.paths import REPO_ROOT as _ROOT

from ..base import Family, TinyFixture
from ..qwen_shared.held import qwen_layout
from ..qwen_shared.plan import text_layers
from ..qwen_shared.text import TEXT_WEIGHTS, build_text_inputs, tied_head
from .plan import NAME, check_config, replay_inputs, substages_of, text_stages, vision_plan
from .processor import prepare_inputs
from .replay import ReplayContext


def _build_tiny(directory: Path) -> Path:
    from .synthetic import TINY_SPEC, make_checkpoint

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
        directory=_ROOT / "fixtures" / "checkpoints" / "tiny-qwen2_5-vl",
        build=_build_tiny,
        images=(_ROOT / "fixtures" / "images" / "shapes_448.png",),
    ),
    substages_of=substages_of,
    quantization=f"{__name__}.quantization",
    derived_weights=tied_head,
    load_layout=qwen_layout,
    text_weights=TEXT_WEIGHTS,
    check_config=check_config,
    videos=True,
    precision=f"{__name__}.precision",
)
