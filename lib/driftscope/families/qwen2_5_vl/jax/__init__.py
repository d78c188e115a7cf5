"""Qwen2.5-VL on the compiled path: ``model`` (the vision tower in JAX), ``text`` (the decoder in JAX),
``program`` (what the ``jax`` and ``iree`` runtimes ask of the family)."""
