"""What a family's emitter loads for the compiled runtimes, and what a hypothesis patch of them receives."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class EmittedModel:
    """What a hypothesis patch receives for the compiled runtimes: the spec and the float32 weights."""

    spec: Any
    weights: dict[str, np.ndarray]
    checkpoint: Any = None  # where weights read on demand come from (e.g. the text decoder's, for its replays)
    text: Any = None  # the family's text decoder spec and weights, once read
    #: the text decoder's weights by the emitter's names, as its graphs receive them (once read; the load audit's
    #: ``LoadLayout.later["text"]`` checks them after the text capture)
    text_weights: dict[str, np.ndarray] | None = None
