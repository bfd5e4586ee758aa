"""Why a transformer needs positions at all: self-attention is permutation-equivariant.

For self-attention ``F`` and any permutation ``σ`` of the tokens, ``F(σ(X)) = σ(F(X))`` (Vaswani et al. 2017 §3.5:
"the model contains no recurrence and no convolution", so order must be injected). The demo runs one tiny
single-head self-attention layer with fixed random weights on a sentence's token embeddings ``X`` and on a shuffled
copy, and measures how far the restored outputs differ: not at all without positions, clearly once a sinusoidal
(``X·√d + PE``) or a learned table (``X + P``) is added by position.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch

from models.lessons.positional.formulas import sinusoidal_encoding
from models.lessons.positional.in_models import learned_positions


@dataclass(frozen=True)
class EquivarianceDemo:
    """One self-attention layer F run on X and on σ(X).

    ``permutation[i]`` is the original index of the token at shuffled position i; ``attention`` ``(L, L)`` is F's
    attention on X; ``shuffled_attention_restored`` is the attention on σ(X) with rows and columns put back in the
    original order (equal to ``attention`` exactly when F is equivariant); ``output_gap`` ``(L,)`` is
    ``‖F(σ(X))[σ⁻¹] − F(X)‖ / ‖F(X)‖`` per token.
    """

    tokens: list[str]
    permutation: np.ndarray
    attention: np.ndarray
    shuffled_attention_restored: np.ndarray
    output_gap: np.ndarray

    @property
    def max_gap(self) -> float:
        return float(self.output_gap.max())


@dataclass(frozen=True)
class EquivarianceRuns:
    """The demo on one sentence three ways (``equivariance_comparison``), and whose embeddings it ran on."""

    model: str  # the registry key of the model whose token embeddings (and learned table) were used
    short_name: str  # the model's name in file names
    sentence: str
    seed: int
    tokens: tuple[str, ...]
    runs: Mapping[str, EquivarianceDemo]  # setting label -> run; every run shuffles the same way
    notices: tuple[str, ...] = ()  # what was cut ("the demo uses the first 32 tokens")

    @property
    def permutation(self) -> np.ndarray:
        return next(iter(self.runs.values())).permutation

    @property
    def shuffled_tokens(self) -> list[str]:
        return [self.tokens[i] for i in self.permutation]

    def run(self, setting: str) -> EquivarianceDemo:
        if setting not in self.runs:
            raise ValueError(f"unknown setting {setting!r}; choose one of: {'; '.join(self.runs)}")
        return self.runs[setting]


def tiny_self_attention(x: torch.Tensor, seed: int = 0, head_dim: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """One single-head self-attention layer with fixed random weights: ``x`` ``(L, d)`` -> output ``(L, head_dim)``,
    attention ``(L, L)``.

    As in a (pre-LN) transformer block, each token is layer-normalised first (a per-token operation, so it keeps the
    symmetry); that puts the scores at a scale where softmax is not uniform. Weights ``N(0, 1/d)`` come from a
    generator seeded with ``seed``.
    """
    length, dim = x.shape
    generator = torch.Generator().manual_seed(seed)
    w_query, w_key, w_value = (torch.randn(dim, head_dim, generator=generator, dtype=torch.float64) / dim ** 0.5
                               for _ in range(3))
    x = torch.nn.functional.layer_norm(x.to(torch.float64), (dim,))
    query, key, value = x @ w_query, x @ w_key, x @ w_value  # (L, head_dim) each
    attention = torch.softmax(query @ key.T / head_dim ** 0.5, dim=-1)  # (L, L)
    return attention @ value, attention


MAX_DEMO_TOKENS = 32


def token_embeddings(model: Any, tokenizer: Any, text: str, max_tokens: int = MAX_DEMO_TOKENS
                     ) -> tuple[list[str], np.ndarray, list[str]]:
    """The input-embedding rows of ``text``'s tokens (no special tokens): labels, float32 ``(L, d)``, notices."""
    from models.core.text import display_tokens

    if not text.strip():
        raise ValueError("Type a sentence first.")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    notices = []
    if len(ids) > max_tokens:
        notices.append(f"The sentence has {len(ids)} tokens; the demo uses the first {max_tokens}.")
        ids = ids[:max_tokens]
    if len(ids) < 2:
        raise ValueError("The sentence gives fewer than two tokens: type a few words, so there is something to "
                         "shuffle.")
    weight = model.get_input_embeddings().weight  # (vocab, d)
    rows = weight[torch.tensor(ids, device=weight.device)].detach().to("cpu", torch.float32).numpy()  # (L, d)
    return display_tokens(tokenizer, ids), rows, notices


