"""Teacher forcing in every family and every runtime that decodes: fed tokens the runtime would not pick itself
(so its cache is rewound after the first step), its ``text.forced.logits`` match transformers f32 fed the same
tokens, and transformers' own forced rows match a prefill of the prompt plus those tokens (no cache at all)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from conftest import ROOT
from driftscope.capture.patches import parse_patch
from driftscope.capture.runtimes import get_runtime
from driftscope.families import FAMILIES, get_family
from driftscope.judge.cache import cache_pair
from driftscope.judge.contract import load_contract
from driftscope.judge.forced import FORCED, forced_pair
from driftscope.views.cache import cache_sentence

ORACLE = "transformers"


def _forced_tokens(greedy: np.ndarray) -> np.ndarray:
    """The greedy first token, then tokens the tiny model does not pick (a rewind after the first step)."""
    out = [int(greedy[0])]
    for step in range(1, len(greedy)):
        out.append(next(t for t in range(20 + 7 * step, 512) if t != int(greedy[step])))
    return np.array(out, dtype=np.int64)


@pytest.fixture(scope="module")
def forced_runs(tiny, runs, tmp_path_factory):
    """family -> (inputs with forced tokens, the oracle's forced TapSet)."""
    out, done = tmp_path_factory.mktemp("forced"), {}

    def get(name: str):
        if name not in done:
            checkpoint, inputs, plan = tiny(name)
            _, reference = runs(name, ORACLE)
            forced_inputs = copy.deepcopy(inputs)
            forced_inputs.text.forced = _forced_tokens(np.asarray(reference["text.generate.tokens"]))
            runtime = get_runtime(ORACLE)(checkpoint, "f32")
            done[name] = (forced_inputs, runtime.capture(forced_inputs, plan, out / name / ORACLE))
            runtime.release()
        return done[name]

    return get


@pytest.fixture(scope="module")
def forced_candidates(tiny, forced_runs, tmp_path_factory):
    """(family, runtime) -> that runtime's f32 TapSet on ``forced_runs``' inputs (its known-defect patch applied),
    captured once for the two tests below that read it (forced logits, KV cache)."""
    out, done = tmp_path_factory.mktemp("forced-candidates"), {}

    def get(name: str, runtime_name: str):
        if (name, runtime_name) not in done:
            checkpoint, _, plan = tiny(name)
            inputs, _ = forced_runs(name)
            patch = get_family(name).known_defects.get(runtime_name)  # a port's known defects are not round-off
            runtime = get_runtime(runtime_name)(checkpoint, "f32", parse_patch(patch))
            done[(name, runtime_name)] = runtime.capture(inputs, plan, out / name / runtime_name)
            runtime.release()
        return done[(name, runtime_name)]

    return get


@pytest.mark.parametrize("name", FAMILIES.names())
def test_the_oracles_forced_rows_are_a_prefill_of_the_prompt_and_the_forced_tokens(name, tiny, forced_runs, tmp_path):
    checkpoint, _, plan = tiny(name)
    inputs, oracle = forced_runs(name)
    forced = inputs.text.forced
    np.testing.assert_array_equal(np.asarray(oracle["text.forced.tokens"]), forced)
    rows = np.asarray(oracle[FORCED])
    np.testing.assert_allclose(rows[0], np.asarray(oracle["text.logits.last"]), atol=0)
    last = len(forced) - 1  # the row fed every forced token but the last, through the rewound cache
    one = copy.deepcopy(inputs)
    one.text.input_ids = np.concatenate([inputs.text.input_ids, forced[:last]]).astype(np.int64)
    if one.text.token_types is not None:
        one.text.token_types = np.concatenate([inputs.text.token_types, np.zeros(last, inputs.text.token_types.dtype)])
    for name, values in inputs.text.token_arrays.items():  # a processor's per-token arrays: text tokens are 0
        one.text.token_arrays[name] = np.concatenate([values, np.zeros(last, values.dtype)])
    one.text.max_new_tokens, one.text.forced = 1, None
    runtime = get_runtime(ORACLE)(checkpoint, "f32")
    prefill = runtime.capture(one, plan, tmp_path / "prefill")
    runtime.release()
    np.testing.assert_allclose(rows[last], np.asarray(prefill["text.logits.last"]), rtol=0, atol=1e-4)


def _decoding_engines() -> list:
    params = []
    for name in FAMILIES.names():
        for runtime in sorted(get_family(name).engines):
            if runtime == ORACLE or not get_runtime(runtime).decodes_with(name):
                continue
            marks = [pytest.mark.slow] if runtime == "iree" else []  # a compile of its own decode graph
            params.append(pytest.param(name, runtime, marks=marks, id=f"{name}-{runtime}"))
    return params


@pytest.mark.parametrize("name,runtime_name", _decoding_engines())
def test_an_f32_candidates_forced_logits_match_the_oracle_fed_the_same_tokens(
    name, runtime_name, forced_runs, forced_candidates
):
    inputs, oracle = forced_runs(name)
    candidate = forced_candidates(name, runtime_name)
    np.testing.assert_array_equal(np.asarray(candidate["text.forced.tokens"]), inputs.text.forced)
    difference = np.abs(np.asarray(candidate[FORCED], np.float64) - np.asarray(oracle[FORCED], np.float64))
    prefill = np.abs(np.asarray(candidate["text.logits.last"], np.float64) - np.asarray(oracle["text.logits.last"]))
    # every forced step as close as the prefill's logits: the rewound cache adds nothing
    assert difference.max() <= max(1e-4, 4 * prefill.max()), (difference.max(axis=1), prefill.max())
    strict = load_contract(ROOT / "parameters" / "contracts" / "strict.yaml")
    result = forced_pair(oracle, candidate, strict)
    assert result["steps_compared"] == len(inputs.text.forced)
    assert result["first_divergence"] is None or prefill.max() > 1e-4, result["first_failing_step"]


@pytest.mark.parametrize("name,runtime_name", _decoding_engines())
def test_an_f32_candidates_kv_cache_matches_the_oracles_per_layer_and_head(
    name, runtime_name, forced_runs, forced_candidates
):
    """The cache at the end of the prefill and after the last forced step (prompt plus the forced tokens but the
    last): every layer and head of an f32 port within round-off of transformers', and within the strict contract."""
    inputs, oracle = forced_runs(name)
    candidate = forced_candidates(name, runtime_name)
    prompt, fed = len(inputs.text.input_ids), len(inputs.text.forced) - 1
    for phase, positions in (("prefill", prompt), ("forced", prompt + fed)):
        for kind in ("keys", "values"):
            stage_id = f"text.cache.{phase}.{kind}"
            r, c = np.asarray(oracle[stage_id], np.float64), np.asarray(candidate[stage_id], np.float64)
            assert r.shape[2] == positions and r.shape == c.shape, (stage_id, r.shape, c.shape)
            assert np.abs(c - r).max() <= 1e-4 * max(1.0, np.abs(r).max()), stage_id
    # the forced cache's prompt part is the prefill's (the rewound decode left it as it was)
    np.testing.assert_array_equal(
        np.asarray(oracle["text.cache.forced.keys"])[:, :, :prompt], np.asarray(oracle["text.cache.prefill.keys"])
    )
    strict = load_contract(ROOT / "parameters" / "contracts" / "strict.yaml")
    result = cache_pair(oracle, candidate, strict)
    assert result["status"] == "pass" and result["first_layer"] is None, result["first_stage"]
    assert result["prompt_length"] == prompt


def _one_slot_off(name: str) -> dict:
    """planted_patches.cache_one_slot_off in layer 1; where the family's MLX port has known defects (Molmo2's
    break the prefill cache already) their fixes are composed first, so the planted defect is the only one left."""
    planted = {"callable": str(ROOT / "tests" / "planted_patches.py") + ":cache_one_slot_off", "kwargs": {"layer": 1}}
    known = get_family(name).known_defects.get("mlx")
    if known is None:
        return planted
    return {
        "callable": str(ROOT / "tests" / "planted_patches.py") + ":composed",
        "kwargs": {"patches": [known, planted]},
    }


@pytest.mark.parametrize(
    "name",
    [
        # a known-defect family's case is slow (Molmo2: a 461-position prompt through a 25-layer tower, ~90 s)
        pytest.param(n, marks=[pytest.mark.slow] if "mlx" in get_family(n).known_defects else [])
        for n in FAMILIES.names()
        if "mlx" in get_family(n).engines
    ],
)
def test_a_cache_written_one_slot_off_from_step_4_is_localized_to_its_layer_and_step(name, tiny, tmp_path):
    """A planted MLX decode defect (planted_patches.cache_one_slot_off: layer 1's entries one slot late from the
    answer's token 3 on, which decode step 4 feeds; composed after the port's known-defect fixes where it has any),
    teacher-forced on the same tokens as transformers: the prefill cache and every other layer agree, the forced
    cache of layer 1 first breaks at step 4, and so does the forced answer (one step numbering for one call)."""
    checkpoint, base, plan = tiny(name)
    inputs = copy.deepcopy(base)
    inputs.text.max_new_tokens = 6
    inputs.text.forced = np.array([20 + 7 * step for step in range(6)], dtype=np.int64)
    runtime = get_runtime(ORACLE)(checkpoint, "f32")
    oracle = runtime.capture(inputs, plan, tmp_path / ORACLE)
    runtime.release()
    runtime = get_runtime("mlx")(checkpoint, "f32", parse_patch(_one_slot_off(name)))
    candidate = runtime.capture(inputs, plan, tmp_path / "mlx")
    runtime.release()
    np.testing.assert_array_equal(np.asarray(candidate["text.forced.tokens"]), inputs.text.forced)
    result = cache_pair(oracle, candidate, load_contract(ROOT / "parameters" / "contracts" / "strict.yaml"))
    assert (result["first_layer"], result["first_step"]) == (1, 4), result
    assert result["first_position"] == len(inputs.text.input_ids) + 3
    stages = result["stages"]
    assert (
        stages["text.cache.prefill.keys"]["status"] == "pass"
        and stages["text.cache.prefill.values"]["status"] == "pass"
    )
    forced = stages["text.cache.forced.keys"]["layers"]
    assert forced[0]["status"] == "pass" and forced[1]["first_step"] == 4
    assert all(head["first_step"] == 4 for head in forced[1]["heads"])  # every head of that layer, from that step
    said = cache_sentence({"reference": ORACLE, "candidate": "mlx", "cache": result})
    assert "layer 1's cache first differs at step 4 (head 0, keys" in said, said
    answer = forced_pair(oracle, candidate, load_contract(ROOT / "parameters" / "contracts" / "strict.yaml"))
    assert answer["first_divergence"] == result["first_step"]  # the answer first diverges in the same call
