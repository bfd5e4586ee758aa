"""Word timestamps from cross-attention, as Whisper's ``timing.py`` does it (Radford et al. 2022, §3.8 and the
reference implementation): the alignment heads' cross-attention over the frames that hold audio, each head
standardised over tokens, median-filtered over time (width 7), averaged over heads, then dynamic time warping from
the first token and frame to the last; a word starts where the path first enters its first token's row.
``ctranslate2_alignment`` times the same words through CTranslate2's own ``align()``, to compare.
"""
from __future__ import annotations

import unicodedata
from dataclasses import dataclass

import numpy as np

from models.core import audio as audio_lib
from models.families.speech import whisper_ct2

NO_SPACE_LANGUAGES = ("zh", "ja", "th", "lo", "my", "yue")  # written without spaces: each token is a "word"
MEDIAN_WIDTH = 7  # Whisper's median filter over time for word timestamps


@dataclass(frozen=True)
class Word:
    text: str
    tokens: tuple[int, int]  # [first, last) index into the output tokens
    start: float  # seconds
    end: float


def alignment_matrix(weights: np.ndarray, audio_frames: int, median_width: int = MEDIAN_WIDTH) -> np.ndarray:
    """``(tokens, audio_frames)`` from the alignment heads' cross-attention ``weights (heads, tokens, frames)``:
    each row renormalised over the frames that hold audio (= softmax over those frames only), each head
    standardised over tokens, median-filtered over time, then averaged over heads."""
    from scipy.ndimage import median_filter

    cropped = weights[:, :, :audio_frames].astype(np.float64)
    cropped = cropped / np.maximum(cropped.sum(axis=-1, keepdims=True), 1e-12)
    mean = cropped.mean(axis=1, keepdims=True)
    std = cropped.std(axis=1, keepdims=True)
    standardised = (cropped - mean) / np.maximum(std, 1e-12)
    if median_width > 1 and audio_frames >= median_width:
        standardised = median_filter(standardised, size=(1, 1, median_width), mode="mirror")
    return standardised.mean(axis=0)


def dtw_path(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(token indices, frame indices) of the monotonic path from (0, 0) to (last, last) that maximises the summed
    ``matrix (tokens, frames)``: dynamic time warping on its negation, steps down, right or diagonal."""
    rows, cols = matrix.shape
    cost = np.full((rows + 1, cols + 1), np.inf)
    cost[0, 0] = 0.0
    trace = np.zeros((rows + 1, cols + 1), dtype=np.int8)  # 0 diagonal, 1 from above (next token), 2 from left
    negated = -matrix
    for i in range(1, rows + 1):
        row_cost, above, diagonal = cost[i], cost[i - 1, 1:], cost[i - 1, :-1]
        step = np.minimum(diagonal, above)
        came = np.where(diagonal <= above, 0, 1)
        # the left neighbour depends on this row: a running scan over frames (one row at a time in Python)
        values, origins = negated[i - 1], trace[i]
        running = np.inf
        for j in range(1, cols + 1):
            best, origin = (step[j - 1], came[j - 1])
            if running < best:
                best, origin = running, 2
            running = best + values[j - 1]
            row_cost[j] = running
            origins[j] = origin
    i, j = rows, cols
    path = []
    while i > 0 and j > 0:
        path.append((i - 1, j - 1))
        origin = trace[i, j]
        if origin == 0:
            i, j = i - 1, j - 1
        elif origin == 1:
            i -= 1
        else:
            j -= 1
    path.reverse()
    tokens, times = (np.array(axis) for axis in zip(*path))
    return tokens, times


CLOSING_PUNCTUATION = set(".,!?:;)]}\"'»”。，！？：；、")


def word_groups(tokenizer, ids: list[int], language: str) -> list[tuple[str, int, int]]:
    """(word, first token, end token) over ``ids`` (the end token excluded), as Whisper splits words: a word starts
    at a token that begins with a space or at punctuation that opens ("-", "(", "¿"); closing punctuation (".", ",",
    "?") joins the word before; languages written without spaces split at every token that completes its
    characters."""
    groups: list[list] = []  # [first, end]
    for index, piece in enumerate(tokenizer.decode([i]) for i in ids):
        stripped = piece.strip()
        punctuation = stripped != "" and all(unicodedata.category(c).startswith("P") for c in stripped)
        if not groups:
            starts = True
        elif punctuation:
            starts = not set(stripped) <= CLOSING_PUNCTUATION
        elif language in NO_SPACE_LANGUAGES:
            starts = "\ufffd" not in tokenizer.decode(ids[groups[-1][0]:index])  # the word before is whole
        else:
            starts = piece.startswith(" ")
        if starts:
            groups.append([index, index + 1])
        else:
            groups[-1][1] = index + 1
    return [(tokenizer.decode(ids[a:b]).strip(), a, b) for a, b in groups]


def word_timings(tokenizer, produced: list[int], language: str,
                 path: tuple[np.ndarray, np.ndarray]) -> list[Word]:
    """Words with (start, end) in seconds from a DTW path over rows = produced tokens (the end token last)."""
    tokens, times = path
    jumps = np.concatenate([[True], np.diff(tokens) > 0])
    entry = times[jumps] * audio_lib.SECONDS_PER_ENCODER_FRAME  # when the path enters each token's row
    text_ids = produced[:-1]
    words = []
    for word, a, b in word_groups(tokenizer, text_ids, language):
        if word:
            words.append(Word(word, (a, b), float(entry[a]), float(entry[min(b, len(entry) - 1)])))
    return words


def ctranslate2_alignment(loaded, result, options=None) -> dict:
    """The same words timed by CTranslate2's ``align()`` (its own cross-attention DTW over the same alignment
    heads) from the same mel spectrogram: {"words": [{word, start, end, ct2_start, ct2_end, difference}],
    "mean_difference", "max_difference"} (seconds). Packaged models only."""
    import ctranslate2

    if loaded.spec.source != "package":
        raise ValueError("CTranslate2's timestamps exist for the packaged Whisper models only (they ship in its "
                         "format); this model came from elsewhere.")
    output = result.output
    if not result.words:
        raise ValueError("No words to time: the model produced no text, or stopped before it ended.")
    model = whisper_ct2.ctranslate2_model(str(whisper_ct2.ct2_folder(loaded.spec)))
    features = ctranslate2.StorageView.from_array(np.array(result.mel[None], dtype=np.float32))
    text_ids = output.output_ids[:-1]
    aligned = model.align(features, output.prompt_ids, [text_ids], 2 * result.audio_frames,
                          median_filter_width=MEDIAN_WIDTH)[0]
    pairs = np.array(aligned.alignments)
    theirs = word_timings(loaded.tokenizer, output.output_ids, output.language, (pairs[:, 0], pairs[:, 1]))
    rows = []
    for ours, other in zip(result.words, theirs):
        difference = max(abs(ours.start - other.start), abs(ours.end - other.end))
        rows.append({"word": ours.text, "start": ours.start, "end": ours.end, "ct2_start": other.start,
                     "ct2_end": other.end, "difference": difference})
    differences = [r["difference"] for r in rows] or [0.0]
    return {"model": result.model.short_name, "input": result.input_name, "words": rows, "mean_difference": float(np.mean(differences)),
            "max_difference": float(np.max(differences))}
