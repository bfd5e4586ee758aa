"""The ViT family end to end on tiny timm ViTs saved to a folder and loaded through the same code as a user's
checkpoint: result contract, prefix tokens (registers), labels, bad model names, attributions."""
import numpy as np
import pytest
import timm
import torch
from PIL import Image

from models import families
from models.core import images, loading
from models.core.inputs import ImageInput
from models.core.specs import ModelSpec
from models.analysis import attribution
from models.analysis.methods import PIXELS
from models.analysis.pixels import patch_pool, rank_correlation
from models.families.vit import explain as vit_explain
from models.families.vit import model as vit


def save_tiny_vit(folder, reg_tokens: int = 0, num_classes: int = 3, seed: int = 0, img_size: int = 32):
    """A random ViT (img_size / 8 patches a side, 8 px each; 4 × 4 by default) saved the way timm publishes models
    (config.json + model.safetensors)."""
    from timm.models import save_for_hf

    torch.manual_seed(seed)
    args = dict(img_size=img_size, patch_size=8, embed_dim=16, depth=2, num_heads=2, num_classes=num_classes,
                reg_tokens=reg_tokens)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, **args)
    config = {"input_size": (3, img_size, img_size), "interpolation": "bilinear", "mean": (0.5, 0.5, 0.5),
              "std": (0.5, 0.5, 0.5), "crop_pct": 1.0, "crop_mode": "center"}
    save_for_hf(model, str(folder), model_config={"label_names": ["red", "green", "blue"][:num_classes]},
                model_args=args, safe_serialization=True, data_config=config)
    return model


def pixel_attribution(loaded, picture, target: int, method: str = "pixel_integrated_gradients",
                      steps: int = 32):
    """``method``'s explanation of class ``target`` on the crop the model sees of ``picture``."""
    crop = images.preprocess(picture, loaded.data_config).crop
    return attribution.explain(vit_explain.explainable(loaded, crop, target), (method,), steps)


@pytest.fixture
def model_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(tmp_path))
    return tmp_path


def local_spec(folder) -> ModelSpec:
    return vit.custom_spec(str(folder))


def run(loaded, name: str = "coffee"):
    return vit.run(loaded, ImageInput(images.load_sample(name), f"sample {name}"))


def test_local_checkpoint_loads_and_runs(model_dirs):
    original = save_tiny_vit(model_dirs / "tiny")
    loaded = families.load(families.custom("vit", str(model_dirs / "tiny")))  # typed: read by timm all the same
    assert loaded.spec.library == "timm"
    assert loaded.label_names == ("red", "green", "blue") and loaded.data_config["input_size"] == (3, 32, 32)
    assert not any(getattr(m, "fused_attn", False) for m in loaded.model.modules())
    for name, tensor in original.state_dict().items():  # weights arrived unchanged
        torch.testing.assert_close(loaded.model.state_dict()[name], tensor)

    picture = images.load_sample("coffee")
    result = families.run(loaded, ImageInput(picture, "sample coffee"))
    assert isinstance(result, vit.ViTResult) and result.input_name == "sample coffee" and result.is_classifier
    maps = result.maps("self")
    assert maps.num_layers == 2 and maps.layer(0).shape == (2, 17, 17)
    np.testing.assert_allclose(maps.layer(1).sum(-1), 1.0, atol=1e-5)
    assert result.tokens[:2] == ["[CLS]", "patch (0, 0)"] and len(result.tokens) == 17
    info = result.image
    assert info.patch_grid == (4, 4) and info.patch_size == (8, 8) and info.image.shape == (32, 32, 3)
    probabilities = [p.probability for p in result.predictions]
    assert len(result.predictions) == 3 and probabilities == sorted(probabilities, reverse=True)
    with torch.no_grad():
        expected = original.eval()(images.preprocess(picture, loaded.data_config).tensor).softmax(-1)[0]
    assert probabilities[0] == pytest.approx(float(expected.max()), abs=1e-5)
    assert result.position_similarity.shape == (4, 4, 4, 4) and result.saliency is None
    np.testing.assert_allclose(np.einsum("ijij->ij", result.position_similarity), 1.0, atol=1e-5)
    with pytest.raises(ValueError):  # frozen and read-only: a cached result is shared by every session
        result.position_similarity[0, 0, 0, 0] = 2.0

    cls_map = vit.cls_attention_grid(maps, info, 1, None)
    np.testing.assert_allclose(cls_map.ravel(), maps.layer(1).mean(0)[0, 1:], atol=1e-6)
    query = vit.patch_token_index(info, 2, 3)
    assert query == 1 + 2 * 4 + 3
    np.testing.assert_allclose(vit.query_attention_grid(maps, info, 0, 1, query)[1, 2], maps.layer(0)[1, query, 7])


