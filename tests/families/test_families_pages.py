"""Every registered family on the generic pages (issue 31 items 5 and 7): its own words and no other family's,
shipped contracts that name no family stage, and a float64 oracle.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import ROOT
from driftscope.families import FAMILIES, get_family
from driftscope.families.base import PROSE_KEYS
from driftscope.judge.compare import compare_tapsets
from driftscope.judge.contract import Contract, load_contract

FAMILY_NAMES = FAMILIES.names()
#: Words that belong to one family's model: a page of any other family must not say them.
OWN_WORDS = {
    "qwen2_5_vl": [r"\bwindows?\b", r"un-reorder", r"full-attention"],
    "qwen3_vl": [],
    "qwen3_vl_moe": [r"\bexperts?\b", r"\brout(er|ed|ing)\b"],
    "molmo2": [r"\bcrops?\b", r"pool(er|ing)"],
    "generic": [],
}
SHARED_WORDS = {
    ("qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"): [r"M-RoPE"],
    ("qwen3_vl", "qwen3_vl_moe"): [r"DeepStack"],
}


def _foreign(name: str) -> list[str]:
    """Patterns from other families' models that ``name``'s pages must not contain."""
    words = [w for other, own in OWN_WORDS.items() if other != name for w in own]
    words += [w for owners, shared in SHARED_WORDS.items() if name not in owners for w in shared]
    return words


def test_every_family_has_words_on_the_list():
    assert set(OWN_WORDS) == set(FAMILY_NAMES), "a new family names the words only its pages may say"


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_the_family_says_every_page_sentence_in_its_own_words(name):
    family = get_family(name)
    for key in PROSE_KEYS:
        said = family.text(key)
        assert len(said) > 30, (name, key)
        foreign = [w for w in _foreign(name) if re.search(w, said, re.IGNORECASE)]
        assert not foreign, (name, key, foreign, said)
    with pytest.raises(KeyError, match="no page asks"):
        family.text("no-such-page")


def test_the_generic_notebooks_say_no_family_word():
    """The notebooks' own prose is the same on every family's page: it may not name one family's model."""
    import json

    every = [w for own in OWN_WORDS.values() for w in own] + [w for shared in SHARED_WORDS.values() for w in shared]
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            source = "".join(cell["source"])
            found = [w for w in every if re.search(w, source, re.IGNORECASE)]
            assert not found, (path.name, found, source[:200])


@pytest.mark.parametrize("contract", ["default.yaml", "strict.yaml"])
@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_the_shipped_generic_contracts_name_no_family_stage(name, contract, tiny):
    """A rule naming one family's stage warned 'matches no stage' on every other family's first screen."""
    _, _, plan = tiny(name)
    warnings = load_contract(ROOT / "parameters" / "contracts" / contract).warnings(plan.ids())
    assert not warnings, warnings


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_transformers_f64_is_an_oracle_for_every_family(name, tiny, runs, tmp_path):
    """The float64 reference captures the whole plan in float64, and the float32 oracle agrees with it to
    float32 round-off (not bit for bit: the two really computed at different widths)."""
    from driftscope.capture.runtimes import get_runtime

    checkpoint, inputs, plan = tiny(name)
    _, f32 = runs(name, "transformers")
    runtime = get_runtime("transformers")(checkpoint, "f64")
    f64 = runtime.capture(inputs, plan, tmp_path / "f64")
    runtime.release()
    assert set(f64.stage_ids()) == set(f32.stage_ids())
    blocks = [s.id for s in plan if s.block is not None and not s.integer]  # (the processor's pixels stay f32)
    assert blocks and all(np.asarray(f64[stage]).dtype == np.float64 for stage in blocks)
    rows = compare_tapsets(f64, f32, Contract.from_dict({"default": {"atol": 1e-4, "rtol": 1e-4}}), plan)
    assert rows and all(row.status == "pass" for row in rows), [(r.stage, r.max_abs) for r in rows if r.failed]
    assert max(row.max_abs for row in rows if not row.integer) > 0  # f32 rounding shows against f64
