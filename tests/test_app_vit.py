"""AppTest of the ViT page with the loader patched to tiny timm ViTs (a classifier and a head-less backbone)."""
from __future__ import annotations

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from tests.conftest import ROOT
from tests.test_vit import save_tiny_vit

TIMEOUT = 120


@pytest.fixture
def tiny_vits(tmp_path, monkeypatch):
    """Registry ViTs load tiny local checkpoints instead: classifier (3 classes, 4 registers) / backbone (no head)."""
    from models import families
    from models.families.vit import model as vit

    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(tmp_path))
    save_tiny_vit(tmp_path / "classifier", reg_tokens=4)
    save_tiny_vit(tmp_path / "backbone", num_classes=0, img_size=48)  # 6 × 6 patches, 2 layers
    real_load = families.load

    def fake_load(spec, device="cpu", dtype="float32", progress=lambda step, fraction: None):
        if spec.family != "vit" or spec not in families.specs("vit"):  # typed names and folders load for real
            return real_load(spec, device, dtype, progress)
        folder = tmp_path / ("backbone" if spec.source == "package" else "classifier")
        loaded = vit.load(vit.custom_spec(str(folder)), device, dtype, progress)
        loaded.spec = spec  # shown as the model the user picked
        return loaded

    monkeypatch.setattr(families, "load", fake_load)
    import streamlit as st

    st.cache_resource.clear()
    yield tmp_path
    st.cache_resource.clear()


def _page() -> AppTest:
    return AppTest.from_file(str(ROOT / "app" / "views" / "vit.py"), default_timeout=TIMEOUT)


def _pick_model(at: AppTest, key_part: str) -> AppTest:
    box = at.sidebar.selectbox(key="model_vit")
    box.set_value(next(o for o in box.options if key_part in o))
    return at.run()


def _image_captions(at: AppTest) -> list[str]:
    """Pictures' captions: display.show writes a figure's caption under it (st.caption), others on the image."""
    return [image.caption for element in at.get("image") for image in element.proto.imgs] + \
        [caption.value for caption in at.caption]


def _shown(at: AppTest, start: str) -> str:
    """The caption of the picture whose caption starts with ``start`` (one of them)."""
    return next(c for c in _image_captions(at) if c.startswith(start))


def test_backbone_shows_attention_and_explains_missing_predictions(tiny_vits):
    at = _page().run()
    assert not at.exception, at.exception
    assert any("no ImageNet classifier" in info.value for info in at.info)
    assert len(at.get("image")) >= 6  # crop, CLS overlay, head grid, query views, rollout, similarity grid
    assert len(at.get("vega_lite_chart")) >= 3  # prefix shares, patch norms, attention distance
    assert _shown(at, "[CLS] → patches").startswith("[CLS] → patches, layer 1, average of heads")
    at.slider(key="vit_layer").set_value(0).run()
    assert _shown(at, "[CLS] → patches").startswith("[CLS] → patches, layer 0, average of heads")
    at.selectbox(key="vit_head").set_value(1).run()
    assert _shown(at, "[CLS] → patches").startswith("[CLS] → patches, layer 0, head 1")
    assert _shown(at, "where patch").startswith("where patch (3, 3) attends (outlined in red), layer 0, head 1")
    at.selectbox(key="vit_fusion").set_value("max").run()
    assert "attention rollout (max, discard 0.00)" in _image_captions(at)
    at.slider(key="vit_discard").set_value(0.5).run()
    assert "attention rollout (max, discard 0.50)" in _image_captions(at)
    at.slider(key="vit_row").set_value(5).run()
    assert _shown(at, "where patch").startswith("where patch (5, 3) attends")
    assert "query: patch (5, 3) = token 34" in _image_captions(at)
    assert not at.exception, at.exception
    at = _pick_model(at, "mini ViT shapes")  # a 4 × 4 grid: row 5 no longer exists and must not break the page
    assert not at.exception, at.exception
    assert at.slider(key="vit_row").value < 4


