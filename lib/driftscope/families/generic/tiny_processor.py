"""The processor saved with each tiny checkpoint: the family's image processor (its PIL class, no torchvision) set to
make the images the tester's tower takes, and the family's processor (prompt expansion) agreeing with the config.

Images stay small (a few tiles, tens of image tokens) but go through the family's real resizing, tiling and
splitting. Two families have no processor transformers 5.24 can build without torchvision (Mistral 3's
``PixtralProcessor``, LFM2-VL's image processor): their files are written for mlx-vlm's own processor of the model
type to read, as the hub's checkpoints carry them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class ProcessorSpec:
    """What is saved for one model type's processor."""

    #: transformers' image processor class (PIL backend)
    image_processor: str
    image_kwargs: dict = field(default_factory=dict)
    #: the processor class's settings
    kwargs: dict = field(default_factory=dict)
    #: the processor class transformers 5.24 cannot build without torchvision: its files are written for mlx-vlm's
    transformers_processor: bool = True


#: Qwen-style resize bounds: 112 x 112 pixels at most (8 x 8 patches of 14, 16 merged tokens), 56 x 56 at least
QWEN_PIXELS = {"size": {"shortest_edge": 56 * 56, "longest_edge": 112 * 112}}
#: InternVL / Aya Vision tiling: the tester's 64-px tower, at most 4 tiles and a thumbnail
GOT_OCR2_TILES = {"size": {"height": 64, "width": 64}, "crop_to_patches": True, "min_patches": 1, "max_patches": 4}
#: Idefics3 / SmolVLM splitting: 16-px tiles (the tester's image_size) of images resized to 32 px: 4 tiles + global
IDEFICS3_TILES = {"size": {"longest_edge": 32}, "max_image_size": {"longest_edge": 16}, "do_image_splitting": True}

PROCESSORS: dict[str, ProcessorSpec] = {
    "qwen2_vl": ProcessorSpec("Qwen2VLImageProcessorPil", {**QWEN_PIXELS, "merge_size": 2}),
    # (16 / 4)^2 patches per tile, pixel-shuffled by scale_factor 2: 4 tokens per tile
    "smolvlm": ProcessorSpec("SmolVLMImageProcessorPil", IDEFICS3_TILES, {"image_seq_len": 4}),
    "idefics3": ProcessorSpec("Idefics3ImageProcessorPil", IDEFICS3_TILES, {"image_seq_len": 4}),
    # one 12-px patch per image, resampled to resampler_n_latents 2 tokens
    "idefics2": ProcessorSpec(
        "Idefics2ImageProcessorPil", {"size": {"shortest_edge": 12, "longest_edge": 12}}, {"image_seq_len": 2}
    ),
    # CLIP's class token is one more position; the "default" strategy drops it again
    "llava": ProcessorSpec(
        "LlavaImageProcessorPil",
        {"size": {"shortest_edge": 8}, "crop_size": {"height": 8, "width": 8}},
        {"patch_size": 2, "vision_feature_select_strategy": "default", "num_additional_image_tokens": 1},
    ),
    "llava_next": ProcessorSpec(
        "LlavaNextImageProcessorPil",
        {"size": {"shortest_edge": 16}, "crop_size": {"height": 16, "width": 16}, "image_grid_pinpoints": [[32, 32]]},
        {"patch_size": 2, "vision_feature_select_strategy": "default", "num_additional_image_tokens": 1},
    ),
    "llava_onevision": ProcessorSpec(
        "LlavaOnevisionImageProcessorPil",
        {"size": {"height": 16, "width": 16}, "image_grid_pinpoints": [[16, 16]]},
        {"num_image_tokens": 4, "vision_feature_select_strategy": "full"},
    ),
    # SigLIP at 30 px, patch 2: (30 // 2)^2 = 225 image tokens, which PaliGemma's processor reads from here
    "paligemma": ProcessorSpec(
        "SiglipImageProcessorPil", {"size": {"height": 30, "width": 30}, "image_seq_length": 225}
    ),
    # (20 // 5)^2 patches average-pooled to int(sqrt(mm_tokens_per_image 2))^2 = 1 token per image
    "gemma3": ProcessorSpec("Gemma3ImageProcessorPil", {"size": {"height": 20, "width": 20}}, {"image_seq_length": 1}),
    # patch 6 merged 2 x 2: 12-px cells, images resized to 24 px at most (the tower's image_size is 30)
    "mistral3": ProcessorSpec(
        "PixtralImageProcessorPil",
        {"size": {"longest_edge": 24}, "patch_size": {"height": 12, "width": 12}},
        {"patch_size": 6, "spatial_merge_size": 2},
        transformers_processor=False,
    ),
    "internvl": ProcessorSpec("GotOcr2ImageProcessorPil", GOT_OCR2_TILES, {"image_seq_length": 64}),
    # 64-px tiles in 8-px patches, pixel-shuffled by 2: (64 // 16)^2 = 16 tokens per tile
    "aya_vision": ProcessorSpec(
        "GotOcr2ImageProcessorPil", GOT_OCR2_TILES, {"patch_size": 8, "img_size": 64, "downsample_factor": 2}
    ),
    # 32-px tiles in 4-px patches, downsampled by 4: 4 tokens per tile, at most 16 per image
    "lfm2_vl": ProcessorSpec(
        "Lfm2VlImageProcessor",
        {
            "encoder_patch_size": 4,
            "downsample_factor": 4,
            "tile_size": 32,
            "min_image_tokens": 4,
            "max_image_tokens": 16,
            "do_image_splitting": True,
            "min_tiles": 2,
            "max_tiles": 4,
            "use_thumbnail": True,
        },
        transformers_processor=False,
    ),
    "glm4v": ProcessorSpec("Glm4vImageProcessorPil", {**QWEN_PIXELS, "merge_size": 1}),
    # 16-px patches, not merged; at most 64 x 64 pixels (the tester's image_size)
    "hunyuan_vl": ProcessorSpec(
        "HunYuanVLImageProcessorPil", {"size": {"shortest_edge": 32 * 32, "longest_edge": 64 * 64}, "merge_size": 1}
    ),
}


def save_processor(model_type: str, directory: Path, tokenizer, chat_template: str) -> None:
    """Save ``model_type``'s processor (image processor, tokenizer, chat template) in ``directory``."""
    from transformers.models.auto.image_processing_auto import get_image_processor_class_from_name
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    from .processor import no_video, processor_class

    spec = PROCESSORS[model_type]
    tokenizer.chat_template = chat_template
    processor_name = PROCESSOR_MAPPING_NAMES[model_type]
    if not spec.transformers_processor:
        tokenizer.save_pretrained(directory)
        image = {"image_processor_type": spec.image_processor, "processor_class": processor_name, **spec.image_kwargs}
        _write_json(directory / "preprocessor_config.json", image)
        _write_json(directory / "processor_config.json", {"processor_class": processor_name, **spec.kwargs})
        return
    image_processor = get_image_processor_class_from_name(spec.image_processor)(**spec.image_kwargs)
    found = processor_class(model_type)
    processor = found(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=chat_template,
        **no_video(found),
        **spec.kwargs,
    )
    processor.save_pretrained(directory)


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
