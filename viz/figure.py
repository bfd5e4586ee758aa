"""What a view draws, once, for the page, the command line and the download buttons alike.

A ``View`` is a named builder ``(data, options) -> Figure``: ``data`` is usually a family's run result, ``options``
a frozen dataclass whose defaults are what the page shows first. The page shows the figure, ``python -m app.cli``
writes it, and the download buttons export it, so the three can never drift (docs/ARCHITECTURE.md).

    @view("head", "One head", HeadOptions)
    def head(result: RunResult, options: HeadOptions) -> Figure: ...

A view whose data is not a run result says how to get it: ``data="options"`` (formulas: the options are all it
needs), or ``analysis=f`` with ``f(loaded, result, options) -> data`` from ``models/`` (attributions, a model's
position table): the app and the CLI call it, the builder never runs a model. ``family`` names whose model the
analysis needs on pages that have none of their own (the positional page reads MiniLM's and SmolLM2's tensors).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Literal, Mapping, TypeVar

import altair as alt
import numpy as np
import pandas as pd
from PIL import Image

NONE = "—"  # a table cell with nothing to say, on the page and in its CSV


@dataclass(frozen=True)
class NoOptions:
    """For views that take no options."""


T = TypeVar("T")


class Lazy(Generic[T]):
    """A part of a figure that may be costly to make (the CSV of a 2,048 × 2,048 map): given as the value or as a
    function that makes it, and read the same way either way, by calling it (``figure.table()``). A function is
    called each time, never kept: a figure is cached and shared, and a file is made only when it is asked for."""

    __slots__ = ("_source",)

    def __init__(self, source: T | Callable[[], T]):
        self._source = source

    def __call__(self) -> T:
        return self._source() if callable(self._source) else self._source

    def __repr__(self) -> str:
        return f"Lazy({'function' if callable(self._source) else type(self._source).__name__})"


def _lazy(value) -> Lazy | None:
    return value if value is None or isinstance(value, Lazy) else Lazy(value)


@dataclass(frozen=True)
class Figure:
    """One view's figure and the numbers behind it.

    ``stem``: the file name without extension; it says what the files hold (model, input, layer, head, ...), and
    every file written from the figure holds exactly that.

    What is drawn: ``chart`` (Altair) or ``image`` (PIL, for large matrices); or ``charts``, several parts the page
    lays out in rows: ``layout`` gives each row's relative column widths, ``((1,), (1, 1))`` one part across then two
    side by side, its last row repeated for the parts left (``((1, 1, 1, 1),)``: rows of four); without it all parts
    stand side by side, or one under the other when ``vertical``. A file holds them combined as laid out (or
    ``chart``, when given). ``width``: "content" draws a chart at its own width (or its
    column's, when narrower), "stretch" as wide as its column.

    The numbers: ``table`` (CSV), ``payload`` (JSON) and ``arrays`` (NPZ, with ``metadata`` as strings), each given as
    a value or as a function called only when a file is asked for (a rerun pays nothing for a 2,048 × 2,048 CSV), and
    read by calling: ``figure.table()``, ``figure.payload()["layer"]``, ``figure.arrays()["weights"]``.
    """

    stem: str
    chart: alt.TopLevelMixin | None = None
    image: Image.Image | None = None
    charts: tuple[alt.TopLevelMixin, ...] = ()
    vertical: bool = False
    layout: tuple[tuple[float, ...], ...] = ()
    table: Lazy[pd.DataFrame] | None = None
    payload: Lazy[dict[str, Any]] | None = None
    arrays: Lazy[dict[str, np.ndarray]] | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    caption: str = ""
    width: Literal["content", "stretch"] = "content"

    def __post_init__(self):
        for name in ("table", "payload", "arrays"):
            object.__setattr__(self, name, _lazy(getattr(self, name)))
        object.__setattr__(self, "charts", tuple(self.charts))
        if self.width not in ("content", "stretch"):
            raise ValueError(f"a figure's width is 'content' or 'stretch', not {self.width!r}")

    def rows(self) -> list[tuple[tuple, tuple[float, ...]]]:
        """The drawn parts as the page lays them out: ``[(parts of a row, their relative widths), ...]``."""
        parts = self.shown()
        if self.layout:
            rows, start = [], 0
            while start < len(parts):
                widths = self.layout[min(len(rows), len(self.layout) - 1)]
                row = parts[start:start + len(widths)]
                rows.append((row, tuple(widths[:len(row)])))
                start += len(widths)
            return rows
        if self.vertical or len(parts) <= 1:
            return [((part,), (1.0,)) for part in parts]
        return [(parts, (1.0,) * len(parts))]

    def export_chart(self):
        """The chart a PNG/SVG file holds: the chart, or the parts combined as the page lays them out."""
        if self.chart is not None or not self.charts:
            return self.chart
        rows = [combined(*parts) if len(parts) > 1 else parts[0] for parts, _ in self.rows()]
        return rows[0] if len(rows) == 1 else combined(*rows, vertical=True)

    def shown(self) -> tuple:
        """What the page draws, in order: charts and images."""
        if self.charts:
            return tuple(self.charts)
        return tuple(part for part in (self.chart, self.image) if part is not None)


def combined(*charts: alt.TopLevelMixin, vertical: bool = False) -> alt.TopLevelMixin:
    """Charts a page shows side by side (or stacked) as one figure to export. Vega-Lite allows ``autosize`` only on
    the outermost chart, so each part loses its own (they are drawn at their own width and height anyway)."""
    parts = []
    for chart in charts:
        part = chart.copy()
        part.autosize = alt.Undefined
        parts.append(part)
    owners = _selection_owners(parts)
    joined = alt.vconcat(*parts) if vertical else alt.hconcat(*parts)
    _own_views(joined, owners, vertical)
    # each part keeps its own colours and legend, as on the page (Vega-Lite would merge same-named colour fields)
    return joined.resolve_scale(color="independent").resolve_legend(color="independent").properties(
        autosize=alt.AutoSizeParams(type="pad", contains="padding"))


def _selection_owners(parts: list) -> dict[str, tuple[int, int, str]]:
    """``{selection name: (part, layer, the layer's name)}`` for the selections of a layered part that one of its
    layers declared (the heatmap's linked token hover, ``viz.heatmap.token_strips``; Altair keeps them on the
    layered chart with that layer as their one view)."""
    owners = {}
    for index, part in enumerate(parts):
        layers = [getattr(layer, "name", None) for layer in getattr(part, "layer", None) or ()]
        for param in part.params if layers and isinstance(getattr(part, "params", None), list) else ():
            views = param.to_dict().get("views") or []
            if len(views) == 1 and views[0] in layers:
                owners[param.name] = (index, layers.index(views[0]), views[0])
    return owners


def _own_views(joined, owners: dict[str, tuple[int, int, str]], vertical: bool) -> None:
    """Give each lifted selection back the one layer that declared it. Altair lifts a layered part's selections
    to the concatenation with every layer of that part as a view (its ``_view_names_for_param``), and Vega-Lite
    then defines each one once per layer in one scope: "Duplicate signal name". Altair also renames the layers
    (``name_<part>``), so a selection listening to ``@name_marks`` is pointed at the new name."""
    if not owners or not isinstance(joined.params, list):
        return
    parts = joined.vconcat if vertical else joined.hconcat
    for param in joined.params:
        if param.name not in owners:
            continue
        index, position, before = owners[param.name]
        after = parts[index].layer[position].name
        param.views = [after]
        select = param.select.to_dict() if hasattr(param.select, "to_dict") else dict(param.select)
        if isinstance(select.get("on"), str):
            select["on"] = select["on"].replace(f"@{before}_marks", f"@{after}_marks")
        param.select = select


@dataclass(frozen=True)
class View:
    """One named figure: a family's results feed it when the family lists its name (``Family.views``); a page
    without a family (positional, mechanics) owns its views by ``page``. The CLI writes it with ``--view name``."""

    name: str
    title: str
    build: Callable[[Any, Any], Figure]
    options: type = NoOptions
    data: str = "result"  # "result": a family's run; "options": nothing else; "analysis": see ``analysis``
    analysis: Callable | None = None  # (loaded, result, options) -> the builder's data (models/ code, never viz/)
    analysis_options: tuple[str, ...] = ()  # the option fields the analysis reads (what its cache is keyed by)
    family: str | None = None  # whose model an analysis reads, on a page without a family of its own
    page: str | None = None  # the page that owns this view, when it is not a family's
    run_options: bool = False  # draws a run made with the family's run options (a generation): the CLI builds them
    # (input text, options) that draw the view when its defaults cannot: a second prompt to compare with, say
    example: tuple[str, Any] | None = None

    def analysis_key(self, options) -> tuple:
        """What identifies this view's analysis for ``options``: the function and the option values it reads.
        Views sharing an analysis share its cache entry (the heads table and the thumbnails share one summary)."""
        return (self.analysis.__module__, self.analysis.__qualname__,
                tuple(getattr(options, name) for name in self.analysis_options))

    def option_fields(self) -> list[dataclasses.Field]:
        return list(dataclasses.fields(self.options))


VIEWS: dict[str, View] = {}


def view(name: str, title: str, options: type = NoOptions, data: str = "result", analysis: Callable | None = None,
         analysis_options: tuple[str, ...] = (), family: str | None = None, page: str | None = None,
         run_options: bool = False, example: tuple[str, Any] | None = None):
    """Register the decorated builder as the view ``name`` (names are unique across the app)."""
    if data not in ("result", "options", "analysis"):
        raise ValueError(f"unknown data source {data!r}")

    def register(build: Callable[[Any, Any], Figure]) -> Callable[[Any, Any], Figure]:
        if name in VIEWS and VIEWS[name].build is not build:
            raise ValueError(f"there already is a view called {name!r}")
        VIEWS[name] = View(name, title, build, options, "analysis" if analysis else data, analysis, analysis_options,
                           family, page, run_options, example)
        return build

    return register
