"""Hypothesis patches: a user callable, named by a dotted path, that may change a loaded model.

``"pkg.module:function"``, ``"pkg.module.function"`` or ``"path/to/file.py:function"``; it is called
as ``function(model, **kwargs)`` right after the runtime loads its model. The report records it.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from driftscope.errors import HypothesisPatchError


@dataclass(frozen=True)
class HypothesisPatch:
    target: str
    kwargs: dict = field(default_factory=dict)
    root: Path | None = field(default=None, compare=False)  # what a relative ``file.py`` is relative to

    def resolve(self) -> Callable[..., Any]:
        return resolve_callable(self.target, self.root)

    def apply(self, model: Any) -> Any:
        """Call the patch on ``model``; an exception it raises becomes a :class:`HypothesisPatchError`
        naming the patch (the original traceback stays chained to it, and goes to the run's log)."""
        function = self.resolve()
        try:
            result = function(model, **self.kwargs)
        except Exception as err:
            raise HypothesisPatchError(
                f"patch {self.target} raised {type(err).__name__}: {err}",
                "fix the patch function (its traceback is in the run's investigation.log) or drop it from 'runtimes'",
            ) from err
        return model if result is None else result

    def describe(self) -> dict:
        function = self.resolve()
        return {"target": self.target, "kwargs": self.kwargs, "doc": inspect.getdoc(function) or ""}


def resolve_callable(target: str, root: Path | None = None) -> Callable[..., Any]:
    """Import the callable named by ``target`` (a relative ``file.py`` under ``root``, default the cwd)
    or explain why it cannot be found."""
    if ":" in target:
        module_name, attr = target.rsplit(":", 1)
    elif "." in target:
        module_name, attr = target.rsplit(".", 1)
    else:
        raise HypothesisPatchError(
            f"hypothesis patch {target!r} is not a dotted path", "write 'package.module:function' or 'file.py:function'"
        )
    try:
        if module_name.endswith(".py"):
            path = Path(module_name).expanduser()
            if root is not None and not path.is_absolute():
                path = Path(root) / path
            if not path.exists():
                raise HypothesisPatchError(
                    f"patch file {path} does not exist",
                    "check the path (in a parameter file, a relative path is resolved against the repository "
                    "holding that file, or its own folder outside a repository)",
                )
            spec = importlib.util.spec_from_file_location(f"driftscope_patch_{path.stem}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except ImportError as err:
        raise HypothesisPatchError(
            f"cannot import {module_name!r} for hypothesis patch {target!r}: {err}",
            "make the module importable (installed or on PYTHONPATH) or use 'file.py:function'",
        ) from err
    except HypothesisPatchError:
        raise
    except Exception as err:  # a module that fails while it is imported (SyntaxError, its own errors)
        raise HypothesisPatchError(
            f"importing {module_name!r} for hypothesis patch {target!r} raised {type(err).__name__}: {err}",
            "fix the module so that it imports",
        ) from err
    function = getattr(module, attr, None)
    if not callable(function):
        raise HypothesisPatchError(f"{module_name} has no callable {attr!r}", "name a function that takes the model")
    return function


def parse_patch(value: Any) -> HypothesisPatch | None:
    """A parameter-file ``patch`` entry: a string, or ``{callable: ..., kwargs: {...}}``."""
    if value is None:
        return None
    if isinstance(value, str):
        return HypothesisPatch(value)
    if isinstance(value, dict) and isinstance(value.get("callable"), str):
        extra = sorted(set(value) - {"callable", "kwargs"})
        if extra or not isinstance(value.get("kwargs", {}), dict):
            raise HypothesisPatchError(
                f"patch entry has unknown keys {extra}", "use {callable: 'pkg.mod:fn', kwargs: {...}}"
            )
        return HypothesisPatch(value["callable"], dict(value.get("kwargs", {})))
    raise HypothesisPatchError(f"patch must be a string or a mapping, got {value!r}", "write patch: 'pkg.mod:fn'")
