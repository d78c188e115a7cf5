"""Chat templates of the families' released checkpoints, reduced to what a tiny checkpoint's prompt uses: system, user
and assistant turns whose content is text and images, images where the released template puts them, and the
generation prompt. Tool calls, thinking blocks, videos and date strings are left out."""

from __future__ import annotations


def _turns(open_: str, image: str, close: str, generation: str, text: str = "{{ item['text'] }}") -> str:
    """A loop over the messages: ``open_`` before a turn (``role`` is the message's role), each image as ``image``
    and each text as ``text`` in content order, ``close`` after it, and the generation prompt."""
    return (
        "{%- for message in messages -%}{%- set role = message['role'] -%}"
        + open_
        + "{%- if message['content'] is string -%}{{ message['content'] }}{%- else -%}"
        "{%- for item in message['content'] -%}"
        "{%- if item['type'] == 'image' -%}" + image + "{%- elif item['type'] == 'text' -%}" + text + "{%- endif -%}"
        "{%- endfor -%}{%- endif -%}" + close + "{%- endfor -%}"
        "{%- if add_generation_prompt -%}" + generation + "{%- endif -%}"
    )


#: Qwen2-VL-Instruct: the default system turn, <|vision_start|><|image_pad|><|vision_end|> per image
QWEN2_VL = (
    "{%- if messages[0]['role'] != 'system' -%}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{%- endif -%}"
    + _turns(
        "<|im_start|>{{ role }}\n",
        "<|vision_start|><|image_pad|><|vision_end|>",
        "<|im_end|>\n",
        "<|im_start|>assistant\n",
    )
)

#: SmolVLM-Instruct and Idefics3: "User:<image>text<end_of_utterance>\nAssistant:"
_IDEFICS_TURNS = _turns(
    "{{ role | capitalize }}{{ ':' if message['content'] is not string and message['content'][0]['type'] == 'image'"
    " else ': ' }}",
    "<image>",
    "<end_of_utterance>\n",
    "Assistant:",
)
SMOLVLM = "<|im_start|>" + _IDEFICS_TURNS
IDEFICS3 = "<|begin_of_text|>" + _IDEFICS_TURNS
#: Idefics2: the same turns; its Llama tokenizer adds <s>, here written out
IDEFICS2 = "{{ bos_token }}" + _IDEFICS_TURNS

#: llava-1.5-hf: "USER: <image>\ntext ASSISTANT:" (images first, then the text)
LLAVA = "{{ bos_token }}" + _turns(
    "{%- if role != 'system' -%}{{ role | upper }}: {%- endif -%}",
    "<image>\n",
    "",
    "ASSISTANT:",
    text="{{ item['text'] }} ",
)

#: llava-v1.6-mistral-7b-hf: "[INST] <image>\ntext [/INST]"
LLAVA_NEXT = "{{ bos_token }}" + _turns(
    "{%- if role == 'user' -%}[INST] {%- endif -%}",
    "<image>\n",
    "{%- if role == 'user' -%} [/INST]{%- else -%}{{ eos_token }}{%- endif -%}",
    "",
)

#: llava-onevision-qwen2-hf: "<|im_start|>user <image>\ntext<|im_end|>\n<|im_start|>assistant\n"
LLAVA_ONEVISION = _turns(
    "<|im_start|>{{ role }} ", "<image>", "<|im_end|>\n", "<|im_start|>assistant\n", "\n{{ item['text'] }}"
)

#: PaliGemma takes no chat: the processor writes "<image>" x n + <bos> + prompt + "\n" around the text given
PALIGEMMA = _turns("", "", "", "")

#: Gemma 3: <start_of_image> per image, which the processor expands; "model" is the assistant's role
GEMMA3 = "{{ bos_token }}" + _turns(
    "<start_of_turn>{{ 'model' if role == 'assistant' else role }}\n",
    "<start_of_image>",
    "<end_of_turn>\n",
    "<start_of_turn>model\n",
    text="{{ item['text'] | trim }}",
)

#: Mistral-Small-3.1: "[INST]text[IMG][/INST]" (the processor expands [IMG] into rows of [IMG] and [IMG_BREAK])
MISTRAL3 = "{{ bos_token }}" + _turns(
    "{%- if role == 'user' -%}[INST]{%- endif -%}",
    "[IMG]",
    "{%- if role == 'user' -%}[/INST]{%- else -%}{{ eos_token }}{%- endif -%}",
    "",
)

#: InternVL3-hf: "<|im_start|>user\n<IMG_CONTEXT>\ntext<|im_end|>\n" (the processor wraps <img>...</img>)
INTERNVL = _turns("<|im_start|>{{ role }}\n", "<IMG_CONTEXT>\n", "<|im_end|>\n", "<|im_start|>assistant\n")

#: Aya Vision: Cohere's turn tokens, <image> per image (expanded by the processor into tiles of <|IMG_PATCH|>)
AYA_VISION = "{{ bos_token }}" + _turns(
    "<|START_OF_TURN_TOKEN|>{{ '<|USER_TOKEN|>' if role == 'user' else '<|CHATBOT_TOKEN|>' }}",
    "<image>",
    "<|END_OF_TURN_TOKEN|>",
    "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
)

#: LFM2-VL: ChatML with <|startoftext|>, <image> per image
LFM2_VL = "{{ bos_token }}" + _turns("<|im_start|>{{ role }}\n", "<image>", "<|im_end|>\n", "<|im_start|>assistant\n")

#: GLM-4.1V: "[gMASK]<sop><|user|>\n<|begin_of_image|><|image|><|end_of_image|>text<|assistant|>\n"
GLM4V = "[gMASK]<sop>" + _turns(
    "<|{{ role }}|>\n",
    "<|begin_of_image|><|image|><|end_of_image|>",
    "",
    "<|assistant|>\n",
)

#: HunyuanOCR: begin-of-sentence, user / assistant markers, each image wrapped in its start and end tokens
HUNYUAN_VL = "{{ bos_token }}" + _turns(
    "{{ '<hy_User>' if role == 'user' else ('<hy_Assistant>' if role == 'assistant' else '') }}",
    "<hy_image_start><hy_image><hy_image_end>",
    "{{ eos_token if role == 'assistant' else '' }}",
    "<hy_Assistant>",
)
