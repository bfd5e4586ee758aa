"""The translation page's help for a word-level mini that reads only its grammar's words: its vocabulary as words to
click into the sentence, and the nearest known words of an unknown one, each a click away.

The widgets write the sentence box's state in their callbacks (which run before the page draws the box again)."""
from __future__ import annotations

import re

import streamlit as st

from app.widgets import plain
from models.families.translation import model as translation

SENTENCE = "translation_text"  # the sentence box's state (widgets.text_source with key "translation")


def _append_word(key: str) -> None:
    """A vocabulary word clicked: added at the end of the sentence; the pill is released for the next click."""
    if word := st.session_state.get(key):
        st.session_state[SENTENCE] = f"{st.session_state.get(SENTENCE, '').rstrip()} {word}".lstrip()
        st.session_state[key] = None


def _replace_word(unknown: str, key: str) -> None:
    """A suggestion clicked: every whole-word occurrence of ``unknown`` in the sentence replaced by it."""
    if word := st.session_state.get(key):
        pattern = rf"(?<!\w){re.escape(unknown)}(?!\w)"
        st.session_state[SENTENCE] = re.sub(pattern, lambda _: word, st.session_state.get(SENTENCE, ""))
        st.session_state[key] = None


def show(loaded, expanded: bool = False) -> None:
    """A word-level mini's vocabulary by kind, each word a pill that adds it to the sentence; nothing for a subword
    model (it can spell any word)."""
    groups = translation.vocabulary_by_kind(loaded)
    if not groups:
        return
    total = sum(len(words) for words in groups.values())
    with st.expander(f"The {total} English words this model knows: click one to add it to the sentence",
                     expanded=expanded):
        st.caption("Case does not matter (“european” is read as “European”, the first word is capitalised) and "
                   "punctuation other than “,” and “.” is left out. Numbers in digits are always known.")
        for kind, words in groups.items():
            key = f"tr_vocab_{kind.replace(' ', '_')}"
            st.pills(kind.capitalize(), words, key=key, on_change=_append_word, args=(key,))


def suggestions(error: translation.UnknownWordsError) -> None:
    """For each unknown word with known words spelled like it, those words: a click replaces it in the sentence."""
    for i, word in enumerate(error.words):
        if close := error.suggestions.get(word):
            key = f"tr_fix_{i}"
            st.pills(f"Replace “{plain(word)}” with", close, key=key, on_change=_replace_word, args=(word, key))
