"""The GPT page's comparison tab: a second prompt on the same model, or the same prompt on a second model with the
same tokenizer; a layer × head map of how differently each head attends, and one head of both runs side by side."""
from __future__ import annotations

import streamlit as st

from app import display, presentation, widgets
from models.analysis import compare
from viz.figures.compare import CompareOptions

KEYS = ["gpt_cmp_text2", "gpt_cmp_model2", "gpt_cmp_distance", "gpt_cmp_layer", "gpt_cmp_head"]
COERCE = {"gpt_cmp_layer": int, "gpt_cmp_head": int}


def _apply_pick(layers: int, heads: int) -> None:
    """A click on the layer × head map (previous run) picks the head shown side by side."""
    points = ((st.session_state.get("gpt_cmp_pick") or {}).get("selection", {}).get("pick")) or []
    if points:
        picked = (int(points[0]["layer"]), int(points[0]["head"]))
        if st.session_state.get("gpt_cmp_last") != picked:
            st.session_state["gpt_cmp_last"] = picked
            st.session_state["gpt_cmp_layer"], st.session_state["gpt_cmp_head"] = picked
    for key, count in (("gpt_cmp_layer", layers), ("gpt_cmp_head", heads)):
        if not 0 <= st.session_state.get(key, 0) < count:  # another model's, or a link's
            st.session_state[key] = 0


def show(result, loaded) -> None:
    st.caption("Two runs side by side: a second prompt on this model, or this prompt on a second model that shares "
               "its tokenizer (e.g. a fine-tune). Each head's maps are compared query by query when the token counts "
               "match; otherwise a summary of each head is.")
    left, right = st.columns(2)
    text2 = left.text_input("Second prompt (empty: the same prompt)", key="gpt_cmp_text2", max_chars=2000)
    model2 = right.text_input("Second model (empty: the same model)", key="gpt_cmp_model2", max_chars=200,
                              help="A registry key, a hub id or an allowed local folder, with the same tokenizer")
    distance = st.radio("Distance between two heads' rows", list(compare.DISTANCES), horizontal=True,
                        format_func=compare.DISTANCES.get, key="gpt_cmp_distance")
    maps = result.maps("self")
    _apply_pick(maps.num_layers, maps.num_heads)
    left, right = st.columns(2)
    layer = left.number_input("Layer shown side by side", 0, maps.num_layers - 1, key="gpt_cmp_layer")
    head = right.number_input("Head shown side by side", 0, maps.num_heads - 1, key="gpt_cmp_head")
    if not text2.strip() and not model2.strip():
        st.info("Type a second prompt (the same number of tokens compares the maps cell by cell), or a second model.")
        return
    with st.spinner("Running the second prompt and comparing every head…"):
        figure = widgets.figure_or_none("compare", result, CompareOptions(
            text2, model2, distance, int(layer), int(head), presentation.color_scheme()), loaded)
    if figure is None:
        return
    display.show(figure, "gpt_compare", select="gpt_cmp_pick")
