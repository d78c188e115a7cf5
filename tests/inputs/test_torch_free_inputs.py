"""Every deep family prepares a run's inputs (its images through its processor, the prompt through its tokenizer
file) without importing torch or transformers, in a fresh process as a run does before its first capture: the
Qwen families through ``qwen_shared.image_processor`` (held equal to transformers' in
tests/families/test_qwen_image_processor.py), Molmo2 through its own NumPy processor, every prompt through
``text_inputs.prompt_tokenizer`` (tests/inputs/test_text_inputs.py). The generic family keeps transformers' (or
mlx-vlm's) processor class of each model type: its prompt expansion is the class's own."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT
from driftscope.families import FAMILIES, GENERIC

SCRIPT = """
import json, sys
from driftscope.families import get_family
from driftscope.families.checkpoints import open_checkpoint
out = {}
for name in sys.argv[1:]:
    family = get_family(name)
    checkpoint = open_checkpoint(family.tiny.ensure())
    inputs = family.prepare_inputs(checkpoint, list(family.tiny.images))
    inputs.text = family.text_inputs(checkpoint, inputs, max_new_tokens=2)
    imported = [module for module in ("torch", "transformers") if module in sys.modules]
    out[name] = {"tokens": int(inputs.text.input_ids.size), "imported": imported}
print(json.dumps(out))
"""


def test_every_deep_family_prepares_its_inputs_without_torch_or_transformers():
    names = sorted(name for name in FAMILIES.names() if name != GENERIC)
    assert {"qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "molmo2"} <= set(names)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, *names], cwd=ROOT, capture_output=True, text=True, timeout=600, check=True
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    for name in names:
        assert found[name]["tokens"] > 0 and found[name]["imported"] == [], (name, found[name])
