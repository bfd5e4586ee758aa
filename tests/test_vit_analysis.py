"""Rollout against a hand-computed example, attention distance geometry, and overlay geometry."""
import numpy as np
import pytest
import torch

from models.analysis import attention_distance, rollout
from viz import image_overlay


def test_rollout_two_layers_by_hand():
    a1 = np.array([[[0.5, 0.5], [0.2, 0.8]]], np.float32)  # (heads=1, 2, 2)
    a2 = np.array([[[1.0, 0.0], [0.4, 0.6]]], np.float32)
    # Â1 = ½A1 + ½I = [[.75, .25], [.1, .9]];  Â2 = [[1, 0], [.2, .8]];  R = Â2 · Â1
    expected = np.array([[0.75, 0.25], [0.2 * 0.75 + 0.8 * 0.1, 0.2 * 0.25 + 0.8 * 0.9]])
    result = rollout.attention_rollout([a1, a2])
    np.testing.assert_allclose(result, expected, atol=1e-6)
    np.testing.assert_allclose(result, [[0.75, 0.25], [0.23, 0.77]], atol=1e-6)
    steps = rollout.rollout_steps([a1, a2])
    np.testing.assert_allclose(steps[0], [[0.75, 0.25], [0.1, 0.9]], atol=1e-6)


def test_rollout_head_fusion_by_hand():
    heads = np.array([[[0.5, 0.5], [0.2, 0.8]], [[0.9, 0.1], [0.6, 0.4]]], np.float32)
    # max: [[.9, .5], [.6, .8]] + I = [[1.9, .5], [.6, 1.8]] -> rows / 2.4
    np.testing.assert_allclose(rollout.attention_rollout([heads], "max"), [[1.9 / 2.4, 0.5 / 2.4], [0.25, 0.75]],
                               atol=1e-6)
    # min: [[.5, .1], [.2, .4]] + I = [[1.5, .1], [.2, 1.4]] -> rows / 1.6
    np.testing.assert_allclose(rollout.attention_rollout([heads], "min"), [[1.5 / 1.6, 0.1 / 1.6], [0.125, 0.875]],
                               atol=1e-6)
    # mean: [[.7, .3], [.4, .6]] -> ½A + ½I
    np.testing.assert_allclose(rollout.attention_rollout([heads], "mean"), [[0.85, 0.15], [0.2, 0.8]], atol=1e-6)
    with pytest.raises(ValueError, match="head fusion"):
        rollout.attention_rollout([heads], "median")


def test_discard_ratio_by_hand():
    a = np.array([[[0.5, 0.5], [0.2, 0.8]]], np.float32)
    # the lowest quarter (one entry, 0.2 at (1, 0)) is discarded: [[.5, .5], [0, .8]] + I -> [[.75, .25], [0, 1]]
    np.testing.assert_allclose(rollout.attention_rollout([a], discard_ratio=0.25), [[0.75, 0.25], [0.0, 1.0]],
                               atol=1e-6)
    cls_lowest = np.array([[[0.1, 0.9], [0.5, 0.5]]], np.float32)  # [CLS]→[CLS] is lowest but never discarded
    np.testing.assert_allclose(rollout.attention_rollout([cls_lowest], discard_ratio=0.25),
                               rollout.attention_rollout([cls_lowest]), atol=1e-6)
    with pytest.raises(ValueError, match="discard ratio"):
        rollout.attention_rollout([a], discard_ratio=1.0)


def test_rollout_rows_sum_to_one_and_torch_in_torch_out():
    rng = np.random.default_rng(0)
    layers = [rng.dirichlet(np.ones(5), size=(3, 5)).astype(np.float32) for _ in range(4)]  # (heads, N, N)
    for fusion in rollout.HEAD_FUSIONS:
        result = rollout.attention_rollout(layers, fusion, discard_ratio=0.5)
        np.testing.assert_allclose(result.sum(-1), 1.0, atol=1e-5)
    as_torch = rollout.attention_rollout([torch.from_numpy(x) for x in layers])
    assert isinstance(as_torch, torch.Tensor)
    np.testing.assert_allclose(as_torch.numpy(), rollout.attention_rollout(layers), atol=1e-6)
    cls_map = rollout.cls_rollout(layers, num_prefix_tokens=1, grid=(2, 2))
    assert cls_map.shape == (2, 2)
    np.testing.assert_allclose(cls_map.ravel(), rollout.attention_rollout(layers)[0, 1:], atol=1e-6)


