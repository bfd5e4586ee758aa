"""One attention call's scores, described (q and k where they live, the mask as rules), and what the two passes of
``models/core/tiles.py`` return. Shared by its PyTorch path and its Triton kernels (``models/core/tiles_triton.py``),
which import these and nothing else of each other."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Scores:
    """One attention call's scores before the softmax, described: q and k where they live, the mask as rules.

    ``query (B, H, Q, d)`` and ``key (B, H_kv, K, d)`` in any float dtype (bf16, fp16, fp32), ``H % H_kv == 0``.
    Query ``i`` of item ``b`` sees key ``j`` when ``key_start[b] <= j < key_stop[b]``, and ``j <= i + offset`` when
    ``causal``, and ``j > i + offset − window`` when ``window`` (a sliding window of ``window`` keys), and
    ``allowed[b, i, j]`` when a whole mask is given. ``relative_bias (B or 1, H or 1, Q + K − 1)``: a bias that
    depends on ``j − i`` only, at index ``j − i + Q − 1`` (T5's buckets, ALiBi); ``bias (B or 1, H or 1, Q, K)`` one
    given whole. Both are added to ``s`` before the softmax, as SDPA adds them. ``softcap`` ``c > 0`` caps the
    scaled product first, ``c · tanh(q·k · scaling / c)`` (Gemma 2's attention logit soft-capping, applied before
    the mask and bias as its eager attention does). ``sink (H,)``: a learned logit per query head that joins every
    row's softmax denominator and takes its share of the row (gpt-oss's attention sinks), so the keys' weights sum
    to one minus that share.
    """

    query: torch.Tensor
    key: torch.Tensor
    scaling: float
    causal: bool = False
    offset: int = 0
    window: int = 0  # 0: none
    key_start: tuple[int, ...] = ()  # per batch item; () = every item starts at key 0
    key_stop: tuple[int, ...] = ()  # per batch item; () = every item ends at its last key
    allowed: torch.Tensor | None = None
    relative_bias: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    softcap: float = 0.0  # 0: none
    sink: torch.Tensor | None = None  # (H,) float32 on the scores' device

    def __post_init__(self):
        if self.query.dim() != 4 or self.key.dim() != 4:
            raise ValueError(f"query and key must be (batch, heads, tokens, head_dim); got {tuple(self.query.shape)} "
                             f"and {tuple(self.key.shape)}")
        if self.heads % self.kv_heads:
            raise ValueError(f"{self.heads} query heads cannot share {self.kv_heads} key heads")

    @property
    def batch(self) -> int:
        return self.query.shape[0]

    @property
    def heads(self) -> int:
        return self.query.shape[1]

    @property
    def kv_heads(self) -> int:
        return self.key.shape[1]

    @property
    def queries(self) -> int:
        return self.query.shape[2]

    @property
    def keys(self) -> int:
        return self.key.shape[2]

    @property
    def device(self) -> torch.device:
        return self.query.device

    @property
    def group(self) -> int:
        """Query heads per key head (grouped-query attention)."""
        return self.heads // self.kv_heads

    def starts(self) -> list[int]:
        return list(self.key_start) if self.key_start else [0] * self.batch

    def stops(self) -> list[int]:
        return [min(stop, self.keys) for stop in self.key_stop] if self.key_stop else [self.keys] * self.batch

    def described(self) -> bool:
        """True when nothing is given whole (what the fused kernel takes)."""
        return self.allowed is None and self.bias is None

    def key_span(self, row_start: int, row_stop: int) -> tuple[int, int]:
        """``[lo, hi)``: the keys that some query in ``row_start:row_stop`` of some item may see."""
        lo, hi = min(self.starts()), max(self.stops())
        if self.causal:
            hi = min(hi, row_stop - 1 + self.offset + 1)
        if self.window:
            lo = max(lo, row_start + self.offset - self.window + 1)
        return lo, max(lo, hi)

    def visible(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """Boolean ``(B, r, c)`` for query positions ``rows (r,)`` and key positions ``cols (c,)``: True = seen.
        Contiguous ranges (every chunk) cost one byte a cell; the rules are applied as triangles, not as an
        ``(r, c)`` array of differences."""
        start = torch.tensor(self.starts(), device=cols.device)[:, None, None]
        stop = torch.tensor(self.stops(), device=cols.device)[:, None, None]
        seen = (cols[None, None, :] >= start) & (cols[None, None, :] < stop)  # (B, 1, c)
        if self.causal or self.window:
            contiguous = len(rows) and len(cols) and int(rows[-1] - rows[0]) == len(rows) - 1 and \
                int(cols[-1] - cols[0]) == len(cols) - 1
            if contiguous:  # j − i <= offset  <=>  j' <= i' + (r0 + offset − c0), in chunk coordinates
                shift = int(rows[0]) + self.offset - int(cols[0])
                band = torch.ones(len(rows), len(cols), dtype=torch.bool, device=cols.device)
                if self.causal:
                    band.tril_(shift)
                if self.window:
                    band.triu_(shift - self.window + 1)
            else:
                relative = cols[None, :] - rows[:, None]  # (r, c): j − i
                band = torch.ones(len(rows), len(cols), dtype=torch.bool, device=cols.device)
                if self.causal:
                    band &= relative <= self.offset
                if self.window:
                    band &= relative > self.offset - self.window
            seen = seen & band[None]
        seen = seen.expand(self.batch, len(rows), len(cols))
        if self.allowed is not None:
            block = self.allowed[:, rows][:, :, cols].to(seen.device, torch.bool)
            seen = seen & block
        return seen

    def visible_counts(self, row_start: int, row_stop: int, key_edges: torch.Tensor) -> torch.Tensor | None:
        """``(B, r, tiles)`` float32: how many keys of each key tile (``key_edges``, on the scores' device) each query
        row in ``row_start:row_stop`` sees, by interval arithmetic on the rules (no per-cell work); None when a
        whole mask is given (then cells must be counted)."""
        if self.allowed is not None:
            return None
        rows = torch.arange(row_start, row_stop, device=key_edges.device)[None, :, None]  # (1, r, 1)
        start = torch.tensor(self.starts(), device=key_edges.device)[:, None, None]  # (B, 1, 1)
        stop = torch.tensor(self.stops(), device=key_edges.device)[:, None, None]
        lo = torch.maximum(key_edges[:-1][None, None, :], start)  # (B, 1, T)
        hi = torch.minimum(key_edges[1:][None, None, :], stop)
        if self.causal:
            hi = torch.minimum(hi, rows + self.offset + 1)  # (B, r, T)
        if self.window:
            lo = torch.maximum(lo, rows + self.offset - self.window + 1)
        return (hi - lo).clamp_min_(0).float().expand(self.batch, row_stop - row_start, len(key_edges) - 1)

    def scores(self, head: int, row_start: int, row_stop: int, col_start: int, col_stop: int,
               key_float: torch.Tensor | None = None) -> torch.Tensor:
        """float32 ``(B, r, c)`` scores of query head ``head`` for rows and keys in the given ranges, ``−inf`` where
        masked. ``key_float``: this head's keys already in float32 ``(B, K, d)`` (saves converting per chunk)."""
        keys = key_float if key_float is not None else self.key[:, head // self.group].float()
        query = self.query[:, head, row_start:row_stop].float()  # (B, r, d)
        scores = torch.matmul(query, keys[:, col_start:col_stop].transpose(1, 2))  # (B, r, c)
        scores.mul_(self.scaling)
        if self.softcap:
            scores.div_(self.softcap).tanh_().mul_(self.softcap)
        rows = torch.arange(row_start, row_stop, device=scores.device)
        cols = torch.arange(col_start, col_stop, device=scores.device)
        if self.relative_bias is not None:
            bias = self.relative_bias[:, head if self.relative_bias.shape[1] > 1 else 0]  # (B or 1, Q + K − 1)
            index = cols[None, :] - rows[:, None] + self.queries - 1  # (r, c)
            scores.add_(bias[:, index].to(scores.device, torch.float32))
        if self.bias is not None:
            bias = self.bias[:, head if self.bias.shape[1] > 1 else 0, row_start:row_stop, col_start:col_stop]
            scores.add_(bias.to(scores.device, torch.float32))
        scores.masked_fill_(~self.visible(rows, cols), float("-inf"))
        return scores

    def normaliser(self, logits: torch.Tensor, head: int) -> torch.Tensor:
        """Each row's log-sum-exp ``(B, r, 1)`` from its logits ``(B, r, c)`` over every key it sees, with the
        head's sink in the denominator when there is one; −inf for a row that sees nothing (and has no sink)."""
        normaliser = torch.logsumexp(logits, dim=-1, keepdim=True)
        if self.sink is not None:
            normaliser = torch.logaddexp(normaliser, self.sink[head].to(normaliser.device, torch.float32))
        return normaliser

    def sink_logit(self, head: int) -> float | None:
        return None if self.sink is None else float(self.sink[head])




@dataclass(frozen=True)
class RowPass:
    """Per query row of ``rows``, for each chosen head: ``(B, heads, R)`` float32 on the scores' device."""

    rows: tuple[int, int]
    normaliser: torch.Tensor  # L_i, natural log; −inf for a row that sees no key
    row_max: torch.Tensor  # the row's largest weight (0 for a row that sees no key)
    entropy_bits: torch.Tensor | None = None  # −Σ p log₂ p
    distance: torch.Tensor | None = None  # Σ p |i − j|, tokens



@dataclass(frozen=True)
class TilePass:
    """A window reduced to tiles, for each output: ``(B, outputs, TQ, TK)`` float32 on the scores' device."""

    query_edges: torch.Tensor  # (TQ + 1,) int64 on the CPU: tile t covers queries edges[t]:edges[t + 1]
    key_edges: torch.Tensor  # (TK + 1,)
    maximum: torch.Tensor  # the tile's largest weight (0 where nothing is visible)
    total: torch.Tensor  # the sum of its weights
    visible: torch.Tensor  # how many of its cells are visible
    row_max: torch.Tensor  # (B, outputs, R): each query row's largest weight within the window's keys

    def cells(self) -> torch.Tensor:
        """``(TQ, TK)`` cells per tile (edge tiles are smaller)."""
        return torch.diff(self.query_edges)[:, None] * torch.diff(self.key_edges)[None, :]

