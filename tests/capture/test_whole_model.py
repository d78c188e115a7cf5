"""The whole model (vision and language) on a scaled-down Qwen2.5-VL-3B shape: the sharded checkpoint writer
and the whole-model investigation of benchmarks/whole_model.py through `driftscope run`."""

from __future__ import annotations

import json
import sys
import weakref

import numpy as np
import pytest
from conftest import ROOT, SHAPES

sys.path.insert(0, str(ROOT / "benchmarks"))

#: Qwen2.5-VL-3B with widths / 16, the real 16/2 text heads and vocabulary cut: small enough for CI.
TINY_WHOLE = {
    "vision_heads": 4,
    "vision_depth": 4,
    "fullatt_block_indexes": (1, 3),
    "text_layers": 3,
    "vocab_size": 2048,
}


def _spec():
    from driftscope.families.qwen2_5_vl.fixture import QWEN25_VL_3B_WHOLE, scaled_spec

    return scaled_spec(QWEN25_VL_3B_WHOLE, 16, **TINY_WHOLE)


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    from driftscope.families.qwen2_5_vl.fixture import write_whole_checkpoint

    base = tmp_path_factory.mktemp("whole")
    write_whole_checkpoint(base / "f32", _spec(), shard_bytes=1 << 20, bf16_dir=base / "bf16")
    return base / "f32", base / "bf16"


def test_scaled_spec_keeps_depths_heads_and_vocabulary_and_fits_rope():
    from driftscope.families.qwen2_5_vl.fixture import QWEN25_VL_3B_WHOLE, scaled_spec

    real = scaled_spec(QWEN25_VL_3B_WHOLE, 1)
    assert real == QWEN25_VL_3B_WHOLE  # the real shape: 36 x 2048, 16/2 heads, 151936, tied
    quarter = scaled_spec(QWEN25_VL_3B_WHOLE, 4)
    assert (quarter.vision_hidden, quarter.text_hidden, quarter.text_intermediate) == (320, 512, 2752)
    assert (quarter.vision_depth, quarter.text_layers, quarter.text_heads, quarter.text_kv_heads) == (32, 36, 16, 2)
    assert quarter.vocab_size == 151936 and quarter.tie_word_embeddings
    assert sum(quarter.mrope_section) == 512 // 16 // 2
    with pytest.raises(ValueError, match="head sizes"):
        scaled_spec(QWEN25_VL_3B_WHOLE, 16)  # vision head size 5: RoPE cannot take it


