"""Activation patching (causal tracing): which activations carry the difference between a clean prompt and a corrupted
one of the same token length ("The Eiffel Tower is in" / "The Colosseum is in").

The corrupted prompt is run with one activation taken from the clean run: the residual stream after one layer at one
position, or one head's output (its slice of the output projection's input) at every position. The recovered fraction
of the logit difference ``LD = logit(clean answer) − logit(corrupted answer)`` at the last position is
``(LD_patched − LD_corrupted) / (LD_clean − LD_corrupted)``: 1 where that activation alone restores the clean answer,
0 where it changes nothing. Batched as head ablation is: one copy of the corrupted prompt per patch.
"""
from __future__ import annotations

import inspect
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from models.analysis import ablation
from models.core import hooks, sites, text
from models.core.results import RunResult

BATCH_TOKENS = 4096
MAX_TOKENS = 64  # layers × positions patches: a long prompt would take minutes


@dataclass(frozen=True)
class Patching:
    model: str
    input_name: str  # the clean prompt's
    clean_tokens: tuple[str, ...]
    corrupted_tokens: tuple[str, ...]
    clean_answer: str
    corrupted_answer: str
    clean_difference: float  # LD on the clean prompt
    corrupted_difference: float  # LD on the corrupted prompt
    residual: np.ndarray  # (layers + 1, tokens) recovered fraction; row 0 = entering block 1, row l = after block l
    heads: np.ndarray  # (layers, heads) recovered fraction, each head's output patched at every position
    kv_heads: int


def decoder_layers(model) -> list:
    """The residual blocks in order (``sites.of``)."""
    return list(sites.of(model).require("layers", "activation patching"))


def clean_stream(model, ids: list[int], keep: dict) -> list:
    """The clean run's residual stream, raw (before any final norm), ``(tokens, d)`` per point: point 0 is what
    enters block 1 (embeddings, and GPT-2's position embeddings), point l what leaves block l."""
    import torch

    layers, points = decoder_layers(model), {}

    def at_point(point, hidden):
        points[point] = hidden[0].clone()

    with hooks.installed(hooks.stream_hooks(layers, at_point)), torch.inference_mode():
        model(input_ids=torch.tensor([ids], device=next(model.parameters()).device), use_cache=False, **keep)
    return [points[i] for i in range(len(layers) + 1)]


@contextmanager
def residual_patched(model, patches: list, stream: list):
    """Row ``b`` of the batch gets the clean ``stream`` at ``patches[b] = (point, position)`` (``clean_stream``'s
    points; ``position`` may be a list of positions, ``point`` −1 patches nothing)."""
    import torch

    def at_point(point, hidden):
        rows = [(b, p) for b, (at, p) in enumerate(patches) if at == point]
        if not rows:
            return None
        hidden = hidden.clone()
        for b, p in rows:
            hidden[b, p] = stream[point][p].to(hidden.dtype)
        return hidden

    with hooks.installed(hooks.stream_hooks(decoder_layers(model), at_point)), torch.inference_mode():
        yield


def _answer(tokenizer, typed: str, fallback: int) -> int:
    return text.single_token_id(tokenizer, typed, fallback)


