"""Per-head summaries that let a user find interesting heads among hundreds without opening each.

The statistics (entropy, mean distance, first-token share, previous-token and diagonal scores)
are the heads-table rows of ``models.core.head_statistics.TABLE``, which defines them; here they
are its float64 reference, kept in float32. Thumbnails are block means of each map to at most
``size × size`` cells, so the all-heads grid costs ``layers × heads × size²`` floats whatever the
input length.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from models.core import head_statistics
from models.core.results import AttentionMaps, RunResult, TextResult

if TYPE_CHECKING:
    import pandas as pd

STATISTICS = head_statistics.labels(head_statistics.HEADS_TABLE)  # {name: label}, the table's


def _bin_edges(length: int, bins: int) -> np.ndarray:
    return np.linspace(0, length, bins + 1).round().astype(int)[:-1]


def pooled(weights: np.ndarray, size: int = 64) -> np.ndarray:
    """Block means of ``(heads, q, k)`` to ``(heads, min(q, size), min(k, size))``."""
    heads, q, k = weights.shape
    rows, cols = _bin_edges(q, min(q, size)), _bin_edges(k, min(k, size))
    # keys first: reduceat along the contiguous axis is ~20× faster than along rows at 4,096 tokens
    summed = np.add.reduceat(np.add.reduceat(weights, cols, axis=2), rows, axis=1)
    row_counts = np.diff(np.append(rows, q))[None, :, None]
    col_counts = np.diff(np.append(cols, k))[None, None, :]
    return (summed / (row_counts * col_counts)).astype(np.float32)


def layer_statistics(weights: np.ndarray, query_offset: int = 0) -> dict[str, np.ndarray]:
    """The heads table's statistics of every head of one layer ``(heads, q, k)`` ->
    ``{name: (heads,)}`` float32.

    ``query_offset``: position of query 0 among the keys (0 for self-attention over the same tokens).
    """
    return head_statistics.reference(weights, query_offset, names=head_statistics.HEADS_TABLE,
                                     dtype=np.float32)


@dataclass(frozen=True)
class HeadSummary:
    thumbnails: np.ndarray  # (layers, heads, s_q, s_k) block means
    statistics: dict[str, np.ndarray]  # name -> (layers, heads)
    model: str = ""  # what the summary is of, for titles and file names
    input_name: str = ""
    kind: str = ""
    roles: dict[str, np.ndarray] = field(default_factory=dict)  # models.analysis.roles.ROLES name -> (layers, heads)
    kv_heads: int = 0  # key/value heads per layer; 0 = as many as query heads (no GQA)
    windows: tuple[int, ...] = ()  # per layer, the sliding window it attends within (0: global); () = none has one

    @property
    def num_heads(self) -> int:
        return self.thumbnails.shape[1]

    @property
    def group_size(self) -> int:
        """Query heads per key/value head (1 without GQA); head h reads key/value head h // group_size."""
        return self.num_heads // self.kv_heads if self.kv_heads else 1

    def values(self, name: str) -> np.ndarray:
        """A statistic or a role score ``(layers, heads)`` by name."""
        if name in self.statistics:
            return self.statistics[name]
        if name in self.roles:
            return self.roles[name]
        from models.analysis.roles import ROLES

        known = list(STATISTICS) + [role for role in ROLES if role in self.roles]
        if name in ROLES:
            raise ValueError(f"{ROLES[name]} is measured for causal language models only; choose one of "
                             f"{', '.join(known)}")
        raise ValueError(f"unknown statistic {name!r}; choose one of {', '.join(known)}")

    def label(self, name: str) -> str:
        from models.analysis.roles import ROLES

        return STATISTICS.get(name) or ROLES.get(name, name)


