"""Whisper (the speech page): the CTranslate2 file reader, the conversion proven by parity with the ``ctranslate2``
runtime (same greedy tokens, the same logits), the log-mel spectrogram against transformers' WhisperFeatureExtractor,
cross-attention rows summing to 1, word timestamps against CTranslate2's own ``align()``, bad audio as messages, the
CLI and the page. tiny.en (the small package) carries most tests; the multilingual base one translation."""
from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from models import families
from models.core import audio
from models.families.speech import model as speech
from models.families.speech import timing as word_timing
from models.families.speech import whisper_ct2

ENGLISH = [name for name in speech.samples() if name.startswith("en ")]


@pytest.fixture(scope="module")
def tiny():
    return families.load(families.spec("speech", "whisper-tiny.en"))


@pytest.fixture(scope="module")
def tiny_runtime(tiny):
    return whisper_ct2.ctranslate2_model(str(whisper_ct2.ct2_folder(tiny.spec)))


def _ct2_generate(runtime, mel: np.ndarray, prompt: list[int]):
    import ctranslate2

    features = ctranslate2.StorageView.from_array(np.array(mel[None], dtype=np.float32))
    return runtime.generate(features, [prompt], beam_size=1, return_logits_vocab=True, max_length=128)[0]


# --- the CTranslate2 file reader ------------------------------------------------------------------------------------

def _ct2_string(text: str) -> bytes:
    raw = text.encode() + b"\0"
    return struct.pack("<H", len(raw)) + raw


def _ct2_file(variables: dict[str, np.ndarray], aliases: dict[str, str]) -> bytes:
    """A CTranslate2 model.bin written from the layout in CTranslate2's model reader (an independent writer)."""
    codes = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.int16): 2, np.dtype(np.float16): 4}
    out = struct.pack("<I", 6) + _ct2_string("WhisperSpec") + struct.pack("<II", 3, len(variables))
    for name, array in variables.items():
        out += _ct2_string(name) + struct.pack("<B", array.ndim) + struct.pack(f"<{array.ndim}I", *array.shape)
        out += struct.pack("<BI", codes[array.dtype], array.nbytes) + array.tobytes()
    out += struct.pack("<I", len(aliases))
    for alias, target in aliases.items():
        out += _ct2_string(alias) + _ct2_string(target)
    return out


def test_reader_reads_names_shapes_dtypes_scalars_and_aliases():
    rng = np.random.default_rng(0)
    variables = {"a/weight": rng.standard_normal((3, 4)).astype(np.float16), "a/bias": np.arange(3, dtype=np.float32),
                 "heads": np.array(6, dtype=np.int16), "flag": np.array(1, dtype=np.int8)}
    spec, read = whisper_ct2.read_model_bin(_ct2_file(variables, {"b/weight": "a/weight"}))
    assert spec == "WhisperSpec"
    for name, array in variables.items():
        assert read[name].dtype == array.dtype and read[name].shape == array.shape
        np.testing.assert_array_equal(read[name], array)
    assert read["b/weight"] is read["a/weight"]
    with pytest.raises(ValueError, match="truncated"):
        whisper_ct2.read_model_bin(_ct2_file(variables, {})[:60])


def test_fused_projections_split_back_into_q_k_v(tiny):
    """The converted q, k, v of a layer, stacked again, are CTranslate2's fused matrix, float16 -> float32 exactly."""
    source = whisper_ct2.ct2_folder(tiny.spec)
    _, variables = whisper_ct2.read_model_bin((source / "model.bin").read_bytes())
    layer = tiny.model.model.decoder.layers[1]
    fused = np.concatenate([layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight,
                            layer.self_attn.v_proj.weight])
    np.testing.assert_array_equal(fused, variables["decoder/layer_1/self_attention/linear_0/weight"].astype(np.float32))
    kv = np.concatenate([layer.encoder_attn.k_proj.weight, layer.encoder_attn.v_proj.weight])
    np.testing.assert_array_equal(kv, variables["decoder/layer_1/attention/linear_1/weight"].astype(np.float32))
    assert layer.self_attn.k_proj.bias is None
    assert tiny.model.config.encoder_layers == 4 and tiny.model.config.decoder_attention_heads == 6


