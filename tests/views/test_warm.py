"""The warm-up a notebook's kernel runs before its report exists (issue 38 item 3): the notebook's own imports
and the views' in-function ones, in a namespace of its own."""

from __future__ import annotations

import ast
import importlib.util

from conftest import ROOT


def test_the_warm_up_imports_each_import_of_the_notebook_once():
    from driftscope.views.warm import notebook_imports

    statements = notebook_imports(ROOT / "notebooks" / "01_stage_parity.ipynb")
    assert statements[0] == "from driftscope.views import notebook, parity"
    assert "from driftscope.views.interactive import error_curves_figure" in statements
    assert len(statements) == len(set(statements))
    assert all(isinstance(ast.parse(s).body[0], ast.Import | ast.ImportFrom) for s in statements)


def test_the_warm_up_leaves_the_notebooks_namespace_as_it_was():
    from driftscope.views.warm import warm_up_code

    namespace: dict = {}
    exec(warm_up_code(ROOT / "notebooks" / "04_negative_controls.ipynb", extra=()), namespace)  # noqa: S102 - what the kernel runs
    assert set(namespace) == {"__builtins__"}


def test_every_view_import_names_a_module_that_exists():
    """A stale entry would only cost time, silently: each names an installed module."""
    from driftscope.views.warm import VIEW_IMPORTS

    for statement in VIEW_IMPORTS:
        node = ast.parse(statement).body[0]
        module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
        assert importlib.util.find_spec(module) is not None, statement


def test_every_part_of_the_warm_up_runs_without_an_error():
    """Each part of the warm-up swallows its error (the cell that needs it shows it); a part that breaks, a renamed
    matplotlib or plotly property say, would stop warming silently: with the errors raised, it runs to the end."""
    from driftscope.views.warm import WARM_UP

    swallowed = "except BaseException:\n    pass"
    assert WARM_UP.count(swallowed) >= 4
    namespace: dict = {"IMPORTS": []}
    exec(WARM_UP.replace(swallowed, "except BaseException:\n    raise"), namespace)  # noqa: S102 - what the kernel runs
    assert namespace["figure"].to_json()  # the last part ran: the plotly figure with the views' properties


def test_the_warm_page_renders_each_kind_of_output_both_ways():
    """The render process renders it once before its first real page (so the two pages, rendered at once in two
    processes, do not each import and build what a page needs): both pages show its picture, table, figure
    division and printed text; the page with code shows the parameters line, the other does not."""
    from driftscope.views.execution import NOTEBOOK_DIR
    from driftscope.views.pages import TEMPLATES, page_body
    from driftscope.views.warm import Exporters, page_warm_up

    pages = Exporters(TEMPLATES)
    shown, bare = (page_body(page_warm_up(), NOTEBOOK_DIR, pages, exclude) for exclude in (False, True))
    for body in (shown, bare):
        assert 'alt="a"' in body and "driftscope-table" in body and "driftscope-plotly" in body and "printed" in body
        assert "Plotly" in body  # plotly.js inlined: the page took the interactive path
    assert "given to this run" in shown and "given to this run" not in bare
