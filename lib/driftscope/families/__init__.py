"""Model families: each folder here is one family, registered by name through the ``driftscope.families``
entry-point group (driftscope's pyproject.toml names its own folders; a plugin package names its own family).

A family folder's ``__init__`` defines ``FAMILY`` (a :class:`~driftscope.families.base.Family`); a folder
without one (work in progress) is skipped. The checkpoint's ``config.json`` ``model_type`` picks the
family, and ``family:`` in a parameter file overrides it.
"""

from __future__ import annotations

import importlib
import pkgutil

from driftscope.core.registry import Registry
from driftscope.taps.stages import StagePlan

from ..errors import CheckpointError
from .base import Family, Mutation

FAMILIES: Registry[Family] = Registry(
    "model family", group="driftscope.families", accepts=lambda entry: isinstance(entry, Family)
)

#: The family the geometry CLI and notebook use when no checkpoint names one.
DEFAULT_FAMILY = "qwen2_5_vl"

#: The family that reads any model transformers and mlx-vlm both implement from the two models themselves: a
#: checkpoint whose model type no family folder claims is its, and ``family: generic`` picks it for any checkpoint.
GENERIC = "generic"


def _register_folders() -> None:
    """A family folder here that no installed entry point names registers from its folder: a source tree run with
    another checkout's installed metadata (``batch --commit`` runs a commit's own ``lib/``)."""
    for found in pkgutil.iter_modules(__path__):
        if not found.ispkg or found.name in FAMILIES:
            continue
        family = getattr(importlib.import_module(f"{__name__}.{found.name}"), "FAMILY", None)
        if isinstance(family, Family):
            FAMILIES.register(family.name, family)


_register_folders()


def get_family(name: str) -> Family:
    """The family registered as ``name`` (an unknown name lists the valid ones)."""
    return FAMILIES.get(name)


def model_types() -> dict[str, str]:
    """config.json ``model_type`` -> family name, over every registered family."""
    return {model_type: family.name for family in FAMILIES.loadable() for model_type in family.model_types}


def detect_family(config: dict, requested: str | None = None) -> str:
    """The family of a checkpoint config: the family folder claiming its model type, else the generic family;
    ``requested`` (a parameter file's ``family:``) overrides it when the config's model type is unknown and must
    agree with it when it is known (``generic`` may read any checkpoint)."""
    model_type = config.get("model_type")
    detected = model_types().get(model_type)
    if requested == GENERIC and GENERIC in FAMILIES:
        return GENERIC  # any checkpoint can be read generically, to compare with its deep family's reading
    if requested is None:
        if detected is None and GENERIC in FAMILIES and model_type:
            return GENERIC
        if detected is None:
            raise CheckpointError(
                f"checkpoint model_type {model_type!r} is not a supported family",
                f"supported model types: {', '.join(sorted(model_types()))}",
            )
        return detected
    if detected is not None and detected != requested:
        raise CheckpointError(
            f"parameter family {requested!r} does not match the checkpoint's model_type {model_type!r}",
            f"set family: {detected}",
        )
    return get_family(requested).name  # an unknown name lists the valid ones


def known_mutations() -> Registry[Mutation]:
    """Every registered family's mutations by name (to check a parameter file before its checkpoint is read)."""
    known: Registry[Mutation] = Registry("mutation")
    for family in FAMILIES.loadable():
        registry = family.mutation_registry()
        for mutation in registry:
            known.register(mutation, registry.get(mutation))
    return known


def stage_plan(family: str, config: dict) -> StagePlan:
    """The vision StagePlan of ``family`` for a checkpoint ``config`` (its config.json as a dict)."""
    return get_family(family).vision_plan(config)