def equivariance_of_model(loaded: Any, result: Any = None, options: Any = None) -> EquivarianceRuns:
    """The demo on a loaded encoder's token embeddings and its learned position table (the positional page's
    analysis): reads ``options.sentence`` and ``options.seed``; a sentence too short to shuffle is a ValueError."""
    tokens, embeddings, notices = token_embeddings(loaded.model, loaded.tokenizer, options.sentence)
    runs = equivariance_comparison(embeddings, tokens, learned_positions(loaded.model).table,
                                   f"{loaded.spec.key}'s learned table", options.seed)
    return EquivarianceRuns(loaded.spec.key, loaded.spec.short_name, options.sentence, options.seed, tuple(tokens),
                            runs, tuple(notices))


def equivariance_comparison(embeddings: np.ndarray, tokens: list[str], learned_table: np.ndarray | None,
                            learned_name: str = "learned", seed: int = 0) -> dict[str, EquivarianceDemo]:
    """The demo three ways: no positions; sinusoidal (``X·√d + PE``, Vaswani et al.); a model's learned table
    (``X + P``, as BERT adds them) when given. Keys are labels for the page."""
    dim = embeddings.shape[1]
    runs = {"no positions": permutation_equivariance(embeddings, tokens, None, seed),
            "sinusoidal (X·√d + PE)": permutation_equivariance(embeddings, tokens,
                                                               sinusoidal_encoding(len(tokens), dim), seed,
                                                               math.sqrt(dim))}
    if learned_table is not None:
        runs[f"{learned_name} (X + P)"] = permutation_equivariance(embeddings, tokens, learned_table, seed)
    return runs


def permutation_equivariance(embeddings: np.ndarray, tokens: list[str], position_table: np.ndarray | None = None,
                             seed: int = 0, embedding_scale: float = 1.0) -> EquivarianceDemo:
    """Run ``tiny_self_attention`` on ``embeddings`` ``(L, d)`` and on a seeded shuffle of them.

    With ``position_table`` ``(≥ L, d)``, row p is added to whichever token sits at position p — before and after
    shuffling — so tokens that move get a different encoding, and the outputs no longer just shuffle along.
    ``embedding_scale`` multiplies the token embeddings first (Vaswani et al. use ``√d`` before adding sinusoids).
    """
    embeddings = np.asarray(embeddings, dtype=np.float64) * embedding_scale
    length = embeddings.shape[0]
    if length < 2:
        raise ValueError("type at least two tokens: a single token cannot be shuffled.")
    if len(tokens) != length:
        raise ValueError(f"{len(tokens)} tokens for {length} embeddings")
    if position_table is not None and (position_table.shape[0] < length or
                                       position_table.shape[1] != embeddings.shape[1]):
        raise ValueError(f"the position table {position_table.shape} does not cover {length} tokens of width "
                         f"{embeddings.shape[1]}")
    rng = np.random.default_rng(seed)
    permutation = rng.permutation(length)
    while np.array_equal(permutation, np.arange(length)):  # a shuffle that moves nothing proves nothing
        permutation = rng.permutation(length)
    shuffled = embeddings[permutation]
    if position_table is not None:
        positions = np.asarray(position_table[:length], dtype=np.float64)
        embeddings, shuffled = embeddings + positions, shuffled + positions
    output, attention = tiny_self_attention(torch.from_numpy(embeddings), seed)
    shuffled_output, shuffled_attention = tiny_self_attention(torch.from_numpy(shuffled), seed)
    inverse = np.argsort(permutation)
    restored_output = shuffled_output.numpy()[inverse]  # row i: the output of original token i
    restored_attention = shuffled_attention.numpy()[np.ix_(inverse, inverse)]
    reference = output.numpy()
    gap = np.linalg.norm(restored_output - reference, axis=1) / np.maximum(np.linalg.norm(reference, axis=1), 1e-12)
    return EquivarianceDemo(list(tokens), permutation, attention.numpy().astype(np.float32),
                            restored_attention.astype(np.float32), gap.astype(np.float32))