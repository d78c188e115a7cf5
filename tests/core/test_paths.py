"""No repository around the package: what ships with it, where runs write, where caches live (issue 51 item 1)."""

from __future__ import annotations

import subprocess

from driftscope.core import paths


def test_the_notebooks_contracts_and_the_demo_image_ship_inside_the_package():
    assert paths.NOTEBOOKS.parent == paths.PACKAGE == paths.CONTRACTS.parent
    assert sorted(p.name for p in paths.NOTEBOOKS.glob("*.ipynb"))[0] == "01_stage_parity.ipynb"
    assert {p.stem for p in paths.CONTRACTS.glob("*.yaml")} >= {"default", "strict"}
    assert (paths.DEMO_IMAGES / "shapes_448.png").is_file()


def test_the_repository_keeps_its_top_level_folders_as_links_into_the_package():
    root = paths.REPO_ROOT
    assert (root / "notebooks").resolve() == paths.NOTEBOOKS
    assert (root / "parameters" / "contracts").resolve() == paths.CONTRACTS
    assert (root / "fixtures" / "images" / "shapes_448.png").resolve() == paths.DEMO_IMAGES / "shapes_448.png"


def test_the_cache_is_the_user_cache_folder_unless_moved(monkeypatch, tmp_path):
    monkeypatch.delenv(paths.CACHE_VARIABLE, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # platformdirs' user cache folder on Linux
    assert paths.cache_root() == tmp_path / "xdg" / "driftscope"
    monkeypatch.setenv(paths.CACHE_VARIABLE, str(tmp_path / "moved"))
    assert paths.cache_root() == tmp_path / "moved"
    from driftscope.capture.iree import default_cache_dir
    from driftscope.run.refcache import cache_root

    assert default_cache_dir() == tmp_path / "moved" / "iree"
    monkeypatch.delenv("DRIFTSCOPE_REFERENCE_CACHE", raising=False)
    assert cache_root() == tmp_path / "moved" / "reference"


def test_outputs_go_to_the_parameter_files_repository_else_the_current_folder(monkeypatch, tmp_path):
    repo, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    (repo / "configs").mkdir(parents=True)
    elsewhere.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    monkeypatch.chdir(elsewhere)
    assert paths.outputs_root(repo / "configs" / "run.yaml") == repo / "outputs"
    assert paths.outputs_root(tmp_path / "loose.yaml") == elsewhere / "outputs"  # no repository: ./outputs
    assert paths.outputs_root() == elsewhere / "outputs"
    monkeypatch.chdir(repo / "configs")
    assert paths.outputs_root() == repo / "outputs"  # a repository's subfolder: its top
