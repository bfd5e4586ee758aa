"""Mozilla Bergamot's "tiny" translation architecture in PyTorch, loaded from Marian's binary format.

What ``special:model.yml`` in the model file says (marian v1.9.56), and what each line becomes here:

- ``type: transformer``, ``enc-depth: 6``, ``transformer-heads: 8``, ``dim-emb: 256``, ``transformer-dim-ffn: 1536``,
  ``transformer-ffn-activation: relu``: six encoder layers of 8-head self-attention and a ReLU FFN;
- ``transformer-postprocess: dan`` (dropout, add, norm) and ``transformer-preprocess: ""``: **post-norm**, each
  sublayer's output added to its input and then layer-normalised (Vaswani et al. 2017's order);
- ``transformer-postprocess-emb: d``: the embeddings are scaled by √d and given sinusoidal positions, not normed;
- ``dec-depth: 2``, ``transformer-decoder-autoreg: rnn``, ``dec-cell: ssru``: two decoder layers whose
  *self-attention is replaced* by a Simpler Simple Recurrent Unit (Kim et al. 2019, "From research to production
  and back: ludicrously fast neural machine translation"): ``f_t = σ(W_f x_t + b_f)``,
  ``c_t = f_t ⊙ c_{t−1} + (1 − f_t) ⊙ W x_t``, ``h_t = ReLU(c_t)``. Each decoder position reads the earlier ones
  only through the cell state, so the decoder has **no self-attention to draw**;
- each decoder layer then has 8-head cross-attention over the encoder output and a ReLU FFN (post-norm as above);
- ``tied-embeddings-all: true``: one 32,000 × 256 matrix embeds source and target words and, transposed, produces
  the logits (plus a bias, ``decoder_ff_logit_out_b``).

Marian starts decoding from an all-zero target embedding (its first step has no previous word), so decoder position
0 is the zero vector plus position 0's sinusoid, whatever id sits there.

Names follow transformers' Marian (``model.encoder.layers[i].self_attn.q_proj``, ``model.decoder.layers[i]
.encoder_attn``, ``lm_head``) and attention runs through the capture function (models/core/capture.py), so the
project's capture, named sites and explanation records work on it as on any transformers encoder–decoder.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import torch
from torch import nn

from models.core import capture

LAYER_NORM_EPS = 1e-6  # marian's transformer layerNorm


@dataclass
class BergamotConfig:
    """The architecture, read from ``special:model.yml`` (``from_marian``); defaults are the tiny model's."""

    vocab_size: int = 32000
    d_model: int = 256
    encoder_layers: int = 6
    decoder_layers: int = 2
    attention_heads: int = 8
    ffn_dim: int = 1536
    eos_token_id: int = 0
    # what the project's shared code reads from a transformers config
    is_encoder_decoder: bool = True
    decoder_start_token_id: int = 0  # any id: position 0 is Marian's zero start embedding whatever it holds
    pad_token_id: int = 0
    _attn_implementation: str = capture.ATTENTION_NAME
    model_type: str = "bergamot"
    hidden_size: int = field(init=False)
    num_attention_heads: int = field(init=False)
    num_hidden_layers: int = field(init=False)

    def __post_init__(self):
        self.hidden_size, self.num_attention_heads = self.d_model, self.attention_heads
        self.num_hidden_layers = self.decoder_layers

    @classmethod
    def from_marian(cls, options: dict, vocab_size: int) -> "BergamotConfig":
        """The config of a Marian ``special:model.yml``; anything this module does not implement is refused."""
        expected = {"type": "transformer", "transformer-decoder-autoreg": "rnn", "dec-cell": "ssru",
                    "transformer-postprocess": "dan", "transformer-preprocess": "",
                    "transformer-postprocess-emb": "d", "transformer-ffn-activation": "relu",
                    "transformer-ffn-depth": 2, "tied-embeddings-all": True,
                    "transformer-train-position-embeddings": False}
        different = {k: options.get(k) for k, v in expected.items() if options.get(k, v) != v}
        if different:
            raise ValueError(f"this Marian model is not the Bergamot tiny architecture this loader implements: "
                             f"{different} (expected {[expected[k] for k in different]})")
        return cls(vocab_size=vocab_size, d_model=int(options["dim-emb"]), encoder_layers=int(options["enc-depth"]),
                   decoder_layers=int(options["dec-depth"]), attention_heads=int(options["transformer-heads"]),
                   ffn_dim=int(options["transformer-dim-ffn"]))


