"""Views of one head at any length, computed where the model's q and k are (``AttentionMaps.tiles``, ``.row``):
a window of the map at its level of the zoom pyramid, and one query's exact weights with its top keys in context.

The zoom is a pyramid: the whole input, then any window brushed on it, each drawn at the level whose tiles fit the
screen (``models.core.tiles.pyramid_tile``: tiles of 2^k positions a side) and computed when asked for, down to the
single cells of ``head_zoom`` (viz/figures/attention.py) once a window is 64 positions a side or fewer.
"""
from __future__ import annotations

from dataclasses import dataclass

import altair as alt
import numpy as np
import pandas as pd

from models.core import selection
from models.core.results import RunResult, TextResult
from models.core.selection import Head, Layer
from viz import export, heatmap
from viz.figure import Figure, view

DETAIL_PX = 640  # a pyramid level's window is drawn at most this many pixels a side
PROFILE_BINS = 600  # a long row's weights over the key positions, drawn as this many bins' maxima


ZOOM_WIDTH = 320  # the zoomable charts fit half a 1280-px laptop screen (402 px a column): Vega maps the pointer in
# its own pixels, so a chart scaled down or cut off by its column would brush and tooltip the wrong cells


@selection.checked
@dataclass(frozen=True)
class OverviewOptions:
    kind: str = ""
    layer: Layer = 0
    head: Head = 0
    scheme: str = "viridis"
    statistic: str = "maximum"  # "maximum" or "mean" of each tile
    queries: tuple[int, int] = (0, 0)  # the region shown beside it, framed in red: first and last query, inclusive
    keys: tuple[int, int] = (0, 0)


@dataclass(frozen=True)
class Overview:
    """A long input's whole map for one head, drawn once (the ``head`` view's figure and its PNG), whatever region
    is framed on it."""

    figure: Figure
    png: bytes
    queries: int
    keys: int


def whole_map(loaded, result: RunResult, options: OverviewOptions) -> Overview:
    """The ``head`` view's figure of the whole map and its image as PNG (the overview the zoom starts from)."""
    from viz.figures.attention import HeadOptions
    from viz.figures.attention import head as one_head

    figure = one_head(result, HeadOptions(options.kind, options.layer, options.head, options.scheme, options.statistic))
    maps = result.maps(options.kind)
    layer, head = selection.pick(maps, options.layer, options.head)
    n_q, n_k = (len(tokens) for tokens in maps.tokens_in(layer))
    image = figure.image
    if image is None:  # small enough for cells (the page draws those): its image at one pixel a cell
        tiles = maps.tiles(layer, head, tile=1)
        image = heatmap.tiles_image(tiles, options.statistic, options.scheme, heatmap.OVERVIEW_PX)[0]
    return Overview(figure, heatmap.png_bytes(image), n_q, n_k)


@view("head_overview", "One head of a long input, to zoom into", OverviewOptions, analysis=whole_map,
      analysis_options=("kind", "layer", "head", "scheme", "statistic"))
def head_overview(overview: Overview, options: OverviewOptions) -> Figure:
    """The whole map of a long input as one image in a chart: drag a rectangle to zoom (the region shown beside
    it is framed in red), double-click to open a query's row. Its files are the ``head`` view's."""
    whole = overview.figure
    chart = heatmap.zoom_overview_chart(overview.png, overview.queries, overview.keys, options.queries, options.keys,
                                        width=ZOOM_WIDTH, pick="pick")
    return Figure(whole.stem, chart=chart, table=whole.table, payload=whole.payload, arrays=whole.arrays,
                  metadata=whole.metadata,
                  caption=whole.caption + " Drag a rectangle to zoom (the red frame is the region on the right); "
                                          "double-click to open a query's row below.")


@selection.checked
@dataclass(frozen=True)
class LevelOptions:
    kind: str = ""
    layer: Layer = 0
    head: Head = 0
    scheme: str = "viridis"
    statistic: str = "maximum"  # "maximum" or "mean" of each tile
    queries: tuple[int, int] = (0, 0)  # first and last query of the window, inclusive; (0, 0): the whole input
    keys: tuple[int, int] = (0, 0)


