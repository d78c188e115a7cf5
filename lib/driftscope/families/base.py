"""The Family interface: what one model family tells the rest of driftscope, in one object.

A family is a folder ``families/<name>/`` whose ``__init__`` builds a :class:`Family` called ``FAMILY``;
``driftscope.families`` finds it there (adding a family edits no other file). Engines, the investigation,
the views and the shared tests only ever ask a ``Family``: they name no family themselves.

Modules that need heavy packages (torch, mlx, jax) are named by import path and imported on first use,
so reading the registry stays cheap.
"""

from __future__ import annotations

import fnmatch
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..errors import ParameterError, RuntimeUnavailableError
from .capabilities import HypothesesCapabilities, capabilities_of

if TYPE_CHECKING:
    from driftscope.core.registry import Registry
    from driftscope.inputs.processor_output import ModelInputs
    from driftscope.inputs.text_inputs import TextInputs
    from driftscope.model.checkpoint import Checkpoint
    from driftscope.model.load_layout import LoadLayout
    from driftscope.taps.stages import Stage, StagePlan
    from driftscope.taps.tapset import TapSet


@dataclass(frozen=True)
class Mutation:
    """A named defect installed in a candidate runtime, to prove a fixture's power.

    ``install`` changes the loaded model; ``during`` (if any) is a context active while capturing;
    ``inputs`` (if any) gives the inputs the mutated runtime receives instead of the run's (a processor
    defect); ``declared`` lists the stages it should disturb first (most specific first); ``blind`` says,
    from the inputs' geometry alone, why a fixture cannot reveal it (None: it can); ``precision`` names the
    activation dtype the defect lives in (e.g. ``float16``): under a policy computing in a wider dtype it
    cannot show."""

    name: str
    description: str
    declared: Callable[[StagePlan], list[str]]
    install: Callable[[Any, dict], None] | None = None  # (model, settings) at load time
    blind: Callable[[ModelInputs, StagePlan], str | None] = lambda inputs, plan: None
    settings: dict = field(default_factory=dict)
    during: Callable[[Any, dict], Any] | None = None  # (model, settings) -> context manager
    inputs: Callable[[Checkpoint, ModelInputs, dict], ModelInputs] | None = None  # (checkpoint, inputs, settings)
    precision: str | None = None

    def declared_stage(self, plan: StagePlan) -> str | None:
        """The first declared stage that the plan captures."""
        return next((stage for stage in self.declared(plan) if stage in plan), None)


@dataclass(frozen=True)
class ImageTokens:
    """Where one image's token rows (in raster order) sit in the image: rows ``start:stop`` of a stage, on a
    grid of ``shape`` (rows, columns) cells, row ``start + i`` at ``cells[i]`` (a [n, 2] integer array)."""

    start: int
    stop: int
    shape: tuple[int, int]
    cells: Any


@dataclass(frozen=True)
class Section:
    """One part of a family's geometry notebook: a heading, a paragraph, then figures and tables in order."""

    title: str
    prose: str
    items: tuple[Any, ...]  # matplotlib Figures, pandas DataFrames, Markdown strings


@dataclass(frozen=True)
class GeometryClaim:
    """Whether given images could reveal one index-math defect (the first thing a geometry page says):
    ``visible`` False when the defect would change no token on them; ``mutations`` name the family's mutations
    that plant the defect (each one's ``blind`` must agree: blind exactly when the claim is not visible)."""

    defect: str
    visible: bool
    reason: str
    mutations: tuple[str, ...] = ()


@dataclass(frozen=True)
class TinyFixture:
    """The family's tiny random-weight checkpoint, which the shared tests build and run on."""

    directory: Path  # where the checkpoint is written (fixtures/checkpoints/...)
    build: Callable[[Path], Path]  # writes the checkpoint into a directory
    images: tuple[Path, ...]  # images the shared tests feed it
    q4_group_size: int = 64  # the group size of its 4-bit twin (``fixtures/make_tiny_q4.py``)
    #: the dense checkpoint the 4-bit twin is quantized from, when not this one (widths the group size divides)
    q4_source: TinyFixture | None = None

    def ensure(self) -> Path:
        """The checkpoint directory, built first if it is not there."""
        if not any(self.directory.glob("*.safetensors")):
            self.build(self.directory)
        return self.directory


#: What the generic pages ask each family to say in its own words (``Family.text``).
PROSE_KEYS = ("inputs", "mutations", "answer")


def _module(path: str) -> ModuleType:
    return importlib.import_module(path)


def block_substages(stage_id: str, plan: StagePlan) -> tuple[str, ...]:
    """The default ``Family.substages_of``: a block output's pieces are the plan's stages of that block that
    declare a ``substage`` (in execution order); any other stage has none."""
    if stage_id not in plan:
        return ()
    stage = plan[stage_id]
    if stage.block is None or stage.substage is not None:
        return ()
    return tuple(s.id for s in plan if s.block == stage.block and s.substage is not None)


