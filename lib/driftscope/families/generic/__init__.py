"""The generic family: any VLM that transformers and mlx-vlm both implement, its stage plan read from the two
loaded models (work in progress: no ``FAMILY`` yet, so the registry skips this folder)."""