@view("head_level", "One head, a window at its zoom level", LevelOptions)
def head_level(result: RunResult, options: LevelOptions) -> Figure:
    """A window of one head's map (or the head average) at the level of the zoom pyramid that fits ``DETAIL_PX``:
    each pixel one tile of ``f × f`` cells (``f`` a power of two), its largest or mean weight."""
    from models.core.tiles import pyramid_tile

    maps = result.maps(options.kind)
    layer, head = selection.pick(maps, options.layer, options.head)
    name = export.head_label(head)
    query_tokens, key_tokens = maps.tokens_in(layer)
    whole = options.queries == (0, 0) and options.keys == (0, 0)
    queries = (0, len(query_tokens)) if whole else (options.queries[0], options.queries[1] + 1)
    keys = (0, len(key_tokens)) if whole else (options.keys[0], options.keys[1] + 1)
    tile = pyramid_tile(max(queries[1] - queries[0], keys[1] - keys[0]), DETAIL_PX)
    tiles = maps.tiles(layer, head, queries, keys, tile)
    image, vmax = heatmap.tiles_image(tiles, options.statistic, options.scheme, DETAIL_PX)
    which = "largest" if options.statistic == "maximum" else "mean"
    where = f"queries {queries[0]:,}–{queries[1] - 1:,}", f"keys {keys[0]:,}–{keys[1] - 1:,}"
    caption = (f"{where[0]}, {where[1]}" + (f": each pixel the {which} weight of {tile} × {tile} cells" if tile > 1
                                            else ", cell by cell")
               + f"; colours saturate at {vmax:.3f}.")
    span = (queries[1] - queries[0], keys[1] - keys[0])
    chart = heatmap.zoom_overview_chart(heatmap.png_bytes(image), *span, (queries[0], queries[1] - 1),
                                        (keys[0], keys[1] - 1), width=ZOOM_WIDTH, origin=(queries[0], keys[0]),
                                        pick="pick")
    return Figure(
        export.run_stem(result, maps.kind, f"layer {layer}", f"head {name}", *where), chart=chart,
        caption=caption + " Drag to zoom further; double-click to open a row.",
        table=lambda: pd.DataFrame({"first query": tiles.query_edges[:-1].repeat(tiles.shape[1]),
                                    "first key": np.tile(tiles.key_edges[:-1], tiles.shape[0]),
                                    "maximum": tiles.maximum.ravel(), "mean": tiles.mean.ravel(),
                                    "visible": tiles.visible.ravel()}),
        arrays=lambda: {"query_edges": tiles.query_edges, "key_edges": tiles.key_edges, "maximum": tiles.maximum,
                        "mean": tiles.mean, "visible": tiles.visible},
        metadata=export.run_metadata(result, kind=maps.kind, layer=layer, head=name, region=" ".join(where), tile=tile))


@selection.checked
@dataclass(frozen=True)
class RowOptions:
    kind: str = ""
    layer: Layer = 0
    head: Head = 0
    query: int = -1  # the attending token's position; -1 = the last
    top: int = 20  # keys listed, strongest first
    context: int = 6  # tokens shown on each side of a key


def in_context(tokens: list[str], position: int, context: int, pieces: tuple[str, ...] = ()) -> str:
    """Key ``position`` among its neighbours, marked: ``… the cat ⟦sat⟧ on the …``. With ``pieces`` (each token's
    decoded text, leading spaces kept) they are joined as the text was; else the labels are joined by spaces.
    Plain text either way (line breaks and invisible characters shown as markers)."""
    from models.core.text import visible_text

    first, last = max(0, position - context), min(len(tokens), position + context + 1)
    if len(pieces) == len(tokens):
        key = pieces[position]
        lead = key[:len(key) - len(key.lstrip(" "))]
        text = "".join(pieces[first:position]) + lead + f"⟦{key.strip(' ')}⟧" + "".join(pieces[position + 1:last])
        text = visible_text(text.strip(" "))
    else:
        text = " ".join(f"⟦{tokens[i]}⟧" if i == position else tokens[i] for i in range(first, last))
    return ("… " if first > 0 else "") + text + (" …" if last < len(tokens) else "")


