"""Every family's geometry page (notebook 03) opens by answering "could these images reveal a wrong index?", for
the images it is given, and the answer is true: each claim agrees with the blindness of the mutations that plant
its defect (computed from the processor's real output), and planting one does or does not change a stage as the
claim says. Every attention mask on any family's page is drawn in the one colour convention."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import ROOT
from driftscope.families import FAMILIES, get_family
from driftscope.families.base import GeometryClaim
from driftscope.families.figures import BLOCKED_COLOUR, MASK_GID, MAY_ATTEND_COLOUR
from driftscope.taps.stages import StageSelection
from driftscope.views.geometry import geometry_sections

FAMILY_NAMES = [name for name in FAMILIES.names() if get_family(name).geometry]
#: Sizes (HxW) whose geometry differs across the families: one or several windows or crops, grids on and off the
#: position table's rows, resized or not, a window permutation that is or is not an involution.
SIZES = ("224x224", "336x336", "448x448", "448x84", "448x672", "768x768", "112x112")
ANSWER = "Could these images reveal a wrong index?"


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """size -> a noise image of that size (every one different)."""
    from PIL import Image

    folder = tmp_path_factory.mktemp("geometry-images")
    out = {}
    for number, size in enumerate(SIZES):
        height, width = map(int, size.split("x"))
        pixels = np.random.default_rng(number).integers(0, 256, (height, width, 3), dtype=np.uint8)
        out[size] = folder / f"noise_{size}.png"
        Image.fromarray(pixels).save(out[size])
    return out


@pytest.fixture(scope="module")
def tiny():
    """name -> (checkpoint, its vision plan with every stage)."""
    from driftscope.families.checkpoints import open_checkpoint

    built = {}

    def get(name: str):
        if name not in built:
            checkpoint = open_checkpoint(get_family(name).tiny.ensure())
            plan = get_family(name).vision_plan(checkpoint.config).select(StageSelection.everything())
            built[name] = (checkpoint, plan)
        return built[name]

    return get


def _claims(name: str, paths, checkpoint) -> list[GeometryClaim]:
    return get_family(name).view_hooks().geometry_claims(list(paths), checkpoint.path)


def _cases(images) -> list[list]:
    """Each size alone, two different images packed, and two copies of one image."""
    return [[path] for path in images.values()] + [[images["224x224"], images["448x672"]], [images["336x336"]] * 2]


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_the_page_opens_with_the_answer_for_its_own_images(name, tiny, images):
    checkpoint, _ = tiny(name)
    pages = []
    for paths in ([images["224x224"]], [images["448x448"], images["448x672"]]):
        sections = geometry_sections(paths, checkpoint.path, name)
        first = sections[0]
        assert first.title == ANSWER
        answer = "".join(item for item in first.items if isinstance(item, str))
        claims = _claims(name, paths, checkpoint)
        assert claims and answer.count(" here**: ") == len(claims)
        for claim in claims:
            assert f"**{'VISIBLE' if claim.visible else 'INVISIBLE'} here**: {claim.defect}" in answer
            assert claim.reason in answer
        assert all(path.name in first.prose for path in paths)
        pages.append(answer)
    answers = {size: _claims(name, [path], checkpoint) for size, path in images.items()}
    verdicts = {tuple(claim.visible for claim in claims) for claims in answers.values()}
    assert len(verdicts) > 1, f"every size gets the same answer: it does not follow the images ({verdicts})"
    reasons = {tuple(claim.reason for claim in claims) for claims in answers.values()}
    assert len(reasons) > 1, "every size is given the same reasons"
    assert len(set(pages)) == 2, "a single image and a packed pair get the same answer"


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_each_claim_agrees_with_the_mutations_that_plant_its_defect(name, tiny, images):
    """The claim comes from the geometry of the image files; a mutation's blindness from the processor's output."""
    checkpoint, plan = tiny(name)
    family = get_family(name)
    registry = family.mutation_registry()
    planted = [m for claim in _claims(name, [images["224x224"]], checkpoint) for m in claim.mutations]
    assert planted, "no claim names a mutation that plants its defect: nothing could check the answer"
    for paths in _cases(images):
        inputs = family.prepare_inputs(checkpoint, list(paths))
        for claim in _claims(name, paths, checkpoint):
            for mutation in claim.mutations:
                blind = registry.get(mutation).blind(inputs, plan)
                sizes = [path.stem for path in paths]
                assert (blind is None) == claim.visible, (sizes, claim.defect, mutation, blind, claim.reason)


def _visible_and_invisible(name: str, images, checkpoint) -> list[tuple[str, list | None, list | None]]:
    """(mutation, a case where its claim is VISIBLE, a case where it is INVISIBLE; None where no case is) for
    every mutation a claim names."""
    by_case = [(paths, _claims(name, paths, checkpoint)) for paths in _cases(images)]
    found = []
    for number, claim in enumerate(by_case[0][1]):
        assert all(claims[number].defect == claim.defect for _, claims in by_case), "claims differ by case"
        seen = {claims[number].visible: paths for paths, claims in reversed(by_case)}
        found += [(mutation, seen.get(True), seen.get(False)) for mutation in claim.mutations]
    return found


@pytest.mark.slow  # an oracle capture per image case and a mutated capture per mutation and case
@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_a_planted_defect_shows_exactly_where_the_page_says_it_can(name, tiny, images, tmp_path):
    from driftscope.capture.runtimes import get_runtime
    from driftscope.judge.contract import Contract
    from driftscope.replay.power import fixture_power

    checkpoint, plan = tiny(name)
    family = get_family(name)
    found = _visible_and_invisible(name, images, checkpoint)
    assert any(None not in (visible, invisible) for _, visible, invisible in found), (
        "no claim of this family is VISIBLE on one case and INVISIBLE on another"
    )
    references = {}
    for mutation, visible, invisible in found:
        for paths, expected in ((visible, True), (invisible, False)):
            if paths is None:
                continue
            case = "+".join(path.stem for path in paths)
            inputs = family.prepare_inputs(checkpoint, list(paths))
            if case not in references:
                oracle = get_runtime("transformers")(checkpoint, "f32")
                references[case] = oracle.capture(inputs, plan, tmp_path / case / "oracle")
                oracle.release()
            power = fixture_power(references[case], checkpoint, inputs, plan, Contract(), tmp_path / case, [mutation])
            (entry,) = power["mutations"]
            assert entry["detected"] == expected, (mutation, case, entry["first_divergence"], entry["blind_reason"])
            if expected:
                assert entry["at_declared_stage"], (mutation, case, entry["first_divergence"])


def _mask_images(sections) -> list:
    from matplotlib.figure import Figure

    figures = [item for section in sections for item in section.items if isinstance(item, Figure)]
    return [image for figure in figures for axis in figure.axes for image in axis.images if image.get_gid() == MASK_GID]


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_every_mask_on_the_page_says_may_attend_in_the_one_colour(name, tiny, images):
    from matplotlib.colors import to_rgba

    checkpoint, _ = tiny(name)
    sections = geometry_sections([images["224x224"], images["336x336"]], checkpoint.path, name)
    for image in _mask_images(sections):
        assert image.cmap(image.norm(1)) == to_rgba(MAY_ATTEND_COLOUR)
        assert image.cmap(image.norm(0)) == to_rgba(BLOCKED_COLOUR)
        legend = image.axes.get_legend()
        labels = {
            text.get_text(): handle for text, handle in zip(legend.get_texts(), legend.legend_handles, strict=True)
        }
        assert to_rgba(labels["may attend"].get_facecolor()) == to_rgba(MAY_ATTEND_COLOUR)


def test_masks_are_drawn_only_by_the_shared_helper(tiny, images):
    """No module draws a mask itself (each draws with ``families.figures.draw_attention_mask``), and some family's
    page draws one (else the convention test above checks nothing)."""
    package = ROOT / "lib" / "driftscope"
    drawn = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in package.rglob("*.py")
        if path != package / "families" / "figures.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"imshow\(.*(mask|segments|allowed)", line)
    ]
    assert not drawn, drawn
    counts = {}
    for name in FAMILY_NAMES:
        checkpoint, _ = tiny(name)
        counts[name] = len(_mask_images(geometry_sections([images["224x224"]], checkpoint.path, name)))
    assert any(counts.values()), counts
