"""How each runtime holds a Molmo2 checkpoint's tensors (``Family.load_layout``, audited by
``capture.load_audit``). The weights are in the original layout (``model.transformer.*``,
``model.vision_backbone.*``) in both config layouts.

- transformers renames them (its conversion mapping for ``molmo2``), splits each decoder layer's fused
  ``att_proj`` into q, k and v (rows: heads x head_dim, then kv_heads x head_dim twice) and ``ff_proj`` into
  up then gate (halves), and stacks the two word-embedding parts into ``embed_tokens``;
- mlx-vlm renames them (its ``sanitize``), and the family's loader re-splits the two word-embedding parts at
  ``vocab_size`` (transformers 5.24 saves them split in halves);
- the compiled emitter reads the tower's under its own names at load, the decoder's at the text capture.
"""

from __future__ import annotations

from driftscope.model.load_layout import Held, LoadLayout, TensorRule

from .config import read_facts

EMBEDDING, NEW = "model.transformer.wte.embedding", "model.transformer.wte.new_embedding"
TRANSFORMERS = (
    (r"(?<!image_vit\.)transformer\.(?!ln_f\.|blocks\.)", "language_model."),
    (r"(?<!image_vit\.)transformer\.ln_f\.", "language_model.norm."),
    (r"(?<!image_vit\.)transformer\.blocks\.", "language_model.layers."),
    (r"vision_backbone\.image_vit\.(?!transformer\.resblocks\.)", "vision_tower."),
    (r"vision_backbone\.image_vit\.transformer\.resblocks\.", "vision_tower.layers."),
    (r"vision_backbone\.image_pooling_2d\.", "multi_modal_projector.image_pooling_2d."),
    (r"vision_backbone\.image_projector\.", "multi_modal_projector.image_projector."),
    (r"\.attention\.w([qkvo])", r".self_attn.\1_proj"),
    (r"\.feed_forward\.w1", ".mlp.fc1"),
    (r"\.feed_forward\.w2", ".mlp.fc2"),
    (r"\.attention_norm", ".layer_norm1"),
    (r"\.ffn_norm", ".layer_norm2"),
    (r"image_pooling_2d\.w([qkvo])", r"image_pooling_2d.\1_proj"),
    (r"image_projector\.w1", "image_projector.gate_proj"),
    (r"image_projector\.w2", "image_projector.down_proj"),
    (r"image_projector\.w3", "image_projector.up_proj"),
    (r"\.attn_norm\.", ".input_layernorm."),
    (r"\.ff_norm\.", ".post_attention_layernorm."),
    (r"self_attn\.attn_out", "self_attn.o_proj"),
    (r"mlp\.ff_out", "mlp.down_proj"),
)
MLX = (
    (r"^model\.transformer\.", "language_model.model."),
    (r"^model\.vision_backbone\.", "vision_tower."),
    (r"^lm_head\.", "language_model.lm_head."),
    (r"\.transformer\.resblocks\.", ".transformer."),
)
COMPILED = (
    (r"^model\.vision_backbone\.image_vit\.transformer\.resblocks\.", "vit.layers."),
    (r"^model\.vision_backbone\.image_vit\.patch_embedding", "vit.patch_embed"),
    (r"^model\.vision_backbone\.image_vit\.positional_embedding", "vit.pos_embed"),
    (r"\.attention\.w([qkvo])\.", r".attn.\1."),
    (r"\.attention_norm\.", ".norm1."),
    (r"\.ffn_norm\.", ".norm2."),
    (r"\.feed_forward\.w1\.", ".mlp.fc1."),
    (r"\.feed_forward\.w2\.", ".mlp.fc2."),
    (r"^model\.vision_backbone\.image_pooling_2d\.w([qkvo])\.", r"pool.\1."),
    (r"^model\.vision_backbone\.image_projector\.w1\.", "projector.gate."),
    (r"^model\.vision_backbone\.image_projector\.w2\.", "projector.down."),
    (r"^model\.vision_backbone\.image_projector\.w3\.", "projector.up."),
)


