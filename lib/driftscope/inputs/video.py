"""Videos as frames: an animated image (GIF, WebP, APNG) read with PIL, or a folder of frame images.

Every frame is kept, in order (no frame sampling); what the family's processor makes of them (resize,
temporal patches) is the family's business. A real container (MP4, MKV, ...) is refused with the command
that turns it into a folder of frames, which any fresh clone can then read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from driftscope.errors import InputError

FRAME_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")
CONTAINERS = (".mp4", ".mkv", ".mov", ".avi", ".webm", ".m4v", ".mpg", ".mpeg")


@dataclass
class Video:
    """One video's frames as loaded (each in its own mode), and its frame rate when the file states one."""

    path: str
    frames: list  # PIL images, in order
    fps: float | None  # frames per second (a GIF's frame durations); None for a folder of frames
    source: str  # "animated GIF", "folder of 4 PNG frames", ...

    @property
    def size(self) -> tuple[int, int]:
        """(height, width) of every frame."""
        width, height = self.frames[0].size
        return height, width


def load_video(path: str | Path) -> Video:
    """The frames of ``path`` (an animated image or a folder of frame images), or a clear error saying why
    it cannot be a video input."""
    path = Path(path)
    if not path.exists():
        raise InputError(
            f"video {path} does not exist",
            "check the path in 'videos' (an animated GIF or a folder of frame PNGs; relative paths in a "
            "parameter file resolve against the repository holding it)",
        )
    video = _folder(path) if path.is_dir() else _animated(path)
    sizes = sorted({frame.size for frame in video.frames})
    if len(sizes) > 1:
        raise InputError(
            f"video {path} has frames of different sizes {[f'{w}x{h}' for w, h in sizes]} (width x height)",
            "give every frame the same size (a processor resizes a video as one block of frames)",
        )
    if len(video.frames) < 2:
        raise InputError(
            f"video {path} has one frame; a video needs at least two",
            "pass a still image under 'images' instead, or add frames",
        )
    return video


def _folder(path: Path) -> Video:
    from PIL import Image, UnidentifiedImageError

    files = sorted(p for p in path.iterdir() if p.suffix.lower() in FRAME_SUFFIXES)
    if not files:
        raise InputError(
            f"video folder {path} holds no frame images ({', '.join(FRAME_SUFFIXES)})",
            "put the frames there as PNGs named in order (frame_000.png, frame_001.png, ...)",
        )
    frames = []
    for file in files:
        try:
            with Image.open(file) as handle:
                if int(getattr(handle, "n_frames", 1)) > 1:
                    raise InputError(
                        f"frame {file} of video folder {path} is itself animated",
                        "save each frame of the folder as a still image",
                    )
                handle.load()
                frames.append(handle.copy())
        except (UnidentifiedImageError, OSError) as err:
            raise InputError(f"frame {file} is not an image PIL can read ({err})", "save the frame as a PNG") from err
    kinds = sorted({file.suffix.lower().lstrip(".").upper() for file in files})
    return Video(str(path), frames, None, f"folder of {len(files)} {'/'.join(kinds)} frames")


def _animated(path: Path) -> Video:
    from PIL import Image, ImageSequence, UnidentifiedImageError

    if path.suffix.lower() in CONTAINERS:
        raise InputError(
            f"video {path} is a {path.suffix} container; driftscope reads a video as an animated image or a "
            "folder of frames (every frame kept, in order)",
            f"extract its frames into a folder, e.g. `ffmpeg -i {path} {path.with_suffix('')}/frame_%04d.png`, "
            "and list that folder under 'videos'",
        )
    try:
        with Image.open(path) as handle:
            kind = handle.format
            frames, durations = [], []
            for frame in ImageSequence.Iterator(handle):
                durations.append(frame.info.get("duration"))
                frames.append(frame.copy())
    except (UnidentifiedImageError, OSError) as err:
        raise InputError(
            f"video {path} is not an animated image PIL can read ({err})",
            "pass an animated GIF/WebP/PNG or a folder of frame PNGs",
        ) from err
    durations = [d for d in durations if isinstance(d, int | float) and d > 0]
    fps = round(1000.0 * len(durations) / sum(durations), 6) if durations else None
    return Video(str(path), frames, fps, f"animated {kind}, {len(frames)} frames")
