"""MLX module names and layouts <-> a checkpoint's tensor names and layouts.

mlx-vlm renames a checkpoint's tensors when it loads them (``visual.`` -> ``vision_tower.``), transposes
convolution weights to channels-last, and may split one stored tensor into several modules (a mixture of experts'
``experts.gate_up_proj`` [experts, hidden, 2 x intermediate] into ``switch_mlp.gate_proj`` and ``up_proj``, each
[experts, intermediate, hidden]); MLX-community checkpoints are saved in that naming. A :class:`NameMap` undoes
it, so weights read from such a checkpoint are keyed and laid out as the family's dense checkpoints are (what
transformers and the JAX emitter read), and does it, so a dense checkpoint's tensors can be quantized in MLX's
layout (groups along each matrix's input axis) as ``nn.quantize`` quantizes the loaded model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Joined:
    """One checkpoint tensor that MLX holds as one or more tensors of its own (``parts``, in order): each part
    permuted by ``axes`` into the checkpoint's layout, then the parts concatenated along ``axis`` (equal sizes).

    Names are suffixes: a name ending in ``checkpoint`` (after the prefix renames) is the joined tensor, one ending
    in a part's suffix is that part.
    """

    checkpoint: str  # e.g. ".mlp.experts.gate_up_proj"
    parts: tuple[str, ...]  # e.g. (".mlp.switch_mlp.gate_proj.weight", ".mlp.switch_mlp.up_proj.weight")
    axes: tuple[int, ...] | None = None  # MLX -> checkpoint permutation of each part
    axis: int = -1  # concatenation axis, in the checkpoint's layout

    def part(self, name: str) -> int | None:
        return next((i for i, suffix in enumerate(self.parts) if name.endswith(suffix)), None)

    def stem(self, name: str, suffix: str) -> str:
        return name[: len(name) - len(suffix)]

    def join(self, parts: list[np.ndarray]) -> np.ndarray:
        laid = [part if self.axes is None else np.transpose(part, self.axes) for part in parts]
        return np.ascontiguousarray(laid[0] if len(laid) == 1 else np.concatenate(laid, axis=self.axis))

    def part_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of each part (MLX's layout) of a joined tensor of ``shape``."""
        laid = list(shape)
        laid[self.axis] //= len(self.parts)
        return tuple(laid) if self.axes is None else tuple(laid[i] for i in np.argsort(self.axes))

    def split(self, array: np.ndarray) -> list[np.ndarray]:
        pieces = np.split(array, len(self.parts), axis=self.axis)
        inverse = None if self.axes is None else tuple(np.argsort(self.axes))
        return [np.ascontiguousarray(p if inverse is None else np.transpose(p, inverse)) for p in pieces]


@dataclass(frozen=True)
class NameMap:
    """Prefix renames (first match wins), per-suffix axis permutations and joined tensors, MLX -> checkpoint."""

    renames: tuple[tuple[str, str], ...]
    #: (name suffix, axes): ``np.transpose(mlx_array, axes)`` is the checkpoint's layout
    permutes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    #: checkpoint tensors MLX stores as other names, or as several tensors
    joins: tuple[Joined, ...] = ()

    def _rename(self, name: str, to_checkpoint: bool) -> str:
        for mlx_prefix, checkpoint_prefix in self.renames:
            source, target = (mlx_prefix, checkpoint_prefix) if to_checkpoint else (checkpoint_prefix, mlx_prefix)
            if name.startswith(source):
                return target + name[len(source) :]
        return name

    def joined(self, name: str) -> tuple[Joined, int] | None:
        """The join an MLX name is part ``i`` of, as ``(join, i)`` (None: not part of one)."""
        for join in self.joins:
            index = join.part(name)
            if index is not None:
                return join, index
        return None

    def split_of(self, name: str) -> Joined | None:
        """The join a checkpoint name is the joined tensor of (None: not one)."""
        return next((join for join in self.joins if name.endswith(join.checkpoint)), None)

    def to_checkpoint(self, name: str) -> str:
        """The checkpoint tensor holding MLX tensor ``name`` (for a part: the joined tensor)."""
        renamed = self._rename(name, True)
        found = self.joined(renamed)
        if found is None:
            return renamed
        join, index = found
        return join.stem(renamed, join.parts[index]) + join.checkpoint

    def to_mlx(self, name: str) -> str:
        """The MLX name of checkpoint tensor ``name`` (for a joined tensor: its first part)."""
        join = self.split_of(name)
        if join is not None:
            name = join.stem(name, join.checkpoint) + join.parts[0]
        return self._rename(name, False)

    def axes(self, name: str) -> tuple[int, ...] | None:
        """The permutation from MLX's layout to the checkpoint's for tensor ``name`` (either naming)."""
        return next((axes for suffix, axes in self.permutes if name.endswith(suffix)), None)

    def array_to_checkpoint(self, name: str, array: np.ndarray) -> np.ndarray:
        axes = self.axes(name)
        return array if axes is None else np.ascontiguousarray(np.transpose(array, axes))

    def array_to_mlx(self, name: str, array: np.ndarray) -> np.ndarray:
        axes = self.axes(name)
        return array if axes is None else np.ascontiguousarray(np.transpose(array, np.argsort(axes)))

    def part_from_checkpoint(self, name: str, read: Callable[[str], np.ndarray]) -> np.ndarray:
        """MLX tensor ``name``'s values in MLX's layout, from the checkpoint tensor holding it (``read(name)``)."""
        stored = read(self.to_checkpoint(name))
        found = self.joined(self._rename(name, True))
        if found is None:
            return self.array_to_mlx(name, stored)
        join, index = found
        return join.split(stored)[index]

    def weights_to_checkpoint(self, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """MLX-named weights renamed and laid out as the checkpoint's (joined parts joined)."""
        out: dict[str, np.ndarray] = {}
        pending: dict[str, tuple[Joined, dict[int, np.ndarray]]] = {}
        for name, value in weights.items():
            renamed = self._rename(name, True)
            found = self.joined(renamed)
            if found is None:
                out[renamed] = self.array_to_checkpoint(name, value)
                continue
            join, index = found
            target = join.stem(renamed, join.parts[index]) + join.checkpoint
            pending.setdefault(target, (join, {}))[1][index] = value
        for target, (join, parts) in pending.items():
            if len(parts) != len(join.parts):
                missing = [join.parts[i] for i in range(len(join.parts)) if i not in parts]
                raise KeyError(f"{target} needs every part of {join.parts}; missing {missing}")
            out[target] = join.join([parts[i] for i in range(len(join.parts))])
        return out

    def parts_of(self, name: str) -> list[str]:
        """The MLX names of checkpoint tensor ``name``'s parts (one name when it is not joined)."""
        join = self.split_of(name)
        if join is None:
            return [self._rename(name, False)]
        stem = join.stem(name, join.checkpoint)
        return [self._rename(stem + suffix, False) for suffix in join.parts]

    def weights_to_mlx(self, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Checkpoint-named weights renamed and laid out as MLX's (joined tensors split into their parts)."""
        out: dict[str, np.ndarray] = {}
        for name, value in weights.items():
            join = self.split_of(name)
            if join is None:
                mlx = self._rename(name, False)
                out[mlx] = self.array_to_mlx(mlx, value)
                continue
            out.update(zip(self.parts_of(name), join.split(value), strict=True))
        return out
