"""The screen's compiled cheap path pads each input to a power-of-two bucket (``options.buckets: pow2``) so one
compiled graph serves every input of a bucket. The padding must never be read back: on the tiny fixture, a
168x168 image (144 patch rows, padded to 256; its prompt padded to the next power of two) gives the numbers of the
unpadded call, and both stay within the f32 contract of the transformers oracle; two sizes of one bucket compile
one tower (IREE: one artifact in the cache, the slow test)."""

from __future__ import annotations

import numpy as np
import pytest
from driftscope.capture.runtimes import get_runtime
from driftscope.capture.runtimes.compiled_taps import padded_length
from driftscope.run.params import load_parameters
from driftscope.screen.capture import model_inputs, screen_options
from driftscope.screen.inputs import screen_inputs
from driftscope.screen.runner import _job
from driftscope.taps.tapset import TapSet
from screen_support import SCREEN_SET, planted_parameters

TOWER = "vision.merger"


def _captures(folder, runtime: str, names: tuple[str, ...], max_new_tokens: int = 4, cache=None) -> dict:
    """{(image, variant): TapSet} for the oracle and ``runtime`` exact/padded, on the screen's own plan."""
    params = load_parameters(planted_parameters(folder, max_new_tokens=max_new_tokens))
    job = _job(params, folder / "out")
    items = [item for n in names for item in screen_inputs(str(SCREEN_SET / n), None, "Name every shape.", ["square"])]
    options = {"cache_dir": str(cache)} if cache else {}
    variants = {
        "oracle": get_runtime("transformers")(job.checkpoint, "f32"),
        "exact": get_runtime(runtime)(job.checkpoint, "f32", None, options),
        "padded": get_runtime(runtime)(job.checkpoint, "f32", None, {**options, "buckets": "pow2"}),
    }
    taps = {}
    for variant, engine in variants.items():
        for item in items:
            base = folder / variant / item.key / "taps"
            base.parent.mkdir(parents=True)
            engine.capture(model_inputs(job, item), job.plan, base)
            taps[item.images[0].name, variant] = TapSet(base)
        engine.release()
    return taps


def _relative(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sqrt(np.mean((a - b) ** 2)) / np.sqrt(np.mean(b**2)))


def _assert_padding_unread(taps: dict, name: str) -> None:
    oracle, exact, padded = (taps[name, v] for v in ("oracle", "exact", "padded"))
    rows = exact.meta["bucket"]["active_rows"][-1][1]
    assert padded.meta["bucket"]["active_rows"] == [[0, rows]]
    assert exact.meta["bucket"]["rows"] == rows and padded.meta["bucket"]["rows"] == padded_length(rows)
    assert padded.meta["bucket"]["rows"] > rows or name == "screen_224x224.png"
    for stage in (TOWER, "text.logits.last", "text.generate.margins"):
        assert padded.shape(stage) == exact.shape(stage) == oracle.shape(stage), stage
        # padded against unpadded: the real rows computed alike (not bit-equal: other shapes, other kernels)
        assert _relative(padded[stage], exact[stage]) < 1e-5, stage
        # both against the oracle, within the f32 contract's 1e-4 relative error
        assert _relative(padded[stage], oracle[stage]) < 1e-4, stage
    assert np.array_equal(padded["text.generate.tokens"], exact["text.generate.tokens"])
    assert np.array_equal(padded["text.generate.tokens"], oracle["text.generate.tokens"])


@pytest.fixture(scope="module")
def jax_taps(tmp_path_factory):
    return _captures(tmp_path_factory.mktemp("buckets"), "jax", ("screen_168x168.png",))


@pytest.mark.slow  # 17-75 s on the shared machine: XLA compiles the tower, prefill and decode twice
def test_a_padded_bucket_gives_the_unpadded_numbers(jax_taps):
    _assert_padding_unread(jax_taps, "screen_168x168.png")


def test_the_screen_pads_compiled_runtimes_only():
    from driftscope.run.params import RuntimeSpec

    def spec(runtime, **options):
        return RuntimeSpec(runtime=runtime, policy="f32", options=options)

    assert screen_options(spec("iree"))["buckets"] == "pow2"
    assert screen_options(spec("jax"))["buckets"] == "pow2"
    assert "buckets" not in screen_options(spec("transformers")) and "buckets" not in screen_options(spec("mlx"))
    assert "buckets" not in screen_options(spec("iree", bucket=1024))  # the parameter file's own bucket wins
    assert [padded_length(n, 4) for n in (1, 4, 144, 256, 257, 1936)] == [4, 4, 256, 256, 512, 2048]


@pytest.mark.slow
def test_iree_compiles_one_tower_per_bucket(tmp_path):
    """168x168 (144 rows) and 224x224 (256 rows) share the 256-row bucket: padded, IREE compiles one tower for
    both (exact: one each); each padded capture gives its unpadded numbers, within the contract of the oracle."""
    cache = tmp_path / "iree-cache"
    names = ("screen_168x168.png", "screen_224x224.png")
    taps = _captures(tmp_path, "iree", names, cache=cache)
    for name in names:
        _assert_padding_unread(taps, name)
    towers = {
        variant: {taps[name, variant].meta["artifact"]["key"] for name in names} for variant in ("exact", "padded")
    }
    assert len(towers["exact"]) == 2 and len(towers["padded"]) == 1
    # 224x224 is 256 rows already: its exact graph is the bucket's, so the cache holds two towers, not three
    assert towers["padded"] == {taps["screen_224x224.png", "exact"].meta["artifact"]["key"]}
    tower_graphs = [p for p in cache.rglob("stablehlo.mlir") if "vision tower" in p.read_text()[:300]]
    assert len(tower_graphs) == 2
