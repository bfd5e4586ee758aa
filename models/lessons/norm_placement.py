"""Where the LayerNorm sits in a Transformer block, and what that does to the gradients at initialisation
(Xiong et al. 2020, "On Layer Normalization in the Transformer Architecture", Fig. 3 and Theorem 1).

    Post-LN (Vaswani et al. 2017, BERT):   x_{l+½} = LN(x_l + Attn(x_l)),       x_{l+1} = LN(x_{l+½} + FFN(x_{l+½}))
    Pre-LN  (GPT-2, ViT, Llama with RMSNorm): x_{l+½} = x_l + Attn(LN(x_l)),   x_{l+1} = x_{l+½} + FFN(LN(x_{l+½}))
                                            and one final LN before the output layer

At Xavier initialisation the gradient of the last layers' weights is large in Post-LN and does not shrink with
depth, so a large learning rate is unstable until the weights settle: deep Post-LN needs learning-rate warm-up.
In Pre-LN the residual path passes gradients through unnormalised and each layer's gradient scales like 1/√L
(Theorem 1), the same at every layer, so training can start at the full learning rate.

A small stack is built here with its own weights (seeded, Xavier-uniform, float64), run on random tokens with a
causal language-modelling loss, and every layer's gradient norm read after one backward pass.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

PLACEMENTS = {"post": "Post-LN (norm after the residual add)", "pre": "Pre-LN (norm before each sub-layer)"}
PARAMETERS = {"ffn_w2": "FFN W₂ (the figure's)", "ffn_w1": "FFN W₁", "attention": "attention W_Q, W_K, W_V, W_O",
              "layer": "whole layer"}


@dataclass(frozen=True)
class StackConfig:
    """The stack whose gradients are measured: the model's sizes, and the random batch (``batch``, ``length``)."""

    layers: int = 12  # deep enough for Post-LN's rise towards the top to show
    d_model: int = 128  # small enough to recompute live on a laptop (about a second per placement)
    heads: int = 4
    d_ff: int = 512  # 4 × d_model, as in the paper
    vocab: int = 256
    length: int = 32
    batch: int = 8
    seed: int = 0

    def __post_init__(self):
        if not 1 <= self.layers <= 48:
            raise ValueError(f"the stack must have 1..48 layers (got {self.layers})")
        if self.d_model % self.heads:
            raise ValueError(f"d_model = {self.d_model} must be a multiple of the {self.heads} heads")


