"""One way to reach inside a model: named sites, found once per architecture, and hooks that act only for the call
that installed them (DESIGN.md, "Capture that is proven"; TransformerLens's hook points are the model).

A loaded model is cached and shared by every browser session, and a hook registered on one of its modules fires for
every forward run while it is registered, whoever runs it. So every hook in this project is installed here:

    site = sites(model)                                   # embeddings, layers, attention, final norm, unembedding
    with installed(before(site.layers[0], keep), after(site.final_norm, keep)):
        model(input_ids)                                  # this call's forwards run the hooks
    # removed here, in ``finally``, even if the forward raised

A hook acts only for the forwards of the ``with`` block that installed it: each block marks itself active in a
``ContextVar`` (per thread, and per asyncio task), and the hooks it installed do nothing for forwards run anywhere
else. Two sessions running the same cached model at once each see only their own hooks; nothing is stored on a
shared module. Blocks nest (patching inside a recording).

The attention function itself (queries and keys after RoPE, the mask) is reached through transformers'
``AttentionInterface`` (models/core/capture.py), not through a module hook.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
import weakref
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from torch import nn

_ACTIVE: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar("active_hook_blocks", default=frozenset())


# --- hooks ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Hook:
    """``fn`` on ``module``: ``"before"`` its forward (``fn(module, args[, kwargs])``, may return new inputs) or
    ``"after"`` it (``fn(module, args, output)``, may return a new output)."""

    module: nn.Module
    fn: Callable
    when: str  # "before" or "after"
    with_kwargs: bool = False


def before(module: nn.Module, fn: Callable, with_kwargs: bool = False) -> Hook:
    """A forward pre-hook: ``fn(module, args)`` (``with_kwargs``: ``fn(module, args, kwargs)``)."""
    return Hook(module, fn, "before", with_kwargs)


def after(module: nn.Module, fn: Callable, with_kwargs: bool = False) -> Hook:
    """A forward hook: ``fn(module, args, output)`` (``with_kwargs``: ``fn(module, args, kwargs, output)``)."""
    return Hook(module, fn, "after", with_kwargs)


def _for_block(fn: Callable, block: int) -> Callable:
    """``fn`` that does nothing (returns None: inputs and output unchanged) outside the ``installed`` block ``block``."""

    @functools.wraps(fn)
    def guarded(*args, **kwargs):
        if block not in _ACTIVE.get():
            return None
        return fn(*args, **kwargs)

    return guarded


def _flatten(items) -> Iterator[Hook]:
    for item in items:
        if isinstance(item, Hook):
            yield item
        else:
            yield from _flatten(item)


@contextlib.contextmanager
def installed(*hooks: Hook | Iterable) -> Iterator[None]:
    """Install ``hooks`` (``Hook``s, or iterables of them, nested as you like) for the forwards run inside the ``with`` block only; remove
    them on exit, always."""
    marker = object()  # alive for the block: its id names the block
    block = id(marker)
    flat = list(_flatten(hooks))
    token = _ACTIVE.set(_ACTIVE.get() | {block})
    handles = []
    try:
        for hook in flat:
            guarded = _for_block(hook.fn, block)
            if hook.when == "before":
                handles.append(hook.module.register_forward_pre_hook(guarded, with_kwargs=hook.with_kwargs))
            elif hook.when == "after":
                handles.append(hook.module.register_forward_hook(guarded, with_kwargs=hook.with_kwargs))
            else:
                raise ValueError(f"a hook runs 'before' or 'after' a forward, not {hook.when!r}")
        yield
    finally:
        for handle in handles:
            handle.remove()
        _ACTIVE.reset(token)
        del marker


# --- the residual stream -------------------------------------------------------------------------------------------

def hidden_of(output):
    """The hidden states of a block's output (a tensor, or the first item of a tuple)."""
    return output[0] if isinstance(output, (tuple, list)) else output


def with_hidden(output, hidden):
    """A block's output with its hidden states replaced."""
    return (hidden, *output[1:]) if isinstance(output, tuple) else hidden


