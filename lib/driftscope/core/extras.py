"""driftscope's optional dependency groups (``pip install 'driftscope[iree]'``): what is installed here, and the
error that names the extra to install when a parameter file or an option needs one that is not."""

from __future__ import annotations

import importlib.util

from driftscope.errors import ParameterError


def missing_modules(modules: dict[str, str]) -> list[str]:
    """The packages (module -> package) whose module is not importable here; nothing is imported but a namespace
    parent (``iree`` of ``iree.runtime``)."""
    missing = []
    for module, package in modules.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:  # the parent package itself is missing
            found = False
        if not found:
            missing.append(package)
    return missing


def install_extra(extra: str) -> str:
    """The fix that installs ``extra``."""
    return f"install driftscope[{extra}] (pip install 'driftscope[{extra}]')"


def require_extra(modules: dict[str, str], extra: str, needed_by: str) -> None:
    """Raise a clear error naming ``extra`` when a module ``needed_by`` (an option, a runtime) uses is missing."""
    missing = missing_modules(modules)
    if missing:
        problem = f"{needed_by} needs {', '.join(missing)}, which is not installed here"
        raise ParameterError(problem, install_extra(extra))
