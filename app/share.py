"""Shareable state and presentation mode.

- Shareable links: a page lists the widget keys that make its figure (model, input, layer, head, options); their
  values live in the URL's query string (``st.query_params``), so a link reproduces the figure. On the first run of
  a session the URL's values are copied into the widgets' state; afterwards every run writes the state back.
- Downloads: ``downloads(...)`` offers a figure as PNG/SVG, its numbers as CSV/JSON and raw maps as ``.npz``, with
  file names that say model, layer, head and input; files are produced only when clicked.
- Presentation mode: larger type, sidebar tucked away, full-width figures, a colour-blind-safe colour scale.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import streamlit as st

from viz import export

MAX_URL_TEXT = 1500  # longer inputs are not put in the URL (browsers and chat apps cut long links)
PRESENTATION_CSS = """
<style>
html, body, [data-testid="stAppViewContainer"] { font-size: 20px; }
[data-testid="stMainBlockContainer"] { max-width: 100%; padding-left: 2rem; padding-right: 2rem; }
h1 { font-size: 2.6rem !important; }
[data-testid="stCaptionContainer"] { font-size: 1rem; }
[data-testid="stVegaLiteChart"] { zoom: 1.4; max-width: 100%; }
[data-testid="stVegaLiteChart"] canvas, [data-testid="stVegaLiteChart"] svg {
  max-width: 100%; height: auto !important; }
</style>
"""  # static: no user text ever goes through unsafe_allow_html


def restore(keys: list[str], coerce: dict[str, Callable] | None = None, names: dict[str, str] | None = None) -> None:
    """Once per session and page: widget state from the URL for ``keys`` (values are strings in a URL).

    ``names`` maps a state key to a shorter URL name (e.g. a per-model key ``tr_layer_<model>`` -> ``tr_layer``)."""
    names = names or {}
    marker = "_restored_" + "|".join(names.get(key, key) for key in keys)
    if st.session_state.get(marker):
        return
    st.session_state[marker] = True
    coerce = coerce or {}
    for key in keys:
        name = names.get(key, key)
        if name in st.query_params:
            value = st.query_params[name]
            try:
                parsed = coerce.get(key, str)(value)
                if isinstance(parsed, float) and not math.isfinite(parsed):  # float("nan"), float("1e309")
                    raise ValueError(f"{name}={value!r} is not a finite number")
                st.session_state[key] = parsed
            except (TypeError, ValueError):
                pass  # a hand-edited link with a bad value: keep the default


def publish(keys: list[str], names: dict[str, str] | None = None) -> None:
    """Write the current values of ``keys`` into the URL (text longer than the URL limit is left out)."""
    names = names or {}
    for key in keys:
        name, value = names.get(key, key), st.session_state.get(key)
        if value is None or (isinstance(value, str) and len(value) > MAX_URL_TEXT):
            st.query_params.pop(name, None)
            continue
        text = str(value)
        if st.query_params.get(name) != text:
            st.query_params[name] = text


# Coercers for ``restore``: a value they refuse (ValueError) leaves the widget at its default. Selectboxes, radios and
# number inputs ignore values outside their options themselves; a slider given one would stop the page.
def within(low: float, high: float, cast: Callable = int) -> Callable[[str], float]:
    """A number from the URL, refused outside ``[low, high]`` (for sliders)."""

    def parse(text: str):
        value = cast(text)
        if not low <= value <= high:
            raise ValueError(f"{value} is outside {low}..{high}")
        return value

    return parse


def flag(text: str) -> bool:
    """A toggle or checkbox: the URL holds ``True`` or ``False``."""
    if text not in ("True", "False"):
        raise ValueError(f"{text!r} is not True or False")
    return text == "True"


def integers(text: str) -> tuple[int, ...]:
    """A tuple or list of integers as ``str`` wrote it: ``(4, 6)`` or ``[0, 3]`` -> ``(4, 6)`` / ``(0, 3)``."""
    inner = text.strip().strip("()[]")
    return tuple(int(part) for part in inner.split(",") if part.strip())


def presentation_toggle() -> bool:
    """Sidebar switch; when on, larger type and full-width figures for a projector. Charts are zoomed too (Vega
    draws axis labels at a fixed 10–11 px): 1.4× where that fits the column, else as wide as the column (a chart is
    scaled down, never cut off); tooltips stay on the right cell either way. It is part of the link, so a lecturer's
    slide link opens in it."""
    restore(["presentation"], {"presentation": flag})
    with st.sidebar:
        on = st.toggle("Presentation mode", key="presentation",
                       help="Larger type, full-width figures and a colour-blind-safe colour scale for projectors.")
    if on:
        st.markdown(PRESENTATION_CSS, unsafe_allow_html=True)
        st.query_params["presentation"] = "True"
    else:
        st.query_params.pop("presentation", None)  # off is the default: keep links short
    return on


def color_scheme() -> str:
    """The heatmap colour scale: cividis (colour-blind safe, survives projectors) in presentation mode."""
    return "cividis" if st.session_state.get("presentation") else st.session_state.get("scheme", "viridis")


def downloads(stem: str, key: str, chart=None, image=None, table=None, payload=None, arrays=None,
              metadata: dict | None = None) -> None:
    """A row of download buttons; each file is made only when its button is clicked.

    Each of ``chart``, ``image``, ``table``, ``payload``, ``arrays`` may be given as a value or as a function that
    returns it: a function is called only on the click, so a page pays nothing per rerun for a 2,048 × 2,048 CSV.
    """
    buttons = []
    if chart is not None:
        buttons.append(("PNG", f"{stem}.png", "image/png", lambda: export.chart_png(resolve(chart))))
        buttons.append(("SVG", f"{stem}.svg", "image/svg+xml", lambda: export.chart_svg(resolve(chart))))
    elif image is not None:
        buttons.append(("PNG", f"{stem}.png", "image/png", lambda: export.image_png(resolve(image))))
    if table is not None:
        buttons.append(("CSV", f"{stem}.csv", "text/csv", lambda: export.csv_bytes(resolve(table))))
    if payload is not None:
        buttons.append(("JSON", f"{stem}.json", "application/json", lambda: export.json_bytes(resolve(payload))))
    if arrays is not None:
        buttons.append(("NPZ", f"{stem}.npz", "application/octet-stream",
                        lambda: export.npz_bytes(resolve(arrays), **(metadata or {}))))
    columns = st.columns(len(buttons) + 3)
    for column, (label, name, mime, make) in zip(columns, buttons):
        column.download_button(label, make, file_name=name, mime=mime, key=f"{key}_dl_{label}",
                               icon=":material/download:", on_click="ignore")


def resolve(value):
    """A download's content: the value itself, or what its function returns."""
    return value() if callable(value) else value