# --- parity with the ctranslate2 runtime -------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(speech.samples()))
def test_converted_model_decodes_and_scores_as_ctranslate2(tiny, tiny_runtime, name):
    """Every sample (tiny.en hears the other languages as English, which makes the tokens harder to agree on):
    the same greedy tokens, logits within float16 tolerance at every step, and the same beam search (width 4)."""
    mel = audio.log_mel(speech.sample_input(name).audio.samples)
    prompt = [50257, 50362]  # <|startoftranscript|> <|notimestamps|>
    theirs = _ct2_generate(tiny_runtime, mel, prompt)
    with torch.inference_mode():
        hidden = tiny.model.model.encoder(torch.from_numpy(mel)[None]).last_hidden_state
        produced = speech.decode(tiny, hidden, prompt, speech.SpeechSettings(max_new_tokens=128))
        logits = tiny.model(encoder_outputs=speech._encoder_outputs(hidden),
                            decoder_input_ids=torch.tensor([prompt + produced])).logits[0].numpy()
    assert produced[:-1] == theirs.sequences_ids[0] and produced[-1] == 50256, name
    import ctranslate2

    beam = speech.decode(tiny, hidden, prompt, speech.SpeechSettings(strategy="beam search", num_beams=4))
    their_beam = tiny_runtime.generate(ctranslate2.StorageView.from_array(np.array(mel[None])), [prompt],
                                       beam_size=4, max_length=128)[0]
    assert beam[:-1] == their_beam.sequences_ids[0], f"{name}: beam search of width 4"
    for step, their_logits in enumerate(theirs.logits[0]):
        their_logits = np.asarray(their_logits).reshape(-1)
        allowed = their_logits > -1e30  # ctranslate2 writes its suppressed tokens as -FLT_MAX
        np.testing.assert_allclose(logits[len(prompt) - 1 + step][allowed], their_logits[allowed], atol=2e-3)


@pytest.fixture(scope="module")
def base():
    return families.load(families.spec("speech", "whisper-base"))


def test_multilingual_base_detects_translates_and_times_as_ctranslate2(base):
    """The two-part package joined and converted: language detection, the English translation of a French clip and
    its word timestamps agree with the ctranslate2 runtime."""
    runtime = whisper_ct2.ctranslate2_model(str(whisper_ct2.ct2_folder(base.spec)))
    inputs = speech.sample_input("fr pangrama")
    result = families.run(base, inputs, speech.SpeechSettings(task="translate"))
    import ctranslate2

    features = ctranslate2.StorageView.from_array(np.array(result.mel[None]))
    language, probability = runtime.detect_language(features)[0][0]
    assert language == "<|fr|>" and result.output.language == "fr" and result.output.language_detected
    assert result.output.language_probabilities[0][1] == pytest.approx(probability, abs=1e-3)
    theirs = _ct2_generate(runtime, result.mel, result.output.prompt_ids)
    assert result.output.output_ids[:-1] == theirs.sequences_ids[0]
    assert "whisk" in result.output.text.lower()  # "Portez ce vieux whisky au juge blond qui fume", in English
    timing = word_timing.ctranslate2_alignment(base, result)
    assert timing["max_difference"] <= 0.2