class Block(nn.Module):
    """One Transformer block (causal self-attention, then a ReLU FFN) with its LayerNorms placed by ``placement``."""

    def __init__(self, config: StackConfig, placement: str):
        super().__init__()
        if placement not in PLACEMENTS:
            raise ValueError(f"unknown placement {placement!r}; use one of {', '.join(PLACEMENTS)}")
        self.placement, self.heads = placement, config.heads
        d = config.d_model
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.w1 = nn.Linear(d, config.d_ff)
        self.w2 = nn.Linear(config.d_ff, d)
        self.norm_attention = nn.LayerNorm(d)
        self.norm_ffn = nn.LayerNorm(d)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        return self.out(y.transpose(1, 2).reshape(B, T, C))

    def ffn(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.relu(self.w1(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.placement == "post":
            x = self.norm_attention(x + self.attention(x))
            return self.norm_ffn(x + self.ffn(x))
        x = x + self.attention(self.norm_attention(x))
        return x + self.ffn(self.norm_ffn(x))


class Stack(nn.Module):
    """Token embedding → ``layers`` blocks → (Pre-LN: a final LayerNorm) → output layer over the vocabulary."""

    def __init__(self, config: StackConfig, placement: str):
        super().__init__()
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(config.seed)
        try:
            self.embed = nn.Embedding(config.vocab, config.d_model)
            self.blocks = nn.ModuleList(Block(config, placement) for _ in range(config.layers))
            self.final_norm = nn.LayerNorm(config.d_model) if placement == "pre" else nn.Identity()
            self.head = nn.Linear(config.d_model, config.vocab)
            for module in self.modules():  # the paper's analysis: Xavier weights, zero biases
                if isinstance(module, nn.Linear):
                    nn.init.xavier_uniform_(module.weight)
                    nn.init.zeros_(module.bias)
            nn.init.normal_(self.embed.weight, std=config.d_model ** -0.5)
        finally:
            torch.random.set_rng_state(generator_state)
        self.double()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) * math.sqrt(self.embed.embedding_dim)  # (B, T, d): unit-variance rows
        for block in self.blocks:
            x = block(x)
        return self.head(self.final_norm(x))  # (B, T, vocab)


def batch(config: StackConfig) -> torch.Tensor:
    """Seeded random tokens ``(batch, length + 1)``: inputs are [:, :-1], next-token targets [:, 1:]."""
    generator = torch.Generator().manual_seed(config.seed + 1)
    return torch.randint(0, config.vocab, (config.batch, config.length + 1), generator=generator)


def language_model_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def layer_parameters(block: Block) -> dict[str, list[torch.Tensor]]:
    """The weight matrices of one block, grouped as ``PARAMETERS`` names them (biases and norms left out)."""
    groups = {"ffn_w2": [block.w2.weight], "ffn_w1": [block.w1.weight],
              "attention": [block.qkv.weight, block.out.weight]}
    groups["layer"] = [p for name in ("attention", "ffn_w1", "ffn_w2") for p in groups[name]]
    return groups


def gradient_norms(config: StackConfig, placement: str) -> dict[str, np.ndarray]:
    """Frobenius norm of the loss gradient of each layer's weights at initialisation, per ``PARAMETERS`` group:
    ``{group: (layers,)}``, plus ``loss`` (a 1-element array)."""
    model = Stack(config, placement)
    loss = language_model_loss(model, batch(config))
    loss.backward()
    out = {name: [] for name in PARAMETERS}
    for block in model.blocks:
        for name, params in layer_parameters(block).items():
            out[name].append(math.sqrt(sum(float((p.grad ** 2).sum()) for p in params)))
    return {**{name: np.asarray(values) for name, values in out.items()}, "loss": np.asarray([float(loss.detach())])}


def averaged_gradient_norms(config: StackConfig, placement: str, seeds: int = 3) -> dict[str, np.ndarray]:
    """``gradient_norms`` averaged over ``seeds`` seeded stacks and batches (seed, seed + 1, …): the figure is about
    expectations, one initialisation is noisy."""
    runs = [gradient_norms(StackConfig(**{**config.__dict__, "seed": config.seed + s}), placement)
            for s in range(seeds)]
    return {name: np.mean([run[name] for run in runs], axis=0) for name in runs[0]}


def last_layer_gradient_by_depth(config: StackConfig, depths: tuple[int, ...] = (2, 4, 8, 16),
                                 group: str = "ffn_w2", seeds: int = 1) -> dict[str, np.ndarray]:
    """The gradient norm of the last layer's ``group`` weights against the stack's depth, per placement:
    ``{"depth": (len,), "post": (len,), "pre": (len,)}``. Theorem 1: Post-LN's stays put, Pre-LN's falls like 1/√L."""
    if group not in PARAMETERS:
        raise ValueError(f"unknown parameter group {group!r}; use one of {', '.join(PARAMETERS)}")
    out = {"depth": np.asarray(depths)}
    for placement in PLACEMENTS:
        out[placement] = np.asarray([
            averaged_gradient_norms(StackConfig(**{**config.__dict__, "layers": depth}), placement, seeds)[group][-1]
            for depth in depths])
    return out


# What the page's table says about each placement (Xiong et al. 2020 §3; the models as their code places the norm)
PLACEMENT_TABLE = {
    "placement": ["Post-LN", "Pre-LN"],
    "one block": ["x ← LN(x + Attn(x));  x ← LN(x + FFN(x))",
                  "x ← x + Attn(LN(x));  x ← x + FFN(LN(x));  LN at the end"],
    "the residual path": ["goes through every LN: each rescales the gradient",
                          "untouched from output to input: an identity highway"],
    "used by": ["the original Transformer, BERT, RoBERTa, Marian",
                "GPT-2/3, ViT, DINOv2, T5 and Llama/SmolLM2 (RMSNorm)"],
    "gradient at init": ["largest in the top layers, does not shrink with depth",
                         "no larger at the top; every layer's shrinks like 1/√L"],
    "learning rate": ["needs warm-up (a large step on the top layers diverges)", "full rate from step 0 works"],
}


@dataclass(frozen=True)
class PlacementGradients:
    """What the Pre-LN vs Post-LN view draws: per placement, each layer's gradient norms (averaged over seeds) and the
    last layer's against the stack's depth."""

    norms: dict  # placement -> (group -> (layers,) float64, and "loss")
    depth: dict  # "depth" -> (D,), and placement -> (D,)


def placement_gradients(loaded, result, options) -> PlacementGradients:
    """The view's analysis (``options``: layers, d_model, group, seeds, seed): seeded stacks in each placement, one
    backward pass each; the depth sweep on a smaller batch (deep stacks are the slow part, one seed shows the trend).
    ``loaded`` and ``result`` are unused (the lesson builds its own small stacks)."""
    if options.group not in PARAMETERS:
        raise ValueError(f"unknown parameter group {options.group!r}; use one of {', '.join(PARAMETERS)}")
    if not 1 <= options.seeds <= 8:
        raise ValueError(f"average over 1..8 seeds (got {options.seeds})")
    config = StackConfig(layers=options.layers, d_model=options.d_model, d_ff=4 * options.d_model, seed=options.seed)
    norms = {p: averaged_gradient_norms(config, p, options.seeds) for p in PLACEMENTS}
    depth = last_layer_gradient_by_depth(replace(config, batch=4, length=16), group=options.group)
    return PlacementGradients(norms, depth)
