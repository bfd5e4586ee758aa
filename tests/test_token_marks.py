"""Token labels show blanks as marks (↵ a line break, ␣ a space, models/core/text.py); a figure that shows such a
label says what the marks mean in its caption, and one that shows none does not (issue 28: "↵ and ␣ tokens never
explained")."""
from __future__ import annotations

from dataclasses import replace

import pytest

from models import families
from models.core import text
from models.core.inputs import TextInput
from models.core.results import StoredAttention
from models.core.specs import ModelSpec
from viz import figures
from viz.figures.attention import FocusOptions, HeadOptions


def test_the_note_names_only_the_marks_shown():
    assert text.whitespace_note(["def", "↵␣␣␣", "if"]) == text.whitespace_note(["↵␣"])
    assert "↵" in text.whitespace_note(["↵"]) and "␣" not in text.whitespace_note(["↵"])
    assert "␣" in text.whitespace_note(["␣"]) and "↵" not in text.whitespace_note(["␣"])
    assert text.whitespace_note(["the", "cat"]) == ""


@pytest.fixture(scope="module")
def results(tiny_folders):
    """A tiny model's run on four words, and the same run with its third token shown as a line break (the MiniLM
    tokenizer keeps no blanks; SmolLM2's and GPT-2's give "↵" and "␣" tokens)."""
    tiny = families.load(ModelSpec("causal_lm", "tiny", "hub", str(tiny_folders["llama"]), "test", "random"))
    result = families.run(tiny, TextInput("the cat sat down", 64))
    maps = result.maps("self")
    tokens = list(maps.query_tokens)
    tokens[2] = "↵"
    marked = StoredAttention("self", tokens, tokens, [maps.layer(i) for i in range(maps.num_layers)],
                             maps.allowed(0))
    return result, replace(result, tokens=tuple(tokens), attention={"self": marked})


@pytest.mark.parametrize("view, options", [("head", HeadOptions("self", 0, 0)), ("focus", FocusOptions("self", 0, 0))])
def test_figures_with_blank_tokens_explain_the_marks(results, view, options):
    plain, marked = results
    assert "line break" not in figures.build(view, plain, options).caption
    assert text.whitespace_note(["↵"]) in figures.build(view, marked, options).caption
