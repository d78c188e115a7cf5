"""How each library's whole model is called on the shared inputs, and mlx-vlm's loader on a transformers-5 checkpoint.

``transformers_kwargs`` and ``mlx_kwargs`` hand the same processor output (``ModelInputs``) and prompt
(``TextInputs``) to ``model(**kwargs)`` of transformers and to mlx-vlm's ``model(input_ids, pixel_values, mask=...,
**kwargs)``, the way mlx-vlm's own ``generate`` passes a processor's output (``generate/dispatch.py``
``_prepare_generation_inputs``: every processor output but ``input_ids``, ``pixel_values`` and ``attention_mask`` as a
keyword, as an ``mx.array``).

``mlx_load`` is mlx-vlm's ``utils.load_model`` on a config adapted in memory (``mlx_config``) to the layout mlx-vlm
0.7.10 reads; the checkpoint directory is never edited. Only plumbing is adapted (where a value is written, under
which name); a value mlx-vlm computes differently from transformers is left for the comparison to find.
"""

from __future__ import annotations

import copy
import glob
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from driftscope.errors import CheckpointError
from driftscope.inputs.processor_output import ModelInputs

#: processor outputs mlx-vlm's generate does not pass as keywords (they are the call's positional arguments)
POSITIONAL = ("input_ids", "pixel_values", "attention_mask")
#: the attribute of a model ``mlx_load`` made that holds the checkpoint's config.json as transformers wrote it
CHECKPOINT_CONFIG = "driftscope_checkpoint_config"
#: config keys that are sub-configs or identity, never copied between the top level and text_config
NOT_COPIED = ("text_config", "vision_config", "audio_config", "perceiver_config", "model_type", "architectures")


def prompt_arrays(inputs: ModelInputs) -> dict[str, np.ndarray]:
    """The prompt's arrays, batch of one: ``input_ids``, ``attention_mask`` and the token types the family's
    processor made (``token_type_ids`` / ``mm_token_type_ids``), then every processor output."""
    text = inputs.text
    if text is None:
        raise ValueError("inputs carry no prompt: build them with processor.build_text_inputs first")
    ids = np.asarray(text.input_ids, dtype=np.int64)[None]
    arrays = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    for name, values in text.token_arrays.items():
        arrays[name] = np.asarray(values)[None]
    arrays.update(inputs.arrays)
    return arrays


def transformers_kwargs(inputs: ModelInputs) -> dict:
    """Torch tensors for transformers' ``model(**kwargs)`` prefill (f32 pixels, int64 ids)."""
    import torch

    return {name: torch.from_numpy(np.ascontiguousarray(array)) for name, array in prompt_arrays(inputs).items()}


def mlx_kwargs(inputs: ModelInputs) -> tuple[Any, Any, Any, dict]:
    """``(input_ids, pixel_values, mask, kwargs)`` as mlx-vlm's generate prepares them from a processor's output
    (``generate/dispatch.py`` ``_prepare_generation_inputs``): ``mask`` is the processor's attention mask, every other
    output an ``mx.array`` keyword of the same dtype.

    Run the prefill with :func:`mlx_prefill`, generate's own path. ``model(input_ids, pixel_values, mask=mask,
    **kwargs)`` is not it: some families' ``__call__`` hand ``mask`` to the language model as its attention mask
    (``idefics3/idefics3.py``), where the processor's all-ones ``[1, seq]`` mask lifts causality, while others need
    it to build their image masks (``paligemma/paligemma.py`` fails without it)."""
    import mlx.core as mx

    arrays = {name: mx.array(np.ascontiguousarray(array)) for name, array in prompt_arrays(inputs).items()}
    kwargs = {name: array for name, array in arrays.items() if name not in POSITIONAL}
    return arrays["input_ids"], arrays.get("pixel_values"), arrays["attention_mask"], kwargs


def mlx_prefill(model, inputs: ModelInputs) -> Any:
    """The prefill logits ``[1, seq, vocab]`` the way mlx-vlm's generate makes them (``generate/ar.py``
    ``generate_step``): ``get_input_embeddings(input_ids, pixel_values, mask=mask, **kwargs)``, then the language
    model on those embeddings with a fresh prompt cache, the processor's other outputs and the embedding step's own
    (positions, RoPE deltas, ...) as keywords."""
    from mlx_vlm.models import cache

    input_ids, pixel_values, mask, kwargs = mlx_kwargs(inputs)
    embedded = model.get_input_embeddings(input_ids, pixel_values, mask=mask, **kwargs)
    extra = {key: value for key, value in embedded.to_dict().items() if key != "inputs_embeds" and value is not None}
    prompt_cache = cache.make_prompt_cache(model.language_model)
    output = model.language_model(
        input_ids, inputs_embeds=embedded.inputs_embeds, cache=prompt_cache, **{**kwargs, **extra}
    )
    return output.logits