def test_registers_are_named_and_kept(model_dirs):
    save_tiny_vit(model_dirs / "reg", reg_tokens=4)
    loaded = vit.load(local_spec(model_dirs / "reg"))
    result = run(loaded, "cat")
    assert result.image.prefix_names == ("[CLS]", "[REG0]", "[REG1]", "[REG2]", "[REG3]")
    assert result.image.num_prefix_tokens == 5 and result.tokens[5] == "patch (0, 0)"
    shares = vit.prefix_attention(result.maps("self"), result.image, 0)
    assert shares.shape == (2, 5) and (shares > 0).all()


def test_bad_model_names_and_folders_say_what_to_do(model_dirs, tmp_path_factory):
    with pytest.raises(ValueError, match="not a known model name"):
        vit.load(vit.custom_spec("vit_that_does_not_exist"))
    with pytest.raises(ValueError, match="Swin|plain Vision Transformer"):
        save_resnet = model_dirs / "resnet"
        from timm.models import save_for_hf

        save_for_hf(timm.create_model("resnet10t", pretrained=False, num_classes=2), str(save_resnet),
                    safe_serialization=True)
        vit.load(local_spec(save_resnet))
    outside = tmp_path_factory.mktemp("elsewhere")
    with pytest.raises(ValueError, match="outside the folders"):
        vit.load(local_spec(outside))


def test_attributions_on_a_tiny_vit(model_dirs):
    save_tiny_vit(model_dirs / "tiny")
    loaded = vit.load(local_spec(model_dirs / "tiny"))
    picture = Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 40, 3), np.uint8))
    prepared = images.preprocess(picture, loaded.data_config)  # the run's input, rebuilt from its crop bit for bit
    assert torch.equal(vit_explain.crop_tensor(loaded, prepared.crop), prepared.tensor)
    for method in PIXELS:
        found = pixel_attribution(loaded, picture, 1, method, steps=8)
        assert found.pixels[method].shape == (32, 32) and found.scores[method].shape == (16,)
        assert np.isfinite(found.pixels[method]).all() and found.scores[method].sum() > 0
    ig = pixel_attribution(loaded, picture, 1, steps=64)
    # completeness: the attributions sum to F(x) − F(black)
    assert ig.deltas["pixel_integrated_gradients"] < 0.05
    with pytest.raises(ValueError, match="classes 0..2"):
        pixel_attribution(loaded, picture, 7)


def test_patch_pool_and_rank_correlation():
    pixels = np.zeros((8, 12))
    pixels[4:8, 8:12] = -2.0  # patch (1, 2) of a 2 × 3 grid of 4 px patches
    pooled = patch_pool(pixels, (2, 3), (4, 4))
    assert pooled[1, 2] == 32.0 and pooled.sum() == 32.0
    a = np.arange(6.0).reshape(2, 3)
    assert rank_correlation(a, a ** 3) == pytest.approx(1.0)
    assert rank_correlation(a, -a) == pytest.approx(-1.0)
    assert np.isnan(rank_correlation(a, np.ones((2, 3))))


