from pathlib import Path

import numpy as np
from make_shapes import make_all
from PIL import Image

COMMITTED = Path(__file__).resolve().parents[2] / "fixtures" / "images"


def test_regenerating_gives_byte_identical_pngs(tmp_path):
    first = make_all(tmp_path / "a")
    second = make_all(tmp_path / "b")
    for name, path in first.items():
        assert path.read_bytes() == second[name].read_bytes(), name
        assert path.read_bytes() == (COMMITTED / name).read_bytes(), f"committed {name} differs from the script"


def test_shapes_have_the_declared_colours_and_places(tmp_path):
    image = np.asarray(Image.open(make_all(tmp_path)["shapes_448.png"]))
    assert image.shape == (448, 448, 3)
    assert tuple(image[0, 0]) == (245, 245, 245)
    assert tuple(image[140, 120]) == (220, 30, 30)  # inside the square [40,60,200,220] (x0,y0,x1,y1)
    assert tuple(image[160, 330]) == (30, 60, 220)  # the circle's centre
    assert tuple(image[380, 230]) == (30, 170, 60)  # inside the triangle
    assert tuple(image[59, 120]) == (245, 245, 245)  # just above the square
    red = np.all(image == (220, 30, 30), axis=-1).sum()
    assert red == 161 * 161


def test_other_fixture_sizes(tmp_path):
    paths = make_all(tmp_path)
    assert Image.open(paths["shapes_336.png"]).size == (336, 336)
    assert Image.open(paths["shapes_448x672.png"]).size == (672, 448)  # PIL reports (width, height)
    board = np.asarray(Image.open(paths["checkerboard_140.png"]))
    assert board.shape == (140, 140, 3)
    assert board[0, 0].sum() == 0 and board[0, 14].sum() == 765 and board[14, 14].sum() == 0
