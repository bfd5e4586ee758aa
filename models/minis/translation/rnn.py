"""GRU encoder–decoder translators, with and without additive attention.

- With attention: Bahdanau, Cho & Bengio (2015), "Neural Machine Translation by Jointly Learning to Align and
  Translate", eqs. 5–6 and appendix A. A bidirectional GRU encodes the source into annotations h_i = [→h_i; ←h_i];
  at output step t the decoder scores every annotation against its previous state,
  e_ti = v_aᵀ tanh(W_a s_{t-1} + U_a h_i), normalises a_t = softmax(e_t) over source positions, reads the context
  c_t = Σ_i a_ti h_i, and updates s_t = GRU([E y_{t-1}; c_t], s_{t-1}).
- Without attention: the RNN Encoder–Decoder of Cho et al. (2014): one fixed context c = [→h_S; ←h_1] summarises
  the whole source and is fed to every decoder step, which is the bottleneck that long sentences expose.

Both predict y_t from a deep output layer over [s_t; c_t; E y_{t-1}]. The decoder starts from ``<pad>`` (as Marian
does), so the same tokenizer and data code serve the Transformer and the GRUs.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn


@dataclass
class GRUConfig:
    vocab_size: int
    embed_dim: int = 128  # shared source/target embedding: the vocabulary is shared, so is the table
    hidden_dim: int = 192  # per direction in the encoder; the decoder state has the same size
    attention_dim: int = 128  # width of the additive scoring layer (n' in Bahdanau et al., appendix A)
    attention: bool = True  # False: fixed context vector (Cho et al. 2014)
    dropout: float = 0.1
    pad_token_id: int = 0
    eos_token_id: int = 1
    decoder_start_token_id: int = 0

    def to_dict(self) -> dict:
        return {"model_type": "gru_translator", **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict) -> "GRUConfig":
        fields = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in fields})


class AdditiveAttention(nn.Module):
    """e_ti = v_aᵀ tanh(W_a s + U_a h_i); a = softmax(e) over unmasked source positions; c = Σ a_i h_i."""

    def __init__(self, query_dim: int, key_dim: int, attention_dim: int):
        super().__init__()
        self.query_proj = nn.Linear(query_dim, attention_dim, bias=False)  # W_a
        self.key_proj = nn.Linear(key_dim, attention_dim)  # U_a (its bias is the scoring layer's bias)
        self.score = nn.Linear(attention_dim, 1, bias=False)  # v_a

    def forward(self, state: torch.Tensor, keys: torch.Tensor, projected_keys: torch.Tensor,
                source_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """state (B, n) = s_{t-1}; keys (B, S, 2n) = h; projected_keys (B, S, n') = U_a h (computed once per
        sentence); source_mask (B, S) bool, True for real tokens. Returns context (B, 2n) and weights (B, S)."""
        energies = self.score(torch.tanh(self.query_proj(state)[:, None, :] + projected_keys)).squeeze(-1)  # (B, S)
        energies = energies.masked_fill(~source_mask, float("-inf"))
        weights = torch.softmax(energies, dim=-1)  # (B, S), rows sum to 1 over real source tokens
        context = torch.bmm(weights[:, None, :], keys).squeeze(1)  # (B, 2n)
        return context, weights


class GRUTranslator(nn.Module):
    def __init__(self, config: GRUConfig):
        super().__init__()
        self.config = config
        n, e = config.hidden_dim, config.embed_dim
        self.embedding = nn.Embedding(config.vocab_size, e, padding_idx=config.pad_token_id)
        self.encoder = nn.GRU(e, n, batch_first=True, bidirectional=True)
        self.init_state = nn.Linear(2 * n, n)  # s_0 = tanh(W_s [→h_S; ←h_1])
        self.attention = AdditiveAttention(n, 2 * n, config.attention_dim) if config.attention else None
        self.decoder = nn.GRU(e + 2 * n, n, batch_first=True)  # run one step at a time when attending
        self.deep_output = nn.Linear(n + 2 * n + e, e)  # t_i in Bahdanau et al., appendix A.2.2
        self.output = nn.Linear(e, config.vocab_size)
        self.dropout = nn.Dropout(config.dropout)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        """input_ids (B, S) -> annotations (B, S, 2n), fixed summary (B, 2n), first decoder state (B, n)."""
        lengths = attention_mask.sum(-1)
        embedded = self.dropout(self.embedding(input_ids))  # (B, S, e)
        packed = nn.utils.rnn.pack_padded_sequence(embedded, lengths.cpu(), batch_first=True, enforce_sorted=False)
        packed_out, final = self.encoder(packed)  # final (2, B, n): last forward state, first backward state
        annotations, _ = nn.utils.rnn.pad_packed_sequence(packed_out, batch_first=True,
                                                          total_length=input_ids.shape[1])  # (B, S, 2n)
        summary = torch.cat([final[0], final[1]], dim=-1)  # (B, 2n) = [→h_S; ←h_1]
        return annotations, summary, torch.tanh(self.init_state(summary))

    def step(self, previous_token: torch.Tensor, state: torch.Tensor, annotations: torch.Tensor,
             projected: torch.Tensor | None, summary: torch.Tensor, source_mask: torch.Tensor):
        """One decoder step. previous_token (B,), state (B, n) = s_{t-1}.

        Returns log-probabilities (B, vocab) of y_t, the new state s_t (B, n) and the attention weights a_t (B, S)
        (None without attention)."""
        embedded = self.embedding(previous_token)  # (B, e)
        if self.attention is not None:
            context, weights = self.attention(state, annotations, projected, source_mask)  # from s_{t-1}
        else:
            context, weights = summary, None
        state = self._decode_one(torch.cat([embedded, context], dim=-1), state)  # (B, n)
        logits = self.readout(state, context, embedded)
        return torch.log_softmax(logits, dim=-1), state, weights

    def _decode_one(self, inputs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """s_t = GRU(inputs (B, in), s_{t-1} (B, n)) -> (B, n)."""
        out, _ = self.decoder(inputs[:, None, :], state[None])
        return out[:, 0]

    def readout(self, state: torch.Tensor, context: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        """Deep output: logits (..., vocab) from s_t (..., n), c_t (..., 2n) and E y_{t-1} (..., e)."""
        hidden = torch.tanh(self.deep_output(self.dropout(torch.cat([state, context, embedded], dim=-1))))
        return self.output(self.dropout(hidden))

    def start_state(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        """Everything the decoder needs from the source: (annotations, U_a h or None, summary, s_0, mask)."""
        annotations, summary, state = self.encode(input_ids, attention_mask)
        projected = self.attention.key_proj(annotations) if self.attention is not None else None
        return annotations, projected, summary, state, attention_mask.bool()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                decoder_input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Teacher-forced pass. decoder_input_ids (B, T) starts with ``<pad>``.

        Returns logits (B, T, vocab) and attention (B, T, S) — row t is the attention used to produce output
        token t (None for the fixed-context model). The read-out runs once over all steps after the recurrence."""
        annotations, projected, summary, state, source_mask = self.start_state(input_ids, attention_mask)
        embedded = self.dropout(self.embedding(decoder_input_ids))  # (B, T, e)
        steps = decoder_input_ids.shape[1]
        if self.attention is None:  # the context is the same at every step: one cuDNN-style GRU call
            contexts = summary[:, None, :].expand(-1, steps, -1)  # (B, T, 2n)
            states, _ = self.decoder(torch.cat([embedded, contexts], dim=-1), state[None])  # (B, T, n)
            return self.readout(states, contexts, embedded), None
        states, contexts, weights = [], [], []
        for t in range(steps):
            context, a_t = self.attention(state, annotations, projected, source_mask)
            state = self._decode_one(torch.cat([embedded[:, t], context], dim=-1), state)
            states.append(state)
            contexts.append(context)
            weights.append(a_t)
        logits = self.readout(torch.stack(states, 1), torch.stack(contexts, 1), embedded)
        return logits, torch.stack(weights, dim=1)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

