"""Attention knockout (Geva et al. 2023, "Dissecting recall of factual associations in auto-regressive language
models", sec. 5): cut chosen query → key edges of the attention in chosen layers, and see what the prediction after
the prompt becomes.

An edge is cut by removing it from the attention mask the layer applies (``models.core.capture.knocked_out``: a per-call
mask in our capture attention function, so the model itself is never changed and other sessions see nothing): the
query renormalises its attention over the keys it still sees, exactly as if the score were −∞. The standard sweep
(the paper's Fig. 5 over every source position): for each layer ``l`` a window of layers centred on it, and for
each earlier position ``k``, the edge last position → ``k`` is cut in every layer of the window; the heatmap is the
relative change of the target's probability, ``(p_cut − p) / p``. Batched as head ablation is: one copy of the prompt
per cut, each with its own mask.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np

from models.analysis import ablation
from models.core import capture, selection, sites, text
from models.core.results import RunResult

BATCH_TOKENS = 4096  # prompt copies per forward × prompt length, at most
MAX_SWEEP_TOKENS = 48  # the sweep runs layers × positions forwards
TOP_K = 5


@dataclass(frozen=True)
class Knockout:
    model: str
    input_name: str
    tokens: tuple[str, ...]
    keys: tuple[int, ...]  # the key positions cut
    queries: tuple[int, ...]  # the query positions that lose them
    layers: tuple[int, int]  # first and last layer cut, inclusive
    num_layers: int
    target: str
    target_id: int
    probability: float  # p(target) after the prompt, nothing cut
    knocked_probability: float  # the same with the edges cut
    top_before: tuple[tuple[str, float], ...]  # the top next tokens, nothing cut
    top_after: tuple[tuple[str, float], ...]  # and with the edges cut

    @property
    def relative_change(self) -> float:
        return (self.knocked_probability - self.probability) / max(self.probability, 1e-30)


@dataclass(frozen=True)
class KnockoutSweep:
    model: str
    input_name: str
    tokens: tuple[str, ...]
    window: int
    target: str
    target_id: int
    probability: float  # p(target), nothing cut
    change: np.ndarray  # (layers, tokens) relative change of p(target), last → k cut in the window around the layer
    knocked: np.ndarray  # (layers, tokens) p(target) with that cut

    def window_of(self, layer: int) -> tuple[int, int]:
        return window_around(layer, self.window, self.change.shape[0])


def window_around(layer: int, size: int, layers: int) -> tuple[int, int]:
    """The ``size`` layers centred on ``layer``, clipped to ``0..layers − 1`` (first, last inclusive)."""
    return max(0, layer - size // 2), min(layers - 1, layer - size // 2 + size - 1)


def parse_positions(typed: str, n: int, what: str) -> tuple[int, ...]:
    """"3", "1-4", "0, 2, 5-6" or negative positions from the end ("-2") -> sorted positions in ``0..n − 1``."""
    positions: set[int] = set()
    for part in typed.replace(" ", "").split(","):
        if not part:
            continue
        try:
            if "-" in part.lstrip("-"):
                start, _, end = part.lstrip("-").partition("-")
                low, high = int(("-" if part.startswith("-") else "") + start), int(end)
            else:
                low = high = int(part)
        except ValueError:
            raise ValueError(f"{what}: {part!r} is not a position or a range such as 2-5") from None
        low, high = (value + n if value < 0 else value for value in (low, high))
        if not 0 <= low <= high < n:
            raise ValueError(f"{what}: {part!r} is outside the prompt's {n} tokens (0 to {n - 1})")
        positions.update(range(low, high + 1))
    if not positions:
        raise ValueError(f"{what}: type the positions to cut, e.g. 2 or 1-3 (the tokens are numbered from 0)")
    return tuple(sorted(positions))


def attention_modules(model) -> dict[int, int]:
    """``id(attention module) -> layer`` for each layer's self-attention (``sites.of``)."""
    return {id(site.module): site.layer for site in sites.of(model).of_kind("self")}


