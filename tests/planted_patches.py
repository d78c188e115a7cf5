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
