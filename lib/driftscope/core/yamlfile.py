"""YAML as a user writes it: ``1e-4`` is the number 1e-4.

PyYAML follows YAML 1.1, whose float needs a dot (``1.0e-4``): ``atol: 1e-4``, the notation of the README
itself, became the string ``"1e-4"``, which a tolerance check then refused. This loader also reads a number
written with an exponent and no dot, an optional sign, and an optional exponent sign, as a float (YAML 1.2's
core schema does); every other value reads as ``yaml.safe_load`` reads it.
"""

from __future__ import annotations

import re
from typing import Any

import yaml


class NumberLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` with YAML 1.2's floats (``1e-4``, ``-2E+3``, ``5e0``) as well."""


_EXPONENT_FLOAT = re.compile(r"^[-+]?[0-9]+(?:\.[0-9]*)?[eE][-+]?[0-9]+$")
NumberLoader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789"))


def load_yaml(text: str) -> Any:
    """The YAML document in ``text``, numbers read the way a user writes them."""
    return yaml.load(text, Loader=NumberLoader)  # noqa: S506 - a SafeLoader subclass
