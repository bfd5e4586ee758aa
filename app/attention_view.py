"""The attention views every text family shares: one head as a heatmap, all heads as a grid, token focus.

Used by the GPT, encoder and translation pages with any ``AttentionMaps``; pages differ only in inputs and extras.
"""
from __future__ import annotations

import streamlit as st

from app import resources
from models.analysis import heads
from models.results import AttentionMaps
from viz import heatmap

AVERAGE = "average of heads"


def _apply_grid_click(key: str) -> None:
    """A click on the layer × head chart (previous run) selects that head before the pickers are drawn."""
    event = st.session_state.get(f"{key}_grid_pick")
    points = (event or {}).get("selection", {}).get("pick") or []
    if points:
        picked = (int(points[0]["layer"]), int(points[0]["head"]))
        if st.session_state.get(f"{key}_grid_last") != picked:
            st.session_state[f"{key}_grid_last"] = picked
            st.session_state[f"{key}_layer"] = picked[0]
            st.session_state[f"{key}_head"] = f"head {picked[1]}"


def layer_head_picker(maps: AttentionMaps, key: str) -> tuple[int, int | None]:
    _apply_grid_click(key)
    left, right = st.columns(2)
    if st.session_state.get(f"{key}_layer", 0) >= maps.num_layers:
        st.session_state[f"{key}_layer"] = 0
    layer = left.slider("Layer", 0, max(maps.num_layers - 1, 1), key=f"{key}_layer",
                        disabled=maps.num_layers == 1)
    options = [AVERAGE] + [f"head {h}" for h in range(maps.num_heads)]
    if st.session_state.get(f"{key}_head") not in options:
        st.session_state[f"{key}_head"] = options[1]
    choice = right.selectbox("Head", options, key=f"{key}_head")
    return min(layer, maps.num_layers - 1), None if choice == AVERAGE else options.index(choice) - 1


def head_heatmap(maps: AttentionMaps, layer: int, head: int | None, key: str, scheme: str = "viridis") -> None:
    """One head (or the head average) as a chart when small, as an image with a zoomable token range when large."""
    weights = maps.head(layer, head)
    allowed = maps.allowed(layer)
    n_q, n_k = weights.shape
    name = f"layer {layer}, {'average of heads' if head is None else f'head {head}'}"
    limit = heatmap.MAX_CHART_TOKENS
    if max(n_q, n_k) <= limit:
        st.altair_chart(heatmap.attention_chart(weights, maps.query_tokens, maps.key_tokens, allowed, name, scheme),
                        width="content")
    else:
        st.image(heatmap.attention_image(weights, allowed, scheme), caption=f"{name}: {n_q} × {n_k} (grey = masked)")
        st.caption(f"Too many tokens for a chart with tooltips; zoom into up to {limit} query tokens below.")
        start = st.slider("Zoom: first query token", 0, max(n_q - limit, 0), max(n_q - limit, 0),
                          key=f"{key}_zoom")
        rows = slice(start, min(start + limit, n_q))
        cols = slice(max(0, rows.stop - limit), min(rows.stop, n_k)) if n_q == n_k else slice(0, min(limit, n_k))
        st.altair_chart(heatmap.attention_chart(
            weights[rows, cols], maps.query_tokens[rows], maps.key_tokens[cols], allowed[rows, cols],
            f"{name}: queries {rows.start}–{rows.stop - 1}, keys {cols.start}–{cols.stop - 1}", scheme,
            query_offset=rows.start, key_offset=cols.start), width="content")
    st.caption("Rows: the token doing the attending (query). Columns: the tokens it attends to (keys). "
               "Each row sums to 1. Grey cells are masked (the model could not look there).")


def model_view(result_key: tuple, result, kind: str, layer: int, head: int | None, key: str) -> None:
    """All layers × heads: pooled thumbnails, and a clickable statistic chart that opens a head above."""
    summary = resources.head_summary(result, result_key, kind)
    statistic = st.selectbox("Colour the layer × head chart by", list(heads.STATISTICS),
                             format_func=heads.STATISTICS.get, key=f"{key}_statistic")
    left, right = st.columns([3, 2])
    selected = (layer, head if head is not None else -1)
    left.image(heatmap.head_grid_image(summary.thumbnails, selected=selected),
               caption="Every head of every layer (block-averaged to at most 64 × 64); red frame: the head shown above")
    with right:
        st.altair_chart(heatmap.head_statistic_chart(summary.statistics[statistic], heads.STATISTICS[statistic],
                                                     selected if head is not None else None),
                        on_select="rerun", key=f"{key}_grid_pick")
        st.caption("Click a cell to open that head above.")


def token_focus(maps: AttentionMaps, layer: int, head: int | None, key: str) -> None:
    """Pick a query token and see its attention over the keys."""
    labels = heatmap.token_labels(maps.query_tokens)
    position = st.selectbox("Query token", range(len(labels)), index=len(labels) - 1,
                            format_func=lambda i: f"{i}: {labels[i]}", key=f"{key}_focus")
    weights = maps.head(layer, head)[position]
    st.altair_chart(heatmap.token_bars(weights, maps.key_tokens, f"Where '{labels[position]}' looks",
                                       maps.allowed(layer)[position]))


def explorer(result_key: tuple, result, kind: str, key: str) -> None:
    """Pickers, then the three views in tabs."""
    maps = result.maps(kind)
    layer, head = layer_head_picker(maps, key)
    one, grid, focus = st.tabs(["One head", "All heads (model view)", "Token focus"])
    with one:
        head_heatmap(maps, layer, head, key)
    with grid:
        model_view(result_key, result, kind, layer, head, key)
    with focus:
        token_focus(maps, layer, head, key)
