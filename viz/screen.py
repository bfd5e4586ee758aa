"""How a chart is fitted to the screen it is shown on: a laptop, or a projector in presentation mode.

One pure function, ``fitted(chart, screen)``, turns an Altair chart into the Vega-Lite spec a page draws and says how
wide to draw it. Every chart reaches the screen through it (``app/display.py``), so every chart gets the same rules:

* **It fits its column.** The chart is drawn at its own width or its column's, whichever is less, with everything
  inside: Vega-Lite ``autosize`` "fit-x" with ``contains: "padding"`` makes the plot narrower so that axes, labels and
  legend fit the given width, instead of running under the next column or off the window. Its width is the plot's
  width plus what its axes and legend need (``natural_width``), so a chart that fits is drawn at the size its builder
  chose. Vega maps the pointer in its own pixels, so the chart is never scaled down by CSS (tooltips and clicks stay
  on the right cell).
* **No axis silently drops labels.** Streamlit's theme turns on ``labelOverlap`` for every axis, which on a token
  axis hides every second token. Discrete axes keep all their labels unless a builder thins them on purpose.
* **In presentation mode it is built for the back of a lecture hall.** Sizes grow by ``SIZE_SCALE`` (a view no taller
  than ``MAX_PRESENTATION_HEIGHT``, keeping its aspect), every font by ``FONT_SCALE`` and to at least
  ``MIN_PRESENTATION_FONT`` px, and the chart is drawn as SVG (crisp on a projector; its text can be measured).

The chart is never changed in place: a cached figure is shared by every session, and a projector in one room must
not enlarge the laptop's charts in another. Altair themes are process-wide for the same reason, so the typography is
set in each spec's own ``config``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import altair as alt

# The page draws what a builder made, however many rows: Altair's 5,000-row guard is for notebooks. Lifted once for
# the process (a `with` around each conversion would race: one thread's exit restores the guard under another's).
alt.data_transformers.disable_max_rows()

SIZE_SCALE = 2.0  # a 1920-px projector's column is about twice a 1280-px laptop's (the sidebar tucked away)
FONT_SCALE = 1.6
MIN_PRESENTATION_FONT = 18  # px: readable from the back of a lecture hall at 1920 px wide
MAX_PRESENTATION_HEIGHT = 720  # px of plot: a view stays within a 1080-px window under the page's header
PRESENTATION_FONTS = {"axis": {"labelFontSize": 20, "titleFontSize": 22},
                      "legend": {"labelFontSize": 20, "titleFontSize": 22},
                      "header": {"labelFontSize": 20, "titleFontSize": 22},
                      "title": {"fontSize": 26, "subtitleFontSize": 20},
                      "text": {"fontSize": 20}}
PRESENTATION_GRADIENT = (300, 22)  # px: a colour bar's length and thickness on a projector
LAPTOP_LABEL_PX = 12  # Streamlit's theme: axis and legend labels

FONT_KEYS = frozenset({"fontSize", "labelFontSize", "titleFontSize", "subtitleFontSize"})
# pixel lengths that grow with the chart in presentation mode (not positions in data units, never inside data)
LENGTH_KEYS = frozenset({"width", "height", "labelLimit", "titleLimit", "limit", "dx", "dy", "size", "strokeWidth",
                         "labelPadding", "titlePadding", "offset", "cornerRadius", "symbolSize", "gradientThickness"})
SKIP_KEYS = frozenset({"data", "datasets", "params", "scale", "value", "condition", "$schema", "usermeta", "config",
                       "selection", "transform", "sort", "tooltip", "bind"})
VIEW_KEYS = ("layer", "hconcat", "vconcat", "concat")
AREA_MARKS = ("point", "circle", "square")
LEGEND_CHANNELS = ("color", "fill", "stroke", "size", "opacity", "shape")


@dataclass(frozen=True)
class Screen:
    """Where a chart is shown: a laptop (the default) or a projector (presentation mode)."""

    presentation: bool = False


@dataclass(frozen=True)
class Fitted:
    """A chart ready for ``st.vega_lite_chart``: its spec, and its width (pixels: drawn at most that wide, narrower
    when its column is; or "stretch": as wide as the column)."""

    spec: dict
    width: int | str


def fitted(chart: alt.TopLevelMixin, screen: Screen = Screen(), stretch: bool = False) -> Fitted:
    """``chart`` as a spec fitted to ``screen`` (see the module docstring). ``stretch``: as wide as its column,
    whatever the chart's own width (line charts, bars over a whole sentence)."""
    spec = chart.to_dict()
    config = spec.setdefault("config", {})
    view = config.get("view", {})
    for default in ("continuousWidth", "continuousHeight"):  # Altair's own theme: the page's theme decides
        view.pop(default, None)
    if not view:
        config.pop("view", None)
    # every token on a token axis: builders that thin labels on purpose say so on the axis itself
    config.setdefault("axisDiscrete", {}).setdefault("labelOverlap", False)
    single = not any(key in spec for key in ("hconcat", "vconcat", "concat", "facet", "repeat"))
    if single:
        spec["autosize"] = {"type": "fit-x", "contains": "padding"}
    scale = 1.0
    if screen.presentation:
        scale = _presentation_scale(spec)
        _grow(spec, scale)
        for part, fonts in PRESENTATION_FONTS.items():
            for name, size in fonts.items():
                current = config.setdefault(part, {}).get(name)
                config[part][name] = max(size, round(current * FONT_SCALE)) if current else size
        config["legend"].setdefault("gradientLength", PRESENTATION_GRADIENT[0])  # a colour bar as tall as a plot
        config["legend"].setdefault("gradientThickness", PRESENTATION_GRADIENT[1])
        spec.setdefault("usermeta", {}).setdefault("embedOptions", {})["renderer"] = "svg"
    if stretch or not single:
        return Fitted(spec, "stretch" if single else "content")
    width = natural_width(spec, screen)
    return Fitted(spec, "stretch" if width is None else max(int(round(width)), 1))


