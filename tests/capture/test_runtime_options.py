"""Each runtime declares the options it reads; one it does not know is refused at the parameters step, naming the
options it knows (issue 30 item 5: ``{warp_speed: 9}`` on mlx, IREE's ``target``/``bucket`` on mlx,
``rmsnorm: manual`` on transformers and ``activations: float16`` on an MLX q4 policy were silently ignored)."""

from __future__ import annotations

import pytest
from driftscope.capture.runtimes import RUNTIMES, get_runtime
from driftscope.cli import main
from driftscope.errors import ParameterError
from driftscope.run.params import parse_parameters
from driftscope.run.preflight import check_parameters

BASE = {"checkpoint": "ck", "images": ["a.png"]}


def preflight(*candidates: dict):
    return check_parameters(parse_parameters({**BASE, "runtimes": ["transformers", *candidates]}))


@pytest.mark.parametrize(
    ("runtime", "policy", "options", "unknown"),
    [
        ("mlx", "f32", {"warp_speed": 9}, "warp_speed"),
        ("mlx", "f32", {"target": "llvm-cpu"}, "target"),
        ("mlx", "f32", {"bucket": 256}, "bucket"),
        ("transformers", "f64", {"rmsnorm": "manual"}, "rmsnorm"),
        ("mlx", "q4", {"activations": "float16"}, "activations"),
        ("jax", "f32", {"flags": ["--iree-opt"]}, "flags"),
    ],
)
def test_an_option_the_runtime_does_not_read_is_refused(runtime, policy, options, unknown):
    with pytest.raises(ParameterError, match=f"runtime '{runtime}' has no option '{unknown}'") as err:
        preflight({"runtime": runtime, "policy": policy, "options": options})
    assert "runtimes[1].options" in err.value.problem
    assert all(name in err.value.fix for name in get_runtime(runtime).known_options())


def test_a_value_the_runtime_does_not_accept_is_refused_before_anything_loads():
    with pytest.raises(ParameterError, match=r"runtimes\[1\].options.rmsnorm='handwritten'") as err:
        preflight({"runtime": "mlx", "policy": "f16", "options": {"rmsnorm": "handwritten"}})
    assert "fused" in err.value.fix and "manual" in err.value.fix
    with pytest.raises(ParameterError, match="options.graph='layers'"):
        preflight({"runtime": "iree", "policy": "f32", "options": {"graph": "layers"}})


def test_every_option_a_runtime_documents_is_accepted():
    preflight({"runtime": "mlx", "policy": "f16", "options": {"rmsnorm": "manual"}})
    preflight({"runtime": "mlx", "policy": "q4", "options": {"group_size": 32, "scope": "vision"}})
    preflight({"runtime": "iree", "policy": "f32", "options": {"target": "llvm-cpu", "decode": False, "bucket": 256}})
    preflight({"runtime": "tapfile", "policy": "f32", "options": {"path": "engine.safetensors"}})
    for name in RUNTIMES:
        assert "label" in get_runtime(name).known_options()
    assert "group_size" not in get_runtime("tapfile").known_options()  # an engine outside quantizes nothing here


def test_driftscope_run_stops_at_the_parameters_step(tmp_path, capsys, tiny_checkpoint_dir):
    import yaml
    from conftest import SHAPES

    params = tmp_path / "p.yaml"
    runtimes = ["transformers:f32", {"runtime": "mlx", "policy": "f32", "options": {"warp_speed": 9}}]
    params.write_text(
        yaml.safe_dump({"checkpoint": str(tiny_checkpoint_dir), "images": [str(SHAPES)], "runtimes": runtimes})
    )
    assert main(["run", str(params), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "has no option 'warp_speed'" in err and "rmsnorm" in err
    assert not (tmp_path / "out" / "report.json").exists()  # nothing ran


@pytest.mark.parametrize(
    ("runtime", "policy", "options", "key"),
    [
        ("transformers", "f64", {"threads": "two"}, "threads"),  # a ValueError at load, no fix line
        ("transformers", "f64", {"threads": 0}, "threads"),
        ("iree", "f32", {"bucket": "big"}, "bucket"),
        ("iree", "f32", {"whole_taps_mib": float("nan")}, "whole_taps_mib"),
        ("iree", "f32", {"flags": "--iree-opt"}, "flags"),
        ("jax", "f32", {"taps": "all"}, "taps"),
        ("tapfile", "f32", {"path": 3}, "path"),
    ],
)
def test_49_13_an_option_value_of_the_wrong_kind_is_refused_with_its_fix(runtime, policy, options, key):
    with pytest.raises(ParameterError, match=rf"runtimes\[1\].options.{key}=") as err:
        preflight({"runtime": runtime, "policy": policy, "options": options})
    assert err.value.fix and key in err.value.fix or "use one of" in err.value.fix


def test_49_13_float32_operators_outside_the_tower_are_refused_at_the_parameters_step(tmp_path, tiny_checkpoint_dir):
    """``options: {f32: [vision.block.99.norm2]}`` on the 8-block tiny tower was an IndexError at the capture."""
    from conftest import SHAPES

    base = {"checkpoint": str(tiny_checkpoint_dir), "images": [str(SHAPES)]}
    for f32, named in (("vision.block.99.norm2", "vision.block.99.norm2"), ("vision.block.0.nonsense", "nonsense")):
        runtimes = ["transformers", {"runtime": "mlx", "policy": "f16", "options": {"f32": [f32]}}]
        with pytest.raises(ParameterError, match=rf"runtimes\[1\] \(mlx:f16\): options.f32 names .*{named}") as err:
            check_parameters(parse_parameters({**base, "runtimes": runtimes}))
        assert "vision.block.0-7.norm2" in err.value.fix
    good = ["transformers", {"runtime": "mlx", "policy": {"base": "f16", "f32": ["vision.block.5-7.norm2"]}}]
    check_parameters(parse_parameters({**base, "runtimes": good}))
