"""Import the notebook stack before a kernel thread starts, so two threads never compile at once."""

from __future__ import annotations

from .execution import kernel_name, notebook_path

#: What the render process imports before it starts a kernel (papermill, nbclient, the kernel client, nbformat's
#: validator, nbconvert and its Jinja templates): all of it before its kernel thread starts, so the two threads
#: never compile at once (CPython 3.11's AST state is not thread-safe: "AST constructor recursion depth mismatch").
NOTEBOOK_STACK = (
    "papermill",
    "papermill.execute",
    "papermill.engines",
    "papermill.translators",
    "papermill.parameterize",
    "papermill.iorw",
    "nbclient",
    "nbclient.client",
    "jupyter_client.manager",
    "jupyter_client.kernelspec",
    "jupyter_client.provisioning",
    "nbformat",
    "nbconvert",
    "nbconvert.exporters.html",
    "jinja2",
    "traitlets.config",
    "zmq.asyncio",
)


def prepare_notebook_stack(names) -> None:
    """Import the notebook stack and read each notebook once (nbformat builds its schema validator)."""
    import importlib

    from driftscope.core.validation import draft_2020_12

    draft_2020_12()  # nbformat validates with jsonschema: imported first without its optional IRI grammar
    import nbformat

    for module in NOTEBOOK_STACK:
        importlib.import_module(module)
    for name in names:
        try:
            nbformat.validate(nbformat.read(str(notebook_path(name)), as_version=4))
        except Exception:  # noqa: BLE001 - a missing or broken notebook is the run's to report, with its name
            continue
    kernel_name()  # jupyter_client's kernel spec lookup (entry points, paths)
    from .engine import register

    register()
