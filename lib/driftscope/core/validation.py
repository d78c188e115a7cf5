"""jsonschema's validator, imported without its optional IRI grammar.

``import jsonschema`` imports ``rfc3987_syntax`` when it is installed (Jupyter's event schemas pull it in), and
that module builds a Lark grammar at import: 4-6 s on the CI machine, for ``format: iri`` checks driftscope
never asks for (no validator here gets a ``format_checker``). Every driftscope schema check imports jsonschema
through :func:`draft_2020_12`, which hides that one optional module while jsonschema is first imported and
leaves it importable for everyone else afterwards.
"""

from __future__ import annotations

import sys

OPTIONAL_GRAMMAR = "rfc3987_syntax"


def draft_2020_12():
    """``jsonschema.Draft202012Validator`` (jsonschema imported without ``rfc3987_syntax`` if not yet imported)."""
    if "jsonschema" not in sys.modules and OPTIONAL_GRAMMAR not in sys.modules:
        sys.modules[OPTIONAL_GRAMMAR] = None  # an ImportError for jsonschema's optional ``import rfc3987_syntax``
        try:
            import jsonschema  # noqa: F401
        finally:
            if sys.modules.get(OPTIONAL_GRAMMAR, 0) is None:
                del sys.modules[OPTIONAL_GRAMMAR]
    from jsonschema import Draft202012Validator

    return Draft202012Validator