def _forwards(model, ids: list[int], blocked, layers):
    """Log-probabilities after the last position ``(rows, vocab)`` for each row's cut, in batches."""
    import torch

    keep = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    device = next(model.parameters()).device
    prompt = torch.tensor([ids], device=device)
    capture.require_interface(model, "Attention knockout")
    layer_of = attention_modules(model)
    per_forward = max(1, BATCH_TOKENS // len(ids))
    out = []
    for start in range(0, blocked.shape[0], per_forward):
        chunk = slice(start, start + per_forward)
        rows = blocked[chunk].shape[0]
        with torch.inference_mode(), capture.knocked_out(layer_of, blocked[chunk], layers[chunk]):
            logits = model(input_ids=prompt.expand(rows, -1), use_cache=False, **keep).logits[:, -1].float()
        out.append(torch.log_softmax(logits, dim=-1).cpu())
    return torch.cat(out)


def _layer_range(first, last, layers: int) -> tuple[int, int]:
    """The layer indices a first and a last layer choice (``models.core.selection``) name."""
    first, last = (selection.layer_index(value, layers) for value in (first, last))
    if first > last:
        raise ValueError(f"the layers to cut run from a first to a last layer among 0 to {layers - 1} (or "
                         f"'last'); {first}–{last} is not such a range")
    return first, last


def _top(logprobs, tokenizer) -> tuple[tuple[str, float], ...]:
    values, indices = logprobs.exp().topk(TOP_K)
    return tuple((text.display_token(tokenizer.decode([int(i)])), float(v)) for v, i in zip(values, indices))


def attention_knockout(loaded, result: RunResult, options) -> Knockout:
    """Cut the edges ``options.queries`` → ``options.keys`` (positions as typed; ``queries`` "" = the last position,
    "later" = every query after each key) in layers ``options.first_layer``..``options.last_layer``; the target is
    one token as typed, or "" for the model's own top-1 next token."""
    import torch

    model, tokenizer = loaded.model, loaded.tokenizer
    ids = ablation.prompt_ids(result)
    n = len(ids)
    layers = model.config.num_hidden_layers
    keys = parse_positions(options.keys, n, "key positions")
    choice = (options.queries or "").strip().lower()
    if choice in ("", "last"):
        queries = (n - 1,)
    elif choice in ("later", "all"):
        queries = tuple(range(min(keys) + 1, n))
    else:
        queries = parse_positions(options.queries, n, "query positions")
    first, last = _layer_range(options.first_layer, options.last_layer, layers)
    blocked = torch.zeros(2, n, n, dtype=torch.bool)  # row 0: nothing cut (the same path), row 1: the cut
    for query in queries:
        for key in keys:
            if key < query or (key == query and choice not in ("later", "all")):
                blocked[1, query, key] = True
    if not blocked[1].any():
        raise ValueError("no edge to cut: a query sees only keys at or before it, so choose keys before the queries "
                         f"(queries {', '.join(map(str, queries))}, keys {', '.join(map(str, keys))})")
    active = torch.zeros(2, layers, dtype=torch.bool)
    active[1, first:last + 1] = True
    logprobs = _forwards(model, ids, blocked, active)
    target = text.single_token_id(tokenizer, options.target, int(logprobs[0].argmax()))
    return Knockout(
        model=result.model.short_name, input_name=result.input_name, tokens=tuple(result.tokens), keys=keys,
        queries=queries, layers=(first, last), num_layers=layers,
        target=text.display_token(tokenizer.decode([target])), target_id=target,
        probability=float(logprobs[0, target].exp()), knocked_probability=float(logprobs[1, target].exp()),
        top_before=_top(logprobs[0], tokenizer), top_after=_top(logprobs[1], tokenizer))


def knockout_sweep(loaded, result: RunResult, options) -> KnockoutSweep:
    """For every layer (a window of ``options.window`` layers centred on it) and every position ``k``, the edge last
    position → ``k`` cut: the relative change of p(target)."""
    import torch

    model, tokenizer = loaded.model, loaded.tokenizer
    ids = ablation.prompt_ids(result)
    n = len(ids)
    if n < 2:
        raise ValueError("the knockout sweep needs a prompt of at least two tokens (an earlier token to cut off)")
    if n > MAX_SWEEP_TOKENS:
        raise ValueError(f"the knockout sweep runs on prompts of up to {MAX_SWEEP_TOKENS} tokens (this one has {n}): "
                         "every layer and position is one more forward")
    layers = model.config.num_hidden_layers
    if options.window < 1:
        raise ValueError(f"the window is at least one layer, not {options.window}")
    window = min(options.window, layers)  # then clipped at the model's first and last layer (window_around)
    cuts = [(layer, key) for layer in range(layers) for key in range(n)]
    blocked = torch.zeros(1 + len(cuts), n, n, dtype=torch.bool)  # row 0: nothing cut
    active = torch.zeros(1 + len(cuts), layers, dtype=torch.bool)
    for row, (layer, key) in enumerate(cuts, start=1):  # the last position's edge to itself too: it sees n ≥ 2 keys
        blocked[row, n - 1, key] = True
        first, last = window_around(layer, window, layers)
        active[row, first:last + 1] = True
    logprobs = _forwards(model, ids, blocked, active)
    target = text.single_token_id(tokenizer, options.target, int(logprobs[0].argmax()))
    probabilities = logprobs[:, target].exp().numpy()
    knocked = probabilities[1:].reshape(layers, n).astype(np.float32)
    clean = float(probabilities[0])
    return KnockoutSweep(
        model=result.model.short_name, input_name=result.input_name, tokens=tuple(result.tokens),
        window=window, target=text.display_token(tokenizer.decode([target])), target_id=target,
        probability=clean, change=((knocked - clean) / max(clean, 1e-30)).astype(np.float32), knocked=knocked)
