"""Every family's engine modules declare what their runtime reads, typed (issue 54 item 1): each answers its
runtime's Protocol, holds its runtime's ``CAPABILITIES`` type (``families.capabilities``, every capability with
its default), and no runtime reads a capability off a module with ``getattr``. The page hooks, precision and
hypotheses modules declare what they offer beyond their functions the same way (or nothing: the defaults)."""

from __future__ import annotations

import ast
import dataclasses
import types

import pytest
from conftest import ROOT
from driftscope.capture.runtimes import get_runtime
from driftscope.errors import RuntimeUnavailableError
from driftscope.families import FAMILIES, get_family
from driftscope.families.capabilities import (
    CompiledCapabilities,
    HooksCapabilities,
    HypothesesCapabilities,
    PrecisionCapabilities,
    TransformersCapabilities,
    capabilities_of,
)

ENGINES = [(name, runtime) for name in FAMILIES.names() for runtime in sorted(get_family(name).engines)]


def _members(protocol: type) -> set[str]:
    """The names a Protocol asks of a module: its annotated data and its methods."""
    methods = {name for name, value in vars(protocol).items() if callable(value) and not name.startswith("_")}
    return set(protocol.__annotations__) | methods


@pytest.mark.parametrize(("name", "runtime"), ENGINES)
def test_every_engine_module_answers_its_runtime_and_declares_its_capabilities(name, runtime):
    engine = get_family(name).engine(runtime)
    kind = get_runtime(runtime)
    missing = sorted(member for member in _members(kind.ENGINE_MODULE) if not hasattr(engine, member))
    assert not missing, f"{engine.__name__} lacks {missing} of {kind.ENGINE_MODULE.__name__}"
    assert isinstance(engine, kind.ENGINE_MODULE)
    assert type(vars(engine)["CAPABILITIES"]) is kind.CAPABILITIES
    # a capability written as a module name (the form no runtime reads any more) would be silently ignored
    stray = {field.name.upper() for field in dataclasses.fields(kind.CAPABILITIES)} & set(vars(engine))
    assert not stray, f"{engine.__name__} declares {sorted(stray)} outside its CAPABILITIES"


def test_the_families_declare_what_they_had_before():
    """What each family declared as module names before the typed declarations, read through them."""
    declared = {
        name: capabilities_of(get_family(name).engine("iree"), CompiledCapabilities)
        for name in ("qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "molmo2")
    }
    assert {name: (c.decodes, c.substitutes, c.buckets, c.tower_weights_apart) for name, c in declared.items()} == {
        "qwen2_5_vl": (True, True, True, True),
        "qwen3_vl": (True, True, False, True),
        "qwen3_vl_moe": (True, True, False, True),
        "molmo2": (True, False, False, False),
    }
    assert "lm_head.weight" in declared["qwen2_5_vl"].dot_weights
    assert not any(declared[name].dot_weights for name in ("qwen3_vl", "qwen3_vl_moe", "molmo2"))
    moe = capabilities_of(get_family("qwen3_vl_moe").engine("transformers"), TransformersCapabilities)
    assert dict(moe.load_kwargs) == {"experts_implementation": "eager"} and moe.correct_load is not None
    for name in ("qwen2_5_vl", "molmo2"):
        assert get_family(name).engine("mlx").CAPABILITIES.unrepresentable is not None
    for name in ("generic", "qwen3_vl", "qwen3_vl_moe"):
        assert get_family(name).engine("mlx").CAPABILITIES.unrepresentable is None


def test_a_misspelt_capability_is_refused_where_it_is_declared():
    with pytest.raises(TypeError, match="bucket"):
        CompiledCapabilities(bucket=True)  # type: ignore[call-arg]


def test_a_module_without_its_declaration_is_refused_naming_the_fix():
    bare = types.ModuleType("a_plugin_family.transformers_taps")
    with pytest.raises(RuntimeUnavailableError) as caught:
        capabilities_of(bare, TransformersCapabilities)
    assert "a_plugin_family.transformers_taps" in caught.value.problem
    assert "CAPABILITIES = TransformersCapabilities(" in caught.value.fix
    bare.CAPABILITIES = CompiledCapabilities()  # another runtime's declaration
    with pytest.raises(RuntimeUnavailableError, match="CompiledCapabilities"):
        capabilities_of(bare, TransformersCapabilities)


MODULE_KINDS = (
    ("hooks", "view_hooks", HooksCapabilities),
    ("precision", "precision_module", PrecisionCapabilities),
    ("hypotheses", "hypothesis_module", HypothesesCapabilities),
)


@pytest.mark.parametrize(("field", "opener", "kind"), MODULE_KINDS)
@pytest.mark.parametrize("name", FAMILIES.names())
def test_every_hooks_precision_and_hypotheses_module_declares_its_own_kind_or_nothing(name, field, opener, kind):
    family = get_family(name)
    if getattr(family, field) is None:
        pytest.skip(f"{name} has no {field} module")
    module = getattr(family, opener)()
    declared = vars(module).get("CAPABILITIES")
    assert declared is None or type(declared) is kind, f"{module.__name__} declares a {type(declared).__name__}"
    stray = {f.name.upper() for f in dataclasses.fields(kind)} & set(vars(module)) - {"CLOSES"}  # closes' source
    assert not stray, f"{module.__name__} declares {sorted(stray)} outside its CAPABILITIES"


def test_the_optional_declarations_say_what_the_modules_said_before():
    """The router view of Qwen3-VL-MoE, the text reason of every precision search, each family's ready patches."""
    rerouted = {name: capabilities_of(get_family(name).view_hooks(), HooksCapabilities).rerouted for name in FAMILIES}
    assert {name for name, hook in rerouted.items() if hook is not None} == {"qwen3_vl_moe"}
    for name in ("qwen2_5_vl", "qwen3_vl", "molmo2"):
        module = get_family(name).precision_module()
        assert capabilities_of(module, PrecisionCapabilities).text_reason == module.TEXT
        assert "text" in module.TEXT
    closes = {name: capabilities_of(get_family(name).hypothesis_module(), HypothesesCapabilities).closes
              for name in FAMILIES}  # fmt: skip
    assert "norm2_in_float32" in closes["qwen2_5_vl"] and "mlx_vlm_fixes" in closes["molmo2"]
    assert closes["qwen3_vl"] == {}  # declares none: the defaults
    bare = types.ModuleType("a_plugin_family.hooks")
    assert capabilities_of(bare, HooksCapabilities) == HooksCapabilities()  # a plugin's bare module: the defaults
    bare.CAPABILITIES = PrecisionCapabilities()
    with pytest.raises(RuntimeUnavailableError, match="PrecisionCapabilities"):
        capabilities_of(bare, HooksCapabilities)


def test_no_runtime_reads_a_family_module_with_getattr():
    """``getattr(<...>.taps, ...)`` or ``getattr(<...>.engine(...), ...)`` anywhere in ``capture/``: a capability
    no declaration names."""
    offenders = []
    for path in sorted((ROOT / "lib" / "driftscope" / "capture").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"):
                continue
            target = node.args[0]
            if isinstance(target, ast.Call):
                target = target.func
            if isinstance(target, ast.Attribute) and target.attr in ("taps", "engine"):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, offenders
