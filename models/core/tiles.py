"""Exact reductions of softmax attention computed from q and k where they live, never the (queries × keys) matrix.

One attention call gives query ``i`` the weights ``p_ij = exp(s_ij − L_i)`` over the keys it may see, with
``s_ij = q_i · k_j · scaling + b_ij`` (``b``: a position bias, or 0) and ``L_i = log Σ_j exp(s_ij)`` the row's
normaliser (its log-sum-exp); keys it may not see get exactly 0, and a query that sees no key at all an all-zero row.
At 131,072 tokens one head's matrix is 68 GB in float32; every view needs far less of it:

- ``row_pass``: per query row, ``L_i``, the row's largest weight, its entropy in bits (``−Σ p log₂ p``) and its mean
  distance (``Σ p |i − j|``, tokens): one online-softmax pass over the keys (Milakov & Gimelshein 2018, the forward of
  FlashAttention, Dao et al. 2022, with the statistics where the values would be), nothing per key kept;
- ``tile_pass``: a window cut into tiles by query and key edges, each tile's largest weight, sum of weights and count
  of visible cells (an overview image, a zoom level of the pyramid, the all-heads thumbnails); a second pass that
  reads the normalisers of the first;
- ``cells``: the exact weights of a bounded window (the zoom's cells, one query's row);
- ``head_statistics``: the heads table's per-head numbers from ``row_pass`` and three weights per row.

Masks are described, not materialised (``Scores``): causal (SDPA's top-left alignment, shifted by ``offset``), a
sliding window, and each batch item's range of real keys (padding); a mask no description fits, or a position bias
that is no function of ``j − i``, may still be given whole and is sliced a chunk at a time. Grouped-query attention
reads key head ``h // (heads / kv_heads)`` for query head ``h``, as the model does.

Two backends give the same numbers: a Triton kernel on CUDA (``models/core/tiles_triton.py``) and chunks of query
rows in PyTorch everywhere else (CPU, MPS, and CUDA when a mask or bias is given whole); ``reference`` is the float64
dense computation both are tested against. The PyTorch path's peak is one chunk of rows × keys (``chunk_bytes``).
"""
from __future__ import annotations

import math
import os
from typing import Iterator, Sequence

import torch

from models.core.head_statistics import HEADS_TABLE
from models.core.scores import RowPass, Scores, TilePass

LN2 = math.log(2.0)
CHUNK_BYTES = {"cpu": 64 * 2**20, "cuda": 512 * 2**20, "mps": 256 * 2**20}  # one chunk of rows × keys, all temporaries
BYTES_PER_CELL = 16  # scores, weights, the visibility mask and one reduction temporary, float32
BACKENDS = ("torch", "triton")


def _pick_backend(scores: Scores, backend: str | None) -> str:
    """Triton on CUDA for described masks and biases (``ATTN_EXPLORER_TILES=torch`` turns it off), else PyTorch."""
    chosen = backend or os.environ.get("ATTN_EXPLORER_TILES") or ""
    if chosen and chosen not in BACKENDS:
        raise ValueError(f"unknown reduction backend {chosen!r}; choose one of {', '.join(BACKENDS)}")
    if chosen == "triton" or (not chosen and scores.device.type == "cuda" and scores.described()):
        if not scores.described():
            raise ValueError("the Triton kernel takes described masks and relative biases only")
        from models.core import tiles_triton

        if tiles_triton.available(scores.device):
            return "triton"
        if chosen == "triton":
            raise ValueError("Triton is not installed (or cannot run on this device); use the PyTorch path")
    return "torch"


def chunk_bytes(device: torch.device) -> int:
    return CHUNK_BYTES.get(device.type, CHUNK_BYTES["cpu"])


