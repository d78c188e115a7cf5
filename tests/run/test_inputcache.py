"""The inputs cache (run.inputcache): every family's real processor and tokenizer on its tiny fixture, stored, then
reused with the same arrays, prompt ids, digest and summary as a fresh ``prepare_inputs``; missed when an image's
bytes, the prompt or a processor file change; a corrupt entry refused and the inputs prepared again; and a second
``driftscope run`` in a fresh process reaching its first capture without importing torch or transformers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, write_params
from driftscope.families import FAMILIES, get_family
from driftscope.families.checkpoints import open_checkpoint, prepare_inputs
from driftscope.run.inputcache import ENTRY, TENSORS, cached_inputs, encode, identity
from driftscope.run.refcache import ENV

CHECKER = ROOT / "fixtures" / "images" / "checkerboard_140.png"
TEXT = {"prompt": "Name every shape.", "max_new_tokens": 4, "expect": ["red"]}


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv(ENV, str(root))
    return root


def fresh(checkpoint, images, text=TEXT):
    """The inputs straight from the family's processor and tokenizer, no cache involved."""
    inputs = prepare_inputs(checkpoint, images)
    if text:
        inputs.text = get_family(checkpoint.family).text_inputs(checkpoint, inputs, **text)
    return inputs


def _json(value):
    return json.loads(json.dumps(value, sort_keys=True))


def assert_same(got, expected) -> None:
    """Every field equal: each array's name (in order), dtype, shape and values; the text side's too."""
    assert list(got.arrays) == list(expected.arrays)
    for name, array in expected.arrays.items():
        assert got[name].dtype == array.dtype and got[name].shape == array.shape, name
        np.testing.assert_array_equal(got[name], array)
    assert got.image_tokens.dtype == expected.image_tokens.dtype
    np.testing.assert_array_equal(got.image_tokens, expected.image_tokens)
    assert got.image_sizes == expected.image_sizes and got.image_paths == expected.image_paths
    assert _json(got.facts) == _json(expected.facts) and got.headline == expected.headline
    assert got.warnings == expected.warnings and got.video_paths == expected.video_paths
    assert (got.text is None) == (expected.text is None)
    if expected.text is not None:
        for field in ("input_ids", "token_types"):
            a, b = getattr(got.text, field), getattr(expected.text, field)
            assert (a is None) == (b is None), field
            if b is not None:
                assert a.dtype == b.dtype
                np.testing.assert_array_equal(a, b)
        for field in ("image_token_id", "prompt", "max_new_tokens", "expect", "video_token_id", "position_grids"):
            assert getattr(got.text, field) == getattr(expected.text, field), field
    assert got.digest == expected.digest
    assert json.dumps(got.summary(), sort_keys=True) == json.dumps(expected.summary(), sort_keys=True)


@pytest.mark.parametrize("name", sorted(FAMILIES.names()))
def test_a_miss_then_a_hit_gives_what_the_processor_gives(name, tiny, cache):
    checkpoint = tiny(name)[0]
    images = list(get_family(name).tiny.images)
    expected = fresh(checkpoint, images)
    lines = []
    stored, outcome = cached_inputs(checkpoint, images, [], TEXT, lines.append, {"commit": "abc"})
    assert outcome["status"] == "stored" and outcome["stored"]["commit"] == "abc" and outcome["prepared_s"] > 0
    assert Path(outcome["entry"]).parent == cache / "inputs" and (Path(outcome["entry"]) / TENSORS).exists()
    assert_same(stored, expected)
    reused, again = cached_inputs(checkpoint, images, [], TEXT, lines.append)
    assert again["status"] == "hit" and again["key"] == outcome["key"] and again["stored"] == outcome["stored"]
    assert any("reused the prepared inputs" in line for line in lines)
    assert_same(reused, expected)
    reused.arrays[next(iter(reused.arrays))][...] = 0  # a run may change its copy: the arrays are its own


def test_videos_are_cached_with_the_images(tiny, cache):
    """A video (a folder of frames) packed after an image, in every family that takes videos."""
    video = ROOT / "fixtures" / "videos" / "shapes_4f"
    names = [name for name in sorted(FAMILIES.names()) if get_family(name).videos]
    assert names
    for name in names:
        checkpoint = tiny(name)[0]
        expected = prepare_inputs(checkpoint, [CHECKER], [video])
        expected.text = get_family(name).text_inputs(checkpoint, expected, **TEXT)
        _, outcome = cached_inputs(checkpoint, [CHECKER], [video], TEXT, print)
        reused, again = cached_inputs(checkpoint, [CHECKER], [video], TEXT, print)
        assert (outcome["status"], again["status"]) == ("stored", "hit"), name
        assert reused.video_paths == [str(video)] and reused.text.video_token_id is not None
        assert_same(reused, expected)
        for field in ("time_intervals", "second_per_grid_ts"):
            assert getattr(reused.text, field) == getattr(expected.text, field), field


