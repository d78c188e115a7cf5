"""Drawing every family's geometry page shares: the attention mask in one colour convention."""

from __future__ import annotations

from typing import Any

#: One colour convention for every attention-mask picture (a cell is a query row against a key row).
MAY_ATTEND_COLOUR = "#08306b"  # dark blue: the query may attend to the key
BLOCKED_COLOUR = "#f2f2f2"  # light grey: blocked
MASK_GID = "attention-mask"  # the ``gid`` of every mask image, so a test finds them on any family's page


def draw_attention_mask(axis: Any, allowed: Any, title: str) -> Any:
    """Draw a boolean ``[query, key]`` mask on ``axis`` in the one convention, with a legend saying which colour
    may attend; returns the image artist."""
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    shown = axis.imshow(
        np.asarray(allowed, dtype=bool).astype(np.int8),
        cmap=ListedColormap([BLOCKED_COLOUR, MAY_ATTEND_COLOUR]),
        vmin=0,
        vmax=1,
        interpolation="nearest",
    )
    shown.set_gid(MASK_GID)
    handles = [Patch(color=MAY_ATTEND_COLOUR, label="may attend"), Patch(color=BLOCKED_COLOUR, label="blocked")]
    axis.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axis.set_title(title, fontsize=9)
    axis.set_xlabel("key row")
    axis.set_ylabel("query row")
    return shown
