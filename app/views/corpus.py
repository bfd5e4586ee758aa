"""Corpus statistics: which heads do what across many documents, not one prompt (AttentionViz, Yeh et al. 2023;
induction and previous-token heads, Olsson et al. 2022). Results persist per document in Parquet and resume; the
bundled corpus's results ship with the app, so the heads map is there when the page opens."""
import streamlit as st

from app import presentation, sidebar, url_state, widgets
from app.sections import corpus as section

FAMILIES = {"causal_lm": "Language model (GPT)", "encoder": "Encoder (BERT)", "moe": "Mixture of experts"}
SHARED = ["corpus_family", "corpus_source", "corpus_n", "corpus_tokens", "corpus_stat", "corpus_layer", "corpus_head",
          "corpus_view"]
url_state.restore(SHARED, {"corpus_n": url_state.within(1, 100_000), "corpus_tokens": int,
                           "corpus_layer": url_state.within(0, 1000), "corpus_head": url_state.within(0, 1000)})

st.title("Corpus statistics: which heads do what, over many documents")
st.caption("Each document runs once through the model; every head's attention is reduced to statistics in the "
           "forward pass (entropy, distance, first-token share, previous-token, diagonal, induction, max weight) "
           "and written per document to a results folder, so a run can be cancelled and resumed.")
with st.sidebar:
    family = st.selectbox("Model family", list(FAMILIES), format_func=FAMILIES.get, key="corpus_family")
spec = widgets.model_picker(family)
widgets.model_card(spec)
# on a projector the corpus and run controls fold away, so the heads map starts above the fold
with st.expander("Corpus, document length and run", expanded=False) if presentation.is_on() else st.container():
    corpus = section.corpus_picker()
    max_tokens = int(st.select_slider("Tokens per document (longer ones are cut)", [64, 128, 256, 512, 1024], 256,
                                      key="corpus_tokens"))
    folder, shipped = section.results_folder(spec, sidebar.device_choice()[1], corpus, max_tokens)
    section.run_controls(spec, corpus, folder, shipped, max_tokens)
if (folder / "run.json").is_file():
    section.show_results(folder, spec)
url_state.publish(SHARED)
