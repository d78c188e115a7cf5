"""What a screen runs: each input is one image (or several, passed in one call) with a prompt and the words its
answer should say.

``--images GLOB`` gives one input per matching file. ``--prompts FILE`` (JSON lines, or CSV with a header) gives
rows ``{images: [...], prompt: ..., expect: [...]}``: a row with ``images`` is an input of its own (paths relative
to the file's folder; a CSV cell separates them with ``;``, like ``expect``); a row without is a prompt asked of
every globbed image. A missing prompt or ``expect`` is the parameter file's ``text``.
"""

from __future__ import annotations

import csv
import glob
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from driftscope.core.names import safe_name
from driftscope.errors import InputError, ParameterError


@dataclass(frozen=True)
class ScreenInput:
    """One screened input; ``key`` names its files (its images' names and a digest of their bytes and text)."""

    key: str
    images: tuple[Path, ...]
    prompt: str | None = None
    expect: tuple[str, ...] = field(default_factory=tuple)

    @property
    def label(self) -> str:
        return " + ".join(path.name for path in self.images)

    def to_dict(self) -> dict:
        return {
            "key": self.key,
            "images": [str(path) for path in self.images],
            "label": self.label,
            "prompt": self.prompt,
            "expect": list(self.expect),
        }


def make_input(images: list[Path], prompt: str | None, expect: list[str]) -> ScreenInput:
    digest = hashlib.sha256()
    for path in images:
        digest.update(path.name.encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    digest.update(json.dumps([prompt, list(expect)]).encode())
    stem = "+".join(path.stem for path in images)
    return ScreenInput(f"{safe_name(stem)[:60]}-{digest.hexdigest()[:8]}", tuple(images), prompt, tuple(expect))


def _globbed(pattern: str) -> list[Path]:
    found = sorted(Path(p).resolve() for p in glob.glob(str(Path(pattern).expanduser()), recursive=True))
    found = [path for path in found if path.is_file()]
    if not found:
        raise InputError(
            f"--images {pattern!r} matches no file",
            "quote the pattern so the shell does not expand it, and check the folder (e.g. 'fixtures/images/*.png')",
        )
    return found


def _listed(value, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [part.strip() for part in value.split(";") if part.strip()]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ParameterError(f"{where} must be a list of strings", 'write e.g. ["a.png", "b.png"] (CSV: "a.png;b.png")')


def read_rows(path: Path) -> list[dict]:
    """The rows of a JSON-lines or CSV prompts file."""
    if not path.is_file():
        raise ParameterError(f"--prompts {path} does not exist", "pass a .jsonl or .csv file of prompt rows")
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".csv":
        return [dict(row) for row in csv.DictReader(text.splitlines())]
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ParameterError(f"{path}:{number} is not JSON: {err.msg}", "write one JSON object per line") from None
        if not isinstance(row, dict):
            raise ParameterError(f"{path}:{number} is not a JSON object", 'write {"images": [...], "prompt": "..."}')
        rows.append(row)
    return rows


def screen_inputs(
    images: str | None, prompts: str | Path | None, prompt: str | None = None, expect: list[str] = ()
) -> list[ScreenInput]:
    """Every input of a screen, in a stable order, each once (``prompt`` and ``expect``: the defaults)."""
    if not images and not prompts:
        raise ParameterError("a screen needs inputs", "pass --images 'DIR/*.png' and/or --prompts rows.jsonl")
    globbed = _globbed(images) if images else []
    rows = read_rows(Path(prompts).expanduser().resolve()) if prompts else []
    folder = Path(prompts).expanduser().resolve().parent if prompts else Path.cwd()
    found: dict[str, ScreenInput] = {}
    questions = [row for row in rows if not row.get("images")]
    for path in globbed:
        for row in questions or [{}]:
            words = _listed(row.get("expect"), "expect") or list(expect)
            item = make_input([path], row.get("prompt") or prompt, words)
            found.setdefault(item.key, item)
    for number, row in enumerate(rows, 1):
        if not row.get("images"):
            continue
        paths = [(folder / name).resolve() for name in _listed(row["images"], f"--prompts row {number}: images")]
        missing = [str(path) for path in paths if not path.is_file()]
        if missing:
            raise InputError(
                f"--prompts row {number}: image {missing[0]} does not exist",
                "write image paths relative to the prompts file's folder",
            )
        words = _listed(row.get("expect"), f"--prompts row {number}: expect") or list(expect)
        item = make_input(paths, row.get("prompt") or prompt, words)
        found.setdefault(item.key, item)
    return list(found.values())
