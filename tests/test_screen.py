"""How charts are fitted to the screen (viz/screen.py), and the figure's parts (viz/figure.py): no token axis drops
labels, a chart fits its column with its decorations, presentation mode is readable from the back of the hall, a
cached chart is never changed, and a figure's parts are laid out and read one way."""
from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ET

import numpy as np
import pandas as pd
import pytest

from viz import heatmap, screen
from viz.figure import Figure, Lazy

import vl_convert  # noqa: E402 (declared in requirements.txt: its absence is a failure, not a skip)

SVG = "{http://www.w3.org/2000/svg}"
TOKENS = ["The", "animal", "didn", "'t", "cross", "the", "street", "because", "it", "was", "too", "tired", "and",
          "it", "fell", "asleep", "on", "the", "warm", "pavement", "."]
# What Streamlit's theme puts under every chart's own config (its CustomTheme: every axis thins its labels)
STREAMLIT_AXIS = {"labelOverlap": True, "labelLimit": 100, "labelFontSize": 12}


def _as_streamlit_draws(spec: dict) -> dict:
    """The spec with Streamlit's theme under it, as the browser gets it (the chart's own config wins)."""
    spec = copy.deepcopy(spec)
    config = spec.setdefault("config", {})
    config["axis"] = {**STREAMLIT_AXIS, **config.get("axis", {})}
    return spec


def _axis_labels(spec: dict, axis: str) -> list[str]:
    root = ET.fromstring(vl_convert.vegalite_to_svg(json.dumps(spec)))
    for group in root.iter(f"{SVG}g"):
        if group.get("aria-roledescription") == "axis" and group.get("aria-label", "").startswith(f"{axis}-axis"):
            for labels in group.iter(f"{SVG}g"):
                if "role-axis-label" in labels.get("class", ""):
                    return ["".join(t.itertext()) for t in labels.iter(f"{SVG}text")
                            if t.get("opacity", "1") != "0"]
    raise AssertionError(f"no {axis} axis in the chart")


def _token_charts():
    weights = np.random.default_rng(0).dirichlet(np.ones(len(TOKENS)), size=len(TOKENS)).astype(np.float32)
    return {
        "token bars": (heatmap.token_bars(weights[-1], TOKENS, "Where '.' looks"), "X"),
        "candidates": (heatmap.probability_bars(TOKENS[:10], list(np.linspace(0.3, 0.01, 10)), "Top 10"), "Y"),
        "heatmap": (heatmap.attention_chart(weights, TOKENS, TOKENS, title="layer 0, head 0"), "X"),
    }


@pytest.mark.parametrize("name", list(_token_charts()))
def test_no_token_axis_drops_labels(name):
    chart, axis = _token_charts()[name]
    count = 10 if name == "candidates" else len(TOKENS)
    for where in (screen.Screen(), screen.Screen(presentation=True)):
        fitted = screen.fitted(chart, where)
        spec = _as_streamlit_draws({**fitted.spec, "width": fitted.width if isinstance(fitted.width, int) else 800})
        shown = _axis_labels(spec, axis)
        assert len(shown) == count, f"{name}: {len(shown)} of {count} labels drawn ({shown})"


def test_streamlits_theme_alone_drops_token_labels():
    """The failure the fitted config prevents: the same bars drawn with Streamlit's theme lose labels."""
    chart, _ = _token_charts()["token bars"]
    assert len(_axis_labels(_as_streamlit_draws(chart.to_dict()), "X")) < len(TOKENS)


def test_a_chart_fits_its_width_with_axes_and_legend():
    chart, _ = _token_charts()["heatmap"]
    plot = chart.to_dict()["width"]
    fitted = screen.fitted(chart)
    assert fitted.spec["autosize"] == {"type": "fit-x", "contains": "padding"}
    assert isinstance(fitted.width, int) and fitted.width > plot + 60  # the labels on the left, the colour bar right
    rendered = ET.fromstring(vl_convert.vegalite_to_svg(json.dumps({**fitted.spec, "width": fitted.width})))
    assert float(rendered.get("width")) <= fitted.width + 1  # everything inside the width it is given
    narrow = ET.fromstring(vl_convert.vegalite_to_svg(json.dumps({**fitted.spec, "width": 300})))
    assert float(narrow.get("width")) <= 301  # a narrow column: the plot shrinks, nothing sticks out
    assert screen.fitted(chart, stretch=True).width == "stretch"


