"""Translation: which source words each output word looked at (Bahdanau et al. 2015, fig. 3), step by step, and a
Transformer's cross-attention beside a GRU's additive attention."""
import numpy as np
import pandas as pd
import streamlit as st

from app import attention_view, resources, share, sidebar, widgets
from models import registry, translation
from models.loading import SAMPLE_DATA
from models.minis.translation import card
from viz import alignment as alignment_viz
from viz import export, heatmap

AVERAGE_LAYERS, AVERAGE_HEADS = "average of layers", "average of heads"
WORDS, PIECES = "words", "tokens"
# what a link carries; the cross-attention layer/head pickers are per model, in the URL as tr_layer / tr_head
SHARED = ["model_translation", "tr_max_source", "translation_text", "tr_strategy", "tr_beams", "tr_units", "tr_view",
          "tr_self_kind", "tr_compare", "tr_encoder_layer", "tr_encoder_head", "tr_decoder_layer", "tr_decoder_head"]
share.restore(SHARED, {"tr_max_source": int, "tr_beams": int, "tr_compare": int,
                       "tr_encoder_layer": share.within(0, 1000), "tr_decoder_layer": share.within(0, 1000)})

st.title("Translation: cross-attention alignments")
spec = widgets.model_picker("translation")
PER_MODEL = {f"tr_layer_{spec.key}": "tr_layer", f"tr_head_{spec.key}": "tr_head"}
share.restore(list(PER_MODEL), names=PER_MODEL)
with st.sidebar:
    max_source = int(st.number_input("Source token limit", 8, 1024, translation.DEFAULT_MAX_SOURCE_TOKENS, 8,
                                     key="tr_max_source", help="Longer sentences are refused with a message."))
widgets.model_card(spec)
device, dtype = sidebar.device_choice()
metrics_path = SAMPLE_DATA / "translation" / "metrics.json"
metrics = resources.translation_quality(metrics_path.stat().st_mtime if metrics_path.is_file() else 0.0)
showcase = resources.translation_showcase()


def load(chosen):
    try:
        return resources.load_translation(chosen, device, dtype)
    except ValueError as error:
        widgets.show_error(error)
        if chosen.source == "hub":
            st.info("Hub models need the internet (or a copy in the local Hugging Face cache). The offline models "
                    "in the sidebar always work: the mini Transformer and the two GRUs were trained by this project.")
        st.stop()


def show_vocabulary(loaded, expanded: bool = False) -> None:
    vocabulary = translation.source_vocabulary(loaded)
    if vocabulary:
        with st.expander(f"The {len(vocabulary)} English words this model knows (each also capitalised)",
                         expanded=expanded):
            st.text(", ".join(vocabulary))


def translate(loaded, sentence, settings):
    """The cached run; a user mistake is shown (unknown words with suggestions) and the page stops."""
    try:
        return resources.run_translation(loaded, resources.run_key(loaded), sentence, settings)
    except translation.UnknownWordsError as error:
        widgets.show_error(error)
        st.dataframe(pd.DataFrame({"unknown word": error.words,
                                   "did you mean": [", ".join(error.suggestions.get(w, [])) or "—"
                                                    for w in error.words]}), hide_index=True)
        show_vocabulary(loaded, expanded=True)
    except ValueError as error:
        widgets.show_error(error)
    st.stop()


def view_picker(maps, loaded, key: str):
    """(layer or None = all layers averaged, head or None = heads averaged, words?) chosen by the user."""
    layer, head = translation.default_view(loaded, metrics)
    left, middle, right = st.columns(3)
    if maps.num_layers > 1 or maps.num_heads > 1:
        layers = [AVERAGE_LAYERS] + [f"layer {i}" for i in range(maps.num_layers)]
        heads = [AVERAGE_HEADS] + [f"head {h}" for h in range(maps.num_heads)]
        chosen_layer = left.selectbox("Cross-attention: decoder layer", layers, index=0 if layer is None else layer + 1,
                                      key=f"{key}_layer_{loaded.spec.key}")
        chosen_head = middle.selectbox("Cross-attention: head", heads, index=0 if head is None else head + 1,
                                       key=f"{key}_head_{loaded.spec.key}")
        layer = None if chosen_layer == AVERAGE_LAYERS else layers.index(chosen_layer) - 1
        head = None if chosen_head == AVERAGE_HEADS else heads.index(chosen_head) - 1
    units = right.radio("Units", [WORDS, PIECES], horizontal=True, key=f"{key}_units",
                        help="Words: attention summed over a source word's tokens and averaged over an output "
                             "word's tokens (rows still sum to 1). Tokens: what the model computed.")
    return layer, head, units == WORDS


