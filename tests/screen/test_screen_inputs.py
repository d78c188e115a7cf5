"""What a screen runs: globbed images, prompt rows (JSON lines and CSV, pairs), stable keys, clear errors; and the
built-in screen set (fixtures/make_screen_set.py): rebuilt byte for byte, its involution facts as its docstring
says."""

from __future__ import annotations

import json

import pytest
from driftscope.errors import InputError, ParameterError
from driftscope.screen.inputs import screen_inputs
from PIL import Image
from screen_support import SCREEN_SET


def test_glob_gives_one_input_per_image_with_the_defaults(tmp_path):
    items = screen_inputs(str(SCREEN_SET / "screen_4*.png"), None, "What is here?", ["red"])
    assert [item.label for item in items] == sorted(p.name for p in SCREEN_SET.glob("screen_4*.png"))
    assert all(item.prompt == "What is here?" and item.expect == ("red",) for item in items)
    again = screen_inputs(str(SCREEN_SET / "screen_4*.png"), None, "What is here?", ["red"])
    assert [i.key for i in items] == [i.key for i in again] and len({i.key for i in items}) == len(items)
    other = screen_inputs(str(SCREEN_SET / "screen_4*.png"), None, "Another prompt?", ["red"])
    assert not {i.key for i in items} & {i.key for i in other}  # the prompt is part of an input's identity


def test_prompt_rows_pairs_and_questions(tmp_path):
    rows = tmp_path / "rows.jsonl"
    (tmp_path / "a.png").write_bytes((SCREEN_SET / "screen_448x448.png").read_bytes())
    (tmp_path / "b.png").write_bytes((SCREEN_SET / "screen_336x336.png").read_bytes())
    rows.write_text(
        json.dumps({"images": ["a.png", "b.png"], "prompt": "Both?", "expect": ["circle"]})
        + "\n\n"
        + json.dumps({"prompt": "Colours?", "expect": ["blue"]})
        + "\n"
    )
    items = screen_inputs(str(tmp_path / "a.png"), rows, "default", [])
    pair = next(i for i in items if len(i.images) == 2)
    assert pair.label == "a.png + b.png" and pair.prompt == "Both?" and pair.expect == ("circle",)
    single = next(i for i in items if len(i.images) == 1)  # the question row asked of the globbed image
    assert single.prompt == "Colours?" and single.expect == ("blue",)
    csv = tmp_path / "rows.csv"
    csv.write_text("images,prompt,expect\na.png;b.png,Both?,circle;red\n")
    (item,) = screen_inputs(None, csv)
    assert [p.name for p in item.images] == ["a.png", "b.png"] and item.expect == ("circle", "red")


def test_bad_inputs_name_the_fix(tmp_path):
    with pytest.raises(InputError, match="matches no file"):
        screen_inputs(str(tmp_path / "*.png"), None)
    with pytest.raises(ParameterError, match="needs inputs"):
        screen_inputs(None, None)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(ParameterError, match="bad.jsonl:1 is not JSON"):
        screen_inputs(None, bad)
    bad.write_text(json.dumps({"images": ["missing.png"]}) + "\n")
    with pytest.raises(InputError, match="missing.png does not exist"):
        screen_inputs(None, bad)


def test_the_screen_set_rebuilds_byte_for_byte_and_says_which_sizes_are_involutions(tmp_path):
    from driftscope.families.qwen2_5_vl.geometry import audit_unreorder
    from make_screen_set import PAIRS, SIZES, make_all, name_of

    written = make_all(tmp_path)
    assert len(written) == len(SIZES) + 1 and make_all(tmp_path) == []  # idempotent: nothing rewritten
    for path in written:
        assert path.read_bytes() == (SCREEN_SET / path.name).read_bytes(), path.name
    rows = [json.loads(line) for line in (SCREEN_SET / "screen.jsonl").read_text().splitlines()]
    assert len(rows) == len(SIZES) + len(PAIRS) and sum(len(r["images"]) == 2 for r in rows) == len(PAIRS)
    involution = {}
    for height, width, variant in SIZES:
        with Image.open(SCREEN_SET / name_of(height, width, variant)) as image:
            assert image.size == (width, height)
        involution[(height, width)] = audit_unreorder([[1, height // 14, width // 14]]).involution
    assert involution[(448, 448)] and involution[(224, 448)] and involution[(448, 56)]
    assert not involution[(336, 336)] and not involution[(224, 224)] and not involution[(448, 336)]
    assert 6 <= sum(involution.values()) <= len(involution) - 10  # both kinds, most of them the kind that shows it
