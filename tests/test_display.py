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
