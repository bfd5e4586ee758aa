"""How attention works, step by step, and what it costs: one small layer on a real sentence, the mask zoo, the
memory argument behind FlashAttention, windows and KV-cache tricks. Built for a lecturer at a projector.

No model is loaded: every figure is a view of viz/figures/mechanics.py drawn from the widgets' values, the same
figures ``python -m app.cli --page mechanics`` writes.
"""
import streamlit as st

from app import display, presentation, resources, url_state, widgets
from app.sections import linear_attention, norm_placement
from app.sections import why as why_section
from models.lessons import cost, mechanics
from viz.figures.mechanics import (
    EntropyOptions,
    HeadsOptions,
    KVOptions,
    MaskOptions,
    MemoryOptions,
    StepsOptions,
    SwinOptions,
    ZooOptions,
)
from viz.mechanics_charts import unique_labels

PRESETS = {
    "Tired animal": "The animal didn't cross the street because it was too tired to walk.",
    "River bank": "She sat on the bank of the river and watched the water.",
    "Short": "Attention is all you need.",
}

# what a link carries: the sentence, the layer's settings, the mask and its settings, the step and head shown
SHARED = ["mechanics_text", "mech_view", "mech_source", "mech_d", "mech_heads", "mech_dk", "mech_seed", "mech_scaled",
          "mech_mask", "mech_window_causal", "mech_global", "mech_grid", "mech_swin_m", "mech_mode", "mech_other",
          "mech_head", "mech_all_steps", "mech_step"]
BY_LENGTH = ["mech_real", "mech_prefix", "mech_window", "mech_stride"]  # sliders up to the token count
COST = ["cost_n", "cost_h", "cost_l", "cost_dtype", "cost_b", "kv_tokens", "kv_dtype"]
url_state.restore(SHARED + COST, {
    "mech_d": int, "mech_heads": int, "mech_dk": int, "mech_seed": int, "mech_scaled": url_state.flag,
    "mech_window_causal": url_state.flag, "mech_global": lambda text: list(url_state.integers(text)),
    "mech_grid": url_state.integers, "mech_swin_m": int, "mech_head": int, "mech_all_steps": url_state.flag,
    "mech_step": int, "cost_n": int, "cost_h": int, "cost_l": int, "cost_b": int, "kv_tokens": int})
st.title("How attention works — and what it costs")
st.latex(r"\operatorname{Attention}(Q,K,V)=\operatorname{softmax}\!\left(\frac{QK^{\top}}{\sqrt{d_k}}+M\right)V")
sentence = widgets.text_source(PRESETS, key="mechanics", label="Sentence", height=68)
c1, c2, c3, c4, c5, c6 = st.columns(6)
source = c1.selectbox("Embeddings", list(mechanics.EMBEDDING_SOURCES), key="mech_source",
                      format_func=mechanics.EMBEDDING_SOURCES.get)
d_model = c2.select_slider("Model width D", [4, 6, 8, 12, 16], value=8, key="mech_d")
heads = c3.select_slider("Heads H", [1, 2, 3, 4, 8], value=2, key="mech_heads")
d_head = c4.select_slider("Head width d_k", [1, 2, 4, 8, 16, 32, 64, 128, 256, 512], value=4, key="mech_dk")
seed = int(c5.number_input("Seed", 0, 9999, 0, key="mech_seed"))
scaled = c6.toggle("Divide by √d_k", value=True, key="mech_scaled")
try:
    tokens = resources.mechanics_tokens(sentence)
except ValueError as error:
    widgets.show_error(error)
    st.stop()
st.caption(mechanics.describe_embeddings(len(tokens), source))
n, labels = len(tokens), unique_labels(tokens)
url_state.restore(BY_LENGTH, {key: url_state.within(0 if key == "mech_prefix" else 1, n) for key in BY_LENGTH})
tab_steps, tab_masks, tab_cost, tab_linear, tab_norm, tab_why = st.tabs(
    ["① Step by step", "② Masks", "③ Cost", "④ Linear attention", "⑤ Pre-LN vs Post-LN", "⑥ Why a head looks there"],
    key="mech_view", on_change="rerun")


