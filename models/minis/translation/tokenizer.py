"""A word-level tokenizer shared by English and French, saved in the standard ``tokenizer.json`` format.

Pieces follow the SentencePiece convention that Marian models use, so the same word-merging code works for the minis
and for hub models: a piece starting with "▁" begins a new word ("▁accord"); a piece without it continues the
previous word. Whole words are single pieces; numbers are split into digits ("1992" → "▁1" "9" "9" "2"), so dates
and counts are copied digit by digit and the minis have real multi-piece words; an elided article keeps its
apostrophe and the next word continues without "▁" ("L'accord" → "▁L'" "accord").

The files load with ``transformers.AutoTokenizer.from_pretrained(folder)`` (a ``PreTrainedTokenizerFast``), which is
how ``models.core.loading.load_transformers`` reads every translation model.
"""
from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from tokenizers import (
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

PAD, EOS, UNK = "<pad>", "</s>", "<unk>"
SPECIALS = (PAD, EOS, UNK)  # ids 0, 1, 2; the decoder starts from <pad>, as Marian's decoder_start_token_id does
PIECE_PATTERN = r"▁?[0-9]|[0-9]|▁?[^\W\d_]+'|▁?[^\W\d_]+|▁?[^\w\s▁]"


def _pipeline(vocab: dict[str, int]) -> Tokenizer:
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tokenizer.normalizer = normalizers.Sequence([
        normalizers.NFC(), normalizers.Replace("’", "'"), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Strip(),
    ])
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True),
        pre_tokenizers.Split(Regex(PIECE_PATTERN), behavior="isolated"),
    ])
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", pair=f"$A $B {EOS}", special_tokens=[(EOS, vocab[EOS])])
    return tokenizer


def pieces(text: str) -> list[str]:
    """The pieces ``text`` splits into (before the vocabulary lookup)."""
    probe = _pipeline({PAD: 0, EOS: 1, UNK: 2})
    normalised = probe.normalizer.normalize_str(text)
    return [piece for piece, _ in probe.pre_tokenizer.pre_tokenize_str(normalised)]


@dataclass(frozen=True)
class Fitted:
    """A sentence as a word-level vocabulary can read it (``fit_to_vocabulary``)."""

    text: str  # the sentence rebuilt from the pieces kept (each respelled as the vocabulary spells it)
    respelled: tuple[tuple[str, str], ...]  # (as typed, as the vocabulary spells it): "european" -> "European"
    dropped: tuple[str, ...]  # punctuation marks the vocabulary does not have, left out
    unknown: tuple[str, ...]  # words with no form in the vocabulary, in order, each once


def _closest_case(typed: str, forms: list[str]) -> str:
    """Of the vocabulary's spellings of a word, the one whose first letter has the typed case, else any."""
    first_upper = typed.lstrip("▁")[:1].isupper()
    return min(forms, key=lambda form: (form.lstrip("▁")[:1].isupper() != first_upper, form != form.lower(), form))


def fit_to_vocabulary(text: str, vocabulary: Collection[str], usual_forms: Iterable[str] = (),
                      capitalise_first: bool = False) -> Fitted:
    """``text`` as a word-level ``vocabulary`` (of pieces) can read it.

    Punctuation is split from words ("yesterday." -> "yesterday" "."); a piece the vocabulary lacks is matched case
    insensitively to a form it has: the word's form in ``usual_forms`` (how the training text writes it
    mid-sentence: "european" and "EUROPEAN" -> "European", "APPROVED" -> "approved"), else the form with the typed
    first letter's case; with ``capitalise_first`` the first word is capitalised as the training text's sentences
    begin ("the" -> "The"). Punctuation the vocabulary has no form of is dropped; a word it has no form of is
    reported in ``unknown`` (and kept, so the text still reads)."""
    known = set(vocabulary)
    by_lower: dict[str, list[str]] = {}
    for piece in known:
        by_lower.setdefault(piece.lower(), []).append(piece)
    usual = {form.lower(): form for form in usual_forms}
    kept, respelled, dropped, unknown = [], [], [], []

    def respell(typed: str, form: str) -> None:
        respelled.append((typed.removeprefix("▁"), form.removeprefix("▁")))
        kept.append(form)

    for piece in pieces(text):
        bare = piece.removeprefix("▁")
        first_word = capitalise_first and not any(any(ch.isalnum() for ch in k) for k in kept)
        capital = piece[:len(piece) - len(bare)] + bare[:1].upper() + bare[1:].lower()
        if first_word and bare[:1].isalpha() and piece != capital and capital in known:
            respell(piece, capital)
        elif piece in known:
            kept.append(piece)
        elif not any(ch.isalnum() for ch in bare):  # a mark: attached or spaced ("report ." as "report.")
            other = bare if piece.startswith("▁") else "▁" + bare
            if other in known:
                kept.append(other)
            else:
                dropped.append(bare)
        elif forms := by_lower.get(piece.lower()):
            wanted = piece[:len(piece) - len(bare)] + usual.get(bare.lower(), "")
            respell(piece, wanted if wanted in forms else _closest_case(piece, forms))
        else:
            unknown.append(bare)
            kept.append(piece)
    rebuilt = "".join(piece.replace("▁", " ") for piece in kept).strip()
    return Fitted(rebuilt, tuple(dict.fromkeys(respelled)), tuple(dict.fromkeys(dropped)),
                  tuple(dict.fromkeys(unknown)))


def build_vocabulary(texts: Iterable[str], extra_words: Iterable[str] = ()) -> dict[str, int]:
    """Every piece of ``texts`` and of ``extra_words`` (each also capitalised), specials first, then sorted."""
    found: set[str] = set()
    for text in texts:
        found.update(pieces(text))
    for word in extra_words:
        for variant in (word, word[:1].upper() + word[1:]):
            found.update(pieces(variant))
    found.update(f"▁{d}" for d in "0123456789")
    found.update("0123456789")
    found.difference_update(SPECIALS)
    return {token: i for i, token in enumerate([*SPECIALS, *sorted(found)])}


def make_tokenizer(vocab: dict[str, int]):
    """A ``PreTrainedTokenizerFast`` over ``vocab`` (pad 0, eos 1, unk 2) that appends ``</s>`` to every input."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=_pipeline(vocab), pad_token=PAD, eos_token=EOS, unk_token=UNK,
                                   model_max_length=256, clean_up_tokenization_spaces=False)


def save_tokenizer(tokenizer, folder: Path) -> None:
    tokenizer.save_pretrained(folder)
