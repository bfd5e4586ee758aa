"""AppTest of the DETR page with the loader patched to a tiny random DETR: generated scene and photo inputs, every
tab, a layer, head and threshold change, and state that comes back from a link."""
from __future__ import annotations

import pytest
import torch
from streamlit.testing.v1 import AppTest

from tests.conftest import ROOT
from tests.test_detr import TINY

TIMEOUT = 120


@pytest.fixture
def tiny_detr(tmp_path, monkeypatch):
    from models import families
    from models.families.detr import model as detr
    from models.minis.detr_shapes.train import build_model

    torch.manual_seed(0)
    model = build_model(TINY)
    model.config.image_size = TINY.img_size
    model.eval().save_pretrained(tmp_path / "tiny")
    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(tmp_path))
    real_load = families.load

    def fake_load(spec, device="cpu", dtype="float32", progress=lambda step, fraction: None):
        if spec.family != "detr" or spec not in families.specs("detr"):
            return real_load(spec, device, dtype, progress)
        loaded = detr.load(families.custom("detr", str(tmp_path / "tiny")), device, dtype, progress)
        loaded.spec = spec
        return loaded

    monkeypatch.setattr(families, "load", fake_load)
    import streamlit as st

    st.cache_resource.clear()
    yield
    st.cache_resource.clear()


def test_detr_page_draws_every_tab_and_takes_a_photo(tiny_detr):
    at = AppTest.from_file(str(ROOT / "app" / "views" / "detr.py"), default_timeout=TIMEOUT)
    at.query_params["detr_seed"] = "11"
    at.query_params["detr_threshold"] = "0.0"
    at.run()
    assert not at.exception, at.exception
    assert at.number_input(key="detr_seed").value == 11 and at.slider(key="detr_threshold").value == 0.0
    assert any("True objects" in c.value for c in at.caption)
    assert len(at.get("image")) >= 3  # all queries, one query's heads, all detections
    assert len(at.dataframe) == 1 and len(at.dataframe[0].value) == TINY.num_queries  # threshold 0: every query
    at.slider(key="detr_layer").set_value(0).run()
    at.selectbox(key="detr_head").set_value("head 1").run()
    at.selectbox(key="detr_query").set_value(at.selectbox(key="detr_query").options[-1]).run()
    at.slider(key="detr_threshold").set_value(1.0).run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    at.radio(key="detr_input").set_value("Photo or your image").run()
    assert not at.exception, at.exception
    assert len(at.get("image")) >= 3
