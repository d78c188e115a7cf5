"""Qwen3-VL's sentences on the generic notebook pages (``Family.text``)."""

PROSE = {
    "inputs": (
        "Drawn over each resized image: its merged-token grid (2x2 patches per token). The tower attends over the "
        "whole image at once; its learned position table is interpolated to this grid."
    ),
    "mutations": (
        "a DeepStack branch dropped or two branches swapped, nearest-neighbour position-table interpolation, "
        "Qwen2-era resize bounds"
    ),
    "answer": (
        "the M-RoPE positions (temporal, height and width ids), the DeepStack additions at the image slots of "
        "the first decoder layers"
    ),
}
