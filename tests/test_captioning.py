"""The captioning family and its minis: the scene grammar and its masks on hand-built scenes, the pointing game on
maps whose answer is known, capture against eager attention for each architecture (on tiny untrained minis of the
same classes, saved and loaded as the app does), the maps' invariants, the faithfulness curves, and the CLI against a
direct run."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from models.core.inputs import ImageInput
from models.core.specs import ModelSpec
from models.families.captioning import explain as caption_explain
from models.families.captioning import model as captioning
from models.minis.captioning import architectures, metrics, scenes, train, vocabulary
from tests import captioning_tiny

# --- the grammar and its masks ------------------------------------------------------------------------------------

def test_the_grammar_describes_a_hand_built_scene_word_by_word():
    scene = scenes.scene_from([("green", "ring", (2, 2)), ("red", "circle", (0, 0)), ("blue", "star", (1, 1))])
    assert scene.caption == ("a red circle at the top left , a blue star in the centre and a green ring at the "
                             "bottom right")
    tagged = [(w.text, w.object, w.role) for w in scene.words if w.object >= 0]
    assert tagged == [("red", 0, "colour"), ("circle", 0, "shape"), ("top", 0, "position"), ("left", 0, "position"),
                      ("blue", 1, "colour"), ("star", 1, "shape"), ("centre", 1, "position"),
                      ("green", 2, "colour"), ("ring", 2, "shape"), ("bottom", 2, "position"),
                      ("right", 2, "position")]
    assert all(w.role == "function" for w in scene.words if w.object < 0)
    assert scenes.parse(scene.caption) == [("red", "circle", ("top", "left")), ("blue", "star", ("centre",)),
                                           ("green", "ring", ("bottom", "right"))]
    one = scenes.scene_from([("yellow", "square", (0, 1))])
    assert one.caption == "a yellow square at the top"


def test_every_noun_knows_its_objects_mask():
    scene = scenes.scene_from([("red", "circle", (0, 0)), ("blue", "ring", (1, 1)), ("green", "square", (2, 0))])
    circle, ring, square = (o.mask for o in scene.objects)
    centre = scenes.CELL / 2
    assert circle[int(centre), int(centre)]  # the circle's centre pixel is on it …
    assert not ring[32, 32] and ring[32, 32 - 6]  # … the ring's is its hole; its band is 0.55–1 × the radius out
    assert abs(circle.sum() - np.pi * 8.5 ** 2) < 0.03 * np.pi * 8.5 ** 2
    assert not (circle & ring).any() and not (ring & square).any()
    ys, xs = np.nonzero(square)
    assert xs.max() < scenes.CELL and ys.min() >= 2 * scenes.CELL - 1  # inside the bottom-left cell
    for t, word in enumerate(scene.words):  # a word's mask is its object's; function words have none
        mask = scene.mask_of(t)
        assert (mask is None) == (word.object < 0)
        if word.text == "ring":
            assert mask is ring


def test_a_symmetry_moves_masks_and_says_the_caption_again():
    scene = scenes.scene_from([("red", "triangle", (0, 0)), ("blue", "cross", (0, 2))])
    flipped = scenes.dihedral(scene, 1)  # left–right
    assert flipped.caption == "a blue cross at the top left and a red triangle at the top right"
    assert np.array_equal(flipped.objects[1].mask, scene.objects[0].mask[:, ::-1])
    assert np.array_equal(flipped.image, scene.image[:, ::-1])


def test_a_caption_outside_the_grammar_is_refused():
    with pytest.raises(ValueError):
        scenes.parse("a red circle")
    with pytest.raises(ValueError, match="not a word"):
        vocabulary.encode("a purple circle")


# --- the pointing game --------------------------------------------------------------------------------------------

def _cell_map(cell: int) -> np.ndarray:
    """(layers 1, heads 1, T, 64) with every row peaked on ``cell``."""
    maps = np.full((1, 1, 40, 64), 0.001, dtype=np.float32)
    maps[..., cell] = 1.0
    return maps


def test_the_pointing_game_on_hand_checked_scenes():
    scene = scenes.scene_from([("red", "square", (0, 0)), ("blue", "circle", (2, 2))])
    # the square (cell (0, 0) of the 3 × 3 grid: pixels ~4–17) covers patch cells 0, 1, 2 of the 8 × 8 grid's rows
    # 0–2; the circle (centre 53, 53) covers cells around (6, 6)
    on_square, on_circle, on_background = 9, 6 * 8 + 6, 4 * 8 + 0
    for cell, square_hit, circle_hit in ((on_square, True, False), (on_circle, False, True),
                                         (on_background, False, False)):
        points = metrics.point(_cell_map(cell), scene)
        by_word = {(p.role, p.own): p for p in points}
        noun_square, noun_circle = by_word[("shape", 0)], by_word[("shape", 1)]
        assert bool(metrics.hit(noun_square.coverage, 0, noun_square.default_cell)) is square_hit
        assert bool(metrics.hit(noun_circle.coverage, 1, noun_circle.default_cell)) is circle_hit
    summary = metrics.summarise(metrics.point(_cell_map(on_square), scene), "shape")
    assert summary["words"] == 2 and summary["default"] == 0.5  # the square's noun hits, the circle's does not
    touched = [(metrics.cell_coverage(o.mask) > 0).sum() for o in scene.objects]
    assert summary["random"] == pytest.approx(np.mean(touched) / 64)  # a random cell's exact chance
    assert summary["right_object"] == 0.5 and summary["right_object_words"] == 2


def test_right_object_needs_the_top_cell_mostly_on_the_words_object():
    coverage = np.zeros((2, 64), dtype=np.float32)
    coverage[0, 5], coverage[1, 5] = 10, 30  # cell 5: a little of object 0, mostly object 1
    assert bool(metrics.hit(coverage, 0, 5)) and not bool(metrics.right_object(coverage, 0, 5))
    assert bool(metrics.right_object(coverage, 1, 5)) and not bool(metrics.right_object(coverage, 0, 6))


# --- tiny minis of each architecture, saved and loaded as the app loads them ------------------------------------------

@pytest.fixture(scope="module")
def tiny_minis(tmp_path_factory):
    root = tmp_path_factory.mktemp("captioning_minis")
    loaded = {}
    for name, folder in captioning_tiny.minis(root).items():
        spec = ModelSpec("captioning", f"tiny {name}", "mini", str(folder), "test", "nothing",
                         library="project" if name == "show-attend-tell" else "transformers")
        loaded[name] = captioning.load(spec)
    return root, loaded


def _scene_input(seed: int = 3) -> ImageInput:
    return ImageInput(Image.fromarray(scenes.page_scene(seed).image), f"scene {seed}")


@pytest.mark.parametrize("strategy", ["greedy", "beam search"])
def test_show_attend_tell_maps_are_its_additive_attention_recomputed_by_hand(tiny_minis, strategy):
    loaded = tiny_minis[1]["show-attend-tell"]
    result = captioning.run(loaded, _scene_input(), captioning.CaptionSettings(strategy=strategy, max_new_tokens=6))
    model = loaded.model
    weights = dict(model.named_parameters())
    with torch.no_grad():
        pixels = captioning._pixel_values(loaded, _scene_input().pil)
        a = model.encode(pixels)[0]  # (L, D)
        mean = a.mean(0)
        h, c = torch.tanh(model.init_h(mean)), torch.tanh(model.init_c(mean))
        inputs = [model.config.bos_token_id, *result.word_ids[:-1]]
        for t, previous in enumerate(inputs):
            scores = torch.tanh(a @ weights["attention.feature_proj.weight"].T + weights["attention.feature_proj.bias"]
                                + h @ weights["attention.hidden_proj.weight"].T) @ weights["attention.score.weight"][0]
            alpha = torch.softmax(scores, 0)
            np.testing.assert_allclose(result.maps("cross").layer(0)[0, t], alpha.numpy(), atol=1e-5)
            beta = torch.sigmoid(model.gate(h))
            z = beta * (alpha @ a)
            h, c = model.lstm(torch.cat([model.embedding(torch.tensor(previous)), z])[None], (h[None], c[None]))
            h, c = h[0], c[0]
    assert np.allclose(captioning.word_attention(result), result.maps("cross").layer(0)[0])


@pytest.mark.parametrize("strategy", ["greedy", "beam search"])
def test_encoder_decoder_capture_equals_eager_attention(tiny_minis, strategy):
    root, loaded = tiny_minis
    result = captioning.run(loaded["encoder-decoder"], _scene_input(), captioning.CaptionSettings(
        strategy=strategy, num_beams=2, max_new_tokens=6))
    eager = train.load_saved("encoder-decoder", root / "encoder-decoder")
    decoder_input = torch.tensor([[vocabulary.BOS_ID, *result.word_ids[:-1]]])
    with torch.no_grad():
        out = eager(pixel_values=captioning._pixel_values(loaded["encoder-decoder"], _scene_input().pil),
                    decoder_input_ids=decoder_input, output_attentions=True, use_cache=False)
    for kind, reference in (("encoder", out.encoder_attentions), ("decoder", out.decoder_attentions),
                            ("cross", out.cross_attentions)):
        for layer, weights in enumerate(reference):
            np.testing.assert_allclose(result.maps(kind).layer(layer), weights[0].numpy(), atol=2e-5,
                                       err_msg=f"{kind} layer {layer}")
    assert result.image_columns == tuple(range(1, 65))  # [CLS] is no image region
    np.testing.assert_allclose(captioning.word_attention(result, 1, None),
                               out.cross_attentions[1][0].mean(0)[:, 1:].numpy(), atol=2e-5)


@pytest.mark.parametrize("strategy", ["greedy", "beam search"])
def test_decoder_only_mini_rows_equal_eager_attention(tiny_minis, strategy):
    root, loaded = tiny_minis
    result = captioning.run(loaded["decoder-only"], _scene_input(), captioning.CaptionSettings(
        strategy=strategy, num_beams=2, max_new_tokens=6))
    eager = train.load_saved("decoder-only", root / "decoder-only")
    prompt = architectures.decoder_only_prompt(1)
    ids = torch.cat([prompt, torch.tensor([result.word_ids[:-1]], dtype=torch.long)], 1)
    with torch.no_grad():
        out = eager(input_ids=ids, pixel_values=captioning._pixel_values(loaded["decoder-only"], _scene_input().pil),
                    output_attentions=True, use_cache=False)
    start = prompt.shape[1] - 1
    for layer, weights in enumerate(out.attentions):
        np.testing.assert_allclose(result.maps("self").layer(layer), weights[0, :, start:].numpy(), atol=2e-5)
    assert result.image_columns == tuple(range(64)) and result.regions.count == 64
    assert result.sink_scores is not None and result.sink_scores.shape == (64,)


def test_every_architecture_maps_each_word_onto_the_64_cells_of_its_picture(tiny_minis):
    for name, loaded in tiny_minis[1].items():
        result = captioning.run(loaded, _scene_input(), captioning.CaptionSettings(max_new_tokens=5))
        maps = captioning.word_attention(result)
        assert maps.shape == (len(result.words), 64) and maps.dtype == np.float32
        assert np.all(maps >= 0) and np.all(maps.sum(1) <= 1 + 1e-5), name
        assert np.allclose(result.regions.areas(), 64.0)  # an 8 × 8 px cell of the 64 px scene each
        assert result.model_picture.shape == (64, 64, 3)
        assert np.array_equal(result.model_picture, scenes.page_scene(3).image)
        assert len(result.generation) == len(result.words)
        rows = result.maps(result.image_kind).query_tokens  # STEP_CONVENTION: the row that chose each word
        assert [rows[step.query] for step in result.generation] == [step.token for step in result.generation], name
        with pytest.raises(ValueError, match="layer"):
            captioning.word_attention(result, 99, None)


def test_the_faithfulness_curves_start_at_the_words_probability_and_meet_at_the_end(tiny_minis):
    loaded = tiny_minis[1]
    for name in ("show-attend-tell", "encoder-decoder", "decoder-only"):
        result = captioning.run(loaded[name], _scene_input(), captioning.CaptionSettings(max_new_tokens=4))
        found = caption_explain.word_faithfulness(loaded[name], result, 1, steps=4, seeds=2)
        assert set(found.curves) >= {"raw_attention", "gradient_rollout", "input_x_gradient"}
        assert ("rollout" in found.curves) == (name != "show-attend-tell")
        p = found.probability
        assert p == pytest.approx(result.generation[1].probability, abs=1e-4)
        for curves in [*found.curves.values(), *found.random]:
            assert curves.deletion[0] == pytest.approx(p, abs=1e-4)  # nothing removed yet
            assert curves.insertion[-1] == pytest.approx(p, abs=1e-4)  # everything revealed
        ends = {round(float(c.deletion[-1]), 5) for c in [*found.curves.values(), *found.random]}
        assert len(ends) == 1  # everything grey is one input whatever the order
        with pytest.raises(ValueError, match="word 9"):
            caption_explain.word_faithfulness(loaded[name], result, 9)


def test_the_image_tokens_regions_are_a_registered_view(tiny_minis):
    """The "Image tokens" tab's picture is the caption_regions view (so the CLI and downloads have it):
    every token's box outlined, one table row per frame."""
    from viz import captioning as draw
    from viz import figures

    result = captioning.run(tiny_minis[1]["encoder-decoder"], _scene_input(),
                            captioning.CaptionSettings(max_new_tokens=3))
    figure = figures.build("caption_regions", result)
    boxes = captioning.display_boxes(result)
    np.testing.assert_array_equal(figure.arrays()["boxes"], boxes)
    expected = draw.outline_regions(result.image.image, boxes, result.regions.frame_of, 448)
    assert np.array_equal(np.asarray(figure.image), np.asarray(expected))
    assert list(figure.table()["frame"]) == [f.name for f in result.regions.frames]
    assert figure.stem.endswith("_caption-regions")


