"""Reading a checkpoint's structure: each library's model loaded in float32 in turn (never both at once), probed
on a small input the checkpoint's own processor makes, released; then the two probes aligned."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from driftscope.errors import CheckpointError
from driftscope.inputs.processor_output import ModelInputs
from driftscope.model.checkpoint import Checkpoint

from .align import Alignment, align
from .probe import SideProbe
from .structure import Structure, cached

#: the probe image: small, wider than tall (so no two image axes have one size by chance), a gradient with edges
PROBE_SIZE = (96, 64)  # width, height
PROBE_PROMPT = "Describe the image."


def probe_image(folder: Path) -> Path:
    """A deterministic RGB gradient with a bright square, as a PNG in ``folder``."""
    from PIL import Image

    width, height = PROBE_SIZE
    x = np.linspace(0, 255, width)[None, :, None]
    y = np.linspace(0, 255, height)[:, None, None]
    pixels = np.concatenate(
        [
            np.broadcast_to(x, (height, width, 1)),
            np.broadcast_to(y, (height, width, 1)),
            np.full((height, width, 1), 96.0),
        ],
        axis=-1,
    ).astype(np.uint8)
    pixels[16:40, 24:56] = (250, 40, 40)
    path = folder / "probe.png"
    Image.fromarray(pixels).save(path)
    return path


def probe_inputs(checkpoint: Checkpoint) -> ModelInputs:
    """The probe's inputs: the probe image through the checkpoint's processor, with a short prompt."""
    from .processor import build_text_inputs, prepare_inputs

    with tempfile.TemporaryDirectory(prefix="driftscope-probe-") as folder:
        inputs = prepare_inputs(checkpoint, [probe_image(Path(folder))])
        inputs.text = build_text_inputs(checkpoint, inputs, PROBE_PROMPT, max_new_tokens=1)
    return inputs


def _torch_side(checkpoint: Checkpoint, inputs: ModelInputs) -> tuple[SideProbe, dict]:
    import torch
    import transformers

    from . import transformers_taps
    from .torch_probe import probe, regions

    model = (
        getattr(transformers, transformers_taps.MODEL_CLASS)
        .from_pretrained(str(checkpoint.path), dtype=torch.float32, attn_implementation="eager", use_safetensors=True)
        .eval()
    )
    return probe(model, lambda: transformers_taps.run_vision(model, inputs)), regions(model)


def _mlx_side(checkpoint: Checkpoint, inputs: ModelInputs) -> SideProbe:
    import mlx.core as mx

    from driftscope.model.blas import mlx_blas

    mlx_blas()
    from . import mlx_taps
    from .mlx_probe import probe

    model = mlx_taps.load(checkpoint.path, checkpoint.config)
    model.set_dtype(mx.float32)
    found = probe(model, lambda: mlx_taps.run_vision(model, inputs))
    mx.clear_cache()  # the model goes with this frame
    return found


def _input_facts(inputs: ModelInputs) -> dict[str, dict]:
    return {
        name: {"rank": int(np.asarray(array).ndim), "integer": bool(np.issubdtype(np.asarray(array).dtype, np.integer))}
        for name, array in inputs.arrays.items()
    }


def read_structure(checkpoint: Checkpoint) -> Structure:
    """Both probes and their alignment (see the module docstring); mlx-vlm failing to load or run the checkpoint
    leaves the transformers side alone, with the library's own error kept."""
    inputs = probe_inputs(checkpoint)
    try:
        torch_probe, regions = _torch_side(checkpoint, inputs)
    except Exception as err:  # noqa: BLE001 - the library's own error, said with the fix
        raise CheckpointError(
            f"checkpoint {checkpoint.path}: transformers could not load or run it ({type(err).__name__}: {err})",
            "check that config.json and the weights belong together (re-save both with save_pretrained), and "
            "that this transformers version implements the model type",
        ) from err
    mlx_probe: SideProbe | None = None
    error = None
    try:
        mlx_probe = _mlx_side(checkpoint, inputs)
    except Exception as err:  # noqa: BLE001 - kept and said by the MLX runtime when a run asks for it
        error = f"{type(err).__name__}: {err}"
    alignment = align(torch_probe, mlx_probe) if mlx_probe is not None else Alignment()
    if mlx_probe is not None and (error := nothing_aligns(alignment)):
        mlx_probe, alignment = None, Alignment()
    prompt = ["input_ids", *sorted(inputs.text.token_arrays)]
    return Structure(torch_probe, mlx_probe, alignment, regions, _input_facts(inputs), error, prompt)


def nothing_aligns(alignment: Alignment) -> str | None:
    """Why the two models cannot be compared module by module: no module of one owns the tensors of a module of
    the other but the whole models' (None: some do)."""
    if any(pair.how == "weights" and pair.torch for pair in alignment.pairs):
        return None
    return (
        "nothing aligns: no module of mlx-vlm's model owns the same tensors as a module of transformers' (its loader "
        "changed every value, or it loaded another model than config.json describes)"
    )


def structure_of(checkpoint: Checkpoint) -> Structure:
    """The checkpoint's structure, read once and kept (``structure.cached``)."""
    return cached(checkpoint.path, lambda: read_structure(checkpoint))


def model_class(config: dict) -> Any:
    """The transformers class the generic family loads a config's model with (a clear error when none)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    model_type = config.get("model_type")
    name = MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.get(model_type)
    if name is None:
        raise CheckpointError(
            f"model_type {model_type!r} is not an image-text-to-text model transformers implements "
            "(AutoModelForImageTextToText has no class for it), so nothing here can be the reference",
            "check config.json's model_type; driftscope compares vision-language models that transformers "
            "implements (a family folder can add one it does not)",
        )
    return name
