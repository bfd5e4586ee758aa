"""Explanations beyond raw attention and their faithfulness (issue 17), each checked against an independent
computation on the packaged mini ViT (182 k parameters, 64 px): value norms by hand, gradient rollout against plain
rollout, IG completeness and IG on embeddings = IG on pixels, input × gradient against captum, curve endpoints
against plain forwards, the pointing game by hand, the CLI's JSON contract, and bad input."""
import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from models import families
from models.analysis import attribution, faithfulness, relevance, rollout
from models.analysis import explanations as explainable
from models.analysis.methods import METHODS, SHARED
from models.core.inputs import ImageInput
from models.families.vit import explain as vit_explain
from models.families.vit import model as vit
from models.minis.vit_shapes import data


@pytest.fixture(scope="module")
def loaded():
    spec = next(s for s in families.specs("vit") if s.source == "mini" and s.id == "vit_shapes")
    return families.load(spec)


@pytest.fixture(scope="module")
def sample():
    return data.make_sample(np.random.default_rng(7))


@pytest.fixture(scope="module")
def ex(loaded, sample):
    return vit_explain.explainable(loaded, sample.image, sample.label)


def pixels_of(loaded, crop):
    return vit_explain.crop_tensor(loaded, crop)


def test_value_norms_equal_the_hand_computation(loaded, ex):
    model = loaded.model
    with torch.no_grad(), ex.record() as layers:
        ex.logits(ex.embeddings)
    block, record = model.blocks[-1], layers[-1]
    x = record.residual[0]  # (N, D) the last block's input
    heads, head_dim = block.attn.num_heads, block.attn.head_dim
    dim = x.shape[-1]
    with torch.no_grad():
        normed = torch.nn.functional.layer_norm(x, (dim,), block.norm1.weight, block.norm1.bias, block.norm1.eps)
        w_qkv, b_qkv = block.attn.qkv.weight, block.attn.qkv.bias
        q, k, v = (normed @ w_qkv[i * dim:(i + 1) * dim].T + b_qkv[i * dim:(i + 1) * dim] for i in range(3))
        n = x.shape[0]
        expected = torch.zeros(n, n)
        summed = torch.zeros(n, dim)
        for i in range(n):
            for j in range(n):
                vector = torch.zeros(dim)
                for h in range(heads):
                    part = slice(h * head_dim, (h + 1) * head_dim)
                    alpha = torch.softmax(q[i, part] @ k[:, part].T / head_dim ** 0.5, -1)[j]
                    vector += alpha * (v[j, part] @ block.attn.proj.weight[:, part].T)  # α^h_ij f^h(x_j)
                expected[i, j] = vector.norm()
                summed[i] += vector
        found = relevance.value_norm_matrix(record.attention[0], record.values[0])
        torch.testing.assert_close(found, expected, rtol=1e-4, atol=1e-5)
        # Σ_j α_ij f(x_j) + the projection's bias is the attention module's own output
        torch.testing.assert_close(summed + block.attn.proj.bias, block.attn(block.norm1(x[None]))[0],
                                   rtol=1e-4, atol=1e-5)


def test_alti_on_a_hand_example():
    attention = torch.tensor([[[1.0, 0.0], [0.5, 0.5]]])  # (H=1, 2, 2)
    values = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]])  # f(x_0), f(x_1)
    residual = torch.tensor([[1.0, 1.0], [-1.0, 0.0]])
    # token 1: T(x_0) = 0.5·(1, 0) = (0.5, 0); T(x_1) = 0.5·(0, 2) + (-1, 0) = (-1, 1); y = (-0.5, 1), ‖y‖₁ = 1.5
    # c_10 = max(0, 1.5 − ‖(-1, 1)‖₁) = 0 ; c_11 = max(0, 1.5 − ‖(0.5, 0)‖₁) = 1  -> row (0, 1)
    # token 0: T(x_0) = (1, 0) + (1, 1) = (2, 1); T(x_1) = 0 -> y = (2, 1): c_00 = 3, c_01 = max(0, 3 − 3) = 0
    found = relevance.alti_matrix(attention, values, residual)
    torch.testing.assert_close(found, torch.tensor([[1.0, 0.0], [0.0, 1.0]]))


