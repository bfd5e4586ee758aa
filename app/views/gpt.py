"""GPT-style language model: causal self-attention per layer and head, next-token probabilities, generation."""
import streamlit as st

from app import attention_view, display, presentation, url_state, widgets
from app.sections import compare as compare_section
from app.sections import decoding_penalties, generation
from app.sections import faithfulness as faithfulness_section
from app.sections import knockout as knockout_section
from app.sections import patching as patching_section
from models.core.inputs import TextInput
from viz.figures.ablation import AblationOptions
from viz.figures.attention import StepOptions
from viz.figures.lens import LensOptions

PRESETS = {
    "Coreference": "The animal didn't cross the street because it was too tired.",
    "Induction": "Mr and Mrs Dursley of number four, Privet Drive, were proud to say that they were perfectly normal. "
                 "Mr and Mrs Dursley of number four, Privet Drive,",
    "Code": "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(",
    "Counting": "one two three four five six seven eight",
    "Question": "The capital of France is",
}

SHARED = ["model_causal_lm", "max_tokens", "gpt_text", "gpt_layer", "gpt_head", "gpt_statistic", "gpt_tab",
          "gpt_lens_count", "gpt_lens_last", "gpt_ablation_target", "gpt_ablation_mode", "gpt_patch_corrupt",
          "gpt_patch_clean_answer", "gpt_patch_corrupted_answer"] + knockout_section.KEYS + compare_section.KEYS + \
    generation.KEYS
LENS_COUNTS = [8, 16, 32, 64]
url_state.restore(SHARED, {"max_tokens": int, "gpt_layer": int, "gpt_lens_count": int, "gpt_lens_last": int,
                           **knockout_section.COERCE, **compare_section.COERCE, **generation.COERCE})

st.title("Causal self-attention in a language model")
spec = widgets.model_picker("causal_lm")
max_tokens = widgets.token_limit()
widgets.model_card(spec)
loaded = widgets.load_or_stop(spec)
prompt = widgets.text_source(PRESETS, key="gpt", label="Prompt")
if not prompt.strip():
    st.info("Type a prompt above, pick a sample, or upload a .txt file.")
    st.stop()
inputs = TextInput(prompt, max_tokens)

# the lens tab runs only when open (on_change="rerun"): a new prompt does not pay for unembedding every layer
attention_tab, lens_tab, ablation_tab, patching_tab, knockout_tab, compare_tab, faithfulness_tab, generate_tab = \
    st.tabs(["Attention on the prompt", "What each layer predicts", "Which heads matter", "Patching", "Knockout",
             "Compare two runs", "Faithfulness", "Generate and step through"], key="gpt_tab", on_change="rerun")

with attention_tab:
    result = widgets.run_or_stop(loaded, inputs)
    widgets.show_notices(result)
    maps = result.maps("self")
    st.caption(f"{len(result.tokens)} tokens · {maps.num_layers} layers × {maps.num_heads} heads")
    attention_view.explorer(result, "self", key="gpt", loaded=loaded)
    url_state.publish(SHARED)
    st.subheader("Next token")
    if (figure := widgets.figure_or_none("next_token", result)) is not None:
        display.show(figure, "gpt_next", downloads=False)

if lens_tab.open is not False:
    with lens_tab:
        n, kept = len(result.tokens), getattr(result, "residual_start", 0)
        st.caption("The logit lens: the residual stream after each layer, put through the model's own final norm "
                   "and unembedding, as if the model stopped there. " + (
                       f"This long run kept the stream of its last {n - kept} positions only (memory): a window that "
                       f"starts before position {kept} re-runs the model up to its end first." if kept else
                       "Read from the run above, no second forward."))
        left, right = st.columns(2)
        count = left.select_slider("Positions shown", LENS_COUNTS, value=16, key="gpt_lens_count")
        if st.session_state.get("gpt_lens_last", n - 1) > n - 1:  # a link made for a longer text
            st.session_state["gpt_lens_last"] = n - 1
        last = right.slider("Last position", 0, n - 1, n - 1, key="gpt_lens_last") if n > count else n - 1
        with st.spinner("Unembedding every layer…"):
            figure = widgets.figure_or_none("lens", result, LensOptions(count, last, presentation.color_scheme()),
                                            loaded)
        if figure is not None:
            display.show(figure, "gpt_lens")
    url_state.publish(SHARED)

if ablation_tab.open is not False:
    with ablation_tab:
        st.caption("Head ablation: each head of each layer switched off in turn (its output set to zero, or to its "
                   "mean over the prompt), the rest of the model untouched; how much does that change the "
                   "probability of the target token after the prompt?")
        left, right = st.columns(2)
        target = left.text_input("Target token (empty: the model's own top prediction)", key="gpt_ablation_target",
                                 max_chars=40, help="One token, spaces included: ' Paris' and 'Paris' differ.")
        mode = right.radio("Switch a head off by setting its output to", ["zero", "mean"], horizontal=True,
                           key="gpt_ablation_mode")
        maps = result.maps("self")
        with st.spinner(f"Switching off {maps.num_layers * maps.num_heads} heads one at a time (batched)…"):
            figure = widgets.figure_or_none("ablation", result, AblationOptions(target, mode), loaded)
        if figure is not None:
            display.show(figure, "gpt_ablation")
    url_state.publish(SHARED)

if patching_tab.open is not False:
    with patching_tab:
        patching_section.show(result, loaded)
    url_state.publish(SHARED)

if knockout_tab.open is not False:
    with knockout_tab:
        knockout_section.show(result, loaded)
    url_state.publish(SHARED)

if compare_tab.open is not False:
    with compare_tab:
        compare_section.show(result, loaded)
    url_state.publish(SHARED)

if faithfulness_tab.open:  # every explanation of the next token and its deletion/insertion curves (issue 17)
    with faithfulness_tab:
        faithfulness_section.show(widgets.run_or_stop(loaded, inputs), loaded, "gpt_faith")
        url_state.publish(SHARED)

with generate_tab:
    if (settings := generation.form()) is None:
        st.info("Choose the decoding settings and press Generate.")
        st.stop()
    with st.spinner("Generating…"):
        generated = widgets.run_or_stop(loaded, inputs, settings)
    widgets.show_notices(generated)
    st.text(prompt + generated.generated_text)  # plain text: never markup
    if not generated.generation:
        st.info("Nothing was generated (the model ended the text at once).")
        st.stop()
    step = generation.step_slider(len(generated.generation))
    layer, head = attention_view.layer_head_picker(generated.maps("self"), key="gpt_gen")
    url_state.publish(SHARED)
    if (figure := widgets.figure_or_none("generation_step", generated, StepOptions(layer, head, step))) is not None:
        display.show(figure, "gpt_gen")
    decoding_penalties.show(generated, loaded)
