"""Shared, cached pieces of the Molmo2 tests: the tiny checkpoints (hub and native layouts), the image cases,
their inputs (processor output and prompt), the whole plan and each runtime's TapSet of it (captured once per
test run, whichever test file and xdist worker asks first: conftest's ``shared_tapset``), optionally with a
hypothesis patch."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
from driftscope.families import get_family
from driftscope.judge.contract import Contract, Tolerance

ROOT = Path(__file__).resolve().parents[1]
FAMILY = get_family("molmo2")
#: The shapes image at each case's size (committed fixtures): 224 px -> 2 crops, 448 px -> 5 crops.
IMAGES = {
    "224": ROOT / "fixtures" / "images" / "shapes_224.png",
    "448": ROOT / "fixtures" / "images" / "shapes_448.png",
}
#: The issue's agreement bound for every f32 runtime against transformers f32 (absolute, every element).
TOLERANCE = 1e-4
F32 = Contract("f32-parity", Tolerance(atol=TOLERANCE, rtol=0.0))
MAX_NEW_TOKENS = 4
#: A chat prompt around one image, for comparing with mlx-vlm's own processor.
PROMPT = "<|im_end|><|image|><|im_start|>user\nDescribe the image.<|im_end|>\n<|im_start|>assistant\n"
#: The ready patches closing mlx-vlm 0.7.10's three defects, and the stage where each defect first shows.
FIXES = ("tanh_gelu", "layers_from_declared_depth", "bidirectional_image_mask")
DEFECT_STAGE = {
    "tanh_gelu": "vision.block.0.mlp.act",
    "layers_from_declared_depth": "vision.selected.24",
    "bidirectional_image_mask": "text.attention_mask",
}


@cache
def checkpoint_dirs() -> dict[str, Path]:
    """``{"hub": ..., "native": ...}``: the family's tiny checkpoint and its native-layout twin."""
    hub = FAMILY.tiny.ensure()
    return {"hub": hub, "native": hub.with_name("tiny-molmo2-native")}


@cache
def checkpoint(layout: str = "hub"):
    from driftscope.families.checkpoints import open_checkpoint

    return open_checkpoint(checkpoint_dirs()[layout])


def config(layout: str = "hub") -> dict:
    return checkpoint(layout).config


@cache
def scratch() -> Path:
    """This process's scratch folder, inside the test run's shared folder (removed with pytest's basetemp,
    not left behind in /tmp): one per process, so two xdist workers never write the same file."""
    import os

    from conftest import shared_root

    folder = shared_root() / "scratch" / f"molmo2-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@cache
def inputs(case: str, layout: str = "hub"):
    """The family's processor output for the case's image, with the chat prompt around it."""
    model_inputs = FAMILY.prepare_inputs(checkpoint(layout), [IMAGES[case]])
    model_inputs.text = FAMILY.text_inputs(checkpoint(layout), model_inputs, max_new_tokens=MAX_NEW_TOKENS)
    return model_inputs


@cache
def plan(layout: str = "hub"):
    """The whole plan: every vision stage and substage, the pooler, the projector, the text stages."""
    from driftscope.taps.stages import StagePlan, StageSelection

    vision = FAMILY.vision_plan(config(layout)).select(StageSelection.everything())
    return StagePlan(
        vision.family, vision.stages + FAMILY.text_stages(config(layout), MAX_NEW_TOKENS), vision.depth, vision.meta
    )


def fixes_patch(skip: tuple[str, ...] = ()):
    """The ready patch applying mlx-vlm's fixes, all but ``skip``."""
    from driftscope.capture.patches import HypothesisPatch

    return HypothesisPatch("driftscope.hypotheses:mlx_vlm_fixes", {"skip": list(skip)} if skip else {})


@cache
def capture(runtime: str, case: str, layout: str = "hub", skip: tuple[str, ...] | None = None, policy: str = "f32"):
    """``runtime``'s TapSet of the whole plan on ``case``; for mlx, ``skip`` not None applies every fix but
    those (``()``: all three)."""
    from conftest import family_run_key, shared_tapset
    from driftscope.capture.runtimes import get_runtime

    patch = None if skip is None else fixes_patch(skip)
    name = f"{runtime}-{policy}" + ("" if skip is None else "-fixed-but-" + "-".join(skip or ("none",)))

    def into(out: Path):
        engine = get_runtime(runtime)(checkpoint(layout), policy, patch)
        tapset = engine.capture(inputs(case, layout), plan(layout), out)
        engine.release()
        return tapset

    # the hub layout's 224 case unpatched in f32 is the shared family tests' run (conftest's ``runs``)
    same_as_runs = (layout, case, skip, policy) == ("hub", "224", None, "f32")
    return shared_tapset(family_run_key("molmo2", runtime) if same_as_runs else f"molmo2/{layout}/{case}/{name}", into)


def max_abs(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)), initial=0.0))


def errors(reference, candidate) -> dict[str, float]:
    """max |candidate - reference| per stage both captured, in plan order (shapes must agree)."""
    out = {}
    for stage in plan():
        if stage.id in reference and stage.id in candidate:
            expected, got = np.asarray(reference[stage.id]), np.asarray(candidate[stage.id])
            assert got.shape == expected.shape, (stage.id, got.shape, expected.shape)
            out[stage.id] = max_abs(got, expected)
    return out


def first_over(errors_by_stage: dict[str, float], bound: float = TOLERANCE) -> str | None:
    return next((stage for stage, error in errors_by_stage.items() if not error < bound), None)
