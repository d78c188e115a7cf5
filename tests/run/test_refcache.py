"""The reference cache (run.refcache): real transformers captures of the tiny fixture, stored, reused (hard-linked,
the model never loaded), and missed when what the taps depend on changes: the checkpoint's bytes, a package
version, the stage selection, the patch or its source. A corrupt entry is refused and captured again."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from driftscope.capture.patches import HypothesisPatch
from driftscope.capture.runtimes import get_runtime
from driftscope.families.checkpoints import open_checkpoint
from driftscope.run.refcache import ENV, capture_cached, identity
from driftscope.taps.stages import StageSelection


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    """One cache for the module's tests that only add entries (the base capture is stored once)."""
    return tmp_path_factory.mktemp("refcache")


@pytest.fixture
def cache(shared, monkeypatch) -> Path:
    monkeypatch.setenv(ENV, str(shared))
    return shared


@pytest.fixture
def own_cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "refcache"
    monkeypatch.setenv(ENV, str(root))
    return root


@pytest.fixture(scope="module")
def stored(shared, tmp_path_factory, tiny_checkpoint, small_inputs, small_plan):
    """The base capture (transformers f32, the small plan), stored in the shared cache: (TapSet, dtypes, outcome)."""
    previous = os.environ.get(ENV)
    os.environ[ENV] = str(shared)
    try:
        tapset, dtypes, outcome, loaded = _capture(
            tiny_checkpoint, small_inputs, small_plan, tmp_path_factory.mktemp("base") / "ref"
        )
    finally:
        os.environ[ENV] = previous if previous is not None else "off"
    assert outcome["status"] == "stored" and loaded
    return tapset, dtypes, outcome


@pytest.fixture(scope="module")
def small_inputs(tiny_checkpoint):
    """The 140x140 checkerboard: a few patches, so each capture costs little."""
    from conftest import ROOT
    from driftscope.families.checkpoints import prepare_inputs

    return prepare_inputs(tiny_checkpoint, [ROOT / "fixtures" / "images" / "checkerboard_140.png"])


@pytest.fixture(scope="module")
def small_plan(tiny_checkpoint):
    from driftscope.families import stage_plan

    return stage_plan(tiny_checkpoint.family, tiny_checkpoint.config).select(StageSelection(blocks=True, substages=()))


def _capture(checkpoint, inputs, plan, base, patch=None, log=None):
    runtime = get_runtime("transformers")(checkpoint, "f32", patch)
    lines = [] if log is None else log
    tapset, dtypes, outcome = capture_cached(runtime, inputs, plan, base, lines.append)
    runtime_loaded = runtime.model is not None
    runtime.release()
    return tapset, dtypes, outcome, runtime_loaded


def test_hit_reuses_the_stored_taps_without_loading_the_model(
    cache, stored, tmp_path, tiny_checkpoint, small_inputs, small_plan
):
    first, dtypes, outcome = stored
    assert dtypes == {"float32": dtypes["float32"]}
    entry = Path(outcome["entry"])
    record = json.loads((entry / "entry.json").read_text())
    assert record["key"] == outcome["key"] == entry.name and record["tensor"]["bytes"] > 0

    lines = []
    second, dtypes2, hit, loaded = _capture(
        tiny_checkpoint, small_inputs, small_plan, tmp_path / "b" / "ref", log=lines
    )
    assert hit["status"] == "hit" and hit["key"] == outcome["key"] and not loaded
    assert dtypes2 == dtypes
    assert any("reused the cached reference taps" in line for line in lines)
    assert os.path.samefile(second.tensor_path, entry / "taps.safetensors")  # linked, not copied
    assert second.stage_ids() == first.stage_ids()
    for stage_id in first.stage_ids():
        np.testing.assert_array_equal(second[stage_id], first[stage_id])
    assert second.meta["inputs_digest"] == small_inputs.digest and second.meta["reference_cache"]["status"] == "hit"


def test_each_thing_the_taps_depend_on_changes_the_key(
    cache, stored, tmp_path, tiny_checkpoint, small_inputs, small_plan
):
    """Changed stage selection, patch and patch source each miss (a real capture stored under a new key)."""
    from driftscope.families import stage_plan

    keys = {stored[2]["key"]}
    wider = stage_plan(tiny_checkpoint.family, tiny_checkpoint.config).select(
        StageSelection(blocks=True, substages=(0,))
    )
    patch_file = tmp_path / "my_patch.py"
    patch_file.write_text("def scale(model, factor=1.0):\n    return model\n")
    patch = HypothesisPatch(f"{patch_file}:scale", {"factor": 1.0})
    cases = [("stages", wider, None), ("patch", small_plan, patch)]
    for index, (what, plan, with_patch) in enumerate(cases, 1):
        _, _, outcome, loaded = _capture(tiny_checkpoint, small_inputs, plan, tmp_path / str(index) / "ref", with_patch)
        assert outcome["status"] == "stored" and loaded, what
        assert outcome["key"] not in keys, what
        keys.add(outcome["key"])
    patch_file.write_text("def scale(model, factor=1.0):\n    return model  # edited\n")
    runtime = get_runtime("transformers")(tiny_checkpoint, "f32", patch)
    assert (
        identity(runtime, small_inputs, small_plan)["patch"]["source"]
        != json.loads((Path(outcome["entry"]) / "entry.json").read_text())["identity"]["patch"]["source"]
    )
    _, _, edited, _ = _capture(tiny_checkpoint, small_inputs, small_plan, tmp_path / "9" / "ref", patch)
    assert edited["status"] == "stored" and edited["key"] not in keys