POSITIONS_KEPT = 2048  # positions of the signal computed once (a decoder step reads one row)


def sinusoidal_positions(length: int, dim: int, start: int = 0) -> torch.Tensor:
    """Marian's sinusoidal position signal ``(length, dim)``: sines in the first half, cosines in the second, with
    timescales ``10000^(i / (dim/2 − 1))`` (tensor2tensor's; transformers' Marian uses ``10000^(2i / dim)``)."""
    if start + length <= POSITIONS_KEPT:
        return _position_table(dim)[start:start + length]
    return _signal(length, dim, start)


@functools.cache
def _position_table(dim: int) -> torch.Tensor:
    return _signal(POSITIONS_KEPT, dim, 0)


def _signal(length: int, dim: int, start: int) -> torch.Tensor:
    half = dim // 2
    increment = math.log(10000.0) / (half - 1)
    inverse = torch.exp(torch.arange(half, dtype=torch.float64) * -increment)
    angles = torch.arange(start, start + length, dtype=torch.float64)[:, None] * inverse[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=-1).float()


class Attention(nn.Module):
    """Multi-head attention through the capture function: ``(B, T, D)`` queries over ``(B, S, D)`` keys/values."""

    is_causal = False  # neither the encoder's self-attention nor the cross-attention is masked

    def __init__(self, d_model: int, heads: int, is_cross_attention: bool):
        super().__init__()
        self.heads, self.head_dim = heads, d_model // heads
        self.is_cross_attention = is_cross_attention  # capture.Recorder.kind_of reads it
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def keys_values(self, source: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, S, D) -> key, value (B, H, S, d): what a decoder reuses at every step."""
        batch, length, _ = source.shape
        split = lambda x: x.view(batch, length, self.heads, self.head_dim).transpose(1, 2)  # noqa: E731
        return split(self.k_proj(source)), split(self.v_proj(source))

    def forward(self, hidden: torch.Tensor, source: torch.Tensor | None = None,
                cached: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        batch, length, d_model = hidden.shape
        query = self.q_proj(hidden).view(batch, length, self.heads, self.head_dim).transpose(1, 2)  # (B, H, T, d)
        key, value = cached if cached is not None else self.keys_values(hidden if source is None else source)
        output, _ = capture.capture_attention_forward(self, query, key, value, None, dropout=0.0,
                                                      scaling=self.head_dim ** -0.5, is_causal=False)
        return self.out_proj(output.reshape(batch, length, d_model))  # output (B, T, H, d)


class FeedForward(nn.Module):
    def __init__(self, d_model: int, ffn_dim: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d_model, ffn_dim), nn.Linear(ffn_dim, d_model)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(hidden)))


class EncoderLayer(nn.Module):
    """Post-norm: ``x = LN(x + SelfAttention(x))``, ``x = LN(x + FFN(x))``."""

    def __init__(self, config: BergamotConfig):
        super().__init__()
        d = config.d_model
        self.self_attn = Attention(d, config.attention_heads, is_cross_attention=False)
        self.self_attn_layer_norm = nn.LayerNorm(d, eps=LAYER_NORM_EPS)
        self.ffn = FeedForward(d, config.ffn_dim)
        self.final_layer_norm = nn.LayerNorm(d, eps=LAYER_NORM_EPS)

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor]:
        hidden = self.self_attn_layer_norm(hidden + self.self_attn(hidden))
        return (self.final_layer_norm(hidden + self.ffn(hidden)),)


class SSRU(nn.Module):
    """The Simpler Simple Recurrent Unit (Kim et al. 2019): ``f_t = σ(W_f x_t + b_f)``,
    ``c_t = f_t ⊙ c_{t−1} + (1 − f_t) ⊙ W x_t``, ``h_t = ReLU(c_t)``; ``c_0 = 0``."""

    def __init__(self, d_model: int):
        super().__init__()
        self.W = nn.Linear(d_model, d_model, bias=False)
        self.Wf = nn.Linear(d_model, d_model)

    def forward(self, inputs: torch.Tensor, state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """inputs (B, T, D), state (B, D) or None -> (outputs (B, T, D), the last cell state (B, D))."""
        candidate, forget = self.W(inputs), torch.sigmoid(self.Wf(inputs))
        cell = torch.zeros_like(candidate[:, 0]) if state is None else state
        outputs = []
        for t in range(inputs.shape[1]):
            cell = forget[:, t] * cell + (1 - forget[:, t]) * candidate[:, t]
            outputs.append(torch.relu(cell))
        return torch.stack(outputs, dim=1), cell


class DecoderLayer(nn.Module):
    """Post-norm: ``x = LN(x + SSRU(x))``, ``x = LN(x + CrossAttention(x, encoder))``, ``x = LN(x + FFN(x))``."""

    def __init__(self, config: BergamotConfig):
        super().__init__()
        d = config.d_model
        self.rnn = SSRU(d)
        self.rnn_layer_norm = nn.LayerNorm(d, eps=LAYER_NORM_EPS)
        self.encoder_attn = Attention(d, config.attention_heads, is_cross_attention=True)
        self.encoder_attn_layer_norm = nn.LayerNorm(d, eps=LAYER_NORM_EPS)
        self.ffn = FeedForward(d, config.ffn_dim)
        self.final_layer_norm = nn.LayerNorm(d, eps=LAYER_NORM_EPS)

    def forward(self, hidden: torch.Tensor, encoder_hidden: torch.Tensor, state: torch.Tensor | None = None,
                cached: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (hidden (B, T, D), the SSRU's last cell state (B, D))."""
        recurrent, state = self.rnn(hidden, state)
        hidden = self.rnn_layer_norm(hidden + recurrent)
        hidden = self.encoder_attn_layer_norm(hidden + self.encoder_attn(hidden, encoder_hidden, cached))
        return self.final_layer_norm(hidden + self.ffn(hidden)), state


