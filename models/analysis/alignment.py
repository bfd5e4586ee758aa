"""Word alignments from attention, and the alignment error rate.

- Words from subword pieces: a piece opens a new word when it starts with a word-boundary marker ("▁" SentencePiece /
  Marian / T5, "Ġ" byte-level BPE / BART), when it is punctuation, or when the previous piece ends with an elided
  apostrophe ("▁L'" "accord" → "L'", "accord"). Special tokens (``</s>``, ``<pad>``) stay words of their own.
- Attention from pieces to words (``merge_to_words``): summed over a source word's pieces (the probability of
  attending anywhere in that word, so rows still sum to 1) and averaged over a target word's pieces (each target
  piece is one query; the mean keeps a row a distribution).
- Hard alignment from soft attention: each target word aligns to the source word it attends to most (argmax), the
  convention of Garg et al. (2019, "Jointly Learning to Align and Translate with Transformer Models").
- Alignment error rate, Och & Ney (2003): AER = 1 − (|A ∩ S| + |A ∩ P|) / (|A| + |S|) for predicted links A, sure
  links S and possible links P ⊇ S; 0 is perfect. Links are (source word, target word) index pairs.
"""
from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence

import numpy as np

WORD_START_MARKERS = ("▁", "Ġ")


def _is_punctuation(text: str) -> bool:
    return bool(text) and all(unicodedata.category(ch).startswith("P") for ch in text)


def word_groups(tokens: Sequence[str], special_tokens: Iterable[str] = ()) -> list[list[int]]:
    """Group piece indices into words. tokens (n,) -> list of index lists covering 0..n-1 in order."""
    specials = set(special_tokens)
    groups: list[list[int]] = []
    previous = ""
    for i, token in enumerate(tokens):
        bare = token.lstrip("".join(WORD_START_MARKERS))
        starts = (
            not groups or token in specials or previous in specials or token.startswith(WORD_START_MARKERS)
            or _is_punctuation(bare) or _is_punctuation(previous.lstrip("".join(WORD_START_MARKERS)))
            or previous.endswith("'")
        )
        if starts:
            groups.append([i])
        else:
            groups[-1].append(i)
        previous = token
    return groups


def word_labels(tokens: Sequence[str], groups: list[list[int]]) -> list[str]:
    """The text of each word: its pieces joined, boundary markers removed."""
    return ["".join(tokens[i] for i in group).replace("▁", "").replace("Ġ", "") or tokens[group[0]]
            for group in groups]


def merge_to_words(weights: np.ndarray, query_groups: list[list[int]], key_groups: list[list[int]]) -> np.ndarray:
    """Piece attention ``(..., q, k)`` -> word attention ``(..., q_words, k_words)``: sum over key pieces, mean over
    query pieces. Rows that summed to 1 still do."""
    summed = np.stack([weights[..., group].sum(axis=-1) for group in key_groups], axis=-1)  # (..., q, kw)
    return np.stack([summed[..., group, :].mean(axis=-2) for group in query_groups], axis=-2)  # (..., qw, kw)


def hard_alignment(word_attention: np.ndarray, source_words: Sequence[int] | None = None,
                   target_words: Sequence[int] | None = None) -> set[tuple[int, int]]:
    """(target words, source words) attention -> {(source, target)} links, one per target word (its argmax).

    ``source_words``/``target_words`` restrict which columns/rows take part (e.g. leave out ``</s>``); indices in the
    result stay those of ``word_attention``."""
    rows = range(word_attention.shape[0]) if target_words is None else target_words
    columns = np.arange(word_attention.shape[1]) if source_words is None else np.asarray(list(source_words))
    if len(columns) == 0:
        return set()
    return {(int(columns[np.argmax(word_attention[t, columns])]), int(t)) for t in rows}


def alignment_error_rate(predicted: Iterable[tuple[int, int]], sure: Iterable[tuple[int, int]],
                         possible: Iterable[tuple[int, int]] | None = None) -> float:
    """AER of predicted links against sure (and possible) gold links; possible defaults to sure."""
    a, s = set(predicted), set(sure)
    p = set(possible) | s if possible is not None else s
    if not a and not s:
        return 0.0
    return 1.0 - (len(a & s) + len(a & p)) / (len(a) + len(s))


def corpus_alignment_error_rate(pairs: Iterable[tuple[set, set]]) -> float:
    """AER over a corpus: counts are summed over sentences before dividing (as Och & Ney do), not averaged."""
    hit_sure = hit_possible = n_predicted = n_sure = 0
    for predicted, sure in pairs:
        hit_sure += len(predicted & sure)
        hit_possible += len(predicted & sure)
        n_predicted += len(predicted)
        n_sure += len(sure)
    if n_predicted + n_sure == 0:
        return 0.0
    return 1.0 - (hit_sure + hit_possible) / (n_predicted + n_sure)
