"""The GPT page's decoding penalties (Generate tab): the penalty inputs of the generation form, and what each
penalty does to the next-token distribution at a chosen step (views in viz/figures/decoding.py)."""
from __future__ import annotations

import streamlit as st

from app import display, tables, url_state, widgets
from viz.figures.decoding import LengthOptions, PenaltyOptions

# SmolLM2-Instruct's chat format: its beams end (<|im_end|>) after 7 to 11 tokens, so α reorders them
CHAT_PROMPT = "<|im_start|>user\nName one colour of the rainbow. One word.<|im_end|>\n<|im_start|>assistant\n"
# the beams' table as the page shows it (the CSV keeps the field names)
BEAM_COLUMNS = {"hypothesis": "hypothesis", "text": "text", "sum_logprob": "Σ log p", "score": "score (Σ log p / L^α)",
                "rank_before": "rank at α = 0", "rank_after": "rank at this α"}
KEYS = ["gpt_pen_step", "gpt_pen_presence", "gpt_pen_frequency", "gpt_pen_repetition", "gpt_pen_alpha"]


def form_inputs() -> tuple[float, float, float]:
    """Inside the generation form: presence and frequency penalties (0 = off) and beam search's length penalty
    (keyed, so they go into the URL with the rest of the form: app/sections/generation.py)."""
    cols = st.columns(4)
    presence = cols[0].number_input("Presence penalty (0 = off)", -2.0, 2.0, 0.0, 0.1, key="gpt_gen_presence")
    frequency = cols[1].number_input("Frequency penalty (0 = off)", -2.0, 2.0, 0.0, 0.1, key="gpt_gen_frequency")
    length = cols[2].number_input("Length penalty α (beam search)", -2.0, 5.0, 1.0, 0.5, key="gpt_gen_length")
    return float(presence), float(frequency), float(length)


def use_chat_prompt() -> None:
    st.session_state["gpt_text"] = CHAT_PROMPT


def show(generated, loaded) -> None:
    """Before/after views of the penalties on ``generated`` (a generation result of ``loaded``)."""
    url_state.restore(KEYS, {"gpt_pen_step": int, "gpt_pen_presence": float, "gpt_pen_frequency": float,
                             "gpt_pen_repetition": float, "gpt_pen_alpha": float})
    steps = len(generated.generation)
    if not 1 <= st.session_state.get("gpt_pen_step", steps) <= steps:  # a link or an earlier, longer generation
        st.session_state["gpt_pen_step"] = steps
    st.subheader("What each penalty does")
    st.latex(r"\text{presence: } \ell_j - \alpha_p[c_j>0]\qquad \text{frequency: } \ell_j - \alpha_f c_j\qquad"
             r"\text{repetition: } \ell_j/\theta \ (\ell_j>0),\ \ell_j\theta \ (\ell_j<0)")
    cols = st.columns(4)
    step = cols[0].number_input("At generated token", 1, steps, steps, key="gpt_pen_step")
    presence = cols[1].number_input("Presence α_p", -2.0, 2.0, 1.0, 0.1, key="gpt_pen_presence")
    frequency = cols[2].number_input("Frequency α_f", -2.0, 2.0, 1.0, 0.1, key="gpt_pen_frequency")
    repetition = cols[3].number_input("Repetition θ", 0.1, 3.0, 1.3, 0.1, key="gpt_pen_repetition")
    options = PenaltyOptions(int(step), float(presence), float(frequency), float(repetition))
    with st.spinner("Reading the model's distribution at that step…"):
        figure = widgets.figure_or_none("decoding_penalties", generated, options, loaded)
    if figure is not None:
        display.show(figure, "gpt_penalties")

    st.subheader("Beam search's length penalty")
    st.latex(r"\text{score}(y) = \frac{\sum_t \log p(y_t \mid y_{<t}, x)}{L^{\alpha}}")
    left, right = st.columns([1, 3])
    alpha = left.number_input("α", -2.0, 5.0, 2.0, 0.5, key="gpt_pen_alpha")
    right.button("Try a chat prompt (beams end at different lengths)", on_click=use_chat_prompt, key="gpt_pen_chat")
    with st.spinner("Beam search with every beam returned…"):
        figure = widgets.figure_or_none("length_penalty", generated, LengthOptions(float(alpha)), loaded)
    if figure is not None:
        display.show(figure, "gpt_length_penalty")
        tables.show(figure.table()[list(BEAM_COLUMNS)].rename(columns=BEAM_COLUMNS))
    url_state.publish(KEYS)
