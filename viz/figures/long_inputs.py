"""Views of one head at any length, computed where the model's q and k are (``AttentionMaps.tiles``, ``.row``):
a window of the map at its level of the zoom pyramid (one query's row is viz/figures/rows.py).

The zoom is a pyramid: the whole input, then any window brushed on it, each drawn at the level whose tiles fit the
screen (``models.core.tiles.pyramid_tile``: tiles of 2^k positions a side) and computed when asked for, down to the
single cells of ``head_zoom`` (viz/figures/attention.py) once a window is 64 positions a side or fewer.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from models.core import selection
from models.core.results import RunResult
from models.core.selection import Head, Layer
from viz import export, heatmap
from viz.figure import Figure, view

DETAIL_PX = 640  # a pyramid level's window is drawn at most this many pixels a side


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
