"""The one way a figure reaches the page (app/display.py): its parts in the rows it declares, each chart fitted to
its column, a key to the token markers it shows, and download buttons labelled with their format and a tooltip."""
from __future__ import annotations

import json

from streamlit.testing.v1 import AppTest


def _page(presentation: bool = False):
    import numpy as np
    import streamlit as st

    from app import display
    from viz import heatmap
    from viz.figure import Figure

    st.session_state["presentation"] = presentation
    tokens = ["The", "cat", "␣", "sat", "↵"]
    bars = heatmap.token_bars(np.linspace(0.4, 0.1, 5), tokens, "Where 'sat' looks")
    candidates = heatmap.probability_bars(["a", "b"], [0.7, 0.3], "Candidates")
    figure = Figure("cat-sat", charts=(bars, candidates), layout=((3, 2),), caption="Where it looked.",
                    table=lambda: __import__("pandas").DataFrame({"token": tokens}), payload={"n": 5})
    display.show(figure, "demo")


def _downloads(at) -> list:
    return [element.proto for element in at.get("download_button")]


def test_a_figure_is_laid_out_keyed_and_offered_with_labels():
    at = AppTest.from_function(_page, default_timeout=60).run()
    assert not at.exception, at.exception
    assert len(at.columns) == 2 and [c.proto.weight for c in at.columns] == [0.6, 0.4]  # the (3, 2) row
    charts = at.get("vega_lite_chart")
    assert len(charts) == 2
    spec = json.loads(charts[0].proto.spec)
    assert spec["autosize"] == {"type": "fit-x", "contains": "padding"}  # fits its column, decorations included
    assert spec["config"]["axisDiscrete"]["labelOverlap"] is False  # every token named
    caption = at.caption[0].value
    assert caption.startswith("Where it looked.") and "␣ is a space" in caption and "↵ is a line break" in caption
    buttons = _downloads(at)
    assert [b.label for b in buttons] == ["PNG", "SVG", "CSV", "JSON"]  # visible labels, not bare icons
    assert all(b.help for b in buttons) and "table" in buttons[2].help


def test_presentation_mode_draws_the_same_figure_for_a_projector():
    at = AppTest.from_function(_page, kwargs={"presentation": True}, default_timeout=60).run()
    assert not at.exception, at.exception
    laptop = json.loads(AppTest.from_function(_page, default_timeout=60).run().get("vega_lite_chart")[0].proto.spec)
    projector = json.loads(at.get("vega_lite_chart")[0].proto.spec)
    assert projector["height"] == 2 * laptop["height"]
    assert projector["config"]["axis"]["labelFontSize"] >= 18
    assert projector["usermeta"]["embedOptions"]["renderer"] == "svg"


def test_a_page_reruns_on_picks_not_on_pan_and_zoom():
    """The corpus embedding can be panned and zoomed (``.interactive()``: a selection bound to the scales) and
    clicked (``pick``). Only the click reruns the page: Streamlit renames Altair's generated name of the zoom's
    selection, so asking for it stopped the corpus page ("Selection parameter 'param_…' is not defined")."""
    import numpy as np

    from app.display import picked_selections
    from models.corpus.analysis import Embedding
    from viz.figures.corpus import embedding_figure

    n = 4
    embedding = Embedding(points=np.zeros((2 * n, 2)), kind=["query"] * n + ["key"] * n, doc_id=[0] * 2 * n,
                          position=list(range(n)) * 2, token=["a"] * 2 * n, context=["a"] * 2 * n, layer=0, head=0,
                          method="pca")
    spec = embedding_figure(embedding, "tiny").chart.to_dict()
    assert any(param.get("bind") == "scales" for param in spec["params"])  # the zoom is there
    assert picked_selections(spec) == ["pick"]
