"""Molmo2 on the compiled path: ``model`` (the ViT, pooling and projector in JAX, with the single-stage functions
for replays), ``weights`` (its spec and weights), ``text`` (the decoder), ``program`` (what the ``jax`` and ``iree``
runtimes ask)."""