def test_imagenet_classifiers_get_timm_class_names():
    in1k = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=1,
                             embed_dim=16, num_heads=2)
    names = loading.timm_label_names(in1k)
    assert len(names) == 1000 and names[281] == "tabby, tabby cat"
    headless = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=1,
                                 embed_dim=16, num_heads=2, num_classes=0)
    assert loading.timm_label_names(headless) == ()


# --- the figures: each one's numbers are the model's ----------------------------------------------------------------

@pytest.fixture
def tiny_run(model_dirs):
    """A tiny classifier with 4 registers (prefix = [CLS] + 4) on a sample: 2 layers × 2 heads, 4 × 4 patches."""
    save_tiny_vit(model_dirs / "tiny", reg_tokens=4)
    loaded = vit.load(local_spec(model_dirs / "tiny"))
    return loaded, run(loaded, "coffee")


def _by_hand_rollout(layers, fusion="mean"):
    """Abnar & Zuidema's rollout written out: Â = (fused A + I) row-normalised, multiplied from the first layer on."""
    total = np.eye(layers[0].shape[-1])
    for attention in layers:
        fused = {"mean": attention.mean(0), "max": attention.max(0), "min": attention.min(0)}[fusion]
        step = fused + np.eye(len(fused))
        total = (step / step.sum(-1, keepdims=True)) @ total
    return total


def test_every_view_the_family_offers_is_the_models_numbers(tiny_run):
    from models.analysis import attention_distance
    from tests.conftest import check_files
    from viz import figures
    from viz.figures import vit as vit_figures

    loaded, result = tiny_run
    maps, prefix = result.maps("self"), 5
    layers = [maps.layer(i).astype(np.float64) for i in range(maps.num_layers)]  # (heads, 21, 21) each

    def build(name, options=None):
        view = figures.get(name)
        options = options or view.options()
        return view.build(view.analysis(loaded, result, options) if view.data == "analysis" else result, options)

    drawn = {}
    for name in families.get("vit").views:
        if name == "saliency":  # the packaged backbone's decoder only
            with pytest.raises(ValueError, match="no saliency decoder"):
                build(name)
            continue
        if name == "localisation":  # the mini ViT shapes only: its generator knows the masks
            with pytest.raises(ValueError, match="mini ViT shapes"):
                build(name)
            continue
        drawn[name] = build(name)
        check_files(drawn[name])
    assert families.get("vit").views[0] == "cls" and set(families.get("vit").views) <= set(figures.VIEWS)

    # [CLS] over the patches, by default the last layer and the head average: row 0, prefix columns dropped
    cls = drawn["cls"]
    assert cls.stem == "tiny_sample-coffee_cls_layer-1_head-mean"
    np.testing.assert_allclose(cls.payload()["values"], layers[1].mean(0)[0, prefix:].reshape(4, 4), atol=1e-6)
    one_head = build("cls", vit_figures.ClsOptions(layer=0, head=1))
    assert one_head.stem.endswith("_cls_layer-0_head-1") and one_head.caption.endswith("layer 0, head 1")
    arrays = one_head.arrays()
    assert set(arrays) == {"cls_attention", "crop"}  # the head named in the file, and the crop under it: nothing more
    np.testing.assert_allclose(arrays["cls_attention"], layers[0][1, 0, prefix:].reshape(4, 4), atol=1e-6)
    np.testing.assert_array_equal(arrays["crop"], result.image.image)
    np.testing.assert_allclose(one_head.table().to_numpy(), arrays["cls_attention"], atol=1e-6)

    np.testing.assert_allclose(drawn["cls_prefix"].arrays()["prefix_share"], layers[1][:, 0, :prefix], atol=1e-6)
    np.testing.assert_allclose(drawn["cls_heads"].arrays()["cls_attention"],
                               layers[1][:, 0, prefix:].reshape(2, 4, 4), atol=1e-6)

    query = build("patch_query", vit_figures.QueryOptions(layer=0, head=1, row=2, col=3))
    token = prefix + 2 * 4 + 3
    assert query.payload()["query_token"] == token and query.stem.endswith("_patch-query_patch-2-3_layer-0_head-1")
    np.testing.assert_allclose(query.arrays()["patch_query"], layers[0][1, token, prefix:].reshape(4, 4), atol=1e-6)
    assert query.payload()["prefix_share"] == pytest.approx(layers[0][:, token, :prefix].sum(-1).mean(), abs=1e-6)
    assert drawn["patch_query"].payload()["patch"] == [2, 2]  # by default the middle patch

    for fusion in ("mean", "max"):
        rolled = build("rollout", vit_figures.RolloutOptions(fusion=fusion))
        expected = _by_hand_rollout(layers, fusion)[0, prefix:].reshape(4, 4)
        np.testing.assert_allclose(rolled.arrays()["rollout"], expected, atol=1e-5)
        assert rolled.payload()["top_patch_share"] == pytest.approx(expected.max() / expected.sum(), abs=1e-5)
    assert build("rollout", vit_figures.RolloutOptions(fusion="max", discard=0.5)).stem.endswith(
        "_rollout_max_discard-0-5")

    distances = drawn["distance"].arrays()["distance_pixels"]
    np.testing.assert_allclose(distances, attention_distance.mean_attention_distance(layers, (4, 4), (8, 8), prefix),
                               atol=1e-4)
    np.testing.assert_allclose(drawn["positions"].arrays()["position_similarity"], result.position_similarity)
    assert drawn["positions"].stem == "tiny_position-embedding-similarity"  # the model's, whatever the image
    assert list(drawn["predictions"].table()["probability"]) == [p.probability for p in result.predictions]
    np.testing.assert_array_equal(drawn["input"].arrays()["crop"], result.image.image)

    # the attribution of the top class by default, explaining exactly the crop the run saw; ρ with the rollout
    top = result.predictions[0]
    occlusion = build("attribution", vit_figures.AttributionOptions(method="occlusion"))
    found = pixel_attribution(loaded, images.load_sample("coffee"), top.token_id, "occlusion")
    expected = found.scores["occlusion"].reshape(4, 4)
    np.testing.assert_allclose(occlusion.arrays()["patch_scores"], expected, atol=1e-5)
    assert occlusion.stem == f"tiny_sample-coffee_occlusion_class-{top.token}"  # occlusion takes no steps
    rolled = drawn["rollout"].arrays()["rollout"]
    assert occlusion.payload()["rank_correlation_with_rollout"] == pytest.approx(
        rank_correlation(rolled, expected), nan_ok=True)
    stem = drawn["attribution"].stem
    assert stem.endswith(f"_pixel-integrated-gradients_class-{top.token}_steps-16")


