"""The captioning page's hub vision–language models, on tiny random models of each architecture saved with their
processors and loaded through the same code a hub id takes (tests/captioning_tiny.py):

- token → pixel region is exact: a bright marker drawn at the centre of a token's region (and near its corners) in
  the user's picture lands, after the processor's own resizing, tiling, cropping, padding, shuffling and merging, in
  that very token's pixels; and the processor's own tile counts, frame sizes and grids are the geometry's;
- the rows kept while generating (and in a beam search's teacher-forced re-run) equal eager attention computed by
  the model itself (``attn_implementation="eager"``, ``output_attentions``);
- sinks: the massive-activation ratio flags what it should.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from models import families
from models.core.inputs import ImageInput
from models.families.captioning import model as captioning
from models.families.captioning import vlm
from tests import captioning_tiny


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """name -> (folder, loaded) for each tiny architecture (built once per module)."""
    import os

    root = tmp_path_factory.mktemp("tiny_vlms")
    previous = os.environ.get("ATTN_EXPLORER_MODEL_DIRS")
    os.environ["ATTN_EXPLORER_MODEL_DIRS"] = str(root)
    built = {}
    try:
        for name, build in {**captioning_tiny.BUILDERS,
                            "llava_pad": lambda folder: captioning_tiny.llava(folder, pad=True)}.items():
            folder = build(root / name)
            built[name] = families.load(families.custom("captioning", str(folder)))
        yield built
    finally:
        if previous is None:
            os.environ.pop("ATTN_EXPLORER_MODEL_DIRS", None)
        else:
            os.environ["ATTN_EXPLORER_MODEL_DIRS"] = previous


def _picture(width: int, height: int, marker: tuple[float, float] | None = None, radius: float = 2.0) -> Image.Image:
    pixels = np.full((height, width, 3), 96, dtype=np.uint8)
    pixels[::7] = 88  # faint texture: no two tokens are exactly alike
    if marker is not None:
        x, y = marker
        pixels[max(0, int(y - radius)):int(np.ceil(y + radius)), max(0, int(x - radius)):int(np.ceil(x + radius))] = 255
    return Image.fromarray(pixels)


def token_brightness(loaded, inputs: dict) -> np.ndarray:
    """Per image token, in prompt order, the mean of the pixels the processor handed the vision encoder for it
    (read from ``pixel_values`` by each architecture's own layout)."""
    config = loaded.model.config
    pixels = inputs["pixel_values"].float()
    kind = vlm.geometry_kind(config)
    if kind == "qwen2_vl":  # (patches, C·T·P·P), each merge × merge group of patches consecutive
        merge = config.vision_config.spatial_merge_size
        return pixels.mean(-1).reshape(-1, merge * merge).mean(-1).numpy()
    if kind == "idefics3":  # (1, frames, 3, M, M); a token is an s × s block of patches
        block = config.vision_config.patch_size * config.scale_factor
        frames = pixels[0]
    else:  # (1, 3, S, S); a token is one patch
        block = config.vision_config.patch_size
        frames = pixels
    values = []
    for frame in frames:
        side_h, side_w = frame.shape[-2] // block, frame.shape[-1] // block
        cells = frame.mean(0)[:side_h * block, :side_w * block].reshape(side_h, block, side_w, block)
        values.append(cells.mean((1, 3)).reshape(-1))
    return torch.cat(values).numpy()


CASES = [("smolvlm", 300, 200, True), ("smolvlm", 180, 400, True), ("smolvlm", 150, 100, False),
         ("llava", 150, 100, True), ("llava", 70, 120, True), ("llava_pad", 150, 100, True),
         ("qwen2_vl", 150, 100, True), ("qwen2_vl", 60, 130, True), ("paligemma", 150, 100, True)]


@pytest.mark.parametrize("name, width, height, tiles", CASES,
                         ids=[f"{n}-{w}x{h}{'' if t else '-no-tiles'}" for n, w, h, t in CASES])
def test_every_image_token_maps_to_the_pixels_the_processor_gave_it(tiny, name, width, height, tiles):
    loaded = tiny[name]
    inputs = vlm.processor_inputs(loaded, _picture(width, height), "", tiles)
    regions = vlm.regions_of(loaded, (width, height), inputs, tiles)
    assert regions.count == int((inputs["input_ids"][0] == loaded.model.config.image_token_id).sum())
    plain = token_brightness(loaded, inputs)  # padding and texture: what the marker is measured against
    rng = np.random.default_rng(0)
    checked = 0
    for token in rng.choice(regions.count, size=min(8, regions.count), replace=False):
        x0, y0, x1, y1 = regions.boxes[token]
        if (x1 - x0) < 6 or (y1 - y0) < 6:  # a sliver at an edge or in padding: no marker fits
            continue
        for fx, fy in ((0.5, 0.5), (0.3, 0.7)):
            marker = (x0 + fx * (x1 - x0), y0 + fy * (y1 - y0))
            radius = max(1.0, 0.12 * min(x1 - x0, y1 - y0))
            brightness = token_brightness(loaded, vlm.processor_inputs(loaded, _picture(width, height, marker,
                                                                                       radius), "", tiles)) - plain
            frame = regions.frame_of[token]
            in_frame = regions.frame_tokens(frame)
            brightest = in_frame[int(np.argmax(brightness[in_frame]))]
            assert brightest == token, (f"{name}: marker at {marker} lit token {brightest} "
                                        f"({regions.boxes[brightest]}), the geometry says token {token} "
                                        f"({regions.boxes[token]})")
            checked += 1
    assert checked >= 6


def test_the_processors_own_counts_are_the_geometrys(tiny):
    smol = tiny["smolvlm"]
    processed = smol.processor.image_processor(images=_picture(150, 100), return_row_col_info=True)
    regions = vlm.regions_of(smol, (150, 100), vlm.processor_inputs(smol, _picture(150, 100), ""))
    tiles = [f for f in regions.frames if f.name.startswith("tile")]
    assert (processed["rows"][0][0], processed["cols"][0][0]) == (max(f.grid and int(f.name[6]) for f in tiles),
                                                                  max(int(f.name[-2]) for f in tiles))
    assert regions.frames[-1].name == "global thumbnail" and len(regions.frames) == len(tiles) + 1
    qwen = tiny["qwen2_vl"]
    inputs = vlm.processor_inputs(qwen, _picture(150, 100), "")
    grid = inputs["image_grid_thw"][0].tolist()
    assert vlm.regions_of(qwen, (150, 100), inputs).frames[0].grid == (grid[1] // 2, grid[2] // 2)
    llava = tiny["llava"]
    inputs = vlm.processor_inputs(llava, _picture(150, 100), "")
    side = inputs["pixel_values"].shape[-1] // llava.model.config.vision_config.patch_size
    assert vlm.regions_of(llava, (150, 100), inputs).frames[0].grid == (side, side)


def test_tiles_partition_the_picture_and_the_thumbnail_covers_it(tiny):
    regions = vlm.regions_of(tiny["smolvlm"], (150, 100), vlm.processor_inputs(tiny["smolvlm"], _picture(150, 100),
                                                                                ""))
    areas = regions.areas()
    thumbnail = regions.frame_tokens(len(regions.frames) - 1)
    tiles = np.setdiff1d(np.arange(regions.count), thumbnail)
    assert np.isclose(areas[tiles].sum(), 150 * 100) and np.isclose(areas[thumbnail].sum(), 150 * 100)
    no_tiles = vlm.regions_of(tiny["smolvlm"], (150, 100), vlm.processor_inputs(tiny["smolvlm"], _picture(150, 100),
                                                                                 "", tiles=False), tiles=False)
    assert [f.name for f in no_tiles.frames] == ["global thumbnail"]


def _eager_rows(loaded, folder_model, inputs: dict, produced: list[int]) -> list[np.ndarray]:
    """The produced tokens' rows of every language-model layer, by the model's own eager attention."""
    eager = type(loaded.model).from_pretrained(folder_model, attn_implementation="eager").eval()
    grown = captioning._extended(inputs, produced, loaded.model.config.model_type)
    with torch.no_grad():
        out = eager(**grown, output_attentions=True, use_cache=False)
    start = inputs["input_ids"].shape[1] - 1
    return [a[0, :, start:start + len(produced)].float().numpy() for a in out.attentions]


@pytest.mark.parametrize("name", ["smolvlm", "llava", "qwen2_vl", "paligemma"])
@pytest.mark.parametrize("strategy", ["greedy", "beam search"])
def test_kept_rows_equal_eager_attention(tiny, name, strategy):
    loaded = tiny[name]
    picture = _picture(150, 100, (40, 30), 6)
    result = captioning.run(loaded, ImageInput(picture, "marker"), captioning.CaptionSettings(
        strategy=strategy, num_beams=2, max_new_tokens=4))
    inputs = vlm.processor_inputs(loaded, picture, "")
    produced = list(result.word_ids)
    expected = _eager_rows(loaded, loaded.spec.id, inputs, produced)
    maps = result.maps("self")
    assert maps.num_layers == len(expected)
    for layer, reference in enumerate(expected):
        np.testing.assert_allclose(maps.layer(layer), reference, atol=2e-5, err_msg=f"{name} layer {layer}")
    rows = captioning.word_attention(result)  # image columns only: a share of each row
    assert rows.shape == (len(result.words), result.regions.count)
    assert np.all(rows.sum(1) <= 1 + 1e-5)


def test_sink_scores_flag_massive_activations():
    hidden = torch.ones(1, 10, 8)
    hidden[0, 3, 5] = 50.0
    scores = vlm.sink_scores(hidden, np.array([1, 2, 3, 4]))
    assert scores.tolist() == [1.0, 1.0, 50.0, 1.0]
    assert np.flatnonzero(scores >= vlm.SINK_RATIO).tolist() == [2]


@pytest.mark.parametrize("name", ["smolvlm", "qwen2_vl"])
def test_greying_a_vlms_regions_gives_curves_that_start_and_end_where_they_must(tiny, name):
    from models.families.captioning import explain

    loaded = tiny[name]
    result = captioning.run(loaded, ImageInput(_picture(150, 100, (40, 30), 6), "marker"),
                            captioning.CaptionSettings(max_new_tokens=3))
    found = explain.word_faithfulness(loaded, result, 1, steps=3, seeds=2)
    assert list(found.curves) == ["raw_attention"] and found.units == len(explain._finest_units(result.regions))
    for curves in [*found.curves.values(), *found.random]:
        assert curves.deletion[0] == pytest.approx(found.probability, abs=1e-5)
        assert curves.insertion[-1] == pytest.approx(found.probability, abs=1e-5)
    assert len({round(float(c.deletion[-1]), 6) for c in [*found.curves.values(), *found.random]}) == 1


def test_a_thumbnail_tokens_attention_is_shared_among_the_units_it_covers():
    from models.families.captioning import explain

    boxes = np.array([[0, 0, 10, 10], [10, 0, 20, 10], [0, 0, 20, 10]], dtype=np.float32)  # two units, a cover
    scores = explain.unit_scores(np.array([0.1, 0.2, 0.4], dtype=np.float32), boxes, np.array([0, 1]))
    np.testing.assert_allclose(scores, [0.3, 0.4])


def test_two_sessions_captioning_at_once_on_one_model_get_their_own_maps(tiny):
    """The rows recorder and the sink hook act for the call that installed them only (a ContextVar each): two
    threads running one cached model on different pictures each get what they get alone."""
    import threading

    loaded = tiny["smolvlm"]
    pictures = [_picture(150, 100, (30, 30), 8), _picture(120, 160, (90, 120), 10)]
    settings = captioning.CaptionSettings(max_new_tokens=4)
    alone = [captioning.run(loaded, ImageInput(p, f"p{i}"), settings) for i, p in enumerate(pictures)]
    together: dict[int, object] = {}
    barrier = threading.Barrier(2)

    def work(index: int) -> None:
        barrier.wait()
        together[index] = captioning.run(loaded, ImageInput(pictures[index], f"p{index}"), settings)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for index, solo in enumerate(alone):
        np.testing.assert_allclose(captioning.word_attention(together[index]), captioning.word_attention(solo),
                                   atol=1e-6)
        np.testing.assert_allclose(together[index].sink_scores, solo.sink_scores, atol=1e-6)
        assert together[index].regions.count == solo.regions.count
