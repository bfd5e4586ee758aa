"""Token strings on chart axes are data, never Vega code: every chart that puts user text on a nominal axis renders
(vl-convert, the same Vega-Lite → Vega → SVG path as the browser) with tokens that are Vega expression keywords or
markup, and keeps the tokens in their input order.

Vega-Lite turns ``sort=[...strings]`` into a generated expression, and the token "if" then stops the chart with
``Unrecognized signal name: "if"``; the charts sort on a numeric position field instead.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET

import altair as alt
import numpy as np
import pandas as pd
import pytest

import vl_convert  # noqa: E402  (declared in requirements.txt: the exports need it)

from viz import alignment, heatmap, mechanics_charts, moe_charts, positional_charts  # noqa: E402

TOKENS = ["if", "datum", "else", "this", "<b>x</b>", "the", "the"]
LABELS = heatmap.token_labels(TOKENS)  # the axis strings a chart shows: [..., "the", "the (2)"]
LAYERS = ["if", "datum", "else"]  # per-layer labels are strings too
SVG = "{http://www.w3.org/2000/svg}"


def axis_labels(svg: str, axis: str) -> list[str]:
    """Label texts of the ``axis`` ("X" or "Y") in drawing order, i.e. the order of the scale's domain; for a
    heatmap with linked token hover, its token strip's marks in their places along the axis (they replace the
    labels, ``viz.heatmap.token_strips``)."""
    root = ET.fromstring(svg)
    for group in root.iter(f"{SVG}g"):
        if group.get("aria-roledescription") == "axis" and group.get("aria-label", "").startswith(f"{axis}-axis"):
            for labels in group.iter(f"{SVG}g"):
                if "role-axis-label" in labels.get("class", ""):
                    return ["".join(text.itertext()) for text in labels.iter(f"{SVG}text")]
    strip = token_strip(root, axis)
    if strip:
        return strip
    raise AssertionError(f"no {axis} axis with labels in the SVG")


def token_strip(root: ET.Element, axis: str) -> list[str]:
    """A linked heatmap's tokens along ``axis`` (keys on X, queries on Y), ordered by where they are drawn."""
    part = {"X": "hover_keys_", "Y": "hover_queries_"}[axis]
    for group in root.iter(f"{SVG}g"):
        if part in group.get("class", ""):
            placed = []
            for text in group.iter(f"{SVG}text"):
                x, y = (float(v) for v in text.get("transform").split(")")[0].split("(")[1].split(","))
                placed.append((x if axis == "X" else y, "".join(text.itertext())))
            return [label for _, label in sorted(placed)]
    return []


def render(chart: alt.TopLevelMixin) -> str:
    """The chart as SVG; raises (vl-convert's ValueError) where the browser would fail to draw it."""
    return vl_convert.vegalite_to_svg(chart.to_json())


def user_text_in_sort_lists(spec, user_text: set[str]) -> list:
    """Sort lists anywhere in the spec that hold user text (the form that becomes an expression). A list of the
    page's own fixed names (settings, experts) is allowed."""
    found = []
    if isinstance(spec, dict):
        if isinstance(spec.get("sort"), list) and user_text & set(map(str, spec["sort"])):
            found.append(spec)
        spec = list(spec.values())
    if isinstance(spec, list):
        for value in spec:
            found += user_text_in_sort_lists(value, user_text)
    return found


def check(chart, expected: dict[str, list[str]]) -> None:
    assert user_text_in_sort_lists(chart.to_dict(), {label for labels in expected.values() for label in labels}) == []
    svg = render(chart)
    for axis, labels in expected.items():
        assert axis_labels(svg, axis) == labels


def test_a_string_sort_list_with_if_breaks_vega_lite():
    """The bug itself, so the test below cannot pass for the wrong reason: if this starts passing, Vega-Lite fixed
    it upstream and string sort lists would be safe again."""
    frame = pd.DataFrame({"t": ["if", "x"], "v": [1, 2]})
    with pytest.raises(ValueError, match="Unrecognized signal name"):
        render(alt.Chart(frame).mark_bar().encode(x=alt.X("t:N", sort=["if", "x"]), y="v:Q"))


