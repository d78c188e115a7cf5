"""Each family's special tokens: which ids its config names, which attributes its processor reads from the tokenizer,
and the chat template of its released checkpoints (reduced to user and assistant turns of text and images).

The tiny tokenizer (``tiny_tokenizer.build_tokenizer``) carries exactly these tokens, so the real processor and chat
template of the family run on it, and every id the config names is the tokenizer's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import templates


@dataclass(frozen=True)
class TokenSpec:
    """The special tokens of one family."""

    bos: str
    eos: str
    pad: str
    #: dotted config key -> token (``image_token_id``, ``text_config.pad_token_id``, ...)
    ids: dict[str, str]
    #: tokenizer attribute the processor reads -> token (transformers' ``extra_special_tokens``)
    named: dict[str, str] = field(default_factory=dict)
    #: further special tokens of the chat format or of the processor's prompt expansion
    extra: tuple[str, ...] = ()
    template: str = ""

    def tokens(self) -> list[str]:
        """Every special token once, pad first (id 0), in a fixed order."""
        ordered = [self.pad, self.bos, self.eos, *self.ids.values(), *self.named.values(), *self.extra]
        return list(dict.fromkeys(ordered))


def text_ids(bos: str, eos: str, pad: str, section: str = "text_config.") -> dict[str, str]:
    """The bos / eos / pad ids of a (text) config section."""
    return {f"{section}bos_token_id": bos, f"{section}eos_token_id": eos, f"{section}pad_token_id": pad}


#: Idefics3's and SmolVLM's tile tokens: ``<row_i_col_j>`` for up to 6 x 6 tiles, and the global view's
TILES = tuple(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)) + ("<global-img>",)
IDEFICS = {"image_token_id": "<image>"}
QWEN_CHAT = ("<|im_start|>", "<|im_end|>")

SPECS: dict[str, TokenSpec] = {
    "qwen2_vl": TokenSpec(
        "<|endoftext|>",
        "<|im_end|>",
        "<|endoftext|>",
        {
            "image_token_id": "<|image_pad|>",
            "video_token_id": "<|video_pad|>",
            "vision_start_token_id": "<|vision_start|>",
            "vision_end_token_id": "<|vision_end|>",
            **text_ids("<|endoftext|>", "<|im_end|>", "<|endoftext|>"),
        },
        extra=(*QWEN_CHAT, "<|vision_pad|>"),
        template=templates.QWEN2_VL,
    ),
    "smolvlm": TokenSpec(
        "<|im_start|>",
        "<end_of_utterance>",
        "<|im_end|>",
        {**IDEFICS, **text_ids("<|im_start|>", "<end_of_utterance>", "<|im_end|>")},
        named={"fake_image_token": "<fake_token_around_image>", "image_token": "<image>"},
        extra=("<end_of_utterance>", "<video>", *TILES),
        template=templates.SMOLVLM,
    ),
    "idefics3": TokenSpec(
        "<|begin_of_text|>",
        "<end_of_utterance>",
        "<|end_of_text|>",
        {**IDEFICS, **text_ids("<|begin_of_text|>", "<end_of_utterance>", "<|end_of_text|>")},
        extra=("<fake_token_around_image>", "<image>", "<end_of_utterance>", *TILES),
        template=templates.IDEFICS3,
    ),
    "idefics2": TokenSpec(
        "<s>",
        "<end_of_utterance>",
        "<unk>",
        {**IDEFICS, **text_ids("<s>", "<end_of_utterance>", "<unk>")},
        extra=("</s>", "<fake_token_around_image>", "<image>", "<end_of_utterance>"),
        template=templates.IDEFICS2,
    ),
    "llava": TokenSpec(
        "<s>",
        "</s>",
        "<pad>",
        {"image_token_index": "<image>", **text_ids("<s>", "</s>", "<pad>")},
        extra=("<unk>",),
        template=templates.LLAVA,
    ),
    "llava_next": TokenSpec(
        "<s>",
        "</s>",
        "<unk>",
        {"image_token_index": "<image>", **text_ids("<s>", "</s>", "<unk>")},
        template=templates.LLAVA_NEXT,
    ),
    "llava_onevision": TokenSpec(
        "<|endoftext|>",
        "<|im_end|>",
        "<|endoftext|>",
        {
            "image_token_index": "<image>",
            "video_token_index": "<video>",
            **text_ids("<|endoftext|>", "<|im_end|>", "<|endoftext|>"),
        },
        extra=QWEN_CHAT,
        template=templates.LLAVA_ONEVISION,
    ),
    "paligemma": TokenSpec(
        "<bos>",
        "<eos>",
        "<pad>",
        {"image_token_index": "<image>", **text_ids("<bos>", "<eos>", "<pad>")},
        named={"image_token": "<image>"},
        template=templates.PALIGEMMA,
    ),
    "gemma3": TokenSpec(
        "<bos>",
        "<eos>",
        "<pad>",
        {
            "image_token_index": "<image_soft_token>",
            "boi_token_index": "<start_of_image>",
            "eoi_token_index": "<end_of_image>",
            **text_ids("<bos>", "<eos>", "<pad>"),
        },
        named={"image_token": "<image_soft_token>", "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>"},
        extra=("<start_of_turn>", "<end_of_turn>"),
        template=templates.GEMMA3,
    ),
    "mistral3": TokenSpec(
        "<s>",
        "</s>",
        "<pad>",
        {"image_token_index": "[IMG]", **text_ids("<s>", "</s>", "<pad>", ""), **text_ids("<s>", "</s>", "<pad>")},
        extra=("<unk>", "[INST]", "[/INST]", "[IMG_BREAK]", "[IMG_END]"),
        template=templates.MISTRAL3,
    ),
    "internvl": TokenSpec(
        "<|endoftext|>",
        "<|im_end|>",
        "<|endoftext|>",
        {
            "image_token_id": "<IMG_CONTEXT>",
            **text_ids("<|endoftext|>", "<|im_end|>", "<|endoftext|>", ""),
            **text_ids("<|endoftext|>", "<|im_end|>", "<|endoftext|>"),
        },
        named={
            "start_image_token": "<img>",
            "end_image_token": "</img>",
            "context_image_token": "<IMG_CONTEXT>",
            "video_token": "<video>",
        },
        extra=QWEN_CHAT,
        template=templates.INTERNVL,
    ),
    "aya_vision": TokenSpec(
        "<BOS_TOKEN>",
        "<|END_OF_TURN_TOKEN|>",
        "<PAD>",
        {
            "image_token_index": "<|IMG_PATCH|>",
            **text_ids("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", "<PAD>", ""),
            **text_ids("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", "<PAD>"),
        },
        extra=(
            "<|START_OF_TURN_TOKEN|>",
            "<|USER_TOKEN|>",
            "<|CHATBOT_TOKEN|>",
            "<image>",
            "<|START_OF_IMG|>",
            "<|END_OF_IMG|>",
            "<|IMG_LINE_BREAK|>",
        ),
        template=templates.AYA_VISION,
    ),
    "lfm2_vl": TokenSpec(
        "<|startoftext|>",
        "<|im_end|>",
        "<|pad|>",
        {"image_token_id": "<image>", **text_ids("<|startoftext|>", "<|im_end|>", "<|pad|>")},
        named={
            "image_token": "<image>",
            "image_start_token": "<|image_start|>",
            "image_end_token": "<|image_end|>",
            "image_thumbnail_token": "<|img_thumbnail|>",
        },
        extra=(*QWEN_CHAT, *(f"<|img_row_{i}_col_{j}|>" for i in range(1, 11) for j in range(1, 11))),
        template=templates.LFM2_VL,
    ),
    "glm4v": TokenSpec(
        "<|endoftext|>",
        "<|endoftext|>",
        "<|endoftext|>",
        {
            "image_token_id": "<|image|>",
            "video_token_id": "<|video|>",
            "image_start_token_id": "<|begin_of_image|>",
            "image_end_token_id": "<|end_of_image|>",
            "video_start_token_id": "<|begin_of_video|>",
            "video_end_token_id": "<|end_of_video|>",
            **text_ids("<|endoftext|>", "<|endoftext|>", "<|endoftext|>"),
        },
        extra=("[gMASK]", "<sop>", "<|user|>", "<|assistant|>"),
        template=templates.GLM4V,
    ),
    # HunyuanOCR's tokenizer names its specials by placeholder numbers; these names are ours, the roles the same
    "hunyuan_vl": TokenSpec(
        "<hy_bos>",
        "<hy_eos>",
        "<hy_pad>",
        {
            "image_token_id": "<hy_image>",
            "im_start_id": "<hy_image_start>",
            "im_end_id": "<hy_image_end>",
            "im_newline_id": "<hy_image_newline>",
            **text_ids("<hy_bos>", "<hy_eos>", "<hy_pad>"),
        },
        named={
            "image_token": "<hy_image>",
            "image_start_token": "<hy_image_start>",
            "image_end_token": "<hy_image_end>",
        },
        extra=("<hy_User>", "<hy_Assistant>"),
        template=templates.HUNYUAN_VL,
    ),
}
