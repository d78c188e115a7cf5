"""Closer-to attribution on synthetic taps with known answers (pure functions, TapSets on disk)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from driftscope.core.numeric import relative_rms
from driftscope.judge.attribution import (
    CloserRow,
    attribute,
    closer_rows,
    closer_to_arrays,
    closer_to_tapsets,
    explain_quantized,
)
from driftscope.taps.tapset import TapWriter

FUSED, DEQUANT, CANDIDATE = "mlx:q4", "mlx:q4-dequant", "iree:q4-dequant"


def rel(a: np.ndarray, e: np.ndarray) -> float:
    """The definition, written out independently: sqrt(sum((a-e)^2) / sum(e^2))."""
    return math.sqrt(float(((a.astype(np.float64) - e) ** 2).sum()) / float((e.astype(np.float64) ** 2).sum()))


def synthetic(blocks: int = 32, fused_wins: tuple[int, ...] = (5, 17)) -> tuple[dict, dict]:
    """A dequantized reference, a fused one 1e-2 away from it, and a candidate 1e-4 from the dequantized one
    (1e-4 from the fused one at the blocks in ``fused_wins``)."""
    rng = np.random.default_rng(0)
    fused, dequant, candidate = {}, {}, {}
    for b in range(blocks):
        stage = f"vision.block.{b}"
        base = rng.standard_normal((50, 16)).astype(np.float32)
        dequant[stage] = base
        fused[stage] = base + 1e-2 * rng.standard_normal(base.shape).astype(np.float32)
        near = fused[stage] if b in fused_wins else dequant[stage]
        candidate[stage] = near + 1e-4 * rng.standard_normal(base.shape).astype(np.float32)
    candidate["vision.patch_embed"] = dequant["vision.patch_embed"] = fused["vision.patch_embed"] = np.ones((4, 4))
    return candidate, {FUSED: fused, DEQUANT: dequant}


def test_relative_rms_is_the_definition():
    rng = np.random.default_rng(1)
    e = rng.standard_normal((7, 9))
    a = e + rng.standard_normal((7, 9)) * 0.3
    assert relative_rms(a, e) == pytest.approx(rel(a, e), rel=1e-12)
    assert relative_rms(e, e) == 0.0
    assert relative_rms(np.ones(3), np.zeros(3)) == math.inf and relative_rms(np.zeros(3), np.zeros(3)) == 0.0
    with pytest.raises(ValueError, match="shapes differ"):
        relative_rms(np.ones(3), np.ones(4))


def test_rows_name_the_nearer_reference_and_the_ratio():
    candidate, references = synthetic()
    rows = closer_to_arrays(candidate, references)
    assert [row.stage for row in rows][:2] == ["vision.block.0", "vision.block.1"]
    for row in rows:
        if row.stage == "vision.patch_embed":  # all three identical: a tie, ratio 1
            assert row.closer is None and row.ratio == 1.0 and row.errors == {FUSED: 0.0, DEQUANT: 0.0}
            continue
        expected = {label: rel(candidate[row.stage], taps[row.stage]) for label, taps in references.items()}
        assert row.errors == pytest.approx(expected, rel=1e-9)
        block = int(row.stage.rsplit(".", 1)[1])
        assert row.closer == (FUSED if block in (5, 17) else DEQUANT)
        near, far = sorted(expected.values())
        assert row.ratio == pytest.approx(far / near, rel=1e-9) and 50 < row.ratio < 200  # ~1e-2 / 1e-4


def test_verdict_counts_blocks_and_names_the_fused_kernel():
    candidate, references = synthetic()
    result = attribute(CANDIDATE, closer_to_arrays(candidate, references))
    assert (result.winner, result.wins, len(result.counted)) == (DEQUANT, 30, 32)
    assert result.verdict.startswith(
        f"{CANDIDATE} is closer to {DEQUANT} than to {FUSED} at 30/32 blocks (median ratio "
    )
    assert result.verdict.endswith(": the remaining drift is the fused kernel's accumulation, not the compiled graph")
    assert result.to_dict()["rows"][0]["closer"] == DEQUANT
    # the other way round: a candidate that shares the fused kernel's error
    flipped = attribute(CANDIDATE, closer_to_arrays(candidate, references), counted=lambda s: s.endswith((".5", ".17")))
    assert (
        flipped.winner == FUSED
        and "2/2 blocks" in flipped.verdict
        and "shares the fused kernel's error" in flipped.verdict
    )


def test_ties_and_missing_stages():
    rows = closer_rows({"a": {"s1": 0.1, "s2": 0.2, "only_a": 1.0}, "b": {"s1": 0.1, "s2": 0.2}})
    assert [row.stage for row in rows] == ["s1", "s2"] and all(row.closer is None for row in rows)
    tie = attribute("x:f32", rows, counted=lambda s: True, noun="stages")
    assert tie.winner is None and "no closer to one of a, b" in tie.verdict and "tied 2 of 2 stages" in tie.verdict
    assert attribute("x:f32", rows).verdict == "x:f32: no blocks to attribute"
    exact = CloserRow("s", {"a": 0.0, "b": 1e-3})
    assert exact.closer == "a" and exact.ratio == math.inf
    with pytest.raises(ValueError, match="at least two references"):
        closer_rows({"a": {"s": 1.0}})
    assert explain_quantized("transformers:q4-dequant", "mlx:q4-dequant-f16", ["mlx:q4-f16"]).endswith(
        "not transformers' own arithmetic"
    )
    assert explain_quantized("jax:q4-dequant", "mlx:f16", ["mlx:bf16"]) == ""


def test_tapsets_on_disk_give_the_same_rows(tmp_path):
    candidate, references = synthetic(blocks=4, fused_wins=(2,))

    def write(name: str, taps: dict):
        with TapWriter(tmp_path / name.replace(":", "_"), {"runtime": name.split(":")[0], "label": name}) as writer:
            for stage, value in taps.items():
                writer.add(stage, value)
        return writer.close()

    on_disk = closer_to_tapsets(write(CANDIDATE, candidate), [write(label, taps) for label, taps in references.items()])
    in_memory = {row.stage: row for row in closer_to_arrays(candidate, references)}
    assert len(on_disk) == 5
    for row in on_disk:
        assert row.closer == in_memory[row.stage].closer
        assert row.errors == pytest.approx(in_memory[row.stage].errors, rel=1e-6, abs=1e-12)


def test_references_both_within_round_off_are_a_tie_not_a_verdict():
    """In float32 a q4-dequant candidate sits 1e-6 from both a fused and a dequantized reference: a ratio of
    1.01x between two round-off errors named a winner ("shares the fused kernel's error") it could not know."""
    from driftscope.judge.attribution import ROUND_OFF, attribute, closer_rows

    blocks = [f"vision.block.{i}" for i in range(4)]
    level = closer_rows({"mlx:q4": {b: 1.01e-6 for b in blocks}, "mlx:q4-dequant": {b: 1.0e-6 for b in blocks}})
    tied = attribute("transformers:q4-dequant", level)
    assert tied.winner is None and all(row.closer is None for row in tied.counted)
    assert "tied 4 of 4 blocks" in tied.verdict and "within round-off" in tied.verdict
    # one reference past round-off: the nearer one is named, as before
    apart = closer_rows({"mlx:q4": {b: 10 * ROUND_OFF for b in blocks}, "mlx:q4-dequant": {b: 1e-6 for b in blocks}})
    named = attribute("transformers:q4-dequant", apart)
    assert named.winner == "mlx:q4-dequant" and named.wins == 4
