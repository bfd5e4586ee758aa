"""The attention views every text family shares: one head as a heatmap, all heads as a grid, token focus.

Used by the GPT, encoder and translation pages with any ``AttentionMaps``; pages differ only in inputs and extras.
"""
from __future__ import annotations

import uuid

import streamlit as st

from app import resources, share
from models.analysis import heads
from models.results import AttentionMaps
from viz import export, heatmap

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
    _apply_table_pick(key, maps.num_heads)
    left, right = st.columns(2)
    if not 0 <= st.session_state.get(f"{key}_layer", 0) < maps.num_layers:  # another model's, or a link's -5
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
        # the maps object lives in the run cache: a random id set on it once names it for the image cache
        run_id = maps.__dict__.setdefault("_view_id", uuid.uuid4().hex)
        large_heatmap(weights, allowed, maps, name, key, scheme, cache_key=(run_id, layer, head))
    st.caption("Rows: the token doing the attending (query). Columns: the tokens it attends to (keys). "
               "Each row sums to 1. Grey cells are masked (the model could not look there).")
    head_downloads(maps, layer, head, key, scheme)


def head_downloads(maps: AttentionMaps, layer: int, head: int | None, key: str, scheme: str) -> None:
    """The shown head as PNG/SVG (the chart, or the image for long inputs), its numbers as CSV/JSON, the layer as .npz.

    Everything is built on click (functions, not values): a rerun that moves a slider computes none of it.
    """
    stem_parts = st.session_state.get(f"{key}_stem", ())
    head_name = "mean" if head is None else head
    stem = export.file_stem(*stem_parts, maps.kind, f"layer {layer}", f"head {head_name}")
    small = max(len(maps.query_tokens), len(maps.key_tokens)) <= heatmap.MAX_CHART_TOKENS
    title = f"{maps.kind} attention, layer {layer}, head {head_name}"

    def weights():
        return maps.head(layer, head)

    share.downloads(
        stem, key,
        chart=(lambda: heatmap.attention_chart(weights(), maps.query_tokens, maps.key_tokens, maps.allowed(layer),
                                               title, scheme)) if small else None,
        image=None if small else (lambda: heatmap.attention_image(weights(), maps.allowed(layer), scheme)),
        table=lambda: export.matrix_frame(weights(), maps.query_tokens, maps.key_tokens),
        payload=lambda: {"kind": maps.kind, "layer": layer, "head": head_name, "query_tokens": maps.query_tokens,
                         "key_tokens": maps.key_tokens, "weights": weights(), "allowed": maps.allowed(layer)},
        arrays=lambda: {"weights": maps.layer(layer), "allowed": maps.allowed(layer)},
        metadata={"kind": maps.kind, "layer": layer, "input": " ".join(map(str, stem_parts))})


