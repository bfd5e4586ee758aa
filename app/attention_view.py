"""The attention views every text family shares: one head as a heatmap, all heads as a grid, token focus.

Used by the GPT, encoder and translation pages with any result that has attention; the figures come from
viz/figures/attention.py (the same ones ``python -m app.cli`` writes), this module adds the widgets around them.
"""
from __future__ import annotations


import streamlit as st

from app import display, presentation, tables, url_state, widgets
from models.analysis import heads, roles, showcase
from models.core import selection
from models.core.results import AttentionMaps, RunResult
from viz import heatmap
from viz.figures.attention import (
    FocusOptions,
    GridOptions,
    HeadOptions,
    StatisticsOptions,
    ZoomOptions,
)
from viz.figures.long_inputs import LevelOptions, OverviewOptions
from viz.figures.rows import RowOptions

def _apply_grid_click(key: str) -> None:
    """A click on the layer × head chart (previous run) selects that head before the pickers are drawn."""
    event = st.session_state.get(f"{key}_grid_pick")
    points = (event or {}).get("selection", {}).get("pick") or []
    if points:
        picked = (int(points[0]["layer"]), int(points[0]["head"]))
        if st.session_state.get(f"{key}_grid_last") != picked:
            st.session_state[f"{key}_grid_last"] = picked
            st.session_state[f"{key}_layer"] = picked[0]
            st.session_state[f"{key}_head"] = picked[1]


def layer_head_picker(maps: AttentionMaps, key: str) -> tuple[int, int | None]:
    """The page's layer and head (``widgets.layer_and_head``), opened by a click on the heads' chart or table."""
    _apply_grid_click(key)
    _apply_table_pick(key, maps.num_heads)
    layer, head = widgets.layer_and_head(key, maps.num_layers, maps.num_heads, opening=(0, 0),
                                         layer_names=[maps.layer_label(i) for i in range(maps.num_layers)],
                                         hybrid=any(maps.layer_number(i) != i for i in range(maps.num_layers)))
    return selection.pick(maps, layer, head)


STATISTICS = {"maximum": "largest weight", "mean": "mean weight"}
FOCUS_CHOICES = 4096  # beyond this many tokens the focus tab's query is typed, not picked from a list


def head_heatmap(result: RunResult, kind: str, layer: int, head: int | None, key: str, scheme: str) -> None:
    """One head (or the head average) as a chart when small; when large, a zoom pyramid computed where the model's
    q and k are: the whole map as an image (each pixel a block's largest or mean weight) on the left, the brushed
    window on the right at its own level (again brushable) down to exact cells with tooltips, and below, one query
    row's exact weights and top keys in context (click a cell, or double-click a pixel, to open its row)."""
    statistic = st.session_state.get(f"{key}_pixels", "maximum")
    figure = widgets.figure_or_none("head", result, HeadOptions(kind, layer, head, scheme, statistic))
    if figure is None:
        return
    if figure.chart is not None:
        display.show(figure, key)
        return
    maps = result.maps(kind)
    n_q, n_k = (len(tokens) for tokens in maps.tokens_in(layer))
    queries, keys = _zoom_ranges(key, n_q, n_k, heatmap.MAX_CHART_TOKENS)
    overview, detail = st.columns([1, 1])
    with overview:
        whole = widgets.figure_or_none("head_overview", result, OverviewOptions(kind, layer, head, scheme, statistic,
                                                                                queries, keys))
        if whole is not None:
            display.show(whole, f"{key}_overview", select=f"{key}_brush", downloads=False)
        st.radio("Each pixel shows", list(STATISTICS), format_func=STATISTICS.get, key=f"{key}_pixels",
                 horizontal=True)
    with detail:
        cells = all(b - a + 1 <= heatmap.MAX_CHART_TOKENS for a, b in (queries, keys))
        if cells:  # the last level: every cell, with a tooltip; a click opens its row
            zoom = widgets.figure_or_none("head_zoom", result, ZoomOptions(kind, layer, head, scheme, queries, keys))
            if zoom is not None:
                display.show(zoom, f"{key}_zoom", select=f"{key}_cells", downloads=False, caption=False)
                st.caption("Click a cell to open its query's row below.")
        else:  # a level of the pyramid: the window at the tiles that fit, computed now; brush again to go deeper
            level = widgets.figure_or_none("head_level", result, LevelOptions(kind, layer, head, scheme, statistic,
                                                                              queries, keys))
            if level is not None:
                display.show(level, f"{key}_level", select=f"{key}_level_brush", downloads=False)
        st.button("Whole map", key=f"{key}_unzoom", help="Show the whole input again on the right",
                  on_click=_zoom_to, args=(key, (0, n_q - 1), (0, n_k - 1)))
    display.offer(figure, key)
    query_row(result, kind, layer, head, key, n_q, queries)