def show_alignment(result, layer, head, words: bool, max_width: int = 800, key: str = "tr_align") -> float | None:
    """The alignment figure (a chart with tooltips, an image when large) and its downloads; returns the AER when
    gold is known."""
    view = translation.alignment_view(result, layer, head, words, showcase.values())
    chart = image = None
    if max(view.weights.shape) > heatmap.MAX_CHART_TOKENS:
        image = heatmap.attention_image(view.weights, None, "greys")
        st.image(image, caption=f"{view.title} ({view.weights.shape[0]} × {view.weights.shape[1]})")
    else:
        chart = alignment_viz.alignment_chart(view.weights, view.row_labels, view.column_labels, view.title,
                                              gold=view.gold, argmax=view.argmax, max_width=max_width)
        st.altair_chart(chart, width="content")
    model, translated = result.model.key, result.extras["translation"].translation
    units = WORDS if words else PIECES
    share.downloads(
        export.file_stem(model, sentence[:40], "cross", "all layers" if layer is None else f"layer {layer}",
                         "mean" if head is None else f"head {head}", units), key, chart=chart, image=image,
        table=lambda: export.matrix_frame(view.weights, view.row_labels, view.column_labels),
        payload=lambda: export.alignment_payload(view, model, sentence, translated, layer, head, units),
        arrays={"weights": view.weights}, metadata={"model": model, "text": sentence, "translation": translated})
    return view.aer


loaded = load(spec)
sentence = widgets.text_source({name: pair.english for name, pair in showcase.items()}, key="translation",
                               label="English sentence", height=80)
left, right = st.columns(2)
strategy = left.radio("Decoding", translation.STRATEGIES, horizontal=True, key="tr_strategy")
beams = int(right.number_input("Beam width", 2, 16, 4, key="tr_beams", disabled=strategy == "greedy"))
settings = translation.TranslationSettings(strategy, beams, max_source)
result = translate(loaded, sentence, settings)
out = result.extras["translation"]
st.subheader("Translation")
st.code(out.translation or "(empty)", language=None, wrap_lines=True)
reference = translation.reference_for(out, showcase.values())
if reference is not None and reference != out.translation:
    st.warning(widgets.plain(f"The grammar's reference is “{reference}”: this output differs, so no gold alignment "
                             "is drawn. Where the words differ, the attention often shows why."), icon="🔍")
widgets.show_notices(result)
show_vocabulary(loaded)


def alignment_tab():
    if "cross" not in result.attention:
        st.info("This model has no attention: its encoder squeezes the whole sentence into one fixed context vector "
                "(Cho et al. 2014) that every output step reads. Compare its accuracy on long sentences under "
                "Measured quality, or pick a model with attention.")
        return
    aer = show_alignment(result, layer, head, words)
    st.caption("Rows: each output word, labelled with the word it produced (row t is the decoder step whose input "
               "was the previous word). Columns: source words. Each row sums to 1. Orange dots: the source word each "
               "output word attends to most. Red squares: the grammar's gold alignment (shown for the samples).")
    if aer is not None:
        st.metric("Alignment error rate of this map against the gold alignment", f"{aer:.3f}",
                  help="AER (Och & Ney 2003) of the orange dots against the red squares; 0 is perfect.")
    if result.maps("cross").num_heads > 1:
        with st.expander("Every layer and head (model view)"):
            attention_view.model_view((resources.run_key(loaded), sentence, settings, "cross"), result, "cross",
                                      layer or 0, head, key="tr_cross")


def steps_tab():
    steps = result.generation
    share.restore(["tr_step"], {"tr_step": share.within(1, len(steps))})  # a link's step must exist in this output
    t = st.slider("Output step", 1, len(steps), 1, key="tr_step") if len(steps) > 1 else 1
    share.publish(["tr_step"])
    step = steps[t - 1]
    so_far = loaded.tokenizer.decode(out.output_ids[:t], skip_special_tokens=True)
    st.text(f"Step {t} of {len(steps)}: the model chose “{step.token}” (p = {step.probability:.1%}). "
            f"Output so far: {so_far}")
    left, right = st.columns([3, 2])
    charts, arrays = [], {"candidate_probabilities": np.array([c.probability for c in step.candidates])}
    if "cross" in result.attention:  # the layer and head chosen above the tabs
        row = translation.cross_weights(result.maps("cross"), layer, head)[t - 1]
        charts.append(heatmap.token_bars(row, out.source_tokens, f"Source attention at step {t} "
                                         f"({translation.describe_view(result.maps('cross'), layer, head)})"))
        left.altair_chart(charts[-1])
        arrays["source_attention"] = row
    else:
        left.info("No attention: every step reads the same fixed context vector.")
    charts.append(heatmap.probability_bars([c.token for c in step.candidates], [c.probability for c in step.candidates],
                                           f"Top candidates at step {t}", highlight=step.token))
    right.altair_chart(charts[-1])
    share.downloads(export.file_stem(spec.short_name, sentence[:40], f"step {t}"), "tr_step",
                    chart=lambda: export.combined(*charts),
                    payload={"model": spec.key, "source": sentence, "step": t, "token": step.token,
                             "source_tokens": out.source_tokens, "candidates": [c.token for c in step.candidates],
                             **arrays}, arrays=arrays, metadata={"model": spec.key, "text": sentence, "step": t})
    st.caption(f"Decoding: {out.strategy}" + (f" (beam width {out.num_beams})" if out.num_beams > 1 else "") +
               ". Attention and probabilities come from one teacher-forced forward over the final output, so they "
               "belong to the chosen hypothesis; under beam search the chosen token need not be the most probable.")


