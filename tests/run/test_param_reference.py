"""docs/parameters.md is the parser's own key tables, and the README says what a newcomer needs (issue 34,
item 7): the generated page is current, every table is the one the parser checks keys against, and the README
lists every recognised ``model_type`` and links the page."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT
from driftscope.capture.runtimes import RUNTIMES
from driftscope.errors import ParameterError
from driftscope.families import model_types
from driftscope.run import param_sections
from driftscope.run.param_reference import SECTIONS, parameters_markdown
from driftscope.run.params import RUNTIME_KEYS, TOP_KEYS, parse_parameters

PAGE = ROOT / "docs" / "parameters.md"
BASE = {"checkpoint": "c", "images": ["i.png"], "runtimes": ["transformers:f32", "mlx:f32"]}


def test_the_page_is_current():
    done = subprocess.run(
        [sys.executable, "scripts/parameters_doc.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert PAGE.read_text(encoding="utf-8") == parameters_markdown()


def listed(valid_keys_error: ParameterError) -> set[str]:
    return set(valid_keys_error.fix.removeprefix("valid keys: ").split(", "))


@pytest.mark.parametrize(
    ("section", "keys"),
    [(name, keys) for name, keys, _ in SECTIONS if name != "relative"] + [(None, TOP_KEYS), ("runtimes", RUNTIME_KEYS)],
)
def test_each_documented_table_is_what_the_parser_accepts(tmp_path, section, keys):
    """A key the page does not list is refused, and the refusal names exactly the page's keys."""
    data = dict(BASE)
    if section is None:
        data["surprise"] = 1
    elif section == "runtimes":
        data["runtimes"] = [{"runtime": "transformers", "surprise": 1}, "mlx:f32"]
    else:
        data[section] = {"surprise": 1}
    with pytest.raises(ParameterError, match="unknown keys \\['surprise'\\]") as err:
        parse_parameters(data, base=tmp_path)
    assert listed(err.value) == set(keys)
    page = PAGE.read_text(encoding="utf-8")
    assert all(f"| `{key}` |" in page for key in keys)


def test_relative_refuses_what_its_table_lacks(tmp_path):
    with pytest.raises(ParameterError) as err:
        param_sections.relative_section({"surprise": 1}, ["transformers:f32", "mlx:f32"], "transformers:f32")
    assert listed(err.value) == set(param_sections.RELATIVE_KEYS)


def test_every_runtime_option_and_model_type_is_on_the_page():
    page = PAGE.read_text(encoding="utf-8")
    for name in RUNTIMES.names():
        assert f"#### `{name}`" in page
        assert all(f"| `{option}` |" in page for option in RUNTIMES.get(name).known_options())
    assert all(f"| `{model_type}` |" in page for model_type in model_types())


def test_the_readme_points_a_newcomer_at_it():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "[docs/parameters.md](docs/parameters.md)" in readme
    assert all(f"`{model_type}`" in readme for model_type in model_types())
    assert "`notebooks:` defaults to notebook 01 only" in readme
    glossary = readme.index("Three words first")
    for word in ("**TapSet**", "**Narrowing**", "**Op-local error**"):  # each defined where it is first used
        term = word.strip("*").split()[0].lower()
        assert readme.lower().index(term) == readme.index(word) + 2 > glossary
    assert "## Two commands" in readme and "make demo" in readme and "make test" in readme