class Encoder(nn.Module):
    def __init__(self, config: BergamotConfig, embed_tokens: nn.Embedding):
        super().__init__()
        self.embed_tokens = embed_tokens
        self.embed_scale = math.sqrt(config.d_model)
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.encoder_layers))

    def forward(self, input_ids: torch.Tensor | None = None, inputs_embeds: torch.Tensor | None = None,
                output_hidden_states: bool = False, **ignored):
        """inputs_embeds: the scaled embeddings (``embed_tokens(ids) · embed_scale``), before positions."""
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids) * self.embed_scale
        positions = sinusoidal_positions(inputs_embeds.shape[1], inputs_embeds.shape[-1])
        hidden = inputs_embeds + positions.to(inputs_embeds)
        states = [hidden]
        for layer in self.layers:
            hidden = layer(hidden)[0]
            states.append(hidden)
        return SimpleNamespace(last_hidden_state=hidden, hidden_states=tuple(states) if output_hidden_states else None)


class Decoder(nn.Module):
    def __init__(self, config: BergamotConfig, embed_tokens: nn.Embedding):
        super().__init__()
        self.embed_tokens = embed_tokens
        self.embed_scale = math.sqrt(config.d_model)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.decoder_layers))

    def embed(self, decoder_input_ids: torch.Tensor, start: int = 0) -> torch.Tensor:
        """(B, T) ids at positions ``start``… -> (B, T, D): scaled embeddings plus positions; position 0 is
        Marian's zero start embedding whatever id it holds."""
        embedded = self.embed_tokens(decoder_input_ids) * self.embed_scale
        if start == 0:
            embedded = torch.cat([torch.zeros_like(embedded[:, :1]), embedded[:, 1:]], dim=1)
        return embedded + sinusoidal_positions(embedded.shape[1], embedded.shape[-1], start).to(embedded)

    def forward(self, decoder_input_ids: torch.Tensor, encoder_hidden_states: torch.Tensor,
                output_hidden_states: bool = False, **ignored):
        """A teacher-forced forward over the whole target: ``(hidden (B, T, D), hidden states per layer or None)``."""
        hidden = self.embed(decoder_input_ids)
        states = [hidden]
        for layer in self.layers:
            hidden, _ = layer(hidden, encoder_hidden_states)
            states.append(hidden)
        return hidden, tuple(states) if output_hidden_states else None


