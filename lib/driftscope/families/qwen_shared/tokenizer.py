"""The Qwen special tokens, chat template and the offline tokenizer of the tiny random-weight checkpoints."""

from __future__ import annotations

from driftscope.model.synthetic import train_tokenizer

#: Qwen2's tokenizer classes (the Qwen families' and Molmo2's language model), which encode as their tokenizer.json
#: does: what those families pass to ``prompt_tokenizer`` (tests/inputs/test_text_inputs.py)
QWEN2_TOKENIZERS = ("Qwen2Tokenizer", "Qwen2TokenizerFast")

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer with Qwen's special tokens, trained on the fixed tiny corpus."""
    return train_tokenizer(vocab_size, SPECIAL_TOKENS, eos_token="<|im_end|>", pad_token="<|endoftext|>")