def test_a_changed_image_byte_prompt_or_processor_file_misses(tiny_checkpoint_dir, tmp_path, cache):
    from PIL import Image

    checkpoint_dir = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint_dir, checkpoint_dir)
    checkpoint = open_checkpoint(checkpoint_dir)
    image = tmp_path / "image.png"
    shutil.copyfile(CHECKER, image)
    first, outcome = cached_inputs(checkpoint, [image], [], TEXT, print)
    keys = {outcome["key"]}

    with Image.open(image) as handle:  # one pixel's value changes: the file's bytes and the pixels
        pixels = np.asarray(handle.convert("RGB")).copy()
    pixels[0, 0, 0] ^= 0xFF
    Image.fromarray(pixels).save(image)
    changed, outcome = cached_inputs(checkpoint, [image], [], TEXT, print)
    assert outcome["status"] == "stored" and outcome["key"] not in keys
    keys.add(outcome["key"])
    assert changed.digest != first.digest
    assert_same(changed, fresh(checkpoint, [image]))

    other = {**TEXT, "prompt": "What colour is the square?"}
    prompted, outcome = cached_inputs(checkpoint, [image], [], other, print)
    assert outcome["status"] == "stored" and outcome["key"] not in keys
    keys.add(outcome["key"])
    assert_same(prompted, fresh(checkpoint, [image], other))
    assert not np.array_equal(prompted.text.input_ids, changed.text.input_ids)

    config = checkpoint_dir / "preprocessor_config.json"
    data = json.loads(config.read_text())
    data["image_mean"] = [0.25, 0.25, 0.25]
    config.write_text(json.dumps(data))
    normalized, outcome = cached_inputs(checkpoint, [image], [], other, print)
    assert outcome["status"] == "stored" and outcome["key"] not in keys
    assert not np.array_equal(normalized["pixel_values"], prompted["pixel_values"])
    assert_same(normalized, fresh(checkpoint, [image], other))

    # every processor-side file is in the key: the chat template and the tokenizer's config too, not the weights
    before = identity(checkpoint, [image], [], other)
    for name in ("chat_template.jinja", "tokenizer_config.json", "tokenizer.json", "config.json"):
        assert name in before["checkpoint_files"], name
    assert "model.safetensors" not in before["checkpoint_files"]
    with open(checkpoint_dir / "chat_template.jinja", "a") as handle:
        handle.write(" ")
    assert identity(checkpoint, [image], [], other) != before


