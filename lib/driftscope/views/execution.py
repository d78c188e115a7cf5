"""Execute one notebook with papermill: which kernel, which notebook file, the kernel's configuration."""

from __future__ import annotations

from pathlib import Path

from driftscope.core.paths import NOTEBOOKS
from driftscope.errors import DriftscopeError

NOTEBOOK_DIR = NOTEBOOKS  # shipped in the package (a repository's notebooks/ links here)
KERNEL_NAME = "driftscope"


def kernel_name() -> str:
    """The project's registered kernel, or the current interpreter's own kernel when it is missing."""
    from jupyter_client.kernelspec import KernelSpecManager

    specs = KernelSpecManager().find_kernel_specs()
    if KERNEL_NAME in specs:
        return KERNEL_NAME
    if "python3" in specs:
        return "python3"
    raise DriftscopeError(
        "no Jupyter kernel to run notebooks with", "run `make setup` (it registers the 'driftscope' kernel)"
    )


def notebook_path(name: str, notebook_dir: Path | None = None) -> Path:
    directory = notebook_dir or NOTEBOOK_DIR
    path = directory / (name if name.endswith(".ipynb") else f"{name}.ipynb")
    if not path.exists() and notebook_dir is not None:
        return notebook_path(name)  # a tree without this notebook: use the installed one
    if not path.exists():
        known = sorted(p.stem for p in NOTEBOOK_DIR.glob("*.ipynb"))
        raise DriftscopeError(f"notebook {name!r} does not exist", f"use one of: {', '.join(known)}")
    return path


def kernel_config():
    """The kernel manager's configuration: CurveZMQ keys where the kernel supports them."""
    from traitlets.config import Config

    config = Config()
    config.KernelManager.transport_encryption = "auto"
    return config


def execute(
    name: str,
    out_dir: Path,
    parameters: dict,
    cwd: Path,
    log_output: bool = True,
    notebook_dir: Path | None = None,
    kernel=None,
) -> Path:
    """Run one notebook into ``out_dir/<name>.ipynb``; the executed copy is written even if it fails.

    ``kernel``: a :class:`driftscope.views.warm.WarmKernel` started for it in ``cwd`` (shut down afterwards);
    without one papermill starts a kernel of its own."""
    import papermill

    from .engine import register

    out_dir.mkdir(parents=True, exist_ok=True)
    source = notebook_path(name, notebook_dir)
    target = out_dir / source.name
    given = {"km": kernel.ready()} if kernel is not None else {}
    try:
        papermill.execute_notebook(
            str(source),
            str(target),
            parameters=parameters,
            kernel_name=kernel_name(),
            engine_name=register(),  # papermill's nbclient engine, without its writes before and after each cell
            cwd=str(cwd),
            log_output=log_output,
            progress_bar=False,
            report_mode=False,
            shutdown_kernel="immediate",  # every output is in by then; a graceful shutdown waited ~2 s
            config=kernel_config(),
            **given,
        )
    finally:
        if kernel is not None:
            kernel.shutdown()
    return target
