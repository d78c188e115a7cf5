"""Hypothesis patches that plant a known defect in a run (a module of their own: a run imports it by path)."""

from __future__ import annotations


def _install(family: str, mutation: str, model):
    from driftscope.families import get_family

    get_family(family).mutation_registry().get(mutation).install(model, {})
    return model


def leak_qwen2_5_vl(model, **_):
    """Qwen2.5-VL's full-attention blocks attend across the packed images and a video's frames."""
    return _install("qwen2_5_vl", "cross_image_leak", model)


def unreorder_qwen2_5_vl(model, **_):
    """Qwen2.5-VL's final un-reorder uses ``reverse[orig] = rank`` instead of argsort (the family's
    ``rank_scatter_unreorder`` mutation, active on every call of the MLX vision tower): visible only on images
    whose window permutation is not an involution (e.g. 336x336 on the tiny fixture)."""
    from driftscope.families import get_family

    mutation = get_family("qwen2_5_vl").mutation_registry().get("rank_scatter_unreorder")
    tower = model.vision_tower
    base = type(tower)

    class Planted(base):
        def __call__(self, *args, **kwargs):
            with mutation.during(model, dict(mutation.settings)):
                return base.__call__(self, *args, **kwargs)

    tower.__class__ = Planted
    return model


def leak_qwen3_vl(model, **_):
    """Qwen3-VL's vision blocks attend across the packed images and a video's frames."""
    return _install("qwen3_vl", "cross_image_leak", model)


def scale_text_layer(model, layer: int = 0, factor: float = 1.5, **_):
    """A text-side planted defect: decoder layer ``layer``'s output multiplied by ``factor`` (transformers or
    mlx-vlm; every position, so the prefill and each decode step)."""
    if hasattr(model, "language_model") and hasattr(model.language_model, "model"):  # mlx-vlm
        layers = model.language_model.model.layers

        class Scaled:
            def __init__(self, inner):
                self.inner = inner

            def __call__(self, *args, **kwargs):
                out = self.inner(*args, **kwargs)
                return out * factor

            def __getattr__(self, name):
                return getattr(self.inner, name)

        layers[layer] = Scaled(layers[layer])
    else:
        target = model.model.language_model.layers[layer]

        def hook(module, args, out):
            if isinstance(out, tuple):
                return (out[0] * factor, *out[1:])
            return out * factor

        target.register_forward_hook(hook)
    return model


def cache_one_slot_off(model, layer: int = 1, from_step: int = 3, **_):
    """A decode defect in mlx-vlm's KV cache: in decoder ``layer``, from decode step ``from_step`` on (the token
    at position ``prompt length + from_step``), each token's keys and values are written one slot late (to
    position p + 1); position p keeps what it held (nothing, or a rewound token's stale entry)."""
    from mlx_vlm.models.cache import KVCache

    class OneSlotOff(KVCache):
        prompt = None

        def update_and_fetch(self, keys, values):
            if self.prompt is None:
                self.prompt = keys.shape[2]
            at = self.offset
            if keys.shape[2] != 1 or at - self.prompt < from_step:
                return super().update_and_fetch(keys, values)
            held_keys, held_values = keys * 0, values * 0
            if self.keys is not None and self.keys.shape[2] > at:
                held_keys, held_values = self.keys[..., at : at + 1, :], self.values[..., at : at + 1, :]
            out = super().update_and_fetch(held_keys, held_values)  # slot p keeps what it held
            if self.keys.shape[2] > at + 1:
                self.keys[..., at + 1 : at + 2, :] = keys  # the token's entry, one slot late
                self.values[..., at + 1 : at + 2, :] = values
            return out

    language = model.language_model
    original = getattr(language, "make_cache", None)

    def make_cache():  # mlx-vlm's own cache (make_prompt_cache's default: a KVCache per layer), one layer's late
        cache = list(original()) if original is not None else [KVCache() for _ in language.layers]
        cache[layer] = OneSlotOff()
        return cache

    object.__setattr__(language, "make_cache", make_cache)
    return model


def nudge_cached_keys(model, layer: int = 0, positions: tuple = (8, 12), size: float = 2e-3, **_):
    """A defect as small as RoPE's round-off at position 4,096, planted at low positions of mlx-vlm's KV cache: in
    decoder ``layer``, the keys of ``positions`` (a range) get ``size`` added to their first channel as the prefill
    writes them (what attention reads from the cache, and what the cache taps hold)."""
    import mlx.core as mx
    from mlx_vlm.models.cache import KVCache

    start, stop = positions

    class Nudged(KVCache):
        def update_and_fetch(self, keys, values):
            at = self.offset
            if at < stop and at + keys.shape[2] > start:
                index = mx.arange(at, at + keys.shape[2])
                rows = ((index >= start) & (index < stop)).astype(keys.dtype)[None, None, :, None]
                channel = (mx.arange(keys.shape[-1]) == 0).astype(keys.dtype)
                keys = keys + size * rows * channel
            return super().update_and_fetch(keys, values)

    language = model.language_model
    original = getattr(language, "make_cache", None)

    def make_cache():
        cache = list(original()) if original is not None else [KVCache() for _ in language.layers]
        cache[layer] = Nudged()
        return cache

    object.__setattr__(language, "make_cache", make_cache)
    return model


