"""Text input handling shared by the text families: validation, truncation, tokens shown as readable text.

Tokens are always shown as plain text. Characters that would be invisible or would reorder a label (zero-width,
bidi overrides, control characters) are replaced by a visible marker such as ⟨U+202E⟩.
"""
from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass

from models.core import limits, memo

MAX_CHARACTERS = limits.MAX_CHARACTERS  # beyond this even tokenising is pointless: the token limit cuts far earlier
DEFAULT_MAX_TOKENS = limits.DEFAULT_TOKENS
VISIBLE = {"\n": "↵", "\r": "⏎", "\t": "⇥"}


def visible_text(text: str) -> str:
    """Make whitespace, control and format characters visible; everything else is left as typed."""
    out = []
    for char in text:
        if char in VISIBLE:
            out.append(VISIBLE[char])
        elif unicodedata.category(char) in ("Cc", "Cf", "Co", "Cs") or char in "\u2028\u2029":
            out.append(f"⟨U+{ord(char):04X}⟩")
        else:
            out.append(char)
    return "".join(out)


@functools.lru_cache(maxsize=1 << 16)
def display_token(text: str) -> str:
    """One token as a label: a leading space dropped (the position says where words start), blanks shown as ␣."""
    if text.strip() == "" and text:
        return visible_text(text.replace(" ", "␣"))
    return visible_text(text[1:] if text.startswith(" ") else text)


_DECODED: "memo.PerObject[dict[int, str]]" = memo.PerObject()  # per tokenizer, for its lifetime


def _decoded_memo(tokenizer) -> dict[int, str] | None:
    """The tokenizer's memo of single-id decodes (None for an object that cannot be watched for its end). At most one
    entry per vocabulary entry: ~20 MB for a 256k vocabulary, shared by every session using that tokenizer."""
    try:
        return _DECODED.get(tokenizer, dict)
    except TypeError:  # no weak references to it: its end cannot be seen, so nothing is kept
        return None


def decoded(tokenizer, ids) -> dict[int, str]:
    """Each distinct id of ``ids`` decoded alone (``tokenizer.decode([i])``). Decodes are remembered per tokenizer:
    a prompt run needs them three times (the tokens, the figure's labels, the text pieces), and the decoding, one
    Python call per id even in ``batch_decode``, was ~13 ms at 4,096 tokens, half a GPU's forward of a 1B model."""
    distinct = sorted(set(map(int, ids)))
    memo = _decoded_memo(tokenizer)
    missing = distinct if memo is None else [i for i in distinct if i not in memo]
    batch_decode = getattr(tokenizer, "batch_decode", None)
    texts = batch_decode([[i] for i in missing]) if batch_decode is not None and missing else None
    if texts is None or len(texts) != len(missing):
        texts = [tokenizer.decode([i]) for i in missing]
    if memo is None:
        return dict(zip(missing, texts))
    memo.update(zip(missing, texts))
    return {i: memo[i] for i in distinct}


def token_pieces(tokenizer, ids) -> tuple[str, ...]:
    """Each token's own text as the tokenizer decodes it, leading spaces kept: joined, a stretch of them reads as the
    text did ("Mrs Dursley of number four"), where display labels would read "Mrs D urs ley of number four"."""
    pieces = decoded(tokenizer, ids)
    return tuple(pieces[int(i)] for i in ids)


MARKS = {"↵": "a line break", "␣": "a space", "⇥": "a tab", "⏎": "a carriage return"}  # what display_token draws


def whitespace_note(labels) -> str:
    """The caption sentence that says what the blank marks in ``labels`` mean (only those present), or "" when
    there are none: every figure that shows token labels says it, in these words."""
    shown = [f"{mark} is {meaning}" for mark, meaning in MARKS.items() if any(mark in label for label in labels)]
    if not shown:
        return ""
    listed = shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]
    return f"In token labels {listed} (a word's own leading space is not drawn)."


def with_marks(caption: str, *labels) -> str:
    """``caption`` and, when any of the groups of token ``labels`` holds a blank mark, ``whitespace_note``."""
    note = whitespace_note([label for group in labels for label in group])
    return f"{caption} {note}".strip() if note else caption


