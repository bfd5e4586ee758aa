"""Showing a figure (``viz.figure.Figure``) on a page: its chart or image, its caption, and a row of download buttons
whose files are exactly what ``python -m app.cli`` writes for the same view."""
from __future__ import annotations

import streamlit as st

from viz import export
from viz.figure import Figure


def part(element, width: str = "content", **chart_options) -> None:
    """One drawn part of a figure: an Altair chart at its own size (or stretched to the column), or an image."""
    if hasattr(element, "to_dict"):  # an Altair chart
        st.altair_chart(element, width=width, **chart_options)
    else:
        st.image(element)


def show(figure: Figure, key: str, downloads: bool = True, caption: bool = True) -> None:
    """Draw ``figure`` (its parts side by side, or stacked when ``vertical``), its caption, and its downloads."""
    parts = figure.shown()
    if len(parts) > 1 and not figure.vertical:
        for column, element in zip(st.columns(len(parts)), parts):
            with column:
                part(element, figure.width)
    else:
        for element in parts:
            part(element, figure.width)
    if caption and figure.caption:
        st.caption(figure.caption)
    if downloads:
        offer(figure, key)


def offer(figure: Figure, key: str) -> None:
    """A row of download buttons for ``figure``: PNG (and SVG for a chart), CSV, JSON, NPZ as it has them; each file
    is made only when its button is clicked."""
    offers = export.offers(figure)
    if not offers:
        return
    for column, file in zip(st.columns(len(offers) + 3), offers):
        column.download_button(file.format.upper(), file.make, file_name=file.filename, mime=file.mime,
                               key=f"{key}_dl_{file.format}", icon=":material/download:", on_click="ignore")
