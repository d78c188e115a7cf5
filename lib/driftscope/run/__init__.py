"""Layer 8, one investigation: parameters, preflight, the pipeline (``investigation``), the report, run records,
locks, output directories and the patch trial on a finished run."""
