"""AppTest of the ViT page with the loader patched to tiny timm ViTs (a classifier and a head-less backbone)."""
from __future__ import annotations

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


def test_backbone_shows_attention_and_explains_missing_predictions(tiny_vits):
    at = _page().run()
    assert not at.exception, at.exception
    assert any("no ImageNet classifier" in info.value for info in at.info)
    assert len(at.get("image")) >= 6  # crop, CLS overlay, head grid, query views, rollout, similarity grid
    assert len(at.get("vega_lite_chart")) >= 2  # prefix shares, attention distance
    at.slider(key="vit_layer").set_value(0).run()
    at.selectbox(key="vit_head").set_value("head 1").run()
    at.selectbox(key="vit_fusion").set_value("max").run()
    at.slider(key="vit_discard").set_value(0.5).run()
    at.slider(key="vit_row").set_value(5).run()
    assert not at.exception, at.exception
    at = _pick_model(at, "mini ViT shapes")  # a 4 × 4 grid: row 5 no longer exists and must not break the page
    assert not at.exception, at.exception
    assert at.slider(key="vit_row").value < 4


def test_classifier_shows_predictions_attributions_and_registers(tiny_vits):
    at = _pick_model(_page().run(), "mini ViT shapes")
    assert not at.exception, at.exception
    assert any("[REG3]" in m.value for m in at.markdown)  # registers are listed among the tokens
    assert len(at.metric) == 2  # Spearman ρ of rollout with IG and with the second method
    at.selectbox(key="vit_method").set_value("gradient_shap").run()
    at.selectbox(key="vit_class").set_value(at.selectbox(key="vit_class").options[-1]).run()
    assert not at.exception, at.exception
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