def shift_decode_rope_delta(model, shift: int = 1, **_):
    """A decode-only position defect in mlx-vlm's Qwen decoders: after the prefill (the call that carries the
    pixels) the language model's stored M-RoPE delta is off by ``shift``, so every generated token sits ``shift``
    positions late while the prompt's positions (and ``text.rope_deltas``) stay right."""
    language = model.language_model
    base = type(language)

    def __call__(self, *args, **kwargs):
        prefill = kwargs.get("pixel_values") is not None
        out = base.__call__(self, *args, **kwargs)
        if prefill and self._rope_deltas is not None:
            self._rope_deltas = self._rope_deltas + shift
        return out

    language.__class__ = type(f"Shifted{base.__name__}", (base,), {"__call__": __call__})
    return model


def misapply_decode_rope_delta(model, shift: int = 1, from_step: int = 2, **_):
    """A fault in applying the M-RoPE delta, not in storing it: mlx-vlm's Qwen decoder keeps the right
    ``_rope_deltas``, but from decode step ``from_step`` on (the call feeding the answer's token ``from_step - 1``)
    the positions its layers are given are ``shift`` too late."""
    import mlx.core as mx

    language = model.language_model
    inner = language.model
    prompt: list[int] = []

    class Misplaced:
        def __call__(self, inputs, cache=None, **kwargs):
            offset = int(cache[0].offset) if cache and cache[0] is not None else 0
            if not prompt:
                prompt.append(offset + inputs.shape[-1])  # the first call is the prefill
            elif kwargs.get("position_ids") is not None and offset - prompt[0] + 1 >= from_step:
                kwargs["position_ids"] = kwargs["position_ids"] + mx.array(shift, dtype=kwargs["position_ids"].dtype)
            return inner(inputs, cache=cache, **kwargs)

        def __getattr__(self, name):
            return getattr(inner, name)

    object.__setattr__(language, "model", Misplaced())
    return model


def composed(model, patches: list, **_):
    """Several patches applied in order (each a parameter-file ``patch`` entry): e.g. a port's known-defect fixes
    first, so that a planted decode defect is the only difference left."""
    from driftscope.capture.patches import parse_patch

    for entry in patches:
        model = parse_patch(entry).apply(model)
    return model


def scale_logits(model, factor: float = 1.0 + 1e-3, tokens: list | None = None, **_):
    """A planted logit-scale change: the final logits of the token ids ``tokens`` (every token when None)
    multiplied by ``factor`` (transformers or mlx-vlm; the prefill and every decode step). Scaling every logit
    alike reorders nothing, so only a partial scale can flip a step: one whose reference margin is under
    ``(factor - 1)`` times the boosted logit."""
    chosen = None if tokens is None else [int(t) for t in tokens]
    if hasattr(model, "language_model") and hasattr(model.language_model, "model"):  # mlx-vlm
        import mlx.core as mx

        language = model.language_model
        base = type(language)

        def __call__(self, *args, **kwargs):
            out = base.__call__(self, *args, **kwargs)
            logits = out.logits
            if chosen is None:
                scaled = logits * factor
            else:
                scale = mx.ones((logits.shape[-1],), dtype=logits.dtype)
                scale[mx.array(chosen)] = factor
                scaled = logits * scale
            out.logits = scaled
            return out

        language.__class__ = type(f"Scaled{base.__name__}", (base,), {"__call__": __call__})
        return model

    def hook(module, args, out):
        if chosen is None:
            return out * factor
        scaled = out.clone()
        scaled[..., chosen] = out[..., chosen] * factor
        return scaled

    model.lm_head.register_forward_hook(hook)
    return model


def video_time_shift(model, shift: int = 1, **_):
    """A defect in the temporal position rule of mlx-vlm's Qwen decoders: the M-RoPE time position of a video's
    later half of tokens (the second temporal patch of a t = 2 video, whichever way the family's prompt lays the
    frames out) is ``shift`` late; the prompt, the embeddings and the spatial positions stay right."""
    import mlx.core as mx
    import numpy as np

    language = model.language_model
    original = language.get_rope_index
    video = language.config.video_token_id

    def get_rope_index(input_ids, *args, **kwargs):
        positions, deltas = original(input_ids, *args, **kwargs)
        slots = np.flatnonzero(np.asarray(input_ids)[0] == video)
        if slots.size:
            shifted = np.array(positions)
            shifted[0, 0, slots[slots.size // 2 :]] += shift
            late = int(shifted.max()) + 1 - shifted.shape[-1]
            positions, deltas = mx.array(shifted), mx.array([[late]])
        return positions, deltas

    object.__setattr__(language, "get_rope_index", get_rope_index)


def wrong_eps(model, block: int = 1, eps: float = 10.0, norm: str = "norm1", **_):
    """Not a precision defect: vision block ``block``'s ``norm`` (norm1 or norm2) with a wrong epsilon (mlx-vlm's
    Qwen2.5-VL RMSNorm or Qwen3-VL LayerNorm: both keep it in ``eps``)."""
    getattr(model.vision_tower.blocks[block], norm).eps = eps
    return model
