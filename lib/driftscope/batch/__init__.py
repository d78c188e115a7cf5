"""Layer 9, many runs: batches over parameter files and commits, executors, workers, the evidence index."""