def test_a_changed_checkpoint_misses(cache, stored, tmp_path, tiny_checkpoint_dir, small_inputs, small_plan):
    """The key holds the checkpoint's content: a copy elsewhere hits, a changed weight misses."""
    first = stored[2]
    copy = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint_dir, copy)
    _, _, again, loaded = _capture(open_checkpoint(copy), small_inputs, small_plan, tmp_path / "b" / "ref")
    assert (again["status"], again["key"], loaded) == ("hit", first["key"], False)
    weights = sorted(copy.glob("*.safetensors"))[0]
    data = bytearray(weights.read_bytes())
    data[-4:] = np.float32(0.5).tobytes()  # the last float of the last tensor
    weights.write_bytes(bytes(data))
    _, _, changed, loaded = _capture(open_checkpoint(copy), small_inputs, small_plan, tmp_path / "c" / "ref")
    assert changed["status"] == "stored" and changed["key"] != first["key"] and loaded


def test_a_changed_package_version_misses(
    cache, stored, tmp_path, monkeypatch, tiny_checkpoint, small_inputs, small_plan
):
    first = stored[2]
    # another transformers version, as importlib.metadata sees it (the first distribution found on sys.path)
    site = tmp_path / "site"
    (site / "transformers-99.0.dist-info").mkdir(parents=True)
    (site / "transformers-99.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: transformers\nVersion: 99.0\n"
    )
    monkeypatch.syspath_prepend(str(site))
    runtime = get_runtime("transformers")(tiny_checkpoint, "f32")
    assert runtime.versions()["transformers"] == "99.0"
    _, _, changed, loaded = _capture(tiny_checkpoint, small_inputs, small_plan, tmp_path / "b" / "ref")
    assert changed["status"] == "stored" and changed["key"] != first["key"] and loaded


def test_a_corrupt_entry_is_refused_and_captured_again(own_cache, tmp_path, tiny_checkpoint, small_inputs, small_plan):
    first, _, stored, _ = _capture(tiny_checkpoint, small_inputs, small_plan, tmp_path / "a" / "ref")
    cached = Path(stored["entry"]) / "taps.safetensors"
    expected = {stage_id: np.array(first[stage_id]) for stage_id in first.stage_ids()}
    os.unlink(first.tensor_path)  # the run's own copy is a hard link: flip a byte in the entry only
    data = bytearray(cached.read_bytes())
    data[-1] ^= 0xFF
    cached.write_bytes(bytes(data))
    lines = []
    again, _, outcome, loaded = _capture(tiny_checkpoint, small_inputs, small_plan, tmp_path / "b" / "ref", log=lines)
    assert outcome["status"] == "stored" and "SHA-256" in outcome["refused"] and loaded
    assert any("refusing the cached reference taps" in line for line in lines)
    for stage_id, value in expected.items():
        np.testing.assert_array_equal(again[stage_id], value)
    _, _, hit, _ = _capture(tiny_checkpoint, small_inputs, small_plan, tmp_path / "c" / "ref")
    assert hit["status"] == "hit"


def test_49_4_weights_rewritten_in_place_with_their_time_stamps_restored_miss(
    own_cache, tmp_path, monkeypatch, tiny_checkpoint_dir, small_inputs, small_plan
):
    """``cp -p``, ``touch -r``, a reproducible archive: the same path, inode, size and modification time, other
    bytes. The key holds the bytes' hash (remembered by a stat key that includes the status-change time)."""
    from driftscope.core import digests

    monkeypatch.setattr(digests, "RACY_NS", 0, raising=False)  # remembered at once, as an old file's hash is
    copy = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint_dir, copy)
    _, _, first, _ = _capture(open_checkpoint(copy), small_inputs, small_plan, tmp_path / "a" / "ref")
    assert first["status"] == "stored"
    weights = sorted(copy.glob("*.safetensors"))[0]
    before = weights.stat()
    data = bytearray(weights.read_bytes())
    data[-4:] = np.float32(0.5).tobytes()  # the last float of the last tensor
    with open(weights, "r+b") as handle:  # in place: the same inode
        handle.write(bytes(data))
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = weights.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    _, _, changed, loaded = _capture(open_checkpoint(copy), small_inputs, small_plan, tmp_path / "b" / "ref")
    assert changed["status"] == "stored" and changed["key"] != first["key"] and loaded


