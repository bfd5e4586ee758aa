"""The mechanics page's Pre-LN vs Post-LN tab: where the norm sits, and every layer's gradient norm at
initialisation in each placement, recomputed on a small stack (view in viz/figures/norm_placement.py)."""
from __future__ import annotations

import streamlit as st

from app import display, url_state, widgets
from models.lessons import norm_placement as npl
from viz.figures.norm_placement import NormOptions

KEYS = ["ln_layers", "ln_d", "ln_group", "ln_seeds"]


def show() -> None:
    url_state.restore(KEYS, {"ln_layers": url_state.within(2, 24), "ln_d": int, "ln_seeds": url_state.within(1, 4)})
    st.latex(r"\text{Post-LN: } x_{l+1} = \operatorname{LN}\big(x_l + F(x_l)\big)\qquad"
             r"\text{Pre-LN: } x_{l+1} = x_l + F\big(\operatorname{LN}(x_l)\big)")
    st.table(npl.PLACEMENT_TABLE, hide_index=True)
    c1, c2, c3, c4 = st.columns(4)
    layers = c1.slider("Layers N", 2, 24, 12, key="ln_layers")
    d_model = c2.select_slider("d_model", [32, 64, 128, 256], value=128, key="ln_d")
    group = c3.selectbox("Gradient of", list(npl.PARAMETERS), key="ln_group", format_func=npl.PARAMETERS.get)
    seeds = c4.slider("Seeds averaged", 1, 4, 2, key="ln_seeds")
    with st.spinner("Building the stacks and running one backward pass each…"):
        figure = widgets.figure_or_none("norm_placement", None, NormOptions(layers, d_model, group, seeds))
    if figure is not None:
        display.show(figure, "mech_norm")
    st.caption("Xiong et al. 2020, \"On Layer Normalization in the Transformer Architecture\" (Fig. 3, Theorem 1); "
               "the stack here is this page's own (seeded, Xavier-uniform weights, zero biases), recomputed live.")
    url_state.publish(KEYS)
