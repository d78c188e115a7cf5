"""Qwen3-VL-MoE in JAX: the sparse decoder MLP (router, top-k, experts) of every sparse layer, on the
precision contract of ``driftscope.taps.jax.layers`` (a building block of the compiled path: the tower and the
dense decoder pieces are Qwen3-VL's emitter)."""
