"""One way to choose a layer and a head, for every view, page, CLI flag and link (issue 40).

A layer is an index (0 = the first), ``LAST``, ``OPENING`` (the layer the model's page opens on: the last, unless
measured otherwise, e.g. DINOv2's layer 10) or ``ALL`` (every layer averaged, where a view can average them); a head
is an index or ``MEAN`` (the layer's heads averaged). Views take these in their options; ``layer_index`` and
``head_index`` turn them into what the maps read (an index, or None for an average), with a message a user can act
on for one that does not exist or that the view cannot draw. ``LABELS`` names each in words, once.
"""
from __future__ import annotations

from typing import Union

LAST = "last"
OPENING = "opening"
ALL = "all"
MEAN = "mean"
NAMED = "alignment"  # the heads a model's config names (Whisper's alignment heads), averaged

Layer = Union[int, str]  # an index, LAST, OPENING or ALL
Head = Union[int, str]  # an index, MEAN; OPENING where a page opens on a measured head (the translator's), NAMED
# where the model's config names heads (Whisper's alignment heads)

LABELS = {LAST: "the last layer", OPENING: "the layer the page opens on", ALL: "every layer averaged",
          MEAN: "average of heads", NAMED: "the alignment heads (mean)"}
LAYER_WORDS = (LAST, OPENING, ALL)


def layer_index(choice: Layer, layers: int, opening: int | None = None, averages: bool = False) -> int | None:
    """The index ``choice`` names among ``layers`` layers (``OPENING``: ``opening``, else the last), or None for
    ``ALL`` where the view ``averages`` layers; a ``ValueError`` for anything else."""
    if choice == ALL:
        if not averages:
            raise ValueError("this view draws one layer: pick a layer number, 'last' or 'opening' (it cannot "
                             "average every layer)")
        return None
    if choice == LAST:
        return layers - 1
    if choice == OPENING:
        return layers - 1 if opening is None else opening
    if isinstance(choice, bool) or not isinstance(choice, int):
        raise ValueError(f"a layer is a number, {', '.join(map(repr, LAYER_WORDS))}; not {choice!r}")
    if not 0 <= choice < layers:
        raise ValueError(f"layer {choice} does not exist: this model has layers 0..{layers - 1} (or 'last')")
    return choice


def head_index(choice: Head, heads: int, opening: int | None = None) -> int | None:
    """The index ``choice`` names among ``heads`` heads, or None for ``MEAN``; ``OPENING``: the head the page opens
    on (``opening``; None: the mean); a ``ValueError`` for anything else."""
    if choice == MEAN:
        return None
    if choice == OPENING:
        return opening
    if isinstance(choice, bool) or not isinstance(choice, int):
        raise ValueError(f"a head is a number or {MEAN!r}, not {choice!r}")
    if not 0 <= choice < heads:
        raise ValueError(f"head {choice} does not exist: this layer has heads 0..{heads - 1} (or 'mean')")
    return choice


def head_choice(index: int | None) -> Head:
    """What the maps' ``head`` argument (an index, or None for the average) is as a choice."""
    return MEAN if index is None else int(index)


def layer_label(choice: Layer, index: int | None = None) -> str:
    """``layer 3``, or the words for a choice by name (with the layer it named, when known)."""
    if isinstance(choice, int) and not isinstance(choice, bool):
        return f"layer {choice}"
    if choice == ALL:
        return LABELS[ALL]
    return f"layer {index}" if index is not None else LABELS[choice]


def head_label(choice: Head) -> str:
    if choice in (MEAN, NAMED):
        return LABELS[choice]
    return "the head the page opens on" if choice == OPENING else f"head {choice}"


def parse(text: str, kind: str) -> Layer | Head:
    """A layer or head as typed (a CLI flag, a link): a number or one of the words. ``kind``: "layer" or "head"."""
    text = str(text).strip().lower()
    words = LAYER_WORDS if kind == "layer" else (MEAN, OPENING, NAMED)
    if text in words:
        return text
    if kind == "layer" and text == MEAN:  # what "--layer mean" said before: every layer averaged
        return ALL
    for word, label in LABELS.items():  # a label as the page shows it (links made before choices were words)
        if text == label.lower() and word in words:
            return word
    if kind == "head" and text in ("heads averaged", "average"):
        return MEAN
    if kind == "layer" and text in ("all layers (mean)", "average of layers"):
        return ALL
    text = text.removeprefix(f"{kind} ").strip()  # "head 3", "layer 2"
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"a {kind} is a number or one of {', '.join(map(repr, words))}; not {text!r}") from None


def pick(maps, layer: Layer, head: Head, opening: int | None = None) -> tuple[int, int | None]:
    """(layer index, head index or None for the mean) of an ``AttentionMaps`` for a view that draws one layer."""
    index = layer_index(layer, maps.num_layers, opening)
    return index, head_index(head, maps.heads_in(index))


def checked(cls):
    """A class decorator, above ``@dataclass``, for a view's options with ``layer`` and/or ``head`` fields: a head
    given as None is the mean (the maps' own convention), and a layer or head that is no choice is refused when the
    options are made, with the words that are."""
    names = set(getattr(cls, "__dataclass_fields__", {}))
    made = cls.__init__

    def __init__(self, *args, **kwargs):
        made(self, *args, **kwargs)
        if "head" in names and self.head is None:
            object.__setattr__(self, "head", MEAN)
        if "head" in names and self.head not in (MEAN, OPENING, NAMED) and (
                isinstance(self.head, bool) or not isinstance(self.head, int)):
            raise ValueError(f"a head is a number or {MEAN!r}, not {self.head!r}")
        if "layer" in names and self.layer not in LAYER_WORDS and (
                isinstance(self.layer, bool) or not isinstance(self.layer, int) or self.layer < 0):
            raise ValueError(f"a layer is a number from 0, or one of {', '.join(map(repr, LAYER_WORDS))}; "
                             f"not {self.layer!r}")

    __init__.__doc__ = made.__doc__
    cls.__init__ = __init__
    return cls
