"""Where a windowed, hierarchical model's per-layer matrices live (Swin; built by
models/families/swin/explain.py), and how relevance is carried through them without an (N, N) matrix
per layer: each layer's per-window matrices placed back on its token grid (the cyclic shift undone),
a stage's grid reaching the previous one through its 2 × 2 patch merge, the target reading the mean
of the last stage's tokens."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Layout:
    """Where a windowed, hierarchical model's per-layer matrices live (Swin; built by
    models/families/swin/explain.py).

    Layer ``l`` has ``tokens[l]`` tokens (its stage's grid, row-major) and computes attention in
    ``len(window_ids[l])`` windows: ``window_ids[l]`` (nW, Nw) long holds, for each window position
    as the model saw it (rolled by the cyclic shift, padded), the original token id (-1: padding).
    Recorded tensors hold the windows of the whole batch, ``(B·nW, …)``; item 0 is the first nW.
    ``merges[l]`` (N_l, N_{l-1}) maps the previous layer's grid onto layer l's where a patch merge
    sits between them (1/k for each of the k ≤ 4 tokens merged). The target reads ``readout``
    (N_last,) of the last layer's tokens (global average pooling: 1/N each)."""

    tokens: list[int]
    window_ids: list[torch.Tensor]
    merges: dict[int, torch.Tensor]
    readout: torch.Tensor

    def windows(self, layer: int) -> int:
        return int(self.window_ids[layer].shape[0])

    def to_grid(self, layer: int, windows: torch.Tensor) -> torch.Tensor:
        """Per-window matrices ``(nW, …, Nw, Nw)`` of ``layer`` (as recorded: windows first) ->
        ``(…, N, N)`` over its token grid in original order: entry (i, j) is the window entry of
        tokens i and j when they share a window, else 0 (padding dropped)."""
        windows = windows.movedim(0, -3)  # (…, nW, Nw, Nw)
        ids = self.window_ids[layer].to(windows.device)
        n = self.tokens[layer]
        rows = ids.unsqueeze(-1).expand(*ids.shape, ids.shape[-1])
        cols = ids.unsqueeze(-2).expand(*ids.shape, ids.shape[-1])
        keep = (rows >= 0) & (cols >= 0)
        lead = windows.shape[:-3]
        out = windows.new_zeros(*lead, n * n)
        out[..., rows[keep] * n + cols[keep]] = windows[..., keep]
        return out.view(*lead, n, n)

    def times(self, layer: int, row: torch.Tensor, windows: torch.Tensor, identity: float = 0.0
              ) -> torch.Tensor:
        """``row · (identity · I + to_grid(layer, windows))`` without the (N, N) matrix: row (N,),
        windows (nW, Nw, Nw). Each window's query entries are gathered, multiplied with its map, and
        added back at its keys (what the dense product does, since a token meets only its own
        window)."""
        ids = self.window_ids[layer].to(row.device)
        keep = ids >= 0
        gathered = row.new_zeros(ids.shape)
        gathered[keep] = row[ids[keep]]
        mixed = torch.einsum("wa,wab->wb", gathered, windows.float())  # (nW, Nw)
        return (row * identity).index_add(0, ids[keep], mixed[keep])

    def carry(self, matrices: dict[int, "torch.Tensor | Windowed"],
              start: torch.Tensor | None = None) -> torch.Tensor:
        """The readout row (or ``start`` over the last layer's tokens) through ``matrices[l]`` from
        the last layer down, merges included: ``r · M_L · G_L · … · M_1`` -> (N_0,) over the first
        layer's tokens. ``M_l`` is a dense (N_l, N_l) tensor or ``Windowed`` (per-window maps plus a
        multiple of I); a layer without one passes the row on unchanged."""
        row = (self.readout if start is None else start).float()
        for layer in reversed(range(len(self.tokens))):
            matrix = matrices.get(layer)
            if isinstance(matrix, Windowed):
                row = self.times(layer, row, matrix.windows, matrix.identity)
            elif matrix is not None:
                row = row @ matrix.float()
            if layer in self.merges:
                row = row @ self.merges[layer].to(row.device)
        return row


@dataclass
class Windowed:
    """One layer's matrix ``identity · I + to_grid(windows)`` kept per window (nW, Nw, Nw): Swin-B
    at 384 px has 9,216 first-stage tokens, and its dense matrix would take 340 MB."""

    windows: torch.Tensor
    identity: float = 0.0
