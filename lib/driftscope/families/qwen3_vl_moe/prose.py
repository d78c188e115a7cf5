"""Qwen3-VL-MoE's sentences on the generic notebook pages (``Family.text``)."""

PROSE = {
    "inputs": (
        "Drawn over each resized image: its merged-token grid (2x2 patches per token). The tower attends over the "
        "whole image at once; its learned position table is interpolated to this grid."
    ),
    "mutations": (
        "the routing weights left unnormalized over the chosen experts, a DeepStack branch "
        "dropped, nearest-neighbour position-table interpolation"
    ),
    "answer": (
        "the M-RoPE positions, the DeepStack additions at the image slots of the first decoder layers, and in "
        "each sparse layer the router's logits, the experts it chose per token (compared exactly), their "
        "weights and each chosen expert's output"
    ),
}