def test_presentation_is_readable_and_leaves_the_cached_chart_alone():
    chart, _ = _token_charts()["token bars"]
    before = chart.to_dict()
    laptop, projector = screen.fitted(chart), screen.fitted(chart, screen.Screen(presentation=True))
    assert chart.to_dict() == before  # a cached figure's chart is shared by every session
    assert projector.spec["usermeta"]["embedOptions"]["renderer"] == "svg"
    assert projector.spec["height"] == pytest.approx(2 * laptop.spec["height"])
    assert projector.width > 1.5 * laptop.width

    def fonts(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key in screen.FONT_KEYS and isinstance(value, (int, float)):
                    yield key, value
                elif key not in ("datasets", "data"):
                    yield from fonts(value)
        elif isinstance(node, list):
            for item in node:
                yield from fonts(item)

    small = [(key, size) for key, size in fonts(projector.spec) if size < screen.MIN_PRESENTATION_FONT]
    assert not small
    svg = vl_convert.vegalite_to_svg(json.dumps(projector.spec))
    sizes = [float(t.get("font-size", "11").rstrip("px")) for t in ET.fromstring(svg).iter(f"{SVG}text")
             if "".join(t.itertext()).strip()]
    assert sizes and min(sizes) >= screen.MIN_PRESENTATION_FONT


def test_explicit_small_fonts_grow_and_tall_charts_stay_in_the_window():
    import altair as alt

    frame = pd.DataFrame({"x": list("abc"), "y": [1, 2, 3]})
    tall = alt.Chart(frame).mark_bar().encode(x="x:N", y="y:Q").properties(width=200, height=600)
    labelled = tall + alt.Chart(frame).mark_text(fontSize=8, dy=-4).encode(x="x:N", y="y:Q", text="y:Q")
    fitted = screen.fitted(labelled, screen.Screen(presentation=True))
    assert fitted.spec["height"] <= screen.MAX_PRESENTATION_HEIGHT
    assert fitted.spec["layer"][1]["mark"]["fontSize"] == screen.MIN_PRESENTATION_FONT


def test_figure_parts_are_read_one_way_and_laid_out_in_rows():
    import altair as alt

    calls = []
    frame = pd.DataFrame({"a": [1.0]})

    def table():
        calls.append(1)
        return frame

    charts = tuple(alt.Chart(frame).mark_point().encode(x="a:Q") for _ in range(5))
    figure = Figure("stem", charts=charts, layout=((1,), (1, 1)), table=table, payload={"layer": 3},
                    arrays=lambda: {"w": np.zeros(2)})
    assert not calls  # made only when asked for
    assert figure.table() is frame and calls == [1]
    assert figure.payload()["layer"] == 3 and figure.arrays()["w"].shape == (2,)
    assert isinstance(figure.table, Lazy) and isinstance(figure.payload, Lazy)
    rows = figure.rows()
    assert [len(parts) for parts, _ in rows] == [1, 2, 2] and rows[1][1] == (1, 1)
    exported = figure.export_chart().to_dict()
    assert len(exported["vconcat"]) == 3 and len(exported["vconcat"][1]["hconcat"]) == 2
    assert [len(p) for p, _ in Figure("s", charts=charts[:2]).rows()] == [2]
    assert [len(p) for p, _ in Figure("s", charts=charts[:2], vertical=True).rows()] == [1, 1]
    with pytest.raises(ValueError):
        Figure("s", width="wide")


def _thinned_axes(node, path=""):
    """Discrete x/y axes whose labels a builder thins (``labelOverlap`` on): where labels go missing."""
    if isinstance(node, dict):
        for channel in ("x", "y"):
            encoding = node.get("encoding", {}).get(channel)
            if isinstance(encoding, dict) and encoding.get("type") in ("nominal", "ordinal"):
                axis = encoding.get("axis")
                if isinstance(axis, dict) and axis.get("labelOverlap") not in (None, False) and axis.get("labels", 1):
                    yield f"{path}/{channel} ({encoding.get('field')})"
        for key, value in node.items():
            if key not in ("datasets", "data"):
                yield from _thinned_axes(value, f"{path}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _thinned_axes(value, f"{path}[{index}]")


def _formula_views() -> list[str]:
    from viz import figures  # noqa: F401  (registers every view)
    from viz.figure import VIEWS

    return sorted(name for name, view in VIEWS.items() if view.data == "options")


@pytest.mark.parametrize("name", _formula_views())
def test_formula_views_keep_their_labels_and_read_from_the_back_of_the_hall(name):
    """Every view drawn from its options alone (the mechanics and positional lessons), as the page shows it by
    default: no token axis thins its labels, and on a projector no text in it is under 18 px."""
    from viz import figures

    figure = figures.build(name, None)
    for part in figure.shown():
        if not hasattr(part, "to_dict"):
            continue
        projector = screen.fitted(part, screen.Screen(presentation=True))
        assert not list(_thinned_axes(projector.spec)), name
        spec = {**projector.spec, "width": projector.width if isinstance(projector.width, int) else 900}
        svg = ET.fromstring(vl_convert.vegalite_to_svg(json.dumps(spec)))
        small = [("".join(t.itertext()), t.get("font-size")) for t in svg.iter(f"{SVG}text")
                 if "".join(t.itertext()).strip() and float(t.get("font-size", "11").rstrip("px"))
                 < screen.MIN_PRESENTATION_FONT]
        assert not small, f"{name}: text under {screen.MIN_PRESENTATION_FONT} px on a projector: {small[:5]}"
