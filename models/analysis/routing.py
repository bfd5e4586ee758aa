"""Routing statistics of a mixture-of-experts model on one input: pure numpy on ``models.families.moe.model.Routing`` arrays.

- Expert load ``f_{l,i}``: share of layer l's token→expert assignments that went to expert i (each token makes k
  assignments); uniform load is ``1/E``.
- Balance: coefficient of variation ``CV = std(f)/mean(f)`` (0 = perfectly balanced, ``sqrt(E-1)`` = all to one
  expert) and the Switch Transformer auxiliary loss without its coefficient, ``E · Σ_i f_i · P_i`` (Fedus et al.
  2021, eq. 4, with ``P_i`` the mean router probability of expert i): 1 when balanced, up to E when collapsed.
- Router entropy per token ``H = -Σ_i p_i log p_i`` in nats (``log E`` = undecided, 0 = certain).
- Co-activation: share of tokens whose top-k contains both experts i and j.
- Cross-layer consistency: normalised mutual information between the top-1 expert at layers a and b (expert
  numbers are arbitrary per layer, so "same number" means nothing; shared information does), and the rate at which
  consecutive tokens keep the same top-1 expert (Jiang et al. 2024, Mixtral §5, Fig. 10) against chance ``Σ f_i²``.
- Specialisation: mutual information ``I(C; X)`` in bits between a token's category C (word, code, number,
  punctuation) and the expert X it was dispatched to, against the same statistic after shuffling the routing across
  tokens (which keeps both marginals and breaks only the link between them; the plug-in estimator's bias is in the
  baseline too).
"""
from __future__ import annotations

import keyword
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

CATEGORIES = ("word", "code", "number", "punctuation")
OTHER = "other"  # whitespace-only and special tokens: not counted in the specialisation statistic

_CODE_START = re.compile(
    r"^\s*(def|class|import|from|return|for|while|if|elif|else|try|except|finally|with|assert|raise|yield|lambda|"
    r"print|pass|break|continue|async|await|global|nonlocal)\b(?!['’])")
_CODE_BODY = re.compile(r"(^|[^=!<>])==?(?!=)|[!<>]=|\+=|-=|->|\w\(.*\)|\[\s*\w*\s*\]|:\s*$|^\s{2,}\S|\w\.\w+\(")
_SENTENCE = re.compile(r"^[A-Z][a-z]+(\s+[a-z]+){3,}")


def expert_load(top_experts: np.ndarray, num_experts: int) -> np.ndarray:
    """Share of assignments per expert: ``top_experts`` int ``(layers, tokens, k)`` -> float ``(layers, E)``.

    Rows sum to 1 (the router's choice, counted before any capacity cut).
    """
    layers = top_experts.shape[0]
    load = np.zeros((layers, num_experts), dtype=np.float64)
    for layer in range(layers):
        load[layer] = np.bincount(top_experts[layer].ravel(), minlength=num_experts)[:num_experts]
    totals = load.sum(axis=1, keepdims=True)
    return np.divide(load, totals, out=np.zeros_like(load), where=totals > 0)


def coefficient_of_variation(load: np.ndarray) -> np.ndarray:
    """``std/mean`` of each row of ``load`` ``(layers, E)`` -> ``(layers,)``; 0 = balanced."""
    mean = load.mean(axis=-1)
    return np.divide(load.std(axis=-1), mean, out=np.zeros_like(mean), where=mean > 0)


def switch_aux_loss(load: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """``E · Σ_i f_i P_i`` per layer: ``load`` ``(layers, E)``, ``probs`` ``(layers, tokens, E)`` -> ``(layers,)``.

    1.0 for a balanced router, E when every token goes to the expert it is most sure of.
    """
    mean_probs = probs.mean(axis=1)  # (layers, E)
    return load.shape[-1] * (load * mean_probs).sum(axis=-1)


def router_entropy(probs: np.ndarray) -> np.ndarray:
    """Entropy in nats of each token's router distribution: ``(..., E)`` -> ``(...)``."""
    p = probs.astype(np.float64)
    logs = np.log(p, out=np.zeros_like(p), where=p > 0)
    return -(p * logs).sum(axis=-1)


def coactivation(top_experts: np.ndarray, num_experts: int) -> np.ndarray:
    """``(E, E)`` share of tokens whose chosen experts include both i and j; diagonal = share choosing i.

    ``top_experts``: int ``(tokens, k)`` for one layer.
    """
    tokens = top_experts.shape[0]
    chosen = np.zeros((tokens, num_experts), dtype=np.float64)
    np.put_along_axis(chosen, top_experts, 1.0, axis=1)
    return chosen.T @ chosen / max(tokens, 1)


def mutual_information(labels_a: np.ndarray, labels_b: np.ndarray, weights: np.ndarray | None = None) -> float:
    """Plug-in mutual information in bits between two integer label arrays of equal length."""
    if labels_a.size == 0:
        return 0.0
    a_values, a = np.unique(labels_a, return_inverse=True)
    b_values, b = np.unique(labels_b, return_inverse=True)
    joint = np.zeros((a_values.size, b_values.size))
    np.add.at(joint, (a, b), 1.0 if weights is None else weights)
    joint /= joint.sum()
    outer = joint.sum(axis=1, keepdims=True) @ joint.sum(axis=0, keepdims=True)
    nonzero = joint > 0
    return float((joint[nonzero] * np.log2(joint[nonzero] / outer[nonzero])).sum())


def entropy_bits(labels: np.ndarray) -> float:
    _, counts = np.unique(labels, return_counts=True)
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum()) if counts.size else 0.0


