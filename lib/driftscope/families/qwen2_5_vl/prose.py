"""Qwen2.5-VL's sentences on the generic notebook pages (``Family.text``)."""

PROSE = {
    "inputs": (
        "Drawn over each resized image: its attention windows (the tower attends within them except in its "
        "full-attention blocks). One window means a wrong window permutation cannot be seen on this image."
    ),
    "mutations": (
        "an identity window permutation, full attention where the model attends in windows, a twice-applied "
        "un-reorder, a cross-image mask leak"
    ),
    "answer": ("the M-RoPE positions (temporal, height and width ids, so the image slots carry their grid position)"),
}
