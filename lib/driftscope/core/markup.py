"""Text from a run (run names, runtime labels, stage ids, error messages) made safe for Markdown and HTML.

Notebook outputs in Markdown are rendered to HTML by JupyterLab and nbconvert, which pass raw HTML through:
a runtime label ``<script>...</script>`` would become a script in the rendered evidence. Every value from a
report goes into Markdown through :func:`code` or :func:`text`, and into HTML through :func:`html_text`.
"""

from __future__ import annotations

import html
import math
import re

_MARKDOWN_PUNCTUATION = re.compile(r"([\\`*_\[\]|~])")  # emphasis, code, links, tables


def html_text(value: object) -> str:
    """``value`` as HTML text (``<``, ``>``, ``&`` and quotes escaped)."""
    return html.escape(str(value), quote=True)


def format_number(value: object, digits: int = 3, missing: str = "non-finite") -> str:
    """A value for display: a float to ``digits`` significant digits, anything else as ``str``; None (in a report's
    JSON, a non-finite value or none) and NaN as ``missing``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def listed(value: object, sep: str = ", ") -> str:
    """A list as words, never its repr: ``listed([1, 16, 16], " x ")`` is ``1 x 16 x 16``; a list of lists joins
    each with ``sep`` and them with ``"; "``; anything else is ``str(value)``."""
    if isinstance(value, list | tuple):
        if value and all(isinstance(v, list | tuple) for v in value):
            return "; ".join(listed(v, sep) for v in value)
        return sep.join(map(str, value))
    return str(value)


def text(value: object) -> str:
    """``value`` as Markdown text that renders as itself: HTML escaped, Markdown punctuation backslashed."""
    return _MARKDOWN_PUNCTUATION.sub(r"\\\1", html.escape(str(value), quote=False))


def code(value: object, in_table: bool = False) -> str:
    """``value`` as Markdown inline code, whatever backticks it holds (the renderer escapes code spans).

    ``in_table``: the span sits in a table cell, where a bare ``|`` would end the cell (GFM)."""
    body = str(value).replace("\n", " ")
    if in_table:
        body = body.replace("|", "\\|")
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if longest or body.startswith(" ") or body.endswith(" ") else ""
    return f"{fence}{pad}{body}{pad}{fence}"
