"""Linear attention, its recurrent (RNN) form, and flow attention, beside softmax attention on the same Q, K, V.

Softmax attention (Vaswani et al. 2017) builds the N × N matrix before it multiplies V:

    Y = softmax(Q Kᵀ / √d_k) V                                                   O(N²) time and memory

Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs", eq. 4–6) swaps the exponential kernel for a
feature map φ(x) = elu(x) + 1 and uses associativity, so no N × N matrix is ever formed:

    Y_i = φ(q_i)ᵀ (Σ_j φ(k_j) v_jᵀ) / φ(q_i)ᵀ (Σ_j φ(k_j))                        O(N) time and memory

Its implicit attention matrix is A_ij = φ(q_i)·φ(k_j) / Σ_j' φ(q_i)·φ(k_j'). Causal (j ≤ i), the two sums become
running sums (eq. 16–20): S_i = S_{i−1} + φ(k_i) v_iᵀ, z_i = z_{i−1} + φ(k_i), Y_i = φ(q_i)ᵀ S_i / φ(q_i)ᵀ z_i —
an RNN whose state is the d_k × d_v matrix S and the d_k vector z.

Flow attention (Wu et al. 2022, "Flowformer", §3.2, eq. 5–9) reads attention as a flow network from sources
(keys/values) to sinks (queries) with φ = sigmoid:

    incoming  I_i = φ(q_i)·Σ_j φ(k_j)                 outgoing  O_j = φ(k_j)·Σ_i φ(q_i)
    conserved Î_i = φ(q_i)·Σ_j φ(k_j) / O_j            conserved Ô_j = φ(k_j)·Σ_i φ(q_i) / I_i
    competition V̂ = softmax_j(Ô) ⊙ V  (× n, so the mean weight stays 1, as the authors' code scales it)
    allocation  Y = sigmoid(Î · n/m) ⊙ (φ(Q) / I)(φ(K)ᵀ V̂)

Every function here is float64 numpy and computes the linear forms in their linear order (sums first); the implicit
matrices are built separately, for drawing, and the tests compare the two.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np


def elu_plus_one(x: np.ndarray) -> np.ndarray:
    """φ(x) = elu(x) + 1: x + 1 for x > 0, eˣ otherwise; always positive, so every implicit weight is ≥ 0."""
    x = np.asarray(x, dtype=np.float64)
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


def _check(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    if q.ndim != 2 or k.ndim != 2 or v.ndim != 2:
        raise ValueError(f"Q, K, V must be 2-D (tokens, features); got {q.shape}, {k.shape}, {v.shape}")
    if q.shape[1] != k.shape[1] or k.shape[0] != v.shape[0]:
        raise ValueError(f"Q {q.shape}, K {k.shape} and V {v.shape} do not fit together")


def softmax_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float | None = None,
                      causal: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Softmax attention: weights ``(N, M)`` (rows sum to 1) and output ``(N, d_v)``; ``scale`` default 1/√d_k."""
    _check(q, k, v)
    scale = 1.0 / np.sqrt(q.shape[1]) if scale is None else scale
    scores = (q @ k.T) * scale  # (N, M)
    if causal:
        scores = np.where(np.tril(np.ones(scores.shape, dtype=bool)), scores, -np.inf)
    scores = scores - scores.max(axis=1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=1, keepdims=True)
    return weights, weights @ v


