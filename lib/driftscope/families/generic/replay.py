"""What every generic replay shares: the reference's stages, the model inputs rebuilt from the reference's own
``inputs.*`` stages, and each engine's recorded module calls (one forward per loaded model), whose arguments
other than the main input a replay reuses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from driftscope.inputs.processor_output import ModelInputs
from driftscope.inputs.text_inputs import TextInputs
from driftscope.taps.stages import StagePlan
from driftscope.taps.tapset import TapSet

from .entries import PROMPT, entries


class ReplayContext:
    """Side inputs of every replay of one reference TapSet under one plan."""

    def __init__(self, reference: TapSet, plan: StagePlan):
        self.reference = reference
        self.plan = plan
        self.entries = entries(plan)
        self._calls: dict[tuple[str, int], dict] = {}
        self._inputs: ModelInputs | None = None

    @classmethod
    def from_plan(cls, reference: TapSet, plan: StagePlan) -> ReplayContext:
        return cls(reference, plan)

    def stage(self, reference: TapSet, name: str) -> np.ndarray | None:
        """A reference stage, as captured (None when the reference did not capture it)."""
        return np.asarray(reference[name]) if name in reference else None

    def model_inputs(self) -> ModelInputs:
        """The inputs the reference ran on, from its ``inputs.*`` stages and the prompt's ids."""
        if self._inputs is None:
            names = [
                s.id
                for s in self.plan
                if s.id.startswith("inputs.") and s.id != "inputs.image_tokens" and not s.id.startswith(PROMPT)
            ]
            arrays = {name.removeprefix("inputs."): np.asarray(self.reference[name]) for name in names}
            tokens = (
                np.asarray(self.reference["inputs.image_tokens"]) if "inputs.image_tokens" in self.reference else []
            )
            self._inputs = ModelInputs(arrays, [], [], np.asarray(tokens))
            prompt = {
                stage.id.removeprefix(PROMPT): np.asarray(self.reference[stage.id])
                for stage in self.plan
                if stage.id.startswith(PROMPT) and stage.id in self.reference
            }
            ids = prompt.pop("input_ids")
            self._inputs.text = TextInputs(ids, -1, "", 1, token_arrays=prompt)
        return self._inputs

    def calls(self, engine: str, model: Any, record: Callable[[set[str]], dict]) -> dict:
        """``engine``'s recorded calls of the modules every replayable stage names (recorded once per model)."""
        key = (engine, id(model))
        if key not in self._calls:
            side = "torch" if engine == "transformers" else "mlx"
            paths = {entry[side] for entry in self.entries.values() if entry.get("reads") and entry.get(side)}
            self._calls = {key: record(paths)}  # one model's recording at a time: a released model frees its own
        return self._calls[key]
