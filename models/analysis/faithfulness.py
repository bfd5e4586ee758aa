"""Is an explanation faithful to the model? Deletion and insertion curves (Petsiuk et al. 2018, "RISE"; the positive
perturbation test of Chefer et al. 2021a) for every method against a random order.

- **Deletion**: remove the units (patches, tokens) most relevant first, re-run, and read the target's probability
  after each step; a faithful map makes it fall fast: a *low* area under the curve is good.
- **Insertion**: start from the input with every unit removed and reveal the most relevant first; a faithful map
  makes the probability rise fast: a *high* area is good.
- **Random**: the same curves for ``seeds`` random orders; their mean AUC (and spread) is the bar a method must
  clear. A method that fails either test — its deletion AUC not below random's mean − one standard deviation, or
  its insertion AUC not above random's mean + one standard deviation — is "no better than random".
- **Ties**: units with equal scores carry no order of their own, so a method's tied units are taken in each random
  order's sequence in turn and its curves are the mean over those orders (taking the earlier unit first would score
  a map with no signal by the accident of word order). A map that ties everywhere (all zero) thus gets exactly the
  random curves and scores as random.

Both axes run from 0 to 1 (the fraction of units removed or revealed; a probability), so the trapezoidal area is
already normalised to 0..1. Step ``s`` of ``steps`` removes ``round(s / steps · units)`` units. All perturbed inputs
of all methods go through the model in batches of ``Explainable.batch_size``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from models.analysis import attribution
from models.analysis.attribution import Explainable

AUC_NOTE = ("trapezoidal area under the target's probability (0..1) against the fraction of units removed (deletion) "
            "or revealed (insertion) (0..1), so already in 0..1; deletion: lower is better, insertion: higher is "
            "better")


PROBABILITY = "target probability"  # the measure the curves read unless the adapter says otherwise


def measure_symbol(measure: str) -> str:
    """How the page and the caption write the measure's value: ``p`` for a probability, ``cos`` for a cosine."""
    return "p" if measure == PROBABILITY else "cos"


@dataclass(frozen=True)
class Curves:
    deletion: np.ndarray  # (steps + 1,) probability after removing fraction s/steps, most relevant first
    insertion: np.ndarray  # (steps + 1,) probability after revealing fraction s/steps, most relevant first
    orders: int = 1  # orders averaged: 1, or the random orders that broke the method's ties

    @property
    def deletion_auc(self) -> float:
        return auc(self.deletion)

    @property
    def insertion_auc(self) -> float:
        return auc(self.insertion)


@dataclass(frozen=True)
class Faithfulness:
    """The table of one input: curves and AUCs per method and for random orders."""

    model: str
    input_name: str
    target: int
    target_name: str
    probability: float  # the target's probability on the untouched input
    replacement: str  # what replaces a removed unit, in words
    units: int
    steps: int
    explanations: attribution.Explanations
    curves: dict[str, Curves]  # per method
    random: list[Curves]  # one per seed
    unit_names: tuple[str, ...]
    seconds: float
    result: object = None  # the run explained (the maps are drawn on its crop / tokens)
    target_kind: str = "class"  # what the target is, in words (a class, a token, a sentence embedding)
    notes: tuple[str, ...] = ()  # the adapter's remarks (which target is used, what is not offered)
    measure: str = PROBABILITY  # what the curves read, in words (a cosine for a sentence embedding)

    @property
    def fractions(self) -> np.ndarray:
        return np.linspace(0.0, 1.0, self.steps + 1)

    @property
    def seeds(self) -> int:
        """How many random orders the methods were compared with."""
        return len(self.random)

    @property
    def weak(self) -> list[str]:
        """The methods no better than random (``no_better_than_random``), in the table's order."""
        return [method for method in self.curves if self.no_better_than_random(method)]

    def random_auc(self, curve: str) -> tuple[float, float]:
        values = [auc(getattr(c, curve)) for c in self.random]
        return float(np.mean(values)), float(np.std(values))

    def no_better_than_random(self, method: str) -> bool:
        """Whether ``method`` fails either test: deletion not below random's mean − 1 sd, or insertion not above
        random's mean + 1 sd."""
        deletion_mean, deletion_std = self.random_auc("deletion")
        insertion_mean, insertion_std = self.random_auc("insertion")
        found = self.curves[method]
        return found.deletion_auc >= deletion_mean - deletion_std or found.insertion_auc <= insertion_mean + \
            insertion_std

    def payload(self) -> dict:
        """The CLI's ``--view faithfulness --format json`` contract (issue 17)."""
        def entry(curves: Curves) -> dict:
            return {"deletion_auc": curves.deletion_auc, "insertion_auc": curves.insertion_auc,
                    "deletion": curves.deletion.tolist(), "insertion": curves.insertion.tolist(),
                    "orders": curves.orders}

        random_mean = Curves(np.mean([c.deletion for c in self.random], 0), np.mean([c.insertion for c in self.random],
                                                                                       0))
        random = entry(random_mean)
        random["deletion_auc"], random["deletion_auc_std"] = self.random_auc("deletion")
        random["insertion_auc"], random["insertion_auc_std"] = self.random_auc("insertion")
        random["seeds"] = self.seeds
        return {"target": {"index": self.target, "name": self.target_name, "probability": self.probability,
                           "kind": self.target_kind, "measure": self.measure, "notes": list(self.notes)},
                "methods": {**{m: entry(c) for m, c in self.curves.items()}, "random": random},
                "model": self.model, "input": self.input_name, "units": self.units, "steps": self.steps,
                "fractions": self.fractions.tolist(), "replacement": self.replacement, "auc": AUC_NOTE,
                "no_better_than_random": self.weak,
                "integrated_gradients_delta": self.explanations.ig_delta,
                "integrated_gradients_difference": self.explanations.ig_difference,
                "raw_attention": (None if self.explanations.raw_attention is None
                                  else self.explanations.raw_attention.as_dict())}