def _zoom_ranges(key: str, n_q: int, n_k: int, limit: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The (first, last) query and key positions to show cell by cell: a brush on the overview (previous run) sets
    the range sliders, which are the source of truth; ranges wider than ``limit`` are cut to ``limit``."""
    event = st.session_state.get(f"{key}_brush")
    brushed = (event or {}).get("selection", {}).get("zoom") or {}
    if "query" in brushed and "key" in brushed:
        picked = tuple(round(v) for v in (*brushed["query"], *brushed["key"]))
        if st.session_state.get(f"{key}_brush_last") != picked:
            st.session_state[f"{key}_brush_last"] = picked
            q0, q1, k0, k1 = (int(min(max(v, 0), top - 1)) for v, top in zip(sorted(picked[:2]) + sorted(picked[2:]),
                                                                              (n_q, n_q, n_k, n_k)))
            st.session_state[f"{key}_zoom_q"] = (q0, min(q1, q0 + limit - 1))
            st.session_state[f"{key}_zoom_k"] = (k0, min(k1, k0 + limit - 1))
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
    cut = [name for name, (a, b) in (("queries", queries), ("keys", keys)) if b - a + 1 > limit]
    if cut:
        st.caption(f"Showing the first {limit} of the chosen {' and '.join(cut)} cell by cell (at most {limit} a "
                   "side keep every cell readable with a tooltip).")
    return (queries[0], min(queries[1], queries[0] + limit - 1)), (keys[0], min(keys[1], keys[0] + limit - 1))


def large_heatmap(weights, allowed, maps: AttentionMaps, name: str, key: str, scheme: str,
                  cache_key: tuple = ()) -> None:
    """A map too large for a chart: the whole map as one image with a brush, beside the brushed region cell by cell.

    The overview is a PNG (block maxima beyond 900 tokens, so a single strong cell never disappears) inside a
    Vega-Lite chart: drag a rectangle over it to pick query and key ranges, or set them with the sliders; the region
    is drawn as a chart with a tooltip per cell. Bytes sent: the PNG once, plus at most 64 × 64 chart rows.
    """
    n_q, n_k = weights.shape
    limit = heatmap.MAX_CHART_TOKENS
    queries, keys = _zoom_ranges(key, n_q, n_k, limit)
    rows, cols = slice(queries[0], queries[1] + 1), slice(keys[0], keys[1] + 1)
    if cache_key:
        png, vmax = resources.overview_png(weights, allowed, cache_key, scheme)
    else:
        png, vmax = heatmap.overview_png(weights, allowed, scheme)
    shrink = -(-max(n_q, n_k) // 900)
    overview, detail = st.columns([1, 1])
    with overview:
        # both charts fit half a 1280-px laptop screen (402 px a column): Vega maps the pointer in its own pixels, so
        # a chart scaled down or cut off by its column would brush and tooltip the wrong cells
        st.altair_chart(heatmap.zoom_overview_chart(png, n_q, n_k, queries, keys, width=320),
                        on_select="rerun", key=f"{key}_brush", width="content")
        st.caption(f"{name}: all {n_q} × {n_k}" + (f" (each pixel the largest of {shrink} × {shrink} cells)"
                                                  if shrink > 1 else "") +
                   f". Colours saturate at {vmax:.3f} (the median of each query's largest weight). Drag a "
                   "rectangle to zoom; the red frame is the region on the right; grey = masked.")
    with detail:
        st.altair_chart(heatmap.attention_chart(
            weights[rows, cols], maps.query_tokens[rows], maps.key_tokens[cols], allowed[rows, cols],
            f"queries {rows.start}–{rows.stop - 1}, keys {cols.start}–{cols.stop - 1}", scheme,
            query_offset=rows.start, key_offset=cols.start, size=300, compact=True), width="content")


def _apply_table_pick(key: str, num_heads: int) -> None:
    """A row picked in the statistics table (previous run) opens that head, as a click on the chart does."""
    event = st.session_state.get(f"{key}_table")
    rows = (event or {}).get("selection", {}).get("rows") or []
    if rows and st.session_state.get(f"{key}_table_last") != rows[0]:
        st.session_state[f"{key}_table_last"] = rows[0]
        st.session_state[f"{key}_layer"] = rows[0] // num_heads
        st.session_state[f"{key}_head"] = f"head {rows[0] % num_heads}"


def model_view(result_key: tuple, result, kind: str, layer: int, head: int | None, key: str) -> None:
    """All layers × heads: pooled thumbnails, and a clickable statistic chart that opens a head above."""
    maps = result.maps(kind)
    with st.spinner(f"Summarising {maps.num_layers * maps.num_heads} heads (once per input)…"):
        summary = resources.head_summary(result, result_key, kind)
    statistic = st.selectbox("Colour the layer × head chart by", list(heads.STATISTICS),
                             format_func=heads.STATISTICS.get, key=f"{key}_statistic")
    selected = (layer, head if head is not None else -1)
    left, right = st.columns([1, 1])
    with left:
        st.altair_chart(heatmap.head_statistic_chart(summary.statistics[statistic], heads.STATISTICS[statistic],
                                                     selected if head is not None else None),
                        on_select="rerun", key=f"{key}_grid_pick", width="content")
        st.caption("Click a cell to open that head above.")
    with right:
        st.dataframe(heads.summary_table(summary), hide_index=True, height=420,
                     on_select="rerun", selection_mode="single-row", key=f"{key}_table",
                     column_config={label: st.column_config.NumberColumn(format="%.3f")
                                    for label in heads.STATISTICS.values()})
        st.caption("Every head, one row each: click a column header to sort (e.g. the most focused heads by "
                   "entropy), select a row to open that head above.")
    st.image(heatmap.head_grid_image(summary.thumbnails, selected=selected),
             caption="Every head of every layer (block-averaged to at most 64 × 64); red frame: the head shown above")


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
    # lazy tabs: only the open tab runs, so a slider move on "One head" never pays for the all-heads summary
    one, grid, focus = st.tabs(["One head", "All heads (model view)", "Token focus"], key=f"{key}_view",
                               on_change="rerun")
    if one.open is not False:
        with one:
            head_heatmap(maps, layer, head, key, share.color_scheme())
    if grid.open is not False:
        with grid:
            model_view(result_key, result, kind, layer, head, key)
    if focus.open is not False:
        with focus:
            token_focus(maps, layer, head, key)
