"""The q4/q8 policies: names, registration in a policy registry, options validated with clear errors."""

from __future__ import annotations

import pytest
from driftscope.core.registry import Registry
from driftscope.errors import ParameterError, RegistryError
from driftscope.model.policies import POLICIES, get_policy
from driftscope.model.precision import PrecisionPolicy
from driftscope.model.quant.policy import (
    QUANTIZED_POLICIES,
    RUNTIME_POLICIES,
    QuantizedPolicy,
    QuantSpec,
    quant_spec,
    register_quantized_policies,
)


def registry_with_quantized() -> Registry[PrecisionPolicy]:
    """What policies.POLICIES holds once policies.py calls ``register_quantized_policies(POLICIES)``."""
    registry: Registry[PrecisionPolicy] = Registry("precision policy")
    for name in POLICIES:
        registry.register(name, POLICIES.get(name))
    register_quantized_policies(registry)
    return registry


def test_every_combination_is_registered_next_to_the_float_policies():
    registry = registry_with_quantized()
    expected = {f"q{b}{e}{a}" for b in (4, 8) for e in ("", "-dequant") for a in ("", "-f16", "-bf16")}
    assert expected <= set(registry.names())
    assert set(POLICIES.names()) <= set(registry.names())  # f32, f16, ... still there
    assert len(QUANTIZED_POLICIES) == len(expected) == 12
    q4 = registry.get("q4")
    assert isinstance(q4, PrecisionPolicy) and (q4.bits, q4.execution, q4.activations) == (4, "fused", "float32")
    half = registry.get("q8-f16")
    assert (half.bits, half.execution, half.activations, half.accumulate) == (8, "fused", "float16", "float16")
    deq = registry.get("q4-dequant-bf16")
    assert (deq.execution, deq.weights, deq.activations, deq.accumulate) == (
        "dequant",
        "bfloat16",
        "bfloat16",
        "float32",
    )
    assert deq.to_dict()["quantization"] == {"bits": 4, "execution": "dequant"}
    hash(q4)  # frozen: hashes into compiled-artifact keys like every policy


def test_runtime_policies_name_registered_policies():
    registry = registry_with_quantized()
    for runtime, names in RUNTIME_POLICIES.items():
        for name in names:
            assert name in registry, (runtime, name)
    assert set(RUNTIME_POLICIES["transformers"]) == {"q4-dequant", "q8-dequant"}
    assert len(RUNTIME_POLICIES["mlx"]) == 12


def test_options_resolve_to_one_spec_with_defaults():
    registry = registry_with_quantized()
    assert quant_spec(registry.get("q4")) == QuantSpec(bits=4, group_size=64, scope="all")
    spec = quant_spec(registry.get("q8-dequant-f16"), {"group_size": 128, "scope": "vision", "bits": 8, "threads": 2})
    assert spec == QuantSpec(8, 128, "affine", "vision", "dequant", "float16")
    assert spec.weights_key == quant_spec(registry.get("q8"), {"group_size": 128, "scope": "vision"}).weights_key
    assert spec.to_dict()["execution"] == "dequant"


@pytest.mark.parametrize(
    ("options", "problem", "fix"),
    [
        ({"group_size": 48}, r"options\.group_size=48", "32, 64, 128"),
        ({"group_size": True}, r"options\.group_size=True", "32, 64, 128"),
        ({"scope": "audio"}, r"options\.scope='audio'", "vision, text, all"),
        ({"mode": "mxfp4"}, r"options\.mode='mxfp4'", "affine"),
        ({"bits": 8}, r"options\.bits=8 contradicts policy 'q4-f16'", "use policy 'q8-f16'"),
        ({"bits": 3}, r"options\.bits=3 contradicts", "drop options.bits"),
    ],
)
def test_bad_options_name_the_problem_and_the_fix(options, problem, fix):
    with pytest.raises(ParameterError, match=problem) as err:
        quant_spec(registry_with_quantized().get("q4-f16"), options)
    assert fix in err.value.fix


def test_a_float_policy_takes_no_quantization_options():
    with pytest.raises(ParameterError, match="'f16' is not quantized") as err:
        quant_spec(get_policy("f16"), {"group_size": 64})
    assert "q4" in err.value.fix


def test_spec_validates_itself_and_unknown_names_list_the_policies():
    with pytest.raises(ParameterError, match="bits=3"):
        QuantSpec(bits=3)
    with pytest.raises(ParameterError, match="activations='float64'"):
        QuantSpec(bits=4, activations="float64")
    with pytest.raises(RegistryError, match="q4-dequant-f16"):
        registry_with_quantized().get("q5")
    assert isinstance(registry_with_quantized().get("q4"), QuantizedPolicy)


@pytest.mark.parametrize(
    "first", ["driftscope.model.precision", "driftscope.model.quant.policy", "driftscope.model.policies"]
)
def test_precision_registers_the_quantized_policies_whichever_module_is_imported_first(first):
    """A fresh interpreter: no circular import, whichever module is imported first, and every quantized policy is
    registered next to the float ones."""
    import subprocess
    import sys

    script = (
        f"import {first}; from driftscope.model.policies import POLICIES; print(' '.join(sorted(POLICIES.names())))"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    names = set(out.stdout.split())
    assert {policy.name for policy in QUANTIZED_POLICIES} <= names
    assert {"f32", "f16", "bf16", "q4", "q4-dequant-f16", "q8-dequant-bf16"} <= names