def test_a_corrupt_entry_is_refused_and_the_inputs_prepared_again(tiny_checkpoint, cache):
    from safetensors.numpy import load, save

    expected = fresh(tiny_checkpoint, [CHECKER])
    _, outcome = cached_inputs(tiny_checkpoint, [CHECKER], [], TEXT, print)
    entry = Path(outcome["entry"])

    def again():
        lines = []
        inputs, outcome = cached_inputs(tiny_checkpoint, [CHECKER], [], TEXT, lines.append)
        assert_same(inputs, expected)
        return outcome, lines

    data = bytearray((entry / TENSORS).read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit of the pixel values
    (entry / TENSORS).write_bytes(bytes(data))
    outcome, lines = again()
    assert outcome["status"] == "stored" and "SHA-256" in outcome["refused"]
    assert any(line.startswith(f"refusing the cached inputs in {entry}") for line in lines)
    assert again()[0]["status"] == "hit"

    # a tensor file whose recorded size and SHA-256 were updated to match: the record's seal no longer holds
    tensors = load((entry / TENSORS).read_bytes())
    tensors["arrays/pixel_values"] = tensors["arrays/pixel_values"] + np.float32(1e-3)
    data = save(tensors)
    record = json.loads((entry / ENTRY).read_text())
    import hashlib

    record["tensors"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (entry / TENSORS).write_bytes(data)
    (entry / ENTRY).write_text(json.dumps(record))
    outcome, _ = again()
    assert outcome["status"] == "stored" and "seal" in outcome["refused"]

    (entry / ENTRY).write_text((entry / ENTRY).read_text()[:100])  # a truncated record
    outcome, _ = again()
    assert outcome["status"] == "stored" and "unreadable" in outcome["refused"]
    (entry / TENSORS).unlink()
    outcome, _ = again()
    assert outcome["status"] == "stored" and "missing" in outcome["refused"]
    assert again()[0]["status"] == "hit"


def test_49_5_inputs_rewritten_with_every_digest_their_record_holds_are_refused(tiny_checkpoint, cache):
    """Other pixel values and, to match them, the recorded size, SHA-256, inputs digest and summary: only the
    record's seal (a key outside the cache) tells, and the entry is refused."""
    import hashlib

    from driftscope.run.inputcache import decode
    from safetensors.numpy import load, save

    expected = fresh(tiny_checkpoint, [CHECKER])
    _, outcome = cached_inputs(tiny_checkpoint, [CHECKER], [], TEXT, print)
    entry = Path(outcome["entry"])
    tensors = load((entry / TENSORS).read_bytes())
    tensors["arrays/pixel_values"] = tensors["arrays/pixel_values"] + np.float32(0.25)
    data = save(tensors)
    record = json.loads((entry / ENTRY).read_text())
    forged = decode(load(data), record["inputs"])
    record.update(
        tensors={"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()},
        digest=forged.digest,
        summary=json.loads(json.dumps(forged.summary(), sort_keys=True, default=str)),
    )
    (entry / TENSORS).write_bytes(data)
    (entry / ENTRY).write_text(json.dumps(record))
    inputs, outcome = cached_inputs(tiny_checkpoint, [CHECKER], [], TEXT, print)
    assert outcome["status"] == "stored" and "seal" in outcome.get("refused", ""), outcome
    assert_same(inputs, expected)


def test_inputs_json_cannot_hold_are_not_stored_and_the_cache_can_be_off(tiny_checkpoint, monkeypatch, tmp_path):
    inputs = fresh(tiny_checkpoint, [CHECKER], None)
    inputs.facts["patches"] = np.int64(inputs.facts["patches"])  # a numpy scalar would come back as an int
    with pytest.raises(TypeError):
        encode(inputs)
    inputs.facts["patches"] = float("nan")
    with pytest.raises(ValueError):
        encode(inputs)
    monkeypatch.setenv(ENV, "off")
    got, outcome = cached_inputs(tiny_checkpoint, [CHECKER], [], None, print)
    assert outcome is None
    assert_same(got, fresh(tiny_checkpoint, [CHECKER], None))


def test_a_run_and_a_second_reach_their_first_capture_without_torch_or_transformers(tmp_path):
    """Two ``driftscope run``s of one parameter file in fresh processes, as a user starts them (the default cache
    under ``$DRIFTSCOPE_CACHE``): the second reuses the inputs and the reference's taps; neither torch nor
    transformers is imported when either run's first capture is logged, nor before the second's MLX candidate
    loads.

    Their environment lacks ``$DRIFTSCOPE_REFERENCE_CACHE``, which the suite sets for every other test: an unset
    variable once crashed every user's run at the reference's capture while the suite passed. The first run
    completes and stores the reference in ``$DRIFTSCOPE_CACHE/reference``."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from startup import PROBE, probe_command

    params = write_params(
        tmp_path / "p.yaml",
        "warm",
        ["transformers:f32", "mlx:f32"],
        notebooks=[],
        text={"prompt": "Name every shape.", "max_new_tokens": 2},
    )
    env = {k: v for k, v in os.environ.items() if k != ENV}
    env.update(DRIFTSCOPE_CACHE=str(tmp_path / "cache"), PYTHONPATH=str(ROOT / "lib"))
    reports, probed = [], []
    for run in ("cold", "warm"):
        out = tmp_path / run
        done = subprocess.run(
            probe_command(["run", str(params), "--out", str(out)]),
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        reports.append(json.loads((out / "report.json").read_text()))
        lines = [line.removeprefix(PROBE).partition(" | ") for line in done.stdout.splitlines()]
        probed.append([(set(names.split()) - {"-"}, message.strip()) for names, _, message in lines if names])
    cold, warm = reports
    assert cold["status"] == "complete" and cold["reference_cache"]["status"] == "stored"
    assert Path(cold["reference_cache"]["entry"]).is_relative_to(tmp_path / "cache" / "reference")
    assert cold["inputs"]["cache"]["status"] == "stored" and warm["inputs"]["cache"]["status"] == "hit"
    assert Path(warm["inputs"]["cache"]["entry"]).is_relative_to(tmp_path / "cache" / "reference" / "inputs")
    assert warm["reference_cache"]["status"] == "hit"
    assert {k: v for k, v in warm["inputs"].items() if k != "cache"} == {
        k: v for k, v in cold["inputs"].items() if k != "cache"
    }
    assert warm["verdict"]["status"] == cold["verdict"]["status"] == "pass"
    from driftscope.run.report_schema import schema_problem

    assert schema_problem(warm) is None and schema_problem(cold) is None
    damaged = json.loads(json.dumps(warm))
    damaged["inputs"]["cache"]["status"] = "maybe"
    assert "['inputs']['cache']['status']" in schema_problem(damaged)

    def imported_at(lines, prefix):
        return next(names for names, message in lines if message.startswith(prefix))

    # a cold run too: the inputs are prepared in NumPy and PIL (qwen_shared.image_processor, the tokenizer file)
    assert imported_at(probed[0], "capture transformers:f32") == set()
    assert imported_at(probed[1], "capture transformers:f32") == set()
    assert not {"torch", "transformers"} & imported_at(probed[1], "capture mlx:f32")