def test_english_only_model_says_when_the_clip_is_not_english(tiny, base, fox):
    """Issue 28: tiny.en given French writes English-sounding gibberish. Its run asks whisper-base's language
    detection: French audio is named as such (by the same probabilities whisper-base itself detects with), with a
    notice that offers the multilingual model; English audio passes on the quick look at the clip's own frames."""
    french = families.run(tiny, speech.sample_input("fr bonjour_monde"))
    check = french.output.language_check
    assert not check.english and check.heard == "French" and check.window == "30 s"
    itself = families.run(base, speech.sample_input("fr bonjour_monde"))  # whisper-base, language auto
    assert itself.output.language == "fr" == check.probabilities[0][0]
    assert check.probabilities[0][1] == pytest.approx(itself.output.language_probabilities[0][1], abs=1e-3)
    notice = next(n for n in french.notices if n.startswith("This does not sound like English"))
    assert "hears French 98%" in notice and "whisper-base transcribes French" in notice
    assert fox.output.language_check.english and fox.output.language_check.window == "clip"
    assert not any("English" in n for n in fox.notices)
    unchecked = families.run(tiny, speech.sample_input("fr bonjour_monde"), speech.SpeechSettings(check_language=False))
    assert unchecked.output.language_check is None and not unchecked.notices
    assert itself.output.language_check is None  # a multilingual model detects the language itself


def test_english_only_model_refuses_translation_and_other_languages(tiny):
    inputs = speech.sample_input("en hello_world")
    with pytest.raises(ValueError, match="English-only"):
        families.run(tiny, inputs, speech.SpeechSettings(task="translate"))
    with pytest.raises(ValueError, match="only knows English"):
        families.run(tiny, inputs, speech.SpeechSettings(language="fr"))
    with pytest.raises(ValueError, match="Beam width"):
        speech.SpeechSettings(strategy="beam search", num_beams=50).validate()


# --- the run: maps, timestamps, beams ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fox(tiny):
    return families.run(tiny, speech.sample_input("en quick_brown_fox"))


def test_transcript_and_cross_attention_rows_sum_to_one(fox):
    assert fox.output.text == "The quick brown fox jumps over the lazy dog."
    cross = fox.maps("cross")
    assert cross.num_layers == 4 and cross.num_heads == 6
    assert cross.query_tokens == fox.output.output_tokens and len(cross.key_tokens) == audio.ENCODER_FRAMES
    for layer in range(cross.num_layers):
        np.testing.assert_allclose(cross.layer(layer).sum(axis=-1), 1.0, atol=1e-5)
    decoder = fox.maps("decoder").layer(0)
    assert np.all(np.triu(decoder[0], k=1) == 0)  # masked: no token sees the future
    weights, described = speech.cross_attention(fox, "all", "alignment")
    expected = np.mean([cross.head(i, h) for i, h in fox.alignment_heads], axis=0)
    np.testing.assert_allclose(weights, expected, atol=1e-6)
    assert "8 alignment heads" in described


def test_cross_attention_equals_an_eager_forward(tiny, fox):
    """The captured cross-attention is what transformers' eager attention returns for the same forward."""
    from transformers import WhisperForConditionalGeneration

    eager = WhisperForConditionalGeneration.from_pretrained(tiny.model.name_or_path, attn_implementation="eager")
    prompt, out = fox.output.prompt_ids, fox.output.output_ids
    with torch.inference_mode():
        result = eager(input_features=torch.from_numpy(np.array(fox.mel))[None],
                       decoder_input_ids=torch.tensor([prompt + out[:-1]]), output_attentions=True)
    first = len(prompt) - 1
    for layer in range(4):
        np.testing.assert_allclose(fox.maps("cross").layer(layer), result.cross_attentions[layer][0, :, first:],
                                   atol=1e-5)
    np.testing.assert_allclose(fox.maps("encoder").layer(3), result.encoder_attentions[3][0], atol=1e-5)


@pytest.mark.parametrize("name", ENGLISH)
def test_word_timestamps_within_0_2_s_of_ctranslate2_align(tiny, name):
    result = families.run(tiny, speech.sample_input(name))
    timing = word_timing.ctranslate2_alignment(tiny, result)
    assert len(timing["words"]) == len(result.words) >= 2
    assert timing["max_difference"] <= 0.2, timing
    starts = [w.start for w in result.words]
    assert starts == sorted(starts) and result.words[-1].end <= result.seconds + 0.2


