"""The "Faithfulness" section of the encoder and translation pages (issue 17): every explanation of one target
side by side over the input tokens, and their deletion and insertion curves against random orders (the GPT and ViT
pages use ``app/sections/faithfulness.py``, whose table, curves and progress bar this reuses).

- Encoder: the target is the sentence embedding (the packaged MiniLM has no masked-LM head, so no [MASK] fill):
  its cosine to the sentence's own embedding, or to a sentence the user types (``models/families/encoder/explain.py``).
- Translation: the target is one output token, teacher-forced; the source tokens are removed
  (``models/families/translation/explain.py``).
"""
from __future__ import annotations

import streamlit as st

from app import display, url_state, widgets
from app.sections import faithfulness as shared
from models.families.translation import explain as translation_explain
from viz.figures.faithfulness import FaithfulnessOptions

OWN, OTHER = "its own embedding (unperturbed)", "the embedding of another sentence"


def _keys(key: str) -> list[str]:
    return [f"{key}_{name}" for name in ("target", "reference", "steps", "ig_steps", "raw_layer", "raw_head")]


def _sliders(key: str) -> tuple[int, int]:
    c1, c2 = st.columns(2)
    steps = int(c1.slider("Curve steps", 5, 50, 20, 5, key=f"{key}_steps"))
    ig_steps = int(c2.slider("IG steps", 8, 128, 32, 8, key=f"{key}_ig_steps"))
    return steps, ig_steps


def _draw(result, loaded, key: str, options: FaithfulnessOptions) -> None:
    maps = shared.figure("explanations", result, options, loaded, "Explaining")
    if maps is None:
        return
    display.show(maps, f"{key}_maps")
    # the same analysis: cached by now
    if shared.figure("faithfulness", result, options, loaded, "Curves") is not None:
        shared.table_and_curves(result, loaded, options, key, "token")


def _restore(key: str, extra: dict) -> None:
    url_state.restore(_keys(key), {f"{key}_steps": url_state.within(5, 50), f"{key}_ig_steps": url_state.within(8, 128),
                                   f"{key}_raw_layer": url_state.within(0, 10**3),
                                   f"{key}_raw_head": url_state.choice("head"), **extra})


def show_encoder(result, loaded, key: str = "enc_faith") -> None:
    """What makes this sentence's embedding: each method's token relevance and whether removing those tokens first
    moves the embedding away fastest."""
    _restore(key, {})
    try:
        st.caption("Target: the **sentence embedding** (the mean of the last layer's token vectors, the pooling "
                   "all-MiniLM-L6-v2 is trained with), not a [MASK] fill: this encoder is loaded without a "
                   "masked-LM head. The methods explain the embedding's length along the reference direction; the "
                   "curves read its cosine similarity to the reference (0..1, below 0 counts as 0) in place of a "
                   "probability. [CLS] and [SEP] are kept.")
        c1, c2 = st.columns([1, 2])
        target = c1.radio("Compare the embedding with", [OWN, OTHER], key=f"{key}_target")
        reference = ""
        if target == OTHER:
            reference = c2.text_input("Reference sentence", "A small animal rested on a rug.", max_chars=300,
                                      key=f"{key}_reference")
            if not reference.strip():
                st.info("Type a reference sentence, or compare with the sentence's own embedding.")
                return
        steps, ig_steps = _sliders(key)
        layer, head = shared.raw_attention_picker(result, key, read="[CLS]'s row of the self-attention")
        _draw(result, loaded, key, FaithfulnessOptions(token=reference, steps=steps, ig_steps=ig_steps, layer=layer,
                                                       head=head))
    finally:
        url_state.publish(_keys(key))


def show_translation(result, loaded, key: str = "tr_faith") -> None:
    """Which source tokens one output token depends on, by every method, and their deletion/insertion curves."""
    _restore(key, {f"{key}_target": url_state.within(0, 10_000)})
    try:
        if not getattr(result.output, "architecture", "").startswith("transformer"):
            st.info("The explanations read Transformer attention (self- and cross-attention). Pick the mini "
                    "Transformer en→fr or a Marian model in the sidebar.")
            return
        choices = translation_explain.output_choices(result)
        positions = [t for t, _ in choices]
        labels = dict(choices)
        if st.session_state.get(f"{key}_target") not in positions:
            st.session_state.pop(f"{key}_target", None)
        c1, c2 = st.columns([1, 2])
        position = c1.selectbox("Output token to explain", positions, key=f"{key}_target",
                                format_func=lambda t: f"{t}: {labels[t]}")
        c2.caption("The decoder is teacher-forced on the translation above, so the target token stays fixed while "
                   "source tokens are removed (their embedding becomes the mean embedding; positions and </s> stay). "
                   "Raw attention reads the chosen decoder layer's cross-attention (default the last, head mean) "
                   "and value norms the last one's; rollout and "
                   "gradient rollout carry relevance through encoder self-, decoder self- and cross-attention "
                   "(Chefer et al. 2021b's encoder–decoder rules). In ALTI's place, value zeroing (Mohebbi et al. "
                   "2023) through the cross-attention: each source token's value vector is zeroed in every decoder "
                   "layer's cross-attention, and its score is the cosine distance this makes to the decoder's output "
                   "at the target position (normalised to sum to 1).")
        if "decoder" not in result.attention:  # Bergamot's SSRU decoder
            st.info(translation_explain.NO_DECODER_SELF_ATTENTION)
        steps, ig_steps = _sliders(key)
        layer, head = shared.raw_attention_picker(result, key, kind="cross", noun="decoder layer",
                                                  read="the cross-attention row of the chosen output token")
        _draw(result, loaded, key, FaithfulnessOptions(target=int(position), steps=steps, ig_steps=ig_steps,
                                                       layer=layer, head=head))
    except ValueError as error:
        widgets.show_error(error)
    finally:
        url_state.publish(_keys(key))

