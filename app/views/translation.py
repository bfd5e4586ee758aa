"""Translation: which source words each output word looked at (Bahdanau et al. 2015, fig. 3), step by step, and a
Transformer's cross-attention beside a GRU's additive attention."""
import streamlit as st

from app import attention_view, display, resources, sidebar, tables, url_state, widgets
from app.sections import decoder_lens, faithfulness_text, vocabulary
from models import families
from models.core.inputs import TextInput
from models.families import translation as family
from models.families.translation import bergamot
from models.core import selection
from models.families.translation import model as translation
from models.minis.translation import card
from viz.figures.translation import AlignmentOptions, DecodingStepOptions

WORDS, PIECES = "words", "tokens"
# what a link carries; the cross-attention layer/head pickers are per model, in the URL as tr_layer / tr_head
SHARED = ["model_translation", "tr_max_source", "translation_text", "translation_pt_text", "tr_strategy", "tr_beams", "tr_units", "tr_view",
          "tr_self_kind", "tr_compare", "tr_encoder_layer", "tr_encoder_head", "tr_decoder_layer", "tr_decoder_head"]
url_state.restore(SHARED, {"tr_max_source": int, "tr_beams": int, "tr_compare": int,
                           **dict.fromkeys(["tr_encoder_layer", "tr_decoder_layer"], url_state.within(0, 1000)),
                           **dict.fromkeys(["tr_encoder_head", "tr_decoder_head"], url_state.choice("head"))})

st.title("Translation: cross-attention alignments")
spec = widgets.model_picker("translation")
PER_MODEL = {f"tr_layer_{spec.key}": "tr_layer", f"tr_head_{spec.key}": "tr_head"}
url_state.restore(list(PER_MODEL), {f"tr_layer_{spec.key}": url_state.choice("layer"),
                                    f"tr_head_{spec.key}": url_state.choice("head")}, names=PER_MODEL)
with st.sidebar:
    max_source = int(st.number_input("Source token limit", 8, 1024, translation.DEFAULT_MAX_SOURCE_TOKENS, 8,
                                     key="tr_max_source", help="Longer sentences are refused with a message."))
widgets.model_card(spec)


def load(chosen):
    try:
        return resources.load(chosen, *sidebar.device_choice())
    except ValueError as error:
        widgets.show_error(error)
        if chosen.source == "hub":
            st.info("Hub models need the internet (or a copy in the local Hugging Face cache). The offline models "
                    "in the sidebar always work: the mini Transformer and the two GRUs were trained by this project.")
        st.stop()


def translate(loaded, inputs, settings):
    """The cached run; a user mistake is shown (unknown words with their nearest known words, each a click away)
    and the page stops."""
    try:
        return resources.run(loaded, inputs, settings)
    except translation.UnknownWordsError as error:
        widgets.show_error(error)
        vocabulary.suggestions(error)
        vocabulary.show(loaded, expanded=True)
    except ValueError as error:
        widgets.show_error(error)
    st.stop()


def head_picker(result) -> tuple:
    """(layer choice, head choice, units) of the cross-attention, opened on the model's own choice
    (``opening_head``: the mini Transformer's best-aligned head); a layer may be every layer averaged."""
    maps, (layer, head) = result.maps("cross"), result.opening_head
    left, middle, right = st.columns(3)
    layer, head = widgets.layer_and_head(
        "tr", maps.num_layers, maps.num_heads, all_layers=True, opening=(layer, selection.head_choice(head)),
        labels=("Cross-attention: decoder layer", "Cross-attention: head"), columns=(left, middle),
        layer_key=f"tr_layer_{spec.key}", head_key=f"tr_head_{spec.key}")
    units = right.radio("Units", [WORDS, PIECES], horizontal=True, key="tr_units",
                        help="Words: attention summed over a source word's tokens and averaged over an output "
                             "word's tokens (rows still sum to 1). Tokens: what the model computed.")
    return layer, head, units


loaded = load(spec)
language = family.source_language(spec)  # a Portuguese source has a text box of its own
sentence = widgets.text_source(family.samples(spec), key="translation" + "_pt" * (language != "English"),
                               label=f"{language} sentence", height=80)
left, right = st.columns(2)
strategy = left.radio("Decoding", translation.STRATEGIES, horizontal=True, key="tr_strategy")
beams = int(right.number_input("Beam width", 2, 16, 4, key="tr_beams", disabled=strategy == "greedy"))
inputs, settings = TextInput(sentence, max_source), translation.TranslationSettings(strategy, beams)
result = translate(loaded, inputs, settings)
out = result.output
st.subheader("Translation")
st.code(out.translation or "(empty)", language=None, wrap_lines=True)
if out.reference is not None and out.reference != out.translation:
    st.warning(widgets.plain(f"The grammar's reference is “{out.reference}”: this output differs, so no gold "
                             "alignment is drawn. Where the words differ, the attention often shows why."), icon="🔍")
widgets.show_notices(result)
vocabulary.show(loaded)
layer, head, units = head_picker(result) if "cross" in result.attention else (0, selection.MEAN, WORDS)


def alignment_tab():
    if "cross" not in result.attention:
        st.info("This model has no attention: its encoder squeezes the whole sentence into one fixed context vector "
                "(Cho et al. 2014) that every output step reads. Compare its accuracy on long sentences under "
                "Measured quality, or pick a model with attention.")
        return
    figure = widgets.figure_or_none("alignment", result, AlignmentOptions(layer, head, units))
    if figure is None:
        return
    display.show(figure, "tr_align", caption=False)
    st.caption(figure.caption)  # below the downloads, as the other tabs' captions
    if (aer := figure.payload()["alignment_error_rate"]) is not None:
        st.metric("Alignment error rate of this map against the gold alignment", f"{aer:.3f}",
                  help="AER (Och & Ney 2003) of the orange dots against the red squares; 0 is perfect.")
    if result.maps("cross").num_heads > 1:
        with st.expander("Every layer and head (model view)"):
            shown = selection.pick(result.maps("cross"), 0 if layer == selection.ALL else layer, head,
                                   opening=result.opening_head[0])
            attention_view.model_view(result, "cross", *shown, key="tr_cross", loaded=loaded)


