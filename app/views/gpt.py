"""GPT-style language model: causal self-attention per layer and head, next-token probabilities, generation."""
import streamlit as st

from app import attention_view, display, presentation, url_state, widgets
from app.sections import compare as compare_section
from app.sections import generation
from app.sections import faithfulness as faithfulness_section
from app.sections import knockout as knockout_section
from app.sections import patching as patching_section
from app.sections import why as why_section
from models.analysis.showcase import Sample
from models.core.inputs import TextInput
from models.families.causal_lm import model as causal_lm
from viz.figures.ablation import AblationOptions
from viz.figures.lens import LensOptions

# Each sample opens on the head that shows its lesson, measured on the run in view (models/analysis/showcase.py).
# On SmolLM2-135M: coreference layer 13 head 8 ("it" -> "animal", 0.75), induction 18/6 (0.54, also its strongest
# on repeated random tokens, models/analysis/roles.py), code 17/5 (induction, 0.48), counting 11/1 (previous token,
# 0.88), question 23/4 ("is" -> "France", 0.90).
SAMPLES = {
    "Coreference": Sample("The animal didn't cross the street because it was too tired.", "word", "it", "animal",
                          "it resolves 'it' to the animal that was too tired"),
    "Induction": Sample("Mr and Mrs Dursley of number four, Privet Drive, were proud to say that they were perfectly "
                        "normal. Mr and Mrs Dursley of number four, Privet Drive,", "induction",
                        lesson="an induction head: it finds where the current token appeared before and looks at what "
                               "came next, which is how the model continues text it has seen (Olsson et al. 2022)"),
    "Code": Sample("def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(",
                   "induction", lesson="an induction head: code repeats itself, and this head looks up what followed "
                                       "the same tokens before, such as the argument after 'fibonacci('"),
    "Counting": Sample("one two three four five six seven eight", "previous_token",
                       lesson="a previous-token head: each number reads the one before it, a first step towards "
                              "continuing the sequence"),
    "Question": Sample("The capital of France is", "word", key="France",
                       lesson="the last word reads the country the question is about, where the answer comes from"),
    "Beyond the window": Sample(
        causal_lm.long_sample(), "word", key=causal_lm.LONG_SAMPLE_NAME, max_tokens=causal_lm.LONG_SAMPLE_TOKENS,
        lesson="the last word reaches back almost 600 tokens to the keeper's name. In Gemma 3 (in the sidebar) only "
               "the global layers can: its local layers, five of every six, see only their last 512 tokens, and "
               "their maps stop in a band along the diagonal"),
}
PRESETS = {name: sample.text for name, sample in SAMPLES.items()}
TOKEN_LIMITS = {name: sample.max_tokens for name, sample in SAMPLES.items() if sample.max_tokens}

SHARED = ["model_causal_lm", "max_tokens", "gpt_text", "gpt_layer", "gpt_head", "gpt_statistic", "gpt_tab",
          "gpt_lens_count", "gpt_lens_last", "gpt_ablation_target", "gpt_ablation_mode", "gpt_patch_corrupt",
          "gpt_patch_clean_answer", "gpt_patch_corrupted_answer"] + knockout_section.KEYS + compare_section.KEYS + \
    generation.KEYS + why_section.keys("gpt")
LENS_COUNTS = [8, 16, 32, 64]
url_state.restore(SHARED, {"max_tokens": int, "gpt_layer": int, "gpt_head": url_state.choice("head"),
                           "gpt_lens_count": int, "gpt_lens_last": int,
                           **knockout_section.COERCE, **compare_section.COERCE, **generation.COERCE,
                           **why_section.coerce("gpt")})

st.title("Causal self-attention in a language model")
spec = widgets.model_picker("causal_lm")
max_tokens = widgets.token_limit()
widgets.model_card(spec)
loaded = widgets.load_or_stop(spec)
prompt = widgets.text_source(PRESETS, key="gpt", label="Prompt", token_limits=TOKEN_LIMITS)
if not prompt.strip():
    st.info("Type a prompt above, pick a sample, or upload a .txt file.")
    widgets.stop()
inputs = TextInput(prompt, max_tokens)

# the lens tab runs only when open (on_change="rerun"): a new prompt does not pay for unembedding every layer
attention_tab, why_tab, lens_tab, ablation_tab, patching_tab, knockout_tab, compare_tab, faithfulness_tab, \
    generate_tab = st.tabs(["Attention on the prompt", "Why this head looks here", "What each layer predicts",
                            "Which heads matter", "Patching", "Knockout", "Compare two runs", "Faithfulness",
                            "Generate and step through"], key="gpt_tab", on_change="rerun")

with attention_tab:
    result = widgets.run_or_stop(loaded, inputs)
    widgets.show_notices(result)
    maps = result.maps("self")
    st.caption(f"{len(result.tokens)} tokens · {maps.num_layers} layers × {maps.num_heads} heads")
    attention_view.explorer(result, "self", key="gpt", loaded=loaded, samples=SAMPLES, text=prompt)
    url_state.publish(SHARED)
    st.subheader("Next token")
    if (figure := widgets.figure_or_none("next_token", result)) is not None:
        display.show(figure, "gpt_next", downloads=False)

if why_tab.open is not False:
    with why_tab:
        why_section.show(result, loaded, "gpt")
    url_state.publish(SHARED)

if lens_tab.open is not False:
    with lens_tab:
        n, kept = len(result.tokens), getattr(result, "residual_start", 0)
        st.caption("The logit lens: the residual stream after each layer, put through the model's own final norm "
                   "and unembedding, as if the model stopped there. " + (
                       f"This run kept the stream of its last {n - kept} positions only (a long prompt's whole "
                       f"stream, or on a GPU its copy, costs more than a forward): a window that starts before "
                       f"position {kept} re-runs the model up to its end first." if kept else
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
        heads, options = maps.num_layers * maps.num_heads, AblationOptions(target, mode)
        if widgets.asked("gpt_ablation", f"Switch off each of the {heads} heads", f"Switching off each of the {heads} "
                         "heads in turn", heads, len(result.tokens), loaded, (result.run_id, options)):
            with st.spinner(f"Switching off {heads} heads one at a time (batched)…"), \
                    widgets.timed(loaded, heads, len(result.tokens)):
                figure = widgets.figure_or_none("ablation", result, options, loaded)
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
    generation.show(loaded, inputs, prompt)
