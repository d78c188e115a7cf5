"""What a family's engine module may declare beyond the functions its runtime calls: one typed object, named
``CAPABILITIES``, per engine module, every capability with its default here.

A runtime reads only these fields (never a module attribute it might lack); a misspelt capability is refused
when the family's module is imported (an unknown keyword of the dataclass), and ``tests/families/
test_capabilities.py`` checks that every family's engine module declares the type its runtime reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import RuntimeUnavailableError

if TYPE_CHECKING:
    from driftscope.model.checkpoint import Checkpoint


@dataclass(frozen=True)
class TransformersCapabilities:
    """What the ``transformers`` runtime may be told besides ``TransformersTaps``."""

    #: further ``from_pretrained`` (and streamed ``_from_config``) arguments the family needs (e.g. a kernel choice)
    load_kwargs: Mapping[str, Any] = field(default_factory=dict)
    #: ``(model, checkpoint) -> names put right``: corrects what transformers' own load gets wrong (e.g. a square
    #: stacked expert left untransposed), applied unless ``options.load_fixes`` is false; None: nothing to correct
    correct_load: Callable[[Any, Checkpoint], Iterable[str]] | None = None


@dataclass(frozen=True)
class MLXCapabilities:
    """What the ``mlx`` runtime may be told besides ``MLXTaps``."""

    #: ``(config, path) -> list[str]``: the settings of a config (or of the weights at ``path``) the family's
    #: mlx-vlm port cannot represent, each naming its key, asked before loading; None: every config is tried
    unrepresentable: Callable[[dict, Path], list[str]] | None = None


@dataclass(frozen=True)
class CompiledCapabilities:
    """What the compiled runtimes (``jax``, ``iree``) may be told besides ``CompiledTaps``."""

    #: the text side decodes greedily after the prefill (``text.generate.*``)
    decodes: bool = False
    #: the text prefill can read another runtime's merged image embeddings (``TextInputs.image_embeds``)
    substitutes: bool = False
    #: the tower and the text prefill read only their real rows of a call padded past them, so ``options.buckets:
    #: pow2`` pads both (the family's buckets then carry ``merge_unit``, the rows a padded call is a multiple of)
    buckets: bool = False
    #: the text decoder holds its own weights and never reads the tower's: the compiled runtimes drop the tower's
    #: while the text side runs (``capture.runtimes.compiled_weights``)
    tower_weights_apart: bool = False
    #: checkpoint tensors (fnmatch patterns) the emitter reads only as dot operands: held in float16 under a
    #: policy whose dots take float16 (``compiled_weights.half_weights``)
    dot_weights: tuple[str, ...] = ()


@dataclass(frozen=True)
class HooksCapabilities:
    """What a family's page hooks module (``Family.hooks``) may offer beyond the hooks every family has."""

    #: ``(reference, candidate) -> list`` of the sparse layers that routed tokens to other experts than the
    #: reference's (notebook 01's per-token choices, ``views.choices``); None: the family routes no tokens
    rerouted: Callable[[Any, Any], list] | None = None


@dataclass(frozen=True)
class PrecisionCapabilities:
    """What a family's precision module (``Family.precision``) may say beyond ``operators`` and ``mlx_sites``."""

    #: why the precision search names no text operator (the report's ``precision.<candidate>.text``); None: it
    #: names them, or the family says nothing
    text_reason: str | None = None


@dataclass(frozen=True)
class HypothesesCapabilities:
    """What a family's hypotheses module (``Family.hypotheses``) declares beyond its patches."""

    #: ready patch name -> the defect it closes: ``runtimes`` and ``stages`` (fnmatch) where that runtime's
    #: operator introduces it, ``defect`` in words, optionally ``model_types`` and ``precisions`` (the activation
    #: dtypes it lives in): ``Family.ready_patches`` suggests it there
    closes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


Capabilities = TypeVar(
    "Capabilities",
    TransformersCapabilities,
    MLXCapabilities,
    CompiledCapabilities,
    HooksCapabilities,
    PrecisionCapabilities,
    HypothesesCapabilities,
)
#: the kinds a module may leave undeclared (each field then has its default): a family's page hooks, precision and
#: hypotheses modules, and a plugin's, need declare only what they offer; an engine module always declares its own
OPTIONAL = (HooksCapabilities, PrecisionCapabilities, HypothesesCapabilities)


def capabilities_of(module: ModuleType, kind: type[Capabilities]) -> Capabilities:
    """``module``'s declared ``CAPABILITIES``, which must be a ``kind`` (of an :data:`OPTIONAL` kind, none declared
    is the defaults): a clear error naming the module if not."""
    declared = vars(module).get("CAPABILITIES")
    if declared is None and kind in OPTIONAL:
        return kind()
    if not isinstance(declared, kind):
        raise RuntimeUnavailableError(
            f"{module.__name__} declares no {kind.__name__} (its CAPABILITIES is {type(declared).__name__})",
            f"add `CAPABILITIES = {kind.__name__}(...)` to {module.__name__} "
            "(driftscope.families.capabilities lists every capability with its default)",
        )
    return declared