def summarize(maps: AttentionMaps, size: int = 64) -> HeadSummary:
    """Thumbnails and statistics of every head. Maps that keep q and k (``layer_summary``) stream them where q and
    k live, a chunk of query rows at a time, never a head's ``(q, k)`` map (any length); others one head at a time
    (``maps.iter_heads``), whose peak is one head's map."""
    thumbnails = np.zeros((maps.num_layers, maps.num_heads, *_pooled_shape(maps, size)), dtype=np.float32)
    stats = {name: np.zeros((maps.num_layers, maps.num_heads), dtype=np.float32) for name in STATISTICS}
    streamed = getattr(maps, "layer_summary", None) if getattr(maps, "streams", False) else None
    for layer in range(maps.num_layers):
        if streamed is not None:
            thumbnails[layer], layer_stats = streamed(layer, size)
            for name in STATISTICS:
                stats[name][layer] = layer_stats[name]
            continue
        for head, weights in maps.iter_heads(layer):
            thumbnails[layer, head] = pooled(weights[None], size)[0]
            for name, values in layer_statistics(weights[None]).items():
                stats[name][layer, head] = values[0]
    return HeadSummary(thumbnails, stats)


def _pooled_shape(maps: AttentionMaps, size: int) -> tuple[int, int]:
    return min(len(maps.query_tokens), size), min(len(maps.key_tokens), size)


def summary_table(summary: HeadSummary) -> "pd.DataFrame":
    """One row per (layer, head) with every statistic as a column: the sortable table beside the layer × head map."""
    import pandas as pd

    from models.analysis.roles import ROLES

    layers, heads = next(iter(summary.statistics.values())).shape
    layer_index, head_index = np.meshgrid(np.arange(layers), np.arange(heads), indexing="ij")
    columns = {"layer": layer_index.ravel(), "head": head_index.ravel()}
    if summary.windows:  # Gemma 3, Mistral: which layers see only a sliding window of keys
        every = all(summary.windows)  # Mistral: one window everywhere, no global layer to tell apart
        columns["attention"] = [(f"window {summary.windows[layer]}" if every else f"local ({summary.windows[layer]})")
                                if summary.windows[layer] else "global" for layer in layer_index.ravel()]
    if summary.group_size > 1:  # GQA: heads of one group share their keys and values
        columns["kv group"] = head_index.ravel() // summary.group_size
    columns.update({label: summary.roles[name].ravel().astype(float) for name, label in ROLES.items()
                    if name in summary.roles})
    columns.update({label: summary.statistics[name].ravel().astype(float) for name, label in STATISTICS.items()})
    return pd.DataFrame(columns)


def summarize_run(loaded, result: RunResult, options) -> HeadSummary:
    """``summarize`` of the result's maps of ``options.kind`` (the all-heads views' analysis), with the key/value
    groups, and for a causal LM's self-attention the head roles (``models.analysis.roles``, which need ``loaded``)."""
    maps = result.maps(options.kind)
    summary = summarize(maps)
    kv_heads = int(getattr(maps, "num_kv_heads", 0) or 0)
    roles = {}
    if loaded is not None and isinstance(result, TextResult) and result.next_token and maps.kind == "self":
        from models.analysis.roles import head_roles

        roles = head_roles(loaded).scores
    windows = tuple(maps.layer_window(layer) for layer in range(maps.num_layers))
    return replace(summary, model=result.model.short_name, input_name=result.input_name, kind=maps.kind,
                   roles=roles, kv_heads=kv_heads if 0 < kv_heads < maps.num_heads else 0,
                   windows=windows if any(windows) else ())


def special_token_share(maps: AttentionMaps, positions: tuple[int, ...] | list[int]) -> np.ndarray:
    """Mean share of each head's attention that lands on ``positions`` (e.g. [CLS], [SEP]): ``(layers, heads)``;
    many BERT heads park their attention there when they have nothing better to do (Clark et al. 2019)."""
    share = np.zeros((maps.num_layers, maps.num_heads), dtype=np.float32)
    for layer in range(maps.num_layers):
        for head, weights in maps.iter_heads(layer):
            share[layer, head] = weights[:, list(positions)].sum(axis=-1).mean()
    return share
