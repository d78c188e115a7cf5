"""Qwen2.5-VL's synthetic checkpoints: the tiny random-weight fixtures (config, seeded weights,
tokenizer, processor files; nothing downloaded) and whole checkpoints at a released model's shapes, written
tensor by tensor."""

from __future__ import annotations

import dataclasses
import json
import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from driftscope.model.synthetic import reinitialize

from ..qwen_shared.synthetic import config_arguments, save_tokenizer
from ..qwen_shared.tokenizer import build_tokenizer

# Random-weight Qwen2.5-VL checkpoints built from a config, saved with ``save_pretrained``.
#
# Used by the fixture script and the shared family tests (the tiny checkpoints) and the benchmarks
# (a real-size vision tower). Nothing is downloaded: the tokenizer is a byte-level BPE trained here on a
# fixed corpus, the image processor is transformers' PIL class.


@dataclass(frozen=True)
class SyntheticQwen25VLSpec:
    """Shape and seed of a random-weight Qwen2.5-VL checkpoint."""

    vision_depth: int = 8
    vision_hidden: int = 64
    vision_heads: int = 4
    vision_intermediate: int = 128
    fullatt_block_indexes: tuple[int, ...] = (3, 7)
    text_hidden: int = 64
    text_layers: int = 2
    text_heads: int = 4
    text_kv_heads: int = 2
    text_intermediate: int = 128
    mrope_section: tuple[int, ...] = (2, 3, 3)
    vocab_size: int = 512
    window_size: int = 112
    spatial_merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    seed: int = 0
    weight_gain: float = 1.0
    massive_channel: int | None = None  # plant a massive activation in this hidden channel of the vision tower
    massive_gain: float = 0.5  # patch-embedding weight of that channel: |x| ~ gain * |sum of a patch's pixels|
    tie_word_embeddings: bool = False  # lm_head shares embed_tokens (then not saved), as in the real 3B
    extra: dict = field(default_factory=dict)


def plant_massive_channel(model, channel: int, gain: float) -> None:
    """Make one hidden channel of the patch embedding huge (|x| of hundreds on ordinary images).

    Real ViTs carry such "massive activations"; squaring them in float16 (max 65504) overflows
    above |x| = 256, which is what a manual F16 RMSNorm does and a fused kernel avoids.
    """
    import torch

    with torch.no_grad():
        weight = model.model.visual.patch_embed.proj.weight
        weight[channel] = torch.full_like(weight[channel], gain)


def build_config(spec: SyntheticQwen25VLSpec, tokenizer):
    """The transformers config of ``spec``, with the special token ids of ``tokenizer``."""
    from transformers import Qwen2_5_VLConfig

    text = {"rope_parameters": {"rope_type": "default", "mrope_section": list(spec.mrope_section), "rope_theta": 1e6}}
    vision = {
        "fullatt_block_indexes": list(spec.fullatt_block_indexes),
        "window_size": spec.window_size,
        "patch_size": 14,
    }
    return Qwen2_5_VLConfig(**config_arguments(spec, tokenizer.convert_tokens_to_ids, text, vision))


def save_side_files(out_dir: Path, spec: SyntheticQwen25VLSpec, tokenizer) -> None:
    """Image processor, tokenizer with the chat template, and the spec that made the checkpoint."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    image_processor = Qwen2VLImageProcessorPil(
        min_pixels=spec.min_pixels, max_pixels=spec.max_pixels, merge_size=spec.spatial_merge_size
    )
    # The combined Qwen2_5_VLProcessor also wants a video processor, which needs torchvision; the
    # image processor and tokenizer are saved side by side instead, as a real checkpoint has them.
    image_processor.save_pretrained(out_dir)
    save_tokenizer(out_dir, tokenizer, spec)


def make_checkpoint(out_dir: Path, spec: SyntheticQwen25VLSpec = SyntheticQwen25VLSpec()) -> Path:
    """Write a random-weight Qwen2.5-VL checkpoint (safetensors, tokenizer, processor) to ``out_dir``."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(spec.vocab_size)
    config = build_config(spec, tokenizer)
    torch.manual_seed(spec.seed)
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    reinitialize(model, spec.seed, spec.weight_gain)
    if spec.massive_channel is not None:
        plant_massive_channel(model, spec.massive_channel, spec.massive_gain)
    model.save_pretrained(out_dir, safe_serialization=True)
    save_side_files(out_dir, spec, tokenizer)
    return out_dir


