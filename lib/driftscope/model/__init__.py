"""Layer 1, the model on disk: checkpoints and their storage, weight files, precision policies, TF32, quantized
weights, the BLAS MLX loads, and what every tiny-checkpoint builder shares."""