def mask_settings(kind: str) -> dict:
    """The chosen mask's settings (``LayerOptions`` fields), asked for under the mask picker."""
    p1, p2, p3 = st.columns(3)
    if kind == "padding":
        return {"real_tokens": p1.slider("Real tokens (the rest are [PAD])", 1, n, max(1, n - n // 4), key="mech_real")}
    if kind == "prefix_lm":
        return {"prefix": p1.slider("Prefix length", 0, n, n // 3, key="mech_prefix")}
    if kind == "strided":
        return {"stride": p1.slider("Stride", 1, n, min(3, n), key="mech_stride")}
    if kind in ("sliding_window", "global_local"):
        window = p1.slider("Window", 1, n, min(3, n), key="mech_window")
        if kind == "sliding_window":
            return {"window": window, "causal": p2.toggle("Causal", value=True, key="mech_window_causal")}
        return {"window": window, "global_tokens": tuple(p2.multiselect(
            "Global tokens", range(n), default=[0], key="mech_global", format_func=lambda i: labels[i]))}
    if kind != "swin":
        return {}
    rows, cols = p1.selectbox("Token grid (rows × cols)", mechanics.grid_shapes(n), key="mech_grid",
                              format_func=lambda rc: f"{rc[0]} × {rc[1]}")
    window = p2.selectbox("Window M", mechanics.common_windows(rows, cols) or [1], key="mech_swin_m")
    url_state.restore(["mech_shift"], {"mech_shift": url_state.within(0, window - 1)})  # a link's shift fits M
    shift = p3.slider("Shift s", 0, window - 1, window // 2, key="mech_shift") if window > 1 else 0
    if window == 1:
        st.info(f"No window M > 1 divides both sides of a {rows} × {cols} grid: pick another grid, or a sentence "
                "whose token count has a square-ish factorisation (16 = 4 × 4, 12 = 2 × 6).")
    return {"grid_rows": rows, "swin_window": window, "shift": shift}


with tab_masks:  # the mask is chosen here and used by the step-by-step tab too
    kind = st.radio("Mask", list(mechanics.MASK_KINDS), horizontal=True, key="mech_mask",
                    format_func=lambda k: mechanics.MASK_KINDS[k].title)
    st.caption(mechanics.MASK_KINDS[kind].used_by)
    settings = mask_settings(kind)
layer = dict(sentence=sentence, source=source, d_model=d_model, heads=heads, d_head=d_head, seed=seed, scaled=scaled,
             mask=kind, **settings)  # the toy layer's options, shared by every view below
scheme = presentation.color_scheme()

with tab_steps:
    other, keys = None, n  # keys: how many keys the scores have (the other sequence's tokens in cross-attention)
    # one row of controls, then the step's figure, then the table of every step's shape: a projector opens on a figure
    attention_column, head_column, step_column, all_column = st.columns([2, 2, 5, 2])
    mode = attention_column.radio("Attention", ["Self-attention", "Cross-attention"], horizontal=True,
                                  key="mech_mode")
    head = head_column.radio("Head shown", range(heads), horizontal=True, key="mech_head",
                             format_func=lambda h: f"head {h}")
    if mode == "Cross-attention":
        other = st.text_input("Keys and values come from", "A tired dog stays at home.", key="mech_other")
        try:
            keys = len(resources.mechanics_tokens(other))
        except ValueError as error:
            widgets.show_error(error)
            st.stop()
        setting = ("Queries from the sentence, keys and values from the other sequence (as a translation decoder reads "
                   "its encoder): the scores are N × M and no mask applies.")
    else:
        setting = f"Mask (chosen in the Masks tab): **{mechanics.MASK_KINDS[kind].title}**."
    steps = mechanics.step_outline(mechanics.LayerConfig(d_model, heads, d_head, scaled, seed), n, keys,
                                   other is not None, mechanics.mask_value(kind if other is None else "none"))
    everything = all_column.toggle("Show every step at once", value=False, key="mech_all_steps")
    first = [step.key for step in steps].index("q" if other is not None else "qkv")
    chosen = steps if everything else [steps[step_column.select_slider(
        "Step", range(len(steps)), value=first, key="mech_step", format_func=lambda i: steps[i].title)]]
    options = StepsOptions(**layer, other=other, head=head, step="" if everything else chosen[0].key,
                           all_steps=everything)
    if (figure := widgets.figure_or_none("layer_steps", None, options)) is not None:
        for part, step in enumerate(chosen):
            if everything:  # one step: the slider names it
                st.markdown(f"#### {step.title}")
            st.latex(step.latex)
            st.caption(f"Shape: {step.shape}" + (f" — head {head} of {heads} shown" if step.per_head else "")
                       + (f". {setting}" if part == 0 else ""))
            display.show(figure, "mech_steps", part=part, downloads=False)
        display.offer(figure, "mech_steps")
    with st.expander("The layer as four matrix multiplications (①–④), with this sentence's shapes",
                     expanded=not presentation.is_on()):
        st.table({"step": [step.title for step in steps], "shape": [step.shape for step in steps]}, hide_index=True)

    st.subheader("Why divide by √d_k")
    if (figure := widgets.figure_or_none("entropy_by_d_k", None, EntropyOptions(**layer, other=other))) is not None:
        st.markdown(figure.caption)
        display.show(figure, "mech_entropy", downloads=False, caption=False)

    st.subheader("Multi-head vs single head")
    figure = widgets.figure_or_none("multi_vs_single_head", None, HeadsOptions(**layer, scheme=scheme))
    if figure is not None:
        display.show(figure, "mech_multihead")

with tab_masks:
    st.markdown(f"The same scores (head {head}) with {'−100' if kind == 'swin' else '−∞'} where the mask hides a key, "
                "then the softmax: hidden keys get 0 and every row still sums to 1.")
    figure = widgets.figure_or_none("masked_softmax", None, MaskOptions(**layer, head=head, scheme=scheme))
    if figure is not None:
        display.show(figure, "mech_masks")
    if kind == "swin" and settings["swin_window"] > 1:
        st.markdown("**How Swin builds it:** roll the token grid by −s, number the regions the roll glued together "
                    "(slices 0:−M, −M:−s, −s:), and add −100 between different ids inside each M × M window.")
        st.caption("The tokens after the cyclic shift, with Swin's region ids; thick lines: the M × M windows.")
        if (figure := widgets.figure_or_none("swin_mask_regions", None, SwinOptions(sentence, **settings))) is not None:
            display.show(figure, "mech_swin", downloads=False)
    st.markdown("#### The whole zoo on this sentence")
    if (figure := widgets.figure_or_none("mask_zoo", None, ZooOptions(n))) is not None:
        display.show(figure, "mech_zoo")


@st.fragment
def cost_tab() -> None:
    """Its own fragment: the calculator's inputs rerun only this tab."""
    st.latex(r"\text{maps} = B\cdot L\cdot H\cdot N^2 \qquad \text{FlashAttention keeps } B\cdot L\cdot H\cdot N "
             r"\text{ float32 statistics}")
    k1, k2, k3, k4, k5 = st.columns(5)
    try:
        calc = cost.attention_cost(int(k1.number_input("Tokens N", 1, 10_000_000, 197, key="cost_n")),
                                   int(k2.number_input("Heads H", 1, 1024, 12, key="cost_h")),
                                   int(k3.number_input("Layers L", 1, 1024, 12, key="cost_l")),
                                   k4.selectbox("Precision", list(cost.DTYPE_BYTES), key="cost_dtype"),
                                   int(k5.number_input("Batch B", 1, 4096, 1, key="cost_b")))
    except ValueError as error:
        widgets.show_error(error)
        return
    for column, metric in zip(st.columns(3), cost.calculator_metrics(calc)):
        column.metric(metric.label, metric.value, metric.detail, delta_color="off", delta_arrow="off")
    st.caption(cost.lecture_vit_note())
    memory = MemoryOptions(calc.heads, calc.layers, calc.dtype, calc.batch)
    if (figure := widgets.figure_or_none("attention_memory", None, memory)) is not None:
        display.show(figure, "cost_memory")

    st.subheader("Worked examples (computed, not typed)")
    for example in cost.worked_examples():  # the arithmetic; the figure below draws every row's bytes
        st.markdown(f"**{example.title}** — {example.setup}")
        st.latex(example.latex)
        st.table(cost.example_table(example), hide_index=True)  # the numbers a lecturer reads out
        st.caption(example.takeaway)
    if (figure := widgets.figure_or_none("worked_examples", None)) is not None:
        display.show(figure, "cost_examples")  # what `python -m app.cli --page mechanics --view worked_examples` writes

    st.subheader("KV cache: what generation keeps per token")
    st.latex(r"\text{MHA/GQA/MQA: } 2\cdot L\cdot H_{kv}\cdot d_{head}\cdot b \qquad \text{MLA: } L\cdot(d_c+d_h^R)"
             r"\cdot b \quad\text{bytes per token}")
    s1, s2 = st.columns(2)
    kv_tokens = int(s1.number_input("Sequence length", 1, 10_000_000, 4096, key="kv_tokens"))
    kv_dtype = s2.selectbox("Cache precision", list(cost.DTYPE_BYTES), index=1, key="kv_dtype")
    with st.spinner("Reading the models' configs…"):
        figure = widgets.figure_or_none("kv_cache", None, KVOptions(kv_tokens, kv_dtype))
    if figure is not None:
        display.show(figure, "cost_kv", caption=False)
        st.table(figure.table(), hide_index=True)
        if figure.caption:  # the MLA notes, the configs not read
            st.caption(figure.caption)
    url_state.publish(COST)


with tab_cost:
    cost_tab()
if tab_linear.open is not False:  # only the tab on screen computes
    with tab_linear:
        linear_attention.show(layer, head, n, scheme)
if tab_norm.open is not False:
    with tab_norm:
        norm_placement.show()
if tab_why.open is not False:
    with tab_why:
        url_state.restore(why_section.CIRCUIT_KEYS, {"mech_why_block": url_state.within(3, 12),
                                                     "mech_why_seed": int})
        why_section.show_circuit()
        url_state.publish(why_section.CIRCUIT_KEYS)
url_state.publish(SHARED + BY_LENGTH + ["mech_shift"])
