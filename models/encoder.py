"""Bidirectional encoders (BERT family): every token attends to every other one, no causal mask.

Besides the maps, ``special_token_share`` measures how much attention lands on [CLS] and [SEP], the "no-op" sinks
Clark et al. (2019, "What does BERT look at?") found in many BERT heads.
"""
from __future__ import annotations

import numpy as np
import torch

from models import capture, text
from models.causal_lm import model_info
from models.loading import LoadedModel, friendly_out_of_memory
from models.results import AttentionMaps, RunResult


def run(loaded: LoadedModel, sentence: str, max_tokens: int = text.DEFAULT_MAX_TOKENS) -> RunResult:
    """Attention of every layer and head of the encoder for ``sentence`` (with its [CLS] ... [SEP])."""
    limit = min(max_tokens, loaded.max_positions) if loaded.max_positions else max_tokens
    tokenized = text.tokenize(loaded.tokenizer, sentence, limit)
    input_ids = torch.tensor([tokenized.ids], device=loaded.device)
    with friendly_out_of_memory(loaded.device, len(tokenized.ids)), torch.inference_mode(), \
            capture.recording(loaded.model) as recorder:
        loaded.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids))
    maps = recorder.attention_maps("self", 0, query_tokens=tokenized.tokens, key_tokens=tokenized.tokens)
    special = [i for i, token_id in enumerate(tokenized.ids) if token_id in set(loaded.tokenizer.all_special_ids)]
    return RunResult(model_info(loaded), tokenized.tokens, {"self": maps}, notices=list(tokenized.notices),
                     extras={"special_positions": special})


def special_token_share(maps: AttentionMaps, positions: list[int]) -> np.ndarray:
    """Mean share of each head's attention that lands on ``positions`` (e.g. [CLS], [SEP]): ``(layers, heads)``."""
    share = np.zeros((maps.num_layers, maps.num_heads), dtype=np.float32)
    for layer in range(maps.num_layers):
        weights = maps.layer(layer)  # (heads, q, k)
        share[layer] = weights[:, :, positions].sum(axis=-1).mean(axis=-1)
    return share
