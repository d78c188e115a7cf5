"""The generic family's load audit (``families.generic.held``): each library's names read from its own published
renaming (transformers' conversion mapping, mlx-vlm's ``sanitize``), values declared by what holds them (an MLX
convolution's kernel channels-last), so a loader that transposes the wrong way is found by value.

mlx-vlm's CLIP-style towers decide whether a patch-embedding kernel still needs its transpose from its shape alone
(``check_array_shape``: ``[out, kH, kW, in]`` with ``kH == kW`` reads as already channels-last), so torch's
``[out, 3, 3, 3]`` kernel of a patch size 3 on RGB images is kept as it is: a wrong layout that loads without
error. The audit names it."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ROOT
from driftscope.capture.runtimes import get_runtime
from driftscope.families.checkpoints import open_checkpoint
from driftscope.families.generic.testers import model_types

PATCH = "vision_tower.vision_model.embeddings.patch_embedding.weight"  # the hub's name (and mlx-vlm's)


def _loaded(path, runtime: str):
    loaded = get_runtime(runtime)(open_checkpoint(path), "f32", None, {})
    loaded.load()
    return loaded


@pytest.mark.parametrize("model_type", model_types())
def test_both_libraries_hold_every_tensor_of_every_swept_checkpoint(model_type):
    path = ROOT / "fixtures" / "checkpoints" / f"generic-{model_type}"
    for name in ("transformers", "mlx"):
        runtime = _loaded(path, name)
        record = runtime.load_audit
        assert record["status"] == "pass", (name, record["findings"])
        assert record["checked"] == len(runtime.loaded_tensors()) > 20, name
        runtime.release()


@pytest.fixture(scope="module")
def patch_three(tmp_path_factory):
    """LLaVA's tester with a CLIP tower of patch size 3 on RGB (its kernel [32, 3, 3, 3] in torch's layout)."""
    from driftscope.families.generic.tiny import build_config, build_model, build_tokenizer

    config = build_config("llava", build_tokenizer("llava"))
    config.vision_config.patch_size, config.vision_config.image_size = 3, 12
    folder = tmp_path_factory.mktemp("llava-patch3")
    build_model(config, seed=0).save_pretrained(folder)
    return folder


def test_a_kernel_mlx_vlm_left_in_torchs_layout_is_named_by_value(patch_three):
    from safetensors.numpy import load_file

    stored = load_file(str(patch_three / "model.safetensors"))[PATCH]
    assert stored.shape == (32, 3, 3, 3)
    reference = _loaded(patch_three, "transformers")
    assert reference.load_audit["status"] == "pass", reference.load_audit["findings"]
    candidate = _loaded(patch_three, "mlx")
    record = candidate.load_audit
    assert record["status"] == "fail"
    (finding,) = record["findings"]
    assert finding.startswith(f"{PATCH}: ") and "values differ" in finding and "transpose" in finding
    # independently of the declaration: MLX holds torch's layout as it is, not the channels-last kernel it computes in
    held = candidate.loaded_tensors()[PATCH][2](None)
    np.testing.assert_array_equal(held, stored)
    assert not np.array_equal(held, stored.transpose(0, 2, 3, 1))


def test_the_audit_follows_the_hubs_older_names_through_transformers_renaming():
    """A LLaVA checkpoint in the hub's layout (``language_model.model.*``, ``vision_tower.vision_model.*``) is read
    under transformers' renamed names; every renamed name is one transformers holds."""
    path = ROOT / "fixtures" / "checkpoints" / "generic-llava"
    from driftscope.families.generic.held import transformers_layout

    layout = transformers_layout(open_checkpoint(path))
    runtime = _loaded(path, "transformers")
    loaded = set(runtime.loaded_tensors())
    assert layout.names and set(layout.names.values()) <= loaded
    assert any(name.startswith("language_model.") for name in layout.names)  # the hub's old names were renamed
    runtime.release()
