"""The only caching in the app: loaded models in ``st.cache_resource`` slots, and every result derived from them in
one kind of store (``_Store``), all made by one cached function (``_stores``) so that they are cleared together
(``st.cache_resource.clear()``) and bounded the same way.

- Models (``load``): one loaded model serves every browser session, so it is never mutated after loading and capture
  keeps its per-call state out of it (models/core/capture.py). Each (spec, device, dtype) has a cached slot, filled under
  a lock by the first session that asks, with a progress bar in that session's page; the server's warm-up
  (app/warmup.py) may have filled it already.
- A ``_Store`` is an LRU bounded by entries, by age and by the bytes its values hold on each device; a value is
  computed once when sessions ask for it at once; entries are tagged with their run, and go when the run goes.
- Runs (``run``): one shared object per run, not a pickled copy (``cache_data`` would unpickle the kept queries and
  keys on every rerun). Results are frozen and their arrays read-only, so sharing them is safe. Bounded by the bytes
  they hold on each device (``RunResult.held_bytes``: a 131,072-token run keeps ~10 GB of q/k on a GPU); a new run
  that does not fit on its device first drops the least recently used runs there.
- Attention recomputed from a result's queries and keys (``cached_maps``): bounded in bytes, keyed by the result's
  ``run_id``, so moving the head slider back does not recompute and a long input cannot fill the memory.
- Analyses and figures (``figure``): keyed by the view, the run and the options that
  matter, and dropped with their run, so that no cached figure keeps a run's maps alive past the run cache's bound.
- Small derived values (a sentence's tokens, a mini's card): the same store, by entries.

``models/`` keeps nothing of its own but per-object memos that die with their object (models/core/memo.py).
"""
from __future__ import annotations

import os
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


# --- caches bounded in bytes ---------------------------------------------------------------------------------------

MB = 2**20
RUN_CACHE_ENTRIES = 32  # small runs are small: the bytes below are what bounds long ones
RUN_CACHE_TTL_S = 3600
# kept runs may hold this much host memory (q/k of CPU runs, residual streams), and this share of a GPU's memory:
# one 131,072-token run of a 1B model keeps ~10.7 GB of q/k on the device, so "eight runs" would be 86 GB
RUN_CACHE_HOST_BYTES = int(float(os.environ.get("ATTN_EXPLORER_RUN_CACHE_MB", "4096")) * MB)
RUN_CACHE_DEVICE_SHARE = float(os.environ.get("ATTN_EXPLORER_RUN_CACHE_GPU_SHARE", "0.5"))
FIGURE_CACHE_ENTRIES = 64
ANALYSIS_CACHE_ENTRIES = 16
ATTENTION_CACHE_BYTES = 512 * MB  # recomputed layers and heads kept across reruns and sessions, newest first


def _device_budget(device: str) -> int | None:
    """Bytes the run cache may hold on ``device`` (None: no bound there)."""
    if device == "cpu":
        return RUN_CACHE_HOST_BYTES
    if device.startswith("cuda"):
        import torch

        index = torch.device(device).index or 0
        return int(torch.cuda.get_device_properties(index).total_memory * RUN_CACHE_DEVICE_SHARE)
    return RUN_CACHE_HOST_BYTES  # MPS shares the host's memory


