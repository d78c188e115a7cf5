"""JAX's persistent compilation cache for the ``jax`` runtime, in driftscope's cache folder."""

from __future__ import annotations

from pathlib import Path

#: the JAX compilation cache's bound: the least recently used executables go past it
JAX_CACHE_BYTES = 2 << 30


def use_persistent_cache(cache_dir: str | None = None) -> None:
    """JAX's persistent compilation cache in the ``jax`` folder of the runtime's ``cache_dir`` option, else of
    driftscope's cache folder (``$DRIFTSCOPE_CACHE``, else the user cache folder); every executable kept however
    fast it compiled. An XLA executable is then compiled once per machine, not once per process and runtime object
    (batch runs, notebooks and a test run's workers share it); XLA keys each entry by the HLO, the compile options,
    the backend and the jax/jaxlib versions. The first directory a process sets is kept, and so is one the user set
    (``JAX_COMPILATION_CACHE_DIR``)."""
    import jax

    from driftscope.capture.iree import default_cache_dir

    if jax.config.jax_compilation_cache_dir is None:
        root = Path(cache_dir) if cache_dir else default_cache_dir().parent
        jax.config.update("jax_compilation_cache_dir", str(root / "jax"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        # a bound turns on JAX's file lock around every read and write: without one an entry is written in place,
        # and a second process could read it half-written
        jax.config.update("jax_compilation_cache_max_size", JAX_CACHE_BYTES)
