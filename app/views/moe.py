"""Mixture of experts: which experts each token is routed to, per layer, and how balanced and specialised that is."""
import numpy as np
import streamlit as st

from app import display, presentation, resources, url_state, widgets
from models.analysis import routing as stats
from models.core.inputs import TextInput
from models.families.moe.model import SAMPLES, PromptPair
from viz import figures
from viz.figure import Figure
from viz.figures.moe import (
    CoactivationOptions,
    ConsistencyOptions,
    GateOptions,
    LoadDifferenceOptions,
    RoutedOptions,
    SpecialisationOptions,
    StripOptions,
)


def show(figure: Figure | None, key: str, downloads: bool = True) -> None:
    """A figure, its download buttons, then its caption (as this page always laid them out)."""
    if figure is not None:
        display.show(figure, key, downloads=downloads, caption=False)
        if figure.caption:
            st.caption(figure.caption)


SHARED = ["model_moe", "max_tokens", "moe_text", "moe_layer", "moe_token", "moe_view", "moe_prompt_a", "moe_prompt_b"]
url_state.restore(SHARED, {"max_tokens": int, "moe_token": url_state.within(0, 1_000_000)})

st.title("Mixture of experts: where each token is routed")
st.caption("Each MoE layer replaces the feed-forward block with E experts; a router sends every token to its top-k "
           "and mixes their outputs by the router's weights (Shazeer et al. 2017, Switch, Mixtral).")
spec = widgets.model_picker("moe")
max_tokens = widgets.token_limit()
widgets.model_card(spec)
if spec.source == "hub":
    st.info(f"{widgets.plain(spec.key)} downloads from the Hugging Face hub on first use. {spec.notes} Without "
            "internet it cannot load here: pick the offline mini-moe in the sidebar, which always works.", icon="🌐")
loaded = widgets.load_or_stop(spec)
text = widgets.text_source(SAMPLES, key="moe")
if not text.strip():
    st.info("Type some text above, pick a sample, or upload a .txt file.")
    st.stop()

result = widgets.run_or_stop(loaded, TextInput(text, max_tokens))
widgets.show_notices(result)
routing = result.routing
labels = routing.layer_labels
st.caption(f"{len(routing.tokens)} tokens · {routing.num_layers} MoE layers × {routing.num_experts} experts · "
           f"dispatch: {routing.dispatch_rule()} · probabilities in float32")

card_text, measured = resources.mini_card(spec)
# a mini opens on the layer its card measured as most specialised (token category against expert, held out)
specialised = (measured or {}).get("per_layer", {}).get("mi_category_bits")
opening = int(np.argmax(specialised)) if specialised and len(specialised) == len(labels) else 0
left, right = st.columns(2)
layer = labels.index(left.selectbox("MoE layer", labels, index=opening, key="moe_layer"))
last = len(routing.tokens) - 1
if st.session_state.get("moe_token", 0) > last:
    st.session_state["moe_token"] = 0
position = min(right.slider("Token", 0, max(last, 1), key="moe_token", disabled=last == 0), last)
right.text(f"token {position}: {routing.tokens[position]}  ({routing.categories[position]})")

tabs = st.tabs(["Tokens by expert", "One token's gate", "Load and balance", "Co-activation and layers",
                "Specialisation", "Two prompts"], key="moe_view", on_change="rerun")
with tabs[0]:
    show(widgets.figure_or_none("routed_text", result, RoutedOptions(layer, position)), "moe_routed")
    show(widgets.figure_or_none("expert_legend", result), "moe_legend", downloads=False)
    if (strip := widgets.figure_or_none("layer_strip", result, StripOptions(position))) is not None:
        st.caption(strip.caption)  # above the strip: it says which tokens the strip shows
        display.show(strip, "moe_strip", downloads=False, caption=False)
with tabs[1]:
    show(widgets.figure_or_none("gate", result, GateOptions(layer, position)), "moe_gate")
    if routing.shared_weight is not None:
        st.metric("Weight of the shared expert(s), which every token uses",
                  f"{float(routing.shared_weight[layer, position]):.3f}")
with tabs[2]:
    show(widgets.figure_or_none("load", result), "moe_load")
    summary = stats.summarise_routing(routing)
    cols = st.columns(3)
    cols[0].metric("Mean load CV", f"{summary.cv.mean():.3f}", help="std/mean of the load: 0 = perfectly even")
    cols[1].metric("Mean Switch aux loss", f"{summary.aux_loss.mean():.3f}", help="E·Σ f·P: 1 = balanced, E = "
                   "collapsed onto one expert (Fedus et al. 2021, eq. 4, without α)")
    cols[2].metric("Mean router entropy", f"{summary.entropy.mean():.2f} nats",
                   help=f"log E = {np.log(routing.num_experts):.2f} nats would be an undecided router")
    if routing.capacity is not None:
        st.caption("Routes dropped by the expert capacity, per layer: "
                   + ", ".join(f"{d:.0%}" for d in summary.dropped_share))
with tabs[3]:
    a, b = st.columns(2)
    with a:
        st.markdown(f"**Co-activation, {labels[layer]}**")
        show(widgets.figure_or_none("coactivation", result, CoactivationOptions(layer)), "moe_coactivation")
    with b:
        st.markdown("**Cross-layer consistency**")
        show(widgets.figure_or_none("consistency", result, ConsistencyOptions(presentation.color_scheme())),
             "moe_consistency")
with tabs[4]:
    show(widgets.figure_or_none("specialisation", result, SpecialisationOptions(), loaded), "moe_special")
    if measured is not None:
        cols = st.columns(3)
        cols[0].metric("Held-out perplexity", f"{measured['perplexity']:.2f}")
        cols[1].metric("Held-out load CV", f"{measured['mean_cv']:.3f}")
        cols[2].metric("Held-out MI vs shuffled", f"{measured['mean_mi_category_bits']:.3f} vs "
                       f"{measured['mean_mi_category_shuffled_bits']:.3f} bits")
        with st.expander("Model card (measured when it was trained)"):
            st.markdown(card_text)
with tabs[5]:
    a, b = st.columns(2)
    text_a = a.text_area("Prompt A", SAMPLES["Prose"], key="moe_prompt_a", height=120)
    text_b = b.text_area("Prompt B", SAMPLES["Code"], key="moe_prompt_b", height=120)
    if text_a.strip() and text_b.strip():
        # the pair comes from the cached runs (the view's analysis, which runs both, is the command line's way)
        pair = PromptPair(*(widgets.run_or_stop(loaded, TextInput(t, max_tokens)) for t in (text_a, text_b)))
        for column, name, routed in ((a, "A", pair.a), (b, "B", pair.b)):
            with column:
                show(widgets.figure_or_none("routed_text", routed, RoutedOptions(layer, None, 56, f"prompt {name}")),
                     f"moe_prompt_{name}", downloads=False)
        st.markdown("**Expert load of A minus B** (percentage points; orange: A uses the expert more)")
        show(figures.build("load_difference", pair, LoadDifferenceOptions(text_a, text_b, max_tokens)), "moe_two")
    else:
        st.info("Type two prompts to compare their expert load.")
url_state.publish(SHARED)
