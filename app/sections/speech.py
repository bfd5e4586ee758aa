"""The speech page's widgets: the audio picker (a sample, a recording in the browser, an upload) and the words of a
transcript as buttons that play their span of the audio.

Decoding and every check live in ``models.core.audio`` (formats, channels, rates, 30 s cut, 0 s, damaged files); this
module reads the choice and shows what was changed or what went wrong. A recording or an upload is named
``recording`` / ``upload`` in file names, never by its own file name, and never goes into a link.
"""
from __future__ import annotations

import streamlit as st

from app.widgets import plain, show_error
from models.core import audio
from models.core.inputs import AudioInput
from models.families.speech import model as speech

SOURCES = ("Sample", "Record", "Upload")
SHARED = ["sp_source", "sp_sample"]  # a link carries the source and the sample's name, never audio


@st.cache_data(max_entries=32, show_spinner=False)
def _decode(data: bytes, name: str) -> audio.Audio:
    return audio.decode(data, name)


def audio_picker(default_sample: str = "en quick_brown_fox") -> AudioInput | None:
    """The chosen clip, 16 kHz mono and at most 30 s, or None (nothing given yet, or a file that cannot be read:
    its message is already on the page)."""
    samples = speech.samples()
    left, right = st.columns([1, 2])  # the source and its player beside the clip: a compact header
    source = left.radio("Audio", SOURCES, horizontal=True, key="sp_source",
                        help="A sample clip, a recording from your microphone, or a file (WAV, FLAC, MP3, OGG; any "
                             "rate and channels: resampled to 16 kHz mono; only the first 30 s are used).")
    if source == "Sample":
        if st.session_state.get("sp_sample") not in samples:
            st.session_state["sp_sample"] = default_sample
        right.selectbox("Sample clip", list(samples), key="sp_sample",
                        format_func=lambda name: f"{name}: “{samples[name][1]}”")
        path, reference = samples[st.session_state["sp_sample"]]
        right.caption(plain(f"Reference transcript: {reference} — {speech.SAMPLE_CREDIT}"))
        data, name = path.read_bytes(), f"sample {st.session_state['sp_sample']}"
    elif source == "Record":
        recording = right.audio_input("Record from your microphone", key="sp_recording")
        if recording is None:
            right.info("Press the microphone, speak (up to 30 s), then stop; or pick a sample clip.")
            return None
        data, name = recording.getvalue(), "recording"
    else:
        upload = right.file_uploader("Your audio file", type=list(audio.FORMATS), key="sp_upload")
        if upload is None:
            right.info("Upload a WAV, FLAC, MP3 or OGG file, or pick a sample clip.")
            return None
        data, name = upload.getvalue(), "upload"
    try:
        clip = _decode(data, name)
    except ValueError as error:
        show_error(error)
        return None
    left.audio(clip.wav_bytes(), format="audio/wav")
    for note in clip.notes:
        st.info(plain(note))
    return AudioInput(clip)


def playable_words(result: speech.SpeechResult, clip: audio.Audio, key: str = "sp_word") -> None:
    """Each word as a button; clicking one plays its span (start to end, as the DTW placed it)."""
    if not result.words:
        st.info("No word timings: the model produced no text, or stopped before it ended.")
        return
    st.caption("Click a word to hear where the alignment heads' cross-attention placed it.")
    per_row = 10
    for first in range(0, len(result.words), per_row):
        row = result.words[first:first + per_row]
        for column, (index, word) in zip(st.columns(per_row), enumerate(row, start=first)):
            if column.button(word.text or "·", key=f"{key}_{index}", help=f"{word.start:.2f}–{word.end:.2f} s"):
                st.session_state[f"{key}_playing"] = index
    playing = st.session_state.get(f"{key}_playing")
    if playing is not None and playing < len(result.words):
        word = result.words[playing]
        end = max(word.end, word.start + 0.1)
        st.text(f"Playing “{word.text}”: {word.start:.2f} s to {end:.2f} s")
        st.audio(clip.wav_bytes(), format="audio/wav", start_time=word.start, end_time=end, autoplay=True)
