"""The causal LM's adapter for the shared explanations (models/analysis/attribution.py) and faithfulness curves: a
transformers decoder run from ``inputs_embeds``, with its attention computed eagerly and kept differentiable.

Attention is recorded by ``models.analysis.records.recording`` (eager and differentiable for this call only; values
``f^h(x_j)`` through each head's slice of the output projection; the block input from a pre-hook on each decoder
layer).

Units: every prompt token; the target is read at the last position: the next-token prediction, or any vocabulary
token typed. A removed token is *replaced* (positions stay, so RoPE and the causal mask do not move) by the mean of
the model's input embedding matrix — a neutral "average token" that is no word in particular — at the scale the
embedding gives its rows (Gemma 3's ``embed_scale``, √d_model).
"""
from __future__ import annotations

import torch

from models.analysis import records
from models.analysis.attribution import Explainable
from models.core import text

REPLACEMENTS = {"mean": "the mean of the input embedding matrix (an 'average token'), positions kept"}


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
        target = text.single_token_id(tokenizer, target, result.next_token[0].token_id)
    elif target is None:
        target = result.next_token[0].token_id
    if not 0 <= int(target) < vocabulary:
        raise ValueError(f"token id {target} does not exist: the vocabulary has ids 0..{vocabulary - 1}")
    device = next(model.parameters()).device
    table = model.get_input_embeddings()
    with torch.no_grad():
        embeddings = table(torch.tensor([ids], device=device))
        average = table.weight.mean(0)
        scale = getattr(table, "embed_scale", None)  # Gemma 3's table scales its rows by √d_model in its forward
        average = average * scale.to(average.dtype) if isinstance(scale, torch.Tensor) else average
        baseline = average.expand_as(embeddings).clone()

    def logits(batch_embeddings):
        output = model(inputs_embeds=batch_embeddings, use_cache=False, logits_to_keep=1)
        return output.logits[:, -1]

    tokens = tuple(text.display_token(tokenizer.decode([i])) for i in ids)
    return Explainable(embeddings, baseline, tuple(range(len(ids))), len(ids) - 1, int(target),
                       text.display_token(tokenizer.decode([int(target)])), logits, lambda: records.recording(model),
                       tokens, REPLACEMENTS[replacement], batch_size,
                       target_kind="a vocabulary token, read at the last position",
                       notes=("Integrated Gradients keeps the first token (the attention sink) as it is along its "
                              "path, so its score there is 0: moving it makes the path too steep to integrate.",),
                       ig_fixed=(0,))