def molmo2_layout(runtime: str, checkpoint) -> LoadLayout | None:
    """The layout ``runtime`` holds ``checkpoint`` in (None for a runtime that loads no weights)."""
    text = read_facts(checkpoint.config).text
    if runtime == "transformers":
        q, kv = text.num_heads * text.head_dim, text.num_kv_heads * text.head_dim
        layers = r"(model\.language_model\.layers\.\d+)"
        split = (
            Held(r"\1.self_attn.q_proj.weight", (("rows", 0, q),)),
            Held(r"\1.self_attn.k_proj.weight", (("rows", q, q + kv),)),
            Held(r"\1.self_attn.v_proj.weight", (("rows", q + kv, q + 2 * kv),)),
        )
        chunks = (
            Held(r"\1.mlp.up_proj.weight", (("half", 0, 0),)),
            Held(r"\1.mlp.gate_proj.weight", (("half", 0, 1),)),
        )
        words = Held("model.language_model.embed_tokens.weight", sources=(EMBEDDING, NEW))
        return LoadLayout(
            renames=TRANSFORMERS,
            rules=(
                TensorRule(layers + r"\.self_attn\.att_proj\.weight", split),
                TensorRule(layers + r"\.mlp\.ff_proj\.weight", chunks),
                TensorRule(r"model\.language_model\.wte\.embedding", (words,)),
                TensorRule(r"model\.language_model\.wte\.new_embedding", ()),  # stacked into embed_tokens above
            ),
        )
    if runtime == "mlx":
        vocab, extra = text.vocab_size, text.additional_vocab_size
        return LoadLayout(
            renames=MLX,
            rules=(
                TensorRule(
                    r"language_model\.model\.wte\.embedding",
                    (Held(sources=(EMBEDDING, NEW), ops=(("rows", 0, vocab),)),),
                ),
                TensorRule(
                    r"language_model\.model\.wte\.new_embedding",
                    (Held(sources=(EMBEDDING, NEW), ops=(("rows", vocab, vocab + extra),)),),
                ),
            ),
        )
    if runtime in ("jax", "iree"):  # the tower's weights at load; the decoder's at the text capture
        return LoadLayout(
            renames=COMPILED,
            not_held=("model.transformer.*", "lm_head.*"),
            later={"text": emitter_text_layout(checkpoint)},
        )
    return None


def emitter_text_layout(checkpoint) -> LoadLayout:
    """How the compiled path's decoder holds the checkpoint's text tensors (``LoadLayout.later["text"]``): the
    emitter's names (``jax.weights.checkpoint_names``), each fused ``att_proj`` split into q, k and v rows and
    ``ff_proj`` into up then gate, the two word-embedding parts stacked into one table."""
    from .jax.weights import Molmo2Spec, checkpoint_names

    spec = Molmo2Spec.from_config(checkpoint.config)
    text = spec.text
    q, kv, inner = text.num_heads * text.head_dim, text.num_kv_heads * text.head_dim, text.intermediate_size
    layer = r"model\.transformer\.blocks\.(\d+)\."
    rules = [
        TensorRule(layer + r"mlp\.ff_proj\.weight", (
            Held(r"text.layers.\1.mlp.up.weight", (("rows", 0, inner),)),
            Held(r"text.layers.\1.mlp.gate.weight", (("rows", inner, 2 * inner),)),
        )),
        TensorRule(r"model\.transformer\.wte\.embedding", (Held("text.embed.weight", sources=(EMBEDDING, NEW)),)),
        TensorRule(r"model\.transformer\.wte\.new_embedding", ()),  # stacked into text.embed.weight above
    ]  # fmt: skip
    for kind in ("weight", "bias"):
        rules.append(TensorRule(layer + rf"self_attn\.att_proj\.{kind}", tuple(
            Held(rf"text.layers.\1.attn.{name}.{kind}", (("rows", start, stop),))
            for name, start, stop in (("q", 0, q), ("k", q, q + kv), ("v", q + kv, q + 2 * kv))
        )))  # fmt: skip
    names = {key: name for name, (key, _) in checkpoint_names(spec).items() if name.startswith("text.")}
    return LoadLayout(names=names, rules=tuple(rules), not_held=("model.vision_backbone.*",))
