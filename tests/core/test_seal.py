"""Seals (core.seal): an HMAC under a key kept outside the caches, made once with mode 0600; another key does not
verify, and a key that cannot be kept falls back to one of this process alone."""

from __future__ import annotations

import stat

from driftscope.core import seal


def test_the_key_is_made_once_private_and_verifies_only_its_own_seals(tmp_path, monkeypatch):
    path = tmp_path / "config" / "seal.key"
    monkeypatch.setenv(seal.KEY_ENV, str(path))
    value = seal.seal({"sha256": "ab", "bytes": 3})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert seal.holds({"bytes": 3, "sha256": "ab"}, value)  # key order does not matter
    assert not seal.holds({"bytes": 4, "sha256": "ab"}, value) and not seal.holds({"bytes": 3}, None)
    monkeypatch.setenv(seal.KEY_ENV, str(tmp_path / "other.key"))
    assert not seal.holds({"sha256": "ab", "bytes": 3}, value)


def test_a_key_that_cannot_be_kept_is_this_process_alone(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv(seal.KEY_ENV, str(blocked / "seal.key"))
    value = seal.seal([1, 2])
    assert seal.holds([1, 2], value) and not (blocked / "seal.key").exists()
