"""Is it English? An English-only Whisper (tiny.en) writes English-sounding words for any language: its run asks the
packaged multilingual whisper-base's language detection, through CTranslate2's runtime, and says so when the clip is
not English.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from models.families.speech import whisper_ct2

LANGUAGE_CHECKER = "whisper-base"  # the packaged multilingual Whisper whose language detection answers
ENGLISH_AT_LEAST = 0.5  # P(<|en|>) from which a clip counts as English


@dataclass(frozen=True)
class LanguageCheck:
    """Whisper's language detection by the multilingual whisper-base on a clip an English-only model transcribed:
    the language tokens' probabilities after <|startoftranscript|> (best first, top 5), over which window, and what
    it cost."""

    probabilities: tuple[tuple[str, float], ...]  # (code, probability)
    window: str  # "clip": the clip's own frames only (the quick look); "30 s": Whisper's own padded 30 s window
    seconds: float

    @property
    def english(self) -> bool:
        return dict(self.probabilities).get("en", 0.0) >= ENGLISH_AT_LEAST or self.probabilities[0][0] == "en"

    @property
    def heard(self) -> str:
        """The most probable language by name, e.g. "French"."""
        return language_name(self.probabilities[0][0])


def language_name(code: str) -> str:
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    return LANGUAGES.get(code, code).title()


def check_language(mel: np.ndarray, audio_frames: int) -> LanguageCheck:
    """Is this clip English? Asked of whisper-base's language tokens, through its packaged CTranslate2 runtime
    (float32: the same probabilities as the converted model, and the instance the word-timing check shares).

    Two looks, so that English, what an English-only model is for, costs almost nothing: first the clip's own
    encoder frames only (about 1/20 of the work of a 30 s window for a few seconds of speech; measured 0.17 s
    against 4.4 s at load 15 on 2 cores); when that does not find English, Whisper's own procedure, the padded 30 s
    window, decides. ``mel``: ``(80, 3000)`` log-mel (whisper-base's 80 bins, whatever the checked model reads);
    ``audio_frames``: encoder frames that hold the audio."""
    import time

    import ctranslate2

    from models import families

    started = time.perf_counter()
    model = whisper_ct2.ctranslate2_model(str(whisper_ct2.ct2_folder(families.spec("speech", LANGUAGE_CHECKER))))

    def detect(frames: np.ndarray) -> tuple[tuple[str, float], ...]:
        found = model.detect_language(ctranslate2.StorageView.from_array(np.ascontiguousarray(frames[None])))[0]
        return tuple((token.strip("<|>"), float(p)) for token, p in found[:5])

    mel = np.asarray(mel, dtype=np.float32)
    quick = LanguageCheck(detect(mel[:, :2 * audio_frames]), "clip", 0.0)
    found = quick if quick.english else LanguageCheck(detect(mel), "30 s", 0.0)
    return LanguageCheck(found.probabilities, found.window, time.perf_counter() - started)


def not_english_notice(model_key: str, check: LanguageCheck) -> str:
    shown = [(code, p) for i, (code, p) in enumerate(check.probabilities[:3]) if i == 0 or p >= 0.01]
    odds = ", ".join(f"{language_name(code)} {p:.0%}" for code, p in shown)
    return (f"This does not sound like English: {LANGUAGE_CHECKER}'s language detection hears {odds}. "
            f"{model_key} only knows English, so its transcript is English words guessed from the sounds. "
            f"The multilingual {LANGUAGE_CHECKER} transcribes {check.heard} (and can translate it into English).")
