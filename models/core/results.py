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
- At any length the maps answer reductions (``tiles``: an overview image, a zoom level, thumbnails; ``window``: exact
  cells; ``row``: one query's weights) that ``RecomputedAttention`` computes where its q and k live, on the model's
  device, without ever building a ``(queries, keys)`` map (``models/core/tiles.py``); masks are described
  (``DescribedMask``), position biases that depend on ``j − i`` kept as one vector per head (``RelativeBias``).
- Results are immutable and hold no caches: arrays are handed out read-only, and whatever is worth keeping between
  reruns (a recomputed layer, an overview image) is kept by the app's cache layer (app/resources.py), keyed by
  ``run_id``. Nothing here is written after construction, so results are safe to share between threads and
  sessions; ``held_bytes`` says what one costs, by device.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from typing import Iterator, Mapping

import numpy as np
import torch

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

    Besides whole maps (``layer``, ``head``: small inputs), every subclass answers the reductions a view of a long
    input asks for: ``tiles`` (a window reduced to tiles: the overview image, a zoom level, a thumbnail), ``window``
    (exact cells), ``row`` (one query's weights) and their masks. Here they are read off the whole map; a subclass
    that keeps q and k (``RecomputedAttention``) computes them where q and k live without ever building it.
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

    def layer_number(self, layer: int) -> int:
        """The model's own number of map ``layer`` (a hybrid's attention layers sit between others)."""
        self._check_layer(layer)
        numbers = getattr(self, "layer_numbers", ())
        return int(numbers[layer]) if numbers else layer

    def layer_window(self, layer: int) -> int:
        """The sliding window map ``layer`` attends within, as the model declared it (0: none). A label: the mask
        (``allowed``) is what was applied, and below the window's width a local layer's mask is plainly causal."""
        self._check_layer(layer)
        windows = getattr(self, "windows", ())
        return int(windows[layer]) if windows else 0

    def layer_label(self, layer: int) -> str:
        """"layer 4 (local, 512)" / "layer 5 (global)" where some layers attend within a sliding window and others
        do not (Gemma 3), "layer 4 (window 4096)" where all do (Mistral), else "layer 4"; under the model's own
        layer number."""
        number, window = self.layer_number(layer), self.layer_window(layer)
        windows = getattr(self, "windows", ())
        if not windows:
            return f"layer {number}"
        if all(windows):
            return f"layer {number} (window {window})"
        return f"layer {number} (local, {window})" if window else f"layer {number} (global)"

    @property
    def has_sinks(self) -> bool:
        """Whether a learned sink takes a share of some rows (then rows sum to one minus it)."""
        return False

    def sink_share(self, layer: int, head: int | None) -> np.ndarray | None:
        """``(queries,)`` float32: each row's share that went to the head's sink (the head mean for None), or None
        when the layer has no sink."""
        return None

    def held_bytes(self) -> dict[str, int]:
        """Bytes these maps hold, by the device they are on (``{"cpu": …, "cuda:0": …}``): what a cache pays."""
        return {}

    # --- reductions (any length) ----------------------------------------------------------------------------------

    def _span(self, layer: int, queries: tuple[int, int] | None, keys: tuple[int, int] | None):
        """Half-open (first, stop) ranges, checked against the layer's tokens (default: everything)."""
        query_tokens, key_tokens = self.tokens_in(layer)
        queries = (0, len(query_tokens)) if queries is None else (int(queries[0]), int(queries[1]))
        keys = (0, len(key_tokens)) if keys is None else (int(keys[0]), int(keys[1]))
        if not (0 <= queries[0] < queries[1] <= len(query_tokens) and 0 <= keys[0] < keys[1] <= len(key_tokens)):
            raise ValueError(f"the region queries {queries[0]}–{queries[1] - 1}, keys {keys[0]}–{keys[1] - 1} is "
                             f"outside the {len(query_tokens)} × {len(key_tokens)} map")
        return queries, keys

    def tiles(self, layer: int, head: int | None, queries: tuple[int, int] | None = None,
              keys: tuple[int, int] | None = None, tile: int | tuple[int, int] = 1) -> "Tiles":
        """The window ``queries × keys`` (half-open (first, stop) token ranges; default all) of one head (None: the
        head mean) cut into tiles of ``tile`` (one side, or (query side, key side)) positions, each reduced to its
        largest weight, its mean and whether any cell is visible (``Tiles``)."""
        queries, keys = self._span(layer, queries, keys)
        tile_q, tile_k = (tile, tile) if isinstance(tile, int) else tile
        query_edges = np.asarray(_edges(*queries, tile_q))
        key_edges = np.asarray(_edges(*keys, tile_k))
        weights = self.window(layer, head, queries, keys)
        allowed = self.window_allowed(layer, queries, keys)
        return Tiles.of(weights, allowed, query_edges, key_edges)

    def window(self, layer: int, head: int | None, queries: tuple[int, int], keys: tuple[int, int]) -> np.ndarray:
        """Exact weights ``(r, c)`` float32 of one head (None: the head mean) on ``queries × keys`` (half-open)."""
        queries, keys = self._span(layer, queries, keys)
        return np.asarray(self.head(layer, head)[queries[0]:queries[1], keys[0]:keys[1]], dtype=np.float32)

    def window_allowed(self, layer: int, queries: tuple[int, int], keys: tuple[int, int]) -> np.ndarray:
        """The mask ``(r, c)`` bool of ``queries × keys``: True where the query may see the key."""
        queries, keys = self._span(layer, queries, keys)
        return np.asarray(self.allowed(layer)[queries[0]:queries[1], keys[0]:keys[1]], dtype=bool)

    def row(self, layer: int, head: int | None, query: int) -> np.ndarray:
        """Query ``query``'s exact weights over every key ``(keys,)`` float32 (head None: the head mean)."""
        query_tokens, key_tokens = self.tokens_in(layer)
        if not 0 <= query < len(query_tokens):
            raise ValueError(f"query {query} does not exist: the input has {len(query_tokens)} tokens")
        return self.window(layer, head, (query, query + 1), (0, len(key_tokens)))[0]

    def row_allowed(self, layer: int, query: int) -> np.ndarray:
        """Which keys query ``query`` may see ``(keys,)`` bool."""
        return self.window_allowed(layer, (query, query + 1), (0, len(self.tokens_in(layer)[1])))[0]


def _edges(start: int, stop: int, size: int) -> list[int]:
    return list(range(start, stop, max(1, size))) + [stop]


@dataclass(frozen=True)
class Tiles:
    """One head's map over a window, reduced to tiles: what an overview image, a zoom level or a thumbnail draws.

    Tile ``(a, b)`` covers queries ``query_edges[a]:query_edges[a + 1]`` and keys ``key_edges[b]:key_edges[b + 1]``
    (token positions). ``maximum``: its largest weight (a lone strong cell stays visible); ``mean``: the mean of its
    cells, masked cells counting 0 (a block mean of the matrix); ``visible``: whether any cell of it may be seen
    (False tiles are drawn as masked). ``row_max (rows,)``: each query's largest weight among the window's keys.
    All float32 / bool numpy arrays, ``(TQ, TK)``.
    """

    query_edges: np.ndarray
    key_edges: np.ndarray
    maximum: np.ndarray
    mean: np.ndarray
    visible: np.ndarray
    row_max: np.ndarray

    def __post_init__(self):
        for array in (self.query_edges, self.key_edges, self.maximum, self.mean, self.visible, self.row_max):
            array.setflags(write=False)

    @property
    def shape(self) -> tuple[int, int]:
        return self.maximum.shape

    @property
    def queries(self) -> tuple[int, int]:
        return int(self.query_edges[0]), int(self.query_edges[-1])

    @property
    def keys(self) -> tuple[int, int]:
        return int(self.key_edges[0]), int(self.key_edges[-1])

    @property
    def tile(self) -> tuple[int, int]:
        """Positions a side of a whole tile (the last ones may be smaller)."""
        return int(self.query_edges[1] - self.query_edges[0]), int(self.key_edges[1] - self.key_edges[0])

    def statistic(self, name: str) -> np.ndarray:
        if name not in ("maximum", "mean"):
            raise ValueError(f"unknown tile statistic {name!r}; choose maximum or mean")
        return self.maximum if name == "maximum" else self.mean

    @staticmethod
    def of(weights: np.ndarray, allowed: np.ndarray, query_edges: np.ndarray, key_edges: np.ndarray) -> "Tiles":
        """Tiles of a dense window ``weights (r, c)`` whose first cell is at ``(query_edges[0], key_edges[0])``."""
        rows, cols = query_edges[:-1] - query_edges[0], key_edges[:-1] - key_edges[0]
        shown = np.where(allowed, weights, 0).astype(np.float32)
        maximum = np.maximum.reduceat(np.maximum.reduceat(shown, cols, axis=1), rows, axis=0)
        total = np.add.reduceat(np.add.reduceat(shown, cols, axis=1), rows, axis=0)
        seen = np.add.reduceat(np.add.reduceat(allowed.astype(np.int64), cols, axis=1), rows, axis=0) > 0
        cells = np.diff(query_edges)[:, None] * np.diff(key_edges)[None, :]
        return Tiles(np.asarray(query_edges), np.asarray(key_edges), maximum.astype(np.float32),
                     (total / cells).astype(np.float32), seen, shown.max(axis=1).astype(np.float32))


def _held(arrays, totals: dict[str, int] | None = None) -> dict[str, int]:
    """Bytes of numpy arrays and torch tensors by device (``"cpu"`` for numpy)."""
    totals = {} if totals is None else totals
    for array in arrays:
        if array is None or isinstance(array, DescribedMask):
            continue
        if isinstance(array, RelativeBias):
            array = array.values
        device = str(array.device) if isinstance(array, torch.Tensor) else "cpu"
        nbytes = array.numel() * array.element_size() if isinstance(array, torch.Tensor) else array.nbytes
        totals[device] = totals.get(device, 0) + int(nbytes)
    return totals


def _host_array(array) -> np.ndarray:
    """A numpy float32 view/copy of a numpy array or of a tensor on any device."""
    if isinstance(array, torch.Tensor):
        return array.detach().float().cpu().numpy()
    return np.asarray(array, dtype=np.float32)


@dataclass(frozen=True, eq=False)
class StoredAttention(AttentionMaps):
    """Maps captured whole, for small token counts: ``layers[i]`` is ``(heads, q, k)``, float32 numpy, or a tensor
    left on the device the model ran on (copied to the host a layer at a time, when a view asks for it)."""

    kind: str
    query_tokens: list[str]
    key_tokens: list[str]
    layers: list
    allowed_mask: np.ndarray | None = None  # (q, k) bool; None = every key visible
    layer_numbers: tuple = ()  # the model's own number of each map (default 0, 1, ...)
    sink_shares: list = field(default_factory=list)  # per layer: None or (heads, q) float32

    def __post_init__(self):
        for weights in self.layers:  # shared by every session that reads this result: nobody edits it in place
            if isinstance(weights, np.ndarray):
                weights.setflags(write=False)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_heads(self) -> int:
        return int(self.layers[0].shape[0]) if self.layers else 0

    def _compute(self, layer: int) -> np.ndarray:
        return _host_array(self.layers[layer])

    def allowed(self, layer: int) -> np.ndarray:
        q, k = self.layers[layer].shape[1:]
        return np.ones((q, k), dtype=bool) if self.allowed_mask is None else self.allowed_mask

    @property
    def has_sinks(self) -> bool:
        return any(shares is not None for shares in self.sink_shares)

    def sink_share(self, layer: int, head: int | None) -> np.ndarray | None:
        self._check_layer(layer)
        shares = self.sink_shares[layer] if layer < len(self.sink_shares) else None
        if shares is None:
            return None
        shares = _host_array(shares)
        return shares.mean(0) if head is None else shares[head]

    def held_bytes(self) -> dict[str, int]:
        return _held([*self.layers, self.allowed_mask])


@dataclass(frozen=True)
class RelativeBias:
    """A position bias that depends on ``j − i`` only (T5's relative buckets, ALiBi), kept as one vector per head:
    ``values (heads or 1, queries + keys − 1)``, the bias of key ``j`` for query ``i`` at ``j − i + queries − 1``."""

    values: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.values.numel() * self.values.element_size()

    def dense(self, queries: int, keys: int) -> np.ndarray:
        """``(heads or 1, queries, keys)`` float32 (small inputs)."""
        index = np.arange(keys)[None, :] - np.arange(queries)[:, None] + queries - 1
        return _host_array(self.values)[:, index]


@dataclass(frozen=True, eq=False)
class RecomputedAttention(AttentionMaps):
    """Queries and keys kept per layer where the model ran; weights = softmax(q kᵀ · scaling + bias, masked)
    recomputed on demand, whole for small inputs and as reductions at any length (``models/core/tiles.py``).

    ``queries[i]``: ``(heads, q, d)``; ``keys[i]``: ``(kv_heads, k, d)`` with ``heads % kv_heads == 0`` (grouped-query
    attention: key head ``h // (heads / kv_heads)`` serves query head ``h``, as in the model); torch tensors on the
    model's device in the dtype capture kept (numpy arrays are taken as CPU tensors). ``allowed_masks[mask_index[i]]``
    is the mask the layer applied: a ``DescribedMask`` (causal, padding, window: no array) or a boolean ``(q, k)``
    array (layers usually share one). ``biases``, when present, hold per layer an additive score bias the model
    added before softmax: a ``RelativeBias`` or a ``(heads or 1, q, k)`` array. ``softcaps`` (per layer, 0 = none)
    cap the scaled scores to ``c · tanh(s / c)`` before the bias; ``sinks`` (per layer, None or ``(heads,)``) are
    learned logits in each row's denominator (``models/core/scores.py``). ``layer_numbers``: the model's own number
    of each layer (default 0, 1, ...); ``windows``: each layer's declared sliding window (``layer_window``).
    """

    kind: str
    query_tokens: list[str]
    key_tokens: list[str]
    queries: list
    keys: list
    scalings: list[float]
    allowed_masks: list
    mask_index: list[int]
    biases: list = field(default_factory=list)
    softcaps: list = field(default_factory=list)  # per layer: 0 or None = none
    sinks: list = field(default_factory=list)  # per layer: None or (heads,) float32
    layer_numbers: tuple = ()
    windows: tuple = ()  # per layer: the sliding window the model declared (0: global); () when none did

    def __post_init__(self):
        as_tensor = lambda a: torch.from_numpy(a) if isinstance(a, np.ndarray) else a  # noqa: E731
        object.__setattr__(self, "queries", [as_tensor(q) for q in self.queries])
        object.__setattr__(self, "keys", [as_tensor(k) for k in self.keys])
        object.__setattr__(self, "allowed_masks", [as_tensor(m) for m in self.allowed_masks])
        object.__setattr__(self, "biases", [as_tensor(b) for b in self.biases])
        object.__setattr__(self, "sinks", [None if b is None else as_tensor(b) for b in self.sinks])

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

    @property
    def uniform(self) -> bool:  # a model whose layers differ in heads (Inkling) is drawn layer by layer
        return len({int(q.shape[0]) for q in self.queries}) <= 1

    def heads_in(self, layer: int) -> int:
        self._check_layer(layer)
        return int(self.queries[layer].shape[0])

    @property
    def device(self) -> torch.device:
        return self.queries[0].device if self.queries else torch.device("cpu")

    def _mask(self, layer: int):
        return self.allowed_masks[self.mask_index[layer]]

    def allowed(self, layer: int) -> np.ndarray:
        mask = self._mask(layer)
        if isinstance(mask, DescribedMask):
            return mask.array()
        return mask.cpu().numpy() if isinstance(mask, torch.Tensor) else np.asarray(mask)

    def _bias(self, layer: int):
        return self.biases[layer] if layer < len(self.biases) else None

    def _softcap(self, layer: int) -> float:
        return float(self.softcaps[layer] or 0.0) if layer < len(self.softcaps) else 0.0

    def _sink(self, layer: int):
        return self.sinks[layer] if layer < len(self.sinks) else None

    @property
    def has_sinks(self) -> bool:
        return any(sink is not None for sink in self.sinks)

    def sink_share(self, layer: int, head: int | None) -> np.ndarray | None:
        from models.core import tiles

        heads, average = self._heads(layer, head)
        if self._sink(layer) is None:
            return None
        self._check_fits(self.reduction_peak_bytes(), f"layer {layer}'s sink shares")
        shares = tiles.sink_shares(self.scores(layer), heads)[0]  # (heads, queries)
        shares = shares.mean(0) if average else shares[0]
        return shares.float().cpu().numpy()

    def scores(self, layer: int) -> "tiles.Scores":
        """Layer ``layer`` as the reduction engine takes it (batch of one), where its q and k are."""
        from models.core import tiles

        self._check_layer(layer)
        query, key = self.queries[layer][None], self.keys[layer][None]
        mask, bias = self._mask(layer), self._bias(layer)
        rules = mask.rules() if isinstance(mask, DescribedMask) else {"allowed": mask.to(query.device)[None]}
        if isinstance(bias, RelativeBias):
            rules["relative_bias"] = bias.values.to(query.device)[None]
        elif bias is not None:
            rules["bias"] = bias.to(query.device)[None]
        sink = self._sink(layer)
        return tiles.Scores(query, key, self.scalings[layer], softcap=self._softcap(layer),
                            sink=None if sink is None else sink.to(query.device, torch.float32), **rules)

    # --- whole maps (small inputs; refused with a message when they would not fit) ---------------------------------

    def _compute(self, layer: int) -> np.ndarray:
        heads = self.heads_in(layer)
        self._check_fits(self.head_peak_bytes() * heads, f"all {heads} heads of layer {layer}")
        return self._dense(layer, list(range(heads)))

    @property
    def streams(self) -> bool:
        """Whether views should be computed as streamed reductions (long inputs, or q/k on a GPU) rather than from
        whole maps: up to ``DENSE_CELLS`` cells on the CPU a whole head costs microseconds in numpy, where the
        chunked path's per-call overhead is milliseconds."""
        return self.device.type != "cpu" or len(self.query_tokens) * len(self.key_tokens) > DENSE_CELLS

    def _dense(self, layer: int, heads: list[int], average: bool = False) -> np.ndarray:
        """``(len(heads) or 1, q, k)`` float32 on the host."""
        from models.core import tiles

        if not self.streams:  # small, on the CPU: numpy, head by head
            query, key = _host_array(self.queries[layer]), _host_array(self.keys[layer])
            bias = self._bias(layer)
            if isinstance(bias, RelativeBias):
                bias = bias.dense(len(self.query_tokens), len(self.key_tokens))
            elif bias is not None:
                bias = _host_array(bias)
            group = query.shape[0] // key.shape[0]  # per layer: a hybrid's layers may differ (MiMo)
            allowed = self.allowed(layer)
            sink = self._sink(layer)
            sink = None if sink is None else sink.float().cpu().numpy()
            maps = [attention_probabilities(query[h:h + 1], key[h // group:h // group + 1], self.scalings[layer],
                                            allowed, None if bias is None else bias[h if len(bias) > 1 else 0][None],
                                            softcap=self._softcap(layer),
                                            sink=None if sink is None else sink[h:h + 1])
                    for h in heads]
            weights = np.concatenate(maps)
            return weights.mean(axis=0, keepdims=True) if average else weights
        weights = tiles.cells(self.scores(layer), heads, (0, len(self.query_tokens)), (0, len(self.key_tokens)),
                              average)[0]
        return weights.cpu().numpy()

    def _compute_head(self, layer: int, head: int) -> np.ndarray:
        """One head ``(q, k)`` without computing the others."""
        self._check_fits(self.head_peak_bytes(), f"layer {layer}, head {head}")
        weights = self._dense(layer, [head])[0]
        weights.setflags(write=False)
        return weights

    def head(self, layer: int, head: int | None) -> np.ndarray:
        """One head ``(queries, keys)`` recomputed alone (a layer is ``heads`` times larger), or the head mean
        accumulated head by head (the peak is two maps, not a whole layer)."""
        self._check_layer(layer)
        if head is not None:
            self._check_head(layer, head)
            return self._compute_head(layer, head)
        self._check_fits(2 * self.head_peak_bytes(), f"the head average of layer {layer}")
        weights = self._dense(layer, list(range(self.heads_in(layer))), average=True)[0]
        weights.setflags(write=False)
        return weights

    def iter_heads(self, layer: int) -> Iterator[tuple[int, np.ndarray]]:
        self._check_layer(layer)
        for head in range(self.heads_in(layer)):
            yield head, self._compute_head(layer, head)

    def nbytes(self) -> int:
        """Bytes held (queries, keys, masks, biases): what this result costs in memory, wherever it is."""
        return sum(self.held_bytes().values())

    def held_bytes(self) -> dict[str, int]:
        return _held([*self.queries, *self.keys, *self.allowed_masks, *self.biases,
                      *(sink for sink in self.sinks if sink is not None)])

    def head_peak_bytes(self) -> int:
        """Bound on the bytes one head's whole map costs (``head``/``iter_heads``): the float32 result on the host,
        and on the device where q and k are, a chunk of rows being computed: ``q · k · 4`` plus one chunk."""
        from models.core import tiles

        return len(self.query_tokens) * len(self.key_tokens) * 4 + tiles.chunk_bytes(self.device)

    def reduction_peak_bytes(self) -> int:
        """Bound on the bytes a reduction (tiles, a window, a row, statistics) allocates where q and k are: one
        chunk of rows × keys, a float32 copy of one key head and the per-row outputs, never ``q · k``."""
        from models.core import tiles

        n_q, n_k = len(self.query_tokens), len(self.key_tokens)
        d = self.queries[0].shape[-1] if self.queries else 0
        return tiles.chunk_bytes(self.device) + 4 * n_k * d + 4 * 8 * n_q * max(1, self.num_heads)

    def _check_fits(self, nbytes: int, what: str) -> None:
        """Refuse, with a message a user can act on, work whose peak would not fit in the memory free now."""
        from models.core import memory_fit

        if nbytes < memory_fit.CHECK_FROM_BYTES:  # small work cannot take the server down: not worth the probe
            return
        for device in {str(self.device), "cpu"}:
            free = memory_fit.free_for_tensors(device)
            if free is not None and nbytes > free * memory_fit.VIEW_SHARE:
                raise ValueError(
                    f"Showing {what} whole at {len(self.query_tokens):,} × {len(self.key_tokens):,} tokens needs about "
                    f"{nbytes / 2**30:,.1f} GB and {device} has {max(free, 0) / 2**30:,.1f} GB free. The overview, "
                    "the zoom, a query's row and the heads table work at any length; this view needs the whole map, "
                    "so shorten the input (the token limit in the sidebar) to see it.")

    # --- reductions, computed where q and k are ---------------------------------------------------------------------

    def _heads(self, layer: int, head: int | None) -> tuple[list[int], bool]:
        self._check_layer(layer)
        if head is None:
            return list(range(self.heads_in(layer))), True
        self._check_head(layer, head)
        return [head], False

    def tiles(self, layer: int, head: int | None, queries: tuple[int, int] | None = None,
              keys: tuple[int, int] | None = None, tile: int | tuple[int, int] = 1) -> "Tiles":
        from models.core import tiles

        queries, keys = self._span(layer, queries, keys)
        heads, average = self._heads(layer, head)
        tile_q, tile_k = (tile, tile) if isinstance(tile, int) else tile
        query_edges, key_edges = _edges(*queries, tile_q), _edges(*keys, tile_k)
        if (len(query_edges) - 1) * (len(key_edges) - 1) > MAX_TILES:
            raise ValueError(f"{len(query_edges) - 1:,} × {len(key_edges) - 1:,} tiles are more than an image shows "
                             f"({MAX_TILES:,}); ask for larger tiles")
        self._check_fits(self.reduction_peak_bytes(), f"layer {layer}'s tiles")
        reduced = tiles.tile_pass(self.scores(layer), heads, query_edges, key_edges, average)
        cells = reduced.cells().numpy()
        host = lambda tensor: tensor[0, 0].cpu().numpy()  # noqa: E731
        return Tiles(np.asarray(query_edges), np.asarray(key_edges), host(reduced.maximum),
                     (host(reduced.total) / cells).astype(np.float32), host(reduced.visible) > 0,
                     host(reduced.row_max))

    def window(self, layer: int, head: int | None, queries: tuple[int, int], keys: tuple[int, int]) -> np.ndarray:
        from models.core import tiles

        queries, keys = self._span(layer, queries, keys)
        heads, average = self._heads(layer, head)
        cells = (queries[1] - queries[0]) * (keys[1] - keys[0])
        self._check_fits(self.reduction_peak_bytes() + 8 * cells, f"queries {queries[0]}–{queries[1] - 1}")
        return tiles.cells(self.scores(layer), heads, queries, keys, average)[0, 0].cpu().numpy()

    def window_allowed(self, layer: int, queries: tuple[int, int], keys: tuple[int, int]) -> np.ndarray:
        queries, keys = self._span(layer, queries, keys)
        mask = self._mask(layer)
        if isinstance(mask, DescribedMask):
            return mask.array(queries, keys)
        return self.allowed(layer)[queries[0]:queries[1], keys[0]:keys[1]]

    def layer_summary(self, layer: int, size: int = 64) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Every head of ``layer`` at once, streamed where q and k are: thumbnails ``(heads, s_q, s_k)`` (block means
        over ``size`` bins a side, as ``models.analysis.heads.pooled``) and the heads table's statistics
        ``{name: (heads,)}`` (``models.analysis.heads``)."""
        from models.core import tiles

        self._check_layer(layer)
        self._check_fits(self.reduction_peak_bytes(), f"the heads of layer {layer}")
        scores = self.scores(layer)
        heads = list(range(self.heads_in(layer)))
        query_edges = _bins(len(self.query_tokens), size)
        key_edges = _bins(len(self.key_tokens), size)
        reduced = tiles.tile_pass(scores, heads, query_edges, key_edges)
        thumbnails = (reduced.total[0] / reduced.cells().to(reduced.total.device)).cpu().numpy().astype(np.float32)
        statistics = {name: values[0].cpu().numpy().astype(np.float32)
                      for name, values in tiles.head_statistics(scores, heads).items()}
        return thumbnails, statistics


DENSE_CELLS = 256 * 256  # see RecomputedAttention.streams
MAX_TILES = 4_000_000  # tiles one reduction may return: ~2,000 × 2,000, far more than a screen shows


def _bins(length: int, bins: int) -> list[int]:
    """Edges of ``min(length, bins)`` near-equal bins (``models.analysis.heads.pooled``'s)."""
    return np.linspace(0, length, min(length, bins) + 1).round().astype(int).tolist()


@dataclass(frozen=True)
class DescribedMask:
    """A mask kept as its rules, never as a ``(queries, keys)`` array: query ``i`` sees key ``j`` when
    ``key_start <= j < key_stop`` (padding outside), and ``j <= i + offset`` if ``causal`` (SDPA's ``is_causal`` is
    top-left aligned: offset 0), and ``j > i + offset − window`` if ``window`` (a sliding window). At 131,072 tokens
    the boolean array would be 16 GB; this is a few integers."""

    queries: int
    keys: int
    causal: bool = False
    key_start: int = 0
    key_stop: int | None = None
    offset: int = 0
    window: int = 0
    nbytes = 0  # held: nothing but the rules

    @property
    def shape(self) -> tuple[int, int]:
        return self.queries, self.keys

    def rules(self) -> dict:
        """The keyword arguments of ``tiles.Scores`` for a batch of one."""
        stop = self.keys if self.key_stop is None else self.key_stop
        return {"causal": self.causal, "offset": self.offset, "window": self.window,
                "key_start": (self.key_start,), "key_stop": (stop,)}

    def shifted(self, queries: tuple[int, int], keys: tuple[int, int]) -> "DescribedMask":
        """The same rules over the window ``queries × keys`` (half-open), positions counted from its corner."""
        (q0, q1), (k0, k1) = queries, keys
        if (q0, q1, k0, k1) == (0, self.queries, 0, self.keys):
            return self
        stop = self.keys if self.key_stop is None else self.key_stop
        return replace(self, queries=q1 - q0, keys=k1 - k0, key_start=min(max(self.key_start - k0, 0), k1 - k0),
                       key_stop=min(max(stop - k0, 0), k1 - k0), offset=self.offset + q0 - k0)

    def array(self, queries: tuple[int, int] | None = None, keys: tuple[int, int] | None = None) -> np.ndarray:
        """The boolean mask of ``queries × keys`` (half-open; default the whole ``(queries, keys)``), True = seen."""
        q0, q1 = queries or (0, self.queries)
        k0, k1 = keys or (0, self.keys)
        rows, cols = np.arange(q0, q1)[:, None], np.arange(k0, k1)[None, :]
        stop = self.keys if self.key_stop is None else self.key_stop
        seen = (cols >= self.key_start) & (cols < stop) & np.ones((q1 - q0, 1), dtype=bool)
        if self.causal:
            seen &= cols - rows <= self.offset
        if self.window:
            seen &= cols - rows > self.offset - self.window
        return seen


@dataclass(frozen=True)
class CausalMask(DescribedMask):
    """The plain causal mask, kept as its shape: query ``i`` sees keys ``0..i`` (and none at or past ``queries``),
    as SDPA's ``is_causal`` applies it."""

    causal: bool = True


def attention_probabilities(
    query: np.ndarray, key: np.ndarray, scaling: float, allowed: np.ndarray, bias: np.ndarray | None = None,
    softcap: float = 0.0, sink: np.ndarray | None = None,
) -> np.ndarray:
    """softmax(q kᵀ · scaling + bias, masked) in float32, head by head to bound peak memory.

    query ``(H, q, d)``, key ``(H_kv, k, d)``, allowed ``(q, k)`` bool -> ``(H, q, k)``; masked entries are exactly 0
    and a query that may see no key at all (a padding position) gets an all-zero row. ``softcap``: the scaled
    scores capped to ``c · tanh(s / c)`` first; ``sink (H,)``: a logit per head in every row's denominator (its
    share is left out, so rows sum to one minus it).
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
        if softcap:
            scores /= np.float32(softcap)
            np.tanh(scores, out=scores)
            scores *= np.float32(softcap)
        if bias is not None:
            scores += bias[h]
        np.putmask(scores, blocked, -np.inf)
        top = np.where(any_allowed, scores.max(axis=-1, keepdims=True), np.float32(-np.inf))
        if sink is not None:
            top = np.maximum(top, np.float32(sink[h]))
        top = np.where(np.isfinite(top), top, np.float32(0))
        scores -= top
        np.exp(scores, out=scores)
        total = scores.sum(axis=-1, keepdims=True)
        if sink is not None:
            total = total + np.exp(np.float32(sink[h]) - top)
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

    def held_bytes(self) -> dict[str, int]:
        """Bytes this result holds by device (its maps' q and k, arrays such as a residual stream): what a cache of
        results pays for keeping it."""
        import dataclasses

        totals: dict[str, int] = {}
        for maps in self.attention.values():
            for device, nbytes in maps.held_bytes().items():
                totals[device] = totals.get(device, 0) + nbytes
        arrays = [getattr(self, f.name) for f in dataclasses.fields(self)]
        return _held([a for a in arrays if isinstance(a, (np.ndarray, torch.Tensor))], totals)

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
    # each token's own decoded text, leading spaces kept (causal LM prompt runs): a token shown in context reads as
    # the text did; () when not kept
    pieces: tuple[str, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self):
        if self.residual is not None:
            self.residual.setflags(write=False)  # shared by every session that reads this result


@dataclass(frozen=True, kw_only=True)
class ImageResult(RunResult):
    """An image model on one image: the crop it saw and its patch layout, and its top classes if it has a head."""

    image: ImageInfo
    predictions: tuple[TokenProbability, ...] = ()  # top classes, best first; () for a backbone
