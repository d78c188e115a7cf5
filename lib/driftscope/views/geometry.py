"""The geometry a family's index math implies for given images: the notebook's sections and the CLI's text.

Which geometry matters is the family's (attention windows, position-embedding grids, crops and pooling);
this module picks the family (``family``, else the checkpoint's, else the default) and shows what it says.
"""

from __future__ import annotations

import json
from pathlib import Path

from driftscope.run.params import find_path, load_parameters

from ..errors import CheckpointError
from ..families import DEFAULT_FAMILY, Family, detect_family, get_family
from ..families.base import GeometryClaim, Section


def family_for(checkpoint: str | Path | None = None, family: str | None = None) -> Family:
    """``family`` if given, else the family of the checkpoint's config.json (when it has one), else the
    default family."""
    config = Path(checkpoint) / "config.json" if checkpoint is not None else None
    if family is None and config is not None and config.exists():
        try:
            return get_family(detect_family(json.loads(config.read_text())))
        except json.JSONDecodeError as err:
            raise CheckpointError(f"{config} is not valid JSON: {err}", "re-save the config") from err
    return get_family(family or DEFAULT_FAMILY)


def run_inputs(params_path: str | Path, family: str | None = None) -> tuple[list[str], str, str]:
    """(images, checkpoint, family) of a parameter file: what the geometry notebook reads of a run (``family``,
    when given, over the file's)."""
    loaded = load_parameters(params_path)
    return [str(path) for path in loaded.images], str(loaded.checkpoint), family or loaded.family


def geometry_sections(
    image_paths: str | Path | list[str | Path],
    checkpoint: str | Path | None = None,
    family: str | None = None,
    **options,
) -> list[Section]:
    """The family's geometry sections for the images (one path or the run's list; ``options``: what the family's
    sections take), the answer to "could these images reveal a wrong index?" first. Relative paths are found
    from the working directory, else the repository root (JupyterLab runs in ``notebooks/``)."""
    paths = [image_paths] if isinstance(image_paths, str | Path) else list(image_paths)
    paths = [find_path(path) for path in paths]
    checkpoint = None if checkpoint is None else find_path(checkpoint)
    hooks = family_for(checkpoint, family).view_hooks()
    answer = answer_section(hooks.geometry_claims(paths, checkpoint), paths)
    return [answer, *hooks.geometry_sections(paths, checkpoint, **options)]


def answer_section(claims: list[GeometryClaim], paths: list[Path]) -> Section:
    """The first screen: for each index-math defect the family names, VISIBLE or INVISIBLE on these images, why."""
    names = ", ".join(f"`{Path(path).name}`" for path in paths)
    lines = [
        f"- **{'VISIBLE' if claim.visible else 'INVISIBLE'} here**: {claim.defect} — {claim.reason}."
        for claim in claims
    ]
    hidden = sum(not claim.visible for claim in claims)
    closing = (
        f"\n\n{hidden} of {len(claims)} cannot show on these images: to test them, add an image of the size the "
        "reason names."
        if hidden
        else f"\n\nEach of the {len(claims)} can show on these images."
    )
    return Section(
        "Could these images reveal a wrong index?",
        f"Computed from the geometry of {names} (the sizes the processor makes of them).",
        ("\n".join(lines) + closing,),
    )


def show(sections: list[Section]) -> None:
    """Display each section in a notebook: its heading and paragraph, then its figures and tables."""
    from IPython.display import Markdown, display

    for section in sections:
        display(Markdown(f"## {section.title}\n\n{section.prose}".rstrip()))
        for item in section.items:
            if hasattr(item, "to_html") and hasattr(item, "columns"):  # a table: no pandas index, headers in words
                from .notebook import table

                item = table(item.rename(columns=lambda c: str(c).replace("_", " ")), highlight=None)
            display(Markdown(item) if isinstance(item, str) else item)


def geometry_text(
    sizes: list[str],
    bucket: int | None = None,
    checkpoint: str | Path | None = None,
    family: str | None = None,
    as_json: bool = False,
    **options,
) -> str:
    """What ``driftscope geometry`` prints for image sizes (``HxW``), from the family's geometry."""
    return family_for(checkpoint, family).view_hooks().geometry_report(sizes, bucket, checkpoint, as_json, **options)
