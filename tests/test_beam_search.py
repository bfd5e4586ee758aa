"""The one beam search (models/core/decoding.py) on a toy decoder whose next-token log-probabilities
depend on the previous token only: beam 1 is greedy under both rules, Marian's rule with a beam as
wide as every hypothesis finds the exhaustive best, transformers' rule keeps its beam full after a
hypothesis ends while Marian's shrinks it, and a shortlist maps columns to ids."""
import itertools

import torch

from models.core import decoding

END = 0
TABLE = torch.log_softmax(torch.tensor([  # row: previous token (3 is the start), column: next token
    [0.0, 0.0, 0.0, 0.0],
    [1.5, 0.2, 1.4, -9.0],
    [0.1, 1.6, 0.3, -9.0],
    [0.2, 1.0, 1.1, -9.0],
]), -1)


def step(previous: torch.Tensor, state: torch.Tensor):
    return TABLE[previous], state + 1  # the state counts steps, one row per hypothesis


def score(sequence: list[int]) -> float:
    tokens = [3, *sequence]
    return float(sum(TABLE[a, b] for a, b in zip(tokens, tokens[1:]))) / len(sequence)


def search(beams: int, max_new: int = 3, shrinking: bool = False, **extra) -> list[int]:
    return decoding.beam_search(step, torch.zeros(1), start=3, end=END, beams=beams,
                                max_new=max_new, shrinking=shrinking, **extra)


def greedy(max_new: int = 3) -> list[int]:
    out = []
    for _ in range(max_new):
        out.append(int(TABLE[out[-1] if out else 3].argmax()))
        if out[-1] == END:
            break
    return out


def test_a_beam_of_one_is_greedy_under_both_rules():
    assert search(1) == search(1, shrinking=True) == greedy() == [2, 1, 0]


def test_marian_rule_with_every_hypothesis_kept_finds_the_exhaustive_best():
    every = itertools.product(range(3), repeat=3)
    candidates = {tuple(s[:s.index(END) + 1]) if END in s else s for s in every}
    best = max(candidates, key=lambda c: score(list(c)))
    assert search(3 ** 3, shrinking=True) == list(best)


def test_transformers_rule_keeps_the_beam_full_after_a_hypothesis_ends_and_marians_shrinks_it():
    def widths(shrinking: bool) -> list[int]:
        seen = []

        def counted(previous, state):
            seen.append(len(previous))
            return step(previous, state)

        decoding.beam_search(counted, torch.zeros(1), start=3, end=END, beams=2, max_new=4,
                             shrinking=shrinking)
        return seen

    # [1, 0] ends at step 2: transformers' rule goes on with two live hypotheses, Marian's with one
    assert widths(False)[:3] == [1, 2, 2]
    assert widths(True)[:3] == [1, 2, 1]


def test_a_shortlist_maps_columns_to_token_ids():
    words = torch.tensor([0, 2])  # only the end and token 2 are allowed

    def listed(previous, state):
        return TABLE[previous][:, words].log_softmax(-1), state

    found = decoding.beam_search(listed, torch.zeros(1), start=3, end=END, beams=2, max_new=3,
                                 shrinking=True, words=words)
    assert set(found) <= {0, 2}
