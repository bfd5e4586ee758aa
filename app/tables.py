"""Read-only tables, as a projector needs them.

``st.dataframe`` draws its cells on a canvas at the theme's size (about 14 px), which no stylesheet reaches and which
is one per server, not per session. In presentation mode a table short enough to read aloud is an HTML table instead,
drawn at the page's 18 px (``app/presentation.py``); a longer one keeps the sortable, scrolling data grid, as outside
presentation mode. Number formats are given once, printf-style (``"%.3f"``), and used by both.
"""
from __future__ import annotations

import numbers
from collections.abc import Mapping

import numpy as np
import pandas as pd
import streamlit as st

from app import presentation
from viz.figure import NONE

PRESENTATION_ROWS = 40  # longer tables stay the scrolling grid: a lecture reads a few rows, a researcher sorts many
SCROLL_FROM_ROWS = 12  # past this an HTML table scrolls inside half a 1080-pixel screen, beside its figure
SCROLL_HEIGHT_PX = 540
STYLED_CELLS = 20_000  # larger tables go to the grid as numbers: pandas' Styler renders each cell in Python


def show(data, formats: Mapping[str, str] | None = None, *, height: int | None = None, where=None,
         sortable: bool = False) -> None:
    """``data`` (a DataFrame, a list of row dicts or a dict of columns) without its index, the columns named in
    ``formats`` printed with those printf formats, missing values as a dash; ``where``: a column or container
    (default: the page); ``height`` (pixels) for the scrolling grid; ``sortable``: always the grid, whose columns
    sort on a click (the page says so), even in presentation mode."""
    where = where if where is not None else st
    frame = data if isinstance(data, pd.DataFrame) else pd.DataFrame(data)
    formats = dict(formats or {})
    if presentation.is_on() and len(frame) <= PRESENTATION_ROWS and not sortable:
        tall = len(frame) > SCROLL_FROM_ROWS
        where.table(_styled(frame, formats), hide_index=True,
                    height=SCROLL_HEIGHT_PX if tall else "content")
        return
    sized = {"height": height} if height is not None else {}
    if frame.size <= STYLED_CELLS:  # sorting still uses the numbers; the cells show the formats
        where.dataframe(_styled(frame, formats), hide_index=True, **sized)
    else:  # the corpus page's every-head table of a large model (80 × 64 heads: 81,920 cells)
        numbers_as = {name: st.column_config.NumberColumn(format=spec) for name, spec in formats.items()}
        where.dataframe(frame, hide_index=True, column_config=numbers_as, **sized)


def _styled(frame: pd.DataFrame, formats: dict[str, str]):
    """The frame as text: numbers in the given formats, else to four significant digits; truth values as yes or
    no; missing values as a dash."""
    def formatter(spec: str | None):
        def text(value) -> str:
            if value is None or (isinstance(value, float) and pd.isna(value)):
                return NONE
            if isinstance(value, (bool, np.bool_)):
                return "yes" if value else "no"  # not Python's True and False
            if not isinstance(value, numbers.Real):
                return str(value)
            if spec:
                return spec % value
            return f"{value:,}" if isinstance(value, numbers.Integral) else f"{value:.4g}"
        return text

    return frame.style.format({name: formatter(formats.get(name)) for name in frame.columns})