def test_gradient_rollout_with_ones_is_plain_rollout(ex):
    with torch.no_grad(), ex.record() as layers:
        ex.logits(ex.embeddings)
    attentions = [r.attention[0] for r in layers]
    ones = [torch.ones_like(a) for a in attentions]
    weighted = relevance.gradient_rollout(attentions, ones)
    torch.testing.assert_close(weighted / 2 ** len(attentions), rollout.attention_rollout(attentions),
                               rtol=1e-5, atol=1e-6)
    # and real gradients change it (the test above could not pass by ignoring the gradients)
    found = attribution.explain(ex, ("gradient_rollout", "rollout"))
    assert not np.allclose(found.scores["gradient_rollout"] / found.scores["gradient_rollout"].sum(),
                           found.scores["rollout"] / found.scores["rollout"].sum(), atol=1e-3)


def test_integrated_gradients_completeness_and_pixel_equivalence(loaded, ex, sample):
    from captum.attr import IntegratedGradients

    found = attribution.explain(ex, ("integrated_gradients",), ig_steps=200)  # this path bends: 64 steps err by 4 %
    with torch.no_grad():
        difference = float(ex.logits(ex.embeddings)[0, ex.target] - ex.logits(ex.baseline)[0, ex.target])
    assert abs(found.scores["integrated_gradients"].sum() - difference) <= 0.01 * abs(difference)
    assert found.ig_delta <= 0.01 * abs(difference)
    found = attribution.explain(ex, ("integrated_gradients",), ig_steps=64)
    # the patch embedding is linear in each patch's pixels: IG on pixels, summed per patch, is IG on embeddings
    pixels = pixels_of(loaded, sample.image)
    with torch.enable_grad():
        on_pixels = IntegratedGradients(loaded.model).attribute(pixels, baselines=torch.zeros_like(pixels),
                                                               target=ex.target, n_steps=64)
    per_patch = on_pixels[0].sum(0).reshape(8, 8, 8, 8).sum((1, 3)).ravel().detach().numpy()
    np.testing.assert_allclose(found.scores["integrated_gradients"], per_patch, rtol=1e-3, atol=1e-4)


def test_input_x_gradient_matches_captum(ex):
    from captum.attr import InputXGradient

    found = attribution.explain(ex, ("input_x_gradient",))
    with torch.enable_grad():
        expected = InputXGradient(ex.logits).attribute(ex.embeddings.clone().requires_grad_(True), target=ex.target)
    np.testing.assert_allclose(found.scores["input_x_gradient"],
                               expected[0].sum(-1)[list(ex.units)].detach().numpy(), rtol=1e-4, atol=1e-6)


def test_curve_endpoints_are_plain_forwards(loaded, ex, sample):
    found = faithfulness.faithfulness(ex, "mini", "sample", steps=8, seeds=2, ig_steps=8)
    with torch.no_grad():
        untouched = float(loaded.model(pixels_of(loaded, sample.image)).softmax(-1)[0, ex.target])
        blank = float(loaded.model(torch.zeros(1, 3, 64, 64)).softmax(-1)[0, ex.target])
    assert found.probability == pytest.approx(untouched, abs=1e-5)
    for curves in [*found.curves.values(), *found.random]:
        assert curves.deletion[0] == pytest.approx(untouched, abs=1e-5)
        assert curves.insertion[-1] == pytest.approx(untouched, abs=1e-5)
        assert curves.deletion[-1] == pytest.approx(blank, abs=1e-5)
        assert curves.insertion[0] == pytest.approx(blank, abs=1e-5)
    # one step in the middle, by hand: the top-k patches greyed in pixel space
    order = faithfulness.ranking(found.explanations.scores["rollout"])
    k = faithfulness.removal_counts(64, 8)[3]
    greyed = pixels_of(loaded, sample.image).clone()
    for unit in order[:k]:
        r, c = divmod(int(unit), 8)
        greyed[..., r * 8:(r + 1) * 8, c * 8:(c + 1) * 8] = 0
    with torch.no_grad():
        expected = float(loaded.model(greyed).softmax(-1)[0, ex.target])
    assert found.curves["rollout"].deletion[3] == pytest.approx(expected, abs=1e-5)
    assert faithfulness.auc(np.array([1.0, 1.0, 0.0])) == pytest.approx(0.75)


