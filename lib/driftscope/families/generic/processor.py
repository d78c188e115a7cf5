"""Inputs of any family: the checkpoint's own processor and chat template, run on the images (resized, tiled and
split as the family does) and on a user turn holding the images then the prompt.

The processor is transformers' class of the model type, built from the checkpoint's files with its PIL image
processor. transformers 5.24's video processors all need torchvision, so a processor that also takes videos is
built without its video processor (images and text go through the family's own code unchanged). Where the class
itself needs torchvision (Mistral 3's ``PixtralProcessor``, LFM2-VL's image processor), mlx-vlm's processor of the
model type is used instead, and the inputs' warnings say so.

The class is resolved by name, never through ``AutoProcessor``: importing an mlx-vlm model module replaces
``AutoProcessor.from_pretrained`` for its model type with mlx-vlm's own processor.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from driftscope.errors import CheckpointError, InputError
from driftscope.inputs.processor_output import ModelInputs, as_processor_sees, load_image
from driftscope.inputs.text_inputs import DEFAULT_PROMPT, TextInputs

if TYPE_CHECKING:
    from driftscope.model.checkpoint import Checkpoint

#: per-token processor outputs: the prompt's, not the images'
TEXT_OUTPUTS = ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids")
#: processor outputs for training that no forward takes
TRAINING_OUTPUTS = ("labels",)


def processor_class(model_type: str):
    """transformers' processor class of ``model_type``, without its video processor where it has one; ImportError
    where transformers 5.24 cannot build it without torchvision."""
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES, processor_class_from_name

    name = PROCESSOR_MAPPING_NAMES.get(model_type)
    if name is None:
        raise CheckpointError(f"transformers has no processor for model_type {model_type!r}", "pass a VLM checkpoint")
    try:
        found = processor_class_from_name(name)
    except ValueError as err:  # the class's module needs torchvision
        raise ImportError(f"transformers' {name} cannot be built here: {err}") from err
    if found is None or "video_processor" not in found.get_attributes():
        return found

    def get_attributes(cls) -> list[str]:
        return [attribute for attribute in found.get_attributes() if attribute != "video_processor"]

    namespace = {"get_attributes": classmethod(get_attributes), "__module__": found.__module__}
    return type(name, (found,), namespace)


def no_video(cls) -> dict:
    """The keyword that builds ``cls`` without a video processor (``video_processor=None``), where it takes one."""
    return {"video_processor": None} if "video_processor" in inspect.signature(cls.__init__).parameters else {}


def load_processor(checkpoint: Checkpoint) -> tuple[Any, str]:
    """The checkpoint's processor and where it comes from (``transformers <class>`` or ``mlx-vlm <class>``); its chat
    template is the checkpoint's (``chat_template.jinja``, read by the tokenizer where the processor does not)."""
    model_type = checkpoint.config.get("model_type")
    failures = []
    try:
        found = processor_class(model_type)
        processor = found.from_pretrained(str(checkpoint.path), **no_video(found))
        source = f"{_library(processor)} {type(processor).__name__}"
    except (ImportError, ValueError) as err:  # the class, or its image processor, needs torchvision
        failures.append(f"transformers: {type(err).__name__}: {err}")
        processor = None
    except (OSError, TypeError, KeyError) as err:
        raise CheckpointError(
            f"checkpoint {checkpoint.path} has no processor that loads ({type(err).__name__}: {err})",
            "save the processor next to the weights (processor.save_pretrained), with its tokenizer and chat template",
        ) from err
    if processor is None:
        processor, source = _mlx_vlm_processor(checkpoint, model_type, failures)
    tokenizer = getattr(processor, "tokenizer", None)
    if getattr(processor, "chat_template", None) is None and tokenizer is not None:
        processor.chat_template = tokenizer.chat_template
    return processor, source


def _library(processor) -> str:
    """``transformers``, or ``mlx-vlm`` where mlx-vlm has replaced the class's code in place (importing
    ``mlx_vlm.models.lfm2_vl`` patches transformers' ``Lfm2VlProcessor.__init__`` to use its own image processor)."""
    parts = (type(processor).__init__, type(getattr(processor, "image_processor", processor)))
    return "mlx-vlm" if any(getattr(part, "__module__", "").startswith("mlx_vlm") for part in parts) else "transformers"


def _mlx_vlm_processor(checkpoint: Checkpoint, model_type: str, failures: list[str]) -> tuple[Any, str]:
    import importlib

    try:
        from mlx_vlm.utils import load_processor as mlx_load_processor

        importlib.import_module(f"mlx_vlm.models.{model_type}")  # installs its processor for the model type
        processor = mlx_load_processor(checkpoint.path, add_detokenizer=False)
    except (ImportError, OSError, ValueError, TypeError, KeyError) as err:
        failures.append(f"mlx-vlm: {type(err).__name__}: {err}")
        raise CheckpointError(
            f"no processor of checkpoint {checkpoint.path} loads without torchvision ({'; '.join(failures)})",
            "save the processor next to the weights (processor.save_pretrained), with its tokenizer and chat template",
        ) from err
    return processor, f"mlx-vlm {type(processor).__name__}"


def image_token_id(config: dict) -> int:
    """The image placeholder id the config names (``image_token_id`` or ``image_token_index``)."""
    for section in (config, config.get("text_config") or {}):
        for key in ("image_token_id", "image_token_index"):
            if section.get(key) is not None:
                return int(section[key])
    raise CheckpointError("the checkpoint's config names no image token id", "set image_token_id in config.json")