def linear_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Non-causal linear attention in its linear order: φ(Q)(φ(K)ᵀ V) / φ(Q)(φ(K)ᵀ 1) — ``(N, d_v)``, never N × N."""
    _check(q, k, v)
    phi_q, phi_k = elu_plus_one(q), elu_plus_one(k)  # (N, d_k), (M, d_k)
    kv = phi_k.T @ v  # (d_k, d_v): the whole sequence summarised once
    normaliser = phi_q @ phi_k.sum(axis=0)  # (N,)
    return (phi_q @ kv) / normaliser[:, None]


def linear_attention_matrix(q: np.ndarray, k: np.ndarray, causal: bool = False) -> np.ndarray:
    """The implicit attention matrix of linear attention, ``(N, M)``: φ(q_i)·φ(k_j) normalised per row (causal:
    j ≤ i only). Built only to draw it; ``linear_attention`` never forms it."""
    similarity = elu_plus_one(q) @ elu_plus_one(k).T  # (N, M), all > 0
    if causal:
        similarity = np.tril(similarity)
    return similarity / similarity.sum(axis=1, keepdims=True)


@dataclass(frozen=True)
class RecurrentTrace:
    """Causal linear attention run as an RNN, every step kept: ``states`` ``(N, d_k, d_v)`` (S_i after token i),
    ``normalisers`` ``(N, d_k)`` (z_i), ``outputs`` ``(N, d_v)`` (Y_i)."""

    states: np.ndarray
    normalisers: np.ndarray
    outputs: np.ndarray


def causal_linear_recurrent(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> RecurrentTrace:
    """Causal linear attention one token at a time (Katharopoulos et al. eq. 18–20): the state S and z grow by
    φ(k_i) v_iᵀ and φ(k_i); the output reads them with φ(q_i). Constant memory per step, whatever the length."""
    _check(q, k, v)
    if q.shape[0] != k.shape[0]:
        raise ValueError("causal attention needs as many queries as keys")
    phi_q, phi_k = elu_plus_one(q), elu_plus_one(k)
    n, d_k = phi_q.shape
    state, z = np.zeros((d_k, v.shape[1])), np.zeros(d_k)
    states, normalisers, outputs = [], [], []
    for i in range(n):
        state = state + np.outer(phi_k[i], v[i])  # S_i = S_{i−1} + φ(k_i) v_iᵀ
        z = z + phi_k[i]  # z_i = z_{i−1} + φ(k_i)
        outputs.append(phi_q[i] @ state / (phi_q[i] @ z))
        states.append(state)
        normalisers.append(z)
    return RecurrentTrace(np.stack(states), np.stack(normalisers), np.stack(outputs))


@dataclass(frozen=True)
class FlowTrace:
    """Flow attention's intermediates (Flowformer §3.2), each per token: ``incoming`` I ``(N,)``, ``outgoing`` O
    ``(M,)``, ``conserved_incoming`` Î ``(N,)``, ``conserved_outgoing`` Ô ``(M,)``, ``competition`` softmax(Ô)·M
    ``(M,)``, ``allocation`` sigmoid(Î·N/M) ``(N,)``, and the ``output`` ``(N, d_v)``."""

    incoming: np.ndarray
    outgoing: np.ndarray
    conserved_incoming: np.ndarray
    conserved_outgoing: np.ndarray
    competition: np.ndarray
    allocation: np.ndarray
    output: np.ndarray

    def matrix(self, q: np.ndarray, k: np.ndarray) -> np.ndarray:
        """The implicit matrix ``(N, M)``: Y = matrix @ V. Row i: allocation_i · φ(q_i)·φ(k_j) / I_i ·
        competition_j. Rows do not sum to 1: the allocation gate and the competition move weight between tokens."""
        similarity = sigmoid(q) @ sigmoid(k).T  # (N, M)
        return (self.allocation / self.incoming)[:, None] * similarity * self.competition[None, :]


def flow_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> FlowTrace:
    """Non-causal flow attention in its linear order (no N × M matrix): every flow is a sum over one side first."""
    _check(q, k, v)
    phi_q, phi_k = sigmoid(q), sigmoid(k)  # (N, d_k), (M, d_k)
    n, m = phi_q.shape[0], phi_k.shape[0]
    incoming = phi_q @ phi_k.sum(axis=0)  # I (N,)
    outgoing = phi_k @ phi_q.sum(axis=0)  # O (M,)
    conserved_incoming = phi_q @ (phi_k / outgoing[:, None]).sum(axis=0)  # Î (N,): sources fixed to outflow 1
    conserved_outgoing = phi_k @ (phi_q / incoming[:, None]).sum(axis=0)  # Ô (M,): sinks fixed to inflow 1
    competition = np.exp(conserved_outgoing - conserved_outgoing.max())
    competition = competition / competition.sum() * m  # softmax over the sources, mean 1
    allocation = sigmoid(conserved_incoming * n / m)
    kv = phi_k.T @ (v * competition[:, None])  # (d_k, d_v)
    output = allocation[:, None] * (phi_q / incoming[:, None]) @ kv
    return FlowTrace(incoming, outgoing, conserved_incoming, conserved_outgoing, competition, allocation, output)


@dataclass(frozen=True)
class Comparison:
    """Softmax, linear and flow attention on one head's Q, K, V: each implicit matrix ``(N, N)`` and output
    ``(N, d_v)``; ``difference_*`` the per-token L2 distance of an output from softmax's, ``(N,)``."""

    softmax_matrix: np.ndarray
    linear_matrix: np.ndarray
    flow_matrix: np.ndarray
    softmax_output: np.ndarray
    linear_output: np.ndarray
    flow_output: np.ndarray
    flow: FlowTrace

    @property
    def difference_linear(self) -> np.ndarray:
        return np.linalg.norm(self.linear_output - self.softmax_output, axis=1)

    @property
    def difference_flow(self) -> np.ndarray:
        return np.linalg.norm(self.flow_output - self.softmax_output, axis=1)


def compare(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float | None = None) -> Comparison:
    """Softmax (scaled by ``scale``, default 1/√d_k), linear and flow attention on the same ``q``, ``k``, ``v``."""
    weights, softmax_output = softmax_attention(q, k, v, scale)
    flow = flow_attention(q, k, v)
    return Comparison(weights, linear_attention_matrix(q, k), flow.matrix(q, k), softmax_output,
                      linear_attention(q, k, v), flow.output, flow)


MEASURED = Path(__file__).resolve().parents[2] / "sample_data" / "measured" / "linear_attention.json"


def measured_cost(path: Path = MEASURED) -> dict:
    """The shipped measurement of softmax vs linear attention against N (``bench/case_linear_attention.py``):
    ``{"command", "settings", "machine", "rows": [{"method", "tokens", "seconds", "peak_bytes"}, ...]}``."""
    if not path.exists():
        raise ValueError(f"no measurement at {path}; run: python -m bench.case_linear_attention")
    return json.loads(path.read_text())


def toy_layer(loaded, result, options):
    """The mechanics page's toy layer (``mechanics.sentence_layer``: the options' sentence, embeddings, sizes; no
    mask), whose head ``options.head`` feeds the linear-attention views: the analysis the app and the CLI run for
    them (``loaded`` and ``result`` are unused)."""
    from models.lessons import mechanics

    config = mechanics.LayerConfig(options.d_model, options.heads, options.d_head, True, options.seed)
    return mechanics.sentence_layer(options.sentence, config, options.source, "none")
