"""The Runtime interface: load a checkpoint under a precision policy, capture a TapSet.

An engine knows no model family: it asks the checkpoint's family (``self.taps``) what to load, where to
tap and how to replay, and keeps the engine's own concerns (policy, dtype, plumbing, orchestration).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from driftscope.capture.load_audit import audit_runtime, audit_summary
from driftscope.capture.patches import HypothesisPatch
from driftscope.capture.quantized import QuantizedWeights, check_policy_fits, quantized_weights
from driftscope.core.extras import install_extra, missing_modules
from driftscope.errors import CheckpointError, OutputError, ParameterError, RuntimeUnavailableError, some
from driftscope.families.capabilities import capabilities_of
from driftscope.families.hypotheses import hypotheses_of
from driftscope.inputs.processor_output import ModelInputs
from driftscope.model.checkpoint import Checkpoint
from driftscope.model.policies import get_policy
from driftscope.model.precision import PrecisionPolicy
from driftscope.model.quant.policy import OPTION_KEYS, QuantizedPolicy
from driftscope.taps.answer_question import AnswerQuestion
from driftscope.taps.sink import Progress, StageSink
from driftscope.taps.stages import StagePlan
from driftscope.taps.tapset import WRITES, TapSet, TapWriter

if TYPE_CHECKING:
    from driftscope.families.base import Family


def require(module: str, package: str, runtime: str, extra: str | None = None) -> Any:
    """Import ``module`` or raise a clear error naming the package (or driftscope's ``extra``) to install."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise RuntimeUnavailableError(
            f"runtime {runtime!r} needs the package {package!r}, which is not importable ({err})",
            f"{install_hint(extra, [package])} or drop {runtime!r} from 'runtimes'",
        ) from err


def install_hint(extra: str | None, packages: list[str]) -> str:
    """How to install what a runtime lacks: its driftscope ``extra`` when it has one, else the packages."""
    return install_extra(extra) if extra else f"install {' '.join(packages)} (pip install {' '.join(packages)})"


def package_versions(*names: str) -> dict[str, str]:
    versions = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "missing"
    return versions


#: what each kind of refused tensor is, in a checkpoint error
REFUSED = {
    "missing": "the model needs but the checkpoint lacks",
    "unexpected": "the checkpoint holds but the model does not use",
    "mismatched": "whose shape differs from the model's",
}


def refuse_weights(path: Path, engine: str, found: dict[str, Iterable[str]], derived: Iterable[str] = ()) -> None:
    """A checkpoint error naming the tensors ``engine`` found ``missing``, ``unexpected`` or ``mismatched``
    (``found``: kind -> names), those matching a pattern of the family's ``derived`` tensors left out: a runtime
    that went on would compute with random values or without a tensor the checkpoint holds."""
    from driftscope.model.weightfile import matching

    derived = tuple(derived)
    for kind, what in REFUSED.items():
        names = {str(name) for name in found.get(kind) or ()}
        names = sorted(names - (matching(names, derived) if kind != "mismatched" else set()))
        if names:
            raise CheckpointError(
                f"checkpoint {path}: {engine}: tensors {what}: {some(names)}",
                "check that config.json and the weights belong together (re-save both with save_pretrained)",
            )


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


#: kind -> (whether a value is of it, an example): what :attr:`Runtime.OPTION_TYPES` names
OPTION_KINDS: dict[str, tuple[Any, str]] = {
    "positive whole number": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0, "2"),
    "positive number": (lambda v: _number(v) and v > 0, "512"),
    "text": (lambda v: isinstance(v, str) and bool(v.strip()), "a-name"),
    "list of texts": (lambda v: isinstance(v, list) and all(isinstance(x, str) and x for x in v), "[a, b]"),
}


