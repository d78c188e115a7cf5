"""Screening: many inputs through every runtime's cheap path (the tower output, the prefill logits, greedy and
teacher-forced tokens), one divergence score per input, then the full investigation of the inputs that deviate
most. ``driftscope screen PARAMS --images GLOB`` (``screen.runner.screen``)."""
