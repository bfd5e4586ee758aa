"""Speech: Whisper hears a clip; which 20 ms of audio each written token listened to (cross-attention), words timed
from that attention and played back, and the encoder's 1,500 × 1,500 self-attention (Radford et al. 2022)."""
import streamlit as st

from models.core import selection

from app import attention_view, display, tables, url_state, widgets
from app.sections import speech as sections
from models import families
from models.families.speech import language as speech_language
from models.families.speech import model as speech
from viz.figures.speech import SpeechCrossOptions, SpeechStepOptions

LANGUAGES = [speech.AUTO, "en", "fr", "de", "es", "it", "pt", "pl", "nl", "ru", "ja", "zh", "hi", "ko", "ar", "tr"]
# what a link carries: model, sample (never a recording or an upload), task, language, decoding and the views
SHARED = ["model_speech", *sections.SHARED, "sp_task", "sp_language", "sp_strategy", "sp_beams",
          "sp_layer", "sp_head", "sp_view", "sp_self_kind"]
url_state.restore(SHARED, {"sp_beams": int, "sp_layer": url_state.choice("layer"), "sp_head": url_state.choice("head")})

st.title("Speech: Whisper's cross-attention over audio")
spec = widgets.model_picker("speech")
widgets.model_card(spec)
if spec.notes:
    st.caption(widgets.plain(spec.notes))
loaded = widgets.load_or_stop(spec)
inputs = sections.audio_picker()
if inputs is None:
    st.stop()

multilingual = speech.vocabulary(loaded).multilingual
c1, c2, c3, c4 = st.columns(4)
task = c1.radio("Task", speech.TASKS, horizontal=True, key="sp_task", disabled=not multilingual,
                help="Translate: into English (multilingual models only).")
language = c2.selectbox("Language", LANGUAGES if multilingual else ["en"], key="sp_language",
                        help="auto: detected from the audio (the decoder's first step).")
strategy = c3.radio("Decoding", speech.STRATEGIES, horizontal=True, key="sp_strategy")
beams = int(c4.number_input("Beam width", 2, 8, 4, key="sp_beams", disabled=strategy == "greedy"))
settings = speech.SpeechSettings(task if multilingual else "transcribe", language if multilingual else speech.AUTO,
                                 strategy, beams)
result = widgets.run_or_stop(loaded, inputs, settings)
out = result.output

st.subheader("English translation" if out.task == "translate" else "Transcript")
st.code(out.text or "(nothing heard)", language=None, wrap_lines=True)
how = "detected" if out.language_detected else "given" if multilingual else "English-only model"
odds = ", ".join(f"{code} {p:.0%}" for code, p in out.language_probabilities[:3])
if (check := out.language_check) is not None:
    odds = f"{speech_language.LANGUAGE_CHECKER} hears " + ", ".join(f"{code} {p:.0%}" for code, p in check.probabilities[:2])
st.caption(widgets.plain(f"Language: {out.language} ({how}{': ' + odds if odds else ''}) · task: {out.task} · "
                         f"prompt: {' '.join(out.prompt_tokens)} · {len(out.output_ids)} tokens · "
                         f"{result.seconds:.1f} s of audio ({result.audio_frames} encoder frames of 20 ms)"))
for notice in result.notices:
    if notice not in inputs.notes:  # the picker already showed what decoding the audio changed
        st.warning(widgets.plain(notice))


def use_multilingual() -> None:
    """The not-English warning's button: the multilingual model, the language detected from the audio."""
    st.session_state["model_speech"] = families.spec("speech", speech_language.LANGUAGE_CHECKER).label
    st.session_state["sp_language"], st.session_state["sp_task"] = speech.AUTO, "transcribe"


if check is not None and not check.english:
    st.button(f"Switch to {speech_language.LANGUAGE_CHECKER} (multilingual) to transcribe {check.heard}", key="sp_switch",
              icon=":material/translate:", type="primary", on_click=use_multilingual)