class BergamotCore(nn.Module):
    def __init__(self, config: BergamotConfig):
        super().__init__()
        self.shared = nn.Embedding(config.vocab_size, config.d_model)
        self.encoder = Encoder(config, self.shared)
        self.decoder = Decoder(config, self.shared)


@dataclass
class DecoderState:
    """What incremental decoding carries between steps, per hypothesis (batch row): each layer's SSRU cell and the
    encoder's keys/values for each cross-attention."""

    cells: list[torch.Tensor | None]
    cross: list[tuple[torch.Tensor, torch.Tensor]]
    encoder_hidden: torch.Tensor
    position: int = 0

    def select(self, rows: torch.Tensor) -> "DecoderState":
        return DecoderState([c[rows] for c in self.cells], [(k[rows], v[rows]) for k, v in self.cross],
                            self.encoder_hidden[rows], self.position)


class BergamotForTranslation(nn.Module):
    """The whole translator: ``forward`` as transformers' seq2seq models take it (teacher-forced), ``start`` and
    ``step`` for incremental decoding. Logits cover the whole vocabulary; the lexical shortlist is applied by the
    search (``models/families/translation/bergamot.py``)."""

    architecture = "transformer-ssru"  # TranslationOutput.architecture: a Transformer encoder, an SSRU decoder

    def __init__(self, config: BergamotConfig):
        super().__init__()
        self.config = config
        self.model = BergamotCore(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.lm_head.weight = self.model.shared.weight  # tied-embeddings-all
        self.register_buffer("final_logits_bias", torch.zeros(1, config.vocab_size))

    @property
    def base_model(self) -> BergamotCore:  # where models.core.hooks looks for the encoder and decoder stacks
        return self.model

    def get_encoder(self) -> Encoder:
        return self.model.encoder

    def get_decoder(self) -> Decoder:
        return self.model.decoder

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.shared

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def logits(self, hidden: torch.Tensor, vocabulary: torch.Tensor | None = None) -> torch.Tensor:
        """hidden (…, D) -> logits (…, V), or (…, len(vocabulary)) over the given word ids only (a shortlist)."""
        if vocabulary is None:
            return self.lm_head(hidden) + self.final_logits_bias[0]
        return hidden @ self.lm_head.weight[vocabulary].T + self.final_logits_bias[0, vocabulary]

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                decoder_input_ids: torch.Tensor | None = None, inputs_embeds: torch.Tensor | None = None,
                output_hidden_states: bool = False, use_cache: bool = False, **ignored):
        """One sentence or a batch of equal-length ones (no padding: ``attention_mask`` must be all ones)."""
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("the Bergamot translator runs unpadded sentences only")
        encoded = self.model.encoder(input_ids=input_ids, inputs_embeds=inputs_embeds,
                                     output_hidden_states=output_hidden_states)
        hidden, states = self.model.decoder(decoder_input_ids, encoded.last_hidden_state, output_hidden_states)
        return SimpleNamespace(logits=self.logits(hidden), decoder_hidden_states=states,
                               encoder_hidden_states=encoded.hidden_states,
                               encoder_last_hidden_state=encoded.last_hidden_state)

    # --- incremental decoding --------------------------------------------------------------------------------------

    def start(self, input_ids: torch.Tensor) -> DecoderState:
        """Encode (B, S) source ids: the state before the first decoder step."""
        encoded = self.model.encoder(input_ids=input_ids).last_hidden_state
        cross = [layer.encoder_attn.keys_values(encoded) for layer in self.model.decoder.layers]
        return DecoderState([None] * len(cross), cross, encoded)

    def step(self, previous: torch.Tensor, state: DecoderState) -> tuple[torch.Tensor, DecoderState]:
        """previous (B,) the last ids (ignored at position 0) -> (the decoder's output (B, D), the next state)."""
        hidden = self.model.decoder.embed(previous[:, None], state.position)
        cells = []
        for layer, cell, cached in zip(self.model.decoder.layers, state.cells, state.cross):
            hidden, cell = layer(hidden, state.encoder_hidden, cell, cached)
            cells.append(cell)
        return hidden[:, 0], DecoderState(cells, state.cross, state.encoder_hidden, state.position + 1)


