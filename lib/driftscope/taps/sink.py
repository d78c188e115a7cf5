"""The sink every engine writes captured stages into (only the selected plan's stages are kept), and the
greedy decode every engine's text side runs from its prefill."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from driftscope.core.numeric import top2_margin
from driftscope.taps.answer_question import AnswerQuestion
from driftscope.taps.stages import Rotary, Stage, StagePlan
from driftscope.taps.tapset import TapWriter

Progress = Callable[[str], None]


def decode_stages(max_new_tokens: int, rotary: Rotary | None = None) -> list[Stage]:
    """The stages :func:`put_greedy` writes: decoded past the prefill, functions of decode steps nothing captures,
    so never replayed. ``rotary``: how the decoder rotates its keys (the cached keys are after RoPE)."""
    return [
        Stage(
            "text.generate.tokens", ("steps",), integer=True, description=f"greedy tokens ({max_new_tokens})", data=True
        ),
        Stage("text.generate.margins", ("steps",), side=True, description="top-1 minus top-2 logit at each step"),
        Stage(
            "text.forced.tokens",
            ("steps",),
            integer=True,
            description="the tokens fed teacher-forced: the reference's greedy tokens",
            data=True,
        ),
        Stage(
            "text.forced.logits",
            ("steps", "vocab"),
            side=True,  # decode outputs: compared under their contract keys, never replayed (like the margins)
            description="teacher-forced logits: row i after feeding the reference's first i tokens (0: the prefill's)",
        ),
        *cache_stages(rotary),
    ]


#: the KV cache's phases: at the end of the prefill, and after the last teacher-forced step
CACHE_PHASES = {"prefill": "at the end of the prefill", "forced": "after the last teacher-forced step"}


def cache_stages(rotary: Rotary | None = None) -> list[Stage]:
    """The KV cache :func:`put_greedy` writes from the decoder's ``cache_snapshot``: every attention layer's keys
    (after RoPE, rotated as ``rotary`` declares) and values of every position, ``[layers, kv_heads, positions,
    head_dim]``. Layers that keep no keys and values (a hybrid model's convolution or linear-attention state) are
    not in it: the sidecar's ``decoder_layers`` names the layers it holds where the snapshot says."""
    return [
        Stage(
            f"text.cache.{phase}.{kind}",
            ("layers", "kv_heads", "positions", "head_dim"),
            side=True,
            description=f"the KV cache's {kind} {said}, attention layers only"
            + (" (after RoPE)" if kind == "keys" else ""),
            rotary=rotary if kind == "keys" else None,
        )
        for phase, said in CACHE_PHASES.items()
        for kind in ("keys", "values")
    ]


#: ``cache_snapshot(kind) -> iterable`` of one array ``[kv_heads, positions, head_dim]`` per attention layer,
#: ``kind`` "keys" or "values": the cache as it holds now (every position written so far); where it has a
#: ``layers()`` attribute, that names the decoder layers it yields (a hybrid model's other layers keep no KV cache)
CacheSnapshot = Callable[[str], Iterable[Any]]


def put_cache(sink, phase: str, snapshot: CacheSnapshot | None) -> None:
    """Write the cache's keys and values for ``phase`` a layer at a time (never the whole cache in memory)."""
    if snapshot is None:
        return
    layers = getattr(snapshot, "layers", None)
    declared = {"decoder_layers": list(layers())} if layers is not None else {}
    for kind in ("keys", "values"):
        sink.put_rows(f"text.cache.{phase}.{kind}", snapshot(kind), **declared)


def compiled_cache(state: dict, kind: str):
    """Each layer's ``kind`` ("keys"/"values") ``[kv_heads, positions, head_dim]`` of a compiled decode's
    fixed-capacity cache ``state[kind]`` ``[layers, capacity, kv_heads, head_dim]``, up to the ``state["length"]``
    positions written so far."""
    cache = state[kind]
    for layer in range(cache.shape[0]):
        yield np.ascontiguousarray(np.swapaxes(cache[layer, : state["length"]], 0, 1), dtype=np.float32)


def put_greedy(
    sink,
    first_logits: np.ndarray,
    step,
    max_new_tokens: int,
    forced: np.ndarray | None = None,
    rewind: Callable[[int], None] | None = None,
    snapshot: CacheSnapshot | None = None,
) -> None:
    """Greedy decode from the prefill's last logits, and the teacher-forced pass over ``forced`` tokens.

    ``step(token) -> logits`` runs the runtime's cached decode step; ``rewind(n)`` (or ``step.rewind``) drops the
    last ``n`` tokens fed to that cache. Free-running greedy gives ``text.generate.tokens`` and ``.margins`` (what
    users see). The forced pass gives ``text.forced.logits`` ``[steps, vocab]``: row ``i`` is the logits after
    feeding ``forced[:i]`` (row 0 the prefill's), and ``text.forced.tokens`` (what was fed).
    Without ``forced`` (the reference) the forced tokens are the runtime's own greedy ones, so its forced logits are
    its greedy logits, streamed to the TapSet a row at a time. While the greedy tokens equal the forced ones the
    two passes share their steps; from the first differing token on, the cache is rewound to it and the forced
    tokens are fed: at most ``steps - 1`` more decode steps, none when the answers agree.
    ``snapshot`` (or ``step.cache_snapshot``, see :data:`CacheSnapshot`) gives the KV cache: ``text.cache.prefill.*``
    as it was before the first step and ``text.cache.forced.*`` once the forced pass is complete (the cache then
    holds the prompt and every forced token but the last: the same inputs in every runtime).
    A candidate fed the reference's answer (``sink.question``, :class:`~driftscope.taps.answer_question.
    AnswerQuestion`) free-runs first and takes the forced pass and the cache only where its answer is in question;
    the sidecar's ``answer_evidence`` says which were taken and why.
    """
    rewind = rewind if rewind is not None else getattr(step, "rewind", None)
    snapshot = snapshot if snapshot is not None else getattr(step, "cache_snapshot", None)
    question = getattr(sink, "question", None) if forced is not None else None
    if question is None or question.always:
        put_cache(sink, "prefill", snapshot)
        decode = _Decode(first_logits, step, max_new_tokens, forced, rewind)
        sink.put_rows("text.forced.logits", decode.forced_rows())
        decode.finish()
        _put_answer(sink, decode, snapshot)
        if question is not None:
            question.weigh(decode.tokens, decode.margins, [])
            sink.writer.meta["answer_evidence"] = question.record(True)
        return
    prefill = held_cache(sink, "prefill", snapshot)  # as it is now; written only if the answer is in question
    decode = _Decode(first_logits, step, max_new_tokens, forced, rewind)
    shared = decode.free_run()
    why = question.weigh(decode.tokens, decode.margins, shared)
    if not why:
        sink.writer.meta["answer_evidence"] = question.record(False)
        absent = sink.writer.meta.setdefault("declared_absent", {})
        absent.update({stage: question.absent_because() for stage in EVIDENCE_STAGES if sink.wants(stage)})
        sink.put("text.generate.tokens", np.array(decode.tokens, dtype=np.int64))
        sink.put("text.generate.margins", np.array(decode.margins, dtype=np.float64))
        return
    prefill()
    sink.put_rows("text.forced.logits", decode.forced_after(shared))
    _put_answer(sink, decode, snapshot)
    note = None if decode.forced_complete else "the tokens differ and this runtime's cache cannot be rewound"
    sink.writer.meta["answer_evidence"] = question.record(decode.forced_complete, note)


#: the answer's evidence a candidate takes only where its answer is in question (``taps.answer_question``)
EVIDENCE_STAGES = ("text.forced.tokens", "text.forced.logits", *(stage.id for stage in cache_stages()))


def _put_answer(sink, decode, snapshot) -> None:
    sink.put("text.generate.tokens", np.array(decode.tokens, dtype=np.int64))
    sink.put("text.generate.margins", np.array(decode.margins, dtype=np.float64))
    if decode.forced_complete:
        sink.put("text.forced.tokens", np.array(decode.forced, dtype=np.int64))
        put_cache(sink, "forced", snapshot)


def held_cache(sink, phase: str, snapshot: CacheSnapshot | None) -> Callable[[], None]:
    """The cache's keys and values for ``phase`` as they are now, held until the returned call writes them (a
    decode appends to the cache and a rewind overwrites its tail, and a sliding window drops its head)."""
    if snapshot is None or not any(sink.wants(f"text.cache.{phase}.{kind}") for kind in ("keys", "values")):
        return lambda: None
    layers = getattr(snapshot, "layers", None)
    declared = {"decoder_layers": list(layers())} if layers is not None else {}
    held = {kind: [np.array(layer, copy=True) for layer in snapshot(kind)] for kind in ("keys", "values")}

    def write() -> None:
        for kind, rows in held.items():
            sink.put_rows(f"text.cache.{phase}.{kind}", rows, **declared)
        held.clear()

    return write


class _Decode:
    """The greedy decode and the teacher-forced rows it shares steps with (see :func:`put_greedy`)."""

    def __init__(self, first_logits, step, steps: int, forced, rewind):
        self.step, self.steps, self.rewind = step, steps, rewind
        self.tokens, self.margins = [int(np.argmax(first_logits))], [top2_margin(first_logits)]
        self.first = np.asarray(first_logits, dtype=np.float32)
        self.own = forced is None  # the forced tokens are the greedy ones as they come
        self.forced = [] if forced is None else [int(t) for t in np.asarray(forced).reshape(-1)][:steps]
        self.rows = 0  # forced rows given so far
        self.forced_complete = False
        self._started = False

    def _greedy(self):
        """Every greedy step's logits, the prefill's first."""
        yield self.first
        for _ in range(self.steps - 1):
            logits = np.asarray(self.step(self.tokens[-1]), dtype=np.float32)
            self.tokens.append(int(np.argmax(logits)))
            self.margins.append(top2_margin(logits))
            yield logits

    def forced_rows(self):
        """The forced rows, streamed as they come; the greedy decode runs to its end either way."""
        self._started = True
        if not self.own and len(self.forced) < self.steps:  # too few forced tokens: greedy only
            for _ in self._greedy():
                pass
            return
        held, agree = [], True  # held: the shared rows of a cache that cannot be rewound
        for index, logits in enumerate(self._greedy()):
            if self.own:
                self.forced.append(self.tokens[index])
            # row ``index`` is a forced row while every token fed so far (tokens[:index]) is the forced one
            agree = agree and (index == 0 or self.tokens[index - 1] == self.forced[index - 1])
            if not agree:
                continue
            if self.rewind is None and not self.own:
                held.append(logits)
            else:
                self.rows += 1
                yield logits
        if held:
            if len(held) < self.steps:
                return  # the answers differ and this runtime's cache cannot be rewound: no forced stage
            self.rows = len(held)
            yield from held
        elif self.rows < self.steps:
            # the cache holds tokens[: steps - 1]; keep the agreeing ones (tokens[: rows - 1]), feed the forced rest
            self.rewind(self.steps - self.rows)
            for index in range(self.rows, self.steps):
                self.rows += 1
                yield np.asarray(self.step(self.forced[index - 1]), dtype=np.float32)
        self.forced_complete = True

    def free_run(self) -> list[np.ndarray]:
        """The greedy decode to its end; returns the rows it shares with the forced pass (row ``i`` while
        ``tokens[:i]`` are the forced ones), held for :meth:`forced_after`."""
        self._started = True
        shared, agree = [], len(self.forced) >= self.steps
        for index, logits in enumerate(self._greedy()):
            agree = agree and (index == 0 or self.tokens[index - 1] == self.forced[index - 1])
            if agree:
                shared.append(logits)
        return shared

    def forced_after(self, shared: list[np.ndarray]):
        """The forced rows after :meth:`free_run`: the ``shared`` ones, then, the cache rewound to the first
        differing token, the forced tokens fed from there (none where the cache cannot be rewound)."""
        if len(self.forced) < self.steps or (len(shared) < self.steps and self.rewind is None):
            return
        while shared:
            self.rows += 1
            yield shared.pop(0)
        if self.rows < self.steps:
            self.rewind(self.steps - self.rows)  # the cache holds tokens[: steps - 1]; keep tokens[: rows - 1]
            for index in range(self.rows, self.steps):
                self.rows += 1
                yield np.asarray(self.step(self.forced[index - 1]), dtype=np.float32)
        self.forced_complete = True

    def finish(self) -> None:
        if not self._started:  # the plan has no forced stage: decode greedily all the same
            for _ in self._greedy():
                pass


class StageSink:
    """What a runtime writes captured stages into: only stages of the selected plan are kept."""

    def __init__(self, writer: TapWriter, plan: StagePlan, progress: Progress | None = None):
        self.writer = writer
        self.plan = plan
        self.progress = progress
        self.count = 0
        self._last_report = time.monotonic()
        #: the reference's answer a candidate's decode is weighed by (``taps.answer_question``; None: take all)
        self.question: AnswerQuestion | None = None

    def put_bounds(self, stage_id: str, bounds: np.ndarray) -> None:
        """Attention bounds as segments (repeats dropped), recording how many empty windows there were."""
        raw = np.asarray(bounds)
        canonical = raw[np.concatenate([[True], raw[1:] != raw[:-1]])] if raw.size else raw
        self.put(stage_id, canonical, raw_length=int(raw.size), empty_windows=int(raw.size - canonical.size))

    def wants(self, stage_id: str) -> bool:
        return stage_id in self.plan and stage_id not in self.writer

    def put_rows(self, stage_id: str, rows: Iterable[Any], **declaration: Any) -> None:
        """Write a stage a row at a time as ``rows`` yields them (nothing is written unless the plan wants it)."""
        if not self.wants(stage_id):
            return
        if self.writer.add_rows(self.plan[stage_id], rows, **declaration):
            self.count += 1

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