@view("query_row", "One query: its top keys in context", RowOptions)
def query_row(result: RunResult, options: RowOptions) -> Figure:
    """One query's exact weights over every key, computed alone where q and k are (a row at 131,072 tokens is 0.5
    MB, its head's map 68 GB): the ``top`` keys with their tokens in context, and the whole row as a profile over
    the key positions (each bin's largest weight)."""
    maps = result.maps(options.kind)
    layer, head = selection.pick(maps, options.layer, options.head)
    name = export.head_label(head)
    query_tokens, key_tokens = maps.tokens_in(layer)
    query = options.query if options.query >= 0 else len(query_tokens) + options.query
    if not 0 <= query < len(query_tokens):
        raise ValueError(f"query {options.query} does not exist: the input has {len(query_tokens)} tokens")
    if not 1 <= options.top <= 1000:
        raise ValueError(f"top must be between 1 and 1,000 keys, not {options.top}")
    row, allowed = maps.row(layer, head, query), maps.row_allowed(layer, query)
    pieces = result.pieces if isinstance(result, TextResult) and maps.kind == "self" else ()  # the keys are the result's tokens
    order = np.argsort(-np.where(allowed, row, -1.0), kind="stable")[:min(options.top, int(allowed.sum()))]
    top = pd.DataFrame({
        "rank": np.arange(1, len(order) + 1), "key position": order, "key": [key_tokens[i] for i in order],
        "weight": row[order].astype(float),
        "in context": [in_context(key_tokens, int(i), options.context, pieces) for i in order]})
    label = heatmap.token_labels(query_tokens)[query]
    bars = alt.Chart(top).mark_bar().encode(
        y=alt.Y("rank:O", title=None, axis=alt.Axis(labelExpr="''")),  # the key's text is data, never an expression
        x=alt.X("weight:Q", title="attention weight"),
        color=alt.Color("weight:Q", scale=alt.Scale(scheme="blues"), legend=None),
        tooltip=["rank", "key position", "key", alt.Tooltip("weight:Q", format=".4f"), "in context"],
    )
    text = alt.Chart(top).mark_text(align="left", dx=4).encode(y=alt.Y("rank:O"), x=alt.X("weight:Q"),
                                                                text="key:N")
    top_chart = (bars + text).properties(title=f"Top {len(top)} keys of '{label}' (query {query:,})",
                                         width=360, height=max(120, 18 * len(top)), autosize=heatmap.PAD)
    profile = _profile(row, allowed)
    profile_chart = alt.Chart(profile).mark_area(line=True, opacity=0.4).encode(
        x=alt.X("first key:Q", title="key position"), y=alt.Y("weight:Q", title="largest weight in the bin"),
        tooltip=["first key", "last key", alt.Tooltip("weight:Q", format=".4f")],
    ).properties(title="The whole row", width=360, height=180, autosize=heatmap.PAD)
    stem = export.run_stem(result, maps.kind, f"layer {layer}", f"head {name}", f"query {query}")
    return Figure(
        stem, charts=(top_chart, profile_chart), caption=(
            f"Layer {layer}, {'average of heads' if head is None else f'head {head}'}: the exact "
            f"weights of query {query:,} ('{label}') over its {int(allowed.sum()):,} visible keys, computed for this "
            "row alone. ⟦ ⟧ marks the key among its neighbours."),
        table=top, width="stretch",
        payload=lambda: {"model": result.model.key, "kind": maps.kind, "layer": layer, "head": name, "query": query,
                         "query_token": query_tokens[query], "top": top.to_dict("list")},
        arrays=lambda: {"weights": row, "allowed": allowed},
        metadata=export.run_metadata(result, kind=maps.kind, layer=layer, head=name, query=query))


def _profile(row: np.ndarray, allowed: np.ndarray) -> pd.DataFrame:
    """The row's largest visible weight per bin of key positions (every key when there are few)."""
    shown = np.where(allowed, row, 0.0)
    edges = np.linspace(0, len(row), min(len(row), PROFILE_BINS) + 1).round().astype(int)
    starts = edges[:-1]
    return pd.DataFrame({"first key": starts, "last key": edges[1:] - 1,
                         "weight": np.maximum.reduceat(shown, starts).astype(float)})