def test_dtw_finds_the_diagonal_and_words_split_at_spaces(tiny):
    matrix = np.eye(4).repeat(3, axis=1)  # token i lives in frames 3i..3i+2
    tokens, times = word_timing.dtw_path(matrix)
    assert tokens[0] == 0 and times[0] == 0 and tokens[-1] == 3 and times[-1] == 11
    entry = [times[np.argmax(tokens == i)] for i in range(4)]
    assert entry == [0, 3, 6, 9]
    ids = tiny.tokenizer(" Hello, wonderful world.", add_special_tokens=False)["input_ids"]
    assert [w for w, _, _ in word_timing.word_groups(tiny.tokenizer, ids, "en")] == ["Hello,", "wonderful", "world."]


# --- log-mel --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("signal, bins", [("sample", 80), ("noise", 80), ("long", 80), ("silence", 80),
                                          ("sample", 128)])
def test_log_mel_equals_whisper_feature_extractor(signal, bins):
    """80 mel bins, and large-v3's 128."""
    from transformers import WhisperFeatureExtractor

    rng = np.random.default_rng(1)
    samples = {"sample": lambda: speech.sample_input("fr bonjour_monde").audio.samples,
               "noise": lambda: (0.1 * rng.standard_normal(16000 * 3)).astype(np.float32),
               "long": lambda: (0.1 * rng.standard_normal(16000 * 31)).astype(np.float32),
               "silence": lambda: np.zeros(16000, dtype=np.float32)}[signal]()
    extractor = WhisperFeatureExtractor(feature_size=bins)
    expected = extractor(samples[:audio.CHUNK_SAMPLES], sampling_rate=16000, return_tensors="np").input_features[0]
    np.testing.assert_allclose(audio.log_mel(samples, bins), expected, atol=1e-4)
    np.testing.assert_allclose(audio.mel_filters(bins), extractor.mel_filters.T, atol=1e-7)


# --- bad audio ------------------------------------------------------------------------------------------------

def _encoded(samples: np.ndarray, rate: int, fmt: str = "WAV", subtype: str = "PCM_16") -> bytes:
    import soundfile

    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


def test_bad_audio_gets_a_clear_message():
    with pytest.raises(ValueError, match="could not be read as audio.*renamed to .wav"):
        audio.decode(b"This is a text file with a .wav name.\n" * 20, "upload")
    with pytest.raises(ValueError, match="empty"):
        audio.decode(b"", "upload")
    with pytest.raises(ValueError, match="0 s"):
        audio.decode(_encoded(np.zeros((0, 1), dtype=np.int16), 16000), "upload")
    good = _encoded(np.zeros(16000, dtype=np.int16), 16000)
    corrupt = good[:22] + struct.pack("<H", 0) + good[24:]  # the header's channel count set to 0
    with pytest.raises(ValueError, match="could not be read as audio|damaged"):
        audio.decode(corrupt, "upload")
    with pytest.raises(ValueError, match="could not be read as audio"):
        audio.decode(b"RIFX" + good[4:], "upload")
    with pytest.raises(ValueError, match="too short"):
        audio.decode(_encoded(np.zeros(40, dtype=np.int16), 16000), "upload")


