"""Two runs compared head by head: two prompts on one model, or one prompt on two models that share a tokenizer
(a model and its fine-tune, ``gpt2`` and ``distilgpt2``'s first layers are *not* pairs: their head grids differ).

When both runs have the same number of tokens, head ``(l, h)`` of one is compared with head ``(l, h)`` of the other
row by row (query by query), then averaged over the queries:
- ``js``: the Jensen–Shannon divergence of the two rows, in bits (0 = the same distribution, 1 = disjoint);
- ``tv``: the total variation distance ½ Σ_k |A_qk − B_qk| (0 … 1), i.e. the mean absolute difference scaled so
  that a row moved entirely elsewhere counts 1.
When the token counts differ, cells cannot be paired: each head is then summarised by one statistic of its map
(``models.analysis.heads.STATISTICS``: entropy, mean distance, first-token share, ...) and the absolute difference of
that statistic is compared instead, which the result says.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from models.analysis import heads
from models.core.results import RunResult, TextResult

DISTANCES = {"js": "Jensen–Shannon divergence (bits)", "tv": "total variation ½Σ|Δ|"}
MAX_TOKENS = 512  # two runs' heads are recomputed layer by layer: bounded work per comparison


@dataclass(frozen=True)
class Comparison:
    first: RunResult
    second: RunResult
    first_label: str  # what distinguishes each run: its prompt, or its model
    second_label: str
    measure: str  # a DISTANCES key when the tokens pair up, else a heads.STATISTICS key
    per_head: np.ndarray  # (layers, heads) float32
    same_length: bool
    note: str  # what was compared, in a sentence

    @property
    def per_layer(self) -> np.ndarray:
        """(layers,) the mean over each layer's heads."""
        return self.per_head.mean(axis=1)

    @property
    def measure_label(self) -> str:
        if self.measure in DISTANCES:
            return DISTANCES[self.measure]
        return f"|Δ {heads.STATISTICS[self.measure].lower()}|"


def row_distances(first: np.ndarray, second: np.ndarray, measure: str) -> np.ndarray:
    """``(heads, q, k)`` × 2 -> ``(heads,)``: the mean over queries of the row distance ``measure``."""
    if measure == "tv":
        return 0.5 * np.abs(first - second).sum(-1).mean(-1)
    if measure != "js":
        raise ValueError(f"unknown distance {measure!r}; choose one of {', '.join(DISTANCES)}")
    middle = 0.5 * (first + second)

    def kl(p: np.ndarray) -> np.ndarray:  # Σ p log₂(p / m), 0 log 0 = 0 (m > 0 wherever p > 0)
        safe = np.where(p > 0, p, 1.0)
        return (p * (np.log2(safe) - np.log2(np.where(p > 0, middle, 1.0)))).sum(-1)

    return np.maximum(0.5 * kl(first) + 0.5 * kl(second), 0).mean(-1)


def compare_results(first: RunResult, second: RunResult, measure: str, labels: tuple[str, str]) -> Comparison:
    """The per-head comparison of two runs' self-attention (see the module docstring)."""
    maps_a, maps_b = first.maps("self"), second.maps("self")
    shape_a, shape_b = (maps_a.num_layers, maps_a.num_heads), (maps_b.num_layers, maps_b.num_heads)
    if shape_a != shape_b:
        raise ValueError(f"the two models have different head grids ({shape_a[0]} × {shape_a[1]} and "
                         f"{shape_b[0]} × {shape_b[1]} layers × heads): their heads cannot be paired. Compare two "
                         "prompts on one model, or two models of the same shape (a model and its fine-tune)")
    n_a, n_b = len(maps_a.query_tokens), len(maps_b.query_tokens)
    same_length = n_a == n_b
    if same_length:
        if measure not in DISTANCES:
            raise ValueError(f"the two runs have the same token count: compare them with {' or '.join(DISTANCES)}, "
                             f"not {measure!r}")
        per_head = np.stack([row_distances(maps_a.layer(layer), maps_b.layer(layer), measure)
                             for layer in range(shape_a[0])])
        note = (f"Both runs have {n_a} tokens: each head's two maps are compared query by query "
                f"({DISTANCES[measure]}, averaged over the queries).")
    else:
        statistic = measure if measure in heads.STATISTICS else "entropy_bits"
        per_head = np.stack([np.abs(heads.layer_statistics(maps_a.layer(layer))[statistic]
                                    - heads.layer_statistics(maps_b.layer(layer))[statistic])
                             for layer in range(shape_a[0])])
        measure = statistic
        note = (f"The runs have different token counts ({n_a} and {n_b}): their maps cannot be compared cell by "
                f"cell, so each head is summarised by its {heads.STATISTICS[statistic].lower()} and the two "
                "summaries are compared. Make the prompts the same length (in tokens) to compare the maps themselves.")
    return Comparison(first, second, labels[0], labels[1], measure, per_head.astype(np.float32), same_length, note)


def compare_runs(loaded, result: RunResult, options) -> Comparison:
    """``result`` against a second run: ``options.text2`` (empty: the same prompt) on ``options.model2`` (empty: the
    same model; else a registry key, hub id or folder whose tokenizer is the same), compared by
    ``options.distance``."""
    from models import families
    from models.core.inputs import TextInput

    text2, model2 = (options.text2 or "").strip(), (options.model2 or "").strip()
    if not text2 and not model2:
        raise ValueError("type a second prompt to compare with, or name a second model that shares this one's "
                         "tokenizer")
    ids = list(result.token_ids) if isinstance(result, TextResult) else []
    if not ids:
        raise ValueError("comparing runs reads a language model's prompt run")
    if len(ids) > MAX_TOKENS:
        raise ValueError(f"comparing runs works on prompts of up to {MAX_TOKENS} tokens, not {len(ids)}")
    other = loaded
    if model2:
        known = {spec.key: spec for spec in families.specs("causal_lm")}
        other = families.load(known.get(model2) or families.custom("causal_lm", model2), loaded.device, loaded.dtype)
        if other.tokenizer.get_vocab() != loaded.tokenizer.get_vocab():
            raise ValueError(f"{model2} does not share {result.model.short_name}'s tokenizer: the two runs' tokens "
                             "would not line up. Pick a model with the same tokenizer (a fine-tune of it)")
    second_text = text2 or loaded.tokenizer.decode(ids, skip_special_tokens=True)
    second = families.run(other, TextInput(second_text, MAX_TOKENS))
    if not text2 and list(second.token_ids) != ids:
        raise ValueError("the second model tokenises the prompt differently: type the second prompt explicitly")
    if model2:
        labels = (result.model.short_name, second.model.short_name)
    else:
        labels = tuple(" ".join(run.tokens)[:60] for run in (result, second))
    return compare_results(result, second, options.distance, labels)
