"""The only caching in the app.

- Models: ``st.cache_resource``; one loaded model serves every browser session, so it is never mutated after loading
  and capture keeps its per-call state out of it (models/capture.py).
- Runs: ``st.cache_resource`` too, not ``st.cache_data``: ``cache_data`` unpickles a fresh copy on every rerun, and for
  long inputs that copy (the kept queries and keys) costs more than the 200 ms a slider move may take. Results are
  immutable (arrays are handed out read-only), so sharing them is safe; ``max_entries`` and ``ttl`` bound the memory.
"""
from __future__ import annotations

import threading

import streamlit as st

from app import warmup
from models import causal_lm, encoder, loading
from models.analysis import heads
from models.loading import LoadedModel
from models.registry import ModelSpec
from models.results import RunResult

RUN_CACHE = dict(max_entries=8, ttl=3600, show_spinner=False)


def _with_progress(spec: ModelSpec, load):
    """``load(progress)`` with a progress bar naming each step, removed when done.

    Call it from inside the cached loader: Streamlit replays a cached function's elements on a cache hit, which only
    works for elements created while that function ran.
    """
    bar = st.progress(0.0, text=f"Loading {spec.key}…")
    try:
        return load(lambda step, fraction: bar.progress(min(max(fraction, 0.0), 1.0), text=f"{spec.key}: {step}"))
    finally:
        bar.empty()


@st.cache_resource(max_entries=6, show_spinner=False)
def load_model(spec: ModelSpec, device: str, dtype: str) -> LoadedModel:
    """The cached model, with a progress bar naming each step the first time it loads (or the one the server began
    loading at start, app/warmup.py)."""
    preloaded = warmup.claim((spec, device, dtype))
    if preloaded is not None:
        with st.spinner(f"Loading {spec.key}…"):
            return preloaded.result()
    return _with_progress(spec, lambda progress: loading.load(spec, device, dtype, progress))


def run_key(loaded: LoadedModel) -> tuple:
    """What identifies a loaded model in the run caches (the object itself is not hashed)."""
    return loaded.spec, loaded.device, loaded.dtype


# --- text families -----------------------------------------------------------------------------------------------

@st.cache_resource(**RUN_CACHE)
def run_causal_lm(_loaded: LoadedModel, key: tuple, prompt: str, max_tokens: int) -> RunResult:
    return causal_lm.run(_loaded, prompt, max_tokens)


@st.cache_resource(**RUN_CACHE)
def generate_causal_lm(_loaded: LoadedModel, key: tuple, prompt: str, settings: causal_lm.GenerationSettings,
                       max_tokens: int) -> RunResult:
    return causal_lm.generate(_loaded, prompt, settings, max_tokens)


@st.cache_resource(**RUN_CACHE)
def run_encoder(_loaded: LoadedModel, key: tuple, sentence: str, max_tokens: int) -> RunResult:
    return encoder.run(_loaded, sentence, max_tokens)


@st.cache_resource(**RUN_CACHE)
def head_summary(_result: RunResult, key: tuple, kind: str) -> heads.HeadSummary:
    """Thumbnails and statistics of every head; ``key`` identifies the run (model key + input + settings)."""
    return heads.summarize(_result.maps(kind))


@st.cache_resource(max_entries=16, show_spinner=False)
def overview_png(_weights, _allowed, key: tuple, scheme: str) -> tuple[bytes, float]:
    """A large map's overview PNG and the weight its top colour stands for; ``key`` = (run, kind, layer, head).
    Cached so that zooming (the most frequent move) re-draws only the 64 × 64 region, not the whole image."""
    from viz import heatmap

    return heatmap.overview_png(_weights, _allowed, scheme)


# --- mechanics (how attention works, what it costs) --------------------------------------------------------------

@st.cache_data(max_entries=32, show_spinner=False)
def mechanics_embeddings(sentence: str, d_model: int, source: str, seed: int):
    """(tokens, X float64 (N, D)) for the step-by-step layer; small, so cached by value."""
    from models import mechanics

    return mechanics.embed(sentence, d_model, source, seed)


@st.cache_data(max_entries=16, show_spinner=False)
def mechanics_entropy_curve(sentence: str, d_model: int, source: str, seed: int, heads: int):
    from models import mechanics

    _, x = mechanics.embed(sentence, d_model, source, seed)
    return mechanics.softmax_entropy_by_d_k(x, heads=heads)


@st.cache_resource(show_spinner=False)
def kv_cache_presets():
    """KV-cache specs of the app's own models (read from their configs) and of published ones, read once."""
    from models import cost

    report = cost.app_model_kv_specs()
    return report.specs, cost.published_kv_specs(), report.skipped


# --- positional encodings ----------------------------------------------------------------------------------------

@st.cache_resource(max_entries=1, show_spinner="Creating an untrained ViT…")
def untrained_vit_positions():
    """The random initial ``pos_embed`` grid of timm's vit_tiny (no weights downloaded); read-only, shared."""
    from models import positional

    return positional.untrained_vit_positions()


# --- mixture of experts ------------------------------------------------------------------------------------------

@st.cache_resource(**RUN_CACHE)
def run_moe(_loaded: LoadedModel, key: tuple, text: str, max_tokens: int) -> RunResult:
    from models import moe

    return moe.run(_loaded, text, max_tokens)


@st.cache_resource(**RUN_CACHE)
def moe_statistics(_result: RunResult, key: tuple):
    """Balance, consistency and specialisation of one routing (the shuffled baseline takes about a second)."""
    from models.analysis import routing as stats

    routing = _result.extras["routing"]
    return (stats.summarise(routing.probs, routing.top_experts, routing.kept),
            stats.cross_layer_consistency(routing.top1), stats.consecutive_repeat_rate(routing.top1),
            stats.specialisation(routing.top_experts, routing.categories, shuffles=100))


