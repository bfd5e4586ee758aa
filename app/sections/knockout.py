"""The GPT page's attention-knockout tab: cut chosen query → key edges in chosen layers (Geva et al. 2023) and see
the prediction change; then the sweep of the last token's edge to every earlier token, window of layers by window."""
from __future__ import annotations

import streamlit as st

from app import display, url_state, widgets
from models.analysis import knockout
from viz.figures.knockout import EXAMPLE, KnockoutOptions, SweepOptions

KEYS = ["gpt_ko_keys", "gpt_ko_from", "gpt_ko_layers", "gpt_ko_target", "gpt_ko_window"]
COERCE = {"gpt_ko_layers": url_state.integers, "gpt_ko_window": int}
FROM = {"the last token": "", "every later token": "later"}


def use_example() -> None:
    st.session_state["gpt_text"], st.session_state["gpt_ko_keys"] = EXAMPLE, "1-3"  # SmolLM2: "E iffel Tower"


def show(result, loaded) -> None:
    st.caption("Attention knockout: remove chosen query → key edges from the attention mask of chosen layers (the "
               "query then spreads its attention over the keys it still sees) and see what the model predicts.")
    tokens = result.tokens
    st.text("Positions:  " + "   ".join(f"{i}:{token}" for i, token in enumerate(tokens)))  # plain text, as typed
    layers = result.maps("self").num_layers
    if len(st.session_state.get("gpt_ko_layers", ())) != 2 or max(st.session_state["gpt_ko_layers"]) >= layers:
        st.session_state["gpt_ko_layers"] = (0, layers - 1)  # another model's, or a link's
    left, middle, right = st.columns([2, 2, 3])
    keys = left.text_input("Key positions to cut", key="gpt_ko_keys", max_chars=60,
                           help="e.g. 2, or 1-3, or 0,4-5 (from 0; -1 = the last token)")
    origin = middle.radio("…from", list(FROM), key="gpt_ko_from")
    first, last = right.slider("In layers", 0, max(layers - 1, 1), key="gpt_ko_layers")
    left, right = st.columns([2, 5])
    target = left.text_input("Target token (empty: the top prediction)", key="gpt_ko_target", max_chars=40)
    right.button("Try: cut 'Eiffel Tower' from the last token", on_click=use_example, key="gpt_ko_example")
    if not keys.strip():
        st.info("Type the key positions to cut (the numbers above), or try the example.")
    else:
        with st.spinner("Running with the edges cut…"):
            figure = widgets.figure_or_none(
                "knockout", result, KnockoutOptions(keys, FROM[origin], first, last, target),
                loaded)
        if figure is not None:
            display.show(figure, "gpt_knockout")
    st.subheader("Sweep: the last token cut off from each token, window by window")
    window = st.slider("Layers cut at once (centred on each layer)", 1, layers, min(5, layers), key="gpt_ko_window")
    n = len(tokens)
    if n > knockout.MAX_SWEEP_TOKENS:
        st.info(f"The sweep runs on prompts of up to {knockout.MAX_SWEEP_TOKENS} tokens ({n} here).")
        return
    options, cuts = SweepOptions(window, target), layers * n
    if not widgets.asked("gpt_ko_sweep", f"Sweep {cuts} cuts", f"Cutting the last token off each of the {n} tokens "
                         f"in each of the {layers} layer windows", cuts, n, loaded, (result.run_id, options)):
        return
    with st.spinner(f"Cutting {cuts} edges one at a time (batched)…"), widgets.timed(loaded, cuts, n):
        figure = widgets.figure_or_none("knockout_sweep", result, options, loaded)
    if figure is not None:
        display.show(figure, "gpt_knockout_sweep")
