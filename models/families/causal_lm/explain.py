"""The causal LM's adapter for the shared explanations (models/analysis/attribution.py) and faithfulness curves: a
transformers decoder run from ``inputs_embeds``, with its attention computed eagerly and kept differentiable.

The model is loaded with the ``"capture"`` attention function (models/core/capture.py); inside ``recording`` this
thread's calls go to ``eager_attention`` instead of SDPA (``capture.overriding``, a ContextVar: other sessions'
forwards of the shared model are untouched): ``softmax(q kᵀ · scaling + mask)`` with grouped key/value heads
repeated, the weights kept with their graph. Values ``f^h(x_j)`` are each head's ``v_j`` through its slice of the
output projection (``o_proj``, GPT-2's ``c_proj``, minus the bias); the block input comes from a pre-hook on each
decoder layer.

Units: every prompt token; the target is read at the last position: the next-token prediction, or any vocabulary
token typed. A removed token is *replaced* (positions stay, so RoPE and the causal mask do not move) by the mean of
the model's input embedding matrix — a neutral "average token" that is no word in particular.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager

import torch

from models.analysis.ablation import _target_id, output_projections
from models.analysis.attribution import Explainable, LayerRecord
from models.core import capture, text

REPLACEMENTS = {"mean": "the mean of the input embedding matrix (an 'average token'), positions kept"}


def _decoder_layers(model) -> list:
    """The decoder blocks in order, found beside their attention's output projections."""
    blocks = []
    for name, module in model.named_modules():
        if any(name.endswith(suffix) for suffix in (".o_proj", ".c_proj")) and (".self_attn." in name or ".attn." in name):
            parent = name.rsplit(".", 2)[0]
            blocks.append(model.get_submodule(parent))
    return blocks


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
    """``softmax(q kᵀ · scaling + mask)`` with its graph, grouped key/value heads repeated: (weights, value)."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = (query @ key.transpose(-1, -2)).float() * scaling  # (B, H, q, k)
    q_len, k_len = scores.shape[-2:]
    if attention_mask is not None:
        mask = attention_mask[..., -k_len:]
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.float()
    elif q_len > 1 and kwargs.get("is_causal", getattr(module, "is_causal", True)):
        causal = torch.ones(q_len, k_len, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    return scores.softmax(-1).to(query.dtype), value


@contextmanager
def overriding_with_residuals(eager_attention, blocks_and_records, owner: int):
    """``eager_attention`` in place of the model's attention inside the block, and each block's input (its residual
    stream) kept in its ``LayerRecord``, for the forwards of thread ``owner`` only."""
    def pre_hook(record: LayerRecord):
        def hook(module, args, kwargs):
            if threading.get_ident() == owner:
                record.residual = args[0] if args else kwargs.get("hidden_states")
        return hook

    handles = [block.register_forward_pre_hook(pre_hook(record), with_kwargs=True)
               for block, record in blocks_and_records]
    try:
        with capture.overriding(eager_attention):
            yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def recording(model):
    """Eager, differentiable attention for this thread's forwards inside the block; yields the list of
    ``LayerRecord`` it fills (one per decoder layer, in order)."""
    layers = _decoder_layers(model)
    projections = output_projections(model)
    if len(layers) != len(projections):
        raise ValueError(f"{type(model).__name__}: could not pair its decoder blocks with their attention")
    records = [LayerRecord() for _ in layers]
    index_of = {}
    for i, projection in enumerate(projections):
        index_of[id(projection)] = i
    owner = threading.get_ident()

    def eager_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
        weights, value = eager_weights(module, query, key, value, attention_mask, scaling, kwargs)
        projection = next(getattr(module, n) for n in ("o_proj", "c_proj", "out_proj") if hasattr(module, n))
        record = records[index_of[id(projection)]]
        record.attention = weights
        record.values_from = lambda: head_values(projection, value)
        return (weights @ value).transpose(1, 2).contiguous(), weights

    with overriding_with_residuals(eager_attention, zip(layers, records), owner):
        yield records


def from_result(loaded, result, target, replacement: str = "mean", batch_size: int = 32) -> Explainable:
    """The adapter for a causal LM's prompt run: ``target`` a vocabulary id, a typed token (``" Paris"``), or
    None/"" for the model's own next-token prediction."""
    if replacement not in REPLACEMENTS:
        raise ValueError(f"a removed token can be replaced by: {', '.join(REPLACEMENTS)} (not {replacement!r})")
    ids = list(getattr(result, "token_ids", ()) or ())
    if not ids or not getattr(result, "next_token", None):
        raise ValueError("explanations read a language model's prompt run (this run has no next-token prediction)")
    if len(ids) < 2:
        raise ValueError("the text is a single token: there is nothing to compare it with or remove. Type a longer "
                         "prompt.")
    model, tokenizer = loaded.model, loaded.tokenizer
    vocabulary = model.get_input_embeddings().weight.shape[0]
    if isinstance(target, str):
        target = _target_id(tokenizer, target, result.next_token[0].token_id)
    elif target is None:
        target = result.next_token[0].token_id
    if not 0 <= int(target) < vocabulary:
        raise ValueError(f"token id {target} does not exist: the vocabulary has ids 0..{vocabulary - 1}")
    device = next(model.parameters()).device
    table = model.get_input_embeddings()
    with torch.no_grad():
        embeddings = table(torch.tensor([ids], device=device))
        baseline = table.weight.mean(0).expand_as(embeddings).clone()

    def logits(batch_embeddings):
        output = model(inputs_embeds=batch_embeddings, use_cache=False, logits_to_keep=1)
        return output.logits[:, -1]

    tokens = tuple(text.display_token(tokenizer.decode([i])) for i in ids)
    return Explainable(embeddings, baseline, tuple(range(len(ids))), len(ids) - 1, int(target),
                       text.display_token(tokenizer.decode([int(target)])), logits, lambda: recording(model),
                       tokens, REPLACEMENTS[replacement], batch_size,
                       target_kind="a vocabulary token, read at the last position")
