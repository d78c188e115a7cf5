"""The screen's captures: one runtime resident at a time, loaded once for every input it lacks.

The reference runs first over every input, then each candidate, fed the reference's greedy tokens for each input
(teacher-forced). Each (input, runtime) capture is one TapSet, ``<out>/taps/<input key>/<runtime>``; its sidecar
is written last and atomically, so a complete sidecar is a finished capture and an interrupted screen, run again,
captures only what it lacks (a runtime with nothing left is not even loaded). A capture that fails leaves
``<runtime>.error.json`` beside it, read by the judge as "could not run" for that input.

Compiled runtimes pad each input to a power-of-two bucket (:func:`screen_options`), so the demo's 24 images (17
sizes) need 6 tower, 5 prefill and 5 decode-step graphs per IREE policy instead of 17 of each.

Inputs are not batched into one call: every runtime's tower already takes several images in one call (one input's
images: transformers and MLX through their ``cu_seqlens``, the compiled path through its bucket's segments), but the
answer side runs one sequence per call in every capture path (transformers and mlx-vlm decode one sequence; the
compiled decode step is one sequence against its fixed-capacity cache), and a batched transformers ``generate``
would need left padding and an attention mask, which move the M-RoPE positions and the masked softmax away from the
single-input call the investigation reproduces. Batching only the towers (each input's share split back into its own
TapSet) is the open part of issue 35 item 4.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from driftscope.capture.runtimes import get_runtime
from driftscope.core.atomic import write_json_atomic
from driftscope.core.names import safe_name
from driftscope.families import get_family
from driftscope.families.checkpoints import prepare_inputs
from driftscope.run.candidates import teacher_force
from driftscope.screen.inputs import ScreenInput
from driftscope.taps.stages import StagePlan
from driftscope.taps.tapset import TapSet, tap_paths

#: errors that stop the screen rather than marking one capture "could not run"
STOPS = (KeyboardInterrupt, SystemExit, MemoryError)


@dataclass(frozen=True)
class Job:
    """What every capture of a screen shares (picklable, so a Dask worker can run a share of the inputs)."""

    checkpoint: object  # model.checkpoint.Checkpoint
    specs: tuple  # run.params.RuntimeSpec, the reference first
    plan: StagePlan
    text: dict | None  # the parameter file's text settings (prompt, max_new_tokens, expect), or None
    out: Path

    @property
    def reference(self) -> str:
        return self.specs[0].display


def tap_base(out: Path, key: str, label: str) -> Path:
    return Path(out) / "taps" / key / safe_name(label)


def error_path(out: Path, key: str, label: str) -> Path:
    return tap_base(out, key, label).with_name(safe_name(label) + ".error.json")


def captured(out: Path, key: str, label: str) -> bool:
    """Whether this (input, runtime) capture finished (its sidecar says complete) or failed for good."""
    if error_path(out, key, label).exists():
        return True
    sidecar = tap_paths(tap_base(out, key, label))[1]
    try:
        return bool(json.loads(sidecar.read_text()).get("complete"))
    except (OSError, ValueError):
        return False


def missing(job: Job, items: Iterable[ScreenInput]) -> dict[str, list[ScreenInput]]:
    """Per runtime label, the inputs it has not captured yet."""
    items = list(items)
    return {spec.display: [i for i in items if not captured(job.out, i.key, spec.display)] for spec in job.specs}


def model_inputs(job: Job, item: ScreenInput):
    """The processor output every runtime is fed for ``item`` (with its prompt when the screen follows text)."""
    inputs = prepare_inputs(job.checkpoint, list(item.images))
    if job.text is not None:
        text = dict(job.text)
        text["prompt"] = item.prompt or text.get("prompt")
        text["expect"] = list(item.expect) or list(text.get("expect") or [])
        inputs.text = get_family(job.checkpoint.family).text_inputs(job.checkpoint, inputs, **text)
    return inputs


def screen_options(spec) -> dict:
    """A runtime's options on the screen: its own, plus ``buckets: pow2`` where it pads (a compiled runtime), so
    inputs of many sizes share a few compiled graphs (one per power-of-two bucket) instead of one per size;
    the padding is never read back (tests/screen/test_buckets.py holds each input's numbers to the unpadded
    call's). An explicit ``bucket``/``buckets`` in the parameter file wins."""
    options = {**spec.options, "label": spec.display}
    if "buckets" in get_runtime(spec.runtime).known_options() and not {"bucket", "buckets"} & set(spec.options):
        options["buckets"] = "pow2"
    return options


def capture_all(
    job: Job, items: list[ScreenInput], advance: Callable[[str, ScreenInput], None], log: Callable[[str], None]
) -> int:
    """Capture every (input, runtime) the screen lacks, one runtime loaded at a time; returns how many ran.
    ``advance(label, item)`` is called after each capture (the progress bar)."""
    todo = missing(job, items)
    ran = 0
    for spec in job.specs:
        pending = todo[spec.display]
        if not pending:
            continue
        runtime = get_runtime(spec.runtime)(job.checkpoint, spec.policy, spec.patch, screen_options(spec))
        try:
            for item in pending:
                _capture_one(job, runtime, spec.display, item, log)
                ran += 1
                advance(spec.display, item)
        finally:
            runtime.release()
    return ran


def _capture_one(job: Job, runtime, label: str, item: ScreenInput, log) -> None:
    base = tap_base(job.out, item.key, label)
    base.parent.mkdir(parents=True, exist_ok=True)
    try:
        inputs = model_inputs(job, item)
        if label != job.reference:
            reference = tap_base(job.out, item.key, job.reference)
            if captured(job.out, item.key, job.reference) and tap_paths(reference)[0].exists():
                teacher_force(inputs, TapSet(reference))
        runtime.capture(inputs, job.plan, base)
    except STOPS:
        raise
    except Exception as err:  # noqa: BLE001 - one input a runtime cannot run is that input's "could not run"
        detail = f"{type(err).__name__}: {err}"
        log(f"  {label} could not run on {item.label}: {detail.splitlines()[0]}")
        write_json_atomic(
            error_path(job.out, item.key, label),
            {"label": label, "input": item.key, "error": detail, "traceback": traceback.format_exc()},
        )
