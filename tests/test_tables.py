"""Read-only tables (app/tables.py): in presentation mode a short table is an HTML table, drawn at the page's 18 px
where the data grid's canvas stays at the theme's 14 px; a long one, and every table outside presentation mode, is
the sortable grid. Numbers read as their formats in both, truth values as yes or no, missing values as a dash."""
from __future__ import annotations

import numpy as np
import pandas as pd
from streamlit.testing.v1 import AppTest

from app import tables


def _page(presentation: bool):
    import numpy as np
    import streamlit as st

    from app import tables

    st.session_state["presentation"] = presentation
    tables.show([{"method": "Grad-CAM", "deletion AUC": 0.123456, "seconds": None},
                 {"method": "<b>random</b>", "deletion AUC": 0.5, "seconds": 1.25}], {"deletion AUC": "%.3f"})
    tables.show({"head": [0, 1], "entropy": [1.5, 2.5]}, sortable=True)  # the page says "click a column to sort"
    tables.show({"key": list(range(tables.PRESENTATION_ROWS + 1)),
                 "weight": np.full(tables.PRESENTATION_ROWS + 1, 0.01)}, {"weight": "%.4f"})


def test_presentation_mode_shows_a_short_table_as_text_the_hall_can_read():
    at = AppTest.from_function(_page, kwargs={"presentation": True}, default_timeout=60).run()
    assert not at.exception, at.exception
    # the short one as text; a sortable one and the long one still the grid
    assert len(at.table) == 1 and len(at.dataframe) == 2
    shown = at.table[0].proto.arrow_data.styler.display_values
    assert shown  # the cells travel as the formatted text
    assert at.dataframe[1].value.shape == (tables.PRESENTATION_ROWS + 1, 2)


def test_outside_presentation_mode_every_table_is_the_sortable_grid():
    at = AppTest.from_function(_page, kwargs={"presentation": False}, default_timeout=60).run()
    assert not at.exception, at.exception
    assert len(at.table) == 0 and len(at.dataframe) == 3
    assert at.dataframe[0].value["deletion AUC"].tolist() == [0.123456, 0.5]  # sorting sees the numbers


def test_cells_read_as_their_formats_and_missing_values_as_a_dash():
    frame = pd.DataFrame({"auc": [0.123456, np.nan], "seen": [True, False], "tokens": np.array([1234, 5], np.int32),
                          "text": ["<b>x</b>", None], "ratio": np.array([3.14159, 2.0], np.float32)})
    styled = tables._styled(frame, {"auc": "%.3f"})
    rows = [[cell["display_value"] for cell in row[1:]] for row in styled._translate(False, False)["body"]]
    assert rows == [["0.123", "yes", "1,234", "<b>x</b>", "3.142"], ["—", "no", "5", "—", "2"]]
