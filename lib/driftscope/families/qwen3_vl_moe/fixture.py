"""Random-weight Qwen3-VL-MoE checkpoints: Qwen3-VL's tiny tower and tokenizer with a sparse decoder (every
layer a mixture of experts), saved with ``save_pretrained``. Nothing is downloaded; building twice gives
identical bytes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from driftscope.model.synthetic import reinitialize

from ..qwen3_vl.fixture import SyntheticQwen3VLSpec, build_config, image_processor
from ..qwen_shared.synthetic import save_tokenizer
from ..qwen_shared.tokenizer import build_tokenizer


@dataclass(frozen=True)
class SyntheticQwen3VLMoeSpec:
    """A Qwen3-VL spec (tower, text widths, seed) and the experts of its sparse layers."""

    base: SyntheticQwen3VLSpec = field(default_factory=SyntheticQwen3VLSpec)
    num_experts: int = 4
    experts_per_token: int = 2
    moe_intermediate: int = 48
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    #: the vision blocks' fc1 bias: near 2.7, where the exact and the tanh GELU differ most, a GELU form swapped
    #: (mlx-vlm's port) shows far above float32's floor (None: the random bias)
    vision_fc1_bias: float | None = 2.7


def build_moe_config(spec: SyntheticQwen3VLMoeSpec, token_id):
    """The ``Qwen3VLMoeConfig`` of ``spec`` (Qwen3-VL's settings, the text side sparse)."""
    from transformers import Qwen3VLMoeConfig

    config = build_config(spec.base, token_id).to_dict()
    text = dict(config["text_config"])
    text.update(
        num_experts=spec.num_experts,
        num_experts_per_tok=spec.experts_per_token,
        moe_intermediate_size=spec.moe_intermediate,
        decoder_sparse_step=spec.decoder_sparse_step,
        mlp_only_layers=list(spec.mlp_only_layers),
        tie_word_embeddings=False,
    )
    for key in ("model_type", "architectures", "transformers_version"):
        text.pop(key, None)
    vision = {k: v for k, v in config["vision_config"].items() if k not in ("model_type", "transformers_version")}
    top = {k: config[k] for k in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")}
    return Qwen3VLMoeConfig(
        text_config=text, vision_config=vision, tie_word_embeddings=False, eos_token_id=config["eos_token_id"], **top
    )


def released_expert_layout(out_dir: Path) -> None:
    """Store the stacked experts as the released checkpoints do (``gate_up_proj`` [experts, hidden,
    2 x intermediate], ``down_proj`` [experts, intermediate, hidden]), which transformers transposes on load
    and mlx-vlm's sanitize expects; transformers 5's ``save_pretrained`` writes its in-memory layout instead."""
    from safetensors.torch import load_file, save_file

    from .held import RELEASED_VERSION

    config_path = out_dir / "config.json"  # as the released checkpoints' config.json says (a square expert's layout)
    config = json.loads(config_path.read_text())
    config["transformers_version"] = RELEASED_VERSION
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for path in sorted(out_dir.glob("*.safetensors")):
        tensors = load_file(path)
        for name in [n for n in tensors if n.endswith((".experts.gate_up_proj", ".experts.down_proj"))]:
            tensors[name] = tensors[name].transpose(1, 2).contiguous()
        save_file(tensors, path, metadata={"format": "pt"})


def make_checkpoint(out_dir: Path, spec: SyntheticQwen3VLMoeSpec) -> Path:
    """Write a random-weight Qwen3-VL-MoE checkpoint (safetensors, tokenizer, image processor) to ``out_dir``."""
    import torch
    from transformers import Qwen3VLMoeForConditionalGeneration

    base = spec.base
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(base.vocab_size)
    config = build_moe_config(spec, tokenizer.convert_tokens_to_ids)
    torch.manual_seed(base.seed)
    model = Qwen3VLMoeForConditionalGeneration(config).eval()
    reinitialize(model, base.seed, base.weight_gain)
    with torch.no_grad():  # stacked experts [experts, out, in]: scale as if fan_in were ``in`` alone
        for name, param in model.named_parameters():
            if ".experts." in name:
                param.mul_(param.shape[1] ** 0.5)
            if spec.vision_fc1_bias is not None and name.startswith("model.visual.blocks.") and "fc1.bias" in name:
                param.add_(spec.vision_fc1_bias)
    model.save_pretrained(out_dir, safe_serialization=True)
    released_expert_layout(out_dir)
    image_processor(base).save_pretrained(out_dir)
    save_tokenizer(out_dir, tokenizer, spec)
    return out_dir


#: The tiny fixture: Qwen3-VL's tiny tower (depth 6, DeepStack at 1, 3, 4), 4 text layers of 4 experts, top-2.
TINY_SPEC = SyntheticQwen3VLMoeSpec()

#: The source of the tiny 4-bit twin: the same with 128-wide experts, so that group size 64 quantizes every expert
#: matrix (the tiny fixture's 48-wide down projections would stay dense). Not 64: transformers 5.24 decides whether
#: to transpose a stored ``experts.down_proj`` by its shape alone, so an intermediate width equal to the hidden
#: width (a square down projection) loads untransposed, i.e. wrong.
Q4_SOURCE_SPEC = SyntheticQwen3VLMoeSpec(moe_intermediate=128)
