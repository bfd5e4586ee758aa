"""Presentation mode: a page for a lecture hall's projector. It is part of the link, so a lecturer's slide link opens
in it.

What changes: the sidebar starts tucked away (app/main.py's page config), the header is compact so that the first
figure starts above the fold, type is larger, figures fill their columns with text of at least 18 px (charts are
re-laid out for the projector by ``viz.screen`` when shown: never scaled by CSS, which would put tooltips and clicks on
the wrong cell), and the colour scale is cividis (colour-blind safe, survives projectors), which the sidebar's colour
scale picker shows, so what the sidebar says is what figures use.
"""
from __future__ import annotations

import streamlit as st

from app import url_state

PRESENTATION_SCHEME = "cividis"
DEFAULT_SCHEME = "viridis"

PRESENTATION_CSS = """
<style>
html, body, [data-testid="stAppViewContainer"] { font-size: 18px; }
[data-testid="stMainBlockContainer"] { max-width: 100%; padding: 2.9rem 2rem 2rem 2rem; }
[data-testid="stMainBlockContainer"] [data-testid="stVerticalBlock"] { gap: 0.55rem; }
h1 { font-size: 1.8rem !important; padding: 0 !important; }
h2, h3 { font-size: 1.4rem !important; }
[data-testid="stCaptionContainer"] { font-size: 1rem; }
/* widget labels, options, buttons, tabs, metrics, typed text and inline code: Streamlit draws them at 0.875rem or
   smaller, 15.75 px here; the back of the hall needs the 18 px the figures' text gets */
[data-testid="stMain"] :is(p, label, li, summary, textarea, input, td, th) { font-size: 1rem !important; }
[data-testid="stMain"] [data-baseweb="select"] div { font-size: 1rem !important; }
[data-testid="stMain"] code, [data-testid="stCode"] :is(pre, code, span) { font-size: 1rem !important; }
[data-testid="stFileUploader"] > label { display: none; }
[data-testid="stFileUploaderDropzone"] { padding: 0; min-height: 0; background: none; border: none; }
[data-testid="stFileUploaderDropzoneInstructions"] { display: none; }
[data-testid="stTextArea"] textarea { height: 2.8rem !important; min-height: 2.8rem !important; }
[data-testid="stImage"] img { max-height: 75vh; object-fit: contain; }
</style>
"""  # static: no user text ever goes through unsafe_allow_html


def requested() -> bool:
    """Whether the link asks for presentation mode (read before the page config, to start the sidebar tucked away)."""
    return st.query_params.get("presentation") == "True"


def is_on() -> bool:
    return bool(st.session_state.get("presentation"))


def _switched() -> None:
    """The toggle moved: presentation mode shows cividis, and leaving it gives the colour scale back."""
    _follow(bool(st.session_state.get("presentation")))


def _follow(on: bool) -> None:
    if on and not st.session_state.get("_scheme_presenting"):
        st.session_state["_scheme_before"] = st.session_state.get("scheme", DEFAULT_SCHEME)
        st.session_state["scheme"] = PRESENTATION_SCHEME
    elif not on and st.session_state.get("_scheme_presenting"):
        st.session_state["scheme"] = st.session_state.pop("_scheme_before", DEFAULT_SCHEME)
    st.session_state["_scheme_presenting"] = on


def restore() -> bool:
    """Presentation mode from the link, before the sidebar's widgets are drawn (the colour scale follows it)."""
    url_state.restore(["presentation"], {"presentation": url_state.flag})
    _follow(is_on())
    return is_on()


def toggle() -> bool:
    """The sidebar switch; when on, the presentation stylesheet and the link say so."""
    restore()
    with st.sidebar:
        on = st.toggle("Presentation mode", key="presentation", on_change=_switched,
                       help="For a projector: larger type, the sidebar tucked away, figures filling the screen with "
                            "text readable from the back of the hall, and the colour-blind-safe cividis scale.")
    if on:
        st.markdown(PRESENTATION_CSS, unsafe_allow_html=True)
        st.query_params["presentation"] = "True"
    else:
        st.query_params.pop("presentation", None)  # off is the default: keep links short
    return on


def color_scheme() -> str:
    """The colour scale figures use: the sidebar's, which is cividis in presentation mode unless changed there."""
    return st.session_state.get("scheme", PRESENTATION_SCHEME if is_on() else DEFAULT_SCHEME)