def test_49_5_an_entry_rewritten_with_its_recorded_digests_is_refused(
    own_cache, tmp_path, tiny_checkpoint, small_inputs, small_plan
):
    """The taps and the size and SHA-256 ``entry.json`` records for them, rewritten together: the record's seal
    (a key outside the cache) does not hold, so the entry is refused and the reference captured again."""
    from driftscope.core.digests import file_sha256

    first, _, stored, _ = _capture(tiny_checkpoint, small_inputs, small_plan, tmp_path / "a" / "ref")
    entry = Path(stored["entry"])
    expected = {stage_id: np.array(first[stage_id]) for stage_id in first.stage_ids()}
    os.unlink(first.tensor_path)  # the run's own copy is a hard link: rewrite the entry only
    cached = entry / "taps.safetensors"
    data = bytearray(cached.read_bytes())
    data[-4:] = np.float32(123.0).tobytes()  # the last value of the last stage
    cached.write_bytes(bytes(data))
    record = json.loads((entry / "entry.json").read_text())
    record["tensor"] = {"bytes": cached.stat().st_size, "sha256": file_sha256(cached)}
    (entry / "entry.json").write_text(json.dumps(record))
    lines = []
    again, _, outcome, loaded = _capture(tiny_checkpoint, small_inputs, small_plan, tmp_path / "b" / "ref", log=lines)
    assert outcome["status"] == "stored" and "seal" in outcome.get("refused", "") and loaded, outcome
    for stage_id, value in expected.items():
        np.testing.assert_array_equal(again[stage_id], value)
    _, _, hit, _ = _capture(tiny_checkpoint, small_inputs, small_plan, tmp_path / "c" / "ref")
    assert hit["status"] == "hit"


def test_concurrent_runs_capture_the_reference_once(own_cache, tmp_path, tiny_checkpoint, small_inputs, small_plan):
    """Two workers needing the same reference at once: one captures and stores, the other waits on the entry's
    lock and reuses it."""
    outcomes = {}

    def work(name):
        outcomes[name] = _capture(tiny_checkpoint, small_inputs, small_plan, tmp_path / name / "ref")[2]

    threads = [threading.Thread(target=work, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcome["status"] for outcome in outcomes.values()) == ["hit", "stored"]


def test_a_second_investigation_reuses_the_reference_and_the_power_captures(own_cache, tmp_path):
    """Two runs of one parameter file into two directories (as two commits would): the second reads the
    reference's taps and the mutated captures from the cache, and judges exactly as the first."""
    from conftest import write_params
    from driftscope.run.investigation import investigate
    from driftscope.run.report import Report

    params = write_params(
        tmp_path / "p.yaml",
        "refcache-e2e",
        ["transformers:f32", "mlx:f16"],
        stages={"blocks": True},
        power={"mutations": ["drop_rotary_block_1"]},
        text={"max_new_tokens": 2},
    )
    first = investigate(params, tmp_path / "a").data
    second = investigate(params, tmp_path / "b").data
    assert first["reference_cache"]["status"] == "stored"
    assert second["reference_cache"]["status"] == "hit"
    assert second["reference_cache"]["entry"] == first["reference_cache"]["entry"]
    assert second["reference_cache"]["stored"]["out"] == str(tmp_path / "a")
    reference = second["runtimes"][0]
    assert reference["label"] == "transformers:f32" and reference["reference_cache"]["status"] == "hit"
    assert reference["observed_dtypes"]["weights"] == first["runtimes"][0]["observed_dtypes"]["weights"]
    assert [c["status"] for c in second["power"]["reference_cache"]["captures"]] == ["hit"]
    assert [m["detected"] for m in second["power"]["mutations"]] == [m["detected"] for m in first["power"]["mutations"]]
    assert second["rows"] == first["rows"] and second["verdict"] == first["verdict"]
    from driftscope.views.parity import reference_cache_line

    loaded = Report.load(tmp_path / "b" / "report.json")  # the report schema holds the new key
    line = reference_cache_line(loaded)
    assert "`transformers:f32`" in line and second["reference_cache"]["entry"] in line and "1 of the 1 mutated" in line
    assert reference_cache_line(Report.load(tmp_path / "a" / "report.json")) is None  # captured, not reused


def test_without_the_variable_the_cache_is_in_its_default_place(monkeypatch, tmp_path):
    """``$DRIFTSCOPE_REFERENCE_CACHE`` unset (as for a user who never heard of it) or empty: the cache under
    ``$DRIFTSCOPE_CACHE``; ``off``: none (an unset variable used to crash every ``driftscope run``)."""
    from driftscope.run.refcache import cache_root

    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setenv("DRIFTSCOPE_CACHE", str(tmp_path))
    assert cache_root() == tmp_path / "reference"
    monkeypatch.setenv(ENV, "")
    assert cache_root() == tmp_path / "reference"
    monkeypatch.setenv(ENV, "OFF")
    assert cache_root() is None
    monkeypatch.setenv(ENV, str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"
