"""The translation page's decoder logit-lens tab: what each decoder layer would output at each step of the
translation (models.analysis.lens.decoder_logit_lens)."""
from __future__ import annotations

import streamlit as st

from app import display, presentation, url_state, widgets
from viz.figures.lens import LensOptions

KEYS = ["tr_lens_count"]
COUNTS = [8, 16, 32, 64]


def show(result, loaded) -> None:
    if not getattr(result.output, "architecture", "").startswith("transformer"):
        st.info("The GRU models have no decoder layers to read: pick the mini Transformer or opus-mt.")
        return
    url_state.restore(KEYS, {"tr_lens_count": int})
    st.caption("The logit lens of the decoder: after each decoder layer, the residual stream at each output step "
               "through the model's own LM head, as if the decoder stopped there. A column is one step: its input "
               "is the token produced before it, the top row what the model produced.")
    if getattr(result.output, "architecture", "") == "transformer-ssru":
        st.caption("Bergamot: its two decoder layers each pass an SSRU (no self-attention), the cross-attention and "
                   "an FFN; the lens reads the whole vocabulary, where the decoder chose among its shortlist, so "
                   "the top row's probabilities can be a little lower than the step-through's.")
    count = st.select_slider("Output steps shown (the last ones)", COUNTS, value=32, key="tr_lens_count")
    with st.spinner("Reading every decoder layer…"):
        figure = widgets.figure_or_none("decoder_lens", result,
                                        LensOptions(count, -1, presentation.color_scheme()), loaded)
    if figure is not None:
        display.show(figure, "tr_decoder_lens")
    url_state.publish(KEYS)
