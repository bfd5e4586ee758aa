"""AppTest of the DETR page with the loader patched to a tiny random DETR: generated scene and photo inputs, every
tab, a layer, head and threshold change, and state that comes back from a link."""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image
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


def _page() -> AppTest:
    return AppTest.from_file(str(ROOT / "app" / "views" / "detr.py"), default_timeout=TIMEOUT)


def _captions(at: AppTest) -> str:
    return "\n".join(c.value for c in at.caption)


def test_detr_page_draws_every_tab_and_takes_a_photo(tiny_detr):
    at = _page()
    at.query_params["detr_seed"] = "11"
    at.query_params["detr_threshold"] = "0.0"
    at.run()
    assert not at.exception, at.exception
    assert at.number_input(key="detr_seed").value == 11 and at.slider(key="detr_threshold").value == 0.0
    assert any("True objects" in c.value for c in at.caption)
    assert len(at.get("image")) >= 3  # all queries, one query's heads, all detections
    assert len(at.dataframe) == 1 and len(at.dataframe[0].value) == TINY.num_queries  # threshold 0: every query
    assert f"Decoder layer {TINY.decoder_layers - 1}, average of heads" in _captions(at)
    at.slider(key="detr_layer").set_value(0).run()
    assert "Decoder layer 0, average of heads" in _captions(at) and "decoder layer 0: heads" in _captions(at)
    at.selectbox(key="detr_head").set_value(1).run()
    assert "Decoder layer 0, head 1" in _captions(at)
    last = at.selectbox(key="detr_query").options[-1]
    at.selectbox(key="detr_query").select(int(last.split()[-1])).run()
    assert f"Query {last.split()[-1]} (" in _captions(at)
    at.slider(key="detr_threshold").set_value(1.0).run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert "none above 100%" in _captions(at) and len(at.dataframe[0].value) == 0
    at.radio(key="detr_input").set_value("Photo or your image").run()
    assert not at.exception, at.exception
    assert len(at.get("image")) >= 3
    assert "Sample photo 'cat'" in _captions(at) and "True objects" not in _captions(at)


def test_in_presentation_mode_the_detections_are_text_the_hall_can_read(tiny_detr):
    """The data grid draws on a canvas at 14 px whatever the page's type; a projector gets an HTML table at 18 px."""
    at = _page()
    at.query_params["detr_seed"] = "11"
    at.query_params["detr_threshold"] = "0.0"
    at.session_state["presentation"] = True  # the sidebar's switch (app/main.py draws it; this runs the page alone)
    at.run()
    assert not at.exception, at.exception
    assert len(at.dataframe) == 0 and len(at.table) == 1
    assert len(at.table[0].value) == TINY.num_queries and "no-object probability" in at.table[0].value.columns


def _png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def _noise(mode: str, size=(120, 90)) -> Image.Image:
    pixels = np.random.default_rng(0).integers(0, 256, (size[1], size[0], len(mode)), dtype=np.uint8)
    return Image.fromarray(pixels.squeeze(-1) if mode == "L" else pixels, mode)


GOOD_UPLOADS = {
    "rgb": (_png(_noise("RGB")), "PNG, 120 × 90 pixels"),
    "rgba": (_png(_noise("RGBA")), "PNG, 120 × 90 pixels"),
    "greyscale": (_png(_noise("L")), "PNG, 120 × 90 pixels"),
    "huge": (_png(Image.new("RGB", (4000, 3000), (200, 180, 40))), "downscaled from 4000 × 3000"),
}
BAD_UPLOADS = {
    "text": (b"these are not the pixels you are looking for", "is not an image"),
    "truncated": (_png(_noise("RGB"))[:2000], "truncated or damaged"),
    "bomb": (_png(Image.new("1", (12_000, 10_000))), "megapixel limit"),
    "empty": (b"", "is empty"),
    "tiny": (_png(_noise("RGB", (8, 8))), "at least 16 pixels"),
}


def _upload(at: AppTest, data: bytes) -> AppTest:
    at.radio(key="detr_input").set_value("Photo or your image").run()
    at.radio(key="detr_source").set_value("Upload").run()
    return at.file_uploader(key="detr_upload").set_value(("mine.png", data, "image/png")).run()


@pytest.mark.parametrize("case", GOOD_UPLOADS)
def test_an_uploaded_image_of_any_kind_draws_boxes(tiny_detr, case):
    data, described = GOOD_UPLOADS[case]
    at = _upload(_page().run(), data)
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert described in _captions(at)
    assert len(at.get("image")) >= 3 and "queries found an object" in _captions(at)
    assert len(at.dataframe) == 1


@pytest.mark.parametrize("case", BAD_UPLOADS)
def test_a_bad_upload_is_named_and_the_page_goes_on(tiny_detr, case):
    data, says = BAD_UPLOADS[case]
    at = _upload(_page().run(), data)
    assert not at.exception, at.exception
    assert any(says in e.value for e in at.error), [e.value for e in at.error]
    assert not at.get("image")  # nothing drawn from a file that could not be read
    at.radio(key="detr_input").set_value("Generated shapes").run()
    assert not at.exception and not at.error
    assert "True objects" in _captions(at) and len(at.get("image")) >= 3


def test_default_view_finds_each_object_once(offered):
    """The shipped mini DETR on the page's first scene, as a visitor first sees it: every query above the 50 %
    threshold with its cross-attention (last decoder layer, average of heads), and one query per true object with
    no non-maximum suppression, DETR's lesson (set prediction; the mini's duplicate rate: tests/test_detr.py)."""
    import streamlit as st

    from models.minis.detr_shapes import data, metrics

    st.cache_resource.clear()
    at = _page().run()
    assert not at.exception, at.exception
    assert [t.label for t in at.tabs][0] == "Queries and their attention"
    assert at.slider(key="detr_layer").value == 2 and at.selectbox(key="detr_head").value == "mean"
    assert at.slider(key="detr_threshold").value == 0.5
    scene = data.page_scene(at.number_input(key="detr_seed").value)
    detections = offered["detr_queries"].payload()["detections"]
    assert offered["detr_queries"].payload()["above_threshold"] and len(detections) == len(scene.labels)
    boxes = np.array([[d["x0"], d["y0"], d["x1"], d["y1"]] for d in detections])
    overlap = metrics.box_iou(boxes, scene.boxes)  # (detections, objects)
    assert sorted(overlap.argmax(1).tolist()) == list(range(len(scene.labels)))  # each object found once …
    assert (overlap.max(1) >= 0.5).all()  # … by a box on it
    assert sorted(d["class_id"] for d in detections) == sorted(scene.labels.tolist())
    st.cache_resource.clear()
