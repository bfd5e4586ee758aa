"""The mechanics page's linear-attention tab: softmax vs linear vs flow attention on the page's own Q, K, V, the
causal form as an RNN step by step, and the measured cost against N (views in viz/figures/linear_attention.py)."""
from __future__ import annotations

import streamlit as st

from app import display, url_state, widgets
from viz.figures.linear_attention import LinearOptions, RecurrentOptions

LAYER_FIELDS = ("sentence", "source", "d_model", "heads", "d_head", "seed")


def show(layer: dict, head: int, tokens: int, scheme: str) -> None:
    """``layer``: the page's toy-layer settings; ``head``: the head chosen in the step-by-step tab."""
    url_state.restore(["mech_lin_step"], {"mech_lin_step": url_state.within(0, tokens - 1)})
    st.latex(r"\underbrace{\operatorname{softmax}(QK^{\top}/\sqrt{d_k})\,V}_{N\times N\text{ matrix first}}"
             r"\quad\text{vs}\quad\frac{\phi(Q)\,\big(\phi(K)^{\top}V\big)}{\phi(Q)\,\phi(K)^{\top}\mathbf 1}"
             r"\quad\phi(x)=\operatorname{elu}(x)+1")
    st.caption(f"Katharopoulos et al. 2020 and Flowformer (Wu et al. 2022) on the same Q, K, V: head {head} of the "
               "step-by-step tab's layer (pick the head there). Flow attention uses φ = sigmoid, conserves each "
               "query's incoming and each key's outgoing flow, and adds a softmax competition among keys and a "
               "sigmoid allocation gate per query.")
    common = {name: layer[name] for name in LAYER_FIELDS}
    figure = widgets.figure_or_none("linear_attention", None, LinearOptions(**common, head=head, scheme=scheme))
    if figure is not None:
        display.show(figure, "mech_linear")

    st.subheader("Causal linear attention is an RNN")
    st.latex(r"S_i = S_{i-1} + \phi(k_i)\,v_i^{\top},\qquad z_i = z_{i-1} + \phi(k_i),\qquad "
             r"y_i = \frac{\phi(q_i)^{\top} S_i}{\phi(q_i)^{\top} z_i}")
    step = st.slider("Step i (token)", 0, tokens - 1, tokens - 1, key="mech_lin_step")
    figure = widgets.figure_or_none("linear_recurrent", None,
                                    RecurrentOptions(**common, head=head, scheme=scheme, step=step))
    if figure is not None:
        display.show(figure, "mech_linear_rnn")

    st.subheader("Measured: time and memory against N")
    if (figure := widgets.figure_or_none("linear_attention_cost", None)) is not None:
        display.show(figure, "mech_linear_cost")
    url_state.publish(["mech_lin_step"])