def activation_patching(loaded, result: RunResult, options) -> Patching:
    """Patch ``result`` (the clean run) into ``options.corrupt``; answers ``options.clean_answer`` /
    ``options.corrupted_answer`` (one token each; empty = each prompt's own top-1 next token)."""
    import torch

    model, tokenizer = loaded.model, loaded.tokenizer
    clean_ids = ablation.prompt_ids(result)
    corrupt_text = (options.corrupt or "").strip()
    if not corrupt_text:
        raise ValueError("type a corrupted prompt: the same sentence with the fact changed, e.g. 'The Colosseum is in'")
    corrupt_ids = text.tokenize(tokenizer, corrupt_text, MAX_TOKENS + 1).ids
    if len(corrupt_ids) != len(clean_ids):
        clean_show = " | ".join(result.tokens)
        corrupt_show = " | ".join(text.display_tokens(tokenizer, corrupt_ids))
        raise ValueError(f"the two prompts must have the same number of tokens: the clean one has {len(clean_ids)} "
                         f"({clean_show}), the corrupted one {len(corrupt_ids)} ({corrupt_show})")
    if len(clean_ids) > MAX_TOKENS:
        raise ValueError(f"activation patching runs on prompts of up to {MAX_TOKENS} tokens, not {len(clean_ids)}")
    device = next(model.parameters()).device
    keep = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    corrupted = torch.tensor([corrupt_ids], device=device)
    with torch.inference_mode():
        clean_logits = model(input_ids=torch.tensor([clean_ids], device=device), use_cache=False, **keep).logits
        corrupt_logits = model(input_ids=corrupted, use_cache=False, **keep).logits
    good = _answer(tokenizer, options.clean_answer, int(clean_logits[0, -1].argmax()))
    bad = _answer(tokenizer, options.corrupted_answer, int(corrupt_logits[0, -1].argmax()))
    if good == bad:
        raise ValueError("both prompts predict the same answer: type a different answer for each (they must differ "
                         "for a logit difference to recover)")

    def difference(logits) -> torch.Tensor:
        last = logits[:, -1].float()
        return (last[:, good] - last[:, bad]).cpu()

    clean_ld, corrupt_ld = float(difference(clean_logits)[0]), float(difference(corrupt_logits)[0])
    if abs(clean_ld - corrupt_ld) < 1e-6:
        raise ValueError("the two prompts give the same logit difference: there is nothing to recover")

    def recovered(values: torch.Tensor) -> np.ndarray:
        return ((values.numpy() - corrupt_ld) / (clean_ld - corrupt_ld)).astype(np.float32)

    per_forward = max(1, BATCH_TOKENS // len(clean_ids))
    stream = clean_stream(model, clean_ids, keep)
    positions = len(clean_ids)
    patches = [(point, p) for point in range(len(stream)) for p in range(positions)]
    values = []
    for i in range(0, len(patches), per_forward):
        chunk = patches[i:i + per_forward]
        with residual_patched(model, chunk, stream):
            values.append(difference(model(input_ids=corrupted.expand(len(chunk), -1), use_cache=False, **keep)
                                     .logits))
    residual = recovered(torch.cat(values)).reshape(len(stream), positions)

    head_values = _head_patches(model, loaded, clean_ids, corrupted, keep, difference, per_forward)
    config = model.config
    return Patching(
        model=result.model.short_name, input_name=result.input_name, clean_tokens=tuple(result.tokens),
        corrupted_tokens=tuple(text.display_tokens(tokenizer, corrupt_ids)),
        clean_answer=text.display_token(tokenizer.decode([good])),
        corrupted_answer=text.display_token(tokenizer.decode([bad])),
        clean_difference=clean_ld, corrupted_difference=corrupt_ld, residual=residual,
        heads=recovered(head_values).reshape(config.num_hidden_layers, config.num_attention_heads),
        kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads)


def _head_patches(model, loaded, clean_ids, corrupted, keep, difference, per_forward: int):
    """Each head's clean output (every position) patched into the corrupted run, one head per batch row."""
    import torch

    projections = ablation.output_projections(model)
    heads = model.config.num_attention_heads
    clean_outputs = [None] * len(projections)

    def grab(index):
        def hook(module, args):
            hidden = args[0]
            clean_outputs[index] = hidden[0].reshape(hidden.shape[1], heads, -1).transpose(0, 1)  # (heads, T, d)
        return hook

    with hooks.installed(hooks.before(projection, grab(index)) for index, projection in enumerate(projections)), \
            torch.inference_mode():
        model(input_ids=torch.tensor([clean_ids], device=corrupted.device), use_cache=False, **keep)
    every = [(layer, head) for layer in range(len(projections)) for head in range(heads)]
    values = []
    for i in range(0, len(every), per_forward):
        chunk = every[i:i + per_forward]
        with ablation.heads_off(projections, heads, chunk, clean_outputs):
            values.append(difference(model(input_ids=corrupted.expand(len(chunk), -1), use_cache=False, **keep)
                                     .logits))
    return torch.cat(values)


def point_label(point: int) -> str:
    return "embeddings" if point == 0 else f"after layer {point}"
