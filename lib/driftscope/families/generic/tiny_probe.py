"""Does a tiny checkpoint load and run in both libraries, and how far apart are their prefill logits?

One row per model type: the checkpoint built (``tiny.build_tiny``), loaded by transformers (f32, eager attention,
every weight accounted for) and by mlx-vlm (strict), the images through the checkpoint's processor, the whole-model
prefill run in both on the same pixel values and token ids, and the max |difference| of the last position's logits
in f32. A library that cannot load or run the checkpoint leaves its own error message in the row. A large difference
is recorded, not fixed: finding where it comes from is the generic family's work.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from driftscope.model.checkpoint import Checkpoint, validate_checkpoint


@dataclass
class ProbeRow:
    """What one model type's tiny checkpoint did."""

    model_type: str
    built: bool = False
    transformers_load: str = ""  # "ok" or the library's error
    mlx_load: str = ""
    transformers_run: str = ""
    mlx_run: str = ""
    image_tokens: list[int] = field(default_factory=list)
    tokens: int = 0
    processor: str = ""
    max_abs: float | None = None  # max |logits difference| at the last prompt position, f32
    logits_max: float | None = None  # max |logit| of transformers' last position (the scale of max_abs)
    error: str = ""  # the first failure, as the library raised it

    def as_dict(self) -> dict:
        return asdict(self)


def _failed(err: Exception) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())[:400]}"


def transformers_load(directory: Path):
    """transformers' model of the checkpoint (f32, eager attention) and its load report ("ok" or what was missing,
    unexpected or mismatched)."""
    import torch
    from transformers import AutoModelForImageTextToText

    model, info = AutoModelForImageTextToText.from_pretrained(
        str(directory), dtype=torch.float32, attn_implementation="eager", output_loading_info=True
    )
    unloaded = {key: sorted(values) for key, values in info.items() if values}
    return model.eval(), "ok" if not unloaded else f"load report: {unloaded}"


def transformers_logits(model, inputs) -> np.ndarray:
    """transformers' last-position prefill logits."""
    import torch

    from .calls import transformers_kwargs

    with torch.no_grad():
        return model(**transformers_kwargs(inputs)).logits[0, -1].float().numpy()


def probe(
    model_type: str, directory: str | Path, images: list[str | Path], seed: int = 0, adjusted: bool = True
) -> ProbeRow:
    """Build ``model_type``'s tiny checkpoint in ``directory`` (``adjusted``: see ``tiny.build_tiny``) and run both
    libraries on ``images``."""
    from .calls import mlx_load, mlx_prefill
    from .processor import build_text_inputs, prepare_inputs
    from .tiny import build_tiny

    row = ProbeRow(model_type)
    try:
        path, config = validate_checkpoint(build_tiny(model_type, directory, seed, adjusted))
        row.built = True
        checkpoint = Checkpoint(path, config, "generic")
        inputs = prepare_inputs(checkpoint, list(images))
        inputs.text = build_text_inputs(checkpoint, inputs, "Name every shape in the image.")
        row.image_tokens, row.tokens = inputs.image_tokens.tolist(), int(inputs.text.input_ids.size)
        row.processor = inputs.facts["processor"]
    except Exception as err:  # noqa: BLE001 - the row records whatever stopped it
        row.error = f"inputs: {_failed(err)}"
        return row
    expected = got = None
    try:
        model, row.transformers_load = transformers_load(path)
        expected = transformers_logits(model, inputs)
        row.transformers_run = "ok"
    except Exception as err:  # noqa: BLE001 - the library's own message is the finding
        if row.transformers_load:
            row.transformers_run = _failed(err)
        else:
            row.transformers_load = _failed(err)
        row.error = f"transformers: {_failed(err)}"
    try:
        import mlx.core as mx

        model = mlx_load(path, config)
        row.mlx_load = "ok"
        got = np.array(mlx_prefill(model, inputs)[0, -1].astype(mx.float32))
        row.mlx_run = "ok"
    except Exception as err:  # noqa: BLE001 - the library's own message is the finding
        if row.mlx_load != "ok":
            row.mlx_load = _failed(err)
        else:
            row.mlx_run = _failed(err)
        row.error = row.error or f"mlx-vlm: {_failed(err)}"
    if expected is not None and got is not None:
        row.max_abs = float(np.abs(got - expected).max())
        row.logits_max = float(np.abs(expected).max())
    return row
