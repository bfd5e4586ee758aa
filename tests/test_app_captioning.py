"""AppTest of the captioning page with the three minis' loaders patched to tiny untrained models of the same
architectures: the default view (a generated scene captioned by Show, Attend and Tell, the strip of word maps), every
tab, a layer and head change on a Transformer, a photo, and state that comes back from a link."""
from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from app.sections.captioning import SCENES
from tests import captioning_tiny
from tests.conftest import ROOT

TIMEOUT = 180
PAGE = str(ROOT / "app" / "views" / "captioning.py")


@pytest.fixture(scope="module")
def tiny_folders(tmp_path_factory):
    return captioning_tiny.minis(tmp_path_factory.mktemp("captioning_app"))


@pytest.fixture
def tiny_minis(tiny_folders, monkeypatch):
    from models import families
    from models.families.captioning import model as captioning

    real_load = families.load

    def fake_load(spec, device="cpu", dtype="float32", progress=lambda step, fraction: None):
        if spec.family != "captioning" or spec.source != "mini":
            return real_load(spec, device, dtype, progress)
        loaded = captioning.load(captioning_tiny.mini_spec(spec, tiny_folders[spec.id.split("/")[-1]]), device,
                                 dtype, progress)
        loaded.spec = spec
        return loaded

    monkeypatch.setattr(families, "load", fake_load)
    import streamlit as st

    st.cache_resource.clear()
    yield
    st.cache_resource.clear()


def _healthy(at) -> None:
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]


def test_default_view_is_the_caption_strip_of_a_generated_scene(tiny_minis):
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT)
    at.run()
    _healthy(at)
    assert at.selectbox(key="model_captioning").value.startswith("mini Show, Attend and Tell")
    assert at.radio(key="cap_input").value == "Generated scene" and at.number_input(key="cap_seed").value == SCENES[0]
    assert at.tabs[0].label == "Caption and maps"
    assert any(m.value.startswith("### “") for m in at.markdown)  # the caption, in large type
    assert any("the grammar's reference" in c.value or "the reference, word for word" in c.value for c in at.caption)
    strip = [c.value for c in at.caption if "each word under the attention that produced it" in c.value]
    assert strip and "additive attention" in strip[0]  # the strip, Show, Attend and Tell's α
    assert len(at.get("image")) == 1 + 6  # the strip, after the six sample scenes to click
    assert at.query_params["cap_seed"] in (str(SCENES[0]), [str(SCENES[0])])
    at.button(key="cap_scene_25").click().run()
    _healthy(at)
    assert at.number_input(key="cap_seed").value == 25 and at.query_params["cap_seed"] in ("25", ["25"])


def test_every_tab_draws_and_a_link_brings_the_state_back(tiny_minis):
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT)
    at.query_params["model_captioning"] = "mini encoder–decoder Transformer (offline, trained here)"
    at.query_params["cap_seed"] = "12"
    at.query_params["cap_layer"] = "1"
    at.query_params["cap_strategy"] = "beam search"
    at.run()
    _healthy(at)
    assert at.number_input(key="cap_seed").value == 12 and at.selectbox(key="cap_layer").value == 1
    assert at.radio(key="cap_strategy").value == "beam search"
    assert any("layer 1, heads averaged" in c.value for c in at.caption)
    at.selectbox(key="cap_head").set_value(1).run()
    _healthy(at)
    assert any("layer 1, head 1" in c.value for c in at.caption)
    for tab, images in (("Step through", 7), ("Layers and heads", 7), ("Is it faithful?", 8),
                        ("Image tokens", 7)):
        at.session_state["cap_view"] = tab
        at.run()
        _healthy(at)
        assert len(at.get("image")) >= images, tab
        if tab == "Is it faithful?":  # the word and its probability, read from the typed result
            assert any(m.value.startswith("**Word:**") and ", p = " in m.value for m in at.markdown)
    assert at.dataframe  # the faithfulness table or the frames
    at.session_state["cap_view"] = "Caption and maps"
    at.radio(key="cap_input").set_value("Photo, upload or camera").run()
    _healthy(at)
    assert len(at.get("image")) >= 1 and at.query_params["cap_sample"] in ("cat", ["cat"])


def test_the_shipped_mini_describes_its_scene_and_each_word_points():
    """The shipped Show, Attend and Tell mini (no patching) captions the opening scene word for word, so the page
    scores each noun's and colour word's map against the object's mask, read at the layer and head the pickers
    hold ("last", "mean"): the tiny untrained models above never get that far."""
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT)
    at.run()
    _healthy(at)
    assert any("the reference, word for word" in c.value for c in at.caption)
    assert any("does each noun's and colour word's" in m.value for m in at.markdown)
    assert len(at.dataframe) + len(at.table) >= 1
