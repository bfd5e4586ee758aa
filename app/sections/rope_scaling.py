"""The positional page's "beyond the training length" tab: RoPE's wavelengths against the context, Position
Interpolation, NTK-aware scaling and YaRN, ALiBi beside them, and SmolLM2's measured perplexity against length
(views in viz/figures/rope_scaling.py)."""
from __future__ import annotations

import streamlit as st

from app import display, url_state, widgets
from viz.figures.rope_scaling import ScalingOptions

KEYS = ["ext_d", "ext_base", "ext_trained", "ext_factor"]
COERCE = {"ext_d": int, "ext_base": float, "ext_trained": int, "ext_factor": float}


@st.fragment
def show() -> None:
    url_state.restore(KEYS, COERCE)
    st.latex(r"\theta_i=b^{-2i/d}\qquad \text{PI: }\theta_i/s\qquad \text{NTK: } b\to b\,s^{d/(d-2)}")
    st.latex(r"\text{YaRN: }\theta_i' = (1-\gamma_i)\,\theta_i+\gamma_i\,\theta_i/s,\qquad "
             r"\text{logits}\times(0.1\ln s+1)^2")
    c1, c2, c3, c4 = st.columns(4)
    head_dim = c1.select_slider("Head dimension d", [16, 32, 64, 128, 256], 64, key="ext_d")
    base = c2.number_input("Base b", 100.0, 1e8, 100000.0, key="ext_base", format="%g")
    trained = c3.select_slider("Trained context L₀", [512, 1024, 2048, 4096, 8192, 32768], 8192, key="ext_trained")
    factor = c4.select_slider("Factor s", [1.0, 1.5, 2.0, 4.0, 8.0, 16.0], 4.0, key="ext_factor")
    st.caption("Defaults: SmolLM2-135M's (d = 64, b = 100,000, L₀ = 8,192 = its max_position_embeddings).")
    figure = widgets.figure_or_none("rope_scaling", None, ScalingOptions(head_dim, base, trained, factor))
    if figure is not None:
        display.show(figure, "rope_scaling")
    st.subheader("Measured: SmolLM2's perplexity against length")
    if (figure := widgets.figure_or_none("rope_perplexity", None)) is not None:
        display.show(figure, "rope_perplexity")
    url_state.publish(KEYS)
