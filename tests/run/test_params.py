import pytest
from driftscope.errors import DriftscopeError, HypothesisPatchError, ParameterError
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


@pytest.mark.parametrize("factor", [float("nan"), float("inf"), -1, 0, "4"])
def test_a_relative_factor_that_is_not_a_finite_ratio_above_zero_is_refused(factor):
    """Issue 30 item 3: a NaN factor makes every `error > factor * reference` false, so nothing would fail."""
    relative = {"high": "mlx:f16", "oracle": "transformers:f32", "factor": factor}
    with pytest.raises(ParameterError, match="relative.factor must be"):
        parse_parameters({**BASE, "relative": relative})
    with pytest.raises(ParameterError, match="relative.floor must be"):
        parse_parameters({**BASE, "relative": {**relative, "factor": 4, "floor": -1e-6}})
    assert parse_parameters({**BASE, "relative": {**relative, "factor": 2}}).relative["factor"] == 2.0


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


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"notebooks": [1]}, "notebooks entries must be str"),
        ({"stages": {"include": [7]}}, "stages.include entries must be str"),
        ({"stages": {"exclude": [None]}}, "stages.exclude entries must be str"),
        ({"power": {"policy": "f99"}}, "f99"),
    ],
)
def test_type_and_name_errors_are_found_at_the_parameters_step(extra, message):
    """Issue 30 items 8 and 16: each was found only at the checkpoint step, after capture, or not at all."""
    with pytest.raises(DriftscopeError, match=message):
        parse_parameters({**BASE, **extra})


def test_a_contract_written_inline_is_refused_with_a_contract_example():
    """The error for ``contract: {default: ...}`` suggested an image path as the fix."""
    with pytest.raises(ParameterError, match="contract must be str") as caught:
        parse_parameters({**BASE, "contract": {"default": {"atol": 1e-4, "rtol": 1e-4}}})
    assert "contracts/strict.yaml" in caught.value.fix and ".png" not in caught.value.fix


def test_substages_outside_the_tower_are_refused_before_anything_loads(tiny_checkpoint_dir):
    """``substages: [99]`` on the tiny fixture's tower was taken modulo its depth (block 99 % depth)."""
    from driftscope.families import stage_plan
    from driftscope.families.checkpoints import open_checkpoint
    from driftscope.run.preflight import check_parameters

    checkpoint = open_checkpoint(tiny_checkpoint_dir)
    depth = stage_plan(checkpoint.family, checkpoint.config).depth
    data = {**BASE, "checkpoint": str(tiny_checkpoint_dir)}
    for index in (depth, 99, -depth - 1):
        with pytest.raises(ParameterError, match=rf"stages.substages \[{index}\] are not blocks of .* {depth}-block"):
            check_parameters(parse_parameters({**data, "stages": {"substages": [index]}}))
    check_parameters(parse_parameters({**data, "stages": {"substages": [0, depth - 1, -depth]}}))
    plan = stage_plan(checkpoint.family, checkpoint.config)
    with pytest.raises(ParameterError, match="not blocks"):  # the same rule wherever a plan is selected
        plan.select(parse_parameters({**data, "stages": {"substages": [99]}}).stages)


def test_49_7_a_relative_factor_or_floor_past_any_scale_judges_nothing_and_is_refused():
    relative = {"high": "mlx:f16", "oracle": "transformers:f32"}
    for key, value in (("factor", 1.0e300), ("floor", 1.0e308), ("factor", 1.0e4)):
        with pytest.raises(ParameterError, match=f"relative.{key} .*judges nothing"):
            parse_parameters({**BASE, "relative": {**relative, key: value}})
