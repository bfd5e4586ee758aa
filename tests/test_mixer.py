"""The MLP-Mixer family: the token-mixing map against the weights (the Jacobian at 0 by hand and by autograd, and the
Jacobian at the image), its figures, and the shipped mini Mixer end to end."""
import numpy as np
import pytest
import torch
from timm.models.mlp_mixer import MlpMixer

from models import families
from models.core import images
from models.core.inputs import ImageInput
from models.core.specs import ModelSpec
from models.families.mixer import model as mixer
from viz import figures
from viz.figures.mixer import MatrixOptions, MixingOptions

DATA_CONFIG = {"input_size": (3, 32, 32), "interpolation": "bilinear", "mean": (0.5,) * 3, "std": (0.5,) * 3,
               "crop_pct": 1.0, "crop_mode": "center"}


@pytest.fixture(scope="module")
def tiny():
    """A random 2-block Mixer on 4 × 4 patches with non-zero biases (so GELU′(b₁) is not ½ everywhere)."""
    torch.manual_seed(0)
    model = MlpMixer(img_size=32, patch_size=8, num_blocks=2, embed_dim=12, num_classes=3).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.mlp_tokens.fc1.bias.normal_(0, 1.0)
    spec = ModelSpec("mixer", "tiny", "local", "tiny", "test", "nothing", library="timm")
    loaded = mixer.LoadedMixer(spec, model, None, "cpu", "float32", data_config=DATA_CONFIG,
                               label_names=("a", "b", "c"))
    picture = images.load_sample("coffee")
    return loaded, mixer.run(loaded, ImageInput(picture, "sample coffee")), picture


def test_fixed_map_is_the_token_mlps_jacobian_at_zero(tiny):
    loaded, result, _ = tiny
    assert result.fixed_mixing.shape == (2, 16, 16) and result.token_hidden == 6
    for layer, block in enumerate(loaded.model.blocks):
        mlp = block.mlp_tokens.double()
        w1, b1, w2 = mlp.fc1.weight, mlp.fc1.bias, mlp.fc2.weight
        z = b1.detach().clone().requires_grad_(True)  # GELU′ by autograd, not by the module's formula
        slope, = torch.autograd.grad(torch.nn.functional.gelu(z).sum(), z)
        by_hand = (w2 @ torch.diag(slope) @ w1).detach().numpy()
        by_autograd = torch.autograd.functional.jacobian(mlp, torch.zeros(16, dtype=torch.float64)).numpy()
        mlp.float()
        np.testing.assert_allclose(result.fixed_mixing[layer], by_hand, atol=1e-6)
        np.testing.assert_allclose(result.fixed_mixing[layer], by_autograd, atol=1e-6)
        assert not np.allclose(by_hand, 0.5 * (w2 @ w1).detach().numpy(), atol=1e-3)  # the biases matter


def test_input_map_is_the_mean_jacobian_at_the_image(tiny):
    loaded, result, picture = tiny
    model = loaded.model
    x = model.stem(images.preprocess(picture, DATA_CONFIG).tensor).detach().double()  # (1, P, C)
    for layer, block in enumerate(model.blocks):
        block.double()
        u = block.norm1(x)[0].detach()  # (P, C)
        jacobians = [torch.autograd.functional.jacobian(block.mlp_tokens, u[:, c]) for c in range(u.shape[1])]
        expected = torch.stack(jacobians).mean(0).numpy()
        np.testing.assert_allclose(result.input_mixing[layer], expected, atol=1e-5)
        x = block(x).detach()
        block.float()
    with torch.no_grad():  # and the run's predictions are the model's
        probabilities = model(images.preprocess(picture, DATA_CONFIG).tensor).softmax(-1)[0]
    assert result.predictions[0].probability == pytest.approx(float(probabilities.max()), abs=1e-5)
    assert result.attention == {} and result.image.num_prefix_tokens == 0


def test_figures_draw_the_map(tiny):
    from tests.conftest import check_files

    _, result, _ = tiny
    row = figures.get("mixing").build(result, MixingOptions(layer=0, row=1, col=2))
    signed = result.fixed_mixing[0][1 * 4 + 2].reshape(4, 4)
    np.testing.assert_allclose(row.payload()["signed_row"], signed, atol=1e-7)
    np.testing.assert_allclose(row.payload()["abs_share"], np.abs(signed) / np.abs(signed).sum(), atol=1e-6)
    assert "sample-coffee" not in row.stem  # the fixed map belongs to the model, not the image
    at_image = figures.get("mixing").build(result, MixingOptions(layer="last", map="input"))
    np.testing.assert_allclose(at_image.payload()["signed_row"], result.input_mixing[1][2 * 4 + 2].reshape(4, 4))
    difference = np.linalg.norm(result.input_mixing[1] - result.fixed_mixing[1]) / np.linalg.norm(
        result.fixed_mixing[1])
    assert at_image.payload()["input_dependence"] == pytest.approx(difference, rel=1e-5)
    matrix = figures.get("mixing_matrix").build(result, MatrixOptions(layer=1))
    np.testing.assert_array_equal(matrix.arrays()["mixing"], result.fixed_mixing[1])
    for figure in (row, at_image, matrix):
        check_files(figure)
    with pytest.raises(ValueError, match="outside the 4 × 4 grid"):
        figures.get("mixing").build(result, MixingOptions(row=9))
    with pytest.raises(ValueError, match="layer 5 does not exist: this model has layers 0..1"):
        figures.get("mixing_matrix").build(result, MatrixOptions(layer=5))
    with pytest.raises(ValueError, match="unknown map"):
        figures.get("mixing_matrix").build(result, MatrixOptions(map="learned"))


def test_the_shipped_mini_mixer_runs_and_is_fixed_across_images():
    loaded = families.load(families.default_spec("mixer"))
    cat = families.run(loaded, ImageInput(images.load_sample("cat"), "sample cat"))
    rocket = families.run(loaded, ImageInput(images.load_sample("rocket"), "sample rocket"))
    assert cat.image.patch_grid == (8, 8) and cat.fixed_mixing.shape == (6, 64, 64)
    np.testing.assert_array_equal(cat.fixed_mixing, rocket.fixed_mixing)  # the weights' map: no image in it
    assert not np.allclose(cat.input_mixing, rocket.input_mixing)
    assert len(cat.predictions) == 5 and cat.predictions[0].token in loaded.label_names
    with pytest.raises(ValueError, match="not an MLP-Mixer"):
        mixer._check_is_mixer(torch.nn.Linear(2, 2), families.default_spec("mixer"))
