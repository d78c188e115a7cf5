"""The prompt side of a Qwen video: its placeholder text, the grids the M-RoPE rule reads and their time steps.

Two styles, as transformers 5.24's processors and ``get_rope_index`` build them:

- ``"seconds_per_grid"`` (Qwen2.5-VL): ``<|vision_start|>`` + t*h*w/m^2 ``<|video_pad|>`` + ``<|vision_end|>``;
  one grid [t, h, w]; its temporal positions step by ``tokens_per_second * second_per_grid_t`` where
  ``second_per_grid_t = temporal_patch_size / fps``.
- ``"timestamps"`` (Qwen3-VL): per temporal patch i, ``<{ts_i:.1f} seconds>`` + ``<|vision_start|>`` + h*w/m^2
  ``<|video_pad|>`` + ``<|vision_end|>``, where ts_i is the mean time of the patch's first and last frame
  (frame index / fps, the last frame repeated up to a multiple of temporal_patch_size); each frame group is its
  own grid [1, h, w] with step 1 (time lives in the timestamp text, not in the positions).

Every frame is used (no sampling), so frame i sits at index i; a video whose file gives no frame rate is read at
24 fps, transformers' ``VideoMetadata`` default (recorded in the prompt facts).
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_FPS = 24.0
STYLES = ("seconds_per_grid", "timestamps")


@dataclass
class VideoPrompt:
    """What the videos add to a prompt after the images."""

    text: str = ""
    grids: list = field(default_factory=list)  # per vision run of the videos, in prompt order
    intervals: list = field(default_factory=list)  # each run's temporal step
    second_per_grid_ts: list = field(default_factory=list)  # per video
    facts: list = field(default_factory=list)  # per video: fps used, timestamps or time step


def frame_timestamps(frames: int, fps: float, temporal: int) -> list[float]:
    """The seconds each temporal patch is stamped with: the mean of its first and last frame's time."""
    indices = list(range(frames))
    indices += [indices[-1]] * (-frames % temporal)
    times = [index / fps for index in indices]
    return [(times[i] + times[i + temporal - 1]) / 2 for i in range(0, len(times), temporal)]


def video_prompt(videos: list[dict], grids: list, merge: int, temporal: int, style: str, tokens_per_second=None):
    """The :class:`VideoPrompt` of ``videos`` (the processor's facts per video) whose grids are ``grids``."""
    if style not in STYLES:
        raise ValueError(f"unknown video prompt style {style!r} (one of {STYLES})")
    out = VideoPrompt()
    for fact, grid in zip(videos, grids, strict=True):
        t, h, w = (int(v) for v in grid)
        fps = float(fact.get("fps") or DEFAULT_FPS)
        seconds = temporal / fps
        fact_out = {"video": fact.get("video"), "fps": fps, "fps_from": "file" if fact.get("fps") else "default"}
        frame_tokens = h * w // (merge * merge)
        if style == "timestamps":
            stamps = frame_timestamps(t * temporal - int(fact.get("padded_frames", 0)), fps, temporal)
            for stamp in stamps:
                out.text += f"<{stamp:.1f} seconds><|vision_start|>" + "<|video_pad|>" * frame_tokens + "<|vision_end|>"
                out.grids.append([1, h, w])
                out.intervals.append(1)
            fact_out["timestamps"] = [round(s, 6) for s in stamps]
        else:
            step = float(tokens_per_second) * seconds
            out.text += "<|vision_start|>" + "<|video_pad|>" * (t * frame_tokens) + "<|vision_end|>"
            out.grids.append([t, h, w])
            out.intervals.append(step)
            fact_out.update(second_per_grid_t=seconds, tokens_per_second=tokens_per_second, time_step=step)
        out.second_per_grid_ts.append(seconds)
        out.facts.append(fact_out)
    return out