def test_bad_view_options_are_messages(tiny_run):
    from viz import figures
    from viz.figures import vit as vit_figures

    loaded, result = tiny_run
    bad = [("cls", vit_figures.ClsOptions(layer=7), "layer 7 does not exist"),
           ("cls", vit_figures.ClsOptions(head=5), "head 5 does not exist"),
           ("cls", vit_figures.ClsOptions(colormap="rainbow"), "unknown colormap"),
           ("cls", vit_figures.ClsOptions(opacity=2.0), "opacity"),
           ("cls", vit_figures.ClsOptions(clip=0.0), "percentile"),
           ("patch_query", vit_figures.QueryOptions(row=4, col=0), "outside the 4 × 4 grid"),
           ("rollout", vit_figures.RolloutOptions(fusion="median"), "head fusion"),
           ("rollout", vit_figures.RolloutOptions(discard=1.0), "discard ratio"),
           ("input", vit_figures.InputOptions((0, 9)), "outside"),
           ("saliency", None, "no saliency decoder")]
    for name, options, message in bad:
        with pytest.raises(ValueError, match=message):
            figures.build(name, result, options)
    attribution = figures.get("attribution")
    with pytest.raises(ValueError, match="classes 0..2"):
        attribution.analysis(loaded, result, vit_figures.AttributionOptions(target=7))
    with pytest.raises(ValueError, match="unknown method"):
        attribution.analysis(loaded, result, vit_figures.AttributionOptions(method="lime"))
