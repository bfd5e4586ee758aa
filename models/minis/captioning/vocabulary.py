"""The captioning minis' word-level vocabulary, saved as a standard ``tokenizer.json`` (``PreTrainedTokenizerFast``).

One token per word of the scene grammar (``scenes.VOCABULARY``), after five specials: ``<pad>`` 0, ``<bos>`` 1 (the
decoder's first input), ``<eos>`` 2 (the caption's end), ``<unk>`` 3, and ``<image>`` 4, the placeholder a LLaVA-style
model replaces with the projected patch tokens. All three minis share it, so their captions are token for token
comparable.
"""
from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from models.minis.captioning import scenes

PAD, BOS, EOS, UNK, IMAGE = "<pad>", "<bos>", "<eos>", "<unk>", "<image>"
SPECIALS = (PAD, BOS, EOS, UNK, IMAGE)
WORDS = (*SPECIALS, *scenes.VOCABULARY)
PAD_ID, BOS_ID, EOS_ID, UNK_ID, IMAGE_ID = range(5)


def make_tokenizer():
    """A ``PreTrainedTokenizerFast`` over ``WORDS`` that splits on whitespace and adds no tokens of its own."""
    from transformers import PreTrainedTokenizerFast

    vocab = {word: i for i, word in enumerate(WORDS)}
    pipeline = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    pipeline.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    pipeline.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=pipeline, pad_token=PAD, bos_token=BOS, eos_token=EOS,
                                   unk_token=UNK, extra_special_tokens={"image_token": IMAGE},
                                   model_max_length=128, clean_up_tokenization_spaces=False)


def encode(caption: str) -> list[int]:
    """A caption's word ids (no specials); a word outside the grammar is a ``ValueError``."""
    index = {word: i for i, word in enumerate(WORDS)}
    try:
        return [index[word] for word in caption.split()]
    except KeyError as error:
        raise ValueError(f"{error.args[0]!r} is not a word of the scene grammar") from None


def decode(ids) -> list[str]:
    """Word ids back to words (specials by name)."""
    return [WORDS[int(i)] if 0 <= int(i) < len(WORDS) else UNK for i in ids]


def save(folder: Path) -> None:
    make_tokenizer().save_pretrained(folder)
