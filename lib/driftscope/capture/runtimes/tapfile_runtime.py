"""The ``tapfile`` runtime: a TapSet written by any other engine, compared like a capture.

The engine's sidecar says what ran; this runtime applies nothing. The parameter file's ``policy`` is a
label the sidecar's declared policy must agree with (``runtime_checks`` says when they differ), and the
report keeps the engine's policy and native dtypes as declared.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from driftscope.capture.runtime_checks import declared_policy
from driftscope.capture.runtimes.base import Runtime
from driftscope.core.atomic import write_json_atomic
from driftscope.errors import ParameterError
from driftscope.inputs.processor_output import ModelInputs
from driftscope.model.policies import POLICIES
from driftscope.taps.sink import Progress, StageSink
from driftscope.taps.stages import StagePlan
from driftscope.taps.tapset import TapSet, tap_paths


class TapfileRuntime(Runtime):
    """Loads taps from ``options.path`` (see docs/tapfile.md) instead of running a model."""

    name = "tapfile"
    policies = tuple(POLICIES.names())  # a label here: the engine applied its policy itself
    external = True
    OPTIONS = {"path": "the engine's TapSet (NAME.safetensors with its NAME.json sidecar)"}
    OPTION_TYPES = {"path": "text"}

    def _load(self) -> Any:
        path = self.options.get("path")
        if not path:
            raise ParameterError("runtime 'tapfile' needs options.path", "set options: {path: taps/engine.safetensors}")
        return TapSet(Path(path))

    def versions(self) -> dict[str, str]:
        return dict(self.model.meta.get("versions", {})) if self.model is not None else {}

    def report_policy(self, tapset: TapSet) -> dict | None:
        """The engine's policy as its sidecar declares it (None: it declares none)."""
        return declared_policy(tapset.meta)

    @property
    def label(self) -> str:
        return str(self.options.get("label") or f"tapfile:{Path(self.options.get('path', '?')).stem}")

    def _capture(self, inputs: ModelInputs, sink: StageSink) -> None:  # pragma: no cover - capture() is overridden
        raise NotImplementedError

    def capture(self, inputs: ModelInputs, plan: StagePlan, out_base: Path, progress: Progress | None = None) -> TapSet:
        """Copy the external TapSet next to the run's other taps, labelled for this run (the rest as declared)."""
        self.load()
        tensor_path, sidecar_path = tap_paths(out_base)
        tensor_path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.model.tensor_path, tensor_path)
        meta = dict(self.model.meta, label=self.label, imported_from=str(self.model.tensor_path))
        write_json_atomic(sidecar_path, meta)
        if progress:
            progress(f"imported {len(self.model.stage_ids())} stages from {self.model.tensor_path}")
        return TapSet(tensor_path)
