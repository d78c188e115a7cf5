"""The sink every engine writes captured stages into (only the selected plan's stages are kept), and the
greedy decode every engine's text side runs from its prefill."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from driftscope.core.numeric import top2_margin
from driftscope.taps.stages import StagePlan
from driftscope.taps.tapset import TapWriter

Progress = Callable[[str], None]


def put_greedy(sink, first_logits: np.ndarray, step, max_new_tokens: int) -> None:
    """Greedy decode from the prefill's last logits; ``step(token) -> logits`` runs the runtime's cached step."""
    tokens, margins = [int(np.argmax(first_logits))], [top2_margin(first_logits)]
    for _ in range(max_new_tokens - 1):
        logits = step(tokens[-1])
        tokens.append(int(np.argmax(logits)))
        margins.append(top2_margin(logits))
    sink.put("text.generate.tokens", np.array(tokens, dtype=np.int64))
    sink.put("text.generate.margins", np.array(margins, dtype=np.float64))


class StageSink:
    """What a runtime writes captured stages into: only stages of the selected plan are kept."""

    def __init__(self, writer: TapWriter, plan: StagePlan, progress: Progress | None = None):
        self.writer = writer
        self.plan = plan
        self.progress = progress
        self.count = 0
        self._last_report = time.monotonic()

    def put_bounds(self, stage_id: str, bounds: np.ndarray) -> None:
        """Attention bounds as segments (repeats dropped), recording how many empty windows there were."""
        raw = np.asarray(bounds)
        canonical = raw[np.concatenate([[True], raw[1:] != raw[:-1]])] if raw.size else raw
        self.put(stage_id, canonical, raw_length=int(raw.size), empty_windows=int(raw.size - canonical.size))

    def wants(self, stage_id: str) -> bool:
        return stage_id in self.plan and stage_id not in self.writer

    def put(self, stage_id: str, value: Any, **declaration: Any) -> None:
        """Write a stage now; ``declaration`` adds facts to its sidecar entry."""
        if not self.wants(stage_id):
            return
        self.writer.add(self.plan[stage_id], np.asarray(value), **declaration)
        self.count += 1
        now = time.monotonic()
        if self.progress is not None and (now - self._last_report > 2.0 or self.count == len(self.plan)):
            self.progress(f"{self.count}/{len(self.plan)} stages, last {stage_id}")
            self._last_report = now
