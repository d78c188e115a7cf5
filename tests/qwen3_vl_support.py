"""Shared, cached pieces of the Qwen3-VL tests: the tiny checkpoint, the image sets, their inputs (processor
output and prompt) and each runtime's TapSet of the whole plan (captured once per test run, whichever test
file and xdist worker asks first: conftest's ``shared_tapset``)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
from driftscope.families import get_family
from driftscope.judge.contract import Contract, Tolerance

ROOT = Path(__file__).resolve().parents[1]
FAMILY = get_family("qwen3_vl")

#: Image sets of the agreement tests: 224x224 (upscaled to 256x256 by Qwen3-VL's min pixels), 448x448, two
#: different 256x256 images packed into one 512-patch call, and the second of them alone.
CASES = {
    "224": (("shapes", 224),),
    "448": (("shapes", 448),),
    "two-256": (("shapes", 256), ("mirrored", 256)),
    "mirrored-256": (("mirrored", 256),),
}
#: The issue's agreement bound for every f32 runtime against transformers f32 (absolute, every element).
TOLERANCE = 1e-4
F32 = Contract("f32-parity", Tolerance(atol=TOLERANCE, rtol=0.0))
#: As the shared family tests' ``runs`` fixture decodes: the 224 case in f32 is then the same capture as
#: ``runs("qwen3_vl", runtime)`` and is made once per test run for both.
MAX_NEW_TOKENS = 4


@cache
def checkpoint():
    from driftscope.families.checkpoints import open_checkpoint

    return open_checkpoint(FAMILY.tiny.ensure())


def config() -> dict:
    return checkpoint().config


@cache
def scratch() -> Path:
    """This process's scratch folder, inside the test run's shared folder (removed with pytest's basetemp,
    not left behind in /tmp): one per process, so two xdist workers never write the same file."""
    import os

    from conftest import shared_root

    folder = shared_root() / "scratch" / f"qwen3-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@cache
def image_paths(name: str) -> tuple[Path, ...]:
    """The case's images as PNG files (the committed ones where they exist)."""
    from make_shapes import draw_shapes
    from PIL import ImageOps

    paths = []
    for kind, size in CASES[name]:
        committed = ROOT / "fixtures" / "images" / f"shapes_{size}.png"
        if kind == "shapes" and committed.exists():
            paths.append(committed)
            continue
        path = scratch() / f"{kind}_{size}.png"
        image = draw_shapes(size)
        (ImageOps.mirror(image) if kind == "mirrored" else image).save(path)
        paths.append(path)
    return tuple(paths)


@cache
def inputs(name: str):
    """The family's processor output for the case, with the chat prompt around its images."""
    model_inputs = FAMILY.prepare_inputs(checkpoint(), list(image_paths(name)))
    model_inputs.text = FAMILY.text_inputs(checkpoint(), model_inputs, max_new_tokens=MAX_NEW_TOKENS)
    return model_inputs


@cache
def plan():
    """The whole plan: every vision stage and substage, every DeepStack branch, the text stages."""
    from driftscope.taps.stages import StagePlan, StageSelection

    vision = FAMILY.vision_plan(config()).select(StageSelection.everything())
    return StagePlan(
        vision.family, vision.stages + FAMILY.text_stages(config(), MAX_NEW_TOKENS), vision.depth, vision.meta
    )


@cache
def capture(runtime: str, name: str, graph: str = "auto"):
    """``runtime``'s f32 TapSet of the whole plan on case ``name`` (``graph``: the compiled runtimes' mode)."""
    from conftest import family_run_key, shared_tapset
    from driftscope.capture.runtimes import get_runtime

    options = {"graph": graph} if runtime in ("jax", "iree") and graph != "auto" else {}  # auto: the default

    def into(out: Path):
        engine = get_runtime(runtime)(checkpoint(), "f32", None, options)
        tapset = engine.capture(inputs(name), plan(), out)
        engine.release()
        return tapset

    same_as_runs = (name, graph) == ("224", "auto")  # the tiny fixture's own image: conftest's ``runs``
    return shared_tapset(
        family_run_key("qwen3_vl", runtime) if same_as_runs else f"qwen3_vl/{name}/{runtime}-{graph}", into
    )


def max_errors(reference, candidate, stage_ids) -> dict[str, float]:
    """max |candidate - reference| per stage (shapes must agree)."""
    errors = {}
    for stage_id in stage_ids:
        expected, got = np.asarray(reference[stage_id]), np.asarray(candidate[stage_id])
        assert got.shape == expected.shape, (stage_id, got.shape, expected.shape)
        errors[stage_id] = float(np.max(np.abs(got.astype(np.float64) - expected.astype(np.float64)), initial=0.0))
    return errors
