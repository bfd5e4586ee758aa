"""The Why tab of the GPT and encoder pages and of the ViT page ([CLS] row): pick a cell of a head (click the head's
map, or choose its query and key), see its score split into what wrote the query × what wrote the key
(``viz/figures/why.py``, ``models/analysis/why.py``), run the intervention check for the top pairs on a button, and
open the head's composition table (which earlier components feed its keys and its queries)."""
from __future__ import annotations

import dataclasses

import altair as alt
import streamlit as st

from app import display, presentation, tables, widgets
from models.analysis import why
from viz import heatmap
from viz.figures.attention import HeadOptions
from viz.figures.why import WhyHeadOptions, WhyOptions

STRONGEST = "the row's strongest key"
KEY_CHOICES = 20  # keys offered by name on the ViT page (the row's strongest)
TABLE_FORMATS = {name: "%+.3f" for name in ("key side", "key share", "key side vs runner-up", "key share vs runner-up",
                                             "query side", "query share", "query side vs runner-up",
                                             "query share vs runner-up")}


def keys(prefix: str) -> list[str]:
    """The session keys a link carries for this section on a page whose keys start with ``prefix``."""
    return [f"{prefix}_why_layer", f"{prefix}_why_head", f"{prefix}_why_query", f"{prefix}_why_key",
            f"{prefix}_why_table"]


def coerce(prefix: str) -> dict:
    return {f"{prefix}_why_layer": int, f"{prefix}_why_head": int, f"{prefix}_why_query": int,
            f"{prefix}_why_key": int, f"{prefix}_why_table": lambda text: text == "True"}


def _apply_click(prefix: str, count: int) -> None:
    """A cell clicked on the head's map (previous run) picks that query and key, before the inputs are drawn."""
    event = st.session_state.get(f"{prefix}_why_cells")
    points = (event or {}).get("selection", {}).get("cell") or []
    if points and "query position" in points[0] and "key position" in points[0]:
        picked = (int(points[0]["query position"]), int(points[0]["key position"]))
        if st.session_state.get(f"{prefix}_why_clicked") != picked and all(0 <= p < count for p in picked):
            st.session_state[f"{prefix}_why_clicked"] = picked
            st.session_state[f"{prefix}_why_query"], st.session_state[f"{prefix}_why_key"] = picked


def _layer_head(maps, prefix: str) -> tuple[int, int]:
    # first opened: the head the page's attention views show (a sample opens on the head that shows its lesson)
    shown = st.session_state.get(f"{prefix}_layer"), st.session_state.get(f"{prefix}_head")
    opening = tuple(choice if isinstance(choice, int) and not isinstance(choice, bool) else 0 for choice in shown)
    layer, head = widgets.layer_and_head(f"{prefix}_why", maps.num_layers, maps.num_heads, opening=opening,
                                         mean=False)  # the split reads one head
    return min(int(layer), maps.num_layers - 1), int(head)


