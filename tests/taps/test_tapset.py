import json

import numpy as np
import pytest
from driftscope.errors import TapFileError
from driftscope.taps.stages import Stage
from driftscope.taps.tapset import TapSet, TapWriter
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


def test_rows_into_reads_any_stored_dtype_into_a_reused_buffer(tmp_path):
    rng = np.random.default_rng(1)
    stored = {
        "f32": rng.standard_normal((9, 4, 3)).astype(np.float32),
        "f64": rng.standard_normal((5, 2)),
        "i64": np.arange(12).reshape(6, 2),
        "bool": rng.random((7, 3)) > 0.5,
    }
    with TapWriter(tmp_path / "taps", {"runtime": "test"}) as writer:
        for name, array in stored.items():
            writer.add(name, array)
    taps = TapSet(tmp_path / "taps")
    buffer = np.empty(1024, dtype=np.uint8)
    for name, array in stored.items():
        for start, stop in ((0, 2), (2, 5), (4, array.shape[0])):
            got = taps.rows_into(name, start, stop, buffer)
            assert got.dtype == array.dtype and got.base is not None  # a view of the caller's buffer
            np.testing.assert_array_equal(got, array[start:stop])
    with pytest.raises(ValueError, match="cannot hold"):
        taps.rows_into("f32", 0, 9, np.empty(8, dtype=np.uint8))
    # a tensor file cut short after it was opened: the read says which stage it ends inside
    data = (tmp_path / "taps.safetensors").read_bytes()
    (tmp_path / "taps.safetensors").write_bytes(data[: len(data) - 10])
    with pytest.raises(TapFileError, match="ends inside stage 'bool'"):
        taps.rows_into("bool", 0, 7, buffer)


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
    sidecar = {"format": "driftscope-tapset", "format_version": 1, "runtime": "engine", "stages": {"a": {}, "b": {}}}
    (tmp_path / "t.json").write_text(json.dumps(sidecar))
    with pytest.raises(TapFileError, match="missing from t.safetensors"):
        TapSet(tmp_path / "t")
    (tmp_path / "bad.safetensors").write_bytes(b"not a tensor file")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(TapFileError, match="not a readable safetensors"):
        TapSet(tmp_path / "bad")


def test_a_stage_captured_twice_is_refused(tmp_path):
    writer = TapWriter(tmp_path / "twice", {"runtime": "test"})
    writer.add("a", np.zeros(1, dtype=np.float32))
    with pytest.raises(TapFileError, match="captured twice"):
        writer.add("a", np.zeros(1, dtype=np.float32))
    writer.close()
