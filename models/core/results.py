"""The one result contract every model family returns (DESIGN.md, "One result contract").

Views only ever see these objects, never the library that produced the numbers:

- ``RunResult.attention`` maps a kind (``self``, ``encoder``, ``decoder``, ``cross``) to an ``AttentionMaps``;
  ``AttentionMaps.layer(i)`` is a float32 array ``(heads, queries, keys)`` whose rows sum to 1 and whose masked
  entries are exactly 0. ``heads_in(i)`` and ``tokens_in(i)`` say what that layer's shape means; in every family but
  Swin (whose stages differ in tokens and heads) they are the same for all layers (``uniform``).
- Attention is memory-aware: holding every layer's ``(heads, N, N)`` is what makes long inputs impossible, so
  ``RecomputedAttention`` keeps each layer's post-projection (post-RoPE) queries and keys and recomputes a layer's
  weights when a view asks for it; ``StoredAttention`` keeps small maps as they were captured (ViT at 197 tokens).
- Each family's result is a frozen subclass of ``RunResult`` whose every other field is named and typed
  (``TextResult.next_token``, ``ImageResult.predictions``, ...); no dict of string keys.
- Results are immutable and hold no caches: arrays are handed out read-only, and whatever is worth keeping between
  reruns (a recomputed layer, an overview image) is kept by the app's cache layer (app/resources.py), keyed by
  ``run_id``. Everything here is plain numpy, so results are safe to share between threads and sessions.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Iterator, Mapping

import numpy as np

ATTENTION_KINDS = ("self", "encoder", "decoder", "cross")


@dataclass(frozen=True)
class ModelInfo:
    """Who produced the numbers: shown on every page so an audience is never misled."""

    key: str  # registry key or the id/folder the user typed
    family: str  # "causal_lm", "encoder", "translation", "vit", "swin", "moe"
    source: str  # "hub", "package", "mini", "local"
    device: str  # "cpu", "cuda:0", "mps"
    dtype: str  # "float32", "float16", "bfloat16"
    capture: str  # how the attention weights were obtained, e.g. "attention-interface (q/k recomputed)"
    licence: str = ""
    trained_on: str = ""

    @property
    def short_name(self) -> str:
        """The key, or a local folder's last part: what names the model in file names and titles."""
        return self.key.rstrip("/").rsplit("/", 1)[-1] if self.source == "local" else self.key


class AttentionMaps:
    """All layers of one kind of attention for one input.

    Subclasses implement ``_compute(layer)`` (and may compute one head alone in ``head``); nothing is cached here.
    ``num_layers``, ``heads_in`` and ``tokens_in`` are known without computing anything.
    """

    kind: str
    query_tokens: list[str]
    key_tokens: list[str]
    num_layers: int
    num_heads: int  # the same for every layer when ``uniform``

    uniform = True  # every layer has the same heads and tokens (False: Swin, whose stages differ)

    def heads_in(self, layer: int) -> int:
        """Heads of ``layer``."""
        self._check_layer(layer)
        return self.num_heads

    def tokens_in(self, layer: int) -> tuple[list[str], list[str]]:
        """(query tokens, key tokens) of ``layer``: the labels of its rows and columns."""
        self._check_layer(layer)
        return self.query_tokens, self.key_tokens

    def _check_layer(self, layer: int) -> None:
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer {layer} does not exist: this model has layers 0..{self.num_layers - 1}")

    def _check_head(self, layer: int, head: int) -> None:
        heads = self.heads_in(layer)
        if not 0 <= head < heads:
            raise ValueError(f"head {head} does not exist: this layer has heads 0..{heads - 1}")

    def _compute(self, layer: int) -> np.ndarray:
        raise NotImplementedError

    def layer(self, layer: int) -> np.ndarray:
        """Attention probabilities of one layer, float32 ``(heads, queries, keys)``, read-only."""
        self._check_layer(layer)
        weights = self._compute(layer)
        weights.setflags(write=False)
        return weights

    def iter_heads(self, layer: int) -> Iterator[tuple[int, np.ndarray]]:
        """``(head, (queries, keys) map)`` for each head of ``layer``; subclasses may compute one head at a time so
        that a pass over every head (the all-heads summary) never holds a whole layer."""
        weights = self.layer(layer)
        for head in range(weights.shape[0]):
            yield head, weights[head]

    def head(self, layer: int, head: int | None) -> np.ndarray:
        """One head ``(queries, keys)``, or the mean over heads when ``head`` is None."""
        if head is not None:
            self._check_head(layer, head)
        weights = self.layer(layer)
        return weights.mean(axis=0) if head is None else weights[head]

    def allowed(self, layer: int) -> np.ndarray:
        """Boolean ``(queries, keys)``: True where the model let a query see a key (False = masked)."""
        raise NotImplementedError


