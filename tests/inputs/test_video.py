"""Video inputs: frames read from an animated GIF or a folder of PNGs, the Qwen video processor built from the
PIL image processor (held against transformers' own image processor on still frames), parameter parsing, and
the refusals that name the fix."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ROOT
from driftscope.errors import InputError, ParameterError
from driftscope.families import get_family
from driftscope.families.checkpoints import open_checkpoint, prepare_inputs
from driftscope.families.qwen_shared.processor import load_image_processor
from driftscope.families.qwen_shared.video import patchify_video
from driftscope.inputs.video import load_video
from driftscope.run.params import parse_parameters
from make_videos import make_all, moving_frames
from PIL import Image

VIDEOS = ROOT / "fixtures" / "videos"
GIF = VIDEOS / "shapes_4f.gif"
FOLDER = VIDEOS / "shapes_4f"
QWEN = ("qwen2_5_vl", "qwen3_vl")


def _checkpoint(name: str):
    return open_checkpoint(get_family(name).tiny.ensure())


def test_the_committed_videos_are_what_the_script_writes(tmp_path):
    written = make_all(tmp_path)
    assert written["shapes_4f.gif"].read_bytes() == GIF.read_bytes()
    for frame in sorted(written["shapes_4f"].iterdir()):
        assert frame.read_bytes() == (FOLDER / frame.name).read_bytes(), frame.name


def test_a_gif_and_a_folder_of_frames_give_the_same_frames_in_order():
    gif, folder = load_video(GIF), load_video(FOLDER)
    assert len(gif.frames) == len(folder.frames) == 4 and gif.size == folder.size == (224, 224)
    assert gif.fps == 4.0 and folder.fps is None  # 250 ms per GIF frame; a folder states no rate
    drawn = [np.asarray(frame) for frame in moving_frames()]
    for k in range(4):  # four colours: the GIF palette keeps them exactly
        np.testing.assert_array_equal(np.asarray(gif.frames[k].convert("RGB")), drawn[k])
        np.testing.assert_array_equal(np.asarray(folder.frames[k].convert("RGB")), drawn[k])
    assert not np.array_equal(drawn[0], drawn[1])  # the drawing moves


@pytest.mark.parametrize("name", QWEN)
def test_identical_frames_give_transformers_image_processor_output(name, tmp_path):
    """A still image is a video of temporal_patch_size identical frames: transformers' image processor (an
    independent implementation) must give the same patches and grid as the video path."""
    checkpoint = _checkpoint(name)
    frame = moving_frames()[1]
    frame.save(tmp_path / "still.png")
    (tmp_path / "clip").mkdir()
    for k in range(2):
        frame.save(tmp_path / "clip" / f"frame_{k}.png")
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(str(checkpoint.path), backend="pil")  # transformers' own
    expected = processor(images=[frame], do_resize=False, return_tensors="np")
    video = prepare_inputs(checkpoint, [], [tmp_path / "clip"])
    assert video["grid_thw"].tolist() == np.asarray(expected["image_grid_thw"]).tolist()
    np.testing.assert_array_equal(video["pixel_values"], np.asarray(expected["pixel_values"], dtype=np.float32))


def test_patchify_puts_two_frames_in_each_temporal_patch_and_pads_with_the_last():
    frames = np.arange(3 * 3 * 4 * 4, dtype=np.float32).reshape(3, 3, 4, 4)  # 3 frames, C=3, 4x4 px
    patches, grid = patchify_video(frames, patch=2, merge=1, temporal=2)
    assert grid == [2, 2, 2]  # 3 frames -> 2 temporal patches (the last frame repeated)
    rows = patches.reshape(2, 2, 2, 3, 2, 2, 2)  # t, h, w, C, temporal, p, p
    np.testing.assert_array_equal(rows[0, 1, 0, :, 0], frames[0, :, 2:4, 0:2])  # frame 0, patch (1, 0)
    np.testing.assert_array_equal(rows[0, 1, 0, :, 1], frames[1, :, 2:4, 0:2])  # frame 1, same patch
    np.testing.assert_array_equal(rows[1, 0, 1, :, 0], frames[2, :, 0:2, 2:4])
    np.testing.assert_array_equal(rows[1, 0, 1, :, 1], frames[2, :, 0:2, 2:4])  # padded: frame 2 again


@pytest.mark.parametrize("name", QWEN)
def test_videos_pack_after_the_images_as_grids_with_time(name):
    checkpoint = _checkpoint(name)
    image = prepare_inputs(checkpoint, [ROOT / "fixtures" / "images" / "shapes_224.png"])
    both = prepare_inputs(checkpoint, [ROOT / "fixtures" / "images" / "shapes_224.png"], [GIF, FOLDER])
    side = 224 // int(load_image_processor(checkpoint).patch_size)  # neither family resizes 224 px frames
    assert both["grid_thw"].tolist() == [*image["grid_thw"].tolist(), [2, side, side], [2, side, side]]
    np.testing.assert_array_equal(both["pixel_values"][: len(image["pixel_values"])], image["pixel_values"])
    video_rows = 2 * side * side
    np.testing.assert_array_equal(
        both["pixel_values"][-2 * video_rows : -video_rows], both["pixel_values"][-video_rows:]
    )
    assert both.image_tokens.tolist()[1:] == [video_rows // 4] * 2
    facts = both.summary()["videos"]
    assert [fact["frames"] for fact in facts] == [4, 4] and facts[0]["fps"] == 4.0
    assert facts[0]["bounds"]["from"].startswith("preprocessor_config.json")


def test_molmo2_refuses_videos_naming_the_families_that_take_them():
    checkpoint = _checkpoint("molmo2")
    with pytest.raises(InputError, match="model family 'molmo2' takes no video input") as err:
        prepare_inputs(checkpoint, [ROOT / "fixtures" / "images" / "shapes_224.png"], [GIF])
    assert "qwen2_5_vl" in err.value.fix and "qwen3_vl" in err.value.fix and "under 'images'" in err.value.fix


def test_bad_videos_are_refused_with_the_fix(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_video(tmp_path / "missing.gif")
    (tmp_path / "clip.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42")
    with pytest.raises(InputError, match="is a .mp4 container") as err:
        load_video(tmp_path / "clip.mp4")
    assert "ffmpeg -i" in err.value.fix
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="holds no frame images"):
        load_video(tmp_path / "empty")
    (tmp_path / "one").mkdir()
    Image.new("RGB", (64, 64)).save(tmp_path / "one" / "frame_0.png")
    with pytest.raises(InputError, match="has one frame") as err:
        load_video(tmp_path / "one")
    assert "under 'images'" in err.value.fix
    Image.new("RGB", (64, 32)).save(tmp_path / "one" / "frame_1.png")
    with pytest.raises(InputError, match="frames of different sizes"):
        load_video(tmp_path / "one")


def test_the_parameter_file_takes_videos_without_images_and_with_text(tmp_path):
    base = {"checkpoint": "x", "runtimes": ["transformers", "mlx"], "videos": ["fixtures/videos/shapes_4f.gif"]}
    params = parse_parameters(base, base=ROOT)
    assert params.images == [] and params.videos == [GIF]
    assert params.to_dict()["videos"] == ["fixtures/videos/shapes_4f.gif"]
    assert "videos" not in parse_parameters({**base, "videos": [], "images": ["a.png"]}, base=ROOT).to_dict()
    assert parse_parameters({**base, "text": True}, base=ROOT).videos == [GIF]  # the text side places them
    with pytest.raises(ParameterError, match="videos must be list"):
        parse_parameters({**base, "videos": "fixtures/videos/shapes_4f.gif"}, base=ROOT)
    with pytest.raises(ParameterError, match="has no 'images'"):
        parse_parameters({"checkpoint": "x", "runtimes": ["transformers", "mlx"]}, base=ROOT)


@pytest.mark.parametrize("name", QWEN)
def test_a_video_preprocessor_config_sets_the_bounds_and_each_family_resizes_by_its_own_rule(name, tmp_path):
    """Bounds of 128x128 pixels: Qwen2-VL's rule holds each frame to them, Qwen3-VL's all frames together."""
    import json

    source = get_family(name).tiny.ensure()
    for path in source.iterdir():
        (tmp_path / path.name).symlink_to(path)
    (tmp_path / "video_preprocessor_config.json").write_text(
        json.dumps({"size": {"shortest_edge": 64 * 64, "longest_edge": 128 * 128}})
    )
    checkpoint = open_checkpoint(tmp_path)
    (fact,) = prepare_inputs(checkpoint, [], [GIF]).summary()["videos"]
    assert fact["bounds"] == {"min_pixels": 64 * 64, "max_pixels": 128 * 128, "from": "video_preprocessor_config.json"}
    factor = 28 if name == "qwen2_5_vl" else 32
    if name == "qwen2_5_vl":
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        expected = smart_resize(224, 224, factor, 64 * 64, 128 * 128)
    else:
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize

        expected = smart_resize(4, 224, 224, 2, factor, 64 * 64, 128 * 128)
    assert fact["resized"] == list(expected) and fact["resized"][0] < 224
    assert fact["grid_thw"] == [2, expected[0] * 2 // factor, expected[1] * 2 // factor]


def test_49_13_a_video_too_small_for_the_processor_is_treated_as_an_image_of_that_size_would_be(tmp_path):
    """Frames of 1x1 (and 20x20) were upscaled silently while a 1x1 image was refused (Qwen2.5-VL) or its upscale
    recorded (Qwen3-VL, whose processor upscales by design): a video now follows its family's rule for images."""
    for side in (1, 20):
        frames = [Image.new("RGB", (side, side), (40 * i, 9, 9)) for i in range(4)]
        video = tmp_path / f"tiny-{side}.gif"
        frames[0].save(video, save_all=True, append_images=frames[1:], duration=100, loop=0)
        image = tmp_path / f"tiny-{side}.png"
        frames[0].save(image)
        qwen25 = _checkpoint("qwen2_5_vl")
        with pytest.raises(InputError, match="below the processor's min_pixels"):
            prepare_inputs(qwen25, [image])
        with pytest.raises(InputError, match=f"frames are {side}x{side} .* would upscale them") as err:
            prepare_inputs(qwen25, [], [video])
        assert "min_pixels" in err.value.fix
        inputs = prepare_inputs(_checkpoint("qwen3_vl"), [], [video])
        (fact,) = inputs.facts["videos"]
        assert fact["upscaled_by_min_pixels"].startswith(f"{side}x{side} -> ")
        assert "upscaled by min_pixels" in inputs.headline
    assert "upscaled_by_min_pixels" not in prepare_inputs(_checkpoint("qwen3_vl"), [], [GIF]).facts["videos"][0]