def test_payload_is_the_cli_contract(loaded, sample, tmp_path):
    from app import cli

    path = tmp_path / "shape.png"
    from PIL import Image
    Image.fromarray(sample.image).save(path)
    assert cli.main(["--page", "vit", "--model", "mini ViT shapes", "--image", str(path), "--view", "faithfulness",
                     "--format", "json", "--out", str(tmp_path), "--steps", "10", "--seeds", "5"]) == 0
    written = json.loads(next(tmp_path.glob("*faithfulness*.json")).read_text())
    assert written["target"]["index"] == sample.label
    methods = written["methods"]
    assert "random" in methods and len(methods) - 1 >= 5
    for name, entry in methods.items():
        assert 0.0 <= entry["deletion_auc"] <= 1.0 and 0.0 <= entry["insertion_auc"] <= 1.0
        assert len(entry["deletion"]) == len(entry["insertion"]) == 11
        assert entry["deletion_auc"] == pytest.approx(faithfulness.auc(np.array(entry["deletion"])))
    assert methods["random"]["seeds"] == 5 and "auc" in written and "replacement" in written
    assert cli.main(["--page", "vit", "--model", "mini ViT shapes", "--image", str(path), "--view", "attribution",
                     "--method", "gradient_rollout", "--format", "npz,json", "--out", str(tmp_path)]) == 0
    scores = np.load(next(tmp_path.glob("*gradient-rollout*.npz")))["patch_scores"]
    assert scores.shape == (8, 8)


def test_pointing_game_by_hand(loaded):
    coverage = np.zeros(4)
    coverage[2:] = [0.2, 0.9]
    assert vit_explain.pointing_and_iou(np.array([0.0, 0.1, 0.9, 0.5]), coverage) == (True, 0.5)
    assert vit_explain.pointing_and_iou(np.array([0.9, 0.1, 0.0, 0.5]), coverage) == (False, 0.5)
    mask = np.zeros((64, 64), dtype=bool)
    mask[:8, :4] = True
    assert vit_explain.patch_coverage(mask, (8, 8))[0, 0] == 0.5
    found = vit_explain.localisation(loaded, images=2, methods=("rollout", "gradient_rollout"), ig_steps=4)
    assert found.hits.shape == (3, 2) and set(found.summary()) == {"rollout", "gradient_rollout", "random"}


def test_bad_input_gets_a_message(loaded, sample, ex):
    with pytest.raises(ValueError, match="class 9 does not exist"):
        vit_explain.explainable(loaded, sample.image, 9)
    with pytest.raises(ValueError, match="blank"):
        vit_explain.explainable(loaded, np.full((64, 64, 3), 128, np.uint8), None)
    with pytest.raises(ValueError, match="no classifier"):
        vit_explain.explainable(replace(loaded, label_names=()), sample.image, None)
    with pytest.raises(ValueError, match="only one unit"):  # a one-token text, a one-patch image
        faithfulness.measure(replace(ex, units=ex.units[:1]),
                             attribution.Explanations({"rollout": np.ones(1)}, {}, 0.0, 1.0))
    with pytest.raises(ValueError, match="unknown method"):
        attribution.explain(ex, ("attention_flow",))
    with pytest.raises(ValueError, match="mini ViT shapes"):
        vit_explain.localisation(replace(loaded, spec=replace(loaded.spec, id="other")), images=1)
    with pytest.raises(ValueError, match="not available for the moe family"):
        explainable.adapter(replace(loaded, spec=families.default_spec("moe")))


def test_views_draw_from_a_run(loaded, sample):
    from viz import figures
    from viz.figures.faithfulness import FaithfulnessOptions

    result = vit.run(loaded, ImageInput(data_image(sample), "generated shape"))
    options = FaithfulnessOptions(steps=5, seeds=2, ig_steps=4)
    found = explainable.faithfulness(loaded, result, options)
    table = figures.build("faithfulness", found, options)
    frame = table.table()
    assert list(frame["method"])[-1] == "Random order" and len(frame) == len(SHARED) + 1
    maps = figures.build("explanations", found, options)
    assert maps.image.size[0] > 4 * 64 and set(maps.arrays()) >= set(SHARED)


def data_image(sample):
    from PIL import Image

    return Image.fromarray(sample.image)


