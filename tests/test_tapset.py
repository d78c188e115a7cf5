import json

import numpy as np
import pytest
from driftscope.errors import TapFileError
from driftscope.stages import Stage
from driftscope.tapset import TapSet, TapWriter
from safetensors.numpy import load_file, save_file


def test_round_trip_keeps_values_order_and_declarations(tmp_path):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((7, 5)).astype(np.float32)
    b = rng.standard_normal((3,)).astype(np.float16)
    with TapWriter(tmp_path / "taps", {"runtime": "test"}) as writer:
        writer.add(Stage("x.a", ("tokens", "hidden"), "window", "patch"), a)
        writer.add("x.b", b)
        writer.add("x.i", np.arange(4, dtype=np.int32))
    taps = TapSet(tmp_path / "taps")
    assert taps.stage_ids() == ["x.a", "x.b", "x.i"]
    np.testing.assert_array_equal(taps["x.a"], a)
    np.testing.assert_array_equal(taps["x.b"], b.astype(np.float32))  # stored widened, exactly
    assert taps.declaration("x.b")["native_dtype"] == "float16"
    assert taps.declaration("x.a")["token_order"] == "window"
    assert taps["x.i"].dtype == np.int64
    np.testing.assert_array_equal(taps.rows("x.a", 2, 4), a[2:4])
    # any safetensors reader reads the file
    np.testing.assert_array_equal(load_file(str(tmp_path / "taps.safetensors"))["x.a"], a)


def test_header_larger_than_the_reservation_is_rewritten(tmp_path):
    writer = TapWriter(tmp_path / "big", {"runtime": "test"}, reserve_header=64)
    arrays = {f"stage.{i}": np.full((2, 3), i, dtype=np.float32) for i in range(20)}
    for name, array in arrays.items():
        writer.add(name, array)
    taps = writer.close()
    for name, array in arrays.items():
        np.testing.assert_array_equal(taps[name], array)


def test_a_crashed_capture_is_marked_incomplete(tmp_path):
    with pytest.raises(RuntimeError):
        with TapWriter(tmp_path / "crash", {"runtime": "test"}) as writer:
            writer.add("ok", np.zeros(3, dtype=np.float32))
            raise RuntimeError("boom")
    meta = json.loads((tmp_path / "crash.json").read_text())
    assert meta["complete"] is False and "boom" in meta["error"]
    assert TapSet(tmp_path / "crash")["ok"].shape == (3,)


def test_an_external_engine_file_per_docs_tapfile_md(tmp_path):
    """What docs/tapfile.md tells an engine in another language to write: plain safetensors + JSON."""
    save_file({"vision.merger": np.ones((4, 2), dtype=np.float32)}, str(tmp_path / "engine.safetensors"))
    (tmp_path / "engine.json").write_text(
        json.dumps(
            {
                "format": "driftscope-tapset",
                "format_version": 1,
                "runtime": "my-engine",
                "stages": {"vision.merger": {"token_order": "raster", "token_unit": "merged"}},
            }
        )
    )
    taps = TapSet(tmp_path / "engine.safetensors")
    assert taps.runtime == "my-engine"
    assert taps.stage_ids() == ["vision.merger"]


def test_missing_or_inconsistent_files_say_what_to_do(tmp_path):
    with pytest.raises(TapFileError, match="sidecar .* does not exist"):
        TapSet(tmp_path / "nothing")
    save_file({"a": np.ones(2, dtype=np.float32)}, str(tmp_path / "t.safetensors"))
    (tmp_path / "t.json").write_text(json.dumps({"stages": {"a": {}, "b": {}}}))
    with pytest.raises(TapFileError, match="missing from t.safetensors"):
        TapSet(tmp_path / "t")
    (tmp_path / "bad.safetensors").write_bytes(b"not a tensor file")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(TapFileError, match="not a readable safetensors"):
        TapSet(tmp_path / "bad")


def test_a_stage_captured_twice_is_refused(tmp_path):
    writer = TapWriter(tmp_path / "twice", {})
    writer.add("a", np.zeros(1, dtype=np.float32))
    with pytest.raises(TapFileError, match="captured twice"):
        writer.add("a", np.zeros(1, dtype=np.float32))
    writer.close()