def test_the_cli_writes_what_a_direct_run_computes(tiny_minis, tmp_path, monkeypatch):
    from app import cli

    root, loaded = tiny_minis
    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(root))
    code = cli.main(["--page", "captioning", "--model", str(root / "encoder-decoder"), "--image", "scene:5",
                     "--view", "caption_strip", "--layer", "1", "--format", "json,npz", "--out", str(tmp_path)])
    assert code == 0
    written = sorted(tmp_path.iterdir())
    npz = np.load(next(p for p in written if p.suffix == ".npz"))
    payload = json.loads(next(p for p in written if p.suffix == ".json").read_text())
    direct = captioning.run(loaded["encoder-decoder"], ImageInput(Image.fromarray(scenes.page_scene(5).image),
                                                                  "scene 5"))
    np.testing.assert_allclose(npz["word_attention"], captioning.word_attention(direct, 1, None), atol=1e-6)
    assert payload["caption"] == direct.caption and payload["words"] == list(direct.words)
    assert payload["layer"] == 1 and payload["head"] == "mean"
    assert "scene-5" in written[0].name


def test_the_page_names_the_closest_architecture_or_calls_a_tie():
    def card(rate: float, se: float = 0.01) -> dict:
        return {"pointing": {"nouns": {"default": rate, "default_se": se, "random": 0.1}}}

    best, sentence = captioning.closest_to_truth({"show-attend-tell": card(0.6), "encoder-decoder": card(0.9),
                                       "decoder-only": card(0.7)})
    assert best == "encoder-decoder" and "90%" in sentence and "tie" not in sentence
    best, sentence = captioning.closest_to_truth({"show-attend-tell": card(0.80, 0.02), "encoder-decoder": card(0.79, 0.02)})
    assert best == "show-attend-tell" and "tie" in sentence


