"""Our own JAX implementations of vision towers, lowered to StableHLO for the compiled runtimes."""
