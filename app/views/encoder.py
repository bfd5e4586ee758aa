"""Bidirectional encoder (BERT family): every token attends to every token; where [CLS] and [SEP] absorb attention."""
import streamlit as st

from app import attention_view, display, presentation, url_state, widgets
from app.sections import faithfulness_text
from app.sections import why as why_section
from models.analysis.showcase import Sample
from models.core.inputs import TextInput
from viz.figures.attention import ShareOptions

# Each sample opens on the head that shows its lesson, measured on the run in view (models/analysis/showcase.py).
# On all-MiniLM-L6-v2: coreference layer 3 head 1 ("it" -> "trophy", 0.58), bank 0/2 ("bank" -> "river", 1.00),
# pair 5/4 ("dog" -> "cat", 0.65), negation 1/8 ("not" -> "good", 0.90).
SAMPLES = {
    "Coreference": Sample("The trophy didn't fit in the suitcase because it was too big.", "word", "it", "trophy",
                          "it resolves 'it' to the trophy that was too big"),
    "Bank": Sample("She sat on the river bank and watched the bank across the street open.", "word", "bank", "river",
                   "the first 'bank' gathers 'river', the word that says which bank is meant"),
    "Pair": Sample("The cat sat on the mat. The dog slept on the rug.", "word", "dog", "cat",
                   "'dog' in the second sentence reads 'cat', its counterpart in the first"),
    "Negation": Sample("The film was not good at all, and the ending was not bad either.", "word", "not", "good",
                       "'not' looks ahead to the word it negates: an encoder reads in both directions"),
}
PRESETS = {name: sample.text for name, sample in SAMPLES.items()}

SHARED = ["model_encoder", "max_tokens", "encoder_text", "encoder_layer", "encoder_head", "encoder_statistic"]
url_state.restore(SHARED, {"max_tokens": int, "encoder_layer": int})

st.title("Bidirectional self-attention in an encoder")
spec = widgets.model_picker("encoder")
max_tokens = widgets.token_limit()
widgets.model_card(spec)
loaded = widgets.load_or_stop(spec)
sentence = widgets.text_source(PRESETS, key="encoder", label="Sentence")
if not sentence.strip():
    st.info("Type a sentence above, pick a sample, or upload a .txt file.")
    widgets.stop()

result = widgets.run_or_stop(loaded, TextInput(sentence, max_tokens))
widgets.show_notices(result)
maps = result.maps("self")
st.caption(f"{len(result.tokens)} tokens · {maps.num_layers} layers × {maps.num_heads} heads · no mask: every "
           "token sees every other token")
attention_view.explorer(result, "self", key="encoder", loaded=loaded, samples=SAMPLES, text=sentence)
url_state.publish(SHARED)

if result.special_positions:
    st.subheader("Attention absorbed by [CLS] and [SEP]")
    figure = widgets.figure_or_none("special_tokens", result, ShareOptions(presentation.color_scheme()))
    if figure is not None:
        display.show(figure, "encoder_special", downloads=False)

st.subheader("Why does this head look here?")  # the score split into what wrote its query and its key (issue 37)
url_state.restore(["encoder_why", *why_section.keys("encoder")],
                  {"encoder_why": lambda text: text == "True", **why_section.coerce("encoder")})
if st.toggle("Split a cell's score into what wrote its query and what wrote its key", key="encoder_why"):
    why_section.show(result, loaded, "encoder")
url_state.publish(["encoder_why", *why_section.keys("encoder")])

st.subheader("Which tokens make the sentence embedding?")  # explanations and their faithfulness (issue 17)
url_state.restore(["encoder_faith"], {"encoder_faith": lambda text: text == "True"})
if st.toggle("Explain it: every method's token relevance and its deletion/insertion curves", key="encoder_faith"):
    faithfulness_text.show_encoder(result, loaded)
url_state.publish(["encoder_faith"])
