"""Qwen3-VL-MoE in JAX for the compiled runtimes: Qwen3-VL's emitted tower and decoder layers, with the sparse MLP
(router, top-k, experts) in the sparse layers (``text``), wired for ``jax`` and ``iree`` (``program``)."""
