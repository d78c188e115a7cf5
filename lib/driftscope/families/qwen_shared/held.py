"""How each runtime holds a Qwen VL checkpoint's tensors (``Family.load_layout``, audited by
``capture.load_audit``): the names each loader gives the checkpoint's tensors, the one value transform (mlx-vlm's
channel-last patch embedding), what a tied head leaves out; the compiled path's text decoder, read at the text
capture, is declared apart (``LoadLayout.later["text"]``).

A checkpoint is in transformers 5's layout (``model.visual.*``, ``model.language_model.*``) or the hub's older one
(``visual.*``, ``model.*``); the renames bring either to each runtime's names.
"""

from __future__ import annotations

from driftscope.model.load_layout import Held, LoadLayout, TensorRule

from .text import tied_head

#: the hub's older layout into transformers 5's (Qwen2.5-VL's released checkpoints)
TO_V5 = ((r"^visual\.", "model.visual."), (r"^model\.(?!visual\.|language_model\.)", "model.language_model."))
#: transformers 5's names into mlx-vlm's (its ``sanitize``)
TO_MLX = (
    (r"^model\.language_model\.", "language_model.model."),
    (r"^model\.visual\.", "vision_tower."),
    (r"^lm_head\.", "language_model.lm_head."),
)
#: the compiled path's text decoder: the text tensors without their prefix (``layers.0.self_attn.q_proj.weight``)
TO_EMITTER_TEXT = (*TO_V5, (r"^model\.language_model\.", ""))
#: mlx-vlm's patch embedding is a channel-last convolution: [out, t, h, w, in] of torch's [out, in, t, h, w]
CHANNEL_LAST = TensorRule(r"vision_tower\.patch_embed\.proj\.weight", (Held(ops=(("transpose", (0, 2, 3, 4, 1)),)),))


def emitter_text_layout(checkpoint, rules: tuple[TensorRule, ...] = ()) -> LoadLayout:
    """How the compiled path's text decoder holds the checkpoint's text tensors (``LoadLayout.later["text"]``):
    by their names without the prefix, the head as the word embedding where it is tied; ``rules``: a family's own
    (e.g. stacked experts), before the shared ones."""
    tied = tied_head(checkpoint.config)
    head = (TensorRule(r"embed_tokens\.weight", (Held(), Held("lm_head.weight"))),) if tied else ()
    return LoadLayout(renames=TO_EMITTER_TEXT, rules=(*rules, *head), not_held=("model.visual.*", *tied))


def qwen_layout(runtime: str, checkpoint, extra: dict[str, tuple[TensorRule, ...]] | None = None) -> LoadLayout | None:
    """The layout ``runtime`` holds ``checkpoint`` in (None for a runtime that loads no weights); ``extra``:
    a family's own rules per runtime (e.g. stacked experts; ``"text"``: the compiled path's text decoder's),
    before the shared ones."""
    extra = extra or {}
    tied = tied_head(checkpoint.config)
    if runtime == "transformers":
        return LoadLayout(renames=TO_V5, rules=extra.get(runtime, ()), not_held=tied)
    if runtime == "mlx":
        return LoadLayout(
            renames=TO_V5 + TO_MLX,
            rules=(*extra.get(runtime, ()), CHANNEL_LAST),
            not_held=tuple(f"language_model.{name}" for name in tied),
        )
    if runtime in ("jax", "iree"):  # the tower's weights at load; the text side's at the text capture
        return LoadLayout(
            renames=(*TO_V5, (r"^model\.visual\.", "")),
            not_held=("model.language_model.*", "lm_head.*"),
            later={"text": emitter_text_layout(checkpoint, extra.get("text", ()))},
        )
    return None
