"""Bidirectional encoder (BERT family): every token attends to every token; where [CLS] and [SEP] absorb attention."""
import streamlit as st

from app import attention_view, resources, share, widgets
from models.encoder import special_token_share
from viz import heatmap

PRESETS = {
    "Coreference": "The trophy didn't fit in the suitcase because it was too big.",
    "Bank": "She sat on the river bank and watched the bank across the street open.",
    "Pair": "The cat sat on the mat. The dog slept on the rug.",
    "Negation": "The film was not good at all, and the ending was not bad either.",
}

SHARED = ["model_encoder", "max_tokens", "encoder_text", "encoder_layer", "encoder_head", "encoder_statistic"]
share.restore(SHARED, {"max_tokens": int, "encoder_layer": int})

st.title("Bidirectional self-attention in an encoder")
spec = widgets.model_picker("encoder")
max_tokens = widgets.token_limit()
widgets.model_card(spec)
loaded = widgets.load_or_stop(spec)
sentence = widgets.text_source(PRESETS, key="encoder", label="Sentence")
if not sentence.strip():
    st.info("Type a sentence above, pick a sample, or upload a .txt file.")
    st.stop()

key = resources.run_key(loaded)
try:
    result = resources.run_encoder(loaded, key, sentence, max_tokens)
except ValueError as error:
    widgets.show_error(error)
    st.stop()
widgets.show_notices(result)
maps = result.maps("self")
st.caption(f"{len(result.tokens)} tokens · {maps.num_layers} layers × {maps.num_heads} heads · no mask: every "
           "token sees every other token")
st.session_state["encoder_stem"] = (spec.short_name, sentence[:40])
attention_view.explorer((key, sentence, max_tokens, "encoder"), result, "self", key="encoder")
share.publish(SHARED)

special = result.extras["special_positions"]
if special:
    st.subheader("Attention absorbed by [CLS] and [SEP]")
    share = special_token_share(maps, special)
    names = ", ".join(sorted({result.tokens[i] for i in special}))

    st.altair_chart(heatmap.head_statistic_chart(share, f"share on {names}"), width="content")
    st.caption(f"Mean share of each head's attention that lands on the special tokens ({names}). Clark et al. "
               "(2019) found many BERT heads park their attention there when they have nothing better to do: "
               f"here {float((share > 0.5).mean()):.0%} of heads put more than half of it there.")
