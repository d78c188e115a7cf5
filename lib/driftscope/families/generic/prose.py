"""The generic family's sentences on the generic notebook pages (``Family.text``)."""

PROSE = {
    "inputs": (
        "Each image as the checkpoint's own processor resized it; the generic family draws no token grid over it, "
        "since where a token sits in the image is a family's own knowledge."
    ),
    "mutations": "the processor's pixel normalization off by 1% (every image token carries it from the first stage)",
    "answer": (
        "the decoder as both libraries run it on the same prompt ids (every aligned decoder layer, its pieces "
        "where narrowing asks, the head and the KV cache)"
    ),
}
