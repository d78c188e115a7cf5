"""What quantization needs to know about a model family, as one :class:`QuantProfile` the family provides.

A family folder's ``quantization`` module defines ``PROFILE`` and its ``FAMILY`` names that module
(``Family.quantization``); a family without one runs no quantized policy. The profile says which tensors
belong to the vision and the text side in both namings (the family's dense checkpoints and mlx-vlm's
modules), how MLX names map back to checkpoint names, the config an MLX-community directory carries
(and the one a dense checkpoint dequantized from it carries), and which stages are the output of a single
linear layer (for the same-input linear replay).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from driftscope.model.quant.names import NameMap
from driftscope.model.quant.select import TensorGroups


def _same(config: dict) -> dict:
    return dict(config)


def _no_linear(stage_id: str) -> LinearSite | None:
    return None


@dataclass(frozen=True)
class LinearSite:
    """A stage that is one linear layer's output: the layer's MLX module path and how its output is laid out.

    The layer's input is the stage's one replay input (``Family.replay_inputs``). ``view(output, shape)``
    turns the layer's ``(rows, out_features)`` output into the stage's ``shape`` (e.g. the value third of a
    fused q/k/v projection); None: the output is the stage as it is.
    """

    module: str
    view: Callable[[np.ndarray, tuple[int, ...]], np.ndarray] | None = None

    def stage_value(self, output: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return output if self.view is None else self.view(output, shape)


@dataclass(frozen=True)
class QuantProfile:
    checkpoint: TensorGroups  # names in the family's dense checkpoints (what transformers saves)
    mlx: TensorGroups  # names of mlx-vlm's modules, and of MLX-community checkpoints
    mlx_names: NameMap  # MLX -> checkpoint
    #: the config.json an MLX-community directory of this family carries (what mlx-vlm's own loader reads),
    #: from the family's dense config; the family's own MLX loader reads both
    mlx_config: Callable[[dict], dict] = _same
    #: stage id -> the linear layer whose output it is (None: not a single linear's output)
    linears: Callable[[str], LinearSite | None] = _no_linear
    #: the config.json of a dense checkpoint dequantized from one of this family's checkpoints (either kind),
    #: as transformers and the JAX emitter read it
    dense_config: Callable[[dict], dict] = _same
