"""Substitution at the vision/text boundary: the text side's prefill reads given rows (another runtime's
``text.embeds.image``) at the image slots instead of its own tower's merged embeddings. The decode steps (one
token, no image slot) are left alone."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import numpy as np

from driftscope.errors import InputError, RuntimeUnavailableError


def _slots(text: Any) -> np.ndarray:
    """The prompt's slots the tower fills (images, then videos: ``TextInputs.vision_slots``)."""
    if hasattr(text, "vision_slots"):
        return np.asarray(text.vision_slots)
    return np.asarray(text.input_ids) == text.image_token_id


def _rows(text: Any, embeds_shape: tuple) -> np.ndarray:
    slots = _slots(text)
    rows = np.asarray(text.image_embeds, dtype=np.float32)
    if rows.shape != (int(slots.sum()), embeds_shape[-1]):
        raise InputError(
            f"substituted image embeddings {list(rows.shape)} do not fit {int(slots.sum())} image slots of width "
            f"{embeds_shape[-1]}",
            "substitute the text.embeds.image of a runtime fed the same inputs",
        )
    return rows


def image_rows(text: Any, own: np.ndarray) -> np.ndarray:
    """The rows a compiled text prefill reads at the image slots: ``text.image_embeds`` when substituted, else
    ``own`` (this runtime's tower output, ``[image_tokens, hidden]``)."""
    if text is None or getattr(text, "image_embeds", None) is None:
        return own
    slots = int((_slots(text)).sum())
    return _rows(text, (slots, np.asarray(own).shape[-1]))


def _is_prefill(text: Any, embeds: Any) -> bool:
    return embeds is not None and len(embeds.shape) == 3 and embeds.shape[1] == len(text.input_ids)


@contextmanager
def torch_image_rows(language: Any, text: Any):
    """A forward pre-hook on the torch decoder ``language`` (called with ``inputs_embeds=``) that writes
    ``text.image_embeds`` into the prefill's image slots."""
    import torch

    slots = torch.from_numpy(_slots(text))

    def hook(module, args, kwargs):
        embeds = kwargs.get("inputs_embeds")
        if not _is_prefill(text, embeds):
            return None
        rows = torch.from_numpy(_rows(text, tuple(embeds.shape))).to(embeds.dtype)
        embeds = embeds.clone()
        embeds[0, slots] = rows
        return args, {**kwargs, "inputs_embeds": embeds}

    handle = language.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


class _Substituting:
    """Calls an MLX decoder with ``text.image_embeds`` written into the prefill's image slots (its embeddings
    come as ``inputs_embeds=`` or as the second positional argument)."""

    def __init__(self, decoder: Any, text: Any):
        self.decoder, self.text = decoder, text
        self.slots = np.flatnonzero(_slots(text))

    def _substituted(self, embeds: Any) -> Any:
        import mlx.core as mx

        if not _is_prefill(self.text, embeds):
            return embeds
        rows = mx.array(_rows(self.text, tuple(embeds.shape))).astype(embeds.dtype)
        embeds = mx.array(embeds)
        embeds[0, mx.array(self.slots)] = rows
        return embeds

    def __call__(self, *args, **kwargs):
        if "inputs_embeds" in kwargs:
            kwargs["inputs_embeds"] = self._substituted(kwargs["inputs_embeds"])
        elif len(args) > 1:
            args = (args[0], self._substituted(args[1]), *args[2:])
        return self.decoder(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.decoder, name)


@contextmanager
def mlx_image_rows(owner: Any, name: str, text: Any):
    """``owner.name`` (an MLX decoder) reads ``text.image_embeds`` at the prefill's image slots."""
    from driftscope.taps.mlx_hooks import shadow

    with shadow(owner, name, _Substituting(getattr(owner, name), text)):
        yield


def substitution_target(runtime: Any, owner: Any, name: str) -> Any:
    """``owner.name``, the decoder a substitution rewrites the embeddings of, or an error saying this runtime's
    text side cannot take substituted embeddings."""
    target = getattr(owner, name, None) if owner is not None else None
    if target is None:
        raise RuntimeUnavailableError(
            f"runtime {runtime.name!r} has no decoder at .{name} to take substituted image embeddings",
            "substitute with transformers or mlx, whose decoders take their embeddings as an argument",
        )
    return target