def no_load_layout(runtime: str, checkpoint: Checkpoint) -> LoadLayout | None:
    """The default ``Family.load_layout``: nothing declared, so no runtime's load is audited."""
    return None


def no_derived_weights(config: dict) -> tuple[str, ...]:
    """The default ``Family.derived_weights``: every tensor is loaded, none is derived from another."""
    return ()


@dataclass(frozen=True)
class Family:
    """Everything model-specific about one family (see docs/adding-a-family.md for each entry)."""

    name: str
    model_types: tuple[str, ...]  # config.json ``model_type`` values this family reads
    vision_plan: Callable[[dict], StagePlan]  # the vision stages of a config, in execution order
    text_stages: Callable[[dict, int], list[Stage]]  # stages past the tower (config, max_new_tokens)
    replay_inputs: Callable[[str, StagePlan], tuple[str, ...] | None]  # what a replay of a stage reads
    replay_context: Callable[[TapSet, StagePlan], Any]  # side inputs of every replay, from the reference
    prepare_inputs: Callable[[Checkpoint, list], ModelInputs]  # images -> the family's processor output
    text_inputs: Callable[..., TextInputs]  # (checkpoint, inputs, prompt, max_new_tokens, expect) -> prompt ids
    engines: Mapping[str, str]  # runtime name -> module with that runtime's taps and replay operators
    mutations: str  # module holding ``MUTATIONS``, the family's registry of mutations
    mutation_runtime: str  # the runtime the mutations are installed in
    hypotheses: str  # module of ready hypothesis patches
    hooks: str  # module of the family's page hooks: token layout and input overlay for the views, geometry pages, CLI
    tiny: TinyFixture
    #: the finer stages computed inside a stage (a block's substages, a head's pieces), from the full plan: what
    #: narrowing captures when that stage is a pair's first divergence; () for a stage with no declared pieces
    substages_of: Callable[[str, StagePlan], tuple[str, ...]] = block_substages
    #: runtime -> the ready patch correcting that runtime's known defects in this family's port (e.g. mlx-vlm's
    #: Molmo2): the shared agreement tests apply it, a run only when its parameter file names it
    known_defects: Mapping[str, str] = field(default_factory=dict)
    #: module holding ``PROFILE``, the family's :class:`~driftscope.model.quant.profiles.QuantProfile` (None: the
    #: family runs no quantized policy)
    quantization: str | None = None
    #: module holding ``PROSE``: the family's sentences on the generic pages, by ``PROSE_KEYS`` (what its inputs
    #: overlay shows, examples of its mutations, what its text side carries besides the layers)
    prose: str | None = None
    #: the tensors (fnmatch patterns of checkpoint names) a config derives from others, e.g. a tied ``lm_head``:
    #: no runtime refuses a checkpoint for lacking or holding them; every other missing or unexpected tensor is
    #: a checkpoint error
    derived_weights: Callable[[dict], tuple[str, ...]] = no_derived_weights
    #: the text side's tensors (fnmatch patterns of checkpoint names), which a runtime that reads them only for a
    #: text capture (the compiled emitters) has not read after loading; () leaves their check to the text capture
    text_weights: tuple[str, ...] = ()
    #: refuses, when the checkpoint is opened, a config the family's runtimes cannot run (a
    #: :class:`~driftscope.errors.CheckpointError` naming the setting); None: every config is tried
    check_config: Callable[[dict], None] | None = None
    #: whether ``prepare_inputs`` takes ``video_paths=[...]`` (each video's frames become one grid with t > 1,
    #: packed after the images); False: the family refuses videos (``families.checkpoints.prepare_inputs``)
    videos: bool = False
    #: module saying which operators each runtime can keep in float32 (``operators(runtime, plan)``: stage-id
    #: templates, ``{b}`` a block) and where MLX holds them (``mlx_sites(model, stage_ids)``); None: none can
    precision: str | None = None
    #: the whole plan read from the checkpoint itself, ``(checkpoint, max_new_tokens or None) -> StagePlan`` (the
    #: generic family: its stages come from the two loaded models), where the config alone cannot say it; None:
    #: ``vision_plan`` and ``text_stages`` of the config
    checkpoint_plan: Callable[[Checkpoint, int | None], StagePlan] | None = None
    #: whether the family knows its inputs' geometry (a token grid, windows, crops): the geometry notebook and CLI
    geometry: bool = True

    def plan_for(self, checkpoint: Checkpoint) -> StagePlan:
        """The vision plan of ``checkpoint`` (every stage before the decoder, in execution order)."""
        if self.checkpoint_plan is not None:
            return self.checkpoint_plan(checkpoint, None)
        return self.vision_plan(checkpoint.config)

    def text_stages_for(self, checkpoint: Checkpoint, max_new_tokens: int) -> list[Stage]:
        """The stages past the tower for ``checkpoint`` (the decoder's, the answer's), in execution order."""
        if self.checkpoint_plan is not None:
            vision = set(self.plan_for(checkpoint).ids())
            return [stage for stage in self.checkpoint_plan(checkpoint, max_new_tokens) if stage.id not in vision]
        return self.text_stages(checkpoint.config, max_new_tokens)

    #: how each runtime holds this checkpoint's tensors (``model.load_layout.LoadLayout``: renames, transposes,
    #: splits, what is not loaded or not read), by runtime name; the load audit checks every load against it
    #: (``capture.load_audit``), None: that runtime's load is not audited
    load_layout: Callable[[str, Checkpoint], LoadLayout | None] = no_load_layout

    def supports(self, runtime: str) -> bool:
        return runtime in self.engines

    def engine(self, runtime: str) -> ModuleType:
        """The module that tells ``runtime`` what to load, where to tap and how to replay for this family."""
        if runtime not in self.engines:
            raise RuntimeUnavailableError(
                f"runtime {runtime!r} does not support model family {self.name!r}",
                f"use one of: {', '.join(sorted(self.engines))}",
            )
        return _module(self.engines[runtime])

    def mutation_registry(self) -> Registry[Mutation]:
        return _module(self.mutations).MUTATIONS

    def hypothesis_module(self) -> ModuleType:
        return _module(self.hypotheses)

    def ready_patches(
        self, stage: str, runtime: str, model_type: str | None = None, activations: str | None = None
    ) -> list[str]:
        """The ready patches (``driftscope.hypotheses:NAME``) the family declares as closing an error that
        ``runtime``'s operator introduces at ``stage`` (its hypotheses module's ``HypothesesCapabilities.closes``),
        in declared order; a patch that names its ``model_types`` (a generic family's stage ids are every model's)
        only for those.

        An entry may say which activation dtypes its error lives in (``precisions``, e.g. a norm computed in
        float32 closes only a half-precision one): given the candidate's ``activations``, a patch that cannot
        change anything there (it is computing in float32 already) is not suggested."""
        closes = capabilities_of(self.hypothesis_module(), HypothesesCapabilities).closes
        return [
            f"driftscope.hypotheses:{name}"
            for name, where in closes.items()
            if runtime in where["runtimes"]
            and any(fnmatch.fnmatchcase(stage, p) for p in where["stages"])
            and ("model_types" not in where or model_type in where["model_types"])
            and (activations is None or activations in where.get("precisions", (activations,)))
        ]

    def defect_of(self, patch: str) -> dict[str, str]:
        """What the family knows of the defect a ready patch (``NAME`` or ``driftscope.hypotheses:NAME``) closes:
        ``{"defect": ..., "patch": ...}``, the defect in words (its ``closes`` entry) and what the patch does (its
        docstring's first paragraph); {} for a name the family does not declare."""
        name = patch.rsplit(":", 1)[-1]
        module = self.hypothesis_module()
        entry = capabilities_of(module, HypothesesCapabilities).closes.get(name)
        if entry is None:
            return {}
        doc = " ".join((getattr(getattr(module, name, None), "__doc__", None) or "").strip().split("\n\n")[0].split())
        return {"defect": str(entry.get("defect", "")), "patch": doc}

    def text(self, key: str) -> str:
        """The family's sentence for ``key`` (one of ``PROSE_KEYS``) on a generic page; "" when it has none."""
        if key not in PROSE_KEYS:
            raise KeyError(f"no page asks a family for {key!r}; the keys are {PROSE_KEYS}")
        return _module(self.prose).PROSE.get(key, "") if self.prose else ""

    def precision_operators(self, runtime: str, plan: StagePlan) -> list[str]:
        """What ``runtime`` can keep in float32 in this family (stage-id templates, ``{b}`` a block); [] if none."""
        return list(_module(self.precision).operators(runtime, plan)) if self.precision else []

    def precision_module(self) -> ModuleType:
        if self.precision is None:
            raise ParameterError(
                f"the {self.name} family says of no operator that a runtime can keep it in float32",
                "give the family a precision module (families/<family>/precision.py), or drop options.f32",
            )
        return _module(self.precision)

    def view_hooks(self) -> ModuleType:
        return _module(self.hooks)

    def quant_profile(self) -> Any:
        """What quantized policies need to know about this family (``quant.profiles.QuantProfile``)."""
        if self.quantization is None:
            raise RuntimeUnavailableError(
                f"model family {self.name!r} has no quantization profile, so it runs no quantized policy",
                "use a float policy (f32, f16, bf16), or give the family a quantization module "
                "(docs/adding-a-family.md)",
            )
        return _module(self.quantization).PROFILE
