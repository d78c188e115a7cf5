"""driftscope's optional dependency groups (``pip install 'driftscope[iree]'``): what is installed here, and the
error that names the extra to install when a parameter file or an option needs one that is not."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from driftscope.errors import ParameterError


def installed(module: str) -> bool:
    """Whether ``module`` (``iree.runtime``) can be imported here, found without importing it or its parents (a run
    imports each framework when its runtime first loads)."""
    top, _, rest = module.partition(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not rest:
        return spec is not None
    *folders, name = rest.split(".")
    for location in spec.submodule_search_locations or ():
        parent = Path(location, *folders)
        if (parent / name).is_dir() or any(parent.glob(f"{name}.py")) or any(parent.glob(f"{name}.*.so")):
            return True
    return False


def missing_modules(modules: dict[str, str]) -> list[str]:
    """The packages (module -> package) whose module is not installed here."""
    return [package for module, package in modules.items() if not installed(module)]


def install_extra(extra: str) -> str:
    """The fix that installs ``extra``."""
    return f"install driftscope[{extra}] (pip install 'driftscope[{extra}]')"


def require_extra(modules: dict[str, str], extra: str, needed_by: str) -> None:
    """Raise a clear error naming ``extra`` when a module ``needed_by`` (an option, a runtime) uses is missing."""
    missing = missing_modules(modules)
    if missing:
        problem = f"{needed_by} needs {', '.join(missing)}, which is not installed here"
        raise ParameterError(problem, install_extra(extra))
