"""Molmo2's inputs: images -> crops, patches and pooling indices (the processor's arrays, written from
mlx-vlm's and transformers' processors), and the prompt around them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import numpy as np

from driftscope.inputs.processor_output import ModelInputs, as_processor_sees, load_image
from driftscope.inputs.text_inputs import DEFAULT_PROMPT, TextInputs, prompt_tokenizer

from ...errors import InputError
from ..qwen_shared.tokenizer import QWEN2_TOKENIZERS
from .geometry import CropLayout, CropSpec, crop_layout

if TYPE_CHECKING:
    from driftscope.model.checkpoint import Checkpoint


# Image -> Molmo2 inputs: crop pixels as 588-wide patch rows, pooling indices, the prompt's token ids.
#
# Pixels follow mlx-vlm's numpy processor (transformers' own Molmo2 image processor needs torchvision):
# 8-bit RGB resized with PIL (bilinear by default), scaled to [0, 1], normalized with the checkpoint's
# mean/std, crops patchified row-major with channels last. The prompt expands each ``<|image|>`` into
# the low-resolution then the high-resolution token grid (``<im_col>`` after every row), and
# ``mm_token_type_ids`` marks every image token 1, as transformers' processor does.

IMAGE_PLACEHOLDER = "<|image|>"
#: Tokens transformers' Molmo2Processor gives type 1 (they attend to each other bidirectionally).
IMAGE_TOKEN_NAMES = (
    "<im_patch>",
    "<im_col>",
    "<im_start>",
    "<low_res_im_start>",
    "<frame_start>",
    "<im_end>",
    "<frame_end>",
    "<im_low>",
)


@dataclass
class Molmo2Inputs:
    """One image and prompt, as every runtime receives them."""

    pixel_values: np.ndarray  # [crops, 729, 588] float32
    pooling: np.ndarray  # [tokens, 4] int64, -1 for padding
    grids: np.ndarray  # [images, 4] int32: low-res rows, cols, high-res rows, cols
    num_crops: np.ndarray  # [images] int64
    layouts: list[CropLayout]
    input_ids: np.ndarray | None = None  # [seq] int64
    mm_token_type_ids: np.ndarray | None = None  # [seq] int64

    def transformers_kwargs(self) -> dict:
        """Keyword arguments of ``Molmo2ForConditionalGeneration`` (torch tensors, batch of one)."""
        import torch

        out = {
            "pixel_values": torch.from_numpy(self.pixel_values),
            "image_token_pooling": torch.from_numpy(self.pooling),
            "image_grids": torch.from_numpy(self.grids),
            "image_num_crops": torch.from_numpy(self.num_crops),
        }
        if self.input_ids is not None:
            out["input_ids"] = torch.from_numpy(self.input_ids)[None]
            out["mm_token_type_ids"] = torch.from_numpy(self.mm_token_type_ids)[None]
        return out


def resize_rgb(image: np.ndarray, size: tuple[int, int], resample: int) -> np.ndarray:
    """8-bit RGB [H, W, 3] resized to ``size`` (height, width) with PIL, as float32 in [0, 1]."""
    from PIL import Image

    resized = Image.fromarray(image).resize((size[1], size[0]), resample=resample)
    return np.asarray(resized, dtype=np.float32) / 255.0


def patchify(crops: np.ndarray, patch: int) -> np.ndarray:
    """[crops, H, W, C] -> [crops, (H/p)*(W/p), p*p*C]: patches row-major, each patch row, col, channel."""
    n, h, w, c = crops.shape
    blocks = crops.reshape(n, h // patch, patch, w // patch, patch, c).transpose(0, 1, 3, 2, 4, 5)
    return blocks.reshape(n, (h // patch) * (w // patch), patch * patch * c)


def image_crops(image: np.ndarray, spec: CropSpec = CropSpec()) -> tuple[np.ndarray, CropLayout]:
    """[crops, 729, 588] pixel rows of one 8-bit RGB image (low-resolution crop first) and its layout."""
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise InputError(
            f"expected an 8-bit RGB image [H, W, 3], got {image.dtype} {list(image.shape)}",
            "convert the image with PIL's .convert('RGB') before processing",
        )
    layout = crop_layout(image.shape[0], image.shape[1], spec)
    mean, std = np.array(spec.image_mean, np.float32), np.array(spec.image_std, np.float32)
    size, step = spec.crop_size, spec.window_patches * spec.patch_size
    low = (resize_rgb(image, (size, size), spec.resample) - mean) / std
    canvas = (resize_rgb(image, layout.resized, spec.resample) - mean) / std
    rows, cols = layout.tiling
    high = [canvas[r * step : r * step + size, c * step : c * step + size] for r in range(rows) for c in range(cols)]
    return patchify(np.stack([low, *high]), spec.patch_size), layout


def image_token_string(grid: tuple[int, int, int, int], col_tokens: bool = True) -> str:
    """The tokens one image becomes in the prompt: the low-resolution grid, then the high-resolution one."""
    low_rows, low_cols, high_rows, high_cols = grid
    col = "<im_col>" if col_tokens else ""
    low = "<low_res_im_start>" + ("<im_patch>" * low_cols + col) * low_rows + "<im_end>"
    return low + "<im_start>" + ("<im_patch>" * high_cols + col) * high_rows + "<im_end>"


def image_token_ids(tokenizer) -> list[int]:
    return [int(i) for i in tokenizer.convert_tokens_to_ids(list(IMAGE_TOKEN_NAMES))]


def prepare(images: list[np.ndarray], text: str | None, tokenizer=None, spec: CropSpec = CropSpec()) -> Molmo2Inputs:
    """Crops of every image and, with ``text``, its token ids with each ``<|image|>`` expanded."""
    crops, layouts = zip(*(image_crops(image, spec) for image in images), strict=True)
    inputs = Molmo2Inputs(
        pixel_values=np.concatenate(crops).astype(np.float32),
        pooling=np.concatenate(_offset_poolings(layouts, spec)).astype(np.int64),
        grids=np.array([layout.grid for layout in layouts], dtype=np.int32),
        num_crops=np.array([layout.crops for layout in layouts], dtype=np.int64),
        layouts=list(layouts),
    )
    if text is None:
        return inputs
    if tokenizer is None:
        raise InputError(
            "a prompt needs the checkpoint's tokenizer", "pass tokenizer=AutoTokenizer.from_pretrained(path)"
        )
    if text.count(IMAGE_PLACEHOLDER) != len(images):
        raise InputError(
            f"the prompt has {text.count(IMAGE_PLACEHOLDER)} {IMAGE_PLACEHOLDER} placeholders for {len(images)} images",
            f"put one {IMAGE_PLACEHOLDER} in the prompt per image",
        )
    for layout in layouts:
        text = text.replace(IMAGE_PLACEHOLDER, image_token_string(layout.grid), 1)
    ids = np.array(tokenizer(text)["input_ids"], dtype=np.int64)
    inputs.input_ids = ids
    inputs.mm_token_type_ids = np.isin(ids, image_token_ids(tokenizer)).astype(np.int64)
    return inputs


def _offset_poolings(layouts, spec: CropSpec) -> list[np.ndarray]:
    """Each image's pooling indices, offset by the patches of the images before it (one flat patch list)."""
    out, offset = [], 0
    for layout in layouts:
        out.append(np.where(layout.pooling >= 0, layout.pooling + offset, -1))
        offset += layout.crops * spec.patches_per_crop
    return out