def test_the_vit_page_shows_the_faithfulness_tab_on_the_mini():
    from streamlit.testing.v1 import AppTest

    from tests.conftest import ROOT

    at = AppTest.from_file(str(ROOT / "app" / "views" / "vit.py"), default_timeout=180)
    at.query_params.update({"model_vit": "mini ViT shapes (offline, trained here)", "vit_view": "Faithfulness",
                            "vit_faith_steps": "5", "vit_faith_ig_steps": "8", "vit_faith_seed": "3"})
    at.run()
    assert not at.exception, at.exception
    tables = [frame.value for frame in at.dataframe]
    faithfulness_table = next(t for t in tables if "deletion AUC (lower better)" in t.columns)
    # methods by name, not snake_case; the random row's verdict and seconds are "—", not "None" (issue 28)
    assert list(faithfulness_table["method"]) == [*(METHODS[m].label for m in SHARED),
                                                  "Random order"]
    assert faithfulness_table["no better than random"].iloc[-1] == "—"
    assert any("top patch on the shape" in t.columns for t in tables)  # the generated shape's own mask
    assert any("A removed patch becomes" in m.value for m in at.markdown)


def test_a_zero_explanation_scores_as_random(ex):
    """A map with no signal (every score 0, as Grad-CAM gives when its ReLU clips everything) must score exactly as
    the random orders do, not by the accident of tie order (issue 28: 0.029 / 0.866 on the translation page, as good
    as the best method), and is flagged; ties inside a real map are broken by the same random orders."""
    units = len(ex.units)
    scores = {"grad_cam": np.zeros(units, np.float32), "rollout": np.arange(units, dtype=np.float32)[::-1].copy()}
    explanations = attribution.Explanations(scores, {}, 0.0, 1.0)
    curves, random = faithfulness.measure(ex, explanations, steps=8, seeds=4)
    np.testing.assert_allclose(curves["grad_cam"].deletion, np.mean([c.deletion for c in random], 0), atol=1e-6)
    np.testing.assert_allclose(curves["grad_cam"].insertion, np.mean([c.insertion for c in random], 0), atol=1e-6)
    assert curves["grad_cam"].orders == 4 and curves["rollout"].orders == 1  # no ties: one order, the map's own
    table = faithfulness.Faithfulness("mini", "sample", ex.target, ex.target_name, 1.0, "grey", units, 8,
                                      explanations, curves, random, ex.unit_names, 0.0)
    assert table.no_better_than_random("grad_cam")
    deletion_mean, _ = table.random_auc("deletion")
    assert curves["grad_cam"].deletion_auc == pytest.approx(deletion_mean)
    # a partly tied map: the tied tail is taken in each random order's sequence, the ranked head stays in front
    partly = np.zeros(units)
    partly[[5, 9]] = [2.0, 1.0]
    orders = faithfulness.rankings(partly, [np.random.default_rng(s).permutation(units) for s in range(3)])
    assert len(orders) == 3 and all(list(order[:2]) == [5, 9] for order in orders)
    assert len({tuple(order) for order in orders}) == 3


def test_failing_either_test_is_no_better_than_random(ex):
    """Swin's ALTI on the cat (issue 28): deletion 0.408 against random 0.284 (worse than random) with a good
    insertion went unflagged, because only failing both tests was."""
    random = [faithfulness.Curves(np.array([1.0, 0.3, 0.2]), np.array([0.2, 0.5, 1.0])),
              faithfulness.Curves(np.array([1.0, 0.2, 0.2]), np.array([0.2, 0.6, 1.0]))]
    curves = {"bad_deletion": faithfulness.Curves(np.array([1.0, 0.9, 0.2]), np.array([0.2, 0.99, 1.0])),
              "bad_insertion": faithfulness.Curves(np.array([1.0, 0.0, 0.2]), np.array([0.2, 0.2, 1.0])),
              "good": faithfulness.Curves(np.array([1.0, 0.0, 0.2]), np.array([0.2, 0.99, 1.0]))}
    explanations = attribution.Explanations({m: np.zeros(3) for m in curves}, {}, 0.0, 1.0)
    table = faithfulness.Faithfulness("m", "i", 0, "t", 1.0, "r", 3, 2, explanations, curves, random, ("a", "b", "c"),
                                      0.0)
    assert table.no_better_than_random("bad_deletion") and table.no_better_than_random("bad_insertion")
    assert not table.no_better_than_random("good")