def test_axis_labels_read_from_svg_follow_the_domain():
    frame = pd.DataFrame({"t": ["b", "c", "a"], "v": [1, 2, 3]})
    svg = render(alt.Chart(frame).mark_bar().encode(x=alt.X("t:N", sort="descending"), y="v:Q"))
    assert axis_labels(svg, "X") == ["c", "b", "a"]


def test_attention_heatmap():
    weights = np.random.default_rng(0).dirichlet(np.ones(len(TOKENS)), size=len(TOKENS)).astype(np.float32)
    chart = heatmap.attention_chart(weights, TOKENS, TOKENS, allowed=np.tril(np.ones_like(weights, dtype=bool)))
    check(chart, {"X": LABELS, "Y": LABELS})


def test_translation_alignment_with_gold_and_argmax_layers():
    source, output = TOKENS, ["if", "else", "la", "la", "<i>y</i>"]
    weights = np.random.default_rng(1).dirichlet(np.ones(len(source)), size=len(output))
    gold = {(0, 0), (2, 1), (5, 2), (6, 3)}
    argmax = {(int(np.argmax(row)), t) for t, row in enumerate(weights)}
    chart = alignment.alignment_chart(weights, output, source, "alignment", gold=gold, argmax=argmax)
    check(chart, {"X": LABELS, "Y": heatmap.token_labels(output)})


def test_mechanics_matrix_and_mask():
    values = np.random.default_rng(2).standard_normal((len(LABELS), len(LABELS)))
    allowed = np.tril(np.ones((len(LABELS), len(LABELS)), dtype=bool))
    check(mechanics_charts.matrix_chart(values, LABELS, LABELS, masked=~allowed), {"X": LABELS, "Y": LABELS})
    check(mechanics_charts.matrix_chart(values[:, :3], LABELS, LAYERS, probabilities=True), {"X": LAYERS, "Y": LABELS})
    check(mechanics_charts.mask_chart(allowed, labels=LABELS), {"X": LABELS, "Y": LABELS})


@pytest.mark.parametrize("selected", [None, 5])
def test_moe_layer_strip(selected):
    top1 = np.random.default_rng(3).integers(0, 4, size=(len(LAYERS), len(TOKENS)))
    chart = moe_charts.layer_strip(TOKENS, top1, LAYERS, num_experts=4, selected=selected)
    check(chart, {"X": LABELS, "Y": LAYERS})


def test_moe_layer_strip_window_keeps_the_selected_column():
    """A window of a longer input (offset 10): the marker's position is the whole input's."""
    top1 = np.random.default_rng(4).integers(0, 4, size=(len(LAYERS), len(TOKENS)))
    chart = moe_charts.layer_strip(TOKENS, top1, LAYERS, num_experts=4, selected=13, offset=10)
    check(chart, {"X": LABELS, "Y": LAYERS})


def test_moe_layer_matrices():
    nmi = np.random.default_rng(5).uniform(size=(len(LAYERS), len(LAYERS)))
    check(moe_charts.consistency_chart(nmi, LAYERS), {"X": LAYERS, "Y": LAYERS})
    load = np.random.default_rng(6).dirichlet(np.ones(4), size=len(LAYERS))
    experts = [f"E{i}" for i in range(4)]
    check(moe_charts.load_difference(load, load[::-1], LAYERS, "a", "b"), {"X": experts, "Y": LAYERS})


def test_positional_equivariance_bars():
    rng = np.random.default_rng(7)
    gaps = {"no positions": rng.uniform(0, 1e-6, len(TOKENS)), "learned": rng.uniform(0.1, 1, len(TOKENS))}
    check(positional_charts.output_gap_chart(TOKENS, gaps), {"X": LABELS})
