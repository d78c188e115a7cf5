"""The ``transformers`` oracle: float32 on CPU (float64 on request), captured through hooks.

The checkpoint's family says which model class to load, which modules to hook for which stage and
which modules replay a stage (its ``transformers_taps`` module, :class:`TransformersTaps`).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol, runtime_checkable

import numpy as np

from driftscope.capture.runtimes.base import (
    Runtime,
    package_versions,
    refuse_weights,
    require,
)
from driftscope.families.capabilities import TransformersCapabilities
from driftscope.inputs.processor_output import ModelInputs
from driftscope.model.quant.policy import RUNTIME_POLICIES
from driftscope.taps.sink import StageSink
from driftscope.taps.substitute import substitution_target


@runtime_checkable
class TransformersTaps(Protocol):
    """What a family tells this engine (module-level names of ``families/<family>/transformers_taps.py``)."""

    MODEL_CLASS: str  # the transformers class loaded with from_pretrained
    CAPABILITIES: TransformersCapabilities  # what else it declares (load arguments, load corrections)

    def run_vision(self, model: Any, inputs: ModelInputs) -> Any: ...

    # may return the tower's output, which is then handed to capture_text as ``tower=`` (no second tower run)
    def capture(self, model: Any, inputs: ModelInputs, sink: StageSink) -> Any: ...

    def capture_text(self, model: Any, inputs: ModelInputs, sink: StageSink, **tower: Any) -> None: ...

    def replay(self, model: Any, stage_id: str, inputs: list[np.ndarray], ctx: Any) -> np.ndarray: ...


def refuse_partial_load(path, info: dict, derived: tuple[str, ...] = ()) -> None:
    """transformers fills weights the checkpoint lacks with random values and only logs it: a checkpoint error,
    naming the tensors, for any weight missing, unexpected or of another shape (the family's derived ones aside)."""
    mismatched = [entry[0] if isinstance(entry, tuple | list) else entry for entry in info.get("mismatched_keys") or ()]
    found = {"missing": info.get("missing_keys"), "unexpected": info.get("unexpected_keys"), "mismatched": mismatched}
    refuse_weights(path, "transformers", found, derived)


class TransformersRuntime(Runtime):
    """Hugging Face transformers' own model code, eager attention, on the CPU (``tf32``: float32 with TF32
    operand rounding around every forward and replay, what a GPU reference with ``allow_tf32`` computes)."""

    name = "transformers"
    ENGINE_MODULE = TransformersTaps
    CAPABILITIES = TransformersCapabilities
    REQUIRES = {"torch": "torch", "transformers": "transformers"}
    OPTIONS = {
        "threads": "torch threads (default: torch's own)",
        "attn_implementation": "the attention kernel transformers loads (default eager)",
        "load_fixes": "true (default): the family's corrections of what transformers' own load gets wrong (e.g. "
        "a square stacked expert left untransposed); false: its load as it is, which the load audit then judges",
        "stream": "true: the weights stream from the memory-mapped checkpoint module by module as the model runs, "
        "never the whole model in memory (a reference larger than the machine's memory; the family's declared "
        "load layout names each tensor); false (default): loaded whole",
    }
    OPTION_TYPES = {"threads": "positive whole number", "attn_implementation": "text"}
    OPTION_VALUES = {"load_fixes": (True, False), "stream": (True, False)}
    policies = ("f32", "f64", "tf32", *RUNTIME_POLICIES["transformers"])  # q4-dequant: the dense dequantized checkpoint

    def arithmetic(self) -> AbstractContextManager:
        """The policy's arithmetic around a forward: TF32 operand rounding under ``tf32``, else nothing."""
        if self.policy.name == "tf32":
            from driftscope.model.tf32 import emulate_tf32

            return emulate_tf32()
        return nullcontext()

    def _load(self) -> Any:
        torch = require("torch", "torch", self.name, self.EXTRA)
        transformers = require("transformers", "transformers", self.name, self.EXTRA)
        dtype = torch.float64 if self.policy.name == "f64" else torch.float32
        torch.set_num_threads(int(self.options.get("threads", torch.get_num_threads())))
        if self.options.get("stream"):
            return self._load_streamed(transformers, dtype)
        model, info = getattr(transformers, self.taps.MODEL_CLASS).from_pretrained(
            str(self.checkpoint.path),
            dtype=dtype,
            attn_implementation=self.options.get("attn_implementation", "eager"),
            use_safetensors=True,
            output_loading_info=True,
            ignore_mismatched_sizes=True,  # reported in the loading info, then refused naming the tensors
            **dict(self.capabilities.load_kwargs),
        )
        refuse_partial_load(self.checkpoint.path, info, self.family.derived_weights(self.checkpoint.config))
        correct = self.capabilities.correct_load
        if correct is not None and self.options.get("load_fixes", True):
            self.load_corrections = list(correct(model, self.checkpoint))
        return model.eval()

    _streamer = None

    def _load_streamed(self, transformers: Any, dtype: Any) -> Any:
        """The model built with every parameter on ``meta``, its weights streamed as it runs (``streamed``)."""
        from driftscope.capture.runtimes.streamed import streamed_model

        model, self._streamer = streamed_model(self, transformers, dtype)
        return model.eval()

    def streaming(self) -> AbstractContextManager:
        """A streamed model's forward (``streamed.streaming``: a weight read outside its module said plainly)."""
        if self._streamer is None:
            return nullcontext()
        from driftscope.capture.runtimes.streamed import streaming

        return streaming(self)

    def release(self) -> None:
        if self._streamer is not None:
            self._streamer.remove()
            self._streamer = None
        super().release()

    def versions(self) -> dict[str, str]:
        return package_versions("torch", "transformers")

    def loaded_tensors(self) -> dict:
        if self._streamer is not None:  # what a module is given when it runs, read as the hooks read it
            return self._streamer.loaded_tensors()

        def rows_of(param):
            return lambda rows: (param.detach() if rows is None else param.detach()[rows]).double().numpy()

        return {
            name: (tuple(param.shape), str(param.dtype).removeprefix("torch."), rows_of(param))
            for name, param in self.model.named_parameters()
        }

    def weight_dtypes(self) -> dict[str, int]:
        from collections import Counter

        return dict(Counter(str(p.dtype).removeprefix("torch.") for p in self.model.parameters()))

    def run_vision(self, inputs: ModelInputs):
        """The plain vision forward (no taps): the tower's output."""
        self.load()
        with self.arithmetic():
            return self.taps.run_vision(self.model, inputs)

    def _capture(self, inputs: ModelInputs, sink: StageSink) -> None:
        self.put_inputs(inputs, sink)
        with self.arithmetic(), self.streaming():
            self._tower = self.taps.capture(self.model, inputs, sink)
        if self._streamer is not None:
            sink.writer.meta["streamed"] = self._streamer.record()

    can_replay = True
    decodes = True

    def _capture_text(self, inputs: ModelInputs, sink: StageSink) -> None:
        """Prefill the whole model on the prompt (hooks on the text layers), then greedy decode with the cache;
        the tower's output from this capture is reused when the family returned one."""
        tower, self._tower = self.__dict__.pop("_tower", None), None
        with self.arithmetic(), self.substituting(inputs), self.streaming():
            self.taps.capture_text(self.model, inputs, sink, **({"tower": tower} if tower is not None else {}))
        if self._streamer is not None:
            sink.writer.meta["streamed"] = self._streamer.record()

    substitutes = True

    def substituting(self, inputs: ModelInputs) -> AbstractContextManager:
        """The prefill reads ``inputs.text.image_embeds`` at the image slots, when set (the decoder's own
        ``inputs_embeds``, rewritten by a pre-hook)."""
        text = inputs.text
        if text is None or text.image_embeds is None:
            return nullcontext()
        from driftscope.taps.substitute import torch_image_rows

        return torch_image_rows(substitution_target(self, getattr(self.model, "model", None), "language_model"), text)

    def replay(self, stage_id: str, inputs: list[np.ndarray], ctx: Any) -> np.ndarray:
        """The stage's own torch modules (the ones the forward ran) applied to ``inputs``; float32 result."""
        self.load()
        with self.arithmetic(), self.streaming():
            return np.asarray(self.taps.replay(self.model, stage_id, inputs, ctx), dtype=np.float32)