def stream_hooks(layers: list[nn.Module], at_point: Callable) -> list[Hook]:
    """Hooks on the residual stream between ``layers``: ``at_point(point, hidden)`` sees point 0 (what enters the
    first block: the embeddings) and point ``l`` (what leaves block ``l``), hidden ``(B, T, d)``; it may return a
    replacement for it, or None to leave it."""

    def entering(module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        new = at_point(0, hidden)
        if new is None:
            return None
        return ((new, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": new})

    def leaving(point):
        def hook(module, args, output):
            new = at_point(point, hidden_of(output))
            return None if new is None else with_hidden(output, new)
        return hook

    return [before(layers[0], entering, with_kwargs=True)] + [after(layer, leaving(index + 1))
                                                              for index, layer in enumerate(layers)]


# --- sites ---------------------------------------------------------------------------------------------------------

ATTENTION_NAMES = ("self_attn", "attn", "attention", "self_attention", "SelfAttention")
PROJECTION_NAMES = ("o_proj", "c_proj", "out_proj", "dense", "o")
FINAL_NORM_NAMES = ("norm", "ln_f", "final_layer_norm", "final_layernorm", "layer_norm")


@dataclass(frozen=True)
class AttentionSite:
    """One attention module in forward order: the module the attention function is called for, its output
    projection (the heads' outputs enter it side by side), the residual block it sits in, and its kind."""

    module: nn.Module
    projection: nn.Module
    block: nn.Module
    kind: str  # "self" (decoder-only or encoder-only), "encoder", "decoder" or "cross"
    layer: int  # its block's index within its stack


@dataclass(frozen=True)
class Sites:
    """Where things are in one model (found once per model by ``sites``)."""

    model_class: str
    embeddings: nn.Module | None  # the input token embeddings
    layers: tuple[nn.Module, ...]  # the residual blocks of the main stack in order (an encoder–decoder's decoder)
    attention: tuple[AttentionSite, ...]  # every attention module, in the order the forward calls them
    final_norm: nn.Module | None  # the norm before the unembedding (that stack's last), if any
    unembedding: nn.Module | None  # the LM head, if any

    def of_kind(self, *kinds: str) -> list[AttentionSite]:
        return [site for site in self.attention if site.kind in kinds]

    def projections(self) -> list[nn.Module]:
        """Each layer's attention output projection of the main stack (self-attention), in layer order."""
        chosen = self.of_kind("self") or self.of_kind("decoder")
        if len(chosen) != len(self.layers):
            raise ValueError(f"{self.model_class}: could not pair each of its {len(self.layers)} layers with its "
                             "attention's output projection")
        return [site.projection for site in chosen]

    def require(self, what: str, purpose: str):
        """``getattr(self, what)``, or a ``ValueError`` saying ``purpose`` cannot find it in this architecture."""
        found = getattr(self, what)
        if found is None or (isinstance(found, tuple) and not found):
            raise ValueError(f"{purpose} does not know where {self.model_class}'s {what.replace('_', ' ')} is")
        return found


_FOUND: "weakref.WeakKeyDictionary[nn.Module, Sites]" = weakref.WeakKeyDictionary()
_FOUND_LOCK = threading.Lock()


def sites(model: nn.Module) -> Sites:
    """The named sites of a transformers text model (decoder-only, BERT-style encoder, BART/Marian/Whisper-style
    encoder–decoder), found once per model and kept beside it (not on it)."""
    with _FOUND_LOCK:
        found = _FOUND.get(model)
    if found is None:
        found = _find(model)
        with _FOUND_LOCK:
            _FOUND[model] = found
    return found


def _first(module, names):
    return next((getattr(module, name) for name in names if isinstance(getattr(module, name, None), nn.Module)), None)


def _projection(attention: nn.Module) -> nn.Module | None:
    """An attention module's output projection (BERT keeps it beside the attention, in ``attention.output.dense``)."""
    found = _first(attention, PROJECTION_NAMES)
    if found is None and isinstance(getattr(attention, "output", None), nn.Module):
        found = _first(attention.output, PROJECTION_NAMES)
    return found


def _stack(container: nn.Module | None, count: int | None = None) -> list[nn.Module]:
    """The ModuleList of blocks in ``container`` (``layers``, ``h``, ``layer``, ``block``, ``blocks``)."""
    if container is None:
        return []
    for name in ("layers", "h", "layer", "block", "blocks"):
        found = getattr(container, name, None)
        if isinstance(found, nn.ModuleList) and (count is None or len(found) == count):
            return list(found)
    if count is not None:  # any ModuleList of the configured length
        found = next((child for child in container.children()
                      if isinstance(child, nn.ModuleList) and len(child) == count), None)
        if found is not None:
            return list(found)
    return []


def _self_attention(block: nn.Module) -> nn.Module | None:
    found = _first(block, ATTENTION_NAMES)
    if found is None:  # T5: block.layer[0].SelfAttention
        inner = getattr(block, "layer", None)
        if isinstance(inner, nn.ModuleList) and len(inner):
            found = _first(inner[0], ATTENTION_NAMES)
    return found


def _attention_site(block: nn.Module, attention: nn.Module, kind: str, layer: int) -> AttentionSite | None:
    projection = _projection(attention)
    if projection is None:
        return None
    module = attention.self if isinstance(getattr(attention, "self", None), nn.Module) else attention  # BERT
    return AttentionSite(module, projection, block, kind, layer)


def _find(model: nn.Module) -> Sites:
    config = getattr(model, "config", None)
    base = getattr(model, "base_model", model)
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    unembedding = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    encoder, decoder = getattr(base, "encoder", None), getattr(base, "decoder", None)
    attention: list[AttentionSite] = []
    if getattr(config, "is_encoder_decoder", False) and encoder is not None and decoder is not None:
        for index, block in enumerate(_stack(encoder)):
            own = _self_attention(block)
            if own is not None and (site := _attention_site(block, own, "encoder", index)) is not None:
                attention.append(site)
        layers = _stack(decoder)
        for index, block in enumerate(layers):
            own = _self_attention(block)
            if own is not None and (site := _attention_site(block, own, "decoder", index)) is not None:
                attention.append(site)
            cross = _first(block, ("encoder_attn", "crossattention", "cross_attn"))
            if cross is not None and (site := _attention_site(block, cross, "cross", index)) is not None:
                attention.append(site)
        final_norm = _first(decoder, FINAL_NORM_NAMES)
    else:
        count = getattr(config, "num_hidden_layers", None)
        layers = _stack(base, count) or _stack(encoder, count)
        for index, block in enumerate(layers):
            own = _self_attention(block)
            if own is not None and (site := _attention_site(block, own, "self", index)) is not None:
                attention.append(site)
        final_norm = _first(base, FINAL_NORM_NAMES[:-1]) if layers else None  # BERT's "layer_norm"s are per block
    return Sites(type(model).__name__, embeddings, tuple(layers), tuple(attention), final_norm, unembedding)


@contextlib.contextmanager
def residual_window(model: nn.Module, start: int, stop: int) -> Iterator[list]:
    """Positions ``start:stop`` of the residual stream as the forward inside the block computes it, nothing else
    kept, in the order transformers' ``hidden_states`` lists it: what enters the first block (the embeddings), what
    leaves every block but the last, and the final norm's output. Yields the list the forward fills (per point,
    ``(stop − start, d)``)."""
    found = sites(model)
    layers = found.require("layers", "reading the residual stream")
    norm = found.require("final_norm", "reading the residual stream")
    slices: list = []

    def keep(point, hidden):
        if point < len(layers):  # the last block's output is read after the final norm instead
            slices.append(hidden[0, start:stop].detach().clone())

    def normed(module, args, output):
        slices.append(hidden_of(output)[0, start:stop].detach().clone())

    with installed(stream_hooks(list(layers), keep), after(norm, normed)):
        yield slices
