"""Qwen3-VL on the compiled path: ``model`` (the vision tower with its DeepStack branches, in JAX), ``weights``
(its specs and weights), ``text`` (the decoder), ``program`` (what the ``jax`` and ``iree`` runtimes ask)."""
