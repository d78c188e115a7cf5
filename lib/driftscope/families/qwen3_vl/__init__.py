"""Qwen3-VL (DeepStack): the stage plan, geometry, mlx-vlm config adaptation, JAX emitter and tiny checkpoint.

Not registered as a family yet: the Family interface lands with the family-packages restructuring.
"""
