"""Which candidates are captured in a process of their own (run.isolated; the crash itself is
test_hostile_runs.py's test 49_12): a patch from outside driftscope, unless ``$DRIFTSCOPE_TRUSTED_PATCHES`` names it."""

from __future__ import annotations

from conftest import ROOT
from driftscope.capture.patches import HypothesisPatch
from driftscope.run.isolated import TRUSTED_ENV, isolated
from driftscope.run.params import RuntimeSpec


def spec(target: str | None) -> RuntimeSpec:
    return RuntimeSpec("mlx", "f32", None if target is None else HypothesisPatch(target, {}, ROOT))


def test_a_patch_from_outside_driftscope_is_isolated_unless_trusted(monkeypatch):
    monkeypatch.setenv(TRUSTED_ENV, str(ROOT / "tests" / "planted_patches.py"))
    assert not isolated(spec(None)) and not isolated(spec("driftscope.hypotheses:norm2_in_float32"))
    assert isolated(spec("tests/hostile_patches.py:segfault"))  # relative to the parameter file's root
    assert not isolated(spec("tests/planted_patches.py:wrong_eps"))
    assert isolated(spec("my_patches:fix"))  # a module of the user's
    monkeypatch.setenv(TRUSTED_ENV, f"{ROOT / 'tests'}:my_patches")  # a folder, and a module by name
    assert not isolated(spec("tests/hostile_patches.py:segfault")) and not isolated(spec("my_patches:fix"))
    monkeypatch.delenv(TRUSTED_ENV)
    assert isolated(spec(f"{ROOT / 'tests' / 'planted_patches.py'}:wrong_eps"))