def _rope(section: dict) -> None:
    """transformers 5's ``rope_parameters`` under the names mlx-vlm 0.7.10 reads: ``rope_theta``,
    ``partial_rotary_factor`` and ``rope_scaling``
    (``{type, mrope_section, ...}``, type ``mrope`` where a section is given), and for per-layer-type parameters
    (``{full_attention: {...}, sliding_attention: {...}}``) the global and local base frequencies."""
    rope = section.get("rope_parameters")
    if not isinstance(rope, dict):
        return
    if "full_attention" in rope or "sliding_attention" in rope:
        full, local = rope.get("full_attention") or {}, rope.get("sliding_attention") or {}
        if "rope_theta" in full:
            section.setdefault("rope_theta", full["rope_theta"])
            section.setdefault("rope_global_base_freq", full["rope_theta"])  # mlx-vlm gemma3/config.py
        if "rope_theta" in local:
            section.setdefault("rope_local_base_freq", local["rope_theta"])
        return
    if "rope_theta" in rope:
        section.setdefault("rope_theta", rope["rope_theta"])
        # transformers 5 reads it from rope_parameters, 1.0 where absent; mlx-vlm from the section, with defaults of its
        # own (glm4v/config.py: 0.5)
        section.setdefault("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0))
    beyond_default = set(rope) - {"rope_theta", "rope_type"} or rope.get("rope_type", "default") != "default"
    if section.get("rope_scaling") is None and beyond_default:
        scaling = {key: value for key, value in rope.items() if key != "rope_theta"}
        kind = rope.get("type") or ("mrope" if "mrope_section" in rope else rope.get("rope_type", "default"))
        section["rope_scaling"] = {**scaling, "type": kind}


def mlx_config(config: dict) -> dict:
    """The mlx-vlm 0.7.10 view of a transformers-5 config (a new dict). Generic rules, in order:

    1. RoPE under the old names (:func:`_rope`), at the top level and in ``text_config``;
    2. every ``text_config`` key the top level lacks is copied up (mlx-vlm reads text settings at the top level for
       some model types, e.g. ``qwen2_vl/config.py`` ``ModelConfig.from_dict`` builds its text config from them);
    3. every top-level setting ``text_config`` lacks is copied down (e.g. ``gemma3/gemma3.py`` reads
       ``text_config.mm_tokens_per_image``; mlx-vlm's own ``hunyuan_vl/config.py`` does the same);
    4. ``text_config.head_dim`` is ``hidden_size // num_attention_heads`` where absent, as transformers derives it
       (mlx-vlm's ``qwen3/config.py`` requires it);
    5. the placeholder ids under both of transformers' spellings (``image_token_id`` / ``image_token_index``,
       ``video_token_id`` / ``video_token_index``): transformers' configs alias them, mlx-vlm's config classes have
       both fields with their own defaults and a model reads one (e.g. ``idefics3/idefics3.py`` reads
       ``config.image_token_index`` where transformers 5 writes ``image_token_id``);
    6. the image's start and end markers under the names mlx-vlm's mrope index reads (``vision_start_token_id`` /
       ``vision_end_token_id``) where the config names them ``image_start_token_id`` / ``image_end_token_id``
       (transformers' GLM-4.1V; mlx-vlm's ``glm4v/language.py`` ``get_rope_index`` looks for
       ``vision_start_token_id``, whose default is the hub checkpoints' id).

    Then the per-model-type rules of :data:`MODEL_TYPE_RULES`. (The vision ``model_type`` is fixed in ``mlx_load``,
    where mlx-vlm's tower says whether it accepts it.)
    """
    adapted = copy.deepcopy(config)
    for kind in ("image", "video"):
        spellings = (f"{kind}_token_id", f"{kind}_token_index")
        value = next((adapted[key] for key in spellings if adapted.get(key) is not None), None)
        for key in spellings:
            if value is not None and adapted.get(key) is None:
                adapted[key] = value
    for marker in ("start", "end"):
        if adapted.get(f"image_{marker}_token_id") is not None:
            adapted.setdefault(f"vision_{marker}_token_id", adapted[f"image_{marker}_token_id"])
    text = adapted.setdefault("text_config", {})
    _rope(adapted)
    _rope(text)
    for key, value in list(text.items()):
        if key not in NOT_COPIED:
            adapted.setdefault(key, copy.deepcopy(value))
    for key, value in list(adapted.items()):
        if key not in NOT_COPIED and not key.endswith("_config"):
            text.setdefault(key, copy.deepcopy(value))
    if "head_dim" not in text and text.get("hidden_size") and text.get("num_attention_heads"):
        text["head_dim"] = int(text["hidden_size"]) // int(text["num_attention_heads"])
    rule = MODEL_TYPE_RULES.get(adapted.get("model_type"))
    if rule is not None:
        rule(adapted)
    return adapted


def _hunyuan_vl(config: dict) -> None:
    """mlx-vlm ``hunyuan_vl/language.py`` reads ``rope_scaling["xdrope_section"]`` and type ``xdrope``: the names
    transformers 5 normalizes to ``mrope_section`` (``configuration_hunyuan_vl.py``, the legacy alias)."""
    for section in (config, config["text_config"]):
        scaling = section.get("rope_scaling") or {}
        if "mrope_section" in scaling and "xdrope_section" not in scaling:
            section["rope_scaling"] = {**scaling, "xdrope_section": scaling["mrope_section"], "type": "xdrope"}


def _lfm2_vl(config: dict) -> None:
    """mlx-vlm ``lfm2/language.py`` sizes the MLP by ``MLP(dim=args.block_dim, ...)``, LFM2's legacy name of the
    hidden size (its config default 1024); transformers 5's ``Lfm2Config`` has no ``block_dim``."""
    text = config["text_config"]
    if "hidden_size" in text:
        text.setdefault("block_dim", text["hidden_size"])


#: model type -> an in-memory rule no generic one covers (each names the mlx-vlm line that needs it)
MODEL_TYPE_RULES = {"hunyuan_vl": _hunyuan_vl, "lfm2_vl": _lfm2_vl}


def _build(module, config: dict):
    from mlx_vlm import utils

    model_config = module.ModelConfig.from_dict(config)
    modules = ["text", "vision", "perceiver", "projector", "audio"]
    model_config = utils.update_module_configs(model_config, module, config, modules)
    model_config = utils.apply_generation_config_defaults(model_config, config)
    return module.Model(model_config), model_config


def mlx_skeleton(config: dict) -> tuple[Any, Any, Any, dict]:
    """mlx-vlm's model of ``config`` (its config.json) before any weight is loaded: (the model's mlx-vlm module, the
    model, its model config, the adapted config.json). When mlx-vlm's vision tower refuses the vision
    ``model_type`` transformers 5 writes (``<model_type>_vision``), it is built with the composite's ``model_type``,
    as the hub's configs name it."""
    from driftscope.model.blas import mlx_blas

    mlx_blas()  # before the first `import mlx.core`
    from mlx_vlm import utils

    adapted = mlx_config(config)
    for section in ("vision_config", "audio_config"):
        adapted.setdefault(section, {})
    module, _ = utils.get_model_and_args(config=adapted)
    try:
        model, model_config = _build(module, copy.deepcopy(adapted))
    except ValueError as err:
        vision = adapted["vision_config"]
        if "Unsupported model type" not in str(err) or vision.get("model_type") == adapted["model_type"]:
            raise
        vision["model_type"] = adapted["model_type"]
        model, model_config = _build(module, copy.deepcopy(adapted))
    return module, model, model_config, adapted


def mlx_sanitized(module: Any, model: Any, model_config: Any, weights: dict) -> dict:
    """The checkpoint's ``weights`` under mlx-vlm's names and layouts: the model's ``sanitize``, then its vision and
    language models' (``mlx_vlm.utils.load_model``'s order)."""
    from mlx_vlm import utils

    weights = utils.sanitize_weights(model, weights)
    for name, attribute in (("VisionModel", "vision_config"), ("LanguageModel", "text_config")):
        if hasattr(module, name) and hasattr(model_config, attribute):
            weights = utils.sanitize_weights(getattr(module, name), weights, getattr(model_config, attribute))
    return weights


def mlx_load(path: str | Path, config: dict) -> Any:
    """mlx-vlm's model of the checkpoint at ``path`` (``config``: its config.json), built and loaded the way
    ``mlx_vlm.utils.load_model`` does (model config, each module's ``sanitize``, strict ``load_model_weights``) from
    :func:`mlx_config` (:func:`mlx_skeleton`, :func:`mlx_sanitized`)."""
    module, model, model_config, adapted = mlx_skeleton(config)
    import mlx.core as mx
    from mlx_vlm import utils

    files = sorted(glob.glob(str(Path(path) / "*.safetensors")))
    if not files:
        raise CheckpointError(f"checkpoint {path} has no *.safetensors files", "save it with save_pretrained")
    weights: dict[str, Any] = {}
    for file in files:
        weights.update(mx.load(file))
    weights = mlx_sanitized(module, model, model_config, weights)
    utils.load_model_weights(model, adapted, weights, Path(path), strict=True)
    mx.eval(model.parameters())
    model.eval()
    # mlx-vlm's config classes keep only the fields they read: a patch correcting the port reads the checkpoint's own
    # settings here (a read-only view; a plain attribute, not a child of the module tree)
    setattr(model, CHECKPOINT_CONFIG, MappingProxyType(copy.deepcopy(config)))
    return model