# --- the shipped minis ------------------------------------------------------------------------------------------------

def test_a_stopped_runs_checkpoint_is_measured_with_its_own_steps_and_times(tmp_path):
    """--checkpoint-log: the card of weights a stopped run left says their step, times and loss (from the run's own
    lines, the last save of that model), and that the learning rate had not decayed."""
    from dataclasses import replace

    from models.minis.captioning import card

    log = tmp_path / "run.log"
    log.write_text("Loading weights: 100%\n"
                   "encoder-decoder step 1000: loss 0.546, 259 CPU s, 2770 wall s\n"
                   "Writing model shards: 100%|██| 1/1\n"
                   "show-attend-tell step 2000: loss 0.783, 641 CPU s, 7446 wall s\n"
                   "encoder-decoder step 2000: loss 0.325, 532 CPU s, 5966 wall s\n"
                   "encoder-decoder step 2100: loss 0.306, 559 CPU s, 6307 wall s\n")
    config = replace(train.Config(), steps=8000, minutes=28.0)
    run = train.checkpoint_run(log, "encoder-decoder", config)
    assert (run["steps"], run["images_seen"], run["train_cpu_seconds"], run["final_loss"]) == (2000, 64000, 532.0,
                                                                                               0.325)
    assert run["stopped_at"] == {"step": 2000, "learning_rate_left": 0.772}  # cosine of 532 s / 28 min
    with pytest.raises(SystemExit, match="no checkpoint of decoder-only"):
        train.checkpoint_run(log, "decoder-only", config)
    text = card.card_text({**json.loads((train.OUT / "encoder-decoder" / "metrics.json").read_text()), **run})
    assert "**These weights are a checkpoint**" in text and "step 2,000" in text and "77.2% of its peak" in text
    assert "stopped after its step-2,000 checkpoint" in text