def query_row(result: RunResult, kind: str, layer: int, head: int | None, key: str, n_q: int,
              queries: tuple[int, int]) -> None:
    """One query's exact weights over every key and its top keys in context; the row is picked by a click in the
    cells, a double-click in an image, or typed."""
    _apply_row_pick(key, n_q)
    if not 0 <= st.session_state.get(f"{key}_row", -1) < n_q:
        st.session_state[f"{key}_row"] = queries[1]  # the window's last query
    query = st.number_input("Query row (position)", 0, n_q - 1, key=f"{key}_row",
                            help="Whose attention to list: click a cell or double-click a pixel above, or type it.")
    figure = widgets.figure_or_none("query_row", result, RowOptions(kind, layer, head, int(query)))
    if figure is not None:
        display.show(figure, f"{key}_row", downloads=False)
        tables.show(figure.table(), {"weight": "%.4f"})
        display.offer(figure, f"{key}_row")


def _apply_row_pick(key: str, n_q: int) -> None:
    """A cell clicked or a pixel double-clicked (previous run) opens that query's row."""
    for source, field in ((f"{key}_cells", "query position"), (f"{key}_brush", "query"),
                          (f"{key}_level_brush", "query")):
        event = st.session_state.get(source)
        selection = (event or {}).get("selection", {})
        points = selection.get("cell" if source.endswith("_cells") else "pick") or []
        if points and field in points[0]:
            picked = int(min(max(round(points[0][field]), 0), n_q - 1))
            if st.session_state.get(f"{source}_row_last") != picked:
                st.session_state[f"{source}_row_last"] = picked
                st.session_state[f"{key}_row"] = picked


def _zoom_to(key: str, queries: tuple[int, int], keys: tuple[int, int]) -> None:
    """Set the window (before the sliders are drawn: a button's callback)."""
    st.session_state[f"{key}_zoom_q"], st.session_state[f"{key}_zoom_k"] = queries, keys


