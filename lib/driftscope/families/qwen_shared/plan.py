"""The text stages both Qwen families share: the prompt's stages before the first decoder layer, the head after
the last, and what their replays read (the decoder layers between are each family's own)."""

from __future__ import annotations

from driftscope.taps.sink import decode_stages
from driftscope.taps.stages import Stage, StagePlan

#: The whole prompt's input embeddings (image slots from ``text.embeds.image``, the rest from ``text.embeds.text``),
#: a view the replay context builds: what text layer 0 reads.
TEXT_INPUT = "text.embeds@sequence"


def prompt_stages() -> list[Stage]:
    """The prompt's token ids, M-RoPE positions and input embeddings (image and text slots apart)."""
    return [
        Stage("text.input_ids", ("tokens",), integer=True, description="prompt token ids", data=True),
        Stage(
            "text.position_ids", ("3", "tokens"), integer=True, description="M-RoPE position ids (t, h, w)", data=True
        ),
        Stage(
            "text.rope_deltas", ("batch",), integer=True, description="M-RoPE delta for generated positions", data=True
        ),
        Stage("text.embeds.image", ("image_tokens", "hidden"), description="merged input embeddings at image slots"),
        Stage("text.embeds.text", ("text_tokens", "hidden"), description="input embeddings at text slots"),
        Stage(
            "text.embeds.text_slots_changed",
            ("count",),
            integer=True,
            description="text slots whose embedding differs from the token's own row (must be 0)",
            data=True,
        ),
    ]


def head_stages(max_new_tokens: int) -> list[Stage]:
    """The final norm and logits at the last position, then what is decoded after the prefill: greedy and
    teacher-forced."""
    return [
        Stage("text.norm.last", ("hidden",), description="final norm, last position"),
        Stage("text.logits.last", ("vocab",), description="prefill logits, last position"),
        Stage(
            "text.rope_delta",
            ("batch",),
            integer=True,
            description="M-RoPE offset the decoder used for generated positions (after the decode)",
            data=True,
        ),
        *decode_stages(max_new_tokens),
    ]


def text_layers(plan: StagePlan) -> int:
    """How many decoder layers the plan follows (0 without the text stages)."""
    return sum(1 for stage in plan if stage.id.startswith("text.layer.") and stage.id.endswith(".last"))


def edge_replay_inputs(stage_id: str, layers: int) -> tuple[str, ...] | None:
    """What a replay of a prompt or head stage reads (the final norm and the logits act per position: the last)."""
    if stage_id == "text.norm.last":
        return (f"text.layer.{layers - 1}.last",) if layers else None
    return {
        "text.embeds.image": ("vision.merger",),
        "text.embeds.text": ("text.input_ids",),
        "text.logits.last": ("text.norm.last",),
    }.get(stage_id)


def layer_index(stage_id: str) -> int:
    """``text.layer.3.last`` -> 3."""
    return int(stage_id.split(".")[2])
