"""Compiled paths: lowering the emitter to StableHLO, compiling it with IREE, caching artifacts."""