def prepare_inputs(checkpoint: Checkpoint, image_paths: list[str | Path]) -> ModelInputs:
    """The crops and pooling indices of the images, with the checkpoint's processor settings.

    The arrays, in digest order: ``pixel_values`` [crops, 729, 588] float32, ``pooling`` [tokens, 4] int64
    (-1 for padding; each image's indices offset by the crops before it), ``grids`` [images, 4] int64 (low-
    and high-resolution token rows and columns) and ``num_crops`` [images] int64."""
    if not image_paths:
        raise InputError("no images given", "list at least one image under 'images'")
    spec = CropSpec.from_checkpoint(checkpoint.path)
    settings = SimpleNamespace(do_convert_rgb=True)  # Molmo2's processor converts every image to RGB
    images, sizes, conversions = [], [], []
    for path in image_paths:
        image, conversion = as_processor_sees(load_image(path), settings, path)
        images.append(np.asarray(image, dtype=np.uint8))
        sizes.append((image.height, image.width))
        conversions.append(conversion)
    out = prepare(images, None, spec=spec)
    tokens = np.array([layout.tokens for layout in out.layouts], dtype=np.int64)
    return ModelInputs(
        arrays={
            "pixel_values": out.pixel_values,
            "pooling": out.pooling.astype(np.int64),
            "grids": out.grids.astype(np.int64),
            "num_crops": out.num_crops.astype(np.int64),
        },
        image_paths=[str(p) for p in image_paths],
        image_sizes=sizes,
        image_tokens=tokens,
        facts={
            "resized": [list(layout.resized) for layout in out.layouts],  # the high-resolution canvas
            "tiling": [list(layout.tiling) for layout in out.layouts],
            "crops": out.num_crops.tolist(),
            "grids": [[grid[:2], grid[2:]] for grid in out.grids.tolist()],  # low-res rows x cols, high-res
            "padded_tokens": [int((layout.valid_counts < 4).sum()) for layout in out.layouts],
            "processor": {
                "crop_size": spec.crop_size,
                "patch_size": spec.patch_size,
                "overlap_margins": list(spec.margins),
                "max_crops": spec.max_crops,
                "pooling_size": list(spec.pooling),
            },
            "conversions": conversions,
        },
        headline=f"{int(out.num_crops.sum())} crops, {int(tokens.sum())} pooled tokens "
        f"(tiling {[list(layout.tiling) for layout in out.layouts]})",
    )


# Molmo2's prompt side: each image's token grid, then the user turn, as transformers' processor builds it.


def build_text_inputs(
    checkpoint,
    inputs: ModelInputs,
    prompt: str = DEFAULT_PROMPT,
    max_new_tokens: int = 16,
    expect: list[str] | None = None,
) -> TextInputs:
    """BOS, every image's low- then high-resolution grid (``<im_col>`` after each row), then the user turn.

    Token types mark every image token (patches, row ends, starts and ends) as transformers' processor does:
    they attend to each other both ways in the prefill."""
    tokenizer = prompt_tokenizer(checkpoint.path, QWEN2_TOKENIZERS)
    bos = tokenizer.bos_token or tokenizer.eos_token or ""
    grids = np.asarray(inputs["grids"]).reshape(-1, 4)
    images = "".join(image_token_string(tuple(int(v) for v in grid)) for grid in grids)
    text = f"{bos}{images}<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    ids = np.asarray(tokenizer(text)["input_ids"], dtype=np.int64)
    patch_id = int(checkpoint.config.get("image_patch_id", tokenizer.convert_tokens_to_ids("<im_patch>")))
    found, expected = int((ids == patch_id).sum()), int(np.asarray(inputs.image_tokens).sum())
    if found != expected:
        raise InputError(
            f"the tokenizer turned {expected} image patches into {found} <im_patch> tokens",
            "use the checkpoint's own tokenizer, where <im_patch> is one special token",
        )
    types = np.isin(ids, image_token_ids(tokenizer)).astype(np.int64)
    return TextInputs(ids, patch_id, prompt, int(max_new_tokens), list(expect or []), token_types=types)
