"""Ready hypothesis patches for ports the generic family reads (``patch: driftscope.hypotheses:NAME``): each
changes the loaded model of the runtime it is given (transformers' or mlx-vlm's), in place, to test a "what if";
none is applied unless a parameter file names it. The patches that close a defect the sweep found in an mlx-vlm
port say which (docs/families.md) and are listed in ``CLOSES``.

A patched MLX module keeps its identity and its path (its class is swapped for a subclass whose call differs),
so the taps that name it still find it.
"""

from __future__ import annotations

from typing import Any

from ..capabilities import HypothesesCapabilities
from .fixes import CLOSES as _FIXES_CLOSE
from .fixes import PATCHES as _FIXES
from .patching import mlx_output, torch_output, vision_blocks

__all__ = ["scale_block_output", *_FIXES]
globals().update(_FIXES)

#: Which introduced errors each ready patch closes: its runtime and the stages where the error is introduced (a
#: fix also names its ``model_types``: a stage id like ``text.layer.0.mlp`` is every generic family's).
CLOSES: dict[str, dict] = dict(_FIXES_CLOSE)
CAPABILITIES = HypothesesCapabilities(closes=CLOSES)


def scale_block_output(model: Any, block: int, factor: float = 1.01) -> Any:
    """Multiply vision block ``block``'s output by ``factor`` (a planted defect in one block)."""
    owner, blocks = vision_blocks(model)
    if owner == "torch":
        torch_output(blocks[block], lambda out: out * factor)
    else:
        mlx_output(blocks[block], lambda out: out * factor)
    return model
