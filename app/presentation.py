"""Presentation mode: larger type, the sidebar tucked away, full-width figures and a colour-blind-safe colour scale,
for a lecture hall's projector. It is part of the link, so a lecturer's slide link opens in it."""
from __future__ import annotations

import streamlit as st

from app import url_state

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


def toggle() -> bool:
    """Sidebar switch; when on, larger type and full-width figures for a projector. Charts are zoomed too (Vega
    draws axis labels at a fixed 10–11 px): 1.4× where that fits the column, else as wide as the column (a chart is
    scaled down, never cut off); tooltips stay on the right cell either way. It is part of the link, so a lecturer's
    slide link opens in it."""
    url_state.restore(["presentation"], {"presentation": url_state.flag})
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