def cross_layer_consistency(top1: np.ndarray) -> np.ndarray:
    """Normalised MI ``I(a; b) / sqrt(H(a) H(b))`` between layers' top-1 experts: ``(layers, tokens)`` -> ``(L, L)``.

    1 = one layer's choice determines the other's (up to renaming experts); 0 = independent.
    """
    layers = top1.shape[0]
    entropies = [entropy_bits(top1[i]) for i in range(layers)]
    nmi = np.eye(layers)
    for i in range(layers):
        for j in range(i + 1, layers):
            denom = np.sqrt(entropies[i] * entropies[j])
            nmi[i, j] = nmi[j, i] = mutual_information(top1[i], top1[j]) / denom if denom > 0 else 0.0
    return nmi


def consecutive_repeat_rate(top1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per layer: share of consecutive token pairs with the same top-1 expert, and the chance rate ``Σ f_i²``.

    ``top1``: int ``(layers, tokens)`` -> two ``(layers,)`` arrays.
    """
    layers, tokens = top1.shape
    if tokens < 2:
        return np.zeros(layers), np.zeros(layers)
    observed = (top1[:, 1:] == top1[:, :-1]).mean(axis=1)
    chance = np.array([((np.bincount(row) / tokens) ** 2).sum() for row in top1])
    return observed, chance


# --- token categories and specialisation --------------------------------------------------------------------------

def is_code_line(line: str) -> bool:
    """Heuristic: does this line read as (Python-like) code rather than prose or a list of numbers?"""
    stripped = line.strip()
    if not stripped or re.fullmatch(r"[\d\s.,:;+\-*/=%()]+", stripped):
        return False
    if _CODE_START.match(line) and not _SENTENCE.match(stripped):
        return True
    if stripped.startswith(("#", "@", '"""')) or stripped in ("}", "]", ")"):
        return True
    if _SENTENCE.match(stripped) and stripped.endswith((".", "!", "?")):
        return False
    return bool(_CODE_BODY.search(line)) or (bool(re.fullmatch(r"[A-Za-z_]\w*", stripped))
                                            and keyword.iskeyword(stripped))


def token_categories(text: str, tokens: list[str], offsets: list[tuple[int, int]] | None,
                     special: set[int] | None = None) -> list[str]:
    """One of ``CATEGORIES`` (or ``OTHER``) per token.

    number: digits (and separators) without letters; code: any other token on a line that reads as code;
    word: letters; punctuation: the rest. Lines are taken from ``offsets`` into ``text`` when known.
    ``special``: positions of special tokens (BOS/EOS), always ``OTHER``.
    """
    special = special or set()
    code_at = None
    if offsets is not None:
        code_at = np.zeros(len(text) + 1, dtype=bool)
        position = 0
        for line in text.split("\n"):
            code_at[position:position + len(line) + 1] = is_code_line(line)
            position += len(line) + 1
    categories = []
    for i, token in enumerate(tokens):
        core = token.strip()
        if i in special or not core:
            categories.append(OTHER)
            continue
        has_letter = any(ch.isalpha() for ch in core)
        if any(ch.isdigit() for ch in core) and not has_letter:
            categories.append("number")
            continue
        in_code = False
        if code_at is not None and offsets is not None and i < len(offsets) and offsets[i][1] > offsets[i][0]:
            start = offsets[i][0] + (len(token) - len(token.lstrip()))
            in_code = bool(code_at[min(start, len(text))])
        if in_code:
            categories.append("code")
        elif has_letter:
            categories.append("word")
        else:
            categories.append("punctuation")
    return categories


@dataclass(frozen=True)
class Specialisation:
    """Mutual information (bits) between token category and dispatched expert, per layer, vs a shuffled baseline."""

    observed: np.ndarray  # (layers,)
    shuffled_mean: np.ndarray  # (layers,) mean over shuffles
    shuffled_p95: np.ndarray  # (layers,) 95th percentile over shuffles
    category_entropy: float  # H(C) in bits: the most MI could ever be
    counts: dict[str, int]  # tokens per category that were counted
    tokens_used: int

    @property
    def excess(self) -> np.ndarray:
        """MI above what shuffled routing gives (bits)."""
        return self.observed - self.shuffled_mean


def specialisation(top_experts: np.ndarray, categories: list[str], shuffles: int = 200,
                   seed: int = 0) -> Specialisation:
    """``I(C; X)`` per layer, counting each of a token's k dispatched experts with weight 1/k.

    ``top_experts``: int ``(layers, tokens, k)``; ``categories``: one per token (``OTHER`` tokens are left out).
    The baseline permutes the tokens' routes (whole rows, all layers alike) ``shuffles`` times.
    """
    use = np.array([c in CATEGORIES for c in categories], dtype=bool)
    labels = np.array([CATEGORIES.index(c) for c, u in zip(categories, use) if u], dtype=np.int64)
    routes = top_experts[:, use]  # (layers, n, k)
    layers, n, k = routes.shape
    counts = {c: int((labels == i).sum()) for i, c in enumerate(CATEGORIES)}
    if n < 2:
        zeros = np.zeros(layers)
        return Specialisation(zeros, zeros, zeros, 0.0, counts, n)
    category_per_slot = np.repeat(labels, k)  # (n·k,) matches routes[layer].ravel()
    weights = np.full(n * k, 1.0 / k)
    rng = np.random.default_rng(seed)
    observed = np.array([mutual_information(category_per_slot, routes[layer].ravel(), weights)
                         for layer in range(layers)])
    baseline = np.empty((shuffles, layers))
    for s in range(shuffles):
        permuted = np.repeat(labels[rng.permutation(n)], k)
        baseline[s] = [mutual_information(permuted, routes[layer].ravel(), weights) for layer in range(layers)]
    return Specialisation(observed, baseline.mean(axis=0), np.percentile(baseline, 95, axis=0),
                          entropy_bits(labels), counts, n)


SHUFFLES = 100  # shuffled routings behind the page's specialisation baseline (about a second for a few layers)


@dataclass(frozen=True)
class RunSpecialisation:
    """The specialisation view's data: ``specialisation`` of ``result``'s routing against ``shuffles`` shuffles."""

    result: Any  # the models.families.moe.model.RoutingResult (models.families.moe.model imports this module, so it is not imported here)
    specialisation: Specialisation
    shuffles: int


def specialisation_of_run(loaded, result, options) -> RunSpecialisation:
    """The specialisation view's analysis: ``specialisation`` of a ``models.families.moe.model.RoutingResult`` with
    ``options.shuffles`` shuffles (seed 0, so the baseline is the same on every rerun); ``loaded`` is not used."""
    if options.shuffles < 1:
        raise ValueError("the shuffled baseline needs at least 1 shuffle")
    routing = result.routing
    return RunSpecialisation(result, specialisation(routing.top_experts, routing.categories, options.shuffles),
                             options.shuffles)


@dataclass(frozen=True)
class RoutingSummary:
    """Everything the page shows about balance, per layer."""

    load: np.ndarray  # (layers, E) share of assignments
    cv: np.ndarray  # (layers,)
    aux_loss: np.ndarray  # (layers,)
    entropy: np.ndarray  # (layers, tokens) nats
    dropped_share: np.ndarray  # (layers,) share of assignments cut by expert capacity


def summarise(probs: np.ndarray, top_experts: np.ndarray, kept: np.ndarray) -> RoutingSummary:
    """Balance figures of one routing: ``probs`` ``(L, T, E)``, ``top_experts``/``kept`` ``(L, T, k)``."""
    load = expert_load(top_experts, probs.shape[-1])
    return RoutingSummary(load, coefficient_of_variation(load), switch_aux_loss(load, probs), router_entropy(probs),
                          1.0 - kept.reshape(kept.shape[0], -1).mean(axis=1))


def summarise_routing(routing) -> RoutingSummary:
    """``summarise`` of a ``models.families.moe.model.Routing``."""
    return summarise(routing.probs, routing.top_experts, routing.kept)
