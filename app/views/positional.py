"""Positional encodings lab: why attention needs positions, the formulas, and the encodings inside loaded models.

Each tab is a fragment, so moving one of its sliders reruns that tab only. The formulas come first, so they show
while the models (MiniLM, SmolLM2 or Gemma 3, a ViT) load.
"""
from pathlib import Path

import streamlit as st
from streamlit.errors import StreamlitPageNotFoundError

from app import display, presentation, resources, sidebar, url_state, widgets
from app.sections import rope_scaling
from models import families
from models.lessons import positional as pe
from viz.figure import Figure
from viz.figures.positional import (
    SENTENCE,
    AlibiOptions,
    EquivarianceMapsOptions,
    EquivarianceOptions,
    GridOptions,
    ResizedGridOptions,
    RopeOptions,
    Sinusoidal2DOptions,
    SinusoidalOptions,
    T5Options,
)

ROPE_DIMS = [8, 16, 32, 64, 96, 128, 256]
# widget keys each tab keeps in the URL (a fragment publishes its own: it reruns without the rest of the page)
TABS = ["pos_view"]
WHY = ["perm_sentence", "perm_seed", "perm_setting"]
SINUSOIDAL = ["sin_d", "sin_length", "sin_base", "sin_grid"]
GRID = ["learned_grid", "learned_resize"]
ROPE = ["rope_d", "rope_base", "rope_span"]
BIASES = ["alibi_heads", "alibi_length", "alibi_causal", "t5_buckets", "t5_distance", "t5_length"]
within, flag = url_state.within, url_state.flag
COERCE = {"perm_seed": int, "sin_d": int, "sin_length": within(8, 1024), "sin_base": float, "sin_grid": within(2, 32),
          "learned_resize": within(2, 64), "rope_d": int, "rope_base": float, "rope_span": within(16, 4096),
          "alibi_heads": within(1, 32), "alibi_length": within(4, 64), "alibi_causal": flag, "t5_buckets": int,
          "t5_distance": int, "t5_length": within(8, 512)}


def load(spec):
    """The cached model, or None after saying why it could not load (the rest of the page keeps working)."""
    try:
        return resources.load(spec, *sidebar.device_choice())
    except ValueError as error:
        widgets.show_error(error)


def show(figure: Figure | None, key: str) -> None:
    """A figure laid out as it says (``display.show``), when it could be drawn."""
    if figure is not None:
        display.show(figure, key)


@st.fragment
def equivariance_tab(encoder) -> None:
    st.latex(pe.LATEX["equivariance"])
    sentence = st.text_input("Sentence", SENTENCE, max_chars=300, key="perm_sentence")
    seed = int(st.number_input("Shuffle seed", 0, 9999, 0, key="perm_seed"))
    gaps = widgets.figure_or_none("equivariance", None, EquivarianceOptions(sentence, seed), encoder)
    if gaps is None:
        return
    demo = gaps.payload()
    for notice in demo["notices"]:
        st.warning(notice)
    st.text("Shuffled: " + " ".join(demo["shuffled_tokens"]))  # plain text, never markup
    display.show(gaps, "perm_gap")
    setting = st.radio("Attention maps for", list(demo["output_gap"]), horizontal=True, key="perm_setting")
    show(widgets.figure_or_none("equivariance_maps", None, EquivarianceMapsOptions(
        sentence, seed, setting, presentation.color_scheme()), encoder), "perm")
    url_state.publish(WHY)


@st.fragment
def sinusoidal_tab() -> None:
    st.latex(pe.LATEX["sinusoidal"])
    c1, c2, c3 = st.columns(3)
    dim = c1.select_slider("d (channels)", [16, 32, 64, 128, 192, 256, 384, 512, 768, 1024], 128, key="sin_d")
    length = c2.slider("Length (positions)", 8, 1024, 128, key="sin_length")
    base = c3.number_input("Base b", 2.0, 1e8, 10000.0, key="sin_base", format="%g")
    show(widgets.figure_or_none("sinusoidal", options=SinusoidalOptions(dim, length, base)), "sin")
    st.subheader("2-D variant for image patches")
    side = st.slider("Patch grid (rows = columns)", 2, 32, 14, key="sin_grid")
    show(widgets.figure_or_none("sinusoidal_2d", options=Sinusoidal2DOptions(dim, side, base)), "sin2d")
    url_state.publish(SINUSOIDAL)


@st.fragment
def grid_tab() -> None:
    st.subheader("Image patches: a ViT's position grid (ViT paper, Fig. 7)")
    choices = {spec.label: spec for spec in families.specs("vit") if spec.offline}
    choices |= {"2-D sinusoidal (formula)": "sinusoidal", f"timm {pe.UNTRAINED_VIT}, untrained (random init)":
                "untrained"}
    picked = choices[st.radio("Grid", list(choices), horizontal=True, key="learned_grid")]
    source, vision = (picked, None) if isinstance(picked, str) else ("model", load(picked))
    if source == "model" and vision is None:
        return
    if source == "untrained":
        st.warning("This grid comes from an untrained model: random numbers, no structure yet — what training "
                   "starts from. Compare with a trained ViT or the 2-D sinusoidal grid.")
    with st.spinner("Reading the grid…"):
        grid = widgets.figure_or_none("position_grid", None, GridOptions(source), vision)
    if grid is None:
        return
    found = grid.payload()
    for note in found["notes"]:
        st.caption(note)
    new_side = st.slider("Interpolate to a grid of (side)", 2, 64, 2 * found["grid"][0], key="learned_resize")
    show(widgets.figure_or_none("position_grid_resized", None, ResizedGridOptions(source, new_side), vision),
         "learned_grid")
    url_state.publish(GRID)
    st.caption("Each tile: one patch's cosine similarity with all patches (every few patches shown; blue low, red "
               "high, dot = the patch). "
               "Right: the grid resized bicubically (timm's resample_abs_pos_embed), as a ViT does for a new image "
               "size: an enlarged grid blends neighbours, so adjacent patches become near-duplicates.")


