"""Quantized weights: policies, host quantization and dequantization, MLX-community checkpoints.

One concern per module; none of them knows a model family (the family's names come in a
:class:`~driftscope.model.quant.profiles.QuantProfile`). MLX is imported only where MLX runs.

- ``policy``: the ``q4``/``q8`` policies (fused or dequantized, f32/f16/bf16 activations) and their options.
- ``select``: which tensors a scope quantizes, and the layers left dense (width not a multiple of the group).
- ``affine``: MLX's affine quantizer, and a numpy dequantization bit-identical to ``mx.dequantize``.
- ``host``: quantize a dense checkpoint's weights on the host; the dequantized dense weights.
- ``mlx_checkpoint``: read and write MLX-community quantized checkpoint directories (``directory``: staged writes).
- ``dense_checkpoint``: write dequantized weights as a dense checkpoint every runtime already loads.
- ``names`` / ``profiles``: MLX module names <-> checkpoint names; what a family tells quantization (its profile).

Running them is capture's (``capture.quantized``: what loads under a quantized policy; ``capture.linear_replay``
and ``capture.linear_controls``: one quantized linear fused and dequantized on the same input); which of several
references a candidate is closer to is judge's (``judge.attribution``).
"""

from __future__ import annotations
