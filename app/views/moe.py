"""Mixture of experts: which experts each token is routed to, per layer, and how balanced and specialised that is."""
import numpy as np
import pandas as pd
import streamlit as st
from PIL import Image

from app import resources, share, widgets
from models.analysis import routing as stats
from models.loading import SAMPLE_DATA
from viz import export
from viz import moe as viz

PRESETS = {
    "Prose": "The old man walked slowly to the harbour in the morning. He was glad that the boats had returned "
             "before the storm, and he counted 12 of them.",
    "Code": "def average(values):\n    total = sum(values)\n    if len(values) == 0:\n        return 0\n"
            "    return total / len(values)",
    "Numbers": "3 + 4 = 7\n12 * 7 = 84\n2, 4, 6, 8, 10, 12\n2024-03-15 17.25 381",
    "Mixed": "Anna wrote a function to add the prices:\n\ndef add(prices):\n    return sum(prices)\n\n"
             "It returned 42.50 for 3 items.",
}


def show(chart) -> None:
    """Big matrices come back from viz as images, the rest as Altair charts."""
    if isinstance(chart, Image.Image):
        st.image(chart)
    else:
        st.altair_chart(chart, width="content")


def offer(figure, what: tuple, key: str, table: pd.DataFrame | None = None, **arrays) -> None:
    """Downloads of one view: the figure (PNG, and SVG for a chart), a table as CSV, the arrays as .npz/JSON;
    ``what`` names the view in the file name (view, layer, token)."""
    kind = "image" if isinstance(figure, Image.Image) else "chart"
    share.downloads(export.file_stem(spec.short_name, *what, text[:40]), key, **{kind: figure}, table=table,
                    payload={"model": spec.key, "text": text, "tokens": routing.tokens, "layers": labels, **arrays},
                    arrays=arrays, metadata={"model": spec.key, "input": text, "view": " ".join(map(str, what))})


def run_or_stop(text: str):
    try:
        return resources.run_moe(loaded, key, text, max_tokens)
    except ValueError as error:
        widgets.show_error(error)
        st.stop()


SHARED = ["model_moe", "max_tokens", "moe_text", "moe_layer", "moe_token", "moe_view", "moe_prompt_a", "moe_prompt_b"]
share.restore(SHARED, {"max_tokens": int, "moe_token": share.within(0, 1_000_000)})

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
text = widgets.text_source(PRESETS, key="moe")
if not text.strip():
    st.info("Type some text above, pick a sample, or upload a .txt file.")
    st.stop()

key = resources.run_key(loaded)
result = run_or_stop(text)
widgets.show_notices(result)
routing = result.extras["routing"]
summary, consistency, (repeat, chance), special = resources.moe_statistics(result, (key, text, max_tokens))
labels = [routing.layer_label(i) for i in range(routing.num_layers)]
st.caption(f"{len(routing.tokens)} tokens · {routing.num_layers} MoE layers × {routing.num_experts} experts · "
           f"dispatch: {routing.dispatch_rule()} · probabilities in float32")

left, right = st.columns(2)
layer = labels.index(left.selectbox("MoE layer", labels, key="moe_layer"))
last = len(routing.tokens) - 1
if st.session_state.get("moe_token", 0) > last:
    st.session_state["moe_token"] = 0
position = right.slider("Token", 0, max(last, 1), key="moe_token", disabled=last == 0)
position = min(position, last)
right.text(f"token {position}: {routing.tokens[position]}  ({routing.categories[position]})")

tabs = st.tabs(["Tokens by expert", "One token's gate", "Load and balance", "Co-activation and layers",
                "Specialisation", "Two prompts"], key="moe_view", on_change="rerun")
with tabs[0]:
    routed = viz.routed_text(routing.tokens, routing.raw_tokens, routing.top1[layer], routing.top_weights[layer, :, 0],
                             routing.num_experts, routing.kept[layer, :, 0], selected=position,
                             title=f"top-1 expert of each token, {labels[layer]}")
    show(routed)
    offer(routed, ("routing", labels[layer]), "moe_routed",
          pd.DataFrame({"token": routing.tokens, "category": routing.categories, "top-1 expert": routing.top1[layer],
                        "top-1 weight": routing.top_weights[layer, :, 0], "kept": routing.kept[layer, :, 0]}),
          probs=routing.probs[layer], top_experts=routing.top_experts[layer], top_weights=routing.top_weights[layer],
          kept=routing.kept[layer])
    show(viz.expert_legend(routing.num_experts))
    start = max(0, min(position - 30, len(routing.tokens) - 60))
    window = slice(start, start + 60)
    st.caption(f"Every MoE layer for tokens {start}–{min(start + 60, len(routing.tokens)) - 1} (the token slider "
               "scrolls): a column per token, a row per layer, the number is the top-1 expert; white = dropped.")
    show(viz.layer_strip(routing.tokens[window], routing.top1[:, window], labels, routing.num_experts,
                         routing.kept[:, window, 0], selected=position, offset=start))
