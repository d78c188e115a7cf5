"""Ready patches that close defects the sweep found in mlx-vlm ports, one module per model type
(``fixes/<model_type>.py``): each module's public functions are patches (``driftscope.hypotheses:NAME``), its
``CLOSES`` says which introduced errors each closes, ``WHOLE`` which patch closes every defect of a model type's port
(per runtime), and docs/families.md shows each defect with its reproduction.
A patch checks that it is given the port it corrects and refuses any other model. Where transformers itself departs
from a model's original code, the patch is for its runtime (``CLOSES`` says ``runtimes: ("transformers",)``)."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable

PATCHES: dict[str, Callable] = {}
CLOSES: dict[str, dict] = {}
#: model type -> runtime -> the patch closing every defect found in that runtime's port of it
WHOLE: dict[str, dict[str, str]] = {}

for _found in pkgutil.iter_modules(__path__):
    _module = importlib.import_module(f"{__name__}.{_found.name}")
    for _name in getattr(_module, "__all__", ()):
        PATCHES[_name] = getattr(_module, _name)
    CLOSES.update(getattr(_module, "CLOSES", {}))
    WHOLE.update(getattr(_module, "WHOLE", {}))