def chat_prompt(processor, images: int, prompt: str) -> str:
    """The chat template's text of one user turn holding ``images`` images then ``prompt``, generation prompt added."""
    content = [{"type": "image"}] * images + ([{"type": "text", "text": prompt}] if prompt else [])
    messages = [{"role": "user", "content": content}]
    template = getattr(processor, "chat_template", None) or getattr(processor.tokenizer, "chat_template", None)
    if not template:
        raise CheckpointError(
            "the checkpoint has no chat template",
            "save the family's chat template next to the weights (chat_template.jinja)",
        )
    # rendered by the tokenizer: the processor's own apply_chat_template also prepares videos (SmolVLM's needs its
    # video processor), and the text is the same
    return processor.tokenizer.apply_chat_template(
        messages, chat_template=template, add_generation_prompt=True, tokenize=False
    )


def _as_arrays(output) -> dict[str, np.ndarray]:
    arrays = {}
    for name, value in dict(output).items():
        try:
            arrays[name] = np.asarray(value)
        except ValueError as err:  # ragged lists
            raise InputError(f"the processor's {name!r} is not an array ({err})", "use one prompt") from err
    return arrays


def _run(processor, images: list, prompt: str) -> dict[str, np.ndarray]:
    text = chat_prompt(processor, len(images), prompt)
    return _as_arrays(processor(text=[text], images=images, return_tensors="np"))


def _load_images(processor, image_paths: list[str | Path]) -> tuple[list, list[tuple[int, int]], list[str]]:
    image_processor = getattr(processor, "image_processor", processor)
    images, sizes, notes = [], [], []
    for path in image_paths:
        image, conversion = as_processor_sees(load_image(path), image_processor, path)
        images.append(image)
        sizes.append((image.height, image.width))
        if conversion:
            notes.append(f"{path}: {conversion}")
    return images, sizes, notes


def prepare_inputs(checkpoint: Checkpoint, images: list[str | Path]) -> ModelInputs:
    """The processor's image outputs (``pixel_values`` and whatever else the family's processor returns:
    ``image_grid_thw``, ``pixel_attention_mask``, ``image_sizes``, ...) as named arrays, batch of one prompt, and the
    image tokens each image takes in the prompt (counted in the processor's own expansion of that image alone)."""
    if not images:
        raise InputError("no images given", "list at least one image under 'images'")
    processor, source = load_processor(checkpoint)
    loaded, sizes, notes = _load_images(processor, images)
    token_id = image_token_id(checkpoint.config)
    counts = [int((_run(processor, [image], "")["input_ids"] == token_id).sum()) for image in loaded]
    outputs = _run(processor, loaded, DEFAULT_PROMPT)
    arrays = {name: array for name, array in outputs.items() if name not in TEXT_OUTPUTS + TRAINING_OUTPUTS}
    if "pixel_values" not in arrays:
        raise InputError(f"the {source} processor returned no pixel_values", "check the checkpoint's processor")
    arrays["pixel_values"] = arrays["pixel_values"].astype(np.float32)
    warnings = list(notes)
    if source.startswith("mlx-vlm"):
        warnings.append(f"inputs from {source}: transformers 5.24 cannot build this processor without torchvision")
    shapes = {name: list(array.shape) for name, array in arrays.items()}
    return ModelInputs(
        arrays=arrays,
        image_paths=[str(path) for path in images],
        image_sizes=sizes,
        image_tokens=np.asarray(counts, dtype=np.int64),
        facts={"processor": source, "arrays": shapes},
        headline=f"{len(images)} image(s) -> {sum(counts)} image tokens ({source})",
        warnings=warnings,
    )


def build_text_inputs(
    checkpoint: Checkpoint,
    inputs: ModelInputs,
    prompt: str = DEFAULT_PROMPT,
    max_new_tokens: int = 16,
    expect: list[str] | None = None,
) -> TextInputs:
    """The chat prompt (a user turn with the images, then ``prompt``; generation prompt added) through the
    checkpoint's processor: its token ids and per-token outputs. The processor's image outputs must be the ones
    ``inputs`` holds, and the prompt must hold each image's tokens."""
    processor, source = load_processor(checkpoint)
    images, _, _ = _load_images(processor, inputs.image_paths)
    outputs = _run(processor, images, prompt)
    for name, array in inputs.arrays.items():
        if name not in outputs or not np.array_equal(np.asarray(outputs[name], dtype=array.dtype), array):
            raise InputError(
                f"the {source} processor made different {name!r} for the prompt than for the inputs",
                "build the inputs and the prompt from the same checkpoint and images",
            )
    ids = np.asarray(outputs["input_ids"], dtype=np.int64).reshape(-1)
    token_id = image_token_id(checkpoint.config)
    found, expected = int((ids == token_id).sum()), int(inputs.image_tokens.sum())
    if found != expected:
        raise InputError(
            f"the prompt holds {found} image tokens (id {token_id}) where the images take {expected}",
            "use the checkpoint's own tokenizer and chat template, where the image token is one special token",
        )
    token_arrays = {
        name: np.asarray(outputs[name]).reshape(-1)
        for name in TEXT_OUTPUTS
        if name in outputs and name not in ("input_ids", "attention_mask")
    }
    return TextInputs(ids, token_id, prompt, int(max_new_tokens), list(expect or []), token_arrays=token_arrays)