class _Store:
    """A thread-safe LRU bounded by entries, by age and by the bytes its values hold on each device (``held(value)
    -> {device: bytes}``; the newest entry is always kept). A value is computed once even when sessions ask for it
    at once (the others wait), as ``st.cache_resource`` does; ``on_evict(key, value)`` runs for what is dropped."""

    def __init__(self, max_entries: int, ttl: float | None = None, held=None, budget=None, on_evict=None):
        self.max_entries, self.ttl = max_entries, ttl
        self.held = held or (lambda value: {})
        self.budget = budget or (lambda device: None)
        self.on_evict = on_evict or (lambda key, value: None)
        self._entries: OrderedDict[tuple, tuple[Any, dict, float, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self._computing: dict[tuple, threading.Lock] = {}

    def _fresh(self, key: tuple, dropped: list):
        entry = self._entries.get(key)
        if entry is not None and self.ttl is not None and time.monotonic() - entry[2] > self.ttl:
            dropped.append((key, self._entries.pop(key)[0]))
            return None
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def get(self, key: tuple, compute, tag: Any = None):
        """The value under ``key``, computed by ``compute()`` on a miss; ``tag`` groups entries for ``purge``."""
        dropped: list = []
        try:
            with self._lock:
                entry = self._fresh(key, dropped)
                if entry is not None:
                    return entry[0]
                lock = self._computing.setdefault(key, threading.Lock())
            with lock:
                with self._lock:
                    entry = self._fresh(key, dropped)
                    if entry is not None:
                        return entry[0]
                try:
                    value = compute()
                finally:
                    with self._lock:
                        self._computing.pop(key, None)
                with self._lock:
                    self._entries[key] = (value, self.held(value), time.monotonic(), tag)
                    dropped += self._shrink()
                return value
        finally:
            for old_key, old_value in dropped:
                self.on_evict(old_key, old_value)

    def _totals(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for _, held, _, _ in self._entries.values():
            for device, nbytes in held.items():
                totals[device] = totals.get(device, 0) + nbytes
        return totals

    def _shrink(self) -> list:
        dropped = []
        while len(self._entries) > 1:
            over = [device for device, total in self._totals().items()
                    if (limit := self.budget(device)) is not None and total > limit]
            if len(self._entries) <= self.max_entries and not over:
                break
            newest = next(reversed(self._entries))
            victim = next((key for key, (_, held, _, _) in self._entries.items()
                           if key != newest and (not over or held.get(over[0], 0) > 0)), None)
            if victim is None:
                break
            dropped.append((victim, self._entries.pop(victim)[0]))
        return dropped

    def evict_one(self, device: str) -> bool:
        """Drop the least recently used entry holding memory on ``device`` ("cuda" is any CUDA device's entry, as
        a model loaded on "cuda" holds "cuda:0"); False when none does."""
        def on_device(held: dict) -> bool:
            return any(nbytes > 0 and (name == device or (":" not in device and name.split(":")[0] == device))
                       for name, nbytes in held.items())

        with self._lock:
            victim = next((key for key, (_, held, _, _) in self._entries.items() if on_device(held)), None)
            value = None if victim is None else self._entries.pop(victim)[0]
        if victim is not None:
            self.on_evict(victim, value)
        return victim is not None

    def purge(self, tag: Any) -> None:
        """Drop every entry stored with ``tag``."""
        with self._lock:
            gone = [(key, entry[0]) for key, entry in self._entries.items() if entry[3] == tag]
            for key, _ in gone:
                del self._entries[key]
        for key, value in gone:
            self.on_evict(key, value)

    def peek(self, key: tuple):
        """The value under ``key`` if it is kept (made newest), else None; nothing is computed."""
        dropped: list = []
        with self._lock:
            entry = self._fresh(key, dropped)
        for old_key, old_value in dropped:
            self.on_evict(old_key, old_value)
        return None if entry is None else entry[0]

    def nbytes(self) -> dict[str, int]:
        with self._lock:
            return self._totals()


def _forget_run(key: tuple, result: RunResult) -> None:
    """A run left the cache: what was derived from it goes too, so no figure or analysis keeps its q/k alive."""
    run_id = getattr(result, "run_id", None)
    for name, store in _stores().items():
        if name != "runs":
            store.purge(run_id)


def _array_bytes(value) -> dict[str, int]:
    return {"cpu": int(getattr(value, "nbytes", 0))}


@st.cache_resource(max_entries=1, show_spinner=False)
def _stores() -> dict[str, _Store]:
    """Every store of derived results, made (and cleared: ``st.cache_resource.clear()``) together."""
    return {
        "runs": _Store(RUN_CACHE_ENTRIES, RUN_CACHE_TTL_S, held=lambda result: result.held_bytes(),
                       budget=_device_budget, on_evict=_forget_run),
        "attention": _Store(10_000, RUN_CACHE_TTL_S, held=_array_bytes,
                            budget=lambda device: ATTENTION_CACHE_BYTES),
        "analyses": _Store(ANALYSIS_CACHE_ENTRIES, RUN_CACHE_TTL_S),
        "figures": _Store(FIGURE_CACHE_ENTRIES, RUN_CACHE_TTL_S),
        "small": _Store(64),
    }


def _runs() -> _Store:
    return _stores()["runs"]


def _analyses() -> _Store:
    return _stores()["analyses"]


def _figures() -> _Store:
    return _stores()["figures"]


def _attention() -> _Store:
    return _stores()["attention"]


# --- runs ------------------------------------------------------------------------------------------------------------

def run(loaded: LoadedModel, inputs, options=None) -> RunResult:
    """``families.run`` cached by model, input (``inputs.key``) and options. Cached runs are bounded by the bytes
    they hold on each device; when a new run does not fit on the device (``capture.DoesNotFit``), the least recently
    used runs there are dropped first and it is tried again."""
    from models.core.capture import DoesNotFit

    key = (model_key(loaded), inputs.key, repr(options))
    while True:
        try:
            return _runs().get(key, lambda: families.run(loaded, inputs, options))
        except DoesNotFit:
            if not _runs().evict_one(loaded.device):
                raise
            _release_device_memory(loaded.device)


def _release_device_memory(device: str) -> None:
    import gc

    gc.collect()
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


# --- recomputed attention ---------------------------------------------------------------------------------------------

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

    # reductions: computed by the wrapped maps where their q and k live (never through a cached whole map)
    def tiles(self, *args, **kwargs):
        return self.inner.tiles(*args, **kwargs)

    def window(self, *args, **kwargs):
        return self.inner.window(*args, **kwargs)

    def window_allowed(self, *args, **kwargs):
        return self.inner.window_allowed(*args, **kwargs)

    def row(self, *args, **kwargs):
        return self.inner.row(*args, **kwargs)

    def row_allowed(self, *args, **kwargs):
        return self.inner.row_allowed(*args, **kwargs)

    def held_bytes(self) -> dict[str, int]:
        return self.inner.held_bytes()

    def _key(self, *parts) -> tuple:
        return (self.run_id, self.inner.kind, *parts)

    def _kept(self, key: tuple, compute) -> np.ndarray:
        def read_only():
            value = np.asarray(compute())
            value.setflags(write=False)  # shared between reruns and sessions: nobody edits it in place
            return value

        return _attention().get(key, read_only, tag=self.run_id)

    def layer(self, layer: int) -> np.ndarray:
        return self._kept(self._key("layer", layer), lambda: self.inner.layer(layer))

    def head(self, layer: int, head: int | None) -> np.ndarray:
        whole = _attention().peek(self._key("layer", layer))
        if whole is not None:  # a layer already computed has every head
            return whole.mean(axis=0) if head is None else whole[head]
        return self._kept(self._key("head", layer, head), lambda: self.inner.head(layer, head))

    def iter_heads(self, layer: int):
        whole = _attention().peek(self._key("layer", layer))
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

def _analysis(key: tuple, run_id: str | None, model: tuple | None, view, loaded, result, options):
    """Keyed by the analysis and the options it reads (``View.analysis_key``), not by the view: views that share an
    analysis (the heads table and the thumbnails) share its result."""
    return _analyses().get((key, run_id, model), lambda: view.analysis(loaded, result, options), tag=run_id)


def _figure(name: str, data_key: tuple, options_key: str, data, options, run_id: str | None) -> Figure:
    """Kept while its run is kept: a figure's lazy downloads read the run's maps, so it goes when the run does."""
    return _figures().get((name, data_key, options_key), lambda: figures.build(name, data, options), tag=run_id)


def analysis(name: str, result: RunResult | None = None, options=None,
             loaded: LoadedModel | None = None):
    """The typed result of analysis view ``name`` (what its figure draws, the fields a page
    reads), cached with the figure's: asking for both costs one analysis."""
    view = figures.get(name)
    if view.data != "analysis":
        raise ValueError(f"the view {name!r} draws no analysis")
    options = options if options is not None else view.options()
    return _analysis_of(view, result, options, loaded)[0]


def _analysis_of(view, result, options, loaded) -> tuple[Any, tuple]:
    key = view.analysis_key(options)
    run_id = result.run_id if result is not None else None
    model = None if loaded is None else model_key(loaded)  # two models' tables are two entries
    maps = None if result is None else cached_maps(result)
    data = _analysis(key, run_id, model, view, loaded, maps, options)
    return data, ("analysis", key, run_id, model)


def figure(name: str, result: RunResult | None = None, options=None, loaded: LoadedModel | None = None) -> Figure:
    """View ``name``'s figure of ``result`` with ``options`` (the view's defaults when None), cached; an analysis
    view first runs (and caches) its analysis, for which ``loaded`` is the model that produced ``result``."""
    view = figures.get(name)
    options = options if options is not None else view.options()
    run_id = result.run_id if result is not None else None
    if view.data == "analysis":
        data, data_key = _analysis_of(view, result, options, loaded)
    elif view.data == "result":
        if result is None:
            raise ValueError(f"the view {name!r} draws a run's result; none was given")
        data, data_key = cached_maps(result), ("result", run_id)
    else:
        data, data_key = None, ("options",)
    return _figure(name, data_key, repr(options), data, options, run_id)


# --- mechanics (how attention works, what it costs) --------------------------------------------------------------

def mechanics_tokens(sentence: str) -> list[str]:
    """MiniLM's WordPiece tokens of the layer's sentence (the page sizes its mask settings by them); a ValueError
    says why a sentence cannot be shown."""
    from models.lessons import mechanics

    return _stores()["small"].get(("mechanics tokens", sentence), lambda: mechanics.tokenize(sentence)[0])


# --- model cards ----------------------------------------------------------------------------------------------------

def mini_card(spec: ModelSpec) -> tuple[str, dict | None]:
    """A mini model's card and measured metrics (``models.core.loading.mini_card``); ``("", None)`` for other models."""
    from models.core import loading

    return _stores()["small"].get(("mini card", spec), lambda: loading.mini_card(spec))