@st.fragment
def rope_tab() -> None:
    st.latex(pe.LATEX["rope"])
    c1, c2, c3 = st.columns(3)
    head_dim = c1.select_slider("Head dimension d", ROPE_DIMS, 64, key="rope_d")
    base = c2.number_input("Base b (rope_theta)", 2.0, 1e8, 10000.0, key="rope_base", format="%g")
    span = c3.slider("Offsets shown (±)", 16, 4096, 512, key="rope_span")
    options = RopeOptions(head_dim, base, span)
    show(widgets.figure_or_none("rope", options=options), "rope")
    show(widgets.figure_or_none("rope_decay", options=options), "rope_decay")
    url_state.publish(ROPE)


def rope_model_view(model) -> None:
    st.subheader(f"RoPE in {model.spec.key}")
    if (figure := widgets.figure_or_none("rope_in_model", None, None, model)) is None:
        return
    found = figure.payload()
    facts = list(found["facts"].items())
    per_row = 3 if len(facts) > 5 else len(facts)  # Gemma 3's two bases: two rows of three fit a laptop's width
    for start in range(0, len(facts), per_row):
        for column, (label, value) in zip(st.columns(per_row), facts[start:start + per_row]):
            column.metric(label, value)
    settings = {"rope_base": found["theta"]} | ({"rope_d": found["rotary_dim"]}
                                                if found["rotary_dim"] in ROPE_DIMS else {})
    st.button("Use these settings in the charts above" + (" (the global layers' base)" if found["by_layer_type"]
                                                          else ""),
              on_click=st.session_state.update, kwargs=settings)
    if found["by_layer_type"]:  # a base per kind of layer (Gemma 3): their wavelengths side by side
        display.show(figure, "rope_model")
    else:
        st.caption(figure.caption)


@st.fragment
def bias_tab() -> None:
    st.latex(pe.LATEX["alibi"])
    c1, c2, c3 = st.columns(3)
    heads = c1.slider("Heads H", 1, 32, 8, key="alibi_heads")
    length = c2.slider("Length", 4, 64, 16, key="alibi_length")
    causal = c3.toggle("Causal (decoder)", True, key="alibi_causal")
    show(widgets.figure_or_none("alibi", options=AlibiOptions(heads, length, causal)), "alibi")
    st.subheader("T5 relative-position buckets")
    st.latex(pe.LATEX["t5"])
    c1, c2, c3 = st.columns(3)
    buckets = c1.select_slider("Buckets n", [8, 16, 32, 64, 128], 32, key="t5_buckets")
    max_distance = c2.select_slider("Max distance D", [16, 32, 64, 128, 256, 512], 128, key="t5_distance")
    t5_length = c3.slider("Length", 8, 512, 160, key="t5_length")
    if (t5 := widgets.figure_or_none("t5_buckets", options=T5Options(buckets, max_distance, t5_length))) is None:
        return
    show(t5, "t5")
    url_state.publish(BIASES)
    try:  # only when the Swin page exists and is routed (not when this page runs on its own)
        if (Path(__file__).parent / "swin.py").exists():
            st.page_link("views/swin.py", label="Swin's relative position bias: a learned table per window offset",
                         icon=":material/grid_view:")
    except StreamlitPageNotFoundError:
        st.caption("Swin's relative position bias is shown on the Swin page.")


url_state.restore(TABS + WHY + SINUSOIDAL + GRID + ROPE + BIASES, COERCE)
st.title("Positional encodings")
st.caption("Self-attention treats its input as a set: shuffle the tokens and its outputs shuffle the same way. "
           "Everything a transformer knows about order comes from how positions enter — added to the input "
           "(sinusoidal, learned), rotated into queries and keys (RoPE), or added to the scores (ALiBi, T5, Swin).")
why, sinusoidal, learned, rope, biases, beyond = st.tabs(["Why positions?", "Sinusoidal", "Learned tables", "RoPE",
                                                          "ALiBi · T5 · Swin", "Beyond the training length"],
                                                         key="pos_view", on_change="rerun")
url_state.publish(TABS)
with sinusoidal:
    sinusoidal_tab()
with rope:
    rope_tab()
with biases:
    bias_tab()
if beyond.open is not False:
    with beyond:
        rope_scaling.show()
# the views below read tensors out of loaded models; they come last so the formulas show while the models load
encoder = load(families.default_spec("encoder"))
with why:
    if encoder is not None:
        equivariance_tab(encoder)
with learned:
    spec = st.radio("Text model", [families.default_spec("encoder"), families.spec("causal_lm", "gpt2")], horizontal=True,
                    format_func=lambda choice: choice.label, key="learned_text")
    if spec.source == "hub" and not pe.hub_model_cached(spec.id):
        st.info(f"{spec.key} comes from the hub and is not in this machine's Hugging Face cache, so its position table "
                f"cannot be shown offline. With internet, open it once on the GPT page (or run `huggingface-cli "
                f"download {spec.id}`) and it appears here.")
    elif (model := encoder if spec == families.default_spec("encoder") else load(spec)) is not None:
        show(widgets.figure_or_none("learned_text_table", None, None, model), "learned_text_table")
    grid_tab()
with rope:
    language_models = [spec for spec in families.specs("causal_lm") if spec.offline]  # SmolLM2, Gemma 3 (two bases)
    picked = st.radio("Language model", language_models, horizontal=True, format_func=lambda choice: choice.label,
                      key="rope_model")
    if (causal_lm := load(picked)) is not None:
        rope_model_view(causal_lm)
