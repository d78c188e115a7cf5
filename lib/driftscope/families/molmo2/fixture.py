"""Random-weight Molmo2 checkpoints in the hub layout and in transformers' native layout.

The hub layout is what allenai publishes: ``vit_config`` declares 27 ViT layers, ``adapter_config``
reads ``vit_layers: [-3, -9]``, and the weights hold only the 25-layer prefix those layers need. The
native layout is what transformers 5.24 ``save_pretrained`` writes: the config in the new layout
(``vision_config`` with 25 layers, ``vision_feature_layer: [24, 18]``), the weights in the original
one. Both share one safetensors file. transformers 5.24 saves the word embedding split in two equal
halves (320 + 320 rows in the tiny config) instead of ``vocab_size`` + ``additional_vocab_size``; the
file is re-split at ``vocab_size`` here. Nothing is downloaded; building twice gives identical bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

#: Molmo2's image and video tokens, in the order of their ids after the base vocabulary (as on the hub).
IMAGE_TOKENS = (
    "<im_start>",
    "<im_end>",
    "<im_patch>",
    "<im_col>",
    "<low_res_im_start>",
    "<|image|>",
    "<im_low>",
    "<frame_start>",
    "<frame_end>",
    "<|video|>",
)
BASE_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

CORPUS = [
    "a red square, a blue circle and a green triangle on a light grey background.",
    "The image shows a red square and a blue circle. There is also a green triangle.",
    "Describe the image. What shapes do you see? Which colours are they? Point to the circle.",
    "square circle triangle red blue green orange black white checkerboard shapes colours count",
    "user assistant system You are a helpful assistant.",
]

#: The hub chat template's shape: images first, then alternating user/assistant turns.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['content'] is not string %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}<|image|>{% endif %}{% endfor %}{% endif %}{% endfor %}"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class SyntheticMolmo2Spec:
    """Shape and seed of a random-weight Molmo2 checkpoint (narrow, but with the hub's depth facts)."""

    vit_hidden: int = 32
    vit_heads: int = 2
    vit_head_dim: int = 16
    vit_intermediate: int = 64
    vit_declared_depth: int = 27
    vit_layers: tuple[int, ...] = (-3, -9)
    adapter_heads: int = 2
    adapter_head_dim: int = 16
    adapter_intermediate: int = 96
    text_hidden: int = 64
    text_layers: int = 2
    text_heads: int = 4
    text_kv_heads: int = 2
    text_head_dim: int = 16
    text_intermediate: int = 128
    vocab_size: int = 512
    additional_vocab_size: int = 128
    rope_theta: float = 5e6
    seed: int = 0
    weight_gain: float = 1.0
    adapter_gain: float = 0.5  # extra scale of the pooler's and projector's matrices: keeps projected features O(1)


def token_ids(spec: SyntheticMolmo2Spec) -> dict[str, int]:
    """Image/video token ids: the first rows of the additional vocabulary, as on the hub."""
    return {token: spec.vocab_size + offset for offset, token in enumerate(IMAGE_TOKENS)}


def build_tokenizer(spec: SyntheticMolmo2Spec):
    """A byte-level BPE tokenizer of exactly ``vocab_size`` base ids, then Molmo2's image tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(BASE_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS * 4, trainer=trainer)
    fillers = [f"<|reserved_{i}|>" for i in range(spec.vocab_size - tokenizer.get_vocab_size())]
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in fillers])
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in IMAGE_TOKENS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    ids = fast.convert_tokens_to_ids(list(IMAGE_TOKENS))
    if ids != list(token_ids(spec).values()):
        raise RuntimeError(f"image tokens got ids {ids}, expected them from {spec.vocab_size} on")
    return fast


def hub_config(spec: SyntheticMolmo2Spec) -> dict:
    """config.json in the hub layout (``vit_config`` / ``adapter_config``, the original key names)."""
    ids = token_ids(spec)
    return {
        "architectures": ["Molmo2ForConditionalGeneration"],
        "model_type": "molmo2",
        "vit_config": {
            "model_type": "molmo2",
            "hidden_size": spec.vit_hidden,
            "intermediate_size": spec.vit_intermediate,
            "num_hidden_layers": spec.vit_declared_depth,
            "num_attention_heads": spec.vit_heads,
            "num_key_value_heads": spec.vit_heads,
            "head_dim": spec.vit_head_dim,
            "hidden_act": "gelu_pytorch_tanh",
            "layer_norm_eps": 1e-6,
            "image_default_input_size": [378, 378],
            "image_num_pos": 729,
            "image_patch_size": 14,
        },
        "adapter_config": {
            "model_type": "molmo2",
            "hidden_size": spec.vit_hidden,
            "intermediate_size": spec.adapter_intermediate,
            "text_hidden_size": spec.text_hidden,
            "num_attention_heads": spec.adapter_heads,
            "num_key_value_heads": spec.adapter_heads,
            "head_dim": spec.adapter_head_dim,
            "hidden_act": "silu",
            "vit_layers": list(spec.vit_layers),
            "pooling_attention_mask": True,
        },
        "text_config": {
            "model_type": "molmo2_text",
            "hidden_size": spec.text_hidden,
            "intermediate_size": spec.text_intermediate,
            "num_hidden_layers": spec.text_layers,
            "num_attention_heads": spec.text_heads,
            "num_key_value_heads": spec.text_kv_heads,
            "head_dim": spec.text_head_dim,
            "vocab_size": spec.vocab_size,
            "additional_vocab_size": spec.additional_vocab_size,
            "hidden_act": "silu",
            "layer_norm_eps": 1e-6,
            "max_position_embeddings": 4096,
            "qk_norm_type": "qwen3",
            "use_qk_norm": True,
            "qkv_bias": False,
            "norm_after": False,
            "rope_theta": spec.rope_theta,
            "rope_scaling": None,
        },
        "image_start_token_id": ids["<im_start>"],
        "image_end_token_id": ids["<im_end>"],
        "image_patch_id": ids["<im_patch>"],
        "image_col_id": ids["<im_col>"],
        "low_res_image_start_token_id": ids["<low_res_im_start>"],
        "image_low_res_id": ids["<im_low>"],
        "frame_start_token_id": ids["<frame_start>"],
        "frame_end_token_id": ids["<frame_end>"],
        "use_frame_special_tokens": False,
        "tie_word_embeddings": False,
    }


PREPROCESSOR_CONFIG = {
    "image_processor_type": "Molmo2ImageProcessor",
    "processor_class": "Molmo2Processor",
    "do_convert_rgb": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "max_crops": 8,
    "overlap_margins": [4, 4],
    "patch_size": 14,
    "pooling_size": [2, 2],
    "resample": 2,
    "size": {"height": 378, "width": 378},
}


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _resplit_embedding(path: Path, vocab_size: int) -> None:
    """Rewrite the word embedding as ``vocab_size`` base rows + the additional rows (transformers 5.24 halves it)."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    base, extra = "model.transformer.wte.embedding", "model.transformer.wte.new_embedding"
    table = torch.cat([tensors[base], tensors[extra]], dim=0)
    tensors[base], tensors[extra] = table[:vocab_size].contiguous(), table[vocab_size:].contiguous()
    save_file(tensors, str(path), metadata={"format": "pt"})


def _save_side_files(out_dir: Path, tokenizer) -> None:
    _write_json(out_dir / "preprocessor_config.json", PREPROCESSOR_CONFIG)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out_dir)