def auc(curve: np.ndarray) -> float:
    """Trapezoidal area under ``curve`` sampled at evenly spaced fractions of 0..1."""
    curve = np.asarray(curve, dtype=np.float64)
    return float(((curve[1:] + curve[:-1]) / 2).sum() / (len(curve) - 1))


def removal_counts(units: int, steps: int) -> list[int]:
    return [round(s * units / steps) for s in range(steps + 1)]


def perturbation_masks(order: np.ndarray, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Boolean ``(steps + 1, units)`` masks of the units *removed* at each step: deletion removes ``order``'s first
    ``k``; insertion has only its first ``k`` revealed (all others removed)."""
    units = len(order)
    deletion = torch.zeros(steps + 1, units, dtype=torch.bool)
    for step, count in enumerate(removal_counts(units, steps)):
        deletion[step, torch.as_tensor(order[:count], dtype=torch.long)] = True
    insertion = ~deletion
    return deletion, insertion


def target_probabilities(ex: Explainable, removed: torch.Tensor,
                         progress: Callable[[int], None] = lambda done: None) -> np.ndarray:
    """The target's probability for each row of ``removed`` (R, units) bool: ``embeddings`` with the removed units
    replaced by the baseline's, in batches."""
    return target_outcomes(ex, removed, progress)[0]


def target_outcomes(ex: Explainable, removed: torch.Tensor,
                    progress: Callable[[int], None] = lambda done: None) -> tuple[np.ndarray, np.ndarray]:
    """``target_probabilities`` and whether the target is still the top class (R,) bool (Chefer et al.'s curves
    count top-1 accuracy)."""
    unique, inverse = torch.unique(removed, dim=0, return_inverse=True)  # every curve's first and last step, …
    if len(unique) < len(removed):  # … are the same input for every order: run each distinct input once
        scale = len(removed) / len(unique)  # progress counts the caller's inputs, so it ends at 100 %
        probabilities, correct = target_outcomes(ex, unique, lambda done: progress(round(done * scale)))
        return probabilities[inverse.numpy()], correct[inverse.numpy()]
    units = torch.as_tensor(ex.units, device=ex.embeddings.device)
    probabilities, correct = [], []
    with torch.no_grad():
        for start in range(0, len(removed), ex.batch_size):
            chunk = removed[start:start + ex.batch_size].to(ex.embeddings.device)  # (b, units)
            full = torch.zeros(len(chunk), ex.embeddings.shape[1], dtype=torch.bool, device=chunk.device)
            full[:, units] = chunk
            batch = torch.where(full.unsqueeze(-1), ex.baseline, ex.embeddings)  # (b, N, D)
            logits = ex.logits(batch).float()
            probabilities.append(ex.probability(logits).cpu())
            correct.append(ex.is_top(logits).cpu())
            progress(min(start + ex.batch_size, len(removed)))
    return torch.cat(probabilities).numpy(), torch.cat(correct).numpy()


def ranking(scores: np.ndarray, tie_order: np.ndarray | None = None) -> np.ndarray:
    """Unit indices, most relevant first; tied units in the sequence of ``tie_order`` (a permutation of the units;
    None: the earlier unit first)."""
    scores = np.asarray(scores, dtype=np.float64)
    if tie_order is None:
        return np.argsort(-scores, kind="stable")
    place = np.empty(len(tie_order), dtype=np.int64)
    place[np.asarray(tie_order)] = np.arange(len(tie_order))  # each unit's place in the tie order
    return np.lexsort((place, -scores))  # by score, then by place


def rankings(scores: np.ndarray, random_orders: list[np.ndarray]) -> list[np.ndarray]:
    """The orders a method's curves are averaged over: one when no two scores are equal, else one per random order,
    each breaking the ties in its own sequence (all ties, a map with no signal: exactly the random orders)."""
    scores = np.asarray(scores, dtype=np.float64)
    if len(np.unique(scores)) == len(scores):
        return [ranking(scores)]
    return [ranking(scores, order) for order in random_orders]


def measure(ex: Explainable, explanations: attribution.Explanations, steps: int = 20, seeds: int = 5,
            progress: Callable[[str, float], None] = lambda step, fraction: None
            ) -> tuple[dict[str, Curves], list[Curves]]:
    """Deletion and insertion curves for every method's scores and ``seeds`` random orders (seeds 0..seeds-1); a
    method with tied scores gets the mean of its curves over the random orders' tie-breaks (``rankings``)."""
    if not 2 <= steps <= 200:
        raise ValueError(f"the curves take 2 to 200 steps, not {steps}")
    if not 1 <= seeds <= 100:
        raise ValueError(f"random orders: 1 to 100 seeds, not {seeds}")
    units = len(ex.units)
    if units < 2:
        raise ValueError("there is only one unit to remove, so there is no order to test: give a longer input")
    randoms = [np.random.default_rng(seed).permutation(units) for seed in range(seeds)]
    orders = {m: rankings(s, randoms) for m, s in explanations.scores.items()}
    every = [order for per_method in orders.values() for order in per_method] + randoms
    masks = [perturbation_masks(order, steps) for order in every]
    # (orders × 2 × (steps + 1), units); inputs shared by several orders (a tie-break that is a random order, every
    # curve's two ends) run once (target_outcomes)
    removed = torch.cat([torch.cat(pair) for pair in masks])
    total = len(removed)
    probabilities = target_probabilities(ex, removed, lambda done: progress(
        f"perturbed inputs {done}/{total}", done / total)).reshape(len(masks), 2, steps + 1)
    curves, start = {}, 0
    for method, per_method in orders.items():
        mean = probabilities[start:start + len(per_method)].mean(axis=0)
        curves[method] = Curves(mean[0], mean[1], len(per_method))
        start += len(per_method)
    return curves, [Curves(p[0], p[1]) for p in probabilities[start:]]


def faithfulness(ex: Explainable, model: str, input_name: str, methods=None, steps: int = 20,
                 seeds: int = 5, ig_steps: int = 32, progress: Callable[[str, float], None] = lambda s, f: None,
                 result=None, layer: int = -1, head: int | None = None) -> Faithfulness:
    """Every method's explanation of ``ex`` and its curves: the page's table, the CLI's JSON.
    ``methods``: default ``attribution.compared(ex)``.
    ``layer``, ``head``: raw attention's (the default: the last layer's head mean)."""
    started = time.perf_counter()
    methods = attribution.compared(ex) if methods is None else methods
    explanations = attribution.explain(ex, methods, ig_steps, layer, head,
                                       progress=lambda step, f: progress(step, 0.4 * f))
    curves, random = measure(ex, explanations, steps, seeds, lambda step, f: progress(step, 0.4 + 0.6 * f))
    return Faithfulness(model, input_name, ex.target, ex.target_name, explanations.probability, ex.replacement,
                        len(ex.units), steps, explanations, curves, random, ex.unit_names,
                        time.perf_counter() - started, result, ex.target_kind, ex.notes, ex.measure)
