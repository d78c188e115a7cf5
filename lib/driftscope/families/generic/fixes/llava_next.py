"""mlx-vlm 0.7.10's LLaVA-NeXT merges the image into the prompt unlike LLaVA-NeXT (``llava_next/llava_next.py``):

- it never packs the anyres features: transformers' ``pack_image_features`` keeps the base patch's tokens, then the
  grid patches laid out as the image (rows of patches, unpadded to the image's aspect ratio) with ``image_newline``
  after each row; mlx-vlm keeps every patch's tokens as they are and appends a whole block of newline copies of the
  same shape (``llava_next.py:87-92``);
- it expects one image token per image: ``_merge_input_ids_with_image_features`` (``llava_next.py:102-123``) puts one
  feature block at each image token and drops the text between the others, where the processor (transformers' and
  mlx-vlm's own) expands each image into as many tokens as its packed features (transformers scatters them there).

Its decoder then runs on another sequence (a prompt of 375 tokens becomes 679 rows in the sweep's run). With the
tester's gelu text MLP, mlx-vlm's SwiGLU (``fixes/llava.py``) shows once the merge is right: ``llava_next_fixes``
applies both."""

from __future__ import annotations

from typing import Any

from ....errors import HypothesisPatchError
from ..patching import checkpoint_config, mlx_methods
from .llava import llava_text_mlp_hidden_act

__all__ = ["llava_next_anyres_merge", "llava_next_fixes"]

_MERGE = ("text.layer.0.*", "text.layer.0")
_MERGE_DEFECT = (
    "mlx-vlm merges the image into the prompt unlike LLaVA-NeXT: it never packs the anyres features (no unpadded grid "
    "with a newline after each row) and puts one feature block at each image token, dropping the text between them"
)
CLOSES = {
    "llava_next_anyres_merge": {
        "runtimes": ("mlx",),
        "stages": _MERGE,
        "model_types": ("llava_next",),
        "defect": _MERGE_DEFECT,
    },
    "llava_next_fixes": {
        "runtimes": ("mlx",),
        "stages": (*_MERGE, "text.layer.*.mlp"),
        "model_types": ("llava_next",),
        "defect": _MERGE_DEFECT + "; its text MLP is always SwiGLU whatever the text config's hidden_act says",
    },
}

#: model type -> runtime -> the ready patch that closes every defect found in that runtime's port of it (the
#: sweep runs each failing model type again with these)
WHOLE = {"llava_next": {"mlx": "llava_next_fixes"}}


def _pack(model: Any, features: Any, size: tuple[int, int], pinpoints: list) -> Any:
    """transformers' ``pack_image_features`` for one image's projected patches ``[patches, tokens, dim]``."""
    import mlx.core as mx
    from transformers.models.llava_next.modeling_llava_next import get_anyres_image_grid_shape, unpad_image

    newline = model.image_newline.astype(features.dtype)
    if features.shape[0] == 1:
        return mx.concatenate([features[0], newline[None]], axis=0)
    vision = model.config.vision_config
    side = vision.image_size // vision.patch_size
    rows, cols = get_anyres_image_grid_shape(list(size), pinpoints, vision.image_size)
    dim = features.shape[-1]
    grid = features[1:].reshape(rows, cols, side, side, dim).transpose(4, 0, 2, 1, 3).reshape(dim, rows * side, -1)
    grid = unpad_image(grid, list(size))
    grid = mx.concatenate([grid, mx.broadcast_to(newline[:, None, None], (*grid.shape[:-1], 1))], axis=-1)
    return mx.concatenate([features[0], grid.reshape(dim, -1).T], axis=0)


def _get_input_embeddings(self, input_ids=None, pixel_values=None, **kwargs):
    """transformers' LLaVA-NeXT: each image's patches through the tower, the chosen layer (without CLS for the
    ``default`` strategy) through the projector, packed, and scattered over the prompt's image tokens."""
    import mlx.core as mx
    import numpy as np
    from mlx_vlm.models.base import InputEmbeddingsFeatures
    from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches

    embeds = self.language_model.model.embed_tokens(input_ids)
    if pixel_values is None:
        return InputEmbeddingsFeatures(inputs_embeds=embeds)
    config = checkpoint_config(self, "llava_next_anyres_merge")
    pinpoints, image_size = config["image_grid_pinpoints"], self.config.vision_config.image_size
    packed = []
    for index, size in enumerate(np.asarray(kwargs["image_sizes"]).reshape(-1, 2).tolist()):
        count = image_size_to_num_patches(size, pinpoints, image_size)  # the base patch and the grid's
        *_, states = self.vision_tower(pixel_values[index, :count].transpose(0, 2, 3, 1), output_hidden_states=True)
        layers = self.vision_feature_layer
        chosen = mx.concatenate([states[i] for i in layers], axis=-1) if isinstance(layers, list) else states[layers]
        chosen = chosen[:, 1:] if self.vision_feature_select_strategy == "default" else chosen
        packed.append(_pack(self, self.multi_modal_projector(chosen), tuple(size), pinpoints))
    features = mx.concatenate(packed, axis=0).astype(embeds.dtype)
    where = np.flatnonzero(np.asarray(input_ids[0]) == self.config.image_token_index)
    if len(where) != features.shape[0]:
        raise ValueError(f"{len(where)} image tokens in the prompt for {features.shape[0]} packed image features")
    embeds[0, mx.array(where)] = features
    return InputEmbeddingsFeatures(inputs_embeds=embeds)


def llava_next_anyres_merge(model: Any) -> Any:
    """The image features packed and merged into the prompt as transformers' LLaVA-NeXT does."""
    from mlx_vlm.models.llava_next.llava_next import Model

    if not isinstance(model, Model):
        raise HypothesisPatchError(
            f"llava_next_anyres_merge corrects mlx-vlm's LLaVA-NeXT merge; it was given a {type(model).__name__}",
            "apply it to the mlx runtime of a llava_next checkpoint",
        )
    if "image_grid_pinpoints" not in checkpoint_config(model, "llava_next_anyres_merge"):
        raise HypothesisPatchError("the checkpoint's config has no image_grid_pinpoints", "check the checkpoint")
    mlx_methods(model, get_input_embeddings=_get_input_embeddings)
    return model


def llava_next_fixes(model: Any) -> Any:
    """Both: the merge, and the text MLP gated with the checkpoint's ``hidden_act`` (``llava_text_mlp_hidden_act``)."""
    return llava_text_mlp_hidden_act(llava_next_anyres_merge(model))