@st.cache_data(max_entries=4, show_spinner=False)
def moe_mini_card(folder: str) -> tuple[dict, str] | None:
    """The mini MoE's measured metrics and card, or None before it is trained."""
    import json
    from pathlib import Path

    path = Path(folder)
    if not (path / "metrics.json").is_file():
        return None
    return json.loads((path / "metrics.json").read_text()), (path / "card.md").read_text()


# --- vision transformers (ViT) -----------------------------------------------------------------------------------

@st.cache_resource(max_entries=4, show_spinner=False)
def _vit_slot(spec: ModelSpec, device: str, dtype: str) -> dict:
    """A cached holder the ViT is loaded into, outside any cached function, so the progress bar is never replayed
    into a page that no longer has it; the lock makes concurrent sessions load once."""
    return {"lock": threading.Lock(), "model": None}


def load_vit(spec: ModelSpec, device: str, dtype: str):
    """The cached timm ViT (``models.vit.LoadedVision``), loaded once per (spec, device, dtype) with a progress bar."""
    from models import vit

    slot = _vit_slot(spec, device, dtype)
    with slot["lock"]:
        if slot["model"] is None:
            slot["model"] = _with_progress(spec, lambda progress: vit.load(spec, device, dtype, progress))
    return slot["model"]


@st.cache_resource(**RUN_CACHE)
def run_vit(_loaded: LoadedModel, key: tuple, image_key: str, _image) -> RunResult:
    """One image through one ViT; ``image_key`` (a digest of the pixels) identifies the image."""
    from models import vit

    return vit.run(_loaded, _image)


@st.cache_resource(max_entries=32, ttl=3600, show_spinner=False)
def vit_rollout(_result: RunResult, key: tuple, image_key: str, head_fusion: str, discard_ratio: float):
    """[CLS] rollout over the patch grid ``(rows, cols)`` for the chosen head fusion and discard ratio."""
    from models.analysis import rollout

    info = _result.image
    query = 0 if info.num_prefix_tokens and info.prefix_names[0] == "[CLS]" else None
    maps = _result.maps("self")
    return rollout.cls_rollout([maps.layer(i) for i in range(maps.num_layers)], info.num_prefix_tokens,
                               info.patch_grid, head_fusion, discard_ratio, query)


@st.cache_resource(max_entries=8, ttl=3600, show_spinner=False)
def vit_distances(_result: RunResult, key: tuple, image_key: str):
    """Mean attention distance ``(layers, heads)`` in pixels."""
    from models.analysis import attention_distance

    info = _result.image
    maps = _result.maps("self")
    return attention_distance.mean_attention_distance([maps.layer(i) for i in range(maps.num_layers)],
                                                      info.patch_grid, info.patch_size, info.num_prefix_tokens)


@st.cache_resource(max_entries=16, ttl=3600, show_spinner=False)
def vit_attribution(_loaded: LoadedModel, key: tuple, image_key: str, _image, target: int, method: str, steps: int):
    """A captum attribution of class ``target`` (``models.vit_attribution.Attribution``)."""
    from models import vit_attribution

    return vit_attribution.attribute(_loaded, _image, target, method, steps)


# --- Swin Transformer --------------------------------------------------------------------------------------------

@st.cache_resource(max_entries=3, show_spinner=False)
def load_swin(spec: ModelSpec, device: str, dtype: str):
    """The cached timm Swin (eager window attention per module), with a progress bar the first time it loads."""
    from models import swin

    return _with_progress(spec, lambda progress: swin.load(spec, device, dtype, progress))


@st.cache_resource(**RUN_CACHE)
def run_swin(_loaded: LoadedModel, key: tuple, image_key: str, _image) -> RunResult:
    """One image through one Swin with every block's window attention captured; ``image_key`` names the pixels."""
    from models import swin

    return swin.run(_loaded, _image)


@st.cache_data(max_entries=4, show_spinner=False)
def swin_card(spec: ModelSpec) -> tuple[str, dict | None]:
    """The mini Swin's card and measured metrics; ``("", None)`` for hub and local models."""
    from models import swin

    return swin.model_card(spec)


# --- translation (encoder–decoder) -------------------------------------------------------------------------------

@st.cache_resource(max_entries=4, show_spinner=False)
def load_translation(spec: ModelSpec, device: str, dtype: str) -> LoadedModel:
    """A cached translation model (transformers with capture, or the project's GRUs); the progress bar is created
    inside the cached function, as ``load_model`` explains."""
    from models import translation

    return _with_progress(spec, lambda progress: translation.load(spec, device, dtype, progress))


@st.cache_resource(**RUN_CACHE)
def run_translation(_loaded: LoadedModel, key: tuple, sentence: str, settings) -> RunResult:
    from models import translation

    return translation.run(_loaded, sentence, settings)


@st.cache_data(max_entries=4, show_spinner=False)
def translation_quality(modified: float) -> dict | None:
    """The minis' measured quality (``sample_data/translation/metrics.json``); ``modified`` keys the cache."""
    import json

    path = loading.SAMPLE_DATA / "translation" / "metrics.json"
    return json.loads(path.read_text()) if path.is_file() else None


@st.cache_resource(show_spinner=False)
def translation_showcase():
    """Named grammar sentences with gold word alignments (the page's presets)."""
    from models.minis.translation import grammar

    return grammar.showcase_pairs()
