"""One way to reach inside a model: named sites, found once per architecture, and hooks that act only for the call
that installed them (DESIGN.md, "Capture that is proven"; TransformerLens's hook points are the model).

A loaded model is cached and shared by every browser session, and a hook registered on one of its modules fires for
every forward run while it is registered, whoever runs it. So every hook in this project is installed here:

    site = sites.of(model)                                # embeddings, layers, attention, final norm, unembedding
    with installed(before(site.layers[0], keep), after(site.final_norm, keep)):
        model(input_ids)                                  # this call's forwards run the hooks
    # removed here, in ``finally``, even if the forward raised

A hook acts only for the forwards of the ``with`` block that installed it: each block marks itself active in a
``ContextVar`` (per thread, and per asyncio task), and the hooks it installed do nothing for forwards run anywhere
else. Two sessions running the same cached model at once each see only their own hooks; nothing is stored on a
shared module. Blocks nest (patching inside a recording).

The attention function itself (queries and keys after RoPE, the mask) is reached through transformers'
``AttentionInterface`` (models/core/capture.py), not through a module hook; where things are in a model (its
blocks, attention modules, final norm, unembedding) is models/core/sites.py.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
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


@contextlib.contextmanager
def apart() -> Iterator[None]:
    """Inside the block, no enclosing ``installed`` block's hooks act (a check the code runs on its own)."""
    token = _ACTIVE.set(frozenset())
    try:
        yield
    finally:
        _ACTIVE.reset(token)


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