# --- from the Marian file --------------------------------------------------------------------------------------------

def state_dict_from_marian(items: dict, config: BergamotConfig) -> dict[str, torch.Tensor]:
    """Marian's parameter names and ``x · W`` matrices -> this module's names and ``nn.Linear`` weights
    (``W.T``). Every Marian parameter but the int8 activation multipliers (``*_QuantMultA``, used only by its int8
    kernels) is used exactly once; a missing or unused one raises ValueError."""
    def matrix(name):
        return torch.from_numpy(np.ascontiguousarray(items[name].values.T))

    def vector(name):
        return torch.from_numpy(items[name].values.reshape(-1).copy())

    state = {"model.shared.weight": torch.from_numpy(items["Wemb"].values.copy()),
             "final_logits_bias": torch.from_numpy(items["decoder_ff_logit_out_b"].values.reshape(1, -1).copy())}
    used = {"Wemb", "decoder_ff_logit_out_b"}

    def linear(ours, weight, bias=None):
        state[f"{ours}.weight"] = matrix(weight)
        used.add(weight)
        if bias is not None:
            state[f"{ours}.bias"] = vector(bias)
            used.add(bias)

    def norm(ours, prefix):
        state[f"{ours}.weight"], state[f"{ours}.bias"] = vector(f"{prefix}_ln_scale"), vector(f"{prefix}_ln_bias")
        used.update({f"{prefix}_ln_scale", f"{prefix}_ln_bias"})

    def attention(ours, prefix):
        for part in "qkv":
            linear(f"{ours}.{part}_proj", f"{prefix}_W{part}", f"{prefix}_b{part}")
        linear(f"{ours}.out_proj", f"{prefix}_Wo", f"{prefix}_bo")

    def ffn(ours, prefix):
        linear(f"{ours}.ffn.fc1", f"{prefix}_ffn_W1", f"{prefix}_ffn_b1")
        linear(f"{ours}.ffn.fc2", f"{prefix}_ffn_W2", f"{prefix}_ffn_b2")
        norm(f"{ours}.final_layer_norm", f"{prefix}_ffn_ffn")

    try:
        for i in range(config.encoder_layers):
            ours, prefix = f"model.encoder.layers.{i}", f"encoder_l{i + 1}"
            attention(f"{ours}.self_attn", f"{prefix}_self")
            norm(f"{ours}.self_attn_layer_norm", f"{prefix}_self_Wo")
            ffn(ours, prefix)
        for i in range(config.decoder_layers):
            ours, prefix = f"model.decoder.layers.{i}", f"decoder_l{i + 1}"
            linear(f"{ours}.rnn.W", f"{prefix}_rnn_W")
            linear(f"{ours}.rnn.Wf", f"{prefix}_rnn_Wf", f"{prefix}_rnn_bf")
            norm(f"{ours}.rnn_layer_norm", f"{prefix}_rnn_ffn")
            attention(f"{ours}.encoder_attn", f"{prefix}_context")
            norm(f"{ours}.encoder_attn_layer_norm", f"{prefix}_context_Wo")
            ffn(ours, prefix)
    except KeyError as missing:
        raise ValueError(f"the Marian model file has no parameter {missing}: not the Bergamot tiny "
                         "architecture") from None
    unused = [n for n in items if n not in used and not n.endswith("_QuantMultA") and not n.startswith("special:")]
    if unused:
        raise ValueError(f"the Marian model file has parameters this architecture does not use: {unused[:5]}")
    return state


def from_marian(items: dict) -> BergamotForTranslation:
    """The model of a read Marian file (``marian_binary.read``), float32, in eval mode."""
    from models.families.translation import marian_binary

    options = marian_binary.model_config(items)
    config = BergamotConfig.from_marian(options, vocab_size=int(items["Wemb"].shape[0]))
    model = BergamotForTranslation(config)
    state = state_dict_from_marian(items, config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"}
    missing = [m for m in missing if m not in tied]  # all one matrix: model.shared.weight
    if missing or unexpected:
        raise ValueError(f"the Marian weights do not fit the module: missing {missing[:5]}, unexpected "
                         f"{unexpected[:5]}")
    return model.eval().requires_grad_(False)
