"""Qwen3-VL-MoE (Qwen3-VL-30B-A3B, 235B-A22B): Qwen3-VL's tower, DeepStack and M-RoPE decoder with a
mixture-of-experts MLP in its sparse decoder layers (a top-k router over stacked experts).

The vision side, the processor, the prompt, the replay context and the page hooks are Qwen3-VL's, imported from
``families/qwen3_vl`` (a declared variant: see the import contracts in ``pyproject.toml``); this folder adds the
sparse layers' stages and their module table (``plan``), how each runtime holds the stacked experts (``held``), their
taps and replays in each runtime (``torch``, ``mlx``, ``jax/`` for ``jax`` and ``iree``), the routing mutations and
hypotheses, the tokens routed to other experts on the pages (``pages``), the quantized policies' names
(``policies``) and the tiny checkpoint (``fixture``).
"""

from __future__ import annotations

import functools
from pathlib import Path

from driftscope.core.paths import REPO_ROOT as _ROOT

from ..base import Family, TinyFixture
from ..qwen3_vl.inputs import prepare_inputs
from ..qwen3_vl.plan import ReplayContext
from ..qwen_shared.text import TEXT_WEIGHTS, build_text_inputs, tied_head
from .held import moe_layout
from .plan import NAME, replay_inputs, text_stages, vision_plan


def _build_tiny(directory: Path) -> Path:
    from .fixture import TINY_SPEC, make_checkpoint

    return make_checkpoint(directory, TINY_SPEC)


def _build_q4_source(directory: Path) -> Path:
    from .fixture import Q4_SOURCE_SPEC, make_checkpoint

    return make_checkpoint(directory, Q4_SOURCE_SPEC)


_IMAGES = (_ROOT / "fixtures" / "images" / "shapes_224.png",)


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
    known_defects={"mlx": "driftscope.hypotheses:mlx_vlm_gelus"},
    derived_weights=tied_head,
    load_layout=moe_layout,
    text_weights=TEXT_WEIGHTS,  # mlx-vlm 0.7.10 swaps the tower GELUs
    tiny=TinyFixture(
        directory=_ROOT / "fixtures" / "checkpoints" / "tiny-qwen3-vl-moe",
        build=_build_tiny,
        images=_IMAGES,
        q4_source=TinyFixture(_ROOT / "fixtures" / "checkpoints" / "tiny-qwen3-vl-moe-wide", _build_q4_source, _IMAGES),
    ),
    quantization=f"{__name__}.policies",
    precision="driftscope.families.qwen3_vl.policies",  # the tower is Qwen3-VL's
    videos=True,
)
