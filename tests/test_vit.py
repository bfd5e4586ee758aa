"""The ViT family end to end on tiny timm ViTs saved to a folder and loaded through the same code as a user's
checkpoint: result contract, prefix tokens (registers), labels, bad model names, attributions."""
import numpy as np
import pytest
import timm
import torch
from PIL import Image

from models import images, vit, vit_attribution
from models.registry import ModelSpec


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


@pytest.fixture
def model_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(tmp_path))
    return tmp_path


def local_spec(folder) -> ModelSpec:
    return vit.custom_spec(str(folder))


def test_local_checkpoint_loads_and_runs(model_dirs):
    original = save_tiny_vit(model_dirs / "tiny")
    loaded = vit.load(local_spec(model_dirs / "tiny"))
    assert loaded.label_names == ("red", "green", "blue") and loaded.data_config["input_size"] == (3, 32, 32)
    assert not any(getattr(m, "fused_attn", False) for m in loaded.model.modules())
    for name, tensor in original.state_dict().items():  # weights arrived unchanged
        torch.testing.assert_close(loaded.model.state_dict()[name], tensor)

    picture = images.load_sample("coffee")
    result = vit.run(loaded, picture)
    maps = result.maps("self")
    assert maps.num_layers == 2 and maps.layer(0).shape == (2, 17, 17)
    np.testing.assert_allclose(maps.layer(1).sum(-1), 1.0, atol=1e-5)
    assert result.tokens[:2] == ["[CLS]", "patch (0, 0)"] and len(result.tokens) == 17
    info = result.image
    assert info.patch_grid == (4, 4) and info.patch_size == (8, 8) and info.image.shape == (32, 32, 3)
    extras = result.extras["vit"]
    probabilities = [p.probability for p in extras.predictions]
    assert len(extras.predictions) == 3 and probabilities == sorted(probabilities, reverse=True)
    with torch.no_grad():
        expected = original.eval()(images.preprocess(picture, loaded.data_config).tensor).softmax(-1)[0]
    assert probabilities[0] == pytest.approx(float(expected.max()), abs=1e-5)
    assert extras.position_similarity.shape == (4, 4, 4, 4)
    np.testing.assert_allclose(np.einsum("ijij->ij", extras.position_similarity), 1.0, atol=1e-5)

    cls_map = vit.cls_attention_grid(maps, info, 1, None)
    np.testing.assert_allclose(cls_map.ravel(), maps.layer(1).mean(0)[0, 1:], atol=1e-6)
    query = vit.patch_token_index(info, 2, 3)
    assert query == 1 + 2 * 4 + 3
    np.testing.assert_allclose(vit.query_attention_grid(maps, info, 0, 1, query)[1, 2], maps.layer(0)[1, query, 7])


def test_registers_are_named_and_kept(model_dirs):
    save_tiny_vit(model_dirs / "reg", reg_tokens=4)
    loaded = vit.load(local_spec(model_dirs / "reg"))
    result = vit.run(loaded, images.load_sample("cat"))
    assert result.image.prefix_names == ("[CLS]", "[REG0]", "[REG1]", "[REG2]", "[REG3]")
    assert result.image.num_prefix_tokens == 5 and result.tokens[5] == "patch (0, 0)"
    shares = vit.prefix_attention(result.maps("self"), result.image, 0)
    assert shares.shape == (2, 5) and (shares > 0).all()


def test_bad_model_names_and_folders_say_what_to_do(model_dirs, tmp_path_factory):
    with pytest.raises(ValueError, match="not a timm model"):
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
    for method in vit_attribution.METHODS:
        found = vit_attribution.attribute(loaded, picture, target=1, method=method, steps=8)
        assert found.pixels.shape == (32, 32) and found.patch_scores.shape == (4, 4)
        assert np.isfinite(found.pixels).all() and found.patch_scores.sum() > 0
    ig = vit_attribution.attribute(loaded, picture, target=1, method="integrated_gradients", steps=64)
    assert ig.convergence_delta < 0.05  # completeness: attributions sum to F(x) − F(black)
    with pytest.raises(ValueError, match="classes 0..2"):
        vit_attribution.attribute(loaded, picture, target=7)


def test_patch_pool_and_rank_correlation():
    pixels = np.zeros((8, 12))
    pixels[4:8, 8:12] = -2.0  # patch (1, 2) of a 2 × 3 grid of 4 px patches
    pooled = vit_attribution.patch_pool(pixels, (2, 3), (4, 4))
    assert pooled[1, 2] == 32.0 and pooled.sum() == 32.0
    a = np.arange(6.0).reshape(2, 3)
    assert vit_attribution.rank_correlation(a, a ** 3) == pytest.approx(1.0)
    assert vit_attribution.rank_correlation(a, -a) == pytest.approx(-1.0)
    assert np.isnan(vit_attribution.rank_correlation(a, np.ones((2, 3))))


def test_imagenet_classifiers_get_timm_class_names():
    in1k = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=1,
                             embed_dim=16, num_heads=2)
    names = vit.label_names(in1k)
    assert len(names) == 1000 and names[281] == "tabby, tabby cat"
    headless = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=1,
                                 embed_dim=16, num_heads=2, num_classes=0)
    assert vit.label_names(headless) == ()
