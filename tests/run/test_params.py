import pytest
from driftscope.errors import HypothesisPatchError, ParameterError
from driftscope.run.params import load_parameters, parse_parameters

BASE = {"checkpoint": "ck", "images": ["a.png"], "runtimes": ["transformers", {"runtime": "mlx", "policy": "f16"}]}


def test_minimal_parameters(tmp_path):
    params = parse_parameters(BASE, base=tmp_path)
    assert params.checkpoint == tmp_path / "ck"
    assert [spec.display for spec in params.runtimes] == ["transformers:f32", "mlx:f16"]
    assert params.reference_label == "transformers:f32"
    assert params.stages.blocks is True and params.stages.substages == ()


def test_unknown_keys_list_the_valid_ones():
    with pytest.raises(ParameterError) as err:
        parse_parameters({**BASE, "checkpont": "x"})
    assert "checkpont" in str(err.value) and "checkpoint" in err.value.fix and "runtimes" in err.value.fix


@pytest.mark.parametrize(
    "change, message",
    [
        ({"images": "a.png"}, "images must be list"),
        ({"runtimes": [{"runtime": "mlx", "policy": 16}, "transformers"]}, "policy must be str"),
        ({"stages": {"substages": [1.5]}}, "block indices"),
        ({"stages": {"blocks": "yes"}}, "stages.blocks must be bool"),
        ({"runtimes": ["transformers"]}, "fewer than two"),
        ({"runtimes": ["mlx", "mlx"]}, "labels repeat"),
        ({"reference": "jax:f32"}, "not one of the runtimes"),
        ({"runtimes": [{"policy": "f32"}, "mlx"]}, "has no 'runtime'"),
        ({"runtimes": [{"runtime": "mlx", "colour": 1}, "transformers"]}, "unknown keys \\['colour'\\]"),
    ],
)
def test_wrong_types_and_values(change, message):
    with pytest.raises(ParameterError, match=message):
        parse_parameters({**BASE, **change})


def test_missing_required_key():
    with pytest.raises(ParameterError, match="no 'images'"):
        parse_parameters({"checkpoint": "x", "runtimes": []})


def test_patch_entries():
    params = parse_parameters(
        {
            **BASE,
            "runtimes": [
                "transformers",
                {
                    "runtime": "mlx",
                    "patch": {"callable": "driftscope.hypotheses:scale_block_output", "kwargs": {"block": 2}},
                },
            ],
        }
    )
    assert params.runtimes[1].patch.kwargs == {"block": 2}
    with pytest.raises(HypothesisPatchError):
        parse_parameters({**BASE, "runtimes": ["transformers", {"runtime": "mlx", "patch": 3}]})


def test_parameter_files_in_the_repository_are_valid():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for path in (root / "parameters").glob("*.yaml"):
        load_parameters(path, base=root)


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ParameterError, match="does not exist"):
        load_parameters(tmp_path / "none.yaml")
    (tmp_path / "bad.yaml").write_text("checkpoint: [")
    with pytest.raises(ParameterError, match="not valid YAML"):
        load_parameters(tmp_path / "bad.yaml")


def test_narrowing_is_on_by_default_and_can_be_switched_off():
    assert parse_parameters(BASE).narrow is True
    params = parse_parameters({**BASE, "narrow": False})
    assert params.narrow is False and params.to_dict()["narrow"] is False
    assert params.digest != parse_parameters(BASE).digest
    with pytest.raises(ParameterError, match="narrow must be bool"):
        parse_parameters({**BASE, "narrow": "yes"})


def test_relative_to_a_peer():
    params = parse_parameters({**BASE, "relative": {"peer": "mlx:f16"}})
    assert params.relative == {"peer": "mlx:f16"}
    both = {"peer": "mlx:f16", "high": "mlx:f16", "oracle": "transformers:f32"}
    assert set(parse_parameters({**BASE, "relative": both}).relative) == {"peer", "high", "oracle", "factor", "floor"}
    with pytest.raises(ParameterError, match="other than the reference"):
        parse_parameters({**BASE, "relative": {"peer": "transformers:f32"}})
    with pytest.raises(ParameterError, match="other than the reference"):
        parse_parameters({**BASE, "relative": {"peer": "iree:f32"}})
    with pytest.raises(ParameterError, match="neither a float64 run"):
        parse_parameters({**BASE, "relative": {"factor": 3}})


Q4 = {
    **BASE,
    "runtimes": [
        {"runtime": "transformers", "policy": "q4-dequant"},
        {"runtime": "mlx", "policy": "q4-f16"},
        {"runtime": "mlx", "policy": "q4-dequant-f16"},
        {"runtime": "iree", "policy": "q4-dequant"},
    ],
}


def test_attribution_section():
    section = {"candidate": "iree:q4-dequant", "references": ["mlx:q4-f16", "mlx:q4-dequant-f16"]}
    params = parse_parameters({**Q4, "attribution": section})
    assert params.attribution == section and params.to_dict()["attribution"] == section
    assert "attribution" not in parse_parameters(Q4).to_dict()  # digests of runs without one are unchanged


@pytest.mark.parametrize(
    "section, message",
    [
        ({"candidate": "iree:q4-dequant", "references": ["mlx:q4", "mlx:q4-dequant-f16"]}, "\\['mlx:q4'\\]"),
        ({"candidate": "iree:q4-dequant", "references": ["mlx:q4-f16"]}, "at least two"),
        ({"candidate": "mlx:q4-f16", "references": ["mlx:q4-f16", "mlx:q4-dequant-f16"]}, "distinct"),
        ({"candidate": "iree:q4-dequant", "references": "mlx:q4-f16"}, "attribution.references must be list"),
        ({"candidate": "iree:q4-dequant", "refs": []}, "refs"),
    ],
)
def test_bad_attribution_sections_are_named(section, message):
    with pytest.raises(ParameterError, match=message):
        parse_parameters({**Q4, "attribution": section})
