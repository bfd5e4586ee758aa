"""The only caching in the app.

- Models (``load``): one loaded model serves every browser session, so it is never mutated after loading and capture
  keeps its per-call state out of it (models/core/capture.py). Each (spec, device, dtype) has a cached slot, filled under
  a lock by the first session that asks, with a progress bar in that session's page; the server's warm-up
  (app/warmup.py) may have filled it already.
- Runs (``run``): ``st.cache_resource``, not ``st.cache_data``: ``cache_data`` unpickles a fresh copy on every rerun,
  and for long inputs that copy (the kept queries and keys) costs more than the 200 ms a slider move may take.
  Results are frozen and their arrays read-only, so sharing them is safe; ``max_entries`` and ``ttl`` bound memory.
- Attention recomputed from a result's queries and keys (``cached_maps``): a byte-bounded LRU keyed by the result's
  ``run_id``, so moving the head slider back does not recompute and a long input cannot fill the memory.
- Analyses and figures (``analysis``, ``figure``): keyed by the view, the run and the options that matter.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import replace
from typing import Any

import numpy as np
import streamlit as st

from app import run_log, server_cpu, warmup
from models import families
from models.core.loading import LoadedModel
from models.core.results import AttentionMaps, RunResult
from models.core.specs import ModelSpec
from viz import figures
from viz.figure import Figure

RUN_CACHE = dict(max_entries=8, ttl=3600, show_spinner=False)
ATTENTION_CACHE_BYTES = 512 * 2**20  # recomputed layers and heads kept across reruns and sessions, newest first


# --- models --------------------------------------------------------------------------------------------------------

def _with_progress(spec: ModelSpec, load):
    """``load(progress)`` with a progress bar naming each step, removed when done."""
    bar = st.progress(0.0, text=f"Loading {spec.key}…")
    try:
        return load(lambda step, fraction: bar.progress(min(max(fraction, 0.0), 1.0), text=f"{spec.key}: {step}"))
    finally:
        bar.empty()


@st.cache_resource(max_entries=6, show_spinner=False)
def _slot(spec: ModelSpec, device: str, dtype: str) -> dict:
    """The cached holder one model is loaded into. The loading itself happens outside any cached function, so its
    progress bar belongs to the page that asked (a cached function's elements are replayed on every cache hit); the
    lock makes sessions arriving at once load it once."""
    return {"lock": threading.Lock(), "model": None}


def load(spec: ModelSpec, device: str, dtype: str) -> LoadedModel:
    """The loaded model for (spec, device, dtype): cached, or the one the server preloaded, or loaded now with a
    progress bar. A failure is a ``ValueError`` with a message for the page; the next call tries again."""
    slot = _slot(spec, device, dtype)
    with slot["lock"]:
        if slot["model"] is None:
            started = time.perf_counter()
            preloaded = warmup.claim((spec, device, dtype))
            if preloaded is not None:
                with st.spinner(f"Loading {spec.key}…"):
                    slot["model"] = preloaded.result()
            else:
                slot["model"] = _with_progress(spec, lambda progress: families.load(spec, device, dtype, progress))
            run_log.model_loaded(f"{spec.key} {device} {dtype}", preloaded is not None,
                                 time.perf_counter() - started)
            server_cpu.freeze_heap()  # the model (and what its load imported) stays: the per-run collection skips it
        return slot["model"]


def model_key(loaded: LoadedModel) -> tuple:
    """What identifies a loaded model in the run caches (the object itself is not hashed)."""
    return loaded.spec, loaded.device, loaded.dtype


run_key = model_key  # the name the pages not yet rewritten use


# --- runs ------------------------------------------------------------------------------------------------------------

@st.cache_resource(**RUN_CACHE)
def _run(_loaded: LoadedModel, model: tuple, inputs: tuple, options: str, _inputs, _options) -> RunResult:
    return families.run(_loaded, _inputs, _options)


def run(loaded: LoadedModel, inputs, options=None) -> RunResult:
    """``families.run`` cached by model, input (``inputs.key``) and options."""
    return _run(loaded, model_key(loaded), inputs.key, repr(options), inputs, options)


# --- recomputed attention ---------------------------------------------------------------------------------------------

class _BytesLRU:
    """A thread-safe LRU of read-only arrays bounded in bytes, not entries (the newest entry is always kept): at
    2,048 tokens one GPT-2 layer is 201 MB, so "four layers" would be 0.8 GB."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple, compute) -> np.ndarray:
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
        value = compute()
        value.setflags(write=False)  # shared between reruns and sessions: nobody edits it in place
        with self._lock:
            self._entries[key] = value
            while len(self._entries) > 1 and sum(a.nbytes for a in self._entries.values()) > self.max_bytes:
                self._entries.popitem(last=False)
        return value

    def peek(self, key: tuple) -> np.ndarray | None:
        with self._lock:
            return self._entries.get(key)


_attention = _BytesLRU(ATTENTION_CACHE_BYTES)


class CachedMaps(AttentionMaps):
    """An ``AttentionMaps`` whose layers and heads come from the app's byte-bounded cache (keyed by the run and the
    kind), computed by the result's own maps on a miss. Everything else is the wrapped maps'."""

    def __init__(self, inner: AttentionMaps, run_id: str):
        self.inner, self.run_id = inner, run_id

    def __getattr__(self, name: str) -> Any:  # kind, tokens, heads, the subclass's own methods
        return getattr(self.inner, name)

    @property
    def num_layers(self) -> int:
        return self.inner.num_layers

    @property
    def num_heads(self) -> int:
        return self.inner.num_heads

    @property
    def uniform(self) -> bool:
        return self.inner.uniform

    def heads_in(self, layer: int) -> int:
        return self.inner.heads_in(layer)

    def tokens_in(self, layer: int):
        return self.inner.tokens_in(layer)

    def allowed(self, layer: int) -> np.ndarray:
        return self.inner.allowed(layer)

    def _key(self, *parts) -> tuple:
        return (self.run_id, self.inner.kind, *parts)

    def layer(self, layer: int) -> np.ndarray:
        return _attention.get(self._key("layer", layer), lambda: self.inner.layer(layer))

    def head(self, layer: int, head: int | None) -> np.ndarray:
        whole = _attention.peek(self._key("layer", layer))
        if whole is not None:  # a layer already computed has every head
            return whole.mean(axis=0) if head is None else whole[head]
        return _attention.get(self._key("head", layer, head), lambda: np.asarray(self.inner.head(layer, head)))

    def iter_heads(self, layer: int):
        whole = _attention.peek(self._key("layer", layer))
        if whole is not None:
            yield from enumerate(whole)
        else:
            yield from self.inner.iter_heads(layer)


def cached_maps(result: RunResult) -> RunResult:
    """``result`` whose maps read through the app's attention cache (same ``run_id``, same everything else)."""
    if all(isinstance(maps, CachedMaps) for maps in result.attention.values()):
        return result
    return replace(result, attention={kind: maps if isinstance(maps, CachedMaps) else CachedMaps(maps, result.run_id)
                                      for kind, maps in result.attention.items()})


# --- analyses and figures -----------------------------------------------------------------------------------------

@st.cache_resource(max_entries=16, ttl=3600, show_spinner=False)
def _analysis(key: tuple, run_id: str | None, model: tuple | None, _view, _loaded, _result, _options):
    """Keyed by the analysis and the options it reads (``View.analysis_key``), not by the view: views that share an
    analysis (the heads table and the thumbnails) share its result."""
    return _view.analysis(_loaded, _result, _options)


@st.cache_resource(max_entries=64, ttl=3600, show_spinner=False)
def _figure(name: str, data_key: tuple, options: str, _data, _options) -> Figure:
    return figures.build(name, _data, _options)


def figure(name: str, result: RunResult | None = None, options=None, loaded: LoadedModel | None = None) -> Figure:
    """View ``name``'s figure of ``result`` with ``options`` (the view's defaults when None), cached; an analysis
    view first runs (and caches) its analysis, for which ``loaded`` is the model that produced ``result``."""
    view = figures.get(name)
    options = options if options is not None else view.options()
    run_id = result.run_id if result is not None else None
    if view.data == "analysis":
        key = view.analysis_key(options)
        model = None if loaded is None else model_key(loaded)  # two models' tables are two entries
        data = _analysis(key, run_id, model, view, loaded, None if result is None else cached_maps(result), options)
        data_key = ("analysis", key, run_id, model)
    elif view.data == "result":
        if result is None:
            raise ValueError(f"the view {name!r} draws a run's result; none was given")
        data, data_key = cached_maps(result), ("result", run_id)
    else:
        data, data_key = None, ("options",)
    return _figure(name, data_key, repr(options), data, options)


@st.cache_resource(max_entries=16, ttl=3600, show_spinner=False)
def _png(key: tuple, _image) -> bytes:
    from viz import heatmap

    return heatmap.png_bytes(_image)


def figure_png(figure_: Figure, key: tuple) -> bytes:
    """A figure's image as fast PNG bytes (for a chart that embeds it, such as the brushable overview), cached."""
    return _png(key, figure_.image)


# --- mechanics (how attention works, what it costs) --------------------------------------------------------------

@st.cache_data(max_entries=32, show_spinner=False)
def mechanics_tokens(sentence: str) -> list[str]:
    """MiniLM's WordPiece tokens of the layer's sentence (the page sizes its mask settings by them); a ValueError
    says why a sentence cannot be shown."""
    from models.lessons import mechanics

    return mechanics.tokenize(sentence)[0]


# --- model cards ----------------------------------------------------------------------------------------------------

@st.cache_data(max_entries=8, show_spinner=False)
def mini_card(spec: ModelSpec) -> tuple[str, dict | None]:
    """A mini model's card and measured metrics (``models.core.loading.mini_card``); ``("", None)`` for other models."""
    from models.core import loading

    return loading.mini_card(spec)
