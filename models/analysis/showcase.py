"""Which head a page opens on for one of its sample texts: the head whose attention on that text shows the sample's
lesson most strongly, measured on the run in view (so it holds for whichever model is picked), with the sentence
that says why.

Each sample names a pattern; a head's score is read from its map A ``(q, k)`` on the sample:
- ``induction`` (Olsson et al. 2022): for every token that occurred earlier, ``A[q, p + 1]`` with ``p`` its latest
  earlier occurrence (the token that followed it then, which an induction head copies forward), averaged over those
  queries;
- ``previous_token``: mean over ``q ≥ 1`` of ``A[q, q − 1]``;
- ``word``: ``A[q, k]`` from the query word to the key word the sample is about ("it" -> "animal"), summed over the
  tokens of each word (averaged over the query's tokens).
Heads are ranked by score; ties go to the earlier layer and head.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from models.core.results import AttentionMaps

PATTERNS = ("induction", "previous_token", "word")


@dataclass(frozen=True)
class Sample:
    """A page's sample text and the lesson its opening head shows."""

    text: str
    pattern: str  # one of PATTERNS
    query: str = ""  # ``word``: the attending word ("" = the last token)
    key: str = ""  # ``word``: the word it should attend to
    lesson: str = ""  # what the head does, in words, for the caption ("resolves 'it' to 'animal'")
    max_tokens: int = 0  # a long sample: the token limit it needs (the page raises a lower one when it is picked)


@dataclass(frozen=True)
class Opening:
    """The head a sample opens on and its score (the share of attention the pattern gets, 0..1)."""

    layer: int
    head: int
    score: float
    heads: int  # how many heads were compared
    sample: Sample
    label: str = ""  # the layer as the page names it ("layer 11 (global)"); "" = "layer {layer}"

    def why(self) -> str:
        """The caption that says why the page opened on this head."""
        what = {"induction": "from each repeated token to the token that followed its earlier occurrence",
                "previous_token": "from each token to the one just before it",
                "word": f"from '{self.sample.query or 'the last token'}' to '{self.sample.key}'"}[self.sample.pattern]
        layer = self.label or f"layer {self.layer}"
        return (f"Opened on {layer}, head {self.head}: of all {self.heads} heads it puts the most "
                f"attention {what} on this sample ({self.score:.2f} of its weight) — {self.sample.lesson}. Pick "
                "another head to compare.")


def _word_positions(labels: list[str], word: str) -> list[int]:
    """Positions of the tokens that make up the first occurrence of ``word`` (tokens joined, case kept)."""
    starts = [i for i, label in enumerate(labels) if word.startswith(label.strip()) and label.strip()]
    for start in starts:
        joined, end = "", start
        while end < len(labels) and len(joined) < len(word):
            joined += labels[end].strip()
            end += 1
        if joined == word:
            return list(range(start, end))
    raise ValueError(f"the sample has no word {word!r} among its tokens")


def head_scores(maps: AttentionMaps, labels: list[str], sample: Sample) -> np.ndarray:
    """Every head's score for ``sample``'s pattern on its run: ``(layers, heads)`` in 0..1. ``labels``: the run's
    tokens as shown (one per position)."""
    n = len(labels)
    if sample.pattern == "induction":
        pairs = []
        for q in range(n):
            earlier = [p for p in range(q - 1) if labels[p] == labels[q]]
            if earlier and earlier[-1] + 1 < q:
                pairs.append((q, earlier[-1] + 1))
        if not pairs:
            raise ValueError("the sample repeats no token, so no head can show induction on it")
        rows, cols = np.array(pairs).T
    elif sample.pattern == "previous_token":
        rows = np.arange(1, n)
        cols = rows - 1
    elif sample.pattern == "word":
        queries = _word_positions(labels, sample.query) if sample.query else [n - 1]
        keys = _word_positions(labels, sample.key)
    else:
        raise ValueError(f"unknown pattern {sample.pattern!r}; choose one of {', '.join(PATTERNS)}")
    scores = np.zeros((maps.num_layers, maps.num_heads), dtype=np.float32)
    for layer in range(maps.num_layers):
        for head, weights in maps.iter_heads(layer):
            if sample.pattern == "word":
                scores[layer, head] = weights[np.ix_(queries, keys)].sum(axis=1).mean()
            else:
                scores[layer, head] = weights[rows, cols].mean()
    return scores


def opening_head(maps: AttentionMaps, labels: list[str], sample: Sample) -> Opening:
    """The head that shows ``sample``'s lesson most strongly on its run."""
    scores = head_scores(maps, labels, sample)
    layer, head = np.unravel_index(int(np.argmax(scores)), scores.shape)  # first maximum: earlier layer and head
    return Opening(int(layer), int(head), float(scores[layer, head]), int(scores.size), sample,
                   maps.layer_label(int(layer)))
