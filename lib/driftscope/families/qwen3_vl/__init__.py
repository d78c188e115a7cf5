"""Qwen3-VL (DeepStack): a full-attention ViT with a learned, interpolated position table, a 2x2 patch merger,
DeepStack mergers on a few blocks whose features are added to the first decoder layers' hidden states, and a
Qwen3 decoder with interleaved M-RoPE. Everything driftscope knows about the family is in this folder:

- ``plan``: the stage plan (vision, DeepStack branches and text), what each replay reads, the modules both engines
  tap, the replay context (rotary tables, attention bounds, grids);
- ``inputs``: images -> pixel values and grids, and the processor contract (bounds, resampler);
- ``geometry``: the position-table interpolation, packed buckets (numpy, property-tested);
- ``torch``, ``mlx``, ``jax/``: where transformers, mlx-vlm and the compiled path tap and how each replays
  (``jax/model`` the tower, ``jax/weights`` its specs and weights, ``jax/text`` the decoder, ``jax/program`` what
  the compiled runtimes ask);
- ``mutations``, ``hypotheses``: the family's defects for fixture power, ready "what if" patches;
- ``policies``: what quantized and mixed-precision policies need (tensor groups, MLX names, float32 operators);
- ``pages``: what the generic views, ``driftscope geometry`` and ``driftscope stages`` ask of a family;
- ``fixture``: the tiny random-weight checkpoint.

The chat prompt, M-RoPE positions, processor runner and tokenizer are shared with Qwen2.5-VL
(``families/qwen_shared``).
"""

from __future__ import annotations

import functools
from pathlib import Path

from driftscope.core.paths import REPO_ROOT as _ROOT

from ..base import Family, TinyFixture
from ..qwen_shared.held import qwen_layout
from ..qwen_shared.text import TEXT_WEIGHTS, build_text_inputs, tied_head
from .inputs import prepare_inputs
from .plan import NAME, ReplayContext, replay_inputs, text_stages, vision_plan


def _build_tiny(directory: Path) -> Path:
    from .fixture import TINY_SPEC, make_checkpoint

    return make_checkpoint(directory, TINY_SPEC)


FAMILY = Family(
    name=NAME,
    model_types=(NAME,),
    vision_plan=vision_plan,
    text_stages=text_stages,
    replay_inputs=replay_inputs,
    replay_context=ReplayContext.from_plan,
    prepare_inputs=prepare_inputs,
    text_inputs=functools.partial(build_text_inputs, video_style="timestamps"),
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
        directory=_ROOT / "fixtures" / "checkpoints" / "tiny-qwen3-vl",
        build=_build_tiny,
        images=(_ROOT / "fixtures" / "images" / "shapes_224.png",),
    ),
    quantization=f"{__name__}.policies",
    precision=f"{__name__}.policies",
    derived_weights=tied_head,
    load_layout=qwen_layout,
    text_weights=TEXT_WEIGHTS,
    videos=True,
)