#: The vision tower of Qwen2.5-VL-3B (depth 32, hidden 1280, 16 heads, MLP 3420, merger to 2048, full
#: attention at 7, 15, 23, 31) with a one-layer text side of the same width, for benchmarks.
QWEN25_VL_3B_SHAPED = SyntheticQwen25VLSpec(
    vision_depth=32,
    vision_hidden=1280,
    vision_heads=16,
    vision_intermediate=3420,
    fullatt_block_indexes=(7, 15, 23, 31),
    text_hidden=2048,
    text_layers=1,
    text_heads=16,
    text_kv_heads=2,
    text_intermediate=256,
    mrope_section=(16, 24, 24),
    vocab_size=512,
)


#: The tiny fixture (depth 8, full attention at 3 and 7, hidden 64) and its massive-activation twin.
TINY_SPEC = SyntheticQwen25VLSpec()
MASSIVE_CHANNEL = 17
MASSIVE_SPEC = SyntheticQwen25VLSpec(massive_channel=MASSIVE_CHANNEL)


#: A wide variant (hidden 1024, MLP 2048, depth 2): its linear layers have 1024 and 2048 inputs, wide enough for
#: MLX's fused quantized matmul, which sums in the activation dtype, to dominate the float16 error from the first
#: linear layer on (``fixtures/make_tiny_qwen25vl_wide.py`` saves it as a 4-bit MLX-community checkpoint).
WIDE_SPEC = SyntheticQwen25VLSpec(
    vision_depth=2,
    vision_hidden=1024,
    vision_heads=16,
    vision_intermediate=2048,
    fullatt_block_indexes=(1,),
    seed=4,
)


# A whole random-weight Qwen2.5-VL checkpoint (vision and language) written tensor by tensor.
#
# The model is never built in memory: its tensor names and shapes come from a model on torch's ``meta``
# device, each tensor gets its own seeded values and shards are written one at a time as Hugging Face ships
# them (``model-0000N-of-0000M.safetensors`` and ``model.safetensors.index.json``, legacy ``visual.*`` /
# ``model.*`` keys, no ``lm_head`` when the embeddings are tied). Peak memory is one shard, so the ~15 GB
# float32 3B-shaped checkpoint can be written on a 24 GiB machine; a bfloat16 copy is written shard by shard
# from the float32 one.

#: Qwen2.5-VL-3B's real dimensions: vision depth 32 (hidden 1280, 16 heads, MLP 3420, full attention at
#: 7/15/23/31), 36 text layers (hidden 2048, 16 heads / 2 KV heads, MLP 11008), vocabulary 151936, tied
#: embeddings. About 3.75 B parameters: 15 GB in float32.
QWEN25_VL_3B_WHOLE = dataclasses.replace(  # the tower benchmark's 3B-shaped vision tower, with the real text side
    QWEN25_VL_3B_SHAPED, text_layers=36, text_intermediate=11008, vocab_size=151936, tie_word_embeddings=True
)
#: Qwen2.5-VL-7B's shape: the 3B's tower, 28 text layers at hidden 3584 (28 heads / 4 KV heads, head 128), MLP
#: 18944, vocabulary 152064, an untied head
QWEN25_VL_7B_WHOLE = dataclasses.replace(
    QWEN25_VL_3B_WHOLE,
    text_hidden=3584,
    text_layers=28,
    text_heads=28,
    text_kv_heads=4,
    text_intermediate=18944,
    vocab_size=152064,
    tie_word_embeddings=False,
)
#: Legacy checkpoint keys (as the hub's Qwen2.5-VL checkpoints and transformers' save_pretrained write them).
KEY_PREFIXES = (("model.visual.", "visual."), ("model.language_model.", "model."))


