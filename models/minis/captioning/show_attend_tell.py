"""Show, Attend and Tell (Xu et al. 2015), soft ("deterministic") attention, at the scale of 64 px scenes.

- Encoder: a small CNN turns the image into a grid of ``L = 8 × 8`` annotation vectors ``a_i`` (D = ``feature_dim``),
  the paper's lower convolutional layer (14 × 14 × 512 of VGG there). A learned position embedding is added to each
  cell, so a word such as "left" can be read from where the attention falls (the paper's VGG features carry position
  through padding; ours is explicit).
- Decoder: an LSTM. At step t the attention model ``f_att`` scores every annotation against the previous hidden state,
  ``e_ti = w_aᵀ tanh(W_a a_i + U_a h_{t-1})`` (eq. 4, the additive form of Bahdanau et al.), ``α_t = softmax(e_t)``
  over the L cells (eq. 5), and the context is ``ẑ_t = β_t Σ_i α_ti a_i`` with the gating scalar
  ``β_t = σ(f_β(h_{t-1}))`` (section 4.2.1). The LSTM reads ``[E y_{t-1}; ẑ_t]``; the word probability is the deep
  output ``p(y_t) ∝ exp(L_o(E y_{t-1} + L_h h_t + L_z ẑ_t))`` (eq. 7). ``h_0, c_0`` come from the mean annotation
  through two MLPs ``f_init,h``, ``f_init,c``.
- Training adds the doubly stochastic regulariser ``λ Σ_i (1 − Σ_t α_ti)²`` (eq. 14): every cell gets attention at
  some step, so the maps spread over the image instead of sticking to one cell.

``α_t`` is the map the paper draws under word ``t``: row t of ``forward``'s ``alphas``, the attention used to produce
word t (its input is word t − 1).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn


@dataclass
class ShowAttendTellConfig:
    vocab_size: int
    image_size: int = 64
    grid: int = 8  # annotation grid side: L = grid² cells (stride 8)
    channels: tuple[int, ...] = (32, 64, 96)  # CNN widths: a stem at full resolution, then stride 2 each
    feature_dim: int = 128  # D: annotation vector size
    embed_dim: int = 64  # m: word embedding size
    hidden_dim: int = 256  # n: LSTM size
    attention_dim: int = 128  # width of the additive scoring layer
    dropout: float = 0.1
    doubly_stochastic: float = 1.0  # λ of eq. 14
    pad_token_id: int = 0
    bos_token_id: int = 1
    eos_token_id: int = 2
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)

    def to_dict(self) -> dict:
        return {"model_type": "show_attend_tell", **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict) -> ShowAttendTellConfig:
        fields = cls.__dataclass_fields__
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in fields}
        return cls(**values)


def _conv(in_channels: int, out_channels: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False),
                         nn.GroupNorm(8, out_channels), nn.GELU())


class AdditiveAttention(nn.Module):
    """``f_att``: e_ti = w_aᵀ tanh(W_a a_i + U_a h); α = softmax(e) over the L cells (Xu et al. eq. 4–5)."""

    def __init__(self, feature_dim: int, hidden_dim: int, attention_dim: int):
        super().__init__()
        self.feature_proj = nn.Linear(feature_dim, attention_dim)  # W_a (its bias is the scoring layer's)
        self.hidden_proj = nn.Linear(hidden_dim, attention_dim, bias=False)  # U_a
        self.score = nn.Linear(attention_dim, 1, bias=False)  # w_a

    def forward(self, hidden: torch.Tensor, projected: torch.Tensor) -> torch.Tensor:
        """hidden (B, n) = h_{t-1}; projected (B, L, a) = W_a a_i (once per image) -> α_t (B, L), rows sum to 1."""
        energies = self.score(torch.tanh(projected + self.hidden_proj(hidden)[:, None])).squeeze(-1)  # (B, L)
        return torch.softmax(energies, dim=-1)


class ShowAttendTell(nn.Module):
    def __init__(self, config: ShowAttendTellConfig):
        super().__init__()
        self.config = config
        c, d, n, m = config.channels, config.feature_dim, config.hidden_dim, config.embed_dim
        layers, width = [_conv(3, c[0], 1)], c[0]
        for out in (*c[1:], d):
            layers.append(_conv(width, out, 2))
            width = out
        self.cnn = nn.Sequential(*layers)  # (B, 3, 64, 64) -> (B, D, 8, 8)
        self.position = nn.Parameter(torch.zeros(1, config.grid * config.grid, d))
        nn.init.normal_(self.position, std=0.02)
        self.init_h = nn.Linear(d, n)  # f_init,h
        self.init_c = nn.Linear(d, n)  # f_init,c
        self.attention = AdditiveAttention(d, n, config.attention_dim)
        self.gate = nn.Linear(n, 1)  # f_β
        self.embedding = nn.Embedding(config.vocab_size, m, padding_idx=config.pad_token_id)  # E
        self.lstm = nn.LSTMCell(m + d, n)
        self.out_hidden = nn.Linear(n, m)  # L_h
        self.out_context = nn.Linear(d, m, bias=False)  # L_z
        self.out_words = nn.Linear(m, config.vocab_size)  # L_o
        self.dropout = nn.Dropout(config.dropout)

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels (B, 3, H, W), normalised -> annotations a (B, L, D), row-major over the grid."""
        features = self.cnn(pixels)  # (B, D, grid, grid)
        if features.shape[-2:] != (self.config.grid, self.config.grid):
            raise ValueError(f"the encoder made a {tuple(features.shape[-2:])} grid; it was trained on "
                             f"{self.config.image_size} px images ({self.config.grid} × {self.config.grid} cells)")
        return features.flatten(2).transpose(1, 2) + self.position  # (B, L, D)

    def start(self, annotations: torch.Tensor):
        """Everything the decoder needs from the image: (a, W_a a, h_0, c_0)."""
        mean = annotations.mean(1)  # (B, D)
        return (annotations, self.attention.feature_proj(annotations), torch.tanh(self.init_h(mean)),
                torch.tanh(self.init_c(mean)))

    def step(self, previous: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor], annotations: torch.Tensor,
             projected: torch.Tensor, alpha: torch.Tensor | None = None):
        """One word. previous (B,) = y_{t-1}; state (h, c) each (B, n). Returns logits (B, V), the new state,
        α_t (B, L) and β_t (B,). ``alpha``: α_t given (the attention computed by the caller, so the gradient of the
        word with respect to it can be asked for), else computed from h_{t-1}."""
        hidden, cell = state
        alpha = self.attention(hidden, projected) if alpha is None else alpha  # (B, L)
        beta = torch.sigmoid(self.gate(hidden))  # (B, 1)
        context = beta * torch.bmm(alpha[:, None], annotations).squeeze(1)  # ẑ_t (B, D)
        embedded = self.embedding(previous)  # (B, m)
        hidden, cell = self.lstm(torch.cat([embedded, context], -1), (hidden, cell))
        logits = self.out_words(self.dropout(embedded + self.out_hidden(self.dropout(hidden)) +
                                             self.out_context(context)))  # eq. 7
        return logits, (hidden, cell), alpha, beta.squeeze(-1)

    def forward(self, pixels: torch.Tensor, input_ids: torch.Tensor):
        """Teacher-forced: input_ids (B, T) start with <bos>. Returns logits (B, T, V), α (B, T, L), β (B, T)."""
        annotations, projected, hidden, cell = self.start(self.encode(pixels))
        logits, alphas, betas = [], [], []
        for t in range(input_ids.shape[1]):
            step_logits, (hidden, cell), alpha, beta = self.step(input_ids[:, t], (hidden, cell), annotations,
                                                                 projected)
            logits.append(step_logits)
            alphas.append(alpha)
            betas.append(beta)
        return torch.stack(logits, 1), torch.stack(alphas, 1), torch.stack(betas, 1)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