def _rows_per_chunk(scores: Scores, width: int, copies: int = 1) -> int:
    """Query rows per chunk so that ``copies`` chunks of rows × ``width`` keys stay within ``chunk_bytes``."""
    per_row = max(1, scores.batch * width * BYTES_PER_CELL * copies)
    return max(1, chunk_bytes(scores.device) // per_row)


def _chunks(scores: Scores, head: int, row_start: int, row_stop: int, key_float: torch.Tensor | None = None
            ) -> Iterator[tuple[int, int, int, int, torch.Tensor, torch.Tensor]]:
    """The exact weights of query head ``head`` a chunk of rows at a time: ``(r0, r1, lo, hi, normaliser, weights)``
    with ``weights (B, r1 − r0, hi − lo)`` float32 over keys ``lo:hi`` (every key those rows may see) and the rows'
    normalisers ``(B, r1 − r0)`` (−inf for a row that sees nothing). Each chunk holds whole rows, so its softmax is
    the row's exact one."""
    key_float = key_float if key_float is not None else scores.key[:, head // scores.group].float()
    lo_all, hi_all = scores.key_span(row_start, row_stop)
    step = _rows_per_chunk(scores, max(1, hi_all - lo_all))
    for r0 in range(row_start, row_stop, step):
        r1 = min(row_stop, r0 + step)
        lo, hi = scores.key_span(r0, r1)
        logits = scores.scores(head, r0, r1, lo, hi, key_float)
        normaliser = scores.normaliser(logits, head)  # (B, r, 1); −inf for a row that sees nothing
        weights = logits.sub_(torch.where(torch.isfinite(normaliser), normaliser, 0.0)).exp_()  # in place
        yield r0, r1, lo, hi, normaliser[..., 0], weights


# --- the two passes --------------------------------------------------------------------------------------------------


def row_pass(scores: Scores, heads: Sequence[int], rows: tuple[int, int] | None = None, statistics: bool = False,
             backend: str | None = None) -> RowPass:
    """Each row's normaliser and largest weight (and with ``statistics`` its entropy and mean distance) for the
    query heads ``heads``, over ``rows = (first, stop)`` (default: all)."""
    rows = rows or (0, scores.queries)
    heads = [int(h) for h in heads]
    if _pick_backend(scores, backend) == "triton":
        from models.core import tiles_triton

        return tiles_triton.row_pass(scores, heads, rows, statistics)
    shape = (scores.batch, len(heads), rows[1] - rows[0])
    normaliser = torch.full(shape, float("-inf"), device=scores.device)
    row_max = torch.zeros(shape, device=scores.device)
    entropy = torch.zeros(shape, device=scores.device) if statistics else None
    distance = torch.zeros(shape, device=scores.device) if statistics else None
    for slot, head in enumerate(heads):
        for r0, r1, lo, hi, chunk_normaliser, weights in _chunks(scores, head, *rows):
            at = slice(r0 - rows[0], r1 - rows[0])
            normaliser[:, slot, at] = chunk_normaliser
            if hi > lo:
                row_max[:, slot, at] = weights.amax(dim=-1)
            if statistics and hi > lo:
                entropy[:, slot, at] = torch.special.entr(weights).sum(-1) / LN2  # −p ln p, 0 at p = 0; bits
                distance[:, slot, at] = _mean_distance(scores, weights, r0, r1, lo, hi)
            if statistics and scores.sink is not None:  # the sink is one more outcome of the row's distribution
                sink_share = torch.exp(scores.sink[head].float() - chunk_normaliser)
                entropy[:, slot, at] += torch.special.entr(torch.nan_to_num(sink_share)) / LN2
    return RowPass(rows, normaliser, row_max, entropy, distance)


def _mean_distance(scores: Scores, weights: torch.Tensor, r0: int, r1: int, lo: int, hi: int) -> torch.Tensor:
    """``Σ_j p_ij |i − j|`` ``(B, r)`` for a chunk: ``i·Σp − Σ p·j`` over all keys, plus twice ``Σ_{j>i} p (j − i)``
    (only when a key after the query may be seen): products with a vector, no ``(r, c)`` table of distances.
    Positions count from the chunk's first row, so the two terms are about the size of the answer (no float32
    cancellation between two numbers near 131,072)."""
    rows = torch.arange(0, r1 - r0, device=weights.device, dtype=torch.float32)
    cols = torch.arange(lo - r0, hi - r0, device=weights.device, dtype=torch.float32)
    distance = rows * weights.sum(-1) - torch.matmul(weights, cols)
    if not (scores.causal and scores.offset <= 0):
        later = weights.triu(r0 - lo + 1)  # keys j > i, in chunk coordinates
        distance += 2 * (torch.matmul(later, cols) - rows * later.sum(-1))
    return distance



def tile_pass(scores: Scores, heads: Sequence[int], query_edges: Sequence[int], key_edges: Sequence[int],
              average: bool = False, normalisers: RowPass | None = None, backend: str | None = None) -> TilePass:
    """Reduce the window ``query_edges[0]:query_edges[-1] × key_edges[0]:key_edges[-1]`` to tiles for each head of
    ``heads`` (or, ``average``, for the mean of their weights: one output). ``normalisers``: a ``row_pass`` of the
    same heads over at least the window's rows, if one was made already (the kernel needs one; the PyTorch path
    computes exact rows in each chunk and ignores it)."""
    heads = [int(h) for h in heads]
    query_edges = torch.as_tensor(list(query_edges), dtype=torch.int64)
    key_edges = torch.as_tensor(list(key_edges), dtype=torch.int64)
    for name, edges, top in (("query", query_edges, scores.queries), ("key", key_edges, scores.keys)):
        if len(edges) < 2 or bool((torch.diff(edges) <= 0).any()) or int(edges[0]) < 0 or int(edges[-1]) > top:
            raise ValueError(f"the {name} edges must rise strictly within 0..{top}; got {edges.tolist()[:8]}…")
    if _pick_backend(scores, backend) == "triton":
        from models.core import tiles_triton

        rows = (int(query_edges[0]), int(query_edges[-1]))
        if normalisers is None or normalisers.rows[0] > rows[0] or normalisers.rows[1] < rows[1]:
            normalisers = row_pass(scores, heads, rows, backend="triton")
        return tiles_triton.tile_pass(scores, heads, query_edges, key_edges, average, normalisers)
    return _tile_pass_torch(scores, heads, query_edges, key_edges, average)


def _tile_pass_torch(scores: Scores, heads: list[int], query_edges: torch.Tensor, key_edges: torch.Tensor,
                     average: bool) -> TilePass:
    """Chunks of whole rows; each chunk's weights reduced to tiles by ``segment_reduce`` along keys (a length per
    tile, no per-cell index), then along rows; visible counts by interval arithmetic."""
    device = scores.device
    outputs = 1 if average else len(heads)
    tq, tk = len(query_edges) - 1, len(key_edges) - 1
    (q0, q1), (k0, k1) = (int(query_edges[0]), int(query_edges[-1])), (int(key_edges[0]), int(key_edges[-1]))
    maximum = torch.zeros(scores.batch, outputs, tq, tk, device=device)
    total = torch.zeros_like(maximum)
    visible = torch.zeros_like(maximum)
    row_max = torch.zeros(scores.batch, outputs, q1 - q0, device=device)
    query_edges_device, key_edges_device = query_edges.to(device), key_edges.to(device)
    key_floats = {}
    groups = [heads] if average else [[head] for head in heads]
    lo_all, hi_all = scores.key_span(q0, q1)
    step = _rows_per_chunk(scores, max(1, hi_all - lo_all), copies=2 if average else 1)
    for slot, group in enumerate(groups):
        for r0 in range(q0, q1, step):
            r1 = min(q1, r0 + step)
            lo, hi = scores.key_span(r0, r1)
            lo, hi = max(lo, k0), min(hi, k1)  # the window's keys only: a row's weights are still its exact ones
            if hi <= lo:
                continue
            summed = None
            for head in group:
                kv = head // scores.group
                if kv not in key_floats:
                    key_floats[kv] = scores.key[:, kv].float()
                weights = _window_weights(scores, head, r0, r1, lo, hi, key_floats[kv])
                summed = weights if summed is None else summed.add_(weights)
                del weights
            if average:
                summed.div_(len(group))
            row_max[:, slot, r0 - q0:r1 - q0] = summed.amax(dim=-1)
            cols = _lengths(key_edges_device, lo, hi)  # keys of each tile in lo:hi
            rows = _lengths(query_edges_device, r0, r1)  # rows of each tile in r0:r1
            by_col_max = _along_last(summed, cols, "max")  # (B, r, TK)
            by_col_sum = _along_last(summed, cols, "sum")
            del summed
            counts = scores.visible_counts(r0, r1, key_edges_device)
            if counts is None:  # a mask given whole: count its cells
                seen = scores.visible(torch.arange(r0, r1, device=device), torch.arange(lo, hi, device=device))
                counts = _along_last(seen.float(), cols, "sum")
            # the query tiles this chunk's rows fall in (one or two): only their lines of the output are touched
            first_tile = int(torch.searchsorted(query_edges, r0, right=True)) - 1
            last_tile = int(torch.searchsorted(query_edges, r1 - 1, right=True))
            rows = rows[first_tile:last_tile]
            for target, values, reduce in ((maximum, by_col_max, "max"), (total, by_col_sum, "sum"),
                                           (visible, counts, "sum")):
                by_tile = _along_last(values.transpose(1, 2), rows, reduce).transpose(1, 2)  # (B, tiles here, TK)
                lines = target[:, slot, first_tile:last_tile]
                if reduce == "max":
                    torch.maximum(lines, by_tile, out=lines)
                else:
                    lines.add_(by_tile)
    return TilePass(query_edges, key_edges, maximum, total, visible, row_max)


def _lengths(edges: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """How many positions of ``start:stop`` fall in each tile between ``edges`` ``(tiles,)``."""
    return edges[1:].clamp(start, stop) - edges[:-1].clamp(start, stop)


def _along_last(values: torch.Tensor, lengths: torch.Tensor, reduce: str) -> torch.Tensor:
    """``values (..., n)`` reduced over consecutive segments of ``lengths (T,)`` (summing to n) -> ``(..., T)``; an
    empty segment gives 0 (weights are never negative)."""
    lengths = lengths.expand(*values.shape[:-1], -1).contiguous()
    if not values.is_contiguous() or values.stride()[-1] != 1:  # segment_reduce reads rows with stride 1 (a
        values = values.new_empty(values.shape).copy_(values)  # transposed (…, 1) passes is_contiguous: not this)
    return torch.segment_reduce(values, reduce, lengths=lengths, axis=values.dim() - 1, initial=0.0)


def _window_weights(scores: Scores, head: int, r0: int, r1: int, lo: int, hi: int,
                    key_float: torch.Tensor) -> torch.Tensor:
    """Exact weights ``(B, r, hi − lo)`` of rows ``r0:r1`` over keys ``lo:hi``: the rows' normalisers over every key
    they see, then ``exp(s − L)`` on the columns asked for (the whole row is a chunk's temporary, never kept)."""
    full_lo, full_hi = scores.key_span(r0, r1)
    logits = scores.scores(head, r0, r1, full_lo, full_hi, key_float)
    normaliser = scores.normaliser(logits, head)
    window = logits[:, :, lo - full_lo:hi - full_lo]
    return window.sub_(torch.where(torch.isfinite(normaliser), normaliser, 0.0)).exp_()  # in place: no copy


# --- exact cells and statistics (every backend) --------------------------------------------------------------------

def cells(scores: Scores, heads: Sequence[int], rows: tuple[int, int], cols: tuple[int, int],
          average: bool = False) -> torch.Tensor:
    """Exact weights ``(B, outputs, r, c)`` float32 of ``rows × cols`` (half-open ranges) for each head of ``heads``
    (``average``: their mean, one output). Each row's normaliser is taken over every key it sees; the peak is a
    chunk of rows × keys, so the window itself should be small (a zoom's cells, one row)."""
    heads = [int(h) for h in heads]
    (r0, r1), (c0, c1) = rows, cols
    if not (0 <= r0 < r1 <= scores.queries and 0 <= c0 < c1 <= scores.keys):
        raise ValueError(f"the window queries {r0}–{r1 - 1}, keys {c0}–{c1 - 1} is outside the "
                         f"{scores.queries} × {scores.keys} map")
    outputs = 1 if average else len(heads)
    out = torch.zeros(scores.batch, outputs, r1 - r0, c1 - c0, device=scores.device)
    lo_all, hi_all = scores.key_span(r0, r1)
    step = _rows_per_chunk(scores, max(1, hi_all - lo_all))
    for slot, head in enumerate(heads):
        key_float = scores.key[:, head // scores.group].float()
        target = 0 if average else slot
        for a in range(r0, r1, step):
            b = min(r1, a + step)
            lo, hi = scores.key_span(a, b)
            lo, hi = max(lo, c0), min(hi, c1)
            if hi > lo:
                out[:, target, a - r0:b - r0, lo - c0:hi - c0] += _window_weights(scores, head, a, b, lo, hi,
                                                                                  key_float)
    if average:
        out /= len(heads)
    return out


def pointwise(scores: Scores, head: int, rows: torch.Tensor, cols: torch.Tensor, normaliser: torch.Tensor
              ) -> torch.Tensor:
    """The weights ``p[b, rows[n], cols[n]]`` ``(B, n)`` of query head ``head`` from the rows' normalisers
    ``(B, n)`` (a ``row_pass``): a dot product per pair, nothing per key; 0 where masked or out of range."""
    inside = (cols >= 0) & (cols < scores.keys)
    safe_cols = cols.clamp(0, scores.keys - 1)
    query = scores.query[:, head, rows].float()  # (B, n, d)
    key = scores.key[:, head // scores.group, safe_cols].float()  # (B, n, d)
    logits = (query * key).sum(-1) * scores.scaling  # (B, n)
    if scores.softcap:
        logits = torch.tanh(logits / scores.softcap) * scores.softcap
    if scores.relative_bias is not None:
        bias = scores.relative_bias[:, head if scores.relative_bias.shape[1] > 1 else 0]
        logits = logits + bias[:, safe_cols - rows + scores.queries - 1].float()
    if scores.bias is not None:
        bias = scores.bias[:, head if scores.bias.shape[1] > 1 else 0]
        logits = logits + bias[:, rows, safe_cols].float()
    seen = _visible_pairs(scores, rows, safe_cols) & inside[None] & torch.isfinite(normaliser)
    if scores.allowed is not None:
        seen = seen & scores.allowed[:, rows, safe_cols].to(seen.device, torch.bool)
    weights = torch.exp(logits - torch.where(torch.isfinite(normaliser), normaliser, 0.0))
    return torch.where(seen, weights, torch.zeros((), device=weights.device))


def _visible_pairs(scores: Scores, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``(B, n)``: whether query ``rows[n]`` sees key ``cols[n]`` under the described mask."""
    start = torch.tensor(scores.starts(), device=cols.device)[:, None]
    stop = torch.tensor(scores.stops(), device=cols.device)[:, None]
    seen = (cols[None] >= start) & (cols[None] < stop)
    if scores.causal:
        seen = seen & (cols - rows <= scores.offset)[None]
    if scores.window:
        seen = seen & (cols - rows > scores.offset - scores.window)[None]
    return seen


HEAD_STATISTICS = HEADS_TABLE


def head_statistics(scores: Scores, heads: Sequence[int] | None = None, backend: str | None = None
                    ) -> dict[str, torch.Tensor]:
    """The heads table's statistics ``{name: (B, heads)}`` float32, each a mean over queries
    (``models.core.head_statistics`` defines them): entropy (bits), mean distance (tokens), the
    weight on the first key, on the previous position (queries 1.. only) and on the query's own
    position (queries that have one among the keys)."""
    heads = list(range(scores.heads)) if heads is None else [int(h) for h in heads]
    passed = row_pass(scores, heads, statistics=True, backend=backend)
    device = scores.device
    rows = torch.arange(scores.queries, device=device)
    first, previous, diagonal = [], [], []
    for slot, head in enumerate(heads):
        normaliser = passed.normaliser[:, slot]
        first.append(pointwise(scores, head, rows, torch.zeros_like(rows), normaliser).mean(-1))
        has_previous = (rows >= 1) & (rows - 1 < scores.keys)
        values = pointwise(scores, head, rows[has_previous], rows[has_previous] - 1, normaliser[:, has_previous])
        previous.append(values.mean(-1) if values.shape[-1] else torch.zeros(scores.batch, device=device))
        on_diagonal = rows < scores.keys
        values = pointwise(scores, head, rows[on_diagonal], rows[on_diagonal], normaliser[:, on_diagonal])
        diagonal.append(values.mean(-1) if values.shape[-1] else torch.zeros(scores.batch, device=device))
    return {"entropy_bits": passed.entropy_bits.mean(-1), "mean_distance": passed.distance.mean(-1),
            "first_token": torch.stack(first, 1), "previous_token": torch.stack(previous, 1),
            "diagonal": torch.stack(diagonal, 1)}


# --- the reference every backend is tested against -----------------------------------------------------------------

def reference(scores: Scores) -> torch.Tensor:
    """The dense float64 weights ``(B, H, Q, K)`` on the CPU: small inputs only (tests)."""
    query = scores.query.detach().to("cpu", torch.float64)
    key = scores.key.detach().to("cpu", torch.float64).repeat_interleave(scores.group, dim=1)
    logits = torch.matmul(query, key.transpose(-1, -2)) * scores.scaling  # (B, H, Q, K)
    if scores.softcap:
        logits = torch.tanh(logits / scores.softcap) * scores.softcap
    rows = torch.arange(scores.queries)
    cols = torch.arange(scores.keys)
    if scores.relative_bias is not None:
        logits = logits + scores.relative_bias.detach().to("cpu", torch.float64)[..., cols[None, :] - rows[:, None]
                                                                                  + scores.queries - 1]
    if scores.bias is not None:
        logits = logits + scores.bias.detach().to("cpu", torch.float64)
    seen = scores.visible(rows.to(scores.device), cols.to(scores.device)).cpu()[:, None]  # (B, 1, Q, K)
    logits = logits.masked_fill(~seen, float("-inf"))
    if scores.sink is not None:  # one more logit per row in the denominator, dropped after the softmax
        sink = scores.sink.detach().to("cpu", torch.float64)[None, :, None, None].expand(*logits.shape[:3], 1)
        return torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
    weights = torch.softmax(logits, dim=-1)
    return torch.nan_to_num(weights, nan=0.0)  # a row that sees nothing: all 0


def sink_shares(scores: Scores, heads: Sequence[int], rows: tuple[int, int] | None = None,
                backend: str | None = None) -> torch.Tensor | None:
    """``(B, heads, R)`` float32: the share of each row that went to the head's sink (None without sinks)."""
    if scores.sink is None:
        return None
    passed = row_pass(scores, heads, rows, backend=backend)
    sink = scores.sink.to(passed.normaliser.device, torch.float32)[torch.as_tensor(list(heads)).long()]
    return torch.exp(sink[None, :, None] - passed.normaliser)


def uniform_edges(start: int, stop: int, size: int) -> list[int]:
    """Edges of tiles of ``size`` positions from ``start`` to ``stop`` (the last tile may be shorter)."""
    return list(range(start, stop, max(1, size))) + [stop]


def pyramid_tile(span: int, pixels: int) -> int:
    """The tile side of a pyramid level showing ``span`` positions in at most ``pixels`` pixels: the smallest power
    of two ``f`` with ``span / f <= pixels`` (1 = single cells). Powers of two make every level's tiles unions of
    the finer levels' tiles, and keep the kernel's blocks aligned with them."""
    return 1 << max(0, math.ceil(math.log2(max(1.0, span / max(1, pixels)))))
