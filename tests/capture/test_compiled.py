"""The compiled path: our JAX emitter on XLA (``jax``) and through iree-compile + iree.runtime (``iree``)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import ROOT, shared_tapset
from driftscope.capture.iree import compile_graph
from driftscope.capture.runtimes import get_runtime
from driftscope.families.checkpoints import prepare_inputs
from driftscope.families.qwen2_5_vl.geometry import pack_images
from driftscope.families.qwen2_5_vl.jax.model import VisionSpec, load_vision_weights
from driftscope.families.qwen2_5_vl.jax.program import lower_vision_tower
from driftscope.judge.compare import compare_tapsets, first_divergence
from driftscope.judge.contract import load_contract
from driftscope.judge.verdict import judge
from driftscope.model.policies import get_policy

CHECKER = ROOT / "fixtures" / "images" / "checkerboard_140.png"
RUNTIMES = (("jax", "f32"), ("iree", "f32"), ("iree", "f16-contract"))


@pytest.fixture(scope="session")
def iree_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("iree-cache")


@pytest.fixture(scope="session")
def compiled_captures(tiny_checkpoint, shapes_inputs, full_plan):
    """The compiled runtimes' TapSets of the whole vision plan on the shapes image, captured once per test run
    with the run's artifact cache: the same captures (conftest's ``captures/<runtime>-<policy>`` keys) serve
    tests/replay/test_replay.py."""

    def capture(name: str, policy: str):
        def into(out):
            return get_runtime(name)(tiny_checkpoint, policy).capture(shapes_inputs, full_plan, out)

        return shared_tapset(f"captures/{name}-{policy}", into)

    return {f"{name}:{policy}": capture(name, policy) for name, policy in RUNTIMES}


def _rows(captures, compiled_captures, label, plan):
    return {
        row.stage: row
        for row in compare_tapsets(captures["transformers:f32"], compiled_captures[label], load_contract(None), plan)
    }


@pytest.mark.parametrize("label", ["jax:f32", "iree:f32"])
def test_f32_matches_the_oracle_on_every_stage(captures, compiled_captures, full_plan, label):
    rows = _rows(captures, compiled_captures, label, full_plan)
    assert set(rows) == {stage.id for stage in full_plan}
    for stage in full_plan:
        row = rows[stage.id]
        assert row.status == "pass", (stage.id, row.note)
        if row.integer:
            assert row.failures == 0, stage.id
        else:
            assert row.max_abs < 1e-4, (stage.id, row.max_abs)
            assert row.elements > 0


def test_iree_and_jax_agree_and_are_separate_pairs(captures, compiled_captures, full_plan):
    judged = judge(
        captures["transformers:f32"],
        [compiled_captures["jax:f32"], compiled_captures["iree:f32"]],
        load_contract(None),
        full_plan,
        [(compiled_captures["jax:f32"], compiled_captures["iree:f32"])],
    )
    keys = [pair["key"] for pair in judged["pairs"]]
    assert keys == ["jax:f32", "iree:f32", "iree:f32 vs jax:f32"]
    between = [row for row in judged["rows"] if row["pair"] == "iree:f32 vs jax:f32"]
    assert len(between) == len(full_plan)
    assert max(row["max_abs"] for row in between) < 1e-4


def test_f16_contract_drifts_from_the_oracle(captures, compiled_captures, full_plan):
    rows = _rows(captures, compiled_captures, "iree:f16-contract", full_plan)
    drifted = [stage.id for stage in full_plan if not rows[stage.id].integer and rows[stage.id].relative_rms > 1e-4]
    assert drifted[0] == "vision.patch_embed"  # the first dot takes F16 operands
    assert rows["vision.rotary.cos"].max_abs < 1e-6  # RoPE stays in F32
    assert rows["vision.block.7"].max_abs > 1e-3
    assert first_divergence(list(rows.values())) is None  # measurable, but inside the default contract


def test_iree_records_the_artifact_and_the_bucket(compiled_captures):
    meta = compiled_captures["iree:f32"].meta
    assert re.fullmatch(r"[0-9a-f]{24}", meta["artifact"]["key"])
    assert meta["artifact"]["policy"] == "f32" and meta["artifact"]["target"] == "llvm-cpu"
    assert meta["bucket"] == {"rows": 1024, "active_rows": [[0, 1024]]}


@pytest.fixture(scope="module")
def two_images(tiny_checkpoint, tmp_path_factory, iree_cache):
    """Two 140x140 images (100 patches each) packed into one 256-row bucket."""
    from driftscope.families import stage_plan
    from driftscope.taps.stages import StageSelection

    inputs = prepare_inputs(tiny_checkpoint, [CHECKER, ROOT / "fixtures" / "images" / "shapes_336.png"])
    plan = stage_plan(tiny_checkpoint.family, tiny_checkpoint.config).select(StageSelection.everything())
    out = tmp_path_factory.mktemp("two")
    rows = int(inputs["grid_thw"].prod(axis=1).sum())
    bucket = rows + (-rows % 4) + 64
    taps = {"transformers": get_runtime("transformers")(tiny_checkpoint).capture(inputs, plan, out / "t")}
    for name in ("jax", "iree"):
        cache = {"cache_dir": str(iree_cache)} if name == "iree" else {}
        runtime = get_runtime(name)(tiny_checkpoint, "f32", options={"bucket": bucket, **cache})
        taps[name] = runtime.capture(inputs, plan, out / name)
    return inputs, plan, taps, bucket


@pytest.mark.parametrize("name", ["jax", "iree"])
def test_two_images_in_one_padded_bucket_match_the_oracle(two_images, name):
    inputs, plan, taps, bucket = two_images
    assert len(inputs["grid_thw"]) == 2
    active = int(inputs["grid_thw"].prod(axis=1).sum())
    assert taps[name].meta["bucket"] == {"rows": bucket, "active_rows": [[0, active]]}
    rows = compare_tapsets(taps["transformers"], taps[name], load_contract(None), plan)
    assert len(rows) == len(plan)
    for row in rows:
        assert row.status == "pass", (row.stage, row.note)
        assert row.integer or row.max_abs < 1e-4, (row.stage, row.max_abs)
    assert taps[name].shape("vision.block.0") == (active, 64)


@pytest.fixture(scope="module")
def xla_tower(tiny_checkpoint):
    """The lowered tower for two 140x140 images in a 256-row bucket, compiled by XLA."""
    spec = VisionSpec.from_config(tiny_checkpoint.config)
    weights = load_vision_weights(tiny_checkpoint.path, spec)
    bucket = pack_images([[1, 10, 10], [1, 10, 10]], 256)
    graph = lower_vision_tower(spec, get_policy("f32"), weights, bucket.rows, ("vision.block.0", "vision.block.3"))
    compiled = graph.lowered.compile()

    def run(pixels):
        out = compiled(
            weights,
            pixels,
            *[
                bucket.graph_inputs()[k]
                for k in ("patch_gather", "positions", "window_segments", "image_segments", "merged_restore")
            ],
        )
        return {k: np.asarray(v) for k, v in out.items()}

    return run, bucket


def test_padded_rows_never_feed_active_rows(xla_tower):
    run, bucket = xla_tower
    rng = np.random.default_rng(0)
    pixels = rng.standard_normal((256, 1176)).astype(np.float32)
    pixels[bucket.active :] = 0
    clean = run(pixels)
    pixels[bucket.active :] = rng.standard_normal((256 - bucket.active, 1176)).astype(np.float32) * 1e4
    noisy = run(pixels)
    for stage in ("vision.block.0", "vision.block.3", "vision.merger"):
        rows = bucket.active if stage != "vision.merger" else bucket.active_merged
        assert np.array_equal(clean[stage][:rows], noisy[stage][:rows]), stage
        assert np.isfinite(noisy[stage]).all()  # a padded query attends to itself, never to nothing
    assert not np.array_equal(clean["vision.block.3"][bucket.active :], noisy["vision.block.3"][bucket.active :])


def test_attention_never_crosses_images(xla_tower):
    run, bucket = xla_tower
    rng = np.random.default_rng(1)
    pixels = np.zeros((256, 1176), dtype=np.float32)
    pixels[:200] = rng.standard_normal((200, 1176))
    before = run(pixels)
    pixels[100:200] = rng.standard_normal((100, 1176))  # change only the second image
    after = run(pixels)
    # the first image's rows come first in window order (its window index is image-local)
    assert np.array_equal(before["vision.block.3"][:100], after["vision.block.3"][:100])  # full attention block
    assert np.array_equal(before["vision.merger"][:25], after["vision.merger"][:25])
    assert not np.array_equal(before["vision.block.3"][100:200], after["vision.block.3"][100:200])


def _lower(tiny_checkpoint, policy, taps=("vision.block.0",)):
    spec = VisionSpec.from_config(tiny_checkpoint.config)
    weights = load_vision_weights(tiny_checkpoint.path, spec)
    return lower_vision_tower(spec, get_policy(policy), weights, 100, taps)


def _dots(text):
    return re.findall(r"stablehlo\.dot_general .*?: \((tensor<[^>]+>), (tensor<[^>]+>)\) -> (tensor<[^>]+>)", text)


def test_stablehlo_shows_the_policy(tiny_checkpoint):
    texts = {policy: _lower(tiny_checkpoint, policy).text for policy in ("f32", "f16-contract", "f16-state")}
    for policy, text in texts.items():
        assert f"// precision policy: {policy}:" in text
        assert f"@jit_vision_tower_{policy.replace('-', '_')}" in text
        assert "stablehlo.constant dense<[[" not in text  # weights are arguments, not constants
    contract = _dots(texts["f16-contract"])
    assert len(contract) >= 8 * 7 + 3  # 7 dots per block (qkv, scores, context, proj, gate, up, down) + embed + merger
    for lhs, rhs, result in contract:
        assert lhs.endswith("xf16>") and rhs.endswith("xf16>"), (lhs, rhs)
        assert result.endswith("xf32>"), result
    for lhs, rhs, result in _dots(texts["f32"]):
        assert lhs.endswith("xf32>") and rhs.endswith("xf32>") and result.endswith("xf32>")
    assert "f16" not in texts["f32"].split("\n", 5)[-1]
    rounds = {p: len(re.findall(r"-> tensor<\d+x64xf16>", t)) for p, t in texts.items() if p != "f32"}
    assert rounds["f16-state"] > rounds["f16-contract"]  # the state is rounded through F16 as well


def test_a_second_compile_reuses_the_artifact_and_a_new_policy_recompiles(tmp_path):
    """The cache's rule on a tiny graph (two fresh compiles of the tower took ~30 s here; the tower compiles in
    f32 and f16-contract in compiled_captures, and test_stablehlo_shows_the_policy shows the policy in its
    StableHLO): the same graph lowered again is the same key, loaded, its file untouched; another policy is
    another key, compiled."""
    graph, _ = _picked_graph()
    first = compile_graph(graph, cache_dir=tmp_path)
    assert not first.cache_hit and first.compile_s > 0 and first.path.exists()
    stamp = first.path.stat().st_mtime_ns
    again = compile_graph(_picked_graph()[0], cache_dir=tmp_path)
    assert again.cache_hit and again.key == first.key and again.path.stat().st_mtime_ns == stamp
    other = compile_graph(_picked_graph("f16-contract")[0], cache_dir=tmp_path)
    assert not other.cache_hit and other.key != first.key
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.key, other.key])


def test_49_5_a_module_copied_in_from_another_key_is_compiled_again(tmp_path):
    """An artifact folder whose module.vmfb was replaced (here by the f16-contract graph's module, which would make
    an f32 candidate run half precision) is not this key's module: its sealed SHA-256 does not hold."""
    import shutil

    first = compile_graph(_picked_graph()[0], cache_dir=tmp_path)
    other = compile_graph(_picked_graph("f16-contract")[0], cache_dir=tmp_path)
    shutil.copyfile(other.path, first.path)
    again = compile_graph(_picked_graph()[0], cache_dir=tmp_path)
    assert not again.cache_hit and again.key == first.key
    assert again.path.read_bytes() != other.path.read_bytes()
    assert compile_graph(_picked_graph()[0], cache_dir=tmp_path).cache_hit


