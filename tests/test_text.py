"""Text input: limits, odd Unicode shown visibly, uploads decoded or refused with a message."""
import pytest

from models.core import text
from tests.conftest import minilm_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return minilm_tokenizer()


@pytest.mark.parametrize("empty", ["", "   ", "\n\t "])
def test_empty_input_is_a_hint(tokenizer, empty):
    with pytest.raises(ValueError, match="Type or pick"):
        text.tokenize(tokenizer, empty, 64)


def test_long_input_is_truncated_with_a_notice_and_keeps_sep(tokenizer):
    tokenized = text.tokenize(tokenizer, "word " * 500, 64)
    assert len(tokenized.ids) == 64
    assert tokenized.ids[-1] == tokenizer.sep_token_id
    assert "only the first 64" in tokenized.notices[0]


def test_huge_input_is_cut_before_tokenising(tokenizer):
    tokenized = text.tokenize(tokenizer, "a" * 300_000, 32)
    assert any("200,000 characters" in notice for notice in tokenized.notices)


def test_invisible_and_reordering_characters_become_visible():
    assert text.visible_text("a\u202eb") == "a⟨U+202E⟩b"
    assert text.visible_text("zero\u200bwidth") == "zero⟨U+200B⟩width"
    assert text.visible_text("line\nbreak\x07") == "line↵break⟨U+0007⟩"
    assert text.display_token(" the") == "the"
    assert text.display_token("  ") == "␣␣"


def test_emoji_and_rtl_text_tokenise(tokenizer):
    tokenized = text.tokenize(tokenizer, "🙂 مرحبا <script>alert(1)</script>", 64)
    assert "<" in "".join(tokenized.tokens)  # kept as text, never interpreted


@pytest.mark.parametrize("data,message", [(b"", "empty"), (b"\x00\x01binary", "binary"),
                                          ("café".encode("latin-1"), "not UTF-8")])
def test_bad_uploads_are_explained(data, message):
    with pytest.raises(ValueError, match=message):
        text.decode_upload(data)


def test_utf8_upload_with_bom_is_read():
    assert text.decode_upload("\ufeffhello 🙂".encode("utf-8")) == "hello 🙂"


def test_distinct_ids_decode_in_one_batch_as_one_by_one(tokenizer):
    """``text.decoded`` (one batch call) gives each id's ``decode([id])``, special tokens and repeats included; a
    tokenizer with no batch call is decoded one id at a time."""
    ids = tokenizer("Attention is all you need — naïve café, 東京 ✓ [SEP] you need")["input_ids"]
    expected = {i: tokenizer.decode([i]) for i in ids}
    assert text.decoded(tokenizer, ids) == expected
    assert text.token_pieces(tokenizer, ids) == tuple(expected[i] for i in ids)

    class OneByOne:
        def decode(self, token_ids):
            return tokenizer.decode(token_ids)

    assert text.decoded(OneByOne(), ids) == expected
    assert text.display_tokens(OneByOne(), ids) == text.display_tokens(tokenizer, ids)


def test_each_id_is_decoded_once_per_tokenizer_and_forgotten_with_it(tokenizer):
    """A prompt run labels its tokens three times (tokens, figure labels, text pieces): the second and third, and the
    next run's known ids, come from the tokenizer's memo; a tokenizer gone takes its memo with it."""
    import gc

    calls = []

    class Counting:
        def decode(self, token_ids):
            calls.extend(token_ids)
            return tokenizer.decode(token_ids)

    counting = Counting()
    first = tokenizer("the cat sat on the mat")["input_ids"]
    second = tokenizer("the dog sat on the cat")["input_ids"]
    labels = text.display_tokens(counting, first)
    assert text.token_pieces(counting, first) == tuple(tokenizer.decode([i]) for i in first)
    assert sorted(calls) == sorted(set(first))  # each distinct id once, for both calls
    assert text.display_tokens(counting, first) == labels
    text.display_tokens(counting, second)
    assert sorted(calls) == sorted(set(first) | set(second))  # only "dog" was new
    held = len(text._DECODED)
    assert held >= 1
    del counting
    gc.collect()
    assert len(text._DECODED) == held - 1  # the memo went with its tokenizer
