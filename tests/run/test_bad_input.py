"""Bad input gets a clear error naming the problem and the fix."""

import shutil
import sys

import numpy as np
import pytest
from driftscope.capture.runtimes import get_runtime
from driftscope.errors import CheckpointError, InputError, RegistryError, RuntimeUnavailableError
from driftscope.families.checkpoints import open_checkpoint, prepare_inputs
from PIL import Image


def test_checkpoint_path_missing(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist") as err:
        open_checkpoint(tmp_path / "nope")
    assert "make fixtures" in str(err.value)


def test_checkpoint_without_safetensors(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="no \\*.safetensors"):
        open_checkpoint(tmp_path)


def test_pickle_only_checkpoint_is_refused(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "qwen2_5_vl"}')
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04")
    with pytest.raises(CheckpointError, match="only pickle weights") as err:
        open_checkpoint(tmp_path)
    assert "safe_serialization=True" in str(err.value)


def test_unknown_family(tiny_checkpoint_dir, tmp_path):
    copy = tmp_path / "ck"
    shutil.copytree(tiny_checkpoint_dir, copy)
    (copy / "config.json").write_text('{"model_type": "no_such_vlm"}')  # no family folder: the generic family's,
    with pytest.raises(CheckpointError, match="not an image-text-to-text model transformers implements"):
        open_checkpoint(copy)  # which transformers must implement to be the reference
    with pytest.raises(CheckpointError, match="does not match"):
        open_checkpoint(tiny_checkpoint_dir, family="molmo2")


def test_unknown_runtime_and_policy(tiny_checkpoint):
    with pytest.raises(RegistryError, match="unknown runtime 'onnx'") as err:
        get_runtime("onnx")
    assert "mlx" in err.value.fix and "transformers" in err.value.fix
    with pytest.raises(RegistryError, match="unknown precision policy 'f8'"):
        get_runtime("mlx")(tiny_checkpoint, "f8")
    with pytest.raises(RuntimeUnavailableError, match="does not offer policy 'f16'"):
        get_runtime("transformers")(tiny_checkpoint, "f16")


def test_runtime_whose_package_is_missing(tiny_checkpoint, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlx_vlm", None)  # makes `import mlx_vlm` fail like an absent package
    runtime = get_runtime("mlx")(tiny_checkpoint, "f32")
    with pytest.raises(RuntimeUnavailableError, match="needs the package 'mlx-vlm'") as err:
        runtime.load()
    assert "pip install mlx-vlm" in err.value.fix


def test_image_missing_or_not_an_image(tiny_checkpoint, tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        prepare_inputs(tiny_checkpoint, [tmp_path / "none.png"])
    (tmp_path / "text.png").write_text("hello")
    with pytest.raises(InputError, match="not an image"):
        prepare_inputs(tiny_checkpoint, [tmp_path / "text.png"])


def test_image_below_min_pixels(tiny_checkpoint, tmp_path):
    Image.fromarray(np.zeros((40, 40, 3), dtype=np.uint8)).save(tmp_path / "small.png")
    with pytest.raises(InputError, match="below the processor's min_pixels 3136") as err:
        prepare_inputs(tiny_checkpoint, [tmp_path / "small.png"])
    assert "56x56" in err.value.fix


def test_a_multi_frame_image_is_refused_not_cut_to_its_first_frame(tiny_checkpoint, tmp_path):
    frames = [Image.fromarray(np.full((112, 112, 3), value, dtype=np.uint8)) for value in (0, 128, 255)]
    frames[0].save(tmp_path / "moving.gif", save_all=True, append_images=frames[1:], duration=100, loop=0)
    with Image.open(tmp_path / "moving.gif") as written:  # the file really holds three frames
        assert written.n_frames == 3
    with pytest.raises(InputError, match="has 3 frames") as err:
        prepare_inputs(tiny_checkpoint, [tmp_path / "moving.gif"])
    assert "pass one frame" in err.value.fix and "under 'videos'" in err.value.fix
    frames[1].save(tmp_path / "still.gif")  # a one-frame GIF still runs, converted as before
    inputs = prepare_inputs(tiny_checkpoint, [tmp_path / "still.gif"])
    assert inputs["grid_thw"].tolist() == [[1, 8, 8]]
