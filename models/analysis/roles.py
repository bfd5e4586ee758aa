"""Head roles of a causal LM, measured as TransformerLens's induction-heads work does (Olsson et al. 2022): on a
sequence of repeated random tokens ``[BOS] + R + R`` (``R`` = ``REPEAT_LENGTH`` tokens drawn uniformly from the
vocabulary, special tokens left out), where the only thing a head can use in the second copy is the first copy.

For a head's map A ``(T, T)`` over ``T = 1 + 2n`` positions (BOS at 0, the first copy at ``1..n``, the second at
``n+1..2n``), averaged over ``SEQUENCES`` random sequences:
- previous-token: mean over queries ``q ≥ 2`` of ``A[q, q−1]`` (BOS left out: every head may park there);
- induction: mean over the second copy of ``A[q, q−n+1]``, the token *after* the earlier occurrence of the current
  token (what an induction head copies forward);
- duplicate-token: mean over the second copy of ``A[q, q−n]``, the earlier occurrence of the same token;
- first-token (sink): mean over every query of ``A[q, 0]``, the attention parked on BOS (Xiao et al. 2023).
These describe the model, not the prompt: one forward of ``SEQUENCES × T`` tokens per model, whatever the input.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np

ROLES = {
    "previous_token_role": "Previous-token (random)",
    "induction": "Induction (repeated random)",
    "duplicate_token": "Duplicate-token (repeated random)",
    "sink": "First-token / sink (random)",
}
REPEAT_LENGTH = 32  # n: the random block; 1 + 2n = 65 positions
SEQUENCES = 2  # random sequences averaged, in one batch (2 × 32 second-copy queries a head)
SEED = 0  # the same sequences every time: the scores are a property of the model


@dataclass(frozen=True)
class HeadRoles:
    scores: dict[str, np.ndarray]  # role name (ROLES) -> (layers, heads) float32 in [0, 1]
    kv_heads: int  # key/value heads per layer (GQA: query head h reads key/value head h // (heads / kv_heads))
    sequence_ids: np.ndarray  # (SEQUENCES, 1 + 2n) the token ids the scores were measured on


def repeated_random_tokens(tokenizer, vocab_size: int, length: int = REPEAT_LENGTH, sequences: int = SEQUENCES,
                           seed: int = SEED) -> np.ndarray:
    """``(sequences, 1 + 2 · length)`` ids: a BOS token (else [CLS], else end-of-text), then ``length`` random
    ordinary tokens twice. Drawn from a generator of their own: concurrent sessions and torch's global seed play no
    part."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    ordinary = np.array([i for i in range(vocab_size) if i not in special])
    if len(ordinary) < length:
        raise ValueError(f"the vocabulary has only {len(ordinary)} ordinary tokens; {length} distinct ones are needed")
    start = next((i for i in (tokenizer.bos_token_id, getattr(tokenizer, "cls_token_id", None),
                              tokenizer.eos_token_id) if i is not None), None)
    if start is None:
        raise ValueError("the tokenizer has neither a beginning- nor an end-of-text token to start the sequence with")
    rng = np.random.default_rng(seed)
    # distinct tokens inside one copy: a token repeated within R would make "its earlier occurrence" ambiguous
    block = np.stack([rng.choice(ordinary, size=length, replace=False) for _ in range(sequences)])
    return np.concatenate([np.full((sequences, 1), start), block, block], axis=1).astype(np.int64)


def role_scores(weights: np.ndarray, length: int) -> dict[str, np.ndarray]:
    """The four scores of every head from maps ``(sequences, heads, T, T)`` over ``[BOS] + R + R`` with
    ``|R| = length`` -> ``{role: (heads,)}``."""
    total = weights.shape[-1]
    if total != 1 + 2 * length:
        raise ValueError(f"maps over {total} positions do not hold [BOS] + R + R with |R| = {length}")
    second = np.arange(length + 1, total)  # queries in the second copy
    previous = np.arange(2, total)
    return {
        "previous_token_role": weights[:, :, previous, previous - 1].mean(axis=(0, 2)),
        "induction": weights[:, :, second, second - length + 1].mean(axis=(0, 2)),
        "duplicate_token": weights[:, :, second, second - length].mean(axis=(0, 2)),
        "sink": weights[:, :, :, 0].mean(axis=(0, 2)),
    }


def head_roles(loaded) -> HeadRoles:
    """The four role scores of every head of ``loaded`` (a causal LM loaded with capture attention)."""
    import torch

    from models.core import capture

    model, tokenizer = loaded.model, loaded.tokenizer
    config = model.config
    vocab_size = model.get_input_embeddings().num_embeddings
    ids = repeated_random_tokens(tokenizer, min(vocab_size, len(tokenizer)))
    # the logits are not read: only the last position goes through the LM head (49,152 × 576 for SmolLM2)
    keep = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    with torch.inference_mode(), capture.recording(model) as recorder:
        model(input_ids=torch.from_numpy(ids).to(next(model.parameters()).device), use_cache=False, **keep)
    batches = [recorder.attention_maps("self", b) for b in range(ids.shape[0])]
    layers, heads = batches[0].num_layers, batches[0].num_heads
    scores = {name: np.zeros((layers, heads), dtype=np.float32) for name in ROLES}
    for layer in range(layers):
        per_layer = role_scores(np.stack([maps.layer(layer) for maps in batches]), REPEAT_LENGTH)
        for name, values in per_layer.items():
            scores[name][layer] = values
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return HeadRoles(scores=scores, kv_heads=int(kv_heads), sequence_ids=ids)
