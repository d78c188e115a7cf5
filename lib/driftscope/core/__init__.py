"""Layer 0, what every layer uses and no model knows: registries, atomic writes, safe names, output roots, git."""
