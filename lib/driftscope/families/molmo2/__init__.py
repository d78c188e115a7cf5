"""Molmo2: a SigLIP-style ViT read at several layers, an attention pooler driven by index tensors,
a SwiGLU projector whose output is added to the ``<im_patch>`` embeddings, and a Qwen3-style decoder.

The pieces here do not depend on the family interface yet: ``config`` (config facts and the mlx-vlm
loader), ``geometry`` / ``processor`` (crops, pooling indices, prompt), ``emitter`` (JAX), the tap
captures of transformers and mlx-vlm, ``hypotheses`` (patches for mlx-vlm's defects), ``plan`` and
``synthetic`` (tiny random checkpoints).
"""
