"""MLX module names and layouts <-> a checkpoint's tensor names and layouts.

mlx-vlm renames a checkpoint's tensors when it loads them (``visual.`` -> ``vision_tower.``) and
transposes convolution weights to channels-last; MLX-community checkpoints are saved in that naming.
A :class:`NameMap` undoes it, so weights read from such a checkpoint are keyed and laid out as the
family's dense checkpoints are (what transformers and the JAX emitter read).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class NameMap:
    """Prefix renames (first match wins) and per-suffix axis permutations, MLX -> checkpoint."""

    renames: tuple[tuple[str, str], ...]
    #: (name suffix, axes): ``np.transpose(mlx_array, axes)`` is the checkpoint's layout
    permutes: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def to_checkpoint(self, name: str) -> str:
        for mlx_prefix, checkpoint_prefix in self.renames:
            if name.startswith(mlx_prefix):
                return checkpoint_prefix + name[len(mlx_prefix) :]
        return name

    def to_mlx(self, name: str) -> str:
        for mlx_prefix, checkpoint_prefix in self.renames:
            if name.startswith(checkpoint_prefix):
                return mlx_prefix + name[len(checkpoint_prefix) :]
        return name

    def axes(self, name: str) -> tuple[int, ...] | None:
        """The permutation from MLX's layout to the checkpoint's for tensor ``name`` (either naming)."""
        return next((axes for suffix, axes in self.permutes if name.endswith(suffix)), None)

    def array_to_checkpoint(self, name: str, array: np.ndarray) -> np.ndarray:
        axes = self.axes(name)
        return array if axes is None else np.ascontiguousarray(np.transpose(array, axes))

    def array_to_mlx(self, name: str, array: np.ndarray) -> np.ndarray:
        axes = self.axes(name)
        return array if axes is None else np.ascontiguousarray(np.transpose(array, np.argsort(axes)))

    def weights_to_checkpoint(self, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """MLX-named weights renamed and laid out as the checkpoint's."""
        return {self.to_checkpoint(name): self.array_to_checkpoint(name, value) for name, value in weights.items()}