def self_attention_tab():
    if "encoder" not in result.attention:
        st.info("The GRU models have no self-attention: their encoder and decoder are recurrent.")
        return
    kind = st.radio("Attention", ["encoder", "decoder"], horizontal=True, key="tr_self_kind",
                    format_func={"encoder": "encoder self-attention (source × source)",
                                 "decoder": "decoder masked self-attention (output × output)"}.get)
    st.session_state[f"tr_{kind}_stem"] = (spec.short_name, sentence[:40])  # names the explorer's downloads
    attention_view.explorer((resources.run_key(loaded), sentence, settings, kind), result, kind, key=f"tr_{kind}")


def compare_tab():
    candidates = [s for s in registry.specs("translation") if s.key != spec.key]
    preferred = "mini GRU + additive attention en→fr" if out.architecture == "transformer" else "mini Transformer en→fr"
    default = next((i for i, s in enumerate(candidates) if s.key == preferred), 0)
    other_spec = candidates[st.selectbox("Compare with", range(len(candidates)), index=default,
                                         format_func=lambda i: candidates[i].label, key="tr_compare")]
    other = load(other_spec)
    other_result = translate(other, sentence, settings)
    views = [(spec.key, result, layer, head), (other_spec.key, other_result, *translation.default_view(other, metrics))]
    for column, (name, res, res_layer, res_head) in zip(st.columns(2), views):
        with column:
            st.text(f"{name}: {res.extras['translation'].translation}")
            if "cross" not in res.attention:
                st.info("No attention (fixed context vector).")
                continue
            aer = show_alignment(res, res_layer, res_head, True, max_width=420, key=f"tr_compare_{name}")
            if aer is not None:
                st.metric("AER against gold", f"{aer:.3f}")
            elif translation.reference_for(res.extras["translation"], showcase.values()) is not None:
                st.caption("This translation differs from the grammar's reference, so no gold alignment is drawn.")
    st.caption("Word-level attention of both models on the same sentence: the left one as chosen above; a mini "
               "Transformer on the right shows its best-aligned head on the held-out set (from its card), other models "
               "their last layer's head average. The GRU shows a_t = softmax(v_aᵀ tanh(W_a s_{t-1} + U_a h_i)), the "
               "attention it actually used to read the source.")


def quality_tab():
    if not metrics:
        st.info("No measurements yet: train the minis with `python -m models.minis.translation.train`.")
        return
    st.dataframe(pd.DataFrame(card.summary_rows(metrics)), hide_index=True, column_config={
        "exact match": st.column_config.NumberColumn(format="percent"),
        "AER (best head)": st.column_config.NumberColumn(format="%.3f"),
        "AER (all heads averaged)": st.column_config.NumberColumn(format="%.3f")})
    accuracy = alignment_viz.accuracy_by_length_chart(card.length_rows(metrics))
    st.altair_chart(accuracy)
    share.downloads("translation-minis_exact-match-by-length", "tr_quality", chart=accuracy,
                    table=pd.DataFrame(card.length_rows(metrics)), payload=metrics)
    st.caption("Held-out generated sentences. Without attention, one fixed vector must carry the whole sentence, "
               "and accuracy falls as sentences grow (Cho et al. 2014; Bahdanau et al. 2015, fig. 2).")
    transformer = metrics["models"].get("transformer", {}).get("alignment")
    if transformer:
        st.altair_chart(alignment_viz.aer_grid_chart(np.array(transformer["per_head"]),
                                                     "Mini Transformer: AER of each cross-attention head"),
                        width="content")
        st.caption("Per decoder layer, heads averaged: " + ", ".join(
            f"layer {i}: {v:.3f}" for i, v in enumerate(transformer["per_layer"])) +
            f"; all layers and heads averaged: {transformer['all_layers_average']:.3f}.")
    card_path = SAMPLE_DATA / "translation" / "card.md"
    if card_path.is_file():
        with st.expander("Model card (sample_data/translation/card.md)"):
            st.markdown(card_path.read_text())


layer, head, words = view_picker(result.maps("cross"), loaded, "tr") if "cross" in result.attention else (0, None, True)
VIEWS = {"Alignment": alignment_tab, "Step through decoding": steps_tab, "Self-attention": self_attention_tab,
         "Transformer vs GRU": compare_tab, "Measured quality": quality_tab}
# lazy tabs: only the open one runs (the comparison loads a second model only when it is looked at)
for tab, render in zip(st.tabs(list(VIEWS), key="tr_view", on_change="rerun"), VIEWS.values()):
    if tab.open is not False:
        with tab:
            render()
share.publish(SHARED)
share.publish(list(PER_MODEL), PER_MODEL)
