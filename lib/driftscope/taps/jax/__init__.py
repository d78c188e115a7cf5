"""The JAX layer library a family's emitter is written with (``layers``) and its lowering to StableHLO
(``graph``); compiling and running the lowered graph is capture's (``driftscope.capture.iree``)."""
