"""Error bounds derived from the arithmetic (``judge.bounds``): RoPE's float32 round-off grows with the position, so
two correct float32 rotations of the same keys pass the strict contract at 4,096 positions only with the
position-dependent bound, while a defect as large as that round-off placed at a low position still fails.

The two rotations are computed here in float32 the two ways runtimes do (the frequencies by ``pow`` as
transformers does, by ``exp(log)`` as fused kernels do), against a float64 rotation as the independent reference."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ROOT
from driftscope.judge.bounds import derived_bound
from driftscope.judge.cache import cache_pair
from driftscope.judge.compare import compare_tapsets
from driftscope.judge.contract import load_contract
from driftscope.taps.sink import cache_stages
from driftscope.taps.stages import Rotary, StagePlan
from driftscope.taps.tapset import TapWriter

STRICT = load_contract(ROOT / "parameters" / "contracts" / "strict.yaml")
KEYS = "text.cache.prefill.keys"
THETA, HEAD_DIM, POSITIONS = 1e6, 128, 4096
F32 = np.float32


def rope(keys: np.ndarray, positions: np.ndarray, theta: float, way: str) -> np.ndarray:
    """``keys`` [..., positions, head_dim] rotated by RoPE (rotate_half pairing): ``pow`` and ``exp`` in float32,
    ``f64`` in float64."""
    d = keys.shape[-1]
    exponents = (np.arange(0, d, 2).astype(F32) / F32(d)).astype(F32)
    if way == "pow":
        inv_freq = (F32(1.0) / (F32(theta) ** exponents)).astype(F32)
    elif way == "exp":
        inv_freq = np.exp(-exponents * np.log(F32(theta))).astype(F32)
    else:
        inv_freq = 1.0 / (float(theta) ** (np.arange(0, d, 2) / d))
    dtype = np.float64 if way == "f64" else F32
    angle = positions.astype(dtype)[:, None] * inv_freq.astype(dtype)[None, :]
    emb = np.concatenate([angle, angle], axis=-1)
    k = keys.astype(dtype)
    rotated = np.concatenate([-k[..., d // 2 :], k[..., : d // 2]], axis=-1)
    return k * np.cos(emb) + rotated * np.sin(emb)


def plan(rotary: Rotary | None) -> StagePlan:
    return StagePlan("test", cache_stages(rotary))


def tapset(tmp_path, name: str, keys: np.ndarray, positions: np.ndarray | None = None):
    meta = {"runtime": name, "label": name, "policy": {"name": "f32", "activations": "float32"}}
    writer = TapWriter(tmp_path / name, meta)
    writer.add(KEYS, np.ascontiguousarray(keys, dtype=F32))
    if positions is not None:
        writer.add("text.position_ids", positions)
    return writer.close()


@pytest.fixture(scope="module")
def keys():
    """Post-norm keys of two layers and two heads (|k| ~ 2, as a q/k-normed decoder's) at 4,096 positions."""
    rng = np.random.default_rng(7)
    return (rng.standard_normal((2, 2, POSITIONS, HEAD_DIM)) * 2).astype(F32)


@pytest.fixture(scope="module")
def rotations(keys):
    positions = np.arange(POSITIONS)
    return {way: rope(keys, positions, THETA, way) for way in ("pow", "exp", "f64")}


def test_each_float32_rotation_is_within_half_the_allowance_of_the_float64_one(rotations, tmp_path):
    """The derivation holds against float64: each float32 runtime's own error stays within its share (half) of
    the allowance at every element, the contract's atol aside (cosine and sine rounding, 1e-6 here)."""
    exact = rotations["f64"]
    bound = derived_bound(plan(Rotary.default(THETA, HEAD_DIM)).stages[0], *(tapset(tmp_path, n, exact) for n in "ab"))
    allowance = bound.rows(exact, 0)
    for way in ("pow", "exp"):
        error = np.abs(rotations[way].astype(np.float64) - exact)
        assert error.max() > 1e-4  # far above the strict atol at the highest positions
        assert np.all(error <= allowance / 2 + 2e-6), way
    assert allowance[:, :, :20].max() < 2e-4  # at low positions the allowance is far below the round-off up there


def test_two_correct_float32_rotations_pass_the_strict_contract_at_4096_positions_only_with_the_bound(
    rotations, tmp_path
):
    reference, candidate = tapset(tmp_path, "pow", rotations["pow"]), tapset(tmp_path, "exp", rotations["exp"])
    plain = compare_tapsets(reference, candidate, STRICT, plan(None))[0]
    assert plain.status == "fail" and plain.failures > 1000  # what a fixed atol makes of round-off
    assert plain.bound == "contract"
    worst = plain.worst_failing["coords"]
    assert worst[2] > 1000 and worst[3] % (HEAD_DIM // 2) < 8  # late positions, the fastest-turning pairs
    row = compare_tapsets(reference, candidate, STRICT, plan(Rotary.default(THETA, HEAD_DIM)))[0]
    assert row.status == "pass" and row.failures == 0 and row.tolerance_used < 1
    assert row.bound == "rotary round-off"
    assert row.bound_detail["passed_by_bound"] == plain.failures
    assert row.bound_detail["highest_position"] == POSITIONS - 1
    cache = cache_pair(reference, candidate, STRICT, plan(Rotary.default(THETA, HEAD_DIM)))
    assert cache["status"] == "pass" and cache["stages"][KEYS]["bound"]["kind"] == "rotary round-off"
    assert cache_pair(reference, candidate, STRICT)["status"] == "fail"  # without the plan's declaration


def test_a_defect_the_size_of_that_round_off_at_a_low_position_still_fails(rotations, tmp_path):
    late = np.abs(rotations["pow"].astype(np.float64) - rotations["exp"])[..., POSITIONS // 2 :, :].max()
    planted = rotations["exp"].copy()
    planted[1, 0, 12, 3] += late  # position 12: as large as the round-off at the last positions
    reference, candidate = tapset(tmp_path, "pow", rotations["pow"]), tapset(tmp_path, "planted", planted)
    row = compare_tapsets(reference, candidate, STRICT, plan(Rotary.default(THETA, HEAD_DIM)))[0]
    assert row.status == "fail" and row.failures == 1
    assert row.worst_failing["coords"] == [1, 0, 12, 3]
    cache = cache_pair(reference, candidate, STRICT, plan(Rotary.default(THETA, HEAD_DIM)))
    assert (cache["first_layer"], cache["first_position"], cache["first_head"]) == (1, 12, 0)


def test_m_rope_positions_bound_the_angle_by_each_tokens_largest_position(keys, tmp_path):
    """With M-RoPE the angle of a token follows its t, h, w positions, not its index: 3,000 image tokens whose
    positions stay below 64, then text; the bound reads ``text.position_ids`` and is tighter there."""
    count = POSITIONS
    grid = np.stack([np.zeros(3000), np.arange(3000) // 60, np.arange(3000) % 60]).astype(np.int64)
    text = np.arange(count - 3000) + 64
    positions = np.concatenate([grid, np.stack([text] * 3)], axis=1)
    rotary = Rotary.default(THETA, HEAD_DIM, positions="text.position_ids")
    exact = rope(keys, positions.max(axis=0), THETA, "f64")
    stage = plan(rotary).stages[0]
    bound = derived_bound(stage, tapset(tmp_path, "r", exact, positions), tapset(tmp_path, "c", exact, positions))
    allowance = bound.rows(exact, 0)
    assert allowance[:, :, :3000].max() < allowance[:, :, -1].max() / 10
    assert bound.position(np.asarray([count, count + 2])).tolist() == [text[-1] + 1, text[-1] + 3]  # decode steps
    by_index = derived_bound(
        plan(Rotary.default(THETA, HEAD_DIM)).stages[0], *(tapset(tmp_path, n, exact) for n in "de")
    )
    assert by_index.rows(exact, 0)[:, :, 2999].max() > allowance[:, :, 2999].max() * 10


def test_a_non_finite_reference_never_widens_the_bound(rotations, tmp_path):
    reference = rotations["pow"].copy()
    reference[0, 0, 4000, 0] = np.inf
    bound = derived_bound(
        plan(Rotary.default(THETA, HEAD_DIM)).stages[0], *(tapset(tmp_path, n, reference) for n in "fg")
    )
    allowance = bound.rows(reference, 0)
    assert np.isfinite(allowance).all() and allowance[0, 0, 4000, 0] == 0.0


def test_the_declaration_travels_with_the_plan():
    from driftscope.taps.stages import Stage

    stage = cache_stages(Rotary.default(THETA, 8, positions="text.position_ids"))[0]
    again = Stage.from_dict(stage.to_dict())
    assert again == stage and again.rotary.inv_freq[0] == 1.0
    assert "rotary" not in cache_stages()[1].to_dict()
