"""The planted-defect screen the screen tests share: transformers f32 (reference) against MLX f32 with the
``reverse[orig] = rank`` un-reorder planted (``tests/planted_patches.py:unreorder_qwen2_5_vl``), on images of the
built-in screen set."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
SCREEN_SET = ROOT / "fixtures" / "images" / "screen"
PATCH = ROOT / "tests" / "planted_patches.py"
#: involution sizes on the tiny fixture (the planted defect cannot show) and sizes where it must
INVOLUTION = ("screen_112x112.png", "screen_224x448.png")
NOT_INVOLUTION = ("screen_224x224.png", "screen_168x168.png")


def planted_parameters(folder: Path, max_new_tokens: int = 2, **extra) -> Path:
    data = {
        "name": "screen-planted",
        "checkpoint": str(ROOT / "fixtures" / "checkpoints" / "tiny-qwen2_5-vl"),
        "images": [str(SCREEN_SET / INVOLUTION[0])],
        "runtimes": [
            {"runtime": "transformers", "policy": "f32"},
            {"runtime": "mlx", "policy": "f32", "label": "mlx-planted", "patch": f"{PATCH}:unreorder_qwen2_5_vl"},
        ],
        "stages": {"blocks": True},
        "text": {"prompt": "Name every shape.", "max_new_tokens": max_new_tokens, "expect": ["square", "circle"]},
        **extra,
    }
    path = Path(folder) / "screen_planted.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def image_folder(folder: Path, names=INVOLUTION + NOT_INVOLUTION) -> str:
    """A folder holding copies of ``names`` from the screen set; returns its glob."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy(SCREEN_SET / name, folder / name)
    return str(folder / "*.png")
