"""One way to choose a layer and a head (models/core/selection.py), as views, the CLI and links read it."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from app import cli
from models.core import selection
from models.core.selection import ALL, LAST, MEAN, NAMED, OPENING, Head, Layer


def test_layer_words_name_the_index_they_mean():
    assert selection.layer_index(LAST, 12) == 11
    assert selection.layer_index(OPENING, 12) == 11
    assert selection.layer_index(OPENING, 12, opening=10) == 10
    assert selection.layer_index(ALL, 12, averages=True) is None
    assert selection.layer_index(3, 12) == 3


@pytest.mark.parametrize("choice, says", [
    (12, "layer 12 does not exist"), (-1, "layer -1 does not exist"), (ALL, "cannot average"),
    ("3", "a layer is a number"), (True, "a layer is a number")])
def test_a_layer_that_is_no_choice_is_refused_in_words(choice, says):
    with pytest.raises(ValueError, match=says):
        selection.layer_index(choice, 12)


def test_heads():
    assert selection.head_index(MEAN, 8) is None
    assert selection.head_index(7, 8) == 7
    assert selection.head_index(OPENING, 8, opening=2) == 2
    with pytest.raises(ValueError, match="head 8 does not exist"):
        selection.head_index(8, 8)
    assert selection.head_choice(None) == MEAN and selection.head_choice(3) == 3


@pytest.mark.parametrize("typed, kind, read", [
    ("3", "layer", 3), ("last", "layer", LAST), ("all", "layer", ALL), ("mean", "layer", ALL),
    ("every layer averaged", "layer", ALL), ("All layers (mean)", "layer", ALL), ("layer 2", "layer", 2),
    ("mean", "head", MEAN), ("average of heads", "head", MEAN), ("head 3", "head", 3), (" 5 ", "head", 5),
    ("alignment", "head", NAMED)])
def test_one_parser_reads_flags_and_old_links(typed, kind, read):
    assert selection.parse(typed, kind) == read


def test_a_word_that_is_no_choice_is_refused():
    with pytest.raises(ValueError, match="a head is a number or one of"):
        selection.parse("last", "head")
    with pytest.raises(ValueError, match="a layer is a number or one of"):
        selection.parse("first", "layer")


@selection.checked
@dataclass(frozen=True)
class Options:
    layer: Layer = LAST
    head: Head = MEAN


def test_options_hold_choices_and_refuse_the_old_conventions():
    assert Options(head=None).head == MEAN  # the maps' own convention for the average
    with pytest.raises(ValueError, match="a layer is a number from 0"):
        Options(layer=-1)  # "the last" is said LAST, once
    with pytest.raises(ValueError, match="a head is a number"):
        Options(head="3")


def test_the_cli_reads_layer_and_head_flags_with_the_one_parser():
    assert cli.convert("mean", "Layer", "layer") == ALL  # every layer averaged, never the opening layer
    assert cli.convert("mean", "Head", "head") == MEAN
    assert cli.convert("4", "Layer", "layer") == 4


def test_one_label_table():
    assert selection.head_label(MEAN) == "average of heads" == selection.LABELS[MEAN]
    assert selection.layer_label(LAST, 11) == "layer 11" and selection.layer_label(ALL) == "every layer averaged"
