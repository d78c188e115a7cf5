"""The prompt side of an investigation: token ids around the images (the family builds them), the tokenizer."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from driftscope.errors import CheckpointError

DEFAULT_PROMPT = "Name every shape in the image and its colour."


@dataclass
class TextInputs:
    """Token ids of a chat prompt whose user turn holds the images (and videos), and what to generate."""

    input_ids: np.ndarray  # [seq] int64
    image_token_id: int
    prompt: str
    max_new_tokens: int = 16
    expect: list[str] = field(default_factory=list)
    token_types: np.ndarray | None = None  # [seq] 1 for every token of an image (when it is not just the placeholder)
    #: the reference's greedy tokens [max_new_tokens], set once the reference has decoded: every candidate that
    #: decodes is also fed these, teacher-forced (``text.forced.*``); None for the reference itself, which free-runs
    forced: np.ndarray | None = None
    #: the reference's answer a candidate's decode weighs its own against, to take teacher forcing and the KV-cache
    #: taps only where its answer is in question (``taps.answer_question``): ``tokens`` and ``margins`` [steps], its
    #: ``top_tokens`` and ``top_logits`` [steps, k] (descending); empty: every forced candidate takes them
    reference_answer: dict[str, np.ndarray] = field(default_factory=dict)
    #: the rule that weighs it: ``mode`` ("auto", or "always": the parameter file's ``text.forced``) and the
    #: contract's ``top5`` and ``margins`` tolerances as ``[atol, rtol, max_failure_fraction]``
    evidence_rule: dict | None = None
    #: substitution (``run.substitution``): rows [image tokens, hidden] that replace the runtime's own merged image
    #: embeddings at the image slots of the prefill (another runtime's ``text.embeds.image``); None: its own
    image_embeds: np.ndarray | None = None
    #: the video placeholder (None: the prompt holds no video); its slots take the tower's rows after the images'
    video_token_id: int | None = None
    #: the M-RoPE position rule's input, one entry per vision run of the prompt in prompt order (an image, a video,
    #: or a video's frame group where the family's prompt splits a video): its grid [t, h, w] in patches and the
    #: step its temporal positions take per temporal patch (1 for an image); None: the images' grids, step 1
    position_grids: list | None = None
    time_intervals: list | None = None
    #: seconds one temporal patch of each video spans (temporal_patch_size / fps), for a model that reads it
    second_per_grid_ts: list | None = None
    #: the processor's other per-token outputs the model call takes, [seq] each (``token_type_ids``,
    #: ``mm_token_type_ids``), by the processor's names
    token_arrays: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def vision_slots(self) -> np.ndarray:
        """[seq] mask of the slots the tower's merged rows fill: the image placeholders, then the video ones
        (``text.embeds.image`` holds these rows, in prompt order: the images' rows first, as the tower packs them)."""
        slots = self.input_ids == self.image_token_id
        if self.video_token_id is not None:
            slots = slots | (self.input_ids == self.video_token_id)
        return slots

    @property
    def mm_token_type_ids(self) -> np.ndarray:
        """1 where a token belongs to an image, 2 where it belongs to a video: ``token_types`` when the family
        gives them (e.g. an image's start, end and row-separator tokens too), else the placeholder tokens."""
        if self.token_types is not None:
            return np.asarray(self.token_types, dtype=np.int64)
        types = (self.input_ids == self.image_token_id).astype(np.int64)
        if self.video_token_id is not None:
            types[self.input_ids == self.video_token_id] = 2
        return types

    def summary(self) -> dict:
        return {
            "prompt": self.prompt,
            "tokens": int(self.input_ids.size),
            "image_tokens": int((self.input_ids == self.image_token_id).sum()),
            "video_tokens": int((self.input_ids == self.video_token_id).sum())
            if self.video_token_id is not None
            else 0,
            "max_new_tokens": self.max_new_tokens,
            "expect": self.expect,
        }


#: files one of which a checkpoint's tokenizer is saved as (transformers' fast and slow tokenizers)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "vocab.txt")


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    if not any((Path(path) / name).exists() for name in TOKENIZER_FILES):
        raise CheckpointError(
            f"checkpoint {path} has no tokenizer files (none of {', '.join(TOKENIZER_FILES)})",
            "save the tokenizer next to the weights (tokenizer.save_pretrained(dir)), or drop `text` from the "
            "parameter file to compare the vision tower only",
        )
    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as err:  # noqa: BLE001 - any failure means the checkpoint has no usable tokenizer
        raise CheckpointError(
            f"checkpoint {path} has no tokenizer transformers can load ({err})",
            "save the tokenizer next to the weights (tokenizer.json, tokenizer_config.json)",
        ) from err


#: tokenizer classes that encode as their tokenizer.json does (no special tokens or normalization added around the
#: file's own pipeline): transformers' own; a family adds its model's (``prompt_tokenizer(path, file_classes)``)
FILE_TOKENIZERS = ("TokenizersBackend",)


class FileTokenizer:
    """A checkpoint's ``tokenizer.json`` through the ``tokenizers`` library alone (transformers' ``AutoTokenizer``
    imports torch on the way): ``tokenizer(text)["input_ids"]`` and ``convert_tokens_to_ids`` as transformers' fast
    tokenizer gives them for :data:`FILE_TOKENIZERS` and the classes a family names (tests/inputs/test_text_inputs.py
    holds them equal)."""

    def __init__(self, path: Path, config: dict):
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(path))
        self.bos_token, self.eos_token = _token(config.get("bos_token")), _token(config.get("eos_token"))

    def __call__(self, text: str) -> dict:
        return {"input_ids": self.tokenizer.encode(text).ids}

    def convert_tokens_to_ids(self, tokens: str | list[str]):
        if isinstance(tokens, str):
            return self.tokenizer.token_to_id(tokens)
        return [self.tokenizer.token_to_id(token) for token in tokens]


def _token(value) -> str | None:
    """A special token as tokenizer_config.json states it (a string, or an added token's ``content``)."""
    return value.get("content") if isinstance(value, dict) else value


def prompt_tokenizer(path: str | Path, file_classes: tuple[str, ...] = ()):
    """What encodes a prompt: the checkpoint's ``tokenizer.json`` alone where its class adds nothing to it
    (:class:`FileTokenizer`: :data:`FILE_TOKENIZERS` and the family's ``file_classes``), else transformers'
    tokenizer (:func:`load_tokenizer`)."""
    import json

    folder = Path(path)
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        config = {}
    if (folder / "tokenizer.json").exists() and isinstance(config, dict):
        if config.get("tokenizer_class") in FILE_TOKENIZERS + file_classes and not config.get("add_bos_token"):
            return FileTokenizer(folder / "tokenizer.json", config)
    return load_tokenizer(folder)


def decode(checkpoint, tokens: list[int]) -> str:
    return load_tokenizer(checkpoint.path).decode([int(t) for t in tokens], skip_special_tokens=False)
