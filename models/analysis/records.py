"""Differentiable attention records for the explanation adapters of transformers families (causal LMs, BERT-style
encoders, BART/Marian-style encoder–decoders), read by the shared explanations (models/analysis/attribution.py).

Inside ``recording(model)`` this call's attention (the ``"capture"`` attention function, models/core/capture.py) goes
to an eager softmax kept with its graph (``eager_weights``, grouped key/value heads repeated). Each attention module
the forward calls (``sites.of(model).attention``, in forward order) fills its ``LayerRecord``: ``kind`` ``"self"``
(a decoder-only or encoder-only stack), ``"encoder"`` / ``"decoder"`` (an encoder–decoder's self-attention) or
``"cross"`` (decoder queries, encoder keys), its weights, and its values ``f^h(x_j)`` (``v_j`` through the head's
slice of the output projection, minus the bias); the block input (the residual, for ALTI) comes from a pre-hook on
each block. Both act only for this call (``capture.overriding`` and ``hooks.installed``): other sessions' forwards of
the shared model are untouched.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from models.analysis.attribution import LayerRecord
from models.core import capture, hooks, sites


def head_values(projection: torch.nn.Module, value: torch.Tensor) -> torch.Tensor:
    """value (B, H, N, d) -> (B, H, N, D): each head's values through its own slice of the output projection."""
    batch, heads, n, head_dim = value.shape
    weight = projection.weight
    if isinstance(projection, torch.nn.Linear):  # (D, H·d)
        per_head = weight.reshape(weight.shape[0], heads, head_dim)
    else:  # GPT-2's Conv1D: (H·d, D)
        per_head = weight.T.reshape(weight.shape[1], heads, head_dim)
    return torch.einsum("bhnk,dhk->bhnd", value, per_head)


def eager_weights(module, query, key, value, attention_mask, scaling, kwargs):
    """``softmax(cap(q kᵀ · scaling) + bias + mask)`` with its graph, grouped key/value heads repeated, a sink in
    the denominator where the model has one (``models.core.capture.KEYWORDS``): (weights, value)."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = (query @ key.transpose(-1, -2)).float() * scaling  # (B, H, q, k)
    q_len, k_len = scores.shape[-2:]
    softcap, sink = capture.score_terms(kwargs)
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if kwargs.get("position_bias") is not None:
        scores = scores + kwargs["position_bias"][..., -k_len:].float()
    if attention_mask is not None:
        mask = attention_mask[..., -k_len:]
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.float()
    elif q_len > 1 and kwargs.get("is_causal", getattr(module, "is_causal", True)):
        causal = torch.ones(q_len, k_len, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    if sink is not None:  # one more logit per row in the denominator, dropped after the softmax
        column = sink.float().reshape(1, -1, 1, 1).expand(*scores.shape[:3], 1)
        return torch.cat([scores, column], dim=-1).softmax(-1)[..., :-1].to(query.dtype), value
    return scores.softmax(-1).to(query.dtype), value


def attention_sites(model) -> list[sites.AttentionSite]:
    """Every attention module of ``model`` in forward order, or a ``ValueError`` for an architecture whose attention
    the explanations cannot find."""
    found = sites.of(model).attention
    if not found:
        raise ValueError(f"explanations do not know where {type(model).__name__}'s attention layers are (they read "
                         "decoder-only LMs, BERT-style encoders and BART-style encoder–decoders)")
    return list(found)


@contextmanager
def recording(model):
    """Eager, differentiable attention for this call's forwards inside the block; yields the list of
    ``LayerRecord`` it fills, one per attention site in forward order."""
    capture.require_interface(model, "Explanations that differentiate through attention")
    sites = attention_sites(model)
    records = [LayerRecord(kind=site.kind) for site in sites]
    index_of = {id(site.module): i for i, site in enumerate(sites)}

    def eager_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
        weights, value = eager_weights(module, query, key, value, attention_mask, scaling, kwargs)
        index = index_of.get(id(module))
        if index is not None:
            record, projection = records[index], sites[index].projection
            record.attention = weights
            record.values_from = lambda: head_values(projection, value)
        return (weights @ value).transpose(1, 2).contiguous(), weights

    def keep_residual(record: LayerRecord):
        def hook(module, args, kwargs):
            record.residual = args[0] if args else kwargs.get("hidden_states")
        return hook

    residuals = [hooks.before(site.block, keep_residual(record), with_kwargs=True)
                 for site, record in zip(sites, records) if site.kind != "cross"]
    with hooks.installed(residuals), capture.overriding(eager_attention):
        yield records


@contextmanager
def zeroing_values(model, keep: torch.Tensor, kind: str = "cross"):
    """Value zeroing (Mohebbi et al. 2023): inside the block, this call's attention of the ``kind`` sites multiplies
    its values by ``keep`` (B, S) over the key positions, so batch row ``b`` has ``v_j = 0`` wherever
    ``keep[b, j] = 0``; the weights are untouched (eager softmax, the same as ``recording``)."""
    capture.require_interface(model, "Value zeroing")
    chosen = {id(site.module) for site in attention_sites(model) if site.kind == kind}

    def eager_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
        weights, value = eager_weights(module, query, key, value, attention_mask, scaling, kwargs)
        if id(module) in chosen:
            value = value * keep[:, None, :, None].to(value.dtype)
        return (weights @ value).transpose(1, 2).contiguous(), weights

    with capture.overriding(eager_attention):
        yield