def test_a_host_tuned_artifact_is_keyed_by_the_host_cpu(tiny_checkpoint):
    """``--iree-llvmcpu-target-cpu=host`` (the llvm-cpu default) builds for this CPU: the identity names it
    (model and feature flags), so a cache shared with another machine never hands it this module."""
    from driftscope.capture.iree import artifact_identity, artifact_key, host_cpu

    graph = _lower(tiny_checkpoint, "f32", ())
    host = artifact_identity(graph, "llvm-cpu")
    assert "--iree-llvmcpu-target-cpu=host" in host["flags"] and host["host_cpu"] == host_cpu()
    assert "features" in host["host_cpu"]
    generic = artifact_identity(graph, "llvm-cpu", ("--iree-llvmcpu-target-cpu=generic",))
    assert "host_cpu" not in generic and artifact_key(generic) != artifact_key(host)


def test_a_large_graph_is_compiled_with_data_tiling_and_its_identity_says_so(tiny_checkpoint, monkeypatch):
    """``--iree-opt-data-tiling`` from ``DATA_TILING_FROM`` bytes of arguments on (llvm-cpu only): the tiny tower is
    below it; with the bound under its size the flag is in the identity, and so in the key."""
    import driftscope.capture.iree as iree
    from driftscope.model.weightfile import TensorFiles

    graph = _lower(tiny_checkpoint, "f32", ())
    tensors = TensorFiles(tiny_checkpoint.path)
    tower = sum(e.nbytes for name, e in tensors.entries.items() if name.startswith("model.visual."))
    assert tower <= graph.argument_bytes < tower + 2**22  # the tower's f32 weights plus its inputs
    small = iree.artifact_identity(graph, "llvm-cpu")
    assert "--iree-opt-data-tiling" not in small["flags"]
    monkeypatch.setattr(iree, "DATA_TILING_FROM", graph.argument_bytes)
    large = iree.artifact_identity(graph, "llvm-cpu")
    assert "--iree-opt-data-tiling" in large["flags"] and iree.artifact_key(large) != iree.artifact_key(small)
    assert "--iree-opt-data-tiling" not in iree.artifact_identity(graph, "cuda")["flags"]