def show(result, loaded, prefix: str, cls_only: bool = False) -> None:
    """The section. ``cls_only``: the one row offered is [CLS] (the ViT page), keys chosen among its strongest."""
    maps = result.maps("self")
    count = len(maps.query_tokens)
    st.caption("Why does this head look here? The score of one cell (query × key, before softmax) is a sum over "
               "pairs of what wrote the query and what wrote the key: the embeddings, each earlier head, each MLP, "
               "biases. With every normalisation frozen at its scale in this run the split is exact.")
    if not cls_only:
        _apply_click(prefix, count)
    layer, head = _layer_head(maps, prefix)
    labels = heatmap.token_labels(maps.query_tokens)
    if cls_only:
        query = why.default_query(result)
        weights = maps.row(layer, head, query)
        order = [int(k) for k in weights.argsort()[::-1][:KEY_CHOICES]]
        if st.session_state.get(f"{prefix}_why_key") not in order:
            st.session_state.pop(f"{prefix}_why_key", None)
        key = st.selectbox(f"Key (the {len(order)} that {labels[query]} attends to most)", order,
                           format_func=lambda k: f"{k}: {labels[k]} ({weights[k]:.1%})", key=f"{prefix}_why_key")
    else:
        if count <= heatmap.MAX_CHART_TOKENS:  # a map with cells: click one
            figure = widgets.figure_or_none("head", result, HeadOptions("self", layer, head,
                                                                        presentation.color_scheme()))
            if figure is not None and figure.chart is not None:
                clickable = dataclasses.replace(figure, chart=figure.chart.add_params(alt.selection_point(
                    name="cell", fields=["query position", "key position"], on="click", clear=False)))
                display.show(clickable, f"{prefix}_why_map", select=f"{prefix}_why_cells", downloads=False,
                             caption=False)
                st.caption("Click a cell to split its score below, or choose the query and key.")
        for name, default in ((f"{prefix}_why_query", why.default_query(result)),):
            if not 0 <= st.session_state.get(name, default) < count:
                st.session_state[name] = default
        if st.session_state.get(f"{prefix}_why_key") is not None and \
                not 0 <= st.session_state[f"{prefix}_why_key"] < count:
            st.session_state[f"{prefix}_why_key"] = None
        left, right = st.columns(2)
        query = int(left.number_input("Query (position)", 0, count - 1, value=why.default_query(result),
                                      key=f"{prefix}_why_query"))
        key = right.number_input("Key (position; empty: the row's strongest)", 0, count - 1, value=None,
                                 key=f"{prefix}_why_key")
        key = None if key is None else int(key)
        st.caption(f"Query {query}: {labels[query]}" + ("" if key is None else f" · key {key}: {labels[key]}"))
    checked = st.session_state.setdefault(f"{prefix}_why_checked", set())
    cell = (result.run_id, layer, head, query, key)
    check = cell in checked
    with st.spinner("Splitting the score…"):
        figure = widgets.figure_or_none("why", result, WhyOptions(layer, head, query, key, check=check), loaded)
    if figure is None:
        return
    display.show(figure, f"{prefix}_why")
    if not check and st.button("Check by intervention: take each top pair's components out of the stream",
                               key=f"{prefix}_why_check", help="With the norms frozen the score moves by exactly "
                               "the term; with them recomputed, by what the model would really do."):
        checked.add(cell)
        st.rerun()
    if cls_only:
        return
    st.subheader("What feeds this head's keys and queries")
    if st.toggle(f"Composition table of layer {layer}, head {head} over its strongest cells",
                 key=f"{prefix}_why_table"):
        with st.spinner("Splitting the strongest cells of the head…"):
            table = widgets.figure_or_none("why_head", result, WhyHeadOptions(layer, head), loaded)
        if table is not None:
            display.show(table, f"{prefix}_why_head", downloads=False)
            tables.show(table.table(), TABLE_FORMATS, sortable=True, height=360)
            st.caption("One row per component (sortable: click a column). Key side: its mean part of the score "
                       "through the key; vs runner-up: at the chosen key minus at the row's next strongest key.")
            display.offer(table, f"{prefix}_why_head")


CIRCUIT_KEYS = ["mech_why_block", "mech_why_seed"]


def show_circuit() -> None:
    """The mechanics page's lesson: an induction circuit built by hand in a two-layer attention-only model, and the
    same decomposition naming it back (``models/lessons/induction.py``)."""
    from models.lessons import induction
    from viz.figures.why import CircuitOptions

    st.markdown("A two-layer, attention-only GPT-2 whose weights are written by hand: **layer 0 head 0** copies the "
                "previous token into a block of its own (its query asks for position p − 1), **layer 1 head 0** "
                "compares the current token with that block (so it attends to the letter after the earlier copy of "
                "the current one). The other head of each layer has small random weights. The score of each of "
                "the induction head's cells is then split exactly into what wrote its query × what wrote its key.")
    left, right = st.columns(2)
    block = left.slider("Letters in the repeated block", 3, len(induction.LETTERS), 8, key="mech_why_block")
    seed = int(right.number_input("Seed (letters and distractor weights)", 0, 9999, 0, key="mech_why_seed"))
    with st.spinner("Building the toy and splitting its induction head's scores…"):
        figure = widgets.figure_or_none("why_circuit", None, CircuitOptions(block, seed,
                                                                            presentation.color_scheme()))
    if figure is not None:
        display.show(figure, "mech_why")
