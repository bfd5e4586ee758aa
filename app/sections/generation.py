"""The GPT page's generation form (Generate tab): the decoding settings (strategy, length, beams, temperature, top-k,
top-p, seed and the penalties), whether a continuation was generated, and the generated token shown, all kept in the
URL, so a shared link reopens the same continuation at the same step."""
from __future__ import annotations

import streamlit as st

from app import attention_view, display, url_state, widgets
from app.sections import decoding_penalties
from models.core import limits
from models.families.causal_lm.model import STRATEGIES, GenerationSettings
from viz.figures.attention import StepOptions

# widget key -> (GenerationSettings field, URL coercer); each form widget is keyed so its submitted value has a state
FIELDS = {
    "gpt_gen_max_new": ("max_new_tokens", url_state.within(1, limits.MAX_NEW_TOKENS)),
    "gpt_gen_strategy": ("strategy", str),
    "gpt_gen_beams": ("num_beams", url_state.within(2, 8)),
    "gpt_gen_temperature": ("temperature", url_state.within(0.05, 3.0, float)),
    "gpt_gen_top_k": ("top_k", url_state.within(0, 1000)),
    "gpt_gen_top_p": ("top_p", url_state.within(0.05, 1.0, float)),
    "gpt_gen_repetition": ("repetition_penalty", url_state.within(0.5, 3.0, float)),
    "gpt_gen_seed": ("seed", url_state.within(0, 2**31 - 1)),
    "gpt_gen_presence": ("presence_penalty", url_state.within(-2.0, 2.0, float)),
    "gpt_gen_frequency": ("frequency_penalty", url_state.within(-2.0, 2.0, float)),
    "gpt_gen_length": ("length_penalty", url_state.within(-2.0, 5.0, float)),
}
GENERATED = "gpt_generated"  # True once Generate was pressed (or a link says it was)
KEYS = [*FIELDS, GENERATED, "gpt_step", "gpt_gen_layer", "gpt_gen_head"]
COERCE = {**{key: coerce for key, (_, coerce) in FIELDS.items()}, GENERATED: url_state.flag,
          "gpt_step": url_state.within(1, limits.MAX_NEW_TOKENS), "gpt_gen_layer": int}


def form() -> GenerationSettings | None:
    """The generation form; the settings last submitted (or restored from a link), None before the first Generate."""
    with st.form("generation"):
        cols = st.columns(4)
        cols[0].selectbox("Decoding", STRATEGIES, key="gpt_gen_strategy")
        cols[1].number_input("Max new tokens", 1, limits.MAX_NEW_TOKENS, 20, key="gpt_gen_max_new")
        cols[2].number_input("Beams (beam search)", 2, 8, 4, key="gpt_gen_beams")
        cols[3].number_input("Repetition penalty", 0.5, 3.0, 1.0, 0.1, key="gpt_gen_repetition")
        cols = st.columns(4)
        cols[0].number_input("Temperature (sampling)", 0.05, 3.0, 0.8, 0.05, key="gpt_gen_temperature")
        cols[1].number_input("Top-k (sampling, 0 = off)", 0, 1000, 50, key="gpt_gen_top_k")
        cols[2].number_input("Top-p (sampling)", 0.05, 1.0, 0.95, 0.05, key="gpt_gen_top_p")
        cols[3].number_input("Seed", 0, 2**31 - 1, 0, key="gpt_gen_seed")
        decoding_penalties.form_inputs()
        submitted = st.form_submit_button("Generate", type="primary")
    if submitted:
        st.session_state[GENERATED] = True
    if not st.session_state.get(GENERATED):
        return None
    return settings(st.session_state)


def settings(state) -> GenerationSettings:
    """The GenerationSettings that the form's values in ``state`` (session state, or any mapping) describe."""
    defaults = GenerationSettings()
    values = {name: state.get(key, getattr(defaults, name)) for key, (name, _) in FIELDS.items()}
    casts = {name: type(getattr(defaults, name)) for name in values}
    return GenerationSettings(**{name: casts[name](value) for name, value in values.items()})


def step_slider(steps: int) -> int:
    """The generated token shown (1..steps); a link's or an earlier, longer generation's step is brought back in."""
    if not 1 <= st.session_state.get("gpt_step", 1) <= steps:
        st.session_state["gpt_step"] = steps
    return st.slider("Generated token", 1, steps, 1, key="gpt_step")


def show(loaded, inputs, prompt: str) -> None:
    """The Generate tab: the form, then the continuation and one generated token at a time (where the position that
    chose it looked, and the candidates it was chosen from)."""
    if (chosen := form()) is None:
        st.info("Choose the decoding settings and press Generate.")
        return
    with st.spinner("Generating…"):
        generated = widgets.run_or_stop(loaded, inputs, chosen)
    widgets.show_notices(generated)
    st.text(prompt + generated.generated_text)  # plain text: never markup
    if not generated.generation:
        st.info("Nothing was generated (the model ended the text at once).")
        return
    step = step_slider(len(generated.generation))
    layer, head = attention_view.layer_head_picker(generated.maps("self"), key="gpt_gen")
    url_state.publish(KEYS)
    if (figure := widgets.figure_or_none("generation_step", generated, StepOptions(layer, head, step))) is not None:
        display.show(figure, "gpt_gen")  # where it looked beside its candidates, in the figure's own row
    decoding_penalties.show(generated, loaded)
