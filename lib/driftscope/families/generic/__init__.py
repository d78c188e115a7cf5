"""The generic family: any vision-language model that transformers and mlx-vlm both implement, read from the two
models themselves. Nothing here names a model: the stage plan comes from the two loaded models (``reading``,
``align``, ``plan``); each runtime taps the modules the plan names (``transformers_taps``, ``mlx_taps``); inputs
come from the checkpoint's own processor and chat template (``processor``, ``calls``).

Used for a checkpoint whose ``model_type`` no family folder claims, and selectable with ``family: generic`` for
one that a deep family reads, to compare both readings.
"""

from __future__ import annotations

from driftscope.core.paths import REPO_ROOT as _ROOT

from ..base import Family, TinyFixture
from .held import generic_layout
from .plan import NAME, generic_plan
from .processor import build_text_inputs, prepare_inputs
from .replay import ReplayContext


def _plan(config: dict):
    from ...errors import CheckpointError

    raise CheckpointError(
        "the generic family's stage plan is read from the checkpoint's two models, not from its config alone",
        "open the checkpoint (driftscope.families.checkpoints.open_checkpoint) and ask Family.plan_for",
    )


def _prepare_inputs(checkpoint, images: list):
    """The processor's output for the images, with the default prompt around them: the generic family runs the
    whole model (a vision-only plan stops once its last stage is written), so every capture needs a prompt; a run
    that follows the prompt sets its own."""
    inputs = prepare_inputs(checkpoint, images)
    inputs.text = build_text_inputs(checkpoint, inputs, max_new_tokens=1)
    return inputs


def _checkpoint_plan(checkpoint, max_new_tokens):
    from .reading import structure_of

    plan = generic_plan(structure_of(checkpoint), max_new_tokens)
    plan.meta["model_type"] = checkpoint.config.get("model_type")  # whose fixes a conclusion may suggest
    return plan


def _replay_inputs(stage_id: str, plan) -> tuple[str, ...] | None:
    from .entries import entries

    reads = entries(plan).get(stage_id, {}).get("reads")
    return (reads,) if reads else None


def _check_config(config: dict) -> None:
    from .reading import model_class

    model_class(config)


def _substages_of(stage_id: str, plan) -> tuple[str, ...]:
    """A block's or a decoder layer's pieces: the plan's stages under it (its modules' outputs and captured
    inputs)."""
    if stage_id not in plan or plan[stage_id].substage is not None:
        return ()
    if plan[stage_id].block is None and not stage_id.startswith("text.layer."):
        return ()
    prefix = f"{stage_id}."
    return tuple(s.id for s in plan if s.id.startswith(prefix) and s.substage is not None)


def _build_tiny(directory):
    from .tiny import build_tiny

    return build_tiny(TINY_MODEL_TYPE, directory)


#: the model type of the generic family's own tiny fixture (the shared family tests run on it)
TINY_MODEL_TYPE = "qwen2_vl"

FAMILY = Family(
    name=NAME,
    model_types=(),
    vision_plan=_plan,
    text_stages=lambda config, max_new_tokens: _plan(config),
    replay_inputs=_replay_inputs,
    replay_context=ReplayContext.from_plan,
    prepare_inputs=_prepare_inputs,
    text_inputs=build_text_inputs,
    engines={"transformers": f"{__name__}.transformers_taps", "mlx": f"{__name__}.mlx_taps"},
    mutations=f"{__name__}.mutations",
    mutation_runtime="mlx",
    hypotheses=f"{__name__}.hypotheses",
    hooks=f"{__name__}.hooks",
    prose=f"{__name__}.prose",
    geometry=False,
    tiny=TinyFixture(
        directory=_ROOT / "fixtures" / "checkpoints" / f"generic-{TINY_MODEL_TYPE}",
        build=_build_tiny,
        images=(_ROOT / "fixtures" / "images" / "shapes_448.png",),
    ),
    substages_of=_substages_of,
    check_config=_check_config,
    checkpoint_plan=_checkpoint_plan,
    load_layout=generic_layout,
)
