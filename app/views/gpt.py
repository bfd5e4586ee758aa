"""GPT-style language model: causal self-attention per layer and head, next-token probabilities, generation."""
import streamlit as st

from app import attention_view, resources, share, widgets
from models import limits
from models.causal_lm import STRATEGIES, GenerationSettings
from viz import heatmap

PRESETS = {
    "Coreference": "The animal didn't cross the street because it was too tired.",
    "Induction": "Mr and Mrs Dursley of number four, Privet Drive, were proud to say that they were perfectly normal. "
                 "Mr and Mrs Dursley of number four, Privet Drive,",
    "Code": "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(",
    "Counting": "one two three four five six seven eight",
    "Question": "The capital of France is",
}

SHARED = ["model_causal_lm", "max_tokens", "gpt_text", "gpt_layer", "gpt_head", "gpt_statistic"]
share.restore(SHARED, {"max_tokens": int, "gpt_layer": int})

st.title("Causal self-attention in a language model")
spec = widgets.model_picker("causal_lm")
max_tokens = widgets.token_limit()
widgets.model_card(spec)
loaded = widgets.load_or_stop(spec)
prompt = widgets.text_source(PRESETS, key="gpt", label="Prompt")
if not prompt.strip():
    st.info("Type a prompt above, pick a sample, or upload a .txt file.")
    st.stop()

attention_tab, generate_tab = st.tabs(["Attention on the prompt", "Generate and step through"])
key = resources.run_key(loaded)

with attention_tab:
    try:
        result = resources.run_causal_lm(loaded, key, prompt, max_tokens)
    except ValueError as error:
        widgets.show_error(error)
        st.stop()
    widgets.show_notices(result)
    st.caption(f"{len(result.tokens)} tokens · {result.maps('self').num_layers} layers × "
               f"{result.maps('self').num_heads} heads")
    st.session_state["gpt_stem"] = (spec.short_name, prompt[:40])
    attention_view.explorer((key, prompt, max_tokens, "prompt"), result, "self", key="gpt")
    share.publish(SHARED)
    st.subheader("Next token")
    top = result.next_token
    st.altair_chart(heatmap.probability_bars([t.token for t in top], [t.probability for t in top],
                                             "Top 10 after the last token"))

with generate_tab:
    with st.form("generation"):
        cols = st.columns(4)
        strategy = cols[0].selectbox("Decoding", STRATEGIES)
        max_new = cols[1].number_input("Max new tokens", 1, limits.MAX_NEW_TOKENS, 20)
        beams = cols[2].number_input("Beams (beam search)", 2, 8, 4)
        penalty = cols[3].number_input("Repetition penalty", 0.5, 3.0, 1.0, 0.1)
        cols = st.columns(4)
        temperature = cols[0].number_input("Temperature (sampling)", 0.05, 3.0, 0.8, 0.05)
        top_k = cols[1].number_input("Top-k (sampling, 0 = off)", 0, 1000, 50)
        top_p = cols[2].number_input("Top-p (sampling)", 0.05, 1.0, 0.95, 0.05)
        seed = cols[3].number_input("Seed", 0, 2**31 - 1, 0)
        submitted = st.form_submit_button("Generate", type="primary")
    settings = GenerationSettings(int(max_new), strategy, int(beams), float(temperature), int(top_k), float(top_p),
                                  float(penalty), int(seed))
    if submitted:
        st.session_state["gpt_generation"] = settings
    if st.session_state.get("gpt_generation") is None:
        st.info("Choose the decoding settings and press Generate.")
        st.stop()
    settings = st.session_state["gpt_generation"]
    try:
        with st.spinner("Generating…"):
            generated = resources.generate_causal_lm(loaded, key, prompt, settings, max_tokens)
    except ValueError as error:
        widgets.show_error(error)
        st.stop()
    widgets.show_notices(generated)
    st.text(prompt + generated.extras["text"])  # plain text: never markup
    if not generated.generation:
        st.info("Nothing was generated (the model ended the text at once).")
        st.stop()
    maps = generated.maps("self")
    step = st.slider("Generated token", 1, len(generated.generation), 1, key="gpt_step")
    chosen = generated.generation[step - 1]
    layer, head = attention_view.layer_head_picker(maps, key="gpt_gen")
    left, right = st.columns([3, 2])
    weights = maps.head(layer, head)[chosen.position]
    visible = slice(0, chosen.position + 1)  # a generated token sees the prompt and the tokens before it
    left.altair_chart(heatmap.token_bars(weights[visible], maps.key_tokens[visible],
                                         f"Step {step}: where '{chosen.token}' looked"))
    right.altair_chart(heatmap.probability_bars([c.token for c in chosen.candidates],
                                                [c.probability for c in chosen.candidates],
                                                f"Candidates at step {step}", highlight=chosen.token))
    st.caption("Attention and probabilities come from one teacher-forced forward over the final text; probabilities "
               "are the model's raw distribution, before temperature, top-k, top-p and repetition penalty.")
