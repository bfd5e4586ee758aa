"""The GPT page's activation-patching tab: a corrupted prompt of the same length, run with one clean activation at a
time (models.analysis.patching)."""
from __future__ import annotations

import streamlit as st

from app import display, widgets
from viz.figures.patching import PatchingOptions

PAIR = ("The Eiffel Tower is in the city of", "The Colosseum is in the city of")  # 9 SmolLM2 tokens each


def use_pair() -> None:
    st.session_state["gpt_text"], st.session_state["gpt_patch_corrupt"] = PAIR


def show(result, loaded) -> None:
    st.caption("Activation patching: run a corrupted prompt (the same number of tokens, one fact changed) with "
               "one activation taken from the prompt above, and see how much of the clean answer comes back.")
    corrupt = st.text_input("Corrupted prompt", key="gpt_patch_corrupt", max_chars=400)
    st.button("Try: Eiffel Tower → Colosseum", on_click=use_pair, key="gpt_patch_pair")
    left, right = st.columns(2)
    clean_answer = left.text_input("Clean answer (empty: the prompt's top prediction)",
                                   key="gpt_patch_clean_answer", max_chars=40)
    corrupted_answer = right.text_input("Corrupted answer (empty: its top prediction)",
                                        key="gpt_patch_corrupted_answer", max_chars=40)
    if not corrupt.strip():
        st.info("Type a corrupted prompt, or try the example.")
        return
    with st.spinner("Patching every layer at every position, and every head…"):
        figure = widgets.figure_or_none("patching", result, PatchingOptions(corrupt, clean_answer, corrupted_answer),
                                        loaded)
    if figure is not None:
        display.show(figure, "gpt_patching")
