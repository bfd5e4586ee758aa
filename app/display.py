"""The one way a figure (``viz.figure.Figure``) reaches the page: its chart(s) or image fitted to their column and to
the screen (a laptop, or a projector in presentation mode: ``viz.screen``), its caption with a key to the token
markers it shows, and a row of labelled download buttons whose files are exactly what ``python -m app.cli`` writes
for the same view.

    figure = widgets.figure_or_none("head", result, options)
    if figure is not None:
        display.show(figure, "gpt_head")

A page hands over the figure and gets everything else; it never draws a figure's parts itself.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import streamlit as st

from app import presentation
from models.core import text
from viz import export, heatmap
from viz.figure import Figure
from viz.screen import Screen, fitted

# What a token label's markers mean (models.core.text.visible_text, viz.heatmap.token_labels)
# What each file holds, said on its button's tooltip
FILE_HELP = {"png": "The figure as a PNG image at print resolution (300 dpi)",
             "svg": "The chart as an SVG vector drawing, for slides and papers",
             "csv": "The numbers behind the figure as a table (CSV, opens in a spreadsheet)",
             "json": "The figure's numbers and settings as JSON (model, input, layer, head, values)",
             "npz": "The raw arrays as a NumPy .npz file, with the model, input and settings"}


def screen() -> Screen:
    """The screen this session draws for: presentation mode is a projector."""
    return Screen(presentation=presentation.is_on())


def show(figure: Figure, key: str, *, downloads: bool = True, caption: bool = True,
         select: str | None = None, part: int | None = None) -> Any:
    """Draw ``figure``: its parts laid out in rows as the figure says (``Figure.rows``), each chart fitted to its
    column; its caption (with a key to ␣ ↵ when its tokens show them) and its downloads.

    ``select``: the widget key of the figure's first chart, whose selections rerun the page (a click on the layer ×
    head chart opens that head); the chart's selection state is returned (None without ``select``). ``part``: only
    that part, for a page that writes its own text between the parts (the steps of a layer); the downloads hold them
    all (``offer``)."""
    state = None
    rows = figure.rows() if part is None else [((figure.shown()[part],), (1.0,))]
    markers: set[str] = set()
    for parts, widths in rows:
        places = [nullcontext()] if len(parts) == 1 else st.columns(widths)
        for place, element in zip(places, parts):
            with place:
                event, seen = _draw(element, figure.width, select if state is None else None)
                state = event if state is None else state
                markers |= seen
    if caption:
        note = " ".join([figure.caption] if figure.caption else [])
        key_text = marker_key(markers)
        key_text = "" if key_text in note else key_text  # the builder's caption says it already
        if note or key_text:
            st.caption((note + " " + key_text).strip())
    if downloads:
        offer(figure, key)
    return state


def _draw(element, width: str, select: str | None) -> tuple[Any, set[str]]:
    """One part: an Altair chart fitted to its column and screen, or an image. Returns the selection state (with
    ``select``) and the token markers its data shows."""
    if not hasattr(element, "to_dict"):
        presenting = presentation.is_on()
        st.image(element, width="stretch" if presenting else "content", output_format="PNG")
        return None, set()
    chart = fitted(element, screen(), stretch=width == "stretch")
    markers = {marker for marker in text.MARKS if _shows(chart.spec, marker)}
    if select is None:
        st.vega_lite_chart(chart.spec, width=chart.width)
        return None, markers
    return st.vega_lite_chart(chart.spec, width=chart.width, on_select="rerun", key=select,
                              selection_mode=picked_selections(chart.spec)), markers


def picked_selections(spec: dict) -> list[str]:
    """The chart's selections a page reruns on: every one but the linked token hover's (``viz.heatmap.HOVER``),
    which only lights tokens and rows inside the chart (a rerun on each pointer move would redraw the page), and
    pan and zoom (``.interactive()``, bound to the scales)."""
    names = []

    def collect(node) -> None:
        if isinstance(node, dict):
            for param in node.get("params", []):
                if "select" in param and not param["name"].startswith(heatmap.HOVER) and param["name"] not in names \
                        and param.get("bind") != "scales":  # pan and zoom: Streamlit renames it, and no rerun
                    names.append(param["name"])
            for key in ("layer", "hconcat", "vconcat", "concat"):
                for child in node.get(key, []):
                    collect(child)

    collect(spec)
    return names


def _shows(spec: dict, marker: str) -> bool:
    """Whether any string in the chart's data contains ``marker``."""
    for rows in spec.get("datasets", {}).values():
        for row in rows if isinstance(rows, list) else []:
            if isinstance(row, dict) and any(isinstance(v, str) and marker in v for v in row.values()):
                return True
    return False


def marker_key(markers: set[str]) -> str:
    """What the blank marks a figure shows mean (models/core/text.whitespace_note, the words captions use); "" for
    none."""
    return text.whitespace_note(markers)


def offer(figure: Figure, key: str) -> None:
    """A row of download buttons for ``figure``, each labelled with its format (PNG, SVG, CSV, JSON, NPZ) and a
    tooltip saying what the file holds; each file is made only when its button is clicked."""
    offers = export.offers(figure)
    if not offers:
        return
    with st.container(horizontal=True, gap="small"):
        for file in offers:
            st.download_button(file.format.upper(), file.make, file_name=file.filename, mime=file.mime,
                               key=f"{key}_dl_{file.format}", icon=":material/download:", on_click="ignore",
                               help=FILE_HELP[file.format], width="content")
