"""The tap file's background writer (``taps.background``): the same file as inline writes, bounded bytes in
flight, and a failed write raised as the capture's error (no hang, nothing kept under the TapSet's name)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from driftscope.capture.runtimes import get_runtime
from driftscope.errors import ParameterError, TapFileError
from driftscope.taps.background import BackgroundWrites
from driftscope.taps.tapset import TapSet, tap_paths

ROOT = Path(__file__).resolve().parents[2]


def test_a_capture_writes_the_same_tapset_inline_and_from_the_writer_thread(tiny, tmp_path):
    """The tiny fixture's whole plan with four text tokens (vision stages, text stages, the decode's rows and
    the KV cache): the tensor files are byte for byte the same, and so is every array."""
    checkpoint, inputs, plan = tiny("qwen2_5_vl")
    runtime = get_runtime("transformers")(checkpoint, "f32")
    taps = {}
    for writes in ("inline", "background"):
        runtime.options["tap_writes"] = writes
        taps[writes] = runtime.capture(inputs, plan, tmp_path / writes)
    runtime.release()
    inline, background = taps["inline"], taps["background"]
    assert len(inline.stage_ids()) > 100 and any(s.startswith("text.forced") for s in inline.stage_ids())
    assert background.stage_ids() == inline.stage_ids()
    for stage_id in inline.stage_ids():
        assert background.stored_dtype(stage_id) == inline.stored_dtype(stage_id), stage_id
        assert np.array_equal(background[stage_id], inline[stage_id]), stage_id
    assert tap_paths(tmp_path / "background")[0].read_bytes() == tap_paths(tmp_path / "inline")[0].read_bytes()
    assert background.meta["stages"] == inline.meta["stages"]


def test_an_unknown_tap_writes_value_is_refused_naming_the_choices(tiny_checkpoint):
    with pytest.raises(ParameterError, match="tap_writes='async' is not a value") as err:
        get_runtime("transformers")(tiny_checkpoint, "f32", options={"tap_writes": "async"})
    assert "background" in str(err.value) and "inline" in str(err.value)


def test_the_bytes_in_flight_are_bounded(tmp_path):
    """Writing into a pipe nobody reads: the writer thread blocks, ``submit`` waits once the limit is handed
    over, and goes on as soon as the reader drains the pipe."""
    read_end, write_end = os.pipe()
    handle = os.fdopen(write_end, "wb", buffering=0)
    writes = BackgroundWrites(handle, limit=1 << 20)
    chunk = np.arange(1 << 17, dtype=np.float32)  # 512 KiB
    writes.submit(chunk.copy())  # the thread takes it and blocks in the pipe (64 KiB)
    writes.submit(chunk.copy())  # 1 MiB handed over: at the limit
    done = threading.Event()
    threading.Thread(target=lambda: (writes.submit(chunk.copy()), done.set()), daemon=True).start()
    assert not done.wait(0.5), "submit went past the limit"
    received = bytearray()
    while len(received) < 3 * chunk.nbytes:
        received += os.read(read_end, 1 << 20)
    assert done.wait(10)
    writes.drain()
    writes.stop()
    handle.close()
    os.close(read_end)
    assert bytes(received) == chunk.tobytes() * 3


_LIMITED = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit a write fails with EFBIG instead of a signal
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, resource.RLIM_INFINITY))
"""

_FAILING_WRITER = (
    _LIMITED
    + """
import numpy as np
from pathlib import Path
from driftscope.errors import OutputError
from driftscope.taps.tapset import TapWriter

writer = TapWriter(Path(sys.argv[1]) / "taps", {"runtime": "test"}, writes=sys.argv[2])
try:
    for index in range(100):
        writer.add(f"stage.{index}", np.full((64, 64), index, dtype=np.float32))  # 16 KiB each
    writer.close()
except OutputError as err:
    print("OutputError", err.errno, "stages handed over:", index, err)
"""
)

_FAILING_CAPTURE = (
    """
import sys
from pathlib import Path
from driftscope.capture.runtimes import get_runtime
from driftscope.errors import OutputError
from driftscope.families import get_family
from driftscope.families.checkpoints import open_checkpoint
from driftscope.taps.stages import StageSelection

family = get_family("qwen2_5_vl")
checkpoint = open_checkpoint(family.tiny.ensure())
inputs = family.prepare_inputs(checkpoint, list(family.tiny.images))
plan = family.vision_plan(checkpoint.config).select(StageSelection.everything())
runtime = get_runtime("transformers")(checkpoint, "f32", options={"tap_writes": sys.argv[2]})
runtime.load()
"""
    + _LIMITED
    + """
try:
    runtime.capture(inputs, plan, Path(sys.argv[1]) / "taps")
except OutputError as err:
    print("OutputError", err.errno, err)
"""
)


def _fails(script: str, folder: Path, writes: str) -> str:
    """Run ``script`` in a fresh process under a 200 kB file size limit; what it printed."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "lib")}
    done = subprocess.run(
        [sys.executable, "-c", script, str(folder), writes], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.parametrize("writes", ["background", "inline"])
def test_a_failed_write_is_the_writers_error_and_leaves_no_file(writes, tmp_path):
    """A real write failure (the process's file size limit: EFBIG once the file passes 200 kB) raises the disk's
    error naming the file from ``add`` or ``close`` (the writer thread's failure reaches the caller, no hang);
    no TapSet under its name and no partial file are left."""
    out = _fails(_FAILING_WRITER, tmp_path, writes)
    assert out.startswith("OutputError 27 stages handed over:"), out  # 27: EFBIG
    assert "taps.safetensors" in out and "free space" in out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("writes", ["background", "inline"])
def test_a_failed_write_is_the_captures_error_and_leaves_no_tapset(writes, tmp_path):
    """The same failure inside a transformers capture of the tiny fixture: the capture raises it, nothing kept."""
    out = _fails(_FAILING_CAPTURE, tmp_path, writes)
    assert out.startswith("OutputError 27 "), out
    assert "taps.safetensors" in out and "free space" in out
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_is_raised_once_then_the_writer_is_closed(tmp_path):
    """Straight on the writer: a write that fails (a closed pipe: EPIPE) is raised by the next submit or drain,
    never swallowed, and the thread has ended."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    handle = os.fdopen(write_end, "wb", buffering=0)
    writes = BackgroundWrites(handle, limit=1 << 20)
    writes.submit(np.zeros(1024, dtype=np.float32))
    with pytest.raises(BrokenPipeError):
        for _ in range(100):  # the first write fails in the thread; a later submit or the drain raises it
            writes.submit(np.zeros(1024, dtype=np.float32))
            time.sleep(0.01)
        writes.drain()
    assert isinstance(writes.failed, BrokenPipeError)
    writes.stop()
    handle.close()


def test_an_abandoned_capture_file_is_removed_with_its_writer(tmp_path):
    from driftscope.taps.tapset import TapWriter

    writer = TapWriter(tmp_path / "gone", {"runtime": "test"})
    writer.add("a", np.zeros((256, 256), dtype=np.float32))
    writer.abandon()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(TapFileError, match="does not exist"):
        TapSet(tmp_path / "gone")
