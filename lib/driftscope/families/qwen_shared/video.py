"""Videos -> the Qwen video processor's ``pixel_values_videos`` and ``video_grid_thw``, built from the
checkpoint's PIL image processor (transformers' Qwen video processors need torchvision, which is not installed).

Each frame is made RGB, resized to the video's one size with the image processor's PIL resampler, rescaled and
normalized by the image processor's own methods; the frames are then padded to a multiple of
``temporal_patch_size`` by repeating the last one and patchified in the video processor's order
(t, h/m, w/m, m, m, C, temporal, p, p), so a grid row is (frames / temporal_patch_size, h / p, w / p).

Where the sizes come from: ``video_preprocessor_config.json`` when the checkpoint has one, else the image
processor's (transformers' video processor falls back to ``preprocessor_config.json`` the same way). Every
frame is used: no frame sampling. The family says how a video is resized (Qwen2-VL per frame, Qwen3-VL over
all frames) through ``resize``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from driftscope.errors import InputError
from driftscope.inputs.processor_output import ModelInputs, as_processor_sees
from driftscope.inputs.video import load_video

from .processor import load_image_processor, processor_settings

if TYPE_CHECKING:
    from driftscope.model.checkpoint import Checkpoint

#: (frames, height, width, factor, temporal_factor, min_pixels, max_pixels) -> resized (height, width)
Resize = Callable[[int, int, int, int, int, int, int], tuple[int, int]]


@dataclass
class VideoRun:
    """What the video processor made of the videos, and the facts about each."""

    pixel_values: np.ndarray  # [patches, C*T*P*P] float32, video processor order, videos one after another
    grid_thw: np.ndarray  # [videos, 3] int64
    facts: list[dict]  # per video: path, source, frames, fps, size, resized, grid, padded frames


def video_bounds(checkpoint: Checkpoint, processor) -> tuple[int, int, str]:
    """(min_pixels, max_pixels, where they were read) for videos of this checkpoint."""
    path = Path(checkpoint.path) / "video_preprocessor_config.json"
    size = dict(getattr(processor, "size", None) or {})
    source = "preprocessor_config.json (no video_preprocessor_config.json)"
    if path.exists():
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise InputError(f"{path} is not valid JSON ({err})", "fix or remove the file") from err
        stated = data.get("size") if isinstance(data.get("size"), dict) else {}
        size = {
            "shortest_edge": data.get("min_pixels", stated.get("shortest_edge", size.get("shortest_edge"))),
            "longest_edge": data.get("max_pixels", stated.get("longest_edge", size.get("longest_edge"))),
        }
        source = "video_preprocessor_config.json"
    return int(size.get("shortest_edge") or 56 * 56), int(size.get("longest_edge") or 28 * 28 * 1280), source


def patchify_video(frames: np.ndarray, patch: int, merge: int, temporal: int) -> tuple[np.ndarray, list[int]]:
    """[T, C, H, W] normalized frames -> ([t*h*w, C*temporal*patch*patch], [t, h, w]) in the order of
    transformers' Qwen video processors (the last frame repeated up to a multiple of ``temporal``)."""
    if pad := -frames.shape[0] % temporal:
        frames = np.concatenate([frames, np.repeat(frames[-1:], pad, axis=0)])
    count, channel, height, width = frames.shape
    t, h, w = count // temporal, height // patch, width // patch
    patches = frames.reshape(t, temporal, channel, h // merge, merge, patch, w // merge, merge, patch)
    patches = patches.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(patches.reshape(t * h * w, channel * temporal * patch * patch)), [t, h, w]


def run_video_processor(
    checkpoint: Checkpoint, video_paths: list, processor, resize: Resize, refuse_upscale: bool = True
) -> VideoRun:
    """Run the video processor on ``video_paths`` with ``processor``'s settings and the family's ``resize``. A video
    the bounds would upscale is refused as an image would be (``refuse_upscale``: the family refuses to upscale
    images), else its facts say so (``upscaled_by_min_pixels``)."""
    from .image_processor import normalize, rescale, resize_chw

    patch, merge = int(processor.patch_size), int(processor.merge_size)
    temporal = int(processor.temporal_patch_size)
    min_pixels, max_pixels, source = video_bounds(checkpoint, processor)
    all_patches, grids, facts = [], [], []
    for path in video_paths:
        video = load_video(path)
        height, width = video.size
        try:
            resized = resize(len(video.frames), height, width, patch * merge, temporal, min_pixels, max_pixels)
        except ValueError as err:
            raise InputError(
                f"video {path} ({len(video.frames)} frames of {height}x{width}) cannot be resized: {err}",
                "use more frames or a less extreme aspect ratio",
            ) from err
        upscaled = int(resized[0]) * int(resized[1]) > height * width
        if upscaled and refuse_upscale:
            side = int(np.ceil(np.sqrt(min_pixels)))
            raise InputError(
                f"video {path}'s frames are {height}x{width} = {height * width} pixels; the processor would upscale "
                f"them to {resized[0]}x{resized[1]} (min_pixels {min_pixels}) and the run would not test the video "
                "you gave",
                f"use frames of at least {side}x{side} pixels, or lower min_pixels in the checkpoint's "
                "preprocessor_config.json (an image that small is refused too)",
            )
        conversions, normalized = set(), []
        for frame in video.frames:
            rgb, conversion = as_processor_sees(frame, processor, path)
            conversions.add(conversion)
            array = np.asarray(rgb).transpose(2, 0, 1)  # CHW, as the image processor holds an image
            if tuple(resized) != (height, width):  # transformers' PIL resize, rescale and normalize, in NumPy
                array = resize_chw(array, int(resized[0]), int(resized[1]), int(processor.resample))
            array = rescale(array, processor.rescale_factor)
            normalized.append(normalize(array, processor.image_mean, processor.image_std))
        stacked = np.stack(normalized).astype(np.float32)
        patches, grid = patchify_video(stacked, patch, merge, temporal)
        all_patches.append(patches)
        grids.append(grid)
        facts.append(
            {
                "video": str(path),
                "source": video.source,
                "frames": len(video.frames),
                "padded_frames": grid[0] * temporal - len(video.frames),
                "fps": video.fps,
                "size": [height, width],
                "resized": [int(v) for v in resized],
                "grid_thw": grid,
                "conversions": sorted(c for c in conversions if c),
                "bounds": {"min_pixels": min_pixels, "max_pixels": max_pixels, "from": source},
                **({"upscaled_by_min_pixels": f"{height}x{width} -> {resized[0]}x{resized[1]}"} if upscaled else {}),
            }
        )
    return VideoRun(np.concatenate(all_patches), np.asarray(grids, dtype=np.int64), facts)


def add_videos(
    checkpoint: Checkpoint,
    inputs: ModelInputs | None,
    video_paths: list,
    resize: Resize,
    processor=None,
    refuse_upscale: bool = True,
) -> ModelInputs:
    """``inputs`` (the images' processor output, or None for a run of videos alone) with the videos packed
    after the images: one tower call over every grid, as each video is a grid with t > 1 (attention, windows
    and rotary are per frame). No videos: ``inputs`` unchanged. ``refuse_upscale``: as for the family's images."""
    if not video_paths:
        return inputs
    processor = processor or load_image_processor(checkpoint)
    run = run_video_processor(checkpoint, list(video_paths), processor, resize, refuse_upscale)
    merge = int(processor.merge_size)
    tokens = (run.grid_thw.prod(axis=1) // (merge * merge)).astype(np.int64)
    paths = [fact["video"] for fact in run.facts]
    headline = f"videos {run.grid_thw.tolist()}, {run.pixel_values.shape[0]} patches"
    upscaled = [fact["upscaled_by_min_pixels"] for fact in run.facts if "upscaled_by_min_pixels" in fact]
    headline += f", upscaled by min_pixels ({'; '.join(upscaled)})" if upscaled else ""
    if inputs is None:
        return ModelInputs(
            arrays={"pixel_values": run.pixel_values, "grid_thw": run.grid_thw},
            image_paths=[],
            image_sizes=[],
            image_tokens=tokens,
            facts={
                "resized": [],
                "grid_thw": run.grid_thw.tolist(),
                "patches": int(run.pixel_values.shape[0]),
                "processor": processor_settings(processor),
                "conversions": [],
                "videos": run.facts,
            },
            headline=headline,
            video_paths=paths,
        )
    pixel_values = np.concatenate([inputs["pixel_values"], run.pixel_values])
    grid_thw = np.concatenate([inputs["grid_thw"], run.grid_thw])
    inputs.arrays = {"pixel_values": pixel_values, "grid_thw": grid_thw}
    inputs.image_tokens = np.concatenate([inputs.image_tokens, tokens])
    inputs.facts.update(grid_thw=grid_thw.tolist(), patches=int(pixel_values.shape[0]), videos=run.facts)
    inputs.headline += f"; {headline}"
    inputs.video_paths = paths
    return inputs
