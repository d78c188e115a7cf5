"""The text stages both Qwen families share: the prompt's stages before the first decoder layer, the head after
the last, and what their replays read (the decoder layers between are each family's own)."""

from __future__ import annotations

from driftscope.taps.sink import decode_stages
from driftscope.taps.stages import Rotary, Stage, StagePlan

#: The whole prompt's input embeddings (image slots from ``text.embeds.image``, the rest from ``text.embeds.text``),
#: a view the replay context builds: what text layer 0 reads.
TEXT_INPUT = "text.embeds@sequence"


def vision_config(config: dict) -> dict:
    """The vision settings of a checkpoint config (transformers 5 nests them under vision_config)."""
    return dict(config.get("vision_config") or {})


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


def decoder_rotary(config: dict, default_theta: float) -> Rotary | None:
    """How the decoder rotates its keys: M-RoPE's frequencies over the whole head (the t, h, w sections split
    the frequencies, each position's largest of the three bounds its angle), positions from ``text.position_ids``.
    None for a scaled RoPE (its frequencies are not ``theta ** (-2i / d)``): the contract alone judges it."""
    text = dict(config.get("text_config") or config)
    rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    if str(rope.get("rope_type", rope.get("type", "default"))) not in ("default", "mrope"):
        return None
    heads = int(text.get("num_attention_heads") or 0)
    head_dim = int(text.get("head_dim") or (int(text.get("hidden_size") or 0) // heads if heads else 0))
    if head_dim < 2:
        return None
    theta = float(rope.get("rope_theta", text.get("rope_theta", default_theta)))
    return Rotary.default(theta, head_dim, positions="text.position_ids")


def head_stages(max_new_tokens: int, rotary: Rotary | None = None) -> list[Stage]:
    """The final norm and logits at the last position, then what is decoded after the prefill: greedy and
    teacher-forced (the cached keys rotated as ``rotary`` declares)."""
    return [
        Stage("text.norm.last", ("hidden",), description="final norm, last position"),
        Stage("text.logits.last", ("vocab",), description="prefill logits, last position"),
        Stage(
            "text.rope_delta",
            ("steps",),
            integer=True,
            description="the M-RoPE offset each decode step applied to its token (position its layers were given "
            "minus sequence index), steps 1, 2, ...",
            data=True,
        ),
        *decode_stages(max_new_tokens, rotary),
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
