"""Stages declared on modules (``taps.module_taps``) read what each library's forward computed: a tiny torch model
and its MLX twin run with a declaration table, checked against the same computation done by hand on the same
modules."""

from __future__ import annotations

import numpy as np
import pytest
from driftscope.taps.module_taps import ModuleTap, argument, both, each, output, resolve, tap_ports, tapped
from driftscope.taps.sink import StageSink
from driftscope.taps.stages import Stage, StagePlan
from driftscope.taps.tapset import TapWriter

TABLE = [
    *each(
        2,
        both("vision.block.{i}", output("blocks.{i}")),
        both("vision.block.{i}.norm", output("blocks.{i}.norm", lambda a: a[0])),  # a row selector
        both("vision.block.{i}.act", argument("blocks.{i}.fc2")),  # the input of the module after it
        both("vision.block.{i}.pair", output("blocks.{i}.pair", item=(1,))),  # the second of what it returns
    ),
    ModuleTap("vision.only_torch", torch=output("head")),
    both("vision.nowhere", output("blocks.7.norm")),  # a path that finds nothing writes nothing
]
STAGES = [tap.stage for tap in TABLE]


def _plan() -> StagePlan:
    return StagePlan("test", [Stage(stage, ("rows", "hidden")) for stage in STAGES])


def _capture(tmp_path, side: str, root, forward, before=None, native=True):
    writer = TapWriter(tmp_path / side, {"runtime": side, "label": side})
    with tapped(side, root, TABLE, StageSink(writer, _plan()), before, native):
        forward()
    return writer.close()


def _model(nn, call: str, layers=list):
    """A two-block model in either library (``call``: the name its modules run by, ``layers``: its list of
    modules): each block a norm, an MLP and a module returning two arrays."""

    def init(self, *children):
        nn.Module.__init__(self)
        for name, child in children:
            setattr(self, name, child)

    def block_call(self, x, scale=1.0):
        return x + self.fc2(self.act(self.fc1(self.norm(x)))) * scale + self.pair(x)[1]

    def model_call(self, x):
        for block in self.blocks:
            x = block(x, scale=0.5)
        return self.head(x)

    pair = type("Pair", (nn.Module,), {call: lambda self, x: (x * 2, x + 1)})
    block = type("Block", (nn.Module,), {call: block_call})
    model = type("Model", (nn.Module,), {call: model_call})

    def new(kind, *children):
        made = kind.__new__(kind)
        init(made, *children)
        return made

    def new_block():
        parts = (nn.LayerNorm(4), nn.Linear(4, 6), nn.GELU(), nn.Linear(6, 4), new(pair))
        return new(block, *zip(("norm", "fc1", "act", "fc2", "pair"), parts, strict=True))

    return new(model, ("blocks", layers([new_block(), new_block()])), ("head", nn.Linear(4, 3)))


def _torch_model():
    import torch
    from torch import nn

    torch.manual_seed(0)
    return _model(nn, "forward", nn.ModuleList).eval()


def test_torch_taps_read_each_declared_output_and_input_in_its_declared_form(tmp_path):
    import torch

    model = _torch_model()
    x = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(1))
    seen = []
    before = {"blocks.1": lambda args, kwargs: seen.append(kwargs["scale"])}  # a call's keyword arguments
    with torch.no_grad():
        tapset = _capture(tmp_path, "torch", model, lambda: model(x), before)
        hidden = x
        for index, block in enumerate(model.blocks):
            act = block.act(block.fc1(block.norm(hidden)))
            assert np.array_equal(tapset[f"vision.block.{index}.norm"], block.norm(hidden)[0].numpy())
            assert np.array_equal(tapset[f"vision.block.{index}.act"], act.numpy())
            assert np.array_equal(tapset[f"vision.block.{index}.pair"], (hidden + 1).numpy())
            hidden = block(hidden, scale=0.5)
            assert np.array_equal(tapset[f"vision.block.{index}"], hidden.numpy())
        assert np.array_equal(tapset["vision.only_torch"], model.head(hidden).numpy())
    assert seen == [0.5]
    assert "vision.nowhere" not in tapset.stage_ids()


def test_torch_taps_come_off_when_removed_and_a_refused_stage_is_never_converted():
    import torch

    model = _torch_model()
    recorded = []

    def refuse(array):
        raise AssertionError("a stage the sink does not want is never selected")

    ports = [("a", output("blocks.0")), ("b", output("blocks.1", refuse))]
    record = lambda stage, value, native: recorded.append((stage, value is None, native))  # noqa: E731
    with torch.no_grad(), tap_ports("torch", model, ports, record, wants=lambda stage: stage == "a") as remove:
        model(torch.zeros(1, 2, 4))
        remove()
        model(torch.zeros(1, 2, 4))
    assert recorded == [("a", False, None), ("b", True, None)]


def _mlx_model():
    import mlx.core as mx
    import mlx.nn as nn

    mx.random.seed(0)
    return _model(nn, "__call__")


class _Doubled:
    """A patch's wrapper, put over a norm as an instance attribute (what the forward then calls)."""

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, x):
        return self.inner(x) * 2


@pytest.mark.parametrize("native", [True, False])
def test_mlx_taps_read_what_the_forward_calls_at_each_path(tmp_path, native):
    import mlx.core as mx

    model = _mlx_model()
    model.set_dtype(mx.float16)
    object.__setattr__(model.blocks[1], "norm", _Doubled(model.blocks[1].norm))
    x = mx.random.normal((3, 5, 4), key=mx.random.key(1)).astype(mx.float16)
    assert isinstance(resolve(model, "blocks.1.norm"), _Doubled)
    seen = []
    before = {"blocks.1": lambda args, kwargs: seen.append(kwargs["scale"])}
    tapset = _capture(tmp_path, "mlx", model, lambda: mx.eval(model(x)), before, native)
    hidden = x
    for index, block in enumerate(model.blocks):
        norm = block.norm(hidden)  # the wrapper on block 1: the tap reads what the forward called
        act = block.act(block.fc1(norm))
        assert np.array_equal(tapset[f"vision.block.{index}.norm"], np.array(norm[0].astype(mx.float32)))
        assert np.array_equal(tapset[f"vision.block.{index}.act"], np.array(act.astype(mx.float32)))
        assert np.array_equal(tapset[f"vision.block.{index}.pair"], np.array((hidden + 1).astype(mx.float32)))
        hidden = block(hidden, scale=0.5)
        assert np.array_equal(tapset[f"vision.block.{index}"], np.array(hidden.astype(mx.float32)))
    assert seen == [0.5]
    assert "vision.only_torch" not in tapset.stage_ids() and "vision.nowhere" not in tapset.stage_ids()
    declared = tapset.declaration("vision.block.0")["native_dtype"]
    assert declared == ("float16" if native else "float32")
    assert "watched" not in type(model.blocks[0]).__call__.__qualname__  # the class's call is put back