def test_two_hours_8_khz_and_six_channels_are_used_with_notes():
    import soundfile

    buffer = io.BytesIO()
    with soundfile.SoundFile(buffer, "w", samplerate=8000, channels=1, format="FLAC", subtype="PCM_16") as sound:
        block = np.zeros(8000 * 600, dtype=np.int16)
        for _ in range(12):  # two hours of 8 kHz silence: 180 kB of FLAC
            sound.write(block)
    long = audio.decode(buffer.getvalue(), "upload")
    assert long.seconds == pytest.approx(30.0) and long.original_seconds == pytest.approx(7200.0)
    assert any("2 h 0 min" in note and "first 30 s" in note for note in long.notes)
    assert any("8,000 Hz" in note and "4 kHz" in note for note in long.notes)

    t = np.arange(8000) / 8000
    tone = audio.decode(_encoded((0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 8000, subtype="FLOAT"),
                        "upload")
    assert len(tone.samples) == 16000
    spectrum = np.abs(np.fft.rfft(tone.samples))
    assert np.argmax(spectrum) == pytest.approx(440, abs=2)  # 1 s at 16 kHz: one bin per Hz; the tone kept its pitch

    channels = np.zeros((16000, 6), dtype=np.float32)
    channels[:, 2] = 0.6
    mixed = audio.decode(_encoded(channels, 16000, subtype="FLOAT"), "upload")
    assert any("6 channels" in note for note in mixed.notes)
    np.testing.assert_allclose(mixed.samples, 0.1, atol=1e-6)


def test_mp3_and_ogg_decode():
    t = np.arange(16000) / 16000
    tone = (0.3 * np.sin(2 * np.pi * 300 * t)).astype(np.float32)
    for fmt, subtype in (("MP3", "MPEG_LAYER_III"), ("OGG", "VORBIS"), ("FLAC", "PCM_16")):
        decoded = audio.decode(_encoded(tone, 16000, fmt, subtype), "upload")
        assert abs(decoded.seconds - 1.0) < 0.1, fmt
        assert abs(np.argmax(np.abs(np.fft.rfft(decoded.samples[:16000]))) * 16000 / 16000 - 300) < 3, fmt


# --- figures, CLI and the page --------------------------------------------------------------------------------

def test_the_step_shown_for_a_token_is_the_position_whose_distribution_chose_it(tiny):
    """Issue 28, the step convention (as on the GPT and translation pages): the cross-attention shown for token t is
    that of the decoder position whose next-token distribution chose it, checked against the decoder fed only the
    prompt and the tokens before t (its last position), and the caption says so."""
    from transformers import WhisperForConditionalGeneration

    from models.core.results import STEP_CONVENTION
    from viz import figures
    from viz.figures.speech import SpeechStepOptions

    result = families.run(tiny, speech.sample_input("en hello_world"), speech.SpeechSettings(check_language=False))
    eager = WhisperForConditionalGeneration.from_pretrained(speech.converted_folder(tiny.spec),
                                                            attn_implementation="eager").eval()
    with torch.no_grad():
        encoded = eager.model.encoder(torch.from_numpy(result.mel)[None]).last_hidden_state
    out = result.output
    for t in range(1, len(out.output_ids) + 1):
        figure = figures.build("speech_step", result, SpeechStepOptions(t, 2, 3))
        prefix = torch.tensor([out.prompt_ids + out.output_ids[:t - 1]])
        with torch.no_grad():
            forward = eager(encoder_outputs=(encoded,), decoder_input_ids=prefix, output_attentions=True)
        logits = forward.logits[0, -1].clone()
        assert figure.payload()["probability"] == pytest.approx(
            float(torch.softmax(logits.float(), -1)[out.output_ids[t - 1]]), abs=1e-4)
        np.testing.assert_allclose(figure.arrays()["attention"],
                                   forward.cross_attentions[2][0, 3, -1, :result.audio_frames].numpy(), atol=1e-5)
    assert STEP_CONVENTION in figure.caption


def test_figures_hold_the_models_numbers(fox):
    from tests.conftest import check_files
    from viz import figures

    cross = figures.build("cross", fox)
    files = check_files(cross)
    payload = json.loads(files["json"])
    assert payload["text"] == fox.output.text and payload["language"] == "en"
    assert payload["frames"] == fox.audio_frames and payload["tokens"] == fox.output.output_tokens
    saved = np.load(io.BytesIO(files["npz"]))
    np.testing.assert_allclose(saved["cross_attention"], speech.cross_attention(fox)[0])
    step = figures.build("speech_step", fox, figures.get("speech_step").options(step=2, layer=3, head=1))
    np.testing.assert_allclose(step.arrays()["attention"], fox.maps("cross").head(3, 1)[1, :fox.audio_frames])
    check_files(figures.build("spectrogram", fox))
    with pytest.raises(ValueError, match="does not exist"):
        figures.build("cross", fox, figures.get("cross").options(layer=9, head=0))


def test_cli_writes_text_tokens_frames_language_and_maps(tmp_path):
    from app import cli

    code = cli.main(["--page", "speech", "--audio", str(speech.SAMPLES / "en_hello_world.wav"), "--view", "cross",
                     "--format", "json,npz", "--out", str(tmp_path)])
    assert code == 0
    payload = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert {"text", "tokens", "frames", "language"} <= set(payload)
    assert "hello" in payload["text"].lower() and payload["language"] == "en"
    arrays = np.load(next(tmp_path.glob("*.npz")))
    assert arrays["cross_attention"].shape == (len(payload["tokens"]), audio.ENCODER_FRAMES)
    assert cli.main(["--page", "speech", "--audio", str(tmp_path / "missing.wav")]) == 2


def shown(elements) -> list[str]:
    """The text of captions and messages as a person reads them (``widgets.plain`` escapes Markdown)."""
    import re

    return [re.sub(r"\\(.)", r"\1", element.value) for element in elements]


def _speech_page():
    from streamlit.testing.v1 import AppTest

    from tests.conftest import ROOT

    return AppTest.from_file(str(ROOT / "app" / "views" / "speech.py"), default_timeout=300)


def test_page_opens_on_the_alignment_heads_following_the_speech(fresh_caches, offered):
    """The default view teaches what cross-attention over audio is: an English clip on the English model, its
    alignment heads' cross-attention (the heads whose attention follows the speech in time; a single head such as
    L0H0 puts every token on the same frame), each token listening further into the clip than the one before."""
    at = _speech_page().run()
    assert not at.exception, at.exception
    assert at.sidebar.selectbox(key="model_speech").value.startswith("whisper-tiny.en")
    assert at.selectbox(key="sp_sample").value == "en quick_brown_fox"
    assert at.tabs[0].label == "Cross-attention" and at.selectbox(key="sp_head").value == "alignment"
    assert at.code[0].value == "The quick brown fox jumps over the lazy dog."
    payload = offered["sp_cross"].payload()
    assert payload["heads"].startswith("mean of the 8 alignment heads")
    listened = np.asarray(payload["weights"])[:-1].argmax(axis=1)  # the text tokens' most-attended frames
    assert np.all(np.diff(listened) > 0), listened
    assert [w["word"] for w in payload["words"]] == "The quick brown fox jumps over the lazy dog.".split()
    assert any("English-only model: whisper-base hears en 100%" in c for c in shown(at.caption))
    assert not at.warning and "sp_switch" not in [b.key for b in at.button]  # English: nothing to offer


def test_page_shows_transcript_and_every_tab(fresh_caches, offered):
    from tests.conftest import url_param

    at = _speech_page().run()
    assert not at.exception, at.exception
    assert at.code[0].value == "The quick brown fox jumps over the lazy dog."
    assert "cross_alignment-heads" in offered["sp_cross"].stem
    at.session_state["sp_view"] = "Word timestamps"
    at.run()
    assert not at.exception, at.exception
    assert offered["sp_timing"].payload()["max_difference"] <= 0.2
    timings = at.dataframe[0].value
    assert list(timings.columns) == ["word", "start (s)", "end (s)", "CTranslate2 start (s)", "CTranslate2 end (s)",
                                     "largest difference (s)"]  # human names, no snake_case
    assert list(timings["word"]) == "The quick brown fox jumps over the lazy dog.".split()
    at.session_state["sp_view"] = "Step through decoding"
    at.run()
    assert not at.exception, at.exception
    assert any(t.value.startswith("Step 1 of 11: the model chose “The”") for t in at.text)
    at.slider(key="sp_step").set_value(4).run()
    assert any(t.value.startswith("Step 4 of 11: the model chose") and "fox" in t.value for t in at.text)
    assert offered["sp_step"].payload()["step"] == 4
    at.session_state["sp_view"] = "Every layer and head"
    at.run()
    assert not at.exception, at.exception
    assert len(at.get("vega_lite_chart")) + len(at.get("image")) >= 1
    at.session_state["sp_view"] = "Spectrogram"
    at.run()
    assert not at.exception, at.exception
    assert offered["sp_mel"].payload()["frames"] == 2 * 145  # the 2.9 s clip's 10 ms frames, padding cut off
    assert url_param(at, "sp_sample") == "en quick_brown_fox"
    at.session_state["sp_source"] = "Upload"
    at.run()
    assert not at.exception and any("Upload a WAV" in info.value for info in at.info)
    assert not at.code  # nothing transcribed until a file is given


def test_page_offers_the_multilingual_model_for_french_audio(fresh_caches):
    """Issue 28: French audio on the English-only model is named as French (whisper-base's language detection),
    and one click switches to whisper-base, which transcribes it in French."""
    at = _speech_page().run()
    at.selectbox(key="sp_sample").set_value("fr bonjour_monde").run()
    assert not at.exception, at.exception
    warning = next(w.value for w in at.warning if "does not sound like English" in w.value)
    assert "French" in warning and "whisper" in warning
    switch = at.button(key="sp_switch")
    assert switch.label == "Switch to whisper-base (multilingual) to transcribe French"
    switch.click().run()
    assert not at.exception, at.exception
    assert at.sidebar.selectbox(key="model_speech").value.startswith("whisper-base")
    assert "bonjour" in at.code[0].value.lower()
    assert any("Language: fr (detected: fr 98%" in c for c in shown(at.caption))
    assert not any("does not sound like English" in w.value for w in at.warning)
    assert "sp_switch" not in [b.key for b in at.button]


def test_a_saved_whisper_folder_loads_and_runs_through_the_same_code(tiny, allowed_dirs):
    """The hub / local-folder path: a small random Whisper saved with save_pretrained (the tiny.en tokenizer beside
    it) loads as a typed folder, runs with capture, and falls back to the upper decoder half for alignment heads."""
    import shutil

    from transformers import WhisperConfig, WhisperForConditionalGeneration

    config = WhisperConfig(vocab_size=tiny.model.config.vocab_size, d_model=32, encoder_layers=2, decoder_layers=2,
                           encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                           decoder_ffn_dim=64, decoder_start_token_id=50257, eos_token_id=50256, pad_token_id=50256,
                           bos_token_id=50256)
    torch.manual_seed(0)
    folder = allowed_dirs / "tiny-whisper"
    WhisperForConditionalGeneration(config).save_pretrained(folder)
    for source in Path(tiny.model.name_or_path).glob("*token*"):  # tokenizer.json, tokenizer_config.json, ...
        shutil.copy(source, folder / source.name)
    loaded = families.load(families.custom("speech", str(folder)))
    result = families.run(loaded, speech.sample_input("en hello_world"), speech.SpeechSettings(max_new_tokens=5))
    assert result.alignment_heads == ((1, 0), (1, 1))
    assert len(result.output.output_ids) <= 5 and result.maps("cross").num_layers == 2
    np.testing.assert_allclose(result.maps("cross").layer(1).sum(axis=-1), 1.0, atol=1e-5)
    with pytest.raises(ValueError, match="Whisper"):
        bad = allowed_dirs / "not-whisper"
        from transformers import BertConfig, BertModel

        BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
                  ).save_pretrained(bad)
        families.load(families.custom("speech", str(bad)))
