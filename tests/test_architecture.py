"""The package reads as its pipeline: the layer contract, no import cycle, narrow signatures below ``run``,
small modules, the old names still importable, and docs/architecture.md drawn from the code."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lib" / "driftscope"
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
LAYERS = next(c for c in CONFIG["contracts"] if c["type"] == "layers")["layers"]  # highest first
BELOW_RUN = [name.removeprefix("driftscope.") for name in LAYERS[LAYERS.index("driftscope.run") + 1 :]]


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("driftscope", cache_dir=None)


def upward_imports(graph: grimp.ImportGraph) -> set:
    return graph.find_illegal_dependencies_for_layers(layers=tuple(LAYERS))


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan), or a module importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(edges.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1 or node in edges.get(node, ()):
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_root_holds_only_the_layers_and_the_entry_points():
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    # hypotheses: the documented name of the ready patches (``patch: driftscope.hypotheses:NAME``); cli_help: what
    # each command's --help says
    assert modules == {"__init__", "__main__", "cli", "cli_help", "errors", "hypotheses"}
    assert packages == {name.removeprefix("driftscope.") for name in LAYERS}


def test_no_layer_imports_a_higher_one(graph):
    assert upward_imports(graph) == set()


def test_the_layer_check_catches_an_upward_import():
    """The same check on a fresh copy of the real graph with one planted import from the bottom layer to the top."""
    planted = grimp.build_graph("driftscope", cache_dir=None)
    planted.add_import(importer="driftscope.core.atomic", imported="driftscope.views.render")
    illegal = upward_imports(planted)
    assert {(d.importer, d.imported) for d in illegal} == {("driftscope.core", "driftscope.views")}


def test_lint_imports_keeps_every_contract():
    """What `make test` runs first: import-linter over pyproject.toml's contracts (layers, independent families, the
    generic family and the deep ones apart (the module taps both use live in taps), and the Qwen3-VL-MoE variant
    building on Qwen3-VL alone, with nothing building on it, and each deep family's light modules importing none of
    the modules its FAMILY names by import path)."""
    done = subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports")), "--no-cache"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "10 kept, 0 broken" in done.stdout


def test_no_import_cycle_in_the_package(graph):
    edges = {module: graph.find_modules_directly_imported_by(module) for module in graph.modules}
    assert cycles(edges) == []


def test_the_cycle_check_finds_a_planted_cycle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(edges) == [["a", "b", "c"], ["e"]]


def functions_taking_parameters(path: Path) -> list[str]:
    """``line name(argument)`` for every function in ``path`` with an argument that is the whole parameter set."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for argument in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
                annotation = ast.unparse(argument.annotation) if argument.annotation else ""
                if argument.arg in ("params", "parameters") or "Parameters" in annotation:
                    found.append(f"{node.lineno} {node.name}({argument.arg})")
    return found


def test_below_run_no_function_takes_the_whole_parameter_set():
    found = [
        f"{path.relative_to(PACKAGE)}:{hit}"
        for layer in BELOW_RUN
        for path in sorted((PACKAGE / layer).rglob("*.py"))
        for hit in functions_taking_parameters(path)
    ]
    assert BELOW_RUN[0] == "replay" and BELOW_RUN[-1] == "core"
    assert found == []


def test_the_signature_check_sees_a_function_taking_parameters(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("def judge(contract, params):\n    pass\n\n\ndef other(p: 'Parameters'):\n    pass\n")
    assert functions_taking_parameters(planted) == ["1 judge(params)", "5 other(p)"]
    assert functions_taking_parameters(PACKAGE / "run" / "investigation.py")  # the run layer does take them


def test_no_module_is_over_400_lines():
    long = {
        str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 400
    }
    assert long == {}


OLD_NAMES = """
import importlib, json
found = {}
for old in ("driftscope.recapture", "driftscope.quant.loading", "driftscope.runtimes.base", "driftscope.checkpoint"):
    try:
        importlib.import_module(old)
        found[old] = "imported"
    except ModuleNotFoundError as err:
        found[old] = err.name
import driftscope.hypotheses as public
from driftscope.families import hypotheses
found["hypotheses"] = [public.__file__.endswith("driftscope/hypotheses.py"), public.names() == hypotheses.names()]
print(json.dumps(found))
"""


def test_the_old_module_names_are_gone_and_hypotheses_is_a_plain_module():
    """In a fresh interpreter: the old flat package's names (before the layers) no longer import (no finder maps
    them); ``driftscope.hypotheses``, the documented home of the ready patches, is a module of its own file."""
    done = subprocess.run([sys.executable, "-c", OLD_NAMES], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found == {
        "driftscope.recapture": "driftscope.recapture",
        "driftscope.quant.loading": "driftscope.quant",
        "driftscope.runtimes.base": "driftscope.runtimes",
        "driftscope.checkpoint": "driftscope.checkpoint",
        "hypotheses": [True, True],
    }


def test_a_documented_patch_target_resolves_to_the_family_patch():
    from driftscope.capture.patches import parse_patch
    from driftscope.families.hypotheses import hypotheses_of
    from driftscope.families.qwen2_5_vl import hypotheses as qwen_patches

    patch = parse_patch("driftscope.hypotheses:norm2_in_float32")
    with hypotheses_of("qwen2_5_vl"):
        assert patch.resolve().target() is qwen_patches.norm2_in_float32


def test_the_architecture_page_is_drawn_from_the_code():
    done = subprocess.run(
        [sys.executable, "scripts/architecture.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_tests_mirror_the_layers():
    """``tests/<layer>/test_<module>.py``: one folder per layer; only this cross-cutting file stays at the top."""
    tests = ROOT / "tests"
    layers = {name.removeprefix("driftscope.") for name in LAYERS}
    folders = {p.name for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == layers
    assert sorted(p.name for p in tests.glob("test_*.py")) == ["test_architecture.py"]
    assert all(any((tests / layer).glob("test_*.py")) for layer in layers)


def layers_imported(source: str) -> list[str]:
    """The modules of a layer below ``views`` that notebook code imports (``driftscope`` itself, its ``errors`` and
    ``views`` are what a notebook may read)."""
    below_views = tuple(name for name in LAYERS[LAYERS.index("driftscope.views") + 1 :])
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    names = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return sorted(name for name in names if name in below_views or name.startswith(tuple(f"{b}." for b in below_views)))


def test_the_notebooks_read_through_open_run_and_the_views():
    """No notebook imports the capture, run or any other layer below the views (issue 54 item 4): what a page shows
    comes from ``driftscope`` (``investigate``, ``open_run``) and ``driftscope.views``."""
    found = {}
    for path in sorted((PACKAGE / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        source = "\n".join("".join(cell["source"]) for cell in cells if cell["cell_type"] == "code")
        if imported := layers_imported(source):
            found[path.name] = imported
    assert found == {}
    planted = "from driftscope.views import drill\nif True:\n    from driftscope.run.params import load_parameters\n"
    assert layers_imported(planted + "import driftscope.capture.runtime_checks\n%matplotlib inline") == [
        "driftscope.capture.runtime_checks",
        "driftscope.run.params",
    ]
