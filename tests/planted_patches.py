"""Hypothesis patches that plant a known defect in a run (a module of their own: a run imports it by path)."""

from __future__ import annotations


def _install(family: str, mutation: str, model):
    from driftscope.families import get_family

    get_family(family).mutation_registry().get(mutation).install(model, {})
    return model


def leak_qwen2_5_vl(model, **_):
    """Qwen2.5-VL's full-attention blocks attend across the packed images and a video's frames."""
    return _install("qwen2_5_vl", "cross_image_leak", model)


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
