import pytest
from driftscope.errors import ContractError
from driftscope.judge.contract import Contract, Tolerance, load_contract


def test_default_contract_is_atol_rtol_0_08():
    contract = load_contract(None)
    assert contract.tolerance("vision.block.3").atol == 0.08
    assert contract.tolerance("vision.block.3").rtol == 0.08


def test_first_matching_pattern_wins(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "default: {atol: 0.1, rtol: 0.1}\nstages:\n"
        "  - {pattern: 'vision.block.1*', atol: 0.5}\n  - {pattern: 'vision.*', atol: 0.2, rtol: 0}\n"
        "  - {pattern: 'vision.rotary.*', skip: true}\n"
    )
    contract = load_contract(path)
    assert contract.tolerance("vision.block.17.mlp.down").atol == 0.5
    assert contract.tolerance("vision.block.17.mlp.down").rtol == 0.1  # inherits the default's rtol
    assert contract.tolerance("vision.block.2").atol == 0.2
    assert contract.tolerance("vision.rotary.cos").skip is False  # 'vision.*' matched first
    assert contract.tolerance("text.logits").atol == 0.1


@pytest.mark.parametrize(
    "text, message",
    [
        ("default: {atol: 0.1, btol: 2}", "unknown keys \\['btol'\\]"),
        ("default: {atol: -1}", "non-negative"),
        ("stages: [{atol: 1}]", "needs a 'pattern'"),
        ("tolerance: 1", "unknown keys \\['tolerance'\\]"),
        ("default: {atol: 0.1", "not valid YAML"),
    ],
)
def test_bad_contracts_name_the_problem(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ContractError, match=message):
        load_contract(path)


def test_missing_contract_file():
    with pytest.raises(ContractError, match="does not exist"):
        load_contract("nope.yaml")


def test_contracts_shipped_in_parameters_load():
    from pathlib import Path

    for path in (Path(__file__).resolve().parents[2] / "parameters" / "contracts").glob("*.yaml"):
        assert isinstance(load_contract(path), Contract)


def test_peer_factors_per_stage_pattern():
    from driftscope.judge.contract import Contract

    contract = Contract.from_dict(
        {"default": {"peer_factor": 2}, "stages": [{"pattern": "vision.merger*", "peer_factor": 8, "peer_floor": 1e-3}]}
    )
    assert (contract.tolerance("vision.block.3").peer_factor, contract.tolerance("vision.block.3").peer_floor) == (
        2,
        1e-6,
    )
    assert (contract.tolerance("vision.merger").peer_factor, contract.tolerance("vision.merger").peer_floor) == (
        8,
        1e-3,
    )
    assert contract.to_dict()["stages"][0]["peer_factor"] == 8
    with pytest.raises(ContractError, match="peer_factor must be a finite, non-negative number"):
        Contract.from_dict({"default": {"peer_factor": -1}})


def test_numbers_are_read_the_way_a_user_writes_them(tmp_path):
    """Issue 30 item 15: PyYAML read ``atol: 1e-4`` (the README's notation) as the string "1e-4", refused."""
    path = tmp_path / "strict.yaml"
    path.write_text(
        "name: strict\ndefault: {atol: 1e-4, rtol: 1E-4}\nstages:\n  - {pattern: vision.merger, atol: 5e-5, rtol: 0}\n"
    )
    contract = load_contract(path)
    assert contract.default == Tolerance(atol=1e-4, rtol=1e-4)
    assert contract.tolerance("vision.merger") == Tolerance(atol=5e-5, rtol=0.0)
    path.write_text('name: quoted\ndefault: {atol: "1e-4"}\n')  # a string the user quoted stays a string: refused
    with pytest.raises(ContractError, match="atol"):
        load_contract(path)


def test_a_parameter_file_reads_exponents_as_numbers(tmp_path):
    from driftscope.run.params import load_parameters

    path = tmp_path / "p.yaml"
    path.write_text(
        "checkpoint: ck\nimages: [a.png]\nruntimes: [transformers:f32, transformers:f64]\n"
        "relative: {high: 'transformers:f64', oracle: 'transformers:f32', factor: 4e0, floor: 1e-6}\n"
    )
    assert load_parameters(path).relative == {
        "high": "transformers:f64",
        "oracle": "transformers:f32",
        "factor": 4.0,
        "floor": 1e-6,
    }


@pytest.mark.parametrize(
    "text, key",
    [
        ("default: {atol: 1.0e+308}", "atol"),  # atol + rtol * |e| overflows to inf: nothing can fail
        ("default: {atol: 1.0e+30}", "atol"),  # finite, but past any stage's scale
        ("stages: [{pattern: 'vision.*', rtol: 1.0}]", "rtol"),  # a candidate of zeros passes every element
        ("default: {rtol: 1.0e+308}", "rtol"),
        ("default: {max_failure_fraction: 1.0}", "max_failure_fraction"),  # every element may fail
        ("stages: [{pattern: 'text.*', max_failure_fraction: 0.75}]", "max_failure_fraction"),
        ("default: {peer_factor: 1.0e+300}", "peer_factor"),
        ("default: {peer_floor: 1.0e+308}", "peer_floor"),
    ],
)
def test_49_7_a_contract_that_judges_nothing_is_refused(tmp_path, text, key):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ContractError, match=f"{key} .*judges? nothing") as caught:
        load_contract(path)
    assert caught.value.fix and key in caught.value.fix


def test_49_7_a_run_with_such_a_contract_stops_at_the_parameters_step_without_numpy_warnings(tmp_path):
    """Before any model loads, exit 2, one line naming the key and no RuntimeWarning on the terminal."""
    import subprocess
    import sys

    import yaml
    from conftest import ROOT, TINY

    contract = tmp_path / "c.yaml"
    contract.write_text("default: {atol: 1.0e+308, rtol: 1.0e+308}\n")
    params = tmp_path / "p.yaml"
    params.write_text(
        yaml.safe_dump(
            {
                "checkpoint": str(TINY),
                "images": [str(ROOT / "fixtures" / "images" / "checkerboard_140.png")],
                "runtimes": ["transformers:f32", "mlx:f32"],
                "contract": str(contract),
                "notebooks": [],
            }
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "driftscope", "run", str(params), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2, done.stderr
    assert "atol" in done.stderr and "Warning" not in done.stderr + done.stdout and "Traceback" not in done.stderr
    assert not (tmp_path / "out" / "report.json").exists()
