"""What the Qwen vision-language families share (not a family itself: it defines no ``FAMILY``).

- ``text``: the Qwen chat prompt around the images and the prompt stages every runtime writes;
- ``mrope``: M-RoPE (t, h, w) position ids of a prompt with images;
- ``grids``: processor-order patch coordinates and per-frame attention bounds of image grids;
- ``processor``: the checkpoint's own Qwen2-VL-style image processor (no torchvision) and its settings;
- ``tokenizer``: the special tokens, chat template and offline tokenizer of the tiny checkpoints.
"""
