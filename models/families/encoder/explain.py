"""The bidirectional encoder's adapter (MiniLM, BERT) for the shared explanations (models/analysis/attribution.py)
and faithfulness curves: the encoder run from its word embeddings (``inputs_embeds``; position and token-type
embeddings are added inside), attention kept differentiable (models/analysis/records.py).

Target: **the sentence embedding** — the mean of the last layer's token states, the pooling all-MiniLM-L6-v2 was
trained with (sentence-transformers). The packaged encoders are loaded with ``AutoModel`` and have no masked-LM head,
so a [MASK] fill cannot be scored. The embedding is compared with a reference direction ``r̂`` (unit length): the
sentence's own unperturbed embedding (default), or the embedding of a sentence the user types.
- the score explained (back-propagated, IG's integrand): ``⟨e(x'), r̂⟩``, the perturbed embedding's length along the
  reference. (Its cosine would have zero gradient at the input itself when the reference is the input: a maximum.)
- what the curves read: ``max(0, cos(e(x'), r̂))``, in 0..1 like a probability.

Units: the tokens between [CLS] and [SEP] (those two stay). A removed token is replaced by the mean of the word
embedding matrix, positions kept.
"""
from __future__ import annotations

import torch

from models.analysis.attribution import Explainable
from models.analysis import records
from models.core import text

REPLACEMENTS = {"mean": "the mean of the word embedding matrix (an 'average token'), positions kept"}
OWN = "own"


def _pooled(model, embeddings: torch.Tensor) -> torch.Tensor:
    mask = torch.ones(embeddings.shape[:2], dtype=torch.long, device=embeddings.device)
    return model(inputs_embeds=embeddings, attention_mask=mask).last_hidden_state.mean(1)  # (B, D)


def from_result(loaded, result, target, replacement: str = "mean", batch_size: int = 32) -> Explainable:
    """The adapter for an encoder run: ``target`` None / "" / ``"own"`` compares with the sentence's own embedding;
    any other text is a reference sentence whose embedding is compared with."""
    if replacement not in REPLACEMENTS:
        raise ValueError(f"a removed token can be replaced by: {', '.join(REPLACEMENTS)} (not {replacement!r})")
    model, tokenizer = loaded.model, loaded.tokenizer
    if not isinstance(target, (str, type(None))):
        raise ValueError("the encoder's target is its sentence embedding: give no target (the sentence's own "
                         "embedding) or a reference sentence, not a class or token id "
                         f"({target!r}; this encoder has no masked-LM head to score a [MASK] fill)")
    ids = list(getattr(result, "token_ids", None) or ())
    if not ids:
        raise ValueError("explanations read an encoder run with its token ids (run the sentence again)")
    special = set(getattr(result, "special_positions", ()) or ())
    units = tuple(i for i in range(len(ids)) if i not in special)
    if len(units) < 2:
        raise ValueError("the text is a single token: there is nothing to compare it with or remove. Type a longer "
                         "sentence.")
    device = next(model.parameters()).device
    table = model.get_input_embeddings()
    with torch.no_grad():
        embeddings = table(torch.tensor([ids], device=device))
        baseline = embeddings.clone()  # [CLS] and [SEP] are no units: they stay in the baseline too (IG's path)
        baseline[:, list(units)] = table.weight.mean(0)
        if target is None or not str(target).strip() or target == OWN:
            reference, target_name = _pooled(model, embeddings)[0], "the sentence's own embedding"
        else:
            reference_ids = tokenizer(str(target), truncation=True, max_length=loaded.max_positions or 512,
                                      return_tensors="pt")["input_ids"].to(device)
            reference = _pooled(model, table(reference_ids))[0]
            target_name = f"the embedding of {str(target)!r}"
        direction = reference / reference.norm().clamp(min=1e-12)

    def logits(batch_embeddings):
        return _pooled(model, batch_embeddings)

    def score_of(pooled):
        return pooled @ direction

    def probability_of(pooled):
        return torch.nn.functional.cosine_similarity(pooled, direction[None], dim=-1).clamp(min=0)

    tokens = tuple(text.display_token(result.tokens[i]) for i in units)  # one name per unit
    note = ("Target: the sentence embedding (mean of the last layer's tokens, as all-MiniLM-L6-v2 is pooled), not a "
            "[MASK] fill: the packaged encoder has no masked-LM head. Explained: its length along the reference "
            "embedding; the curves read the cosine similarity (below 0 counts as 0).")
    return Explainable(embeddings, baseline, units, 0, 0, f"cosine to {target_name}", logits,
                       lambda: records.recording(model), tokens, REPLACEMENTS[replacement], batch_size,
                       notes=(note,), score_of=score_of, probability_of=probability_of,
                       target_kind="sentence embedding (cosine similarity to a reference)",
                       measure="cosine to the reference (≥ 0)")