def display_tokens(tokenizer, ids) -> list[str]:
    labels = {i: display_token(text) for i, text in decoded(tokenizer, ids).items()}
    return [labels[int(i)] for i in ids]


def decode_upload(data: bytes) -> str:
    """A ``.txt`` upload as text: UTF-8 (with or without BOM) only; anything else gets a message, not mojibake."""
    if not data:
        raise ValueError("The uploaded file is empty.")
    if b"\x00" in data[:4096]:
        raise ValueError("That file looks binary (it contains NUL bytes). Upload a plain-text .txt file.")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ValueError(f"That file is not UTF-8 text (byte {error.start} cannot be decoded). Save it as UTF-8 and "
                         "upload it again.") from error


SURROGATE = re.compile("[\ud800-\udfff]")


def replace_lone_surrogates(text: str) -> str:
    """``text`` with each unpaired UTF-16 surrogate (which a browser string may carry) replaced by U+FFFD."""
    if not SURROGATE.search(text):
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


@dataclass(frozen=True)
class Tokenized:
    ids: list[int]
    tokens: list[str]
    notices: tuple[str, ...]


def tokenize(tokenizer, text: str, max_tokens: int, add_special_tokens: bool = True) -> Tokenized:
    """Token ids for ``text``, truncated to ``max_tokens`` with a notice; empty input is a ValueError."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("Type or pick some text first.")
    if max_tokens < 2:
        raise ValueError("The token limit must be at least 2.")
    if max_tokens > limits.highest_tokens():
        raise ValueError(f"The token limit on this server is {limits.highest_tokens():,} (ATTN_EXPLORER_MAX_TOKENS, "
                         "ATTN_EXPLORER_MAX_TOKENS_GPU on a GPU); lower it in the sidebar.")
    notices = []
    characters = limits.max_characters(max_tokens)
    if len(text) > characters:
        text = text[:characters]
        notices.append(f"Only the first {characters:,} characters were read.")
    repaired = replace_lone_surrogates(text)
    if repaired != text:  # the Rust tokenizers refuse them with a TypeError
        text = repaired
        notices.append("Broken characters (unpaired UTF-16 surrogates) were replaced by \ufffd.")
    ids = tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
    if len(ids) > max_tokens:
        notices.append(f"The input has {len(ids):,} tokens; only the first {max_tokens:,} are shown "
                       "(raise the token limit in the sidebar to see more).")
        keep_last = [ids[-1]] if add_special_tokens and tokenizer.sep_token_id is not None \
            and ids[-1] == tokenizer.sep_token_id else []
        ids = ids[: max_tokens - len(keep_last)] + keep_last
    if not ids:
        raise ValueError("The text produced no tokens. Try different text.")
    return Tokenized(list(ids), display_tokens(tokenizer, ids), tuple(notices))


def display_ids(tokenizer, ids) -> list[str]:
    """Token labels for ``ids``: special tokens by their own name (<|en|>, </s>), others as ``display_token``."""
    special = set(tokenizer.all_special_ids)
    return [tokenizer.convert_ids_to_tokens(i) if i in special else display_token(tokenizer.decode([i]))
            for i in ids]


def top_tokens(probabilities, tokenizer, k: int) -> tuple:
    """The ``k`` most probable tokens of a ``(vocab,)`` torch tensor, as ``TokenProbability``, best first."""
    from models.core.results import TokenProbability

    values, indices = probabilities.topk(min(k, probabilities.shape[-1]))
    return tuple(TokenProbability(display_ids(tokenizer, [int(i)])[0], int(i), float(v))
                 for v, i in zip(values, indices))


def single_token_id(tokenizer, typed: str | None, fallback: int) -> int:
    """The id of the one token ``typed`` (spaces included: ``" Paris"`` and ``"Paris"`` differ), or ``fallback`` when
    nothing was typed; a ``ValueError`` showing the pieces when it is more than one token."""
    if typed is None or typed == "":
        return fallback
    ids = tokenizer.encode(typed, add_special_tokens=False)
    if len(ids) != 1:
        pieces = [display_token(tokenizer.decode([i])) for i in ids]
        raise ValueError(f"the target must be one token; {typed!r} is {len(ids)}: {' | '.join(pieces) or 'none'} "
                         "(a word after a space usually starts with one, e.g. ' Paris')")
    return ids[0]