with tabs[1]:
    gate = viz.gate_bars(routing.probs[layer, position], routing.top_experts[layer, position],
                         routing.top_weights[layer, position], float(summary.entropy[layer, position]),
                         f"token {position}, {labels[layer]}", routing.kept[layer, position])
    show(gate)
    offer(gate, ("gate", labels[layer], f"token {position}"), "moe_gate",
          pd.DataFrame({"expert": range(routing.num_experts), "probability": routing.probs[layer, position]}),
          probs=routing.probs[layer, position], top_experts=routing.top_experts[layer, position],
          top_weights=routing.top_weights[layer, position])
    st.caption("Bars: the router's probability for every expert. Coloured bars are the experts the token was "
               "dispatched to, labelled with their rank (and, up to 16 experts, the weight that multiplied their "
               "output; hover for it otherwise). Dashed line: uniform 1/E.")
    if routing.shared_weight is not None:
        st.metric("Weight of the shared expert(s), which every token uses",
                  f"{float(routing.shared_weight[layer, position]):.3f}")
with tabs[2]:
    load_figure = viz.load_heatmap(summary.load, labels, summary.cv, summary.aux_loss)
    show(load_figure)
    offer(load_figure, ("expert load",), "moe_load",
          pd.DataFrame(summary.load, index=pd.Index(labels, name="layer"),
                       columns=[f"expert {e}" for e in range(routing.num_experts)]),
          load=summary.load, load_cv=summary.cv, aux_loss=summary.aux_loss)
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
    a.markdown(f"**Co-activation, {labels[layer]}**")
    coactivation = stats.coactivation(routing.top_experts[layer], routing.num_experts)
    with a:
        show(coactivation_figure := viz.coactivation_chart(coactivation))
        offer(coactivation_figure, ("coactivation", labels[layer]), "moe_coactivation", coactivation=coactivation)
    a.caption("Share of tokens whose chosen experts include both i and j; the diagonal is each expert alone."
              + (" Top-1 routing fills only the diagonal." if routing.top_k == 1 else ""))
    b.markdown("**Cross-layer consistency**")
    with b:
        show(consistency_figure := viz.consistency_chart(consistency, labels, share.color_scheme()))
        offer(consistency_figure, ("cross-layer consistency",), "moe_consistency", nmi=consistency)
    b.caption("Normalised mutual information between two layers' top-1 experts (1: one predicts the other, up to "
              "renaming). Consecutive tokens keep their top-1 expert: "
              + ", ".join(f"{o:.0%} (chance {c:.0%})" for o, c in zip(repeat, chance)) + " per layer (Mixtral §5).")
with tabs[4]:
    special_figure = viz.specialisation_chart(special.observed, special.shuffled_mean, special.shuffled_p95, labels,
                                              special.category_entropy)
    show(special_figure)
    offer(special_figure, ("specialisation",), "moe_special", observed_bits=special.observed,
          shuffled_mean_bits=special.shuffled_mean, shuffled_p95_bits=special.shuffled_p95)
    st.caption(f"Mutual information between each token's category and its experts, against the same routes "
               f"shuffled across tokens (100 times). Tokens counted: {special.counts}. Categories come from the "
               "token's characters and whether its line reads as code (models/analysis/routing.py).")
    card = resources.moe_mini_card(str(SAMPLE_DATA / spec.id)) if spec.source == "mini" else None
    if card is not None:
        measured, card_text = card
        cols = st.columns(3)
        cols[0].metric("Held-out perplexity", f"{measured['perplexity']:.2f}")
        cols[1].metric("Held-out load CV", f"{measured['mean_cv']:.3f}")
        cols[2].metric("Held-out MI vs shuffled", f"{measured['mean_mi_category_bits']:.3f} vs "
                       f"{measured['mean_mi_category_shuffled_bits']:.3f} bits")
        with st.expander("Model card (measured when it was trained)"):
            st.markdown(card_text)
with tabs[5]:
    a, b = st.columns(2)
    text_a = a.text_area("Prompt A", PRESETS["Prose"], key="moe_prompt_a", height=120)
    text_b = b.text_area("Prompt B", PRESETS["Code"], key="moe_prompt_b", height=120)
    if text_a.strip() and text_b.strip():
        routes = [run_or_stop(t).extras["routing"] for t in (text_a, text_b)]
        for column, name, other in ((a, "A", routes[0]), (b, "B", routes[1])):
            with column:
                show(viz.routed_text(other.tokens, other.raw_tokens, other.top1[layer], other.top_weights[layer, :, 0],
                                     other.num_experts, other.kept[layer, :, 0], width_chars=56,
                                     title=f"prompt {name}, {labels[layer]}"))
        loads = [stats.expert_load(r.top_experts, r.num_experts) for r in routes]
        st.markdown("**Expert load of A minus B** (percentage points; orange: A uses the expert more)")
        show(difference := viz.load_difference(loads[0], loads[1], labels, "A", "B"))
        share.downloads(export.file_stem(spec.short_name, "load difference", text_a[:20], text_b[:20]), "moe_two",
                        **{"image" if isinstance(difference, Image.Image) else "chart": difference},
                        payload={"model": spec.key, "prompt_a": text_a, "prompt_b": text_b, "load_a": loads[0],
                                 "load_b": loads[1]}, arrays={"load_a": loads[0], "load_b": loads[1]},
                        metadata={"model": spec.key, "prompt_a": text_a, "prompt_b": text_b})
    else:
        st.info("Type two prompts to compare their expert load.")
share.publish(SHARED)
