"""Layer 6, judging taps: contracts, comparison rows, layout alignment, traversal, relative and peer verdicts,
closer-to attribution, answer parity and lineage."""