def _zoom_ranges(key: str, n_q: int, n_k: int, limit: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The (first, last) query and key positions of the window on the right: a brush on the overview or on the
    window itself (previous run) sets the range sliders, which are the source of truth. A window of at most
    ``limit`` a side is shown cell by cell, a larger one at its level of the zoom pyramid."""
    for source in (f"{key}_brush", f"{key}_level_brush"):
        event = st.session_state.get(source)
        brushed = (event or {}).get("selection", {}).get("zoom") or {}
        if "query" in brushed and "key" in brushed:
            picked = tuple(round(v) for v in (*brushed["query"], *brushed["key"]))
            if st.session_state.get(f"{source}_last") != picked:
                st.session_state[f"{source}_last"] = picked
                q0, q1, k0, k1 = (int(min(max(v, 0), top - 1)) for v, top in
                                  zip(sorted(picked[:2]) + sorted(picked[2:]), (n_q, n_q, n_k, n_k)))
                st.session_state[f"{key}_zoom_q"] = (q0, q1)
                st.session_state[f"{key}_zoom_k"] = (k0, k1)
    for name, n in (("q", n_q), ("k", n_k)):  # a new, shorter input: start again at the end of the text
        current = st.session_state.get(f"{key}_zoom_{name}")
        if current is not None and current[1] >= n:
            del st.session_state[f"{key}_zoom_{name}"]
    if f"{key}_zoom_q" not in st.session_state:  # default: the last queries and the keys just before them
        st.session_state[f"{key}_zoom_q"] = (max(0, n_q - limit), n_q - 1)
        st.session_state[f"{key}_zoom_k"] = (max(0, min(n_q, n_k) - limit), min(n_q, n_k) - 1) if n_q == n_k \
            else (0, min(limit, n_k) - 1)
    left, right = st.columns(2)
    queries = left.slider("Zoom: query tokens", 0, n_q - 1, key=f"{key}_zoom_q")
    keys = right.slider("Zoom: key tokens", 0, n_k - 1, key=f"{key}_zoom_k")
    return (int(queries[0]), int(queries[1])), (int(keys[0]), int(keys[1]))


def _apply_table_pick(key: str, num_heads: int) -> None:
    """A row picked in the statistics table (previous run) opens that head, as a click on the chart does."""
    event = st.session_state.get(f"{key}_table")
    rows = (event or {}).get("selection", {}).get("rows") or []
    if rows and st.session_state.get(f"{key}_table_last") != rows[0]:
        st.session_state[f"{key}_table_last"] = rows[0]
        st.session_state[f"{key}_layer"] = rows[0] // num_heads
        st.session_state[f"{key}_head"] = rows[0] % num_heads


def model_view(result: RunResult, kind: str, layer: int, head: int | None, key: str, loaded=None) -> None:
    """All layers × heads: a clickable statistic chart and a sortable table that open a head above, and pooled
    thumbnails of every head."""
    maps = result.maps(kind)
    # head roles (induction, duplicate-token, ...) are measured for a causal LM's self-attention (models.analysis.roles)
    labels = {**heads.STATISTICS,
              **(roles.ROLES if getattr(result, "next_token", None) and kind == "self" and loaded else {})}
    if st.session_state.get(f"{key}_statistic") not in labels:  # a link made on another page or model
        st.session_state.pop(f"{key}_statistic", None)
    statistic = st.selectbox("Colour the layer × head chart by", list(labels), format_func=labels.get,
                             key=f"{key}_statistic")
    with st.spinner(f"Summarising {maps.num_layers * maps.num_heads} heads (once per input)…"):
        chart = widgets.figure_or_none("head_statistics", result,
                                       StatisticsOptions(kind, statistic, layer, head, presentation.color_scheme()),
                                       loaded)
        thumbnails = widgets.figure_or_none("grid", result, GridOptions(kind, layer, head, presentation.color_scheme()),
                                            loaded)
    if chart is None or thumbnails is None:
        return
    left, right = st.columns([1, 1])
    with left:
        display.show(chart, f"{key}_statistics", select=f"{key}_grid_pick")
    with right:
        st.dataframe(chart.table(), hide_index=True, height=420, on_select="rerun", selection_mode="single-row",
                     key=f"{key}_table", column_config={label: st.column_config.NumberColumn(format="%.3f")
                                                        for label in labels.values()})
        st.caption("Every head, one row each: click a column header to sort (e.g. the most focused heads by "
                   "entropy, the strongest induction heads), select a row to open that head above.")
    display.show(thumbnails, f"{key}_grid")


def token_focus(result: RunResult, kind: str, layer: int, head: int | None, key: str) -> None:
    """Pick a query token, or a span of them taken together (a word split into pieces, a phrase), and see its
    attention over the keys."""
    labels = heatmap.token_labels(result.maps(kind).tokens_in(layer)[0])
    combine = "mean"
    if len(labels) > FOCUS_CHOICES:  # a list of 100,000 options would be megabytes sent to every rerun
        if not 0 <= st.session_state.get(f"{key}_focus_position", -1) < len(labels):
            st.session_state[f"{key}_focus_position"] = len(labels) - 1
        first = last = int(st.number_input("Query token (position)", 0, len(labels) - 1, key=f"{key}_focus_position"))
    else:
        span = st.session_state.get(f"{key}_focus_span")
        if span is not None and not (isinstance(span, (tuple, list)) and len(span) == 2
                                     and 0 <= span[0] <= span[1] < len(labels)):
            del st.session_state[f"{key}_focus_span"]  # a longer input's span: start again at the last token
        first, last = st.select_slider(
            "Query tokens", range(len(labels)), value=(len(labels) - 1, len(labels) - 1),
            format_func=lambda i: f"{i}: {labels[i]}", key=f"{key}_focus_span",
            help="One token, or drag the ends apart for several at once: a word split into pieces, a phrase.")
        if last > first:
            combine = st.radio("Take the tokens' attention together as", ["mean", "sum"], horizontal=True,
                               key=f"{key}_focus_combine",
                               help="mean: where the span looks on average (sums to 1); sum: how much attention "
                                    "the span sends to each key in all.")
    options = FocusOptions(kind, layer, head, first, last if last > first else None, combine)
    figure = widgets.figure_or_none("focus", result, options)
    if figure is not None:
        display.show(figure, f"{key}_focus", downloads=False)


def open_on_sample(result: RunResult, kind: str, key: str, samples: dict[str, showcase.Sample],
                   text: str) -> showcase.Opening | None:
    """While ``text`` is one of the page's samples, the head that shows its lesson (``models.analysis.showcase``,
    measured on this run); the first time a sample is shown with a model, that head is selected (before the
    pickers are drawn), unless the session's link chose a head."""
    name = next((name for name, sample in samples.items() if sample.text == text), None)
    if name is None:
        return None
    try:
        opening = showcase.opening_head(result.maps(kind), list(result.maps(kind).query_tokens), samples[name])
    except ValueError:  # a model whose tokens split the sample's words differently
        return None
    marker, shown = f"{key}_opened_for", f"{name}|{result.model.key}"
    first = marker not in st.session_state
    if st.session_state.get(marker) != shown:
        st.session_state[marker] = shown
        if not (first and (url_state.from_link(f"{key}_layer") or url_state.from_link(f"{key}_head"))):
            st.session_state[f"{key}_layer"] = opening.layer
            st.session_state[f"{key}_head"] = opening.head
    return opening


def explorer(result: RunResult, kind: str, key: str, loaded=None, samples: dict[str, showcase.Sample] | None = None,
             text: str = "") -> None:
    """Pickers, then the three views in tabs. ``samples``, ``text``: the page's samples and the text in view (a
    sample opens on the head that shows its lesson, with a line that says why)."""
    maps: AttentionMaps = result.maps(kind)
    opening = open_on_sample(result, kind, key, samples, text) if samples else None
    layer, head = layer_head_picker(maps, key)
    if opening is not None and (layer, head) == (opening.layer, opening.head):
        st.caption(opening.why())
    # lazy tabs: only the open tab runs, so a slider move on "One head" never pays for the all-heads summary
    one, grid, focus = st.tabs(["One head", "All heads (model view)", "Token focus"], key=f"{key}_view",
                               on_change="rerun")
    if one.open is not False:
        with one:
            head_heatmap(result, kind, layer, head, key, presentation.color_scheme())
    if grid.open is not False:
        with grid:
            model_view(result, kind, layer, head, key, loaded)
    if focus.open is not False:
        with focus:
            token_focus(result, kind, layer, head, key)
