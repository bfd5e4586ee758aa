"""Differentiable attention records for transformers encoders and encoder–decoders (the BERT encoder, Marian/BART
translators), for the shared explanations (models/analysis/attribution.py).

Like ``models/families/causal_lm/explain.py``: inside ``recording`` this thread's attention calls (the ``"capture"`` attention
function, models/core/capture.py) go to an eager softmax kept with its graph (``text_explain.eager_weights``). Each call
fills the ``LayerRecord`` of its module: ``kind`` ``"encoder"`` / ``"decoder"`` (self-attention) or ``"cross"``
(decoder queries, encoder keys), its weights, and its values ``f^h(x_j)`` (``v_j`` through the head's slice of the
attention's output projection); the block input (the residual, for ALTI) comes from a pre-hook on each block.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from models.analysis.attribution import LayerRecord
from models.core import capture
from models.families.causal_lm.explain import (
    eager_weights,
    head_values,
    overriding_with_residuals,
)


@dataclass(frozen=True)
class Site:
    """One attention module of the model, in forward order: its output projection, the block it sits in, its kind."""

    attention: torch.nn.Module
    projection: torch.nn.Module
    block: torch.nn.Module
    kind: str  # "encoder", "decoder" or "cross"


def bert_sites(model) -> list[Site]:
    """A BERT-style encoder (``BertModel``; MiniLM): ``encoder.layer[i].attention.{self, output.dense}``."""
    base = getattr(model, "base_model", model)
    layers = getattr(getattr(base, "encoder", None), "layer", None)
    if layers is None:
        raise ValueError(f"explanations do not know where {type(model).__name__}'s attention layers are (they read "
                         "BERT-style encoders: encoder.layer[i].attention)")
    return [Site(layer.attention.self, layer.attention.output.dense, layer, "encoder") for layer in layers]


def seq2seq_sites(model) -> list[Site]:
    """A BART-style encoder–decoder (Marian, BART, mBART): encoder ``self_attn`` blocks, then each decoder block's
    ``self_attn`` and ``encoder_attn`` (the order the forward calls them)."""
    base = getattr(model, "model", model)
    encoder, decoder = getattr(base, "encoder", None), getattr(base, "decoder", None)
    if encoder is None or decoder is None or not hasattr(encoder, "layers"):
        raise ValueError(f"explanations read BART-style encoder–decoders (Marian, BART); {type(model).__name__} is "
                         "not one")
    sites = [Site(layer.self_attn, layer.self_attn.out_proj, layer, "encoder") for layer in encoder.layers]
    for layer in decoder.layers:
        sites.append(Site(layer.self_attn, layer.self_attn.out_proj, layer, "decoder"))
        sites.append(Site(layer.encoder_attn, layer.encoder_attn.out_proj, layer, "cross"))
    return sites


@contextmanager
def recording(sites: list[Site]):
    """Eager, differentiable attention for this thread's forwards inside the block; yields the list of
    ``LayerRecord`` (one per site, in order) it fills."""
    records = [LayerRecord(kind=site.kind) for site in sites]
    index_of = {id(site.attention): i for i, site in enumerate(sites)}
    owner = threading.get_ident()

    def eager_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
        weights, value = eager_weights(module, query, key, value, attention_mask, scaling, kwargs)
        index = index_of.get(id(module))
        if index is not None:
            record, projection = records[index], sites[index].projection
            record.attention = weights
            record.values_from = lambda: head_values(projection, value)
        return (weights @ value).transpose(1, 2).contiguous(), weights

    blocks = [(site.block, record) for site, record in zip(sites, records) if site.kind != "cross"]
    with overriding_with_residuals(eager_attention, blocks, owner):
        yield records


@contextmanager
def zeroing_values(sites: list[Site], keep: torch.Tensor, kind: str = "cross"):
    """Value zeroing (Mohebbi et al. 2023): inside the block, this thread's attention calls of the ``kind`` sites
    multiply their values by ``keep`` (B, S) over the key positions, so batch row ``b`` has ``v_j = 0`` wherever
    ``keep[b, j] = 0``; the weights are untouched (eager softmax, the same as ``recording``)."""
    chosen = {id(site.attention) for site in sites if site.kind == kind}

    def eager_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
        weights, value = eager_weights(module, query, key, value, attention_mask, scaling, kwargs)
        if id(module) in chosen:
            value = value * keep[:, None, :, None].to(value.dtype)
        return (weights @ value).transpose(1, 2).contiguous(), weights

    with capture.overriding(eager_attention):
        yield
