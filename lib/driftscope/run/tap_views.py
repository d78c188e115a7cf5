"""Reading a tap by its axes' names, and looking at it with treescope (``driftscope.open_run``'s helpers).

A stage's sidecar declares its axes (``["crops", "patches", "hidden"]``, ``["tokens", "heads", "head_dim"]``): a tap
is indexed by those names (``taps.sel("vision.block.0", crops=0, patches=264)``), an unknown name answered with the
names it has and the closest one; and a tap or a difference is shown as treescope's interactive array view with
those names on its axes, where treescope is installed (``pip install treescope``).
"""

from __future__ import annotations

import numpy as np

from driftscope.core.markup import format_number
from driftscope.core.markup import html_text as escape
from driftscope.errors import RuntimeUnavailableError, TapFileError, did_you_mean


def axes_of(declaration: dict, ndim: int) -> tuple[str, ...]:
    """The declared names of a stage's axes (``axis0``, ``axis1``, ... where the sidecar names fewer)."""
    named = [str(axis) for axis in declaration.get("axes") or []]
    return tuple(named[:ndim]) + tuple(f"axis{i}" for i in range(len(named), ndim))


def select(array: np.ndarray, axes: tuple[str, ...], index: dict, what: str) -> tuple[np.ndarray, tuple[str, ...]]:
    """``array`` indexed by axis name (an int, a slice or a list per name); the remaining axes' names."""
    unknown = [name for name in index if name not in axes]
    if unknown:
        raise TapFileError(
            f"{what} has no axis {unknown[0]!r}: its axes are {list(axes)}",
            f"{did_you_mean(unknown[0], list(axes))}index it by one of those names",
        )
    key = tuple(index.get(name, slice(None)) for name in axes)
    kept = tuple(name for name in axes if not isinstance(index.get(name, slice(None)), int | np.integer))
    return np.asarray(array)[key], kept


def treescope_view(array: np.ndarray, axes: tuple[str, ...], around_zero: bool = False):
    """treescope's interactive view of ``array`` (its axes named; a difference coloured around zero)."""
    try:
        import treescope
    except ImportError:
        raise RuntimeUnavailableError(
            "treescope is not installed, so there is no interactive array view",
            "pip install treescope (the numbers are the same: the array itself, or .delta of a difference)",
        ) from None
    labels = dict(enumerate(axes))
    return treescope.render_array(np.asarray(array, dtype=np.float32), axis_labels=labels, around_zero=around_zero)


def html_table(header: list[str], rows: list[list], caption: str = "") -> str:
    head = "".join(f"<th>{escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(v))}</td>" for v in row) + "</tr>" for row in rows)
    title = f"<caption style='text-align:left'>{escape(caption)}</caption>" if caption else ""
    return f"<table>{title}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def number(value) -> str:
    """A cell of a tap view: four significant digits, "-" for none."""
    return format_number(value, 4, missing="-")