def test_attention_distance_geometry():
    grid, patch = (3, 3), (16, 16)
    tokens = 1 + 9
    local = np.zeros((1, tokens, tokens), np.float32)
    local[0, np.arange(tokens), np.arange(tokens)] = 1.0  # every token attends to itself: distance 0
    far = np.zeros((1, tokens, tokens), np.float32)
    far[0, :, 1] = 1.0  # every token attends to the top-left patch (0, 0)
    far[0, 0, 0] = 1.0; far[0, 0, 1] = 0.0  # noqa: E702  ([CLS] row is ignored anyway)
    distances = attention_distance.mean_attention_distance([local, far], grid, patch, num_prefix_tokens=1)
    assert distances.shape == (2, 1)
    assert distances[0, 0] == 0.0
    centres = [(r, c) for r in range(3) for c in range(3)]
    expected = np.mean([16 * np.hypot(r, c) for r, c in centres])
    assert distances[1, 0] == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("r, c", [(0, 0), (2, 5), (6, 3)])
def test_one_hot_patch_lights_the_right_pixels(r, c):
    grid, patch = (7, 6), 8  # a non-square grid catches a row/column swap
    image = np.zeros((grid[0] * patch, grid[1] * patch, 3), np.uint8)
    one_hot = np.zeros(grid)
    one_hot[r, c] = 1.0
    nearest = np.asarray(image_overlay.attention_overlay(image, one_hot, opacity=1.0, colormap="gray",
                                                         mode="nearest"))[..., 0]
    lit = np.argwhere(nearest > 127)
    assert lit[:, 0].min() == r * patch and lit[:, 0].max() == (r + 1) * patch - 1
    assert lit[:, 1].min() == c * patch and lit[:, 1].max() == (c + 1) * patch - 1
    assert len(lit) == patch * patch
    smooth = np.asarray(image_overlay.attention_overlay(image, one_hot, opacity=1.0, colormap="gray",
                                                        mode="bilinear"))[..., 0].astype(float)
    peak = np.unravel_index(smooth.argmax(), smooth.shape)
    assert r * patch <= peak[0] < (r + 1) * patch and c * patch <= peak[1] < (c + 1) * patch
    if 0 < r < grid[0] - 1 and 0 < c < grid[1] - 1:  # away from the border the blob is centred on the patch
        ys, xs = np.mgrid[: smooth.shape[0], : smooth.shape[1]]
        centre = ((ys * smooth).sum() / smooth.sum(), (xs * smooth).sum() / smooth.sum())
        assert centre == pytest.approx(((r + 0.5) * patch - 0.5, (c + 0.5) * patch - 0.5), abs=0.3)


def test_overlay_opacity_and_grid_drawing():
    image = np.full((32, 32, 3), 100, np.uint8)
    untouched = image_overlay.attention_overlay(image, np.random.default_rng(0).random((4, 4)), opacity=0.0)
    assert np.array_equal(np.asarray(untouched), image)
    with pytest.raises(ValueError, match="opacity"):
        image_overlay.attention_overlay(image, np.ones((4, 4)), opacity=1.5)
    drawn = np.asarray(image_overlay.patch_grid(image, (4, 4), highlight=(1, 2)))
    assert (drawn[8, :, 0] == 255).all() and (drawn[:, 8, 0] == 255).all()  # grid lines at patch borders
    assert tuple(drawn[8 + 4, 16]) == (255, 0, 0)  # left edge of the outlined patch (1, 2)
    sheet = image_overlay.tile([image_overlay.patch_grid(image, (4, 4))] * 5, columns=3, gap=2)
    assert sheet.size == (3 * 32 + 4, 2 * 32 + 2)
    sim = np.random.default_rng(1).uniform(-1, 1, (3, 4, 3, 4))
    assert image_overlay.similarity_grid(sim, tile_pixels=12, gap=1).size == (4 * 12 + 3, 3 * 9 + 2)


def test_percentile_clip_keeps_an_outlier_from_hiding_the_map():
    values = np.linspace(0.0, 1.0, 100).reshape(10, 10)
    values[0, 0] = 1000.0  # one artifact patch
    plain = image_overlay.normalise(values)
    clipped = image_overlay.normalise(values, clip_percentile=98.0)
    assert plain[9, 9] < 0.01  # without clipping the rest of the map is black
    assert clipped[0, 0] == 1.0 and clipped[9, 8] == pytest.approx(1.0, abs=1e-3) and clipped[5, 0] > 0.4
