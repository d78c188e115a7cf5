"""Molmo2's sentences on the generic notebook pages (``Family.text``)."""

PROSE = {
    "inputs": (
        "Each image is cut into a low-resolution crop of the whole image and overlapping high-resolution crops; "
        "the attention pooler gathers their patches into tokens by index. One high-resolution crop means a wrong "
        "crop order cannot be seen on this image."
    ),
    "mutations": (
        "ViT layers resolved against the layers that run instead of the declared depth, the exact GELU in the "
        "ViT, a causal mask over the image tokens, padded pooling slots clamped to patch 0"
    ),
    "answer": (
        "the image tokens' attention mask (bidirectional among an image's tokens, causal elsewhere) and the "
        "1-D rotary positions"
    ),
}
