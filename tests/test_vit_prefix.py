"""Prefix tokens of hub ViTs that have more than [CLS]: DeiT's distillation token and DINOv2's registers, on tiny
random timm models of the same architectures saved to a folder and loaded as a user's checkpoint. Their names, the
patch grid they stay out of, and the maps over the patches against attention recomputed by hand from the weights."""
import numpy as np
import pytest
import timm
import torch

from models.core import images
from models.core.inputs import ImageInput
from models.families.vit import model as vit
from viz import figures
from viz.figures.vit import ClsOptions, InputOptions, PrefixQueryOptions

TINY = dict(embed_dim=16, depth=2, num_heads=2)
# the hub models' own architectures (timm entry points), shrunk: 4 × 4 patches
ARCHITECTURES = {
    "deit_small_distilled_patch16_224": (dict(img_size=32, patch_size=8, num_classes=3), ("[CLS]", "[DIST]")),
    "vit_small_patch14_reg4_dinov2": (dict(img_size=28, patch_size=7), ("[CLS]", "[REG0]", "[REG1]", "[REG2]",
                                                                          "[REG3]")),
}


@pytest.fixture(params=list(ARCHITECTURES))
def tiny(request, tmp_path, monkeypatch):
    from timm.models import save_for_hf

    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(tmp_path))
    args, names = ARCHITECTURES[request.param]
    torch.manual_seed(0)
    model = timm.create_model(request.param, pretrained=False, **TINY, **args)
    size = args["img_size"]
    config = {"input_size": (3, size, size), "interpolation": "bilinear", "mean": (0.5,) * 3, "std": (0.5,) * 3,
              "crop_pct": 1.0, "crop_mode": "center"}
    extra = {"label_names": ["a", "b", "c"]} if args.get("num_classes") else {}
    save_for_hf(model, str(tmp_path / "tiny"), model_config=extra, model_args={**TINY, **args},
                safe_serialization=True, data_config=config)
    loaded = vit.load(vit.custom_spec(str(tmp_path / "tiny")))
    picture = images.load_sample("cat")
    return loaded, vit.run(loaded, ImageInput(picture, "sample cat")), names, picture


def _first_layer_by_hand(model, pixels) -> np.ndarray:
    """softmax(QKᵀ/√d) of block 0, recomputed from its weights: ``(heads, N, N)``."""
    with torch.no_grad():
        tokens = model.norm_pre(model._pos_embed(model.patch_embed(pixels)))  # (1, N, D): prefix tokens first
        block = model.blocks[0]
        B, N, D = tokens.shape
        heads = block.attn.num_heads
        qkv = block.attn.qkv(block.norm1(tokens)).reshape(B, N, 3, heads, D // heads).permute(2, 0, 3, 1, 4)
        q, k = qkv[0], qkv[1]  # (B, heads, N, D/heads)
        return ((q @ k.transpose(-2, -1)) * (D // heads) ** -0.5).softmax(-1)[0].numpy()


def test_prefix_tokens_are_named_and_kept_out_of_the_grid(tiny):
    loaded, result, names, picture = tiny
    info = result.image
    assert info.prefix_names == names and info.num_prefix_tokens == len(names)
    assert info.patch_grid == (4, 4)
    assert result.tokens[: len(names)] == list(names) and result.tokens[len(names)] == "patch (0, 0)"
    assert len(result.tokens) == len(names) + 16

    expected = _first_layer_by_hand(loaded.model, images.preprocess(picture, loaded.data_config).tensor)
    maps = result.maps("self")
    np.testing.assert_allclose(maps.layer(0), expected, atol=1e-5)
    prefix = len(names)
    # [CLS] over the patches: row 0, every prefix column ([CLS], [DIST], registers) left out
    cls = vit.cls_attention_grid(maps, info, 0, None)
    np.testing.assert_allclose(cls, expected.mean(0)[0, prefix:].reshape(4, 4), atol=1e-5)
    assert cls.sum() < 1.0 - 1e-4  # the prefix's share is not in the grid
    assert cls.sum() + expected.mean(0)[0, :prefix].sum() == pytest.approx(1.0, abs=1e-5)

    # the second prefix token ([DIST] or [REG0]) as the query, by default and by name
    second = names[1]
    figure = figures.get("prefix_query").build(result, PrefixQueryOptions(layer=0, head=1))
    np.testing.assert_allclose(figure.payload()["values"], expected[1, 1, prefix:].reshape(4, 4), atol=1e-5)
    assert figure.payload()["token"] == second and figure.payload()["query_token"] == 1
    assert figure.payload()["prefix_share"] == pytest.approx(expected[:, 1, :prefix].sum(-1).mean(), abs=1e-5)
    assert second.strip("[]").lower() in figure.stem
    last = figures.get("prefix_query").build(result, PrefixQueryOptions(layer=0, head=None, token=names[-1]))
    np.testing.assert_allclose(last.payload()["values"], expected.mean(0)[prefix - 1, prefix:].reshape(4, 4),
                               atol=1e-5)
    with pytest.raises(ValueError, match="no \\[REG9\\] token"):
        figures.get("prefix_query").build(result, PrefixQueryOptions(token="[REG9]"))

    drawn = figures.get("cls").build(result, ClsOptions(layer=0, head=None))
    assert drawn.payload()["prefix_tokens"] == list(names)
    assert all(name in figures.get("input").build(result, InputOptions()).caption for name in names)
    if second == "[DIST]":
        assert loaded.is_classifier and len(result.predictions) == 3
        assert "distillation" in vit.prefix_role("[DIST]")
    else:
        assert not loaded.is_classifier and "register" in vit.prefix_role("[REG3]")
        assert result.position_similarity.shape == (4, 4, 4, 4)  # no_embed_class: position embeddings are patches'


def test_a_model_with_only_cls_draws_cls_as_the_prefix_query(tmp_path, monkeypatch):
    from tests.test_vit import save_tiny_vit

    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(tmp_path))
    save_tiny_vit(tmp_path / "plain")
    loaded = vit.load(vit.custom_spec(str(tmp_path / "plain")))
    result = vit.run(loaded, ImageInput(images.load_sample("cat"), "sample cat"))
    assert result.image.prefix_names == ("[CLS]",)
    figure = figures.get("prefix_query").build(result, PrefixQueryOptions())
    same = figures.get("cls").build(result, ClsOptions())
    assert figure.payload()["token"] == "[CLS]"
    np.testing.assert_array_equal(figure.payload()["values"], same.payload()["values"])
    with pytest.raises(ValueError, match="no \\[DIST\\] token; its prefix tokens are: \\[CLS\\]"):
        figures.get("prefix_query").build(result, PrefixQueryOptions(token="[DIST]"))
