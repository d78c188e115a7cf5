"""The storage boundary: an output root given as a URL, and inputs fetched from URLs into the local cache."""

from __future__ import annotations

import pytest
from conftest import ROOT
from driftscope.core.storage import OutputRoot, StorageError, is_url, localize
from driftscope.run.params import parse_parameters


def test_a_file_url_root_reads_writes_lists_and_uploads(tmp_path):
    root = OutputRoot((tmp_path / "shared").as_uri())
    assert root.remote and root.url("abc", "index.html") == (tmp_path / "shared").as_uri() + "/abc/index.html"
    assert root.read_text("abc", "index.html") is None and root.directories("abc") == []
    root.write_text("abc", "index.html", text="<p>one</p>")
    root.write_text("abc", "index.html", text="<p>two</p>")
    assert (tmp_path / "shared" / "abc" / "index.html").read_text() == "<p>two</p>"
    assert root.files("abc") == ["index.html"]  # no temporary file left behind
    scratch = tmp_path / "scratch"
    (scratch / "taps").mkdir(parents=True)
    (scratch / "report.json").write_text('{"status": "complete"}')
    (scratch / "taps" / "a.json").write_text("{}")
    (tmp_path / "shared" / "abc" / "run").mkdir()
    (tmp_path / "shared" / "abc" / "run" / "old.html").write_text("an earlier run's page")
    root.upload(scratch, "abc", "run")
    assert root.directories("abc") == ["run"]
    assert root.read_json("abc", "run", "report.json") == {"status": "complete"}
    assert sorted(p.name for p in (tmp_path / "shared" / "abc" / "run").rglob("*") if p.is_file()) == [
        "a.json",
        "report.json",
    ]


def test_a_plain_path_is_a_local_root(tmp_path):
    root = OutputRoot(tmp_path / "out")
    assert not root.remote and root.path("abc") == tmp_path / "out" / "abc"
    root.write_text("abc", "x.json", text='{"a": 1}')
    assert root.read_json("abc", "x.json") == {"a": 1} and root.directories() == ["abc"]
    assert not is_url(str(tmp_path)) and is_url("s3://bucket/runs") and is_url("file:///tmp/x")


def test_inputs_given_as_urls_are_fetched_once_and_keep_their_url_as_identity(tmp_path, monkeypatch):
    monkeypatch.setenv("DRIFTSCOPE_CACHE", str(tmp_path / "cache"))
    image = ROOT / "fixtures" / "images" / "checkerboard_140.png"
    local = localize(image.as_uri())
    assert local.read_bytes() == image.read_bytes() and local.is_relative_to(tmp_path / "cache")
    assert localize(image.as_uri()) == local  # cached
    checkpoint = ROOT / "fixtures" / "checkpoints" / "tiny-qwen2_5-vl"
    params = parse_parameters(
        {
            "checkpoint": checkpoint.as_uri(),
            "images": [image.as_uri()],
            "runtimes": ["transformers:f32", "mlx:f32"],
        },
        "remote.yaml",
    )
    assert (params.checkpoint / "config.json").read_text() == (checkpoint / "config.json").read_text()
    assert params.to_dict()["checkpoint"] == checkpoint.as_uri() and params.to_dict()["images"] == [image.as_uri()]
    with pytest.raises(StorageError, match="does not exist"):
        localize((tmp_path / "nothing.png").as_uri())


def test_49_5_a_fetched_copy_changed_since_it_was_fetched_is_fetched_again(tmp_path, monkeypatch):
    """The local copy of a URL's file is a cache entry: rewritten in place (its record rewritten to match, without
    the seal key), it is refused and fetched again, not read as the URL's file."""
    import hashlib
    import json

    monkeypatch.setenv("DRIFTSCOPE_CACHE", str(tmp_path / "cache"))
    image = ROOT / "fixtures" / "images" / "checkerboard_140.png"
    local = localize(image.as_uri())
    local.write_bytes(b"not the image")
    record = json.loads((local.parent / ".complete").read_text())
    record["files"] = {local.name: hashlib.sha256(b"not the image").hexdigest()}
    (local.parent / ".complete").write_text(json.dumps(record))
    assert localize(image.as_uri()).read_bytes() == image.read_bytes()