def _presentation_scale(spec: dict) -> float:
    """How much a chart grows on a projector: ``SIZE_SCALE``, less when that would make its tallest view taller
    than ``MAX_PRESENTATION_HEIGHT`` (never less than 1: a chart is never smaller than on a laptop)."""
    heights = [h for h in _view_sizes(spec, "height") if isinstance(h, (int, float))]
    tallest = max(heights, default=0)
    if tallest * SIZE_SCALE <= MAX_PRESENTATION_HEIGHT:
        return SIZE_SCALE
    return max(1.0, MAX_PRESENTATION_HEIGHT / tallest)


def _view_sizes(spec: dict, key: str) -> list:
    sizes = [spec[key]] if key in spec else []
    for part in VIEW_KEYS:
        for child in spec.get(part, []):
            sizes += _view_sizes(child, key)
    return sizes


def _grow(node: Any, scale: float, parent: str = "") -> None:
    """Every font and pixel length in ``node`` (a spec, in place) scaled for a projector; data never touched. A
    point's ``size`` is an area (it grows by the square), a tick's or a bar's a length."""
    if isinstance(node, list):
        for item in node:
            _grow(item, scale, parent)
        return
    if not isinstance(node, dict):
        return
    area = node.get("type") in AREA_MARKS or parent == "point"
    for key, value in node.items():
        if key in SKIP_KEYS:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            _grow(value, scale, key)
        elif key in FONT_KEYS:
            node[key] = max(MIN_PRESENTATION_FONT, round(value * FONT_SCALE))
        elif key in LENGTH_KEYS:
            squared = key == "symbolSize" or (key == "size" and area)
            node[key] = round(value * (scale * scale if squared else scale), 1)


# --- how wide a chart is, axes and legend included ---------------------------------------------------------------

def natural_width(spec: dict, screen: Screen = Screen()) -> float | None:
    """The width a single or layered view takes with its decorations: the plot's width, plus the y axis (its
    labels, from the data, and its title) on the left and the legend on the right. None when the plot has no
    width of its own (it then fills its column). An estimate from character counts: a few pixels off only makes
    the plot a few pixels narrower or wider, never the chart wider than its column."""
    plot = spec.get("width")
    if not isinstance(plot, (int, float)):
        plot = max((w for w in _view_sizes(spec, "width") if isinstance(w, (int, float))), default=None)
    if plot is None:
        return None
    font = _font(spec, screen)
    views = [spec] + list(spec.get("layer", []))
    left = max((_axis_width(view, spec, font) for view in views), default=0.0)
    right = max((_legend_width(view, spec, font) for view in views), default=0.0)
    return plot + left + right + 10  # Vega's padding


def _font(spec: dict, screen: Screen) -> float:
    axis = spec.get("config", {}).get("axis", {})
    return float(axis.get("labelFontSize", PRESENTATION_FONTS["axis"]["labelFontSize"] if screen.presentation
                          else LAPTOP_LABEL_PX))


def _values(spec: dict, view: dict, field: str) -> list:
    data = view.get("data") or spec.get("data") or {}
    rows = spec.get("datasets", {}).get(data.get("name"), data.get("values", []))
    return [row.get(field) for row in rows if isinstance(row, dict)]


def _text_width(values: list, font: float, limit: float | None) -> float:
    longest = max((len(str(v)) for v in values if v is not None), default=4)
    width = 0.6 * font * longest
    return min(width, limit) if limit else width


def _axis_width(view: dict, spec: dict, font: float) -> float:
    y = view.get("encoding", {}).get("y")
    if not isinstance(y, dict) or y.get("axis", {}) is None:
        return 0.0
    axis = y.get("axis") or {}
    label_font = axis.get("labelFontSize", font)
    if y.get("type") in ("nominal", "ordinal") and "field" in y:
        labels = _text_width(_values(spec, view, y["field"]), label_font, axis.get("labelLimit", 100 * font / 12))
    else:
        labels = 0.6 * label_font * 6  # "0.0001", "1.2e+3"
    title = 0 if y.get("title", axis.get("title", "")) is None else axis.get("titleFontSize", font) * 1.6
    return labels + title + 8


def _legend_width(view: dict, spec: dict, font: float) -> float:
    widest = 0.0
    for channel in LEGEND_CHANNELS:
        encoding = view.get("encoding", {}).get(channel)
        if not isinstance(encoding, dict):
            continue
        encoding = encoding.get("condition", encoding) if "field" not in encoding else encoding
        if not isinstance(encoding, dict) or "field" not in encoding or encoding.get("legend", {}) is None:
            continue
        legend = encoding.get("legend") or {}
        if legend.get("orient", "right") not in ("right", "left"):
            continue
        title = encoding.get("title", legend.get("title", encoding["field"]))
        title_width = 0.6 * legend.get("titleFontSize", font) * len(str(title or ""))
        if encoding.get("type") == "quantitative":
            body = 16 + 0.6 * font * 6
        else:
            body = 24 + _text_width(_values(spec, view, encoding["field"]), font, legend.get("labelLimit", 160))
        widest = max(widest, title_width, body)
    return widest + 16 if widest else 0.0
