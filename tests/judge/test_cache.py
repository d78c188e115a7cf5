"""The KV cache's first difference (``judge.cache``): the step numbering it shares with the teacher-forced answer,
and which stage is named when two break at the same layer, position and head."""

from __future__ import annotations

import numpy as np
from driftscope.judge.cache import cache_pair, decode_step
from driftscope.judge.contract import Contract, Tolerance
from driftscope.taps.tapset import TapWriter

PROMPT, STEPS, LAYERS, HEADS, DIM = 5, 3, 2, 2, 4
STRICT = Contract("strict", Tolerance(1e-4, 1e-4))


def write(tmp_path, name: str, prefill: np.ndarray, forced: np.ndarray):
    writer = TapWriter(tmp_path / name, {"runtime": name, "label": name})
    for phase, array in (("prefill", prefill), ("forced", forced)):
        for kind in ("keys", "values"):
            writer.add(f"text.cache.{phase}.{kind}", np.ascontiguousarray(array, dtype=np.float32))
    return writer.close()


def caches():
    rng = np.random.default_rng(3)
    forced = rng.standard_normal((LAYERS, HEADS, PROMPT + STEPS - 1, DIM))
    return forced[:, :, :PROMPT].copy(), forced


def test_a_tie_names_the_prefill_cache_written_first_not_the_alphabetically_first(tmp_path):
    """A prompt position that differs in both the prefill's cache and the forced one (the same entry, kept): the
    first difference is the prefill's, which was written first ("forced" sorts before "prefill")."""
    prefill, forced = caches()
    bad_prefill, bad_forced = prefill.copy(), forced.copy()
    bad_prefill[1, 0, 2, 1] += 0.5
    bad_forced[1, 0, 2, 1] += 0.5
    result = cache_pair(write(tmp_path, "r", prefill, forced), write(tmp_path, "c", bad_prefill, bad_forced), STRICT)
    assert (result["first_layer"], result["first_position"], result["first_head"]) == (1, 2, 0)
    assert result["first_stage"] == "text.cache.prefill.keys"


def test_steps_count_decode_calls_as_the_forced_answer_does(tmp_path):
    """One numbering: step 0 is the prefill (the prompt's cache entries, logits row 0); the entry at position
    prompt + i - 1 was written by step i, the call whose logits are row i of ``text.forced.logits``."""
    assert [decode_step(p, PROMPT) for p in (0, PROMPT - 1, PROMPT, PROMPT + 1)] == [0, 0, 1, 2]
    prefill, forced = caches()
    late = forced.copy()
    late[0, 1, PROMPT + 1, 0] += 0.5  # the entry the second decode call writes
    result = cache_pair(write(tmp_path, "r", prefill, forced), write(tmp_path, "c", prefill, late), STRICT)
    assert (result["first_position"], result["first_step"]) == (PROMPT + 1, 2)
    assert "step 0 is the prefill" in result["steps"]
    early = prefill.copy()
    early[0, 0, 1, 0] += 0.5
    result = cache_pair(write(tmp_path, "r2", prefill, forced), write(tmp_path, "c2", early, forced), STRICT)
    assert result["first_step"] == 0  # a prompt position: the prefill's


def test_the_sentences_say_the_prefill_as_step_0():
    from driftscope.views.cache import cache_sentence

    cache = {"first_layer": 1, "first_step": 0, "first_head": 0, "first_stage": "text.cache.prefill.keys"}
    said = cache_sentence({"reference": "r", "candidate": "c", "cache": {**cache, "first_position": 3}})
    assert "first differs in the prefill (step 0)" in said
