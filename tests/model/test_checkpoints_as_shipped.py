"""Checkpoints as Hugging Face ships them (bf16, sharded with an index file): every runtime computes in the
policy's dtype whatever the checkpoint stores, and the report records what was stored and what ran."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import ROOT, TINY

CHECKER = ROOT / "fixtures" / "images" / "checkerboard_140.png"
SIDE_FILES = ("preprocessor_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


@pytest.fixture(scope="module")
def shipped(tmp_path_factory, tiny_checkpoint_dir):
    """The tiny fixture cast to bfloat16 and saved by transformers: one file, and sharded with an index."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    base = tmp_path_factory.mktemp("shipped")
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(TINY), dtype=torch.bfloat16)
    out = {}
    for name, shard in (("bf16", None), ("bf16-sharded", "400KB")):
        target = base / name
        model.save_pretrained(target, **({"max_shard_size": shard} if shard else {}))
        for side in SIDE_FILES:
            shutil.copy(TINY / side, target / side)
        out[name] = target
    assert (out["bf16-sharded"] / "model.safetensors.index.json").exists()
    assert len(list(out["bf16-sharded"].glob("model-*-of-*.safetensors"))) > 1
    return out


def bf16_representable(values: np.ndarray) -> bool:
    """Whether every value survives a round trip through bfloat16 (its low 16 float32 bits are zero)."""
    return bool(np.all((np.ascontiguousarray(values, dtype=np.float32).view(np.uint32) & 0xFFFF) == 0))


RUNTIMES = ["transformers", "mlx", "jax", pytest.param("iree", marks=pytest.mark.slow)]


@pytest.mark.parametrize("name", RUNTIMES)
def test_every_runtime_runs_a_bf16_checkpoint_in_float32_under_f32(shipped, name, tmp_path):
    from driftscope.capture.runtimes import get_runtime
    from driftscope.families import stage_plan
    from driftscope.families.checkpoints import open_checkpoint, prepare_inputs
    from driftscope.taps.stages import StageSelection

    taps = {}
    for kind, path in shipped.items():  # the sharded copy loads in every runtime, to the same taps
        checkpoint = open_checkpoint(path)
        plan = stage_plan(checkpoint.family, checkpoint.config).select(StageSelection(substages=(0,)))
        runtime = get_runtime(name)(checkpoint, "f32")
        taps[kind] = runtime.capture(prepare_inputs(checkpoint, [CHECKER]), plan, tmp_path / kind)
        weights = getattr(runtime, "weight_dtypes", dict)()  # asserted last: the values first
        runtime.release()
    single, sharded = taps["bf16"], taps["bf16-sharded"]
    assert single.stage_ids() == sharded.stage_ids()
    floats = [s for s in single.stage_ids() if not single.declaration(s)["integer"] and s.startswith("vision.block")]
    assert len(floats) >= 9
    for stage in floats:
        assert not bf16_representable(single[stage]), f"{name} f32 ran {stage} in bfloat16"
        assert single.declaration(stage)["native_dtype"] == "float32", stage
        np.testing.assert_array_equal(single[stage], sharded[stage])
    assert set(weights) == {"float32"}, weights


def test_mlx_bf16_is_what_the_bf16_checkpoint_gives_without_a_cast(shipped, tmp_path):
    """The control: under bf16 the same taps are bf16-representable (the test above can fail)."""
    from driftscope.capture.runtimes import get_runtime
    from driftscope.families import stage_plan
    from driftscope.families.checkpoints import open_checkpoint, prepare_inputs
    from driftscope.taps.stages import StageSelection

    checkpoint = open_checkpoint(shipped["bf16"])
    plan = stage_plan(checkpoint.family, checkpoint.config).select(StageSelection())
    taps = get_runtime("mlx")(checkpoint, "bf16").capture(prepare_inputs(checkpoint, [CHECKER]), plan, tmp_path / "b")
    assert (
        bf16_representable(taps["vision.block.7"]) and taps.declaration("vision.block.7")["native_dtype"] == "bfloat16"
    )


def test_the_report_records_the_stored_dtypes_the_shards_and_what_each_runtime_computed_in(shipped, tmp_path):
    from driftscope.run.investigation import investigate
    from driftscope.run.params import parse_parameters

    params = parse_parameters(
        {
            "name": "shipped",
            "checkpoint": str(shipped["bf16-sharded"]),
            "images": [str(CHECKER)],
            "runtimes": ["transformers:f32", "mlx:f32", "mlx:bf16"],
            "replay": False,
        }
    )
    report = investigate(params, tmp_path).data
    index = json.loads((shipped["bf16-sharded"] / "model.safetensors.index.json").read_text())
    storage = report["checkpoint_storage"]
    assert storage["index_file"] == "model.safetensors.index.json"
    assert storage["shards"] == len(set(index["weight_map"].values())) > 1
    assert sorted(storage["files"]) == sorted(set(index["weight_map"].values()))
    vision = sum(1 for name in index["weight_map"] if "visual." in name)
    embeddings = sum(1 for name in index["weight_map"] if "embed_tokens" in name or "lm_head" in name)
    assert storage["dtypes"] == {
        "embeddings": {"BF16": embeddings},
        "text": {"BF16": len(index["weight_map"]) - vision - embeddings},
        "vision": {"BF16": vision},
    }
    observed = {entry["label"]: entry["observed_dtypes"] for entry in report["runtimes"]}
    assert set(observed["transformers:f32"]["weights"]) == {"float32"}
    assert set(observed["mlx:f32"]["weights"]) == set(observed["mlx:f32"]["activations"]) == {"float32"}
    assert set(observed["mlx:bf16"]["weights"]) == set(observed["mlx:bf16"]["activations"]) == {"bfloat16"}
    checks = {label: {c["check"]: c["status"] for c in entries} for label, entries in report["checks"].items()}
    assert {label: entry["compute_dtype"] for label, entry in checks.items()} == dict.fromkeys(observed, "pass")


def test_a_shard_the_index_names_but_the_directory_lacks_is_named(shipped, tmp_path):
    from driftscope.errors import CheckpointError
    from driftscope.model.checkpoint_storage import checkpoint_storage

    broken = tmp_path / "broken"
    shutil.copytree(shipped["bf16-sharded"], broken)
    missing = sorted(broken.glob("model-*-of-*.safetensors"))[-1]
    missing.unlink()
    with pytest.raises(CheckpointError, match=f"lists shards that .* lacks: \\['{missing.name}'\\]"):
        checkpoint_storage(broken)