def steps_tab():
    steps = result.generation
    url_state.restore(["tr_step"], {"tr_step": url_state.within(1, len(steps))})  # a link's step must exist
    t = st.slider("Output step", 1, len(steps), 1, key="tr_step") if len(steps) > 1 else 1
    url_state.publish(["tr_step"])
    step = steps[t - 1]
    so_far = loaded.tokenizer.decode(out.output_ids[:t], skip_special_tokens=True)
    st.text(f"Step {t} of {len(steps)}: the model chose “{step.token}” (p = {step.probability:.1%}). "
            f"Output so far: {so_far}")
    figure = widgets.figure_or_none("decoding_step", result, DecodingStepOptions(t, layer, head))
    if figure is None:
        return
    if len(figure.charts) == 1:
        st.info("No attention: every step reads the same fixed context vector.")
    display.show(figure, "tr_step")


def self_attention_tab():
    if "encoder" not in result.attention:
        st.info("The GRU models have no self-attention: their encoder and decoder are recurrent.")
        return
    kinds = [k for k in ("encoder", "decoder") if k in result.attention]
    if "decoder" not in kinds:  # Bergamot: a Transformer encoder, an SSRU decoder
        st.info(bergamot.DECODER_NOTE)
        if st.session_state.get("tr_self_kind") not in kinds:
            st.session_state.pop("tr_self_kind", None)  # a link made on a model with a decoder self-attention
    kind = st.radio("Attention", kinds, horizontal=True, key="tr_self_kind",
                    format_func={"encoder": "encoder self-attention (source × source)",
                                 "decoder": "decoder masked self-attention (output × output)"}.get)
    attention_view.explorer(result, kind, key=f"tr_{kind}", loaded=loaded)


def compare_tab():
    candidates = [s for s in families.specs("translation") if s.key != spec.key]
    preferred = ("mini GRU + additive attention en→fr" if out.architecture.startswith("transformer")
                 else "mini Transformer en→fr")
    default = next((i for i, s in enumerate(candidates) if s.key == preferred), 0)
    other_spec = candidates[st.selectbox("Compare with", range(len(candidates)), index=default,
                                         format_func=lambda i: candidates[i].label, key="tr_compare")]
    other = translate(load(other_spec), inputs, settings)
    # the left one as chosen above; the right one as it opens (AlignmentOptions' -1: its best head, or last layer)
    shown = [(result, AlignmentOptions(layer, head, WORDS, width=420)),
             (other, AlignmentOptions(units=WORDS, width=420))]
    for column, (res, options) in zip(st.columns(2), shown):
        with column:
            st.text(f"{res.model.key}: {res.output.translation}")
            if "cross" not in res.attention:
                st.info("No attention (fixed context vector).")
                continue
            figure = widgets.figure_or_none("alignment", res, options)
            if figure is None:
                continue
            display.show(figure, f"tr_compare_{res.model.key}", caption=False)
            if (aer := figure.payload()["alignment_error_rate"]) is not None:
                st.metric("AER against gold", f"{aer:.3f}")
            elif res.output.reference is not None:
                st.caption("This translation differs from the grammar's reference, so no gold alignment is drawn.")
    st.caption("Word-level attention of both models on the same sentence: the left one as chosen above; a mini "
               "Transformer on the right shows its best-aligned head on the held-out set (from its card), other models "
               "their last layer's head average. The GRU shows a_t = softmax(v_aᵀ tanh(W_a s_{t-1} + U_a h_i)), the "
               "attention it actually used to read the source.")


def quality_tab():
    if spec.library == bergamot.LIBRARY:  # a packaged model: its card (parity, alignment error, licence)
        st.markdown(bergamot.CARD.read_text())
        return
    metrics = translation.read_metrics()
    if not metrics:
        st.info("No measurements yet: train the minis with `python -m models.minis.translation.train`.")
        return
    tables.show(card.summary_rows(metrics))
    if (accuracy := widgets.figure_or_none("accuracy_by_length", None, None, loaded)) is not None:
        display.show(accuracy, "tr_quality")
    if metrics["models"].get("transformer", {}).get("alignment"):
        if (grid := widgets.figure_or_none("aer_grid", None, None, loaded)) is not None:
            display.show(grid, "tr_aer", downloads=False)
    if translation.MODEL_CARD.is_file():
        with st.expander("Model card (sample_data/translation/card.md)"):
            st.markdown(translation.MODEL_CARD.read_text())


TABS = {"Alignment": alignment_tab, "Step through decoding": steps_tab, "Self-attention": self_attention_tab,
        "Transformer vs GRU": compare_tab, "Measured quality": quality_tab,
        "What each decoder layer predicts": lambda: decoder_lens.show(result, loaded),
        "Faithfulness": lambda: faithfulness_text.show_translation(result, loaded)}  # issue 17
# lazy tabs: only the open one runs (the comparison loads a second model only when it is looked at)
for tab, render in zip(st.tabs(list(TABS), key="tr_view", on_change="rerun"), TABS.values()):
    if tab.open is not False:
        with tab:
            render()
url_state.publish(SHARED)
url_state.publish(list(PER_MODEL), PER_MODEL)
