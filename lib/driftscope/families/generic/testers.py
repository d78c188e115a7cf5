"""The settings of transformers' own model testers, one config per model type, for the tiny checkpoints.

Each entry is what the tester's ``get_config`` passes to the model type's config class, transcribed from
``tests/models/<family>/test_modeling_<family>.py`` of huggingface/transformers (``testers_native`` and
``testers_llava`` name the file and class next to each). Keys of the test harness that no config reads
(``is_training``, ``use_labels``, ``seq_length``, ``num_labels``, ``type_vocab_size``, ``output_channels``, ...) are
left out, and so are the testers' token ids and vocabulary sizes, which the builder replaces for every entry:

- token ids are the tokenizer's: every id a config names (``image_token_id``, ``pad_token_id``, ...) is set to the id
  of the special token ``tokens.SPECIAL`` maps it to (testers use ids such as 0 or 99 of a 99-word vocabulary, where a
  byte-level tokenizer keeps its byte alphabet);
- ``vocab_size`` is :data:`VOCAB` (testers say 99 or 100: a byte-level BPE needs 256 byte ids plus the specials).

Anything else changed is changed in :data:`ADJUSTMENTS`, each with why.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from driftscope.errors import CheckpointError

from .testers_llava import LLAVA_STYLE
from .testers_native import NATIVE

#: The tiny checkpoints' vocabulary: 256 byte ids, the family's special tokens, BPE merges of the fixed corpus.
VOCAB = 384


@dataclass(frozen=True)
class Tester:
    """One model tester's config (the kwargs of the model type's config class) and where it comes from."""

    model_type: str
    source: str
    config: dict


#: SigLIP's pooling head: built by default when a tester gives the tower as a dict, used by neither forward (the
#: composite reads the last hidden state), and absent from mlx-vlm 0.7.10's tower, whose strict load refuses it
NO_POOLING_HEAD = ("vision_config.vision_use_head", False)

#: the testers untie the head in text_config only; transformers 5 ties it by the top-level flag (the config class
#: defaults to True) and mlx-vlm 0.7.10 by text_config's: the two would build different models
UNTIED = "the tester's text_config says untied; the top-level flag transformers 5 follows must agree"

GLM4V_HEAD = (
    "mlx-vlm 0.7.10's GLM-4.1V always builds its own lm_head (glm4v/language.py), so a tied checkpoint misses "
    "lm_head.weight there"
)

HEAD_UNUSED = "unused by both forwards; mlx-vlm 0.7.10's strict load refuses its 11 weights"

#: What must differ from a tester for our use: model type -> {dotted config key: (value, why)}.
ADJUSTMENTS: dict[str, dict[str, tuple[object, str]]] = {
    "paligemma": {NO_POOLING_HEAD[0]: (NO_POOLING_HEAD[1], HEAD_UNUSED)},
    "gemma3": {
        NO_POOLING_HEAD[0]: (NO_POOLING_HEAD[1], HEAD_UNUSED),
        "text_config.num_hidden_layers": (
            6,
            "mlx-vlm 0.7.10's Gemma 3 text model indexes its prompt cache at sliding_window_pattern - 1 "
            "(gemma3/language.py, 6 - 1): with the tester's 2 layers its generate fails; 6 layers are 5 sliding-window "
            "layers and one global one, as the pattern says",
        ),
    },
    "lfm2_vl": {NO_POOLING_HEAD[0]: (NO_POOLING_HEAD[1], HEAD_UNUSED)},
    "mistral3": {"tie_word_embeddings": (False, UNTIED)},
    "hunyuan_vl": {
        "text_config.tie_word_embeddings": (
            True,
            "mlx-vlm 0.7.10's HunYuan-VL sanitize maps no top-level lm_head.weight (hunyuan_vl.py sanitize), so only a "
            "tied head loads there",
        )
    },
    "glm4v": {
        "text_config.tie_word_embeddings": (False, GLM4V_HEAD),
        "tie_word_embeddings": (False, GLM4V_HEAD),
    },
    "qwen2_vl": {
        "vision_config.spatial_merge_size": (
            2,
            "mlx-vlm 0.7.10's Qwen2-VL merger ignores spatial_merge_size (qwen2_vl/vision.py builds "
            "PatchMerger(dim, context_dim) with its default 2): the tester's 1 cannot load there",
        )
    },
    "aya_vision": {
        "text_config.num_hidden_layers": (
            4,
            "mlx-vlm 0.7.10's Cohere2 text model indexes its prompt cache at sliding_window_pattern - 1 "
            "(aya_vision/language.py, 4 - 1): with the tester's 2 layers its generate fails; 4 layers are 3 "
            "sliding-window layers and one global one, as Cohere2's pattern says",
        ),
        "alignment_intermediate_size": (
            128,
            "transformers falls back to the text hidden size (128) when the config does not say; mlx-vlm 0.7.10's "
            "config class always has the field (28672), so the checkpoint states the value transformers uses",
        ),
    },
    "internvl": {
        "text_config.model_type": (
            "qwen3",
            "mlx-vlm 0.7.10's InternVL always builds a Qwen3 language model (internvl/internvl.py imports "
            "qwen3.language); the tester's qwen2 (InternVL3) cannot load there, qwen3 is InternVL3.5's",
        ),
        "text_config.head_dim": (32, "Qwen3Config's default head_dim is 128; the tester's qwen2 had 128 / 4 heads"),
    },
}


def get_tester(model_type: str, adjusted: bool = True) -> Tester:
    """The tester config of ``model_type`` with its :data:`ADJUSTMENTS` applied (a fresh copy); ``adjusted=False``:
    the tester's settings as they are (to show what each adjustment is for)."""
    found = {**NATIVE, **LLAVA_STYLE}.get(model_type)
    if found is None:
        raise CheckpointError(
            f"no model tester config for model_type {model_type!r}",
            f"known model types: {', '.join(sorted(model_types()))}",
        )
    source, config = found
    config = copy.deepcopy(config)
    for key, (value, _why) in (ADJUSTMENTS.get(model_type, {}) if adjusted else {}).items():
        *parents, leaf = key.split(".")
        node = config
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = copy.deepcopy(value)
    return Tester(model_type, source, config)


def model_types() -> list[str]:
    """Every model type with a tester config here."""
    return [*NATIVE, *LLAVA_STYLE]
