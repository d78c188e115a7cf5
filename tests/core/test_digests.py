"""Content digests remembered by a stat key (core.digests): a rewrite that restores the modification time is
hashed again, a memo file rewritten to vouch for other bytes is ignored, and a file changed a moment ago is not
remembered at all (timestamps are coarse)."""

from __future__ import annotations

import json
import os

from driftscope.core import digests
from driftscope.core.digests import file_sha256, tree_digest


def test_49_4_a_rewrite_that_restores_size_and_modification_time_is_hashed_again(tmp_path, monkeypatch):
    monkeypatch.setattr(digests, "RACY_NS", 0)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    weights = folder / "model.safetensors"
    weights.write_bytes(b"a" * 4096)
    memo = tmp_path / "memo.json"
    first = tree_digest(folder, memo)
    before = weights.stat()
    with open(weights, "r+b") as handle:
        handle.write(b"b")
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert weights.stat().st_mtime_ns == before.st_mtime_ns and weights.stat().st_ino == before.st_ino
    digests._known.clear()  # a fresh process: only the memo file remembers
    assert tree_digest(folder, memo) != first


def test_49_5_a_memo_entry_rewritten_to_vouch_for_other_bytes_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setattr(digests, "RACY_NS", 0)
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"x" * 100)
    memo = tmp_path / "memo.json"
    honest = tree_digest(weights, memo)
    entries = json.loads(memo.read_text())
    (key,) = entries
    entries[key]["sha256"] = "0" * 64  # the digest of other bytes, without the key that seals it
    memo.write_text(json.dumps(entries))
    digests._known.clear()
    assert tree_digest(weights, memo) == honest
    assert json.loads(memo.read_text())[key]["sha256"] == file_sha256(weights)  # the memo mended


def test_a_file_changed_a_moment_ago_is_not_remembered(tmp_path):
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"x" * 100)
    memo = tmp_path / "memo.json"
    tree_digest(weights, memo)
    assert not memo.exists() and not any(str(weights.resolve()) in key for key in digests._known)
