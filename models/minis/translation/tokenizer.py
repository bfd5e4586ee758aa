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

from collections.abc import Iterable
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