class Runtime(ABC):
    """Loads one checkpoint under one precision policy and captures stages of its vision tower."""

    name: str = ""
    policies: tuple[str, ...] = ("f32",)
    #: the runtime options this engine reads (name -> what it does); ``label`` and, where the engine offers a
    #: quantized policy, the quantization options (``model.quant.policy.OPTION_KEYS``) are known to every one
    OPTIONS: dict[str, str] = {}
    #: option -> the values it accepts, where they are a fixed set
    OPTION_VALUES: dict[str, tuple] = {}
    #: the modules this engine imports (module -> the package that provides it), checked before a run starts
    REQUIRES: dict[str, str] = {}
    #: driftscope's optional dependency group that installs them (``pip install 'driftscope[EXTRA]'``), if any
    EXTRA: str | None = None
    #: option -> the kind of value it takes (:data:`OPTION_KINDS`), where it is not a fixed set
    OPTION_TYPES: dict[str, str] = {}
    #: the Protocol a family's module for this engine answers (``Family.engines[name]``) and the type of that
    #: module's ``CAPABILITIES`` (:mod:`driftscope.families.capabilities`); None: the engine reads no family module
    ENGINE_MODULE: ClassVar[type | None] = None
    CAPABILITIES: ClassVar[type | None] = None
    external: ClassVar[bool] = False  # the taps come from outside driftscope (an unreadable file: "could not run")
    load_audit: dict | None = None  # the last load's record (``capture.load_audit``)
    load_corrections: tuple[str, ...] | list[str] = ()  # what the family's ``correct_load`` put right at the last

    def __init__(
        self,
        checkpoint: Checkpoint,
        policy: str = "f32",
        patch: HypothesisPatch | None = None,
        options: dict | None = None,
    ):
        self.check_policy(policy)
        self.check_options(options or {})
        self.checkpoint = checkpoint
        self.policy: PrecisionPolicy = get_policy(policy)
        self.patch = patch
        self.options = dict(options or {})
        self.model: Any = None
        self.timings: dict[str, float] = {}
        #: the checkpoint the run names; ``checkpoint`` is what loads (under a -dequant policy, its dense
        #: dequantized copy: see ``quant.loading``)
        self.source = checkpoint
        self.quantized: QuantizedWeights | None = None
        if not self.external:
            check_policy_fits(checkpoint, self.policy, self.options)

    @classmethod
    def check_policy(cls, policy: str) -> None:
        """Raise a clear error unless this runtime offers ``policy`` (before anything is loaded)."""
        if policy not in cls.policies:
            get_policy(policy)  # unknown names list every registered policy
            raise RuntimeUnavailableError(
                f"runtime {cls.name!r} does not offer policy {policy!r}", f"use one of: {', '.join(cls.policies)}"
            )

    @classmethod
    def check_installed(cls) -> None:
        """Raise a clear error, before anything runs, when a package this engine imports is not installed."""
        missing = missing_modules(cls.REQUIRES)
        if missing:
            raise RuntimeUnavailableError(
                f"runtime {cls.name!r} needs {', '.join(missing)}, which is not installed here",
                f"{install_hint(cls.EXTRA, missing)}, or drop {cls.name!r} from 'runtimes'",
            )

    def mixed_policy(self) -> PrecisionPolicy:
        """The policy with ``options.f32``'s operators in float32 (``model.mixed``; under f32 there is nothing to
        widen)."""
        from driftscope.model.mixed import with_float32

        if self.policy.activations == "float32" and (self.policy.dot_inputs or "float32") == "float32":
            raise ParameterError(
                f"options.f32 widens operators of a half-precision policy, and {self.policy.name} is float32 already",
                "drop options.f32, or give a half-precision policy (f16, bf16, f16-contract, f16-state)",
            )
        plan = self.family.plan_for(self.checkpoint)
        return with_float32(self.policy, self.check_float32(self.options["f32"], self.family, plan))

    @classmethod
    def check_float32(cls, patterns: list, family: Family, plan: StagePlan) -> tuple[str, ...]:
        """The stage ids ``options.f32`` names (``model.mixed.expand``), each an operator this runtime can keep in
        float32 in ``family`` (``plan``: its full vision plan), else a :class:`ParameterError` naming the ones it
        cannot (a block the tower does not have, an operator the family does not widen)."""
        from driftscope.model.mixed import compress, expand

        ids = expand(patterns, plan.depth)
        templates = family.precision_operators(cls.name, plan)
        allowed = {template.format(b=block) for template in templates for block in range(max(plan.depth, 1))}
        unknown = [stage_id for stage_id in ids if stage_id not in allowed]
        if unknown:
            examples = ", ".join(t.replace("{b}", f"0-{plan.depth - 1}") for t in templates) or "none"
            raise ParameterError(
                f"options.f32 names {', '.join(compress(unknown)[:4])}: not an operator {cls.name} can keep in "
                f"float32 in this {family.name} checkpoint (blocks 0-{plan.depth - 1})",
                f"name operators it can: {examples}" if templates else "drop options.f32 for this runtime",
            )
        return ids

    @classmethod
    def known_options(cls) -> dict[str, str]:
        """Every option this runtime accepts, with what it does."""
        known = {
            "label": "the runtime's label in the report (default runtime:policy)",
            "tap_writes": "background (default: a writer thread, next to the forward) or inline: how the captured "
            "stages reach the tap file (the same file either way)",
            **cls.OPTIONS,
        }
        if not cls.external and any(name.startswith("q") for name in cls.policies):
            known.update(dict.fromkeys(OPTION_KEYS, "quantization setting of a quantized policy"))
        return known

    @classmethod
    def check_options(cls, options: dict, where: str = "options") -> None:
        """Raise a clear error for an option this runtime does not read (it would be silently ignored) or a value
        it does not accept, naming the options it knows."""
        known = cls.known_options()
        unknown = sorted(str(key) for key in options if key not in known)
        if unknown:
            raise ParameterError(
                f"runtime {cls.name!r} has no option {', '.join(map(repr, unknown))} ({where})",
                f"the options {cls.name!r} knows: {', '.join(sorted(known))}",
            )
        for key, allowed in {"tap_writes": WRITES, **cls.OPTION_VALUES}.items():
            if key in options and options[key] not in allowed:
                raise ParameterError(
                    f"{where}.{key}={options[key]!r} is not a value runtime {cls.name!r} accepts",
                    f"use one of: {', '.join(map(str, allowed))}",
                )
        for key, kind in {"label": "text", **cls.OPTION_TYPES}.items():
            if key in options and not OPTION_KINDS[kind][0](options[key]):
                raise ParameterError(
                    f"{where}.{key}={options[key]!r} is not a {kind}, which runtime {cls.name!r} needs there",
                    f"write e.g. {key}: {OPTION_KINDS[kind][1]}",
                )

    @property
    def family(self) -> Family:
        from driftscope.families import get_family

        return get_family(self.checkpoint.family)

    @property
    def taps(self) -> Any:
        """The checkpoint family's module for this engine: what to load, where to tap, how to replay."""
        return self.family.engine(self.name)

    @property
    def capabilities(self) -> Any:
        """What the family's module for this engine declares it can do (its typed ``CAPABILITIES``)."""
        return capabilities_of(self.taps, self.CAPABILITIES)

    def load(self) -> None:
        """Load the model (once) and apply the hypothesis patch."""
        if self.model is not None:
            return
        start = time.perf_counter()
        if isinstance(self.policy, QuantizedPolicy) and self.quantized is None:
            self.quantized = quantized_weights(self.source, self.policy, self.options, self.family)
            self.checkpoint = self.quantized.checkpoint
        self.model = self._load()
        self.audit_load()  # before any capture, and before a patch changes what was loaded
        if self.patch is not None:
            with hypotheses_of(self.checkpoint.family):
                self.model = self.patch.apply(self.model)
        self.timings["load_s"] = time.perf_counter() - start

    #: whether a load audit with findings stops this runtime (the run's reference: nothing compares against it)
    strict_audit: bool = False

    def audit_load(self) -> None:
        """Check every loaded parameter against the checkpoint (``capture.load_audit``): the record goes into the
        capture's sidecar; the reference (``strict_audit``) stops on a finding."""
        self.load_audit = audit_runtime(self)

    def loaded_tensors(self) -> dict:
        """``{name: (shape, dtype, rows(index or None) -> float array)}`` of every parameter the loaded model holds
        (the load audit's view of it); an engine that loads nothing holds nothing."""
        return {}

    def release(self) -> None:
        """Drop the loaded model (its memory, by a full collection where reference counting did not free it, as
        under a hypothesis patch); a later capture or replay loads it again."""
        from driftscope.core.memory import free, watch

        if self.model is None:
            return  # nothing was loaded since the last release, which freed what it dropped
        watched = watch(self.model) if self.patch is None else None
        self.model = None
        free(watched)

    @abstractmethod
    def _load(self) -> Any: ...

    @abstractmethod
    def _capture(self, inputs: ModelInputs, sink: StageSink) -> None: ...

    @abstractmethod
    def versions(self) -> dict[str, str]: ...

    def metadata(self, inputs: ModelInputs) -> dict:
        return {
            "runtime": self.name,
            "label": self.label,
            "policy": self.policy.to_dict(),
            "patch": self._describe_patch(),
            "versions": self.versions(),
            "inputs_digest": inputs.digest,
            "checkpoint": str(self.source.path),
            "family": self.checkpoint.family,
            "options": self.options,
            **({"load_audit": audit_summary(self.load_audit)} if self.load_audit else {}),
            **({"quantization": self.quantized.report} if self.quantized else {}),
        }

    def _describe_patch(self) -> dict | None:
        if self.patch is None:
            return None
        with hypotheses_of(self.checkpoint.family):
            return self.patch.describe()

    @property
    def label(self) -> str:
        return str(self.options.get("label") or f"{self.name}:{self.policy.name}")

    def weight_dtypes(self) -> dict[str, int]:
        """How many weight tensors the loaded model holds in each dtype (as observed, not as the policy says)."""
        return {}

    def report_policy(self, tapset: TapSet) -> dict:
        """The policy as the report records it for this capture."""
        return self.policy.to_dict()

    def capture(self, inputs: ModelInputs, plan: StagePlan, out_base: Path, progress: Progress | None = None) -> TapSet:
        """Run the vision tower once on ``inputs``, streaming the planned stages to ``out_base``."""
        self.load()
        self.check_capture(inputs, plan)
        writer = TapWriter(out_base, self.metadata(inputs), writes=str(self.options.get("tap_writes", "background")))
        sink = StageSink(writer, plan, progress)
        sink.question = AnswerQuestion.of(inputs.text, self.policy.activations)
        start = time.perf_counter()
        try:
            self._capture(inputs, sink)
            if inputs.text is not None and any(stage.id.startswith("text.") for stage in plan):
                self._capture_text(inputs, sink)
                if self.load_audit:  # the text side's weights, where read at the text capture, are audited there
                    writer.meta["load_audit"] = audit_summary(self.load_audit)
            writer.drain()  # the capture's time includes its last bytes' writes (a failed write raises here)
        except BaseException as err:
            if isinstance(err, OSError | OutputError):
                writer.abandon()  # the disk refused a write: nothing is kept under the TapSet's name
            else:
                writer.close(complete=False, error=f"{type(err).__name__}: {err}")
            raise
        self.timings["capture_s"] = time.perf_counter() - start
        writer.meta["timings"] = dict(self.timings)
        return writer.close()

    def check_capture(self, inputs: ModelInputs, plan: StagePlan) -> None:  # noqa: B027 (a hook, not abstract)
        """Refuse, before anything is written, a capture the loaded model cannot run (none here)."""

    def _capture_text(self, inputs: ModelInputs, sink: StageSink) -> None:
        """Prefill and greedy decode on the prompt (runtimes without a text side capture nothing here)."""
        if sink.progress:
            sink.progress(f"runtime {self.name!r} has no text side: text stages are left out")

    #: whether the text side can take another runtime's merged image embeddings (``TextInputs.image_embeds``)
    substitutes: bool = False

    #: whether ``replay`` is implemented (same-input replay of single stages)
    can_replay: bool = False
    #: whether the text capture decodes greedily past the prefill (``text.generate.*``)
    decodes: bool = False

    @classmethod
    def decodes_with(cls, family: str) -> bool:
        """Whether this engine decodes greedily for ``family`` (engines whose decoding is the family's code,
        the compiled ones, ask the family)."""
        return cls.decodes

    def replay(self, stage_id: str, inputs: list[np.ndarray], ctx: Any) -> np.ndarray:
        """Run only ``stage_id``'s operator on ``inputs`` (another runtime's stage values); float32 result."""
        raise RuntimeUnavailableError(
            f"runtime {self.name!r} cannot replay single stages", "replay with transformers, mlx, jax or iree"
        )

    def same_input_controls(self, reference: TapSet, plan: StagePlan) -> dict | None:
        """Controls beyond the stage replay, on the reference's own stage inputs (None: this runtime has none)."""
        return None

    def put_inputs(self, inputs: ModelInputs, sink: StageSink) -> None:
        for stage_id, value in inputs.stages().items():
            sink.put(stage_id, value)