def test_callers_sharing_the_cache_compile_each_key_once(tmp_path):
    """Processes sharing one artifact cache (batch workers, pytest-xdist workers) that ask for the same module
    while it compiles wait on its key's lock: one compiles, the other loads it, no partial file is left."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from driftscope.capture.iree import _key_lock, artifact_identity, artifact_key

    graph, _ = _picked_graph()
    folder = tmp_path / artifact_key(artifact_identity(graph, "llvm-cpu"))
    folder.mkdir()
    with ThreadPoolExecutor(2) as pool:
        with _key_lock(folder):  # another process is compiling this key
            waiting = [pool.submit(compile_graph, graph, "llvm-cpu", tmp_path) for _ in range(2)]
            time.sleep(0.3)
            assert not any(future.done() for future in waiting)
        artifacts = [future.result(timeout=120) for future in waiting]
    assert sorted(artifact.cache_hit for artifact in artifacts) == [False, True]
    assert len({artifact.path for artifact in artifacts}) == 1 and artifacts[0].path.exists()
    assert not list(folder.glob("*.partial"))


def _picked_graph(policy: str = "f32"):
    """A tiny graph (return the second of three arrays) and its arguments, lowered under ``policy``."""
    import jax
    from driftscope.taps.jax.graph import lower_function

    def pick(layers):
        return layers[1]

    rng = np.random.default_rng(0)
    layers = [rng.standard_normal(4096).astype(np.float32) for _ in range(3)]
    return lower_function(jax.jit(pick, keep_unused=True), (layers,), get_policy(policy)), layers


# bad input --------------------------------------------------------------------------------------


def test_an_iree_compile_failure_shows_the_diagnostic_and_the_file(tiny_checkpoint, tmp_path):
    from driftscope.errors import CompileError

    graph = _lower(tiny_checkpoint, "f32", ())
    graph.text = graph.text.replace("stablehlo.dot_general", "stablehlo.not_an_op", 1)
    graph.digest = "broken"
    with pytest.raises(CompileError) as err:
        compile_graph(graph, cache_dir=tmp_path)
    message = str(err.value)
    assert "error:" in message and "not_an_op" in message  # iree-compile's own diagnostic
    mlir = re.search(r"failed on (\S+stablehlo\.mlir)", message).group(1)
    assert "not_an_op" in open(mlir).read()
    assert "iree-compile" in err.value.fix


def test_unknown_policy_or_target_lists_the_valid_ones(tiny_checkpoint, tmp_path):
    from driftscope.errors import RegistryError, RuntimeUnavailableError

    with pytest.raises(RuntimeUnavailableError, match="does not offer policy 'bf16'") as err:
        get_runtime("iree")(tiny_checkpoint, "bf16")
    assert "f16-contract" in err.value.fix and "f16-state" in err.value.fix
    with pytest.raises(RegistryError, match="unknown precision policy 'f16-contrct'"):
        get_runtime("iree")(tiny_checkpoint, "f16-contrct")
    with pytest.raises(RegistryError, match="unknown IREE target 'tpu'") as err:
        compile_graph(_lower(tiny_checkpoint, "f32", ()), "tpu", cache_dir=tmp_path)
    assert "llvm-cpu" in err.value.fix and "cuda" in err.value.fix


def _rewrite_checkpoint(source, target, change):
    import shutil

    from safetensors.numpy import load_file, save_file

    shutil.copytree(source, target)
    tensors = load_file(str(target / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target


def test_checkpoint_tensors_that_do_not_match_the_config_are_named(tiny_checkpoint_dir, tiny_checkpoint, tmp_path):
    from driftscope.errors import CheckpointError

    spec = VisionSpec.from_config(tiny_checkpoint.config)
    missing = _rewrite_checkpoint(
        tiny_checkpoint_dir, tmp_path / "missing", lambda t: t.pop("visual.blocks.5.mlp.up_proj.weight")
    )
    with pytest.raises(CheckpointError, match=r"'visual\.blocks\.5\.mlp\.up_proj\.weight' is missing"):
        load_vision_weights(missing, spec)

    def widen(tensors):
        tensors["visual.blocks.2.attn.qkv.weight"] = np.zeros((192, 65), np.float32)

    wrong = _rewrite_checkpoint(tiny_checkpoint_dir, tmp_path / "wrong", widen)
    with pytest.raises(CheckpointError, match=r"'visual\.blocks\.2\.attn\.qkv\.weight' has shape \[192, 65\]"):
        load_vision_weights(wrong, spec)


def test_a_bucket_too_small_says_how_many_rows_the_images_need(tiny_checkpoint, tmp_path):
    from driftscope.errors import InputError

    with pytest.raises(InputError, match="bucket of 128 rows is too small: the images need 200 patch rows") as err:
        pack_images([[1, 10, 10], [1, 10, 10]], 128)
    assert "at least 200 rows" in err.value.fix
    inputs = prepare_inputs(tiny_checkpoint, [CHECKER, CHECKER])
    runtime = get_runtime("jax")(tiny_checkpoint, "f32", options={"bucket": 128})
    from driftscope.families import stage_plan
    from driftscope.taps.stages import StageSelection

    plan = stage_plan(tiny_checkpoint.family, tiny_checkpoint.config).select(StageSelection())
    with pytest.raises(InputError, match="need 200 patch rows"):
        runtime.capture(inputs, plan, tmp_path / "taps")


@pytest.mark.parametrize("name", ["jax", "iree"])
def test_block_by_block_path_matches_the_oracle_and_reuses_one_block_artifact(
    two_images, name, tmp_path, tiny_checkpoint, iree_cache
):
    """graph: blocks runs the stem, one function per block (window and full share it) and the merger."""
    inputs, plan, taps, bucket = two_images
    cache = {"cache_dir": str(iree_cache)} if name == "iree" else {}
    runtime = get_runtime(name)(tiny_checkpoint, "f32", options={"graph": "blocks", "bucket": bucket, **cache})
    tapset = runtime.capture(inputs, plan, tmp_path / name)
    rows = compare_tapsets(taps["transformers"], tapset, load_contract(None), plan)
    assert len(rows) == len(plan)
    for row in rows:
        assert row.status == "pass", (row.stage, row.note)
        assert row.integer or row.max_abs < 1e-4, (row.stage, row.max_abs)
    assert tapset.meta["graph"] == {"mode": "blocks", "requested": "blocks"}
    # stem, block with substages, merger: three pieces for eight blocks of two attention kinds
    assert sorted({key if isinstance(key, str) else key[0] for key in runtime._pieces}) == [
        "block+substages",
        "merger",
        "stem",
    ]


def test_auto_graph_goes_block_by_block_when_the_taps_exceed_the_budget(
    two_images, tmp_path, tiny_checkpoint, iree_cache
):
    """graph: auto (the default) keeps the whole graph for small tap sets and streams block by block past
    ``whole_taps_mib``; both captures equal the oracle."""
    inputs, plan, taps, bucket = two_images
    options = {"bucket": bucket, "cache_dir": str(iree_cache)}
    whole = get_runtime("iree")(tiny_checkpoint, "f32", options=dict(options))
    small = whole.capture(inputs, plan, tmp_path / "whole")
    tapped_mib = whole.lower(whole.bucket(inputs), whole.graph_taps([s.id for s in plan])).output_bytes / 2**20
    blocks = get_runtime("iree")(tiny_checkpoint, "f32", options={**options, "whole_taps_mib": tapped_mib / 2})
    streamed = blocks.capture(inputs, plan, tmp_path / "blocks")
    assert small.meta["graph"]["mode"] == "whole" and small.meta["graph"]["requested"] == "auto"
    assert streamed.meta["graph"] == {"mode": "blocks", "requested": "auto"}
    for tapset in (small, streamed):
        for row in compare_tapsets(taps["transformers"], tapset, load_contract(None), plan):
            assert row.status == "pass", (row.stage, row.note)
            assert row.integer or row.max_abs < 1e-4, (row.stage, row.max_abs)


def test_unknown_graph_mode_lists_the_valid_ones(tiny_checkpoint, shapes_inputs, full_plan, tmp_path):
    from driftscope.errors import ParameterError

    with pytest.raises(ParameterError, match="options.graph='layers'") as err:  # before anything loads
        get_runtime("jax")(tiny_checkpoint, "f32", options={"graph": "layers"})
    assert "blocks" in err.value.fix and "whole" in err.value.fix


def test_device_arrays_on_the_cpu_driver_share_host_memory_and_keep_it_alive():
    """The CPU driver reads host arrays in place; a misaligned array is copied once, and that copy must
    live as long as the device array (the bindings tie it only to a temporary HalBuffer object)."""
    import gc

    from driftscope.capture.iree import device_array
    from driftscope.model.weightfile import aligned_empty

    aligned = aligned_empty((64, 48))
    aligned[...] = np.arange(64 * 48, dtype=np.float32).reshape(64, 48)
    shared = device_array("local-task", aligned)
    aligned[3, 5] = -1.0  # no copy: the device sees the change
    assert shared.to_host()[3, 5] == -1.0

    expected = np.random.default_rng(0).standard_normal(4097).astype(np.float32)
    misaligned = np.concatenate([np.zeros(1, np.float32), expected])[1:]  # 4 bytes past a 64-byte boundary
    assert misaligned.ctypes.data % 64
    copied = device_array("local-task", misaligned)
    del misaligned
    gc.collect()
    junk = [np.full(4097, 7.0, np.float32) for _ in range(200)]  # reuse any memory freed too early
    np.testing.assert_array_equal(copied.to_host(), expected)
    assert len(junk) == 200


def test_an_iree_output_that_is_its_argument_outlives_the_call(tmp_path):
    """A function returning one of its inputs (a replay that picks a layer) hands back the argument's own
    buffer, imported from a host array the caller drops: the output must keep that memory alive."""
    import gc

    from driftscope.capture.iree import IreeModule

    graph, layers = _picked_graph()
    module = IreeModule(compile_graph(graph, cache_dir=tmp_path), graph.output_names)
    out = module([layer.copy() for layer in layers])["output"]
    gc.collect()
    junk = [np.full(4096, 7.0, np.float32) for _ in range(200)]  # reuse any memory freed too early
    np.testing.assert_array_equal(out, layers[1])
    assert len(junk) == 200


def test_the_jax_runtime_compiles_an_executable_once_per_cache(tiny_checkpoint):
    """The jax runtime turns on JAX's persistent compilation cache in driftscope's (``$DRIFTSCOPE_CACHE/jax``; the
    test run's own folder): a second jit of the same computation, a new function object as each new runtime
    object makes, is a cache hit, not a compile; an executable under a second of compiling is kept too."""
    import os
    import uuid
    from pathlib import Path

    import jax
    import jax.numpy as jnp
    from driftscope.capture.runtimes.jax_cache import JAX_CACHE_BYTES

    get_runtime("jax")(tiny_checkpoint, "f32").load()
    assert Path(jax.config.jax_compilation_cache_dir) == Path(os.environ["DRIFTSCOPE_CACHE"]) / "jax"
    assert jax.config.jax_compilation_cache_max_size == JAX_CACHE_BYTES  # JAX then locks each read and write
    scale = float(uuid.uuid4().int % 10_000) + 0.5  # a computation no other test compiled into this run's cache
    events: list[str] = []

    def listen(event: str, **kwargs) -> None:
        events.append(event)

    jax.monitoring.register_event_listener(listen)
    try:
        first = jax.jit(lambda x: jnp.tanh(x) * scale)(np.arange(5, dtype=np.float32))
        misses = events.count("/jax/compilation_cache/cache_misses")
        second = jax.jit(lambda x: jnp.tanh(x) * scale)(np.arange(5, dtype=np.float32))
    finally:
        jax.monitoring.unregister_event_listener(listen)
    assert misses == 1 and events.count("/jax/compilation_cache/cache_hits") == 1, events
    np.testing.assert_array_equal(np.asarray(first), np.asarray(second))
    np.testing.assert_allclose(np.asarray(second), np.tanh(np.arange(5, dtype=np.float32)) * scale, rtol=1e-6)