def test_classifier_shows_predictions_attributions_and_registers(tiny_vits, offered):
    at = _pick_model(_page().run(), "mini ViT shapes")
    assert not at.exception, at.exception
    assert any("[REG3]" in m.value for m in at.markdown)  # registers are listed among the tokens
    assert any("This model has registers ([REG0], [REG1], [REG2], [REG3])" in c.value for c in at.caption)
    assert len(at.metric) == 2  # Spearman ρ of rollout with IG and with the second method
    assert {"vit_pixel_integrated_gradients", "vit_occlusion"} <= set(offered)
    first_class = offered["vit_pixel_integrated_gradients"].payload()["class"]
    at.selectbox(key="vit_method").set_value("gradient_shap").run()
    assert "vit_gradient_shap" in offered and any(c.startswith("GradientSHAP") for c in _image_captions(at))
    last = at.selectbox(key="vit_class").options[-1]
    at.selectbox(key="vit_class").set_value(last).run()
    assert not at.exception, at.exception
    chosen = offered["vit_pixel_integrated_gradients"].payload()["class"]
    assert chosen == last.rsplit(" (", 1)[0] != first_class
    assert len(at.metric) == 2


def test_sample_buttons_and_a_typed_model_that_does_not_exist(tiny_vits):
    at = _page().run()
    at.button(key="vit_sample_rocket").click().run()
    assert not at.exception and any("rocket" in c.value for c in at.caption)
    box = at.sidebar.selectbox(key="model_vit")
    box.set_value(box.options[-1]).run()
    at.sidebar.text_input(key="custom_model_vit").set_value("vit_no_such_model_42").run()
    assert not at.exception
    assert any("not a known model name" in e.value for e in at.error)


def test_default_view_teaches_what_dinov2_looks_at_and_names_its_artefacts(offered):
    """The packaged DINOv2 ViT-S/14 on the cat, as a visitor first sees it: [CLS] attention of layer 10 (not the last,
    whose attention sits on border background; the measurement: tests/test_vit_artefacts.py), the patches with
    outlier norms outlined and out of the colour scale, the page saying why; each display switch changes the map."""
    import streamlit as st

    st.cache_resource.clear()
    at = _page().run()
    assert not at.exception, at.exception
    assert [t.label for t in at.tabs][0] == "[CLS] attention"
    assert at.slider(key="vit_layer").value == 10 and at.selectbox(key="vit_head").value == "mean"
    assert any(c.value.startswith("It opens on layer 10 of 0–11, not the last") for c in at.caption)
    cls_caption = _shown(at, "[CLS] → patches")
    assert cls_caption.startswith("[CLS] → patches, layer 10, average of heads; ")
    flagged = len(offered["vit_norms"].payload()["high_norm_patches"])
    assert flagged >= 8 and f"{flagged} high-norm patches outlined, left out of the colour scale" in cls_caption
    assert any(m.value.startswith(f"**High-norm patches.** {flagged} patches") for m in at.markdown)
    assert any("vit_small_patch14_reg4_dinov2" in c.value for c in at.caption)  # the model with registers, named
    default_picture = np.asarray(offered["vit_cls"].image)

    at.toggle(key="vit_high_norm_in_scale").set_value(True).run()
    assert f"{flagged} high-norm patches outlined, in the colour scale" in _shown(at, "[CLS] → patches")
    at.toggle(key="vit_mark_high_norm").set_value(False).run()
    assert f"{flagged} high-norm patches not outlined, in the colour scale" in _shown(at, "[CLS] → patches")
    assert not np.array_equal(np.asarray(offered["vit_cls"].image), default_picture)
    at.slider(key="vit_layer").set_value(11).run()
    assert _shown(at, "[CLS] → patches").startswith("[CLS] → patches, layer 11")
    assert not at.exception, at.exception
    st.cache_resource.clear()
