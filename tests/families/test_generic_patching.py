"""What the generic family's ready patches are written with: the checkpoint's own config beside mlx-vlm's model, MLX
activations computing transformers' by name (checked against transformers' ``ACT2FN``), and a module's methods
changed in place, its identity and path kept."""

from __future__ import annotations

import numpy as np
import pytest
from driftscope.errors import HypothesisPatchError
from driftscope.families.generic.patching import ACTIVATIONS, checkpoint_config, mlx_activation, mlx_methods


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_an_mlx_activation_computes_transformers_one_of_that_name(name):
    import mlx.core as mx
    import torch
    from transformers.activations import ACT2FN

    x = np.linspace(-8, 8, 4001, dtype=np.float32)
    expected = ACT2FN[name](torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.array(mlx_activation(name, "test")(mx.array(x))), expected, atol=2e-6, rtol=0)


def test_an_activation_mlx_has_no_match_for_is_refused_by_name():
    with pytest.raises(HypothesisPatchError, match="no MLX activation for transformers' 'laplace'"):
        mlx_activation("laplace", "some_patch")


def test_mlx_vlm_models_the_generic_loader_made_keep_the_checkpoint_config_for_patches():
    """mlx-vlm's LLaVA text config drops ``hidden_act``; the loader keeps the checkpoint's config beside the model, as
    a plain attribute (no parameter, no module of the tree)."""
    import json

    from driftscope.families.generic.calls import mlx_load
    from make_generic_tinies import ensure

    folder = ensure("llava")
    config = json.loads((folder / "config.json").read_text())
    model = mlx_load(folder, config)
    assert not hasattr(model.config.text_config, "hidden_act")
    kept = checkpoint_config(model, "test")
    assert kept == config and kept["text_config"]["hidden_act"] == "gelu"
    assert "driftscope_checkpoint_config" not in model  # not in the module tree (parameters, children)
    with pytest.raises(HypothesisPatchError, match="was not loaded with"):
        checkpoint_config(type(model).__new__(type(model)), "some_patch")


def test_a_module_given_new_methods_keeps_its_identity_path_and_children():
    import mlx.core as mx
    import mlx.nn as nn

    model = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
    inner = model.layers[0]
    before = dict(model.named_modules())
    mlx_methods(inner, __call__=lambda self, x: 2 * nn.Linear.__call__(self, x), doubled=lambda self: True)
    after = dict(model.named_modules())
    assert after.keys() == before.keys() and all(after[path] is before[path] for path in before)
    assert isinstance(inner, nn.Linear) and inner.doubled() and type(inner).patched_from is nn.Linear
    x = mx.array([[1.0, -2.0]])
    np.testing.assert_allclose(np.array(inner(x)), 2 * np.array(x @ inner.weight.T + inner.bias), rtol=1e-6)