def scaled_spec(spec: SyntheticQwen25VLSpec, divisor: int = 1, **overrides) -> SyntheticQwen25VLSpec:
    """``spec`` with every width divided by ``divisor`` (depths, heads, vocabulary kept), then ``overrides``;
    the M-RoPE sections are rescaled to the new head size. Raises ValueError for a shape RoPE cannot take."""
    if divisor < 1:
        raise ValueError(f"the width divisor must be >= 1, got {divisor}")
    widths = ("vision_hidden", "vision_intermediate", "text_hidden", "text_intermediate")
    out = dataclasses.replace(spec, **{name: getattr(spec, name) // divisor for name in widths})
    out = dataclasses.replace(out, **overrides)
    vision_head, text_head = out.vision_hidden / out.vision_heads, out.text_hidden / out.text_heads
    if vision_head % 4 or text_head % 2:
        raise ValueError(
            f"head sizes {vision_head:g} (vision) and {text_head:g} (text) must be multiples of 4 and 2: "
            "pick a divisor or head counts that keep them so"
        )
    if "mrope_section" not in overrides:
        half, total = int(text_head) // 2, sum(spec.mrope_section)
        sections = [max(1, s * half // total) for s in spec.mrope_section[:-1]]
        out = dataclasses.replace(out, mrope_section=(*sections, half - sum(sections)))
    return out


def parameter_shapes(spec: SyntheticQwen25VLSpec, config) -> dict[str, tuple[int, ...]]:
    """Checkpoint key -> shape of every saved tensor, from a model on the ``meta`` device (no memory)."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration(config)
    shapes = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and spec.tie_word_embeddings:
            continue
        for new, old in KEY_PREFIXES:
            if name.startswith(new):
                name = old + name[len(new) :]
                break
        shapes[name] = tuple(tensor.shape)
    return dict(sorted(shapes.items()))


def seeded_tensor(name: str, shape: tuple[int, ...], seed: int, gain: float):
    """The values of one tensor, from its own generator (independent of every other tensor): N(0, gain /
    sqrt(fan_in)) for matrices, 1 + N(0, 0.1) for norm scales, N(0, 0.02) for biases."""
    import torch

    generator = torch.Generator().manual_seed(zlib.crc32(name.encode()) ^ seed)
    values = torch.randn(shape, generator=generator)
    if name.endswith("bias"):
        return values.mul_(0.02)
    if len(shape) == 1:
        return values.mul_(0.1).add_(1.0)
    return values.mul_(gain / math.sqrt(math.prod(shape[1:])))


def plan_shards(shapes: dict[str, tuple[int, ...]], shard_bytes: int, itemsize: int = 4) -> list[list[str]]:
    """Tensor names grouped into shards of at most ``shard_bytes`` (a larger tensor gets a shard of its own)."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        nbytes = math.prod(shape) * itemsize
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def _write_index(out_dir: Path, names: list[list[str]], total_bytes: int) -> None:
    count = len(names)
    weight_map = {
        name: f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i, shard in enumerate(names) for name in shard
    }
    index = {"metadata": {"total_size": total_bytes}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def write_whole_checkpoint(
    out_dir: Path,
    spec: SyntheticQwen25VLSpec,
    shard_bytes: int = 2 << 30,
    bf16_dir: Path | None = None,
    dtype: str = "float32",
) -> Path:
    """Write ``spec`` as a sharded checkpoint in ``dtype`` (float32 or bfloat16, as Qwen2.5-VL's releases ship) in
    ``out_dir`` (and, with ``bf16_dir``, a bfloat16 copy there); one shard in memory at a time. The index is
    written last: a directory without it is unfinished."""
    import torch
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    tokenizer = build_tokenizer(min(spec.vocab_size, 4096))
    config = build_config(spec, tokenizer)
    shapes = parameter_shapes(spec, config)
    shards = plan_shards(shapes, shard_bytes)
    targets = [(out_dir, getattr(torch, dtype))] + ([(Path(bf16_dir), torch.bfloat16)] if bf16_dir else [])
    for folder, dtype in targets:
        folder.mkdir(parents=True, exist_ok=True)
        config.dtype = str(dtype).removeprefix("torch.")
        config.save_pretrained(folder)
        save_side_files(folder, spec, tokenizer)
    for i, names in enumerate(shards):
        tensors = {name: seeded_tensor(name, shapes[name], spec.seed, spec.weight_gain) for name in names}
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        for folder, dtype in targets:
            cast = tensors if dtype == torch.float32 else {k: v.to(dtype) for k, v in tensors.items()}
            save_file(cast, str(folder / file), metadata={"format": "pt"})
            del cast
        del tensors
    for folder, dtype in targets:
        itemsize = torch.empty((), dtype=dtype).element_size()
        _write_index(folder, shards, sum(math.prod(s) for s in shapes.values()) * itemsize)
    return out_dir