@pytest.mark.parametrize("name", architectures.ARCHITECTURES)
def test_each_shipped_mini_is_float16_and_captions_as_its_card_says(name):
    """The three minis ship (a missing one is a failure), in float16, with the card and metrics the page reads; read
    back into float32 they caption held-out scenes of the card's test stream as well as the card says (within three
    standard errors on the first 100 scenes)."""
    from safetensors import safe_open

    folder = train.OUT / name
    recorded = json.loads((folder / "metrics.json").read_text())
    assert (folder / "card.md").read_text().startswith(f"# captioning/{name}")
    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        names = weights.keys()
        assert {str(weights.get_slice(k).get_dtype()) for k in names} == {"F16"}
    assert set(captioning.mini_metrics()) == set(architectures.ARCHITECTURES)

    model = train.load_saved(name, folder)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    rng = np.random.default_rng(train.Config.test_seed)
    test = [scenes.make_scene(rng, train.Config.clutter) for _ in range(100)]
    said = metrics.greedy(model, name, np.stack([s.image for s in test]))
    exact = np.mean([caption == scene.caption for caption, scene in zip(said, test)])
    expected = recorded["exact_match"]
    assert abs(exact - expected) <= 3 * max(np.sqrt(expected * (1 - expected) / len(test)), 0.01), (exact, expected)