def heads_picker() -> tuple:
    """The cross-attention's layer and head (``widgets.layer_and_head``), opening on the model's alignment heads
    (its config names them: their attention follows the speech in time)."""
    maps, named = result.maps("cross"), bool(result.alignment_heads)
    opening = (selection.ALL, selection.NAMED if named else selection.MEAN)
    return widgets.layer_and_head("sp", maps.num_layers, maps.num_heads, all_layers=True,
                                  named_heads=named, opening=opening,
                                  labels=("Cross-attention: decoder layer", "Head"))


def cross_tab():
    layer, head = heads_picker()
    figure = widgets.figure_or_none("cross", result, SpeechCrossOptions(layer, head))
    if figure is not None:
        display.show(figure, "sp_cross")
    if head == selection.NAMED:  # below the figure, which this line would push under the fold
        named = ", ".join(f"L{i}H{h}" for i, h in result.alignment_heads)
        st.caption(f"Alignment heads: {named}; with them the layer is every layer they sit in.")
    sections.playable_words(result, inputs.audio)


TIMING_COLUMNS = {"word": "word", "start": "start (s)", "end": "end (s)", "ct2_start": "CTranslate2 start (s)",
                  "ct2_end": "CTranslate2 end (s)", "difference": "largest difference (s)"}  # the CSV keeps its names


def words_tab():
    figure = widgets.figure_or_none("word_timestamps", result, None, loaded)
    if figure is None:  # not a packaged model: this app's timings alone
        tables.show([{"word": w.text, "start (s)": w.start, "end (s)": w.end} for w in result.words],
                    {"start (s)": "%.2f", "end (s)": "%.2f"})
        return
    display.show(figure, "sp_timing")
    seconds = {name: "%.2f" for name in TIMING_COLUMNS.values() if name != "word"}
    tables.show(figure.table().rename(columns=TIMING_COLUMNS), seconds)


def steps_tab():
    steps = result.generation
    if not steps:
        st.info("Nothing was produced.")
        return
    url_state.restore(["sp_step"], {"sp_step": url_state.within(1, len(steps))})
    t = st.slider("Output step", 1, len(steps), 1, key="sp_step") if len(steps) > 1 else 1
    url_state.publish(["sp_step"])
    step = steps[t - 1]
    so_far = loaded.tokenizer.decode(out.output_ids[:t], skip_special_tokens=True)
    st.text(f"Step {t} of {len(steps)}: the model chose “{step.token}” (p = {step.probability:.1%}). "
            f"Output so far: {so_far}")
    layer, head = heads_picker()
    figure = widgets.figure_or_none("speech_step", result, SpeechStepOptions(t, layer, head))
    if figure is not None:
        display.show(figure, "sp_step")


def attention_tab():
    kind = st.radio("Attention", ["encoder", "decoder", "cross"], horizontal=True, key="sp_self_kind",
                    format_func={"encoder": "encoder self-attention (1,500 frames of 20 ms, padding included)",
                                 "decoder": "decoder masked self-attention (prompt + output)",
                                 "cross": "cross-attention (output tokens × 1,500 frames)"}.get)
    if kind == "encoder":  # the zoom opens on the first frames of speech, not on the padding at the end
        first = (0, min(result.audio_frames, 64) - 1)
        for name in ("sp_encoder_zoom_q", "sp_encoder_zoom_k"):  # (a bare expression would be drawn: Streamlit magic)
            if name not in st.session_state:
                st.session_state[name] = first
    attention_view.explorer(result, kind, key=f"sp_{kind}", loaded=loaded)


def spectrogram_tab():
    figure = widgets.figure_or_none("spectrogram", result)
    if figure is not None:
        display.show(figure, "sp_mel")


TABS = {"Cross-attention": cross_tab, "Word timestamps": words_tab, "Step through decoding": steps_tab,
        "Every layer and head": attention_tab, "Spectrogram": spectrogram_tab}
for tab, render in zip(st.tabs(list(TABS), key="sp_view", on_change="rerun"), TABS.values()):
    if tab.open is not False:
        with tab:
            render()
url_state.publish(SHARED)