@dataclass(frozen=True, eq=False)
class StoredAttention(AttentionMaps):
    """Maps captured whole, for small token counts: ``layers[i]`` is ``(heads, q, k)`` float32."""

    kind: str
    query_tokens: list[str]
    key_tokens: list[str]
    layers: list[np.ndarray]
    allowed_mask: np.ndarray | None = None  # (q, k) bool; None = every key visible

    def __post_init__(self):
        for weights in self.layers:  # shared by every session that reads this result: nobody edits it in place
            weights.setflags(write=False)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_heads(self) -> int:
        return int(self.layers[0].shape[0]) if self.layers else 0

    def _compute(self, layer: int) -> np.ndarray:
        return np.asarray(self.layers[layer], dtype=np.float32)

    def allowed(self, layer: int) -> np.ndarray:
        q, k = self.layers[layer].shape[1:]
        return np.ones((q, k), dtype=bool) if self.allowed_mask is None else self.allowed_mask


@dataclass(frozen=True, eq=False)
class RecomputedAttention(AttentionMaps):
    """Queries and keys kept per layer; weights = softmax(q kᵀ · scaling + mask) recomputed on demand.

    ``queries[i]``: ``(heads, q, d)``; ``keys[i]``: ``(kv_heads, k, d)`` with ``heads % kv_heads == 0`` (grouped-query
    attention repeats each key head ``heads // kv_heads`` times, as the model does); float32, or float16 beyond
    ``capture.HALF_PRECISION_TOKENS`` keys (the weights are recomputed in float32 either way). ``allowed_masks[mask_index[i]]`` is
    the boolean ``(q, k)`` mask the layer applied (layers usually share one). ``biases``, when present, hold an additive
    score bias per layer ``(heads, q, k)`` (e.g. ALiBi, T5 relative position) that the model added before softmax.
    """

    kind: str
    query_tokens: list[str]
    key_tokens: list[str]
    queries: list[np.ndarray]
    keys: list[np.ndarray]
    scalings: list[float]
    allowed_masks: list[np.ndarray]
    mask_index: list[int]
    biases: list[np.ndarray | None] = field(default_factory=list)

    @property
    def num_layers(self) -> int:
        return len(self.queries)

    @property
    def num_heads(self) -> int:
        return int(self.queries[0].shape[0]) if self.queries else 0

    @property
    def num_kv_heads(self) -> int:
        """Key/value heads (fewer than ``num_heads`` under grouped-query attention)."""
        return int(self.keys[0].shape[0]) if self.keys else 0

    def allowed(self, layer: int) -> np.ndarray:
        mask = self.allowed_masks[self.mask_index[layer]]
        return mask.array() if isinstance(mask, CausalMask) else mask

    def _bias(self, layer: int) -> np.ndarray | None:
        return self.biases[layer] if layer < len(self.biases) else None

    def _compute(self, layer: int) -> np.ndarray:
        return attention_probabilities(self.queries[layer], self.keys[layer], self.scalings[layer],
                                       self.allowed(layer), self._bias(layer))

    def _compute_head(self, layer: int, head: int) -> np.ndarray:
        """One head ``(q, k)`` without computing the others: the key head it shares under GQA, its bias slice."""
        group = self.num_heads // self.keys[layer].shape[0]
        bias = self._bias(layer)
        weights = attention_probabilities(self.queries[layer][head:head + 1], self.keys[layer][head // group:][:1],
                                          self.scalings[layer], self.allowed(layer),
                                          None if bias is None else bias[head:head + 1])[0]
        weights.setflags(write=False)
        return weights

    def head(self, layer: int, head: int | None) -> np.ndarray:
        """One head ``(queries, keys)`` recomputed alone (a layer is ``heads`` times larger), or the head mean
        accumulated head by head (the peak is two maps, not a whole layer)."""
        self._check_layer(layer)
        if head is not None:
            self._check_head(layer, head)
            return self._compute_head(layer, head)
        total = np.zeros((len(self.query_tokens), len(self.key_tokens)), dtype=np.float32)
        for _, weights in self.iter_heads(layer):
            total += weights
        return total / np.float32(self.num_heads)

    def iter_heads(self, layer: int) -> Iterator[tuple[int, np.ndarray]]:
        self._check_layer(layer)
        for head in range(self.num_heads):
            yield head, self._compute_head(layer, head)

    def nbytes(self) -> int:
        """Bytes held (queries, keys, masks, biases): what this result costs in memory."""
        total = sum(a.nbytes for a in self.queries) + sum(a.nbytes for a in self.keys)
        total += sum(a.nbytes for a in self.allowed_masks)
        return total + sum(b.nbytes for b in self.biases if b is not None)

    def head_peak_bytes(self) -> int:
        """Bound on the bytes one head's recompute allocates (``head``/``iter_heads``): the float32 result (the
        scores are computed in place in it), the boolean blocked mask, room for one more float32 ``(q, k)`` temporary,
        row vectors and a float32 copy of q and k: ``q · k · (4 + 1 + 4) + 4 · (q + k) · (d + 4)``."""
        n_q, n_k = len(self.query_tokens), len(self.key_tokens)
        d = self.queries[0].shape[-1] if self.queries else 0
        return n_q * n_k * 9 + 4 * (n_q + n_k) * (d + 4)


@dataclass(frozen=True)
class CausalMask:
    """The plain causal mask of a long input, kept as its shape: query ``i`` sees keys ``0..i`` (and none at or past
    ``queries``), as SDPA's ``is_causal`` applies it. At 8,192 tokens the boolean array is 64 MB that every layer
    shares; it is built only while a view recomputes a head (``RecomputedAttention.allowed``)."""

    queries: int
    keys: int
    nbytes = 0  # held: nothing but the shape

    @property
    def shape(self) -> tuple[int, int]:
        return self.queries, self.keys

    def array(self) -> np.ndarray:
        """The boolean ``(queries, keys)`` mask, True = visible."""
        allowed = np.tri(self.queries, self.keys, dtype=bool)
        allowed[:, self.queries:] = False
        return allowed


def attention_probabilities(
    query: np.ndarray, key: np.ndarray, scaling: float, allowed: np.ndarray, bias: np.ndarray | None = None
) -> np.ndarray:
    """softmax(q kᵀ · scaling + bias, masked) in float32, head by head to bound peak memory.

    query ``(H, q, d)``, key ``(H_kv, k, d)``, allowed ``(q, k)`` bool -> ``(H, q, k)``; masked entries are exactly 0
    and a query that may see no key at all (a padding position) gets an all-zero row.
    """
    heads, kv_heads = query.shape[0], key.shape[0]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads cannot share {kv_heads} key heads")
    group = heads // kv_heads
    out = np.empty((heads, query.shape[1], key.shape[1]), dtype=np.float32)
    blocked = ~allowed
    any_allowed = allowed.any(axis=-1, keepdims=True)
    scale = np.float32(scaling)
    for h in range(heads):
        scores = out[h]  # computed in place in the output: one (q, k) float32 buffer per head, no temporaries
        np.matmul(query[h].astype(np.float32, copy=False), key[h // group].astype(np.float32, copy=False).T,
                  out=scores)
        scores *= scale
        if bias is not None:
            scores += bias[h]
        np.putmask(scores, blocked, -np.inf)
        scores -= np.where(any_allowed, scores.max(axis=-1, keepdims=True), np.float32(0))
        np.exp(scores, out=scores)
        total = scores.sum(axis=-1, keepdims=True)
        np.divide(scores, np.where(total > 0, total, np.float32(1)), out=scores)  # an all-masked row stays 0
    return out


@dataclass(frozen=True)
class TokenProbability:
    token: str
    token_id: int
    probability: float


# How every page steps through generated tokens (GPT, translation, speech), said on each page under the step view
STEP_CONVENTION = ("Step t shows the attention of the position that chose token t (the position whose input was the "
                   "token before it, so token t itself is not yet among what it sees), beside the distribution it "
                   "chose from.")


@dataclass(frozen=True)
class GenerationStep:
    """One generated token with the candidates it was chosen from."""

    position: int  # index of the generated token in the result's tokens (translation: its output step)
    token: str
    probability: float
    candidates: tuple[TokenProbability, ...]
    # the attention row whose distribution chose this token (STEP_CONVENTION): in a causal LM the position before
    # it, ``position - 1``; in an encoder–decoder the row of output step ``position``, the decoder position whose
    # input was the previous token
    query: int


@dataclass(frozen=True)
class ImageInfo:
    """What the image model saw: the preprocessed crop (uint8 RGB ``(H, W, 3)``) and its patch layout."""

    image: np.ndarray
    patch_grid: tuple[int, int]  # (rows, cols) of patch tokens
    patch_size: tuple[int, int]  # pixels (height, width) of one patch in ``image``
    num_prefix_tokens: int  # CLS + registers (+ distillation token) before the patch tokens
    prefix_names: tuple[str, ...] = ("[CLS]",)


def _new_run_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """Everything one run of one model on one input produced: the part every family shares.

    ``run_id`` names this run for the app's caches (a recomputed layer is kept under it), so that nothing has to be
    stored on the result itself.
    """

    model: ModelInfo
    tokens: list[str]  # the input as the model tokenised it (for images: prefix names + patch labels)
    attention: Mapping[str, AttentionMaps]
    input_name: str = ""  # what names the input in file names: the text's start, "sample cat", "upload"
    notices: tuple[str, ...] = ()  # e.g. "input truncated to 512 tokens"
    run_id: str = field(default_factory=_new_run_id, compare=False)

    def maps(self, kind: str = "") -> AttentionMaps:
        """The maps of one kind; ``""`` = the first kind this result has (``self``, or ``encoder`` for a translator)."""
        if not kind and self.attention:
            kind = next(iter(self.attention))
        if kind not in self.attention:
            have = ", ".join(self.attention) or "none"
            raise ValueError(f"this model has no {kind!r} attention (it has: {have})")
        return self.attention[kind]


@dataclass(frozen=True, kw_only=True)
class TextResult(RunResult):
    """A language model or an encoder on one text (``models/families/causal_lm/model.py``, ``models/families/encoder/model.py``)."""

    next_token: tuple[TokenProbability, ...] = ()  # top candidates after the last position (causal LMs)
    generation: tuple[GenerationStep, ...] = ()  # generated tokens, when the run generated
    prompt_length: int = 0  # tokens of the prompt; generated tokens follow it in ``tokens``
    generated_text: str = ""
    special_positions: tuple[int, ...] = ()  # [CLS], [SEP], BOS/EOS: positions of special tokens
    # the residual stream of a causal LM's prompt run, float32 (layers + 1, tokens, d_model): after the embeddings,
    # after each block, the last entry with the final norm already applied (as transformers returns it); None when
    # not kept (generation runs, encoders)
    residual: np.ndarray | None = field(default=None, repr=False, compare=False)
    # the first position ``residual`` holds: 0 when it holds every token; beyond ``causal_lm.RESIDUAL_FULL_TOKENS``
    # tokens only the last ``causal_lm.RESIDUAL_WINDOW`` positions are kept and the lens re-runs other windows
    residual_start: int = 0
    token_ids: tuple[int, ...] = ()  # the prompt's ids as the model saw them (causal LM prompt runs), for re-runs

    def __post_init__(self):
        if self.residual is not None:
            self.residual.setflags(write=False)  # shared by every session that reads this result


@dataclass(frozen=True, kw_only=True)
class ImageResult(RunResult):
    """An image model on one image: the crop it saw and its patch layout, and its top classes if it has a head."""

    image: ImageInfo
    predictions: tuple[TokenProbability, ...] = ()  # top classes, best first; () for a backbone