def make_checkpoints(
    hub_dir: Path, native_dir: Path, spec: SyntheticMolmo2Spec = SyntheticMolmo2Spec()
) -> tuple[Path, Path]:
    """Write the hub-layout and the native-layout checkpoint of one random model."""
    import shutil

    import torch
    from transformers import Molmo2Config, Molmo2ForConditionalGeneration

    from driftscope.model.synthetic import reinitialize

    hub_dir, native_dir = Path(hub_dir), Path(native_dir)
    for folder in (hub_dir, native_dir):
        folder.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(spec)
    config = hub_config(spec)
    torch.manual_seed(spec.seed)
    model = Molmo2ForConditionalGeneration(Molmo2Config(**json.loads(json.dumps(config)))).eval()
    reinitialize(model, spec.seed, spec.weight_gain)
    with torch.no_grad():
        for param in model.model.multi_modal_projector.parameters():
            if param.ndim == 2:
                param.mul_(spec.adapter_gain)
    model.save_pretrained(native_dir, safe_serialization=True)
    _resplit_embedding(native_dir / "model.safetensors", spec.vocab_size)
    shutil.copyfile(native_dir / "model.safetensors", hub_dir / "model.safetensors")
    shutil.copyfile(native_dir / "generation_config.json", hub_dir / "generation_config.json")
    _write_json(hub_dir / "config.json", config)
    for folder in (hub_dir, native_dir):
        _save_side_files(folder, tokenizer)
        _write_json(folder / "driftscope_fixture.json", {"spec": repr(spec)})
    return hub_dir, native_dir