def test_sharded_checkpoint_loads_in_transformers_without_missing_keys_and_the_bf16_copy_matches(whole):
    import torch
    from driftscope.model.weightfile import TensorFiles
    from safetensors import safe_open
    from transformers import Qwen2_5_VLForConditionalGeneration

    f32, bf16 = whole
    index = json.loads((f32 / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and all((f32 / s).exists() and (bf16 / s).exists() for s in shards)
    assert "lm_head.weight" not in index["weight_map"]  # tied, as the real 3B checkpoint
    model, info = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(f32), output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched keys
    assert model.lm_head.weight.data_ptr() == model.model.language_model.embed_tokens.weight.data_ptr()
    assert model.config.text_config.num_hidden_layers == 3 and model.config.text_config.num_key_value_heads == 2
    files = TensorFiles(f32)
    name = "model.layers.2.mlp.down_proj.weight"
    values = files.read(name)
    assert abs(values.std() * np.sqrt(values.shape[1]) - 1.0) < 0.05  # N(0, 1/sqrt(fan_in))
    with safe_open(str(bf16 / index["weight_map"][name]), "pt") as handle:
        stored = handle.get_tensor(name)
    assert stored.dtype == torch.bfloat16
    assert torch.equal(stored, torch.from_numpy(values).to(torch.bfloat16))


@pytest.mark.slow
def test_whole_model_investigation_agrees_in_f32_and_keeps_one_runtime_resident(whole, tmp_path, monkeypatch):
    """`driftscope run` on the whole model: five runtimes, every block, every text layer, logits, 8 tokens."""
    import yaml
    from driftscope.capture.runtimes.base import Runtime
    from driftscope.cli import main
    from driftscope.run.report import Report
    from whole_model import TOKENS, WHOLE_RUNTIMES, whole_params

    resident, overlaps = weakref.WeakSet(), []
    original = Runtime.load

    def load(self):  # the real load; records any other runtime still holding its model
        overlaps.extend(other.label for other in resident if other is not self and other.model is not None)
        original(self)
        resident.add(self)

    monkeypatch.setattr(Runtime, "load", load)
    f32, _ = whole
    params = tmp_path / "whole.yaml"
    params.write_text(yaml.safe_dump(whole_params(f32, SHAPES, notebooks=["06_answer_parity"])))
    assert main(["run", str(params), "--out", str(tmp_path / "run"), "--no-gate"]) == 0
    assert overlaps == []
    report = Report.load(tmp_path / "run" / "report.json")
    rows = {(r.candidate, r.stage): r for r in report.rows}
    text_stages = [f"text.layer.{i}.last" for i in range(3)] + ["text.norm.last", "text.logits.last"]
    for label in ("mlx:f32", "iree:f32"):
        for stage in [f"vision.block.{b}" for b in range(4)] + ["text.embeds.image"] + text_stages:
            assert rows[(label, stage)].max_abs < 1e-4, (label, stage, rows[(label, stage)].max_abs)
        assert rows[(label, "text.logits.last")].extra["top1_agree"]
    for label in ("mlx:bf16", "iree:f16-contract"):  # the low-precision runs drift: the test can see a difference
        assert rows[(label, "text.logits.last")].max_abs > 1e-4, label
    answer = report.data["answer"]["runtimes"]
    assert len(answer["transformers:f32"]["tokens"]) == TOKENS
    for label in ("mlx:f32", "iree:f32"):  # IREE decodes with its compiled step and cache
        assert answer[label]["tokens"] == answer["transformers:f32"]["tokens"], label
    assert {r["label"] for r in report.data["runtimes"]} == set(WHOLE_RUNTIMES)
    # the report holds no tensors: no numeric list as long as a hidden state, and it is tiny next to the taps
    text = (tmp_path / "run" / "report.json").read_text()
    assert _longest_numeric_list(json.loads(text)) < 128
    taps = sum(p.stat().st_size for p in (tmp_path / "run" / "taps").glob("*.safetensors"))
    assert len(text) < taps / 20


def _longest_numeric_list(value) -> int:
    if isinstance(value, dict):
        return max((_longest_numeric_list(v) for v in value.values()), default=0)
    if isinstance(value, list):
        own = len(value) if value and all(isinstance(v, (int, float)) for v in value) else 0
        return max([own] + [_longest_numeric_list(v) for v in value])
    return 0


@pytest.mark.parametrize("name", ["transformers", "mlx"])
def test_a_capture_with_text_runs_the_tower_once(name, tmp_path, tiny_checkpoint_dir):
    """The text prefill reads the tower output of the same capture instead of running the tower again."""
    from conftest import TINY
    from driftscope.capture.runtimes import get_runtime
    from driftscope.families.checkpoints import open_checkpoint
    from whole_model import whole_plan, with_text

    checkpoint = open_checkpoint(TINY)
    runtime = get_runtime(name)(checkpoint, "f32")
    runtime.load()
    calls = []
    if name == "transformers":
        handle = runtime.model.model.visual.register_forward_pre_hook(lambda *args: calls.append(1))
    else:
        tower = runtime.model.vision_tower
        original = type(tower).__call__
        handle = None
        type(tower).__call__ = lambda self, *a, **k: calls.append(1) or original(self, *a, **k)
    try:
        tapset = runtime.capture(with_text(checkpoint, [SHAPES], tokens=2), whole_plan(checkpoint, 2), tmp_path / name)
    finally:
        handle.remove() if handle else setattr(type(tower), "__call__", original)
    assert len(calls) == 1
    image = np.asarray(tapset["text.embeds.image"])
    np.testing.assert_array_equal(image, np.asarray(tapset["vision.merger"]))  # the merged rows are the tower's
