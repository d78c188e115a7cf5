"""The worst row's lineage follows the token the family lays out (issue 53 item 2): a defect planted in one token's
row of one block's output, on each family's own capture, is named as that token, in raster order over the axes that
index the family's rows (Molmo2's crops and patches, Qwen2.5-VL's window order restored, the raster order of Qwen3-VL
and Qwen3-VL-MoE), and every earlier stage of that token is clean. Where the planted row sits is computed here from
the family's geometry, not from the lineage's own mapping. The generic family lays out no tokens: its lineage says
so (None)."""

from __future__ import annotations

import numpy as np
import pytest
from driftscope.judge.compare import compare_tapsets
from driftscope.judge.contract import Contract
from driftscope.judge.lineage import row_lineage
from driftscope.taps.tapset import TapWriter

STAGE = "vision.block.1"


def _planted(reference, out, stored: tuple[int, ...]):
    """A copy of ``reference`` whose ``STAGE`` row at ``stored`` (its leading indices) is off by far more than the
    contract allows; every other stage and row is the reference's own."""
    meta = {k: v for k, v in reference.meta.items() if k not in ("stages", "complete")}
    writer = TapWriter(out, {**meta, "label": "planted"})
    for stage_id in reference.stage_ids():
        value = np.array(reference[stage_id])
        if stage_id == STAGE:
            value[stored] = value[stored] * 1.5 + 1.0
        declared = {
            k: v for k, v in reference.declaration(stage_id).items() if k not in ("id", "shape", "native_dtype")
        }
        writer.add(stage_id, value, **declared)
    return writer.close()


def _window_position(checkpoint, reference, token: int) -> int:
    """Where raster patch row ``token`` sits in Qwen2.5-VL's window order: its merged token's place in the window
    index the family's geometry computes from the image's grid and the checkpoint's window settings."""
    from driftscope.families.qwen2_5_vl.geometry import window_index

    vision = checkpoint.config["vision_config"]
    grid = np.asarray(reference["inputs.grid_thw"]).reshape(-1, 3).tolist()
    index = window_index(grid, vision["spatial_merge_size"], vision["window_size"], vision["patch_size"])
    merged = vision["spatial_merge_size"] ** 2
    return int(np.flatnonzero(np.asarray(index) == token // merged)[0]) * merged + token % merged


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "molmo2"])
def test_a_planted_token_is_followed_as_that_token(family, runs, tiny, tmp_path):
    checkpoint, _, plan = tiny(family)
    _, reference = runs(family, "transformers")
    shape = reference.shape(STAGE)
    if family == "molmo2":  # rows over crops and patches: crop 1's patch 100
        token, stored = shape[1] + 100, (1, 100)
    elif family == "qwen2_5_vl":  # window order: the token's row restored with the family's own window index
        token = shape[0] // 3 + 1
        stored = (_window_position(checkpoint, reference, token),)
    else:  # raster order
        token, stored = shape[0] // 3 + 1, (shape[0] // 3 + 1,)
    candidate = _planted(reference, tmp_path / "planted", stored)
    contract = Contract()
    (row,) = [r for r in compare_tapsets(reference, candidate, contract, plan) if r.stage == STAGE]
    assert row.failed and tuple(row.worst_failing["coords"][: len(stored)]) in (stored, (token,)[: len(stored)])
    lineage = row_lineage(reference, candidate, plan, contract, STAGE, row.worst_failing["coords"])
    assert lineage["raster_row"] == token, (family, lineage["raster_row"], token)
    if family == "molmo2":
        assert lineage["row_at"] == {"crops": 1, "patches": 100}
    *earlier, last = lineage["stages"]
    assert last["stage"] == STAGE and last["failures"] > 0
    assert earlier and all(entry["failures"] == 0 and entry["max_abs"] == 0 for entry in earlier)


def test_the_generic_family_lays_out_no_tokens_so_there_is_no_row_to_follow(runs, tiny, tmp_path):
    _, _, plan = tiny("generic")
    _, reference = runs("generic", "transformers")
    candidate = _planted(reference, tmp_path / "planted", (3,))
    (row,) = [r for r in compare_tapsets(reference, candidate, Contract(), plan) if r.stage == STAGE]
    assert row.failed and plan[STAGE].token_unit is None
    assert row_lineage(reference, candidate, plan, Contract(), STAGE, row.worst_failing["coords"]) is None
