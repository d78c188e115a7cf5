"""Layer 5, running a checkpoint: the runtimes (engines that know no family and ask it), the compiled path,
quantized loading, runtime checks, hypothesis patches and the stage listing."""
