"""Long inputs: summary statistics against hand computations, image pixels against the matrix, and the memory the
long-input path claims (RecomputedAttention.nbytes, one head's recompute peak) measured at n = 4,096."""
from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from models.analysis import heads
from models.core import capture
from models.core.results import CausalMask, RecomputedAttention, StoredAttention
from tests.conftest import ROOT
from viz import heatmap

# --- summary statistics ------------------------------------------------------------------------------------------

# two heads over three tokens, causal: rows are probability distributions, the upper triangle is 0
HAND = np.array([
    [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.25, 0.25, 0.5]],
    [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 1.0, 0.0]],
], dtype=np.float32)


def test_statistics_equal_hand_computations():
    stats = heads.layer_statistics(HAND)
    # head 0 — entropy (bits) per row: 0, 1, 1.5 -> 2.5 / 3; distance per row: 0, 0.5·1, 0.25·2 + 0.25·1 -> 1.25 / 3
    # first token: (1 + 0.5 + 0.25) / 3; previous token (rows 1, 2): (0.5 + 0.25) / 2; diagonal: (1 + 0.5 + 0.5) / 3
    # head 1 — entropy 0; distance (0 + 0 + 1) / 3; first token 1 / 3; previous (0 + 1) / 2; diagonal (1 + 1 + 0) / 3
    np.testing.assert_allclose(stats["entropy_bits"], [2.5 / 3, 0.0], atol=1e-6)
    np.testing.assert_allclose(stats["mean_distance"], [1.25 / 3, 1 / 3], atol=1e-6)
    np.testing.assert_allclose(stats["first_token"], [1.75 / 3, 1 / 3], atol=1e-6)
    np.testing.assert_allclose(stats["previous_token"], [0.375, 0.5], atol=1e-6)
    np.testing.assert_allclose(stats["diagonal"], [2 / 3, 2 / 3], atol=1e-6)


def test_summary_over_layers_and_its_table():
    second = HAND[::-1].copy()  # layer 1: the heads swapped
    maps = StoredAttention("self", list("abc"), list("abc"), [HAND, second])
    summary = heads.summarize(maps, size=2)
    assert summary.thumbnails.shape == (2, 2, 2, 2)
    # block means with 3 -> 2 bins (edges 0, round(1.5) = 2): rows {0, 1}, {2}; columns {0, 1}, {2}
    np.testing.assert_allclose(summary.thumbnails[0, 0], [[(1 + 0 + 0.5 + 0.5) / 4, 0.0], [(0.25 + 0.25) / 2, 0.5]])
    np.testing.assert_allclose(summary.statistics["previous_token"], [[0.375, 0.5], [0.5, 0.375]], atol=1e-6)
    table = heads.summary_table(summary)
    assert list(table.columns) == ["layer", "head", *heads.STATISTICS.values()]
    assert len(table) == 4  # row i = layer i // heads, head i % heads (the page opens a picked row this way)
    row = table.iloc[3]
    assert (row["layer"], row["head"]) == (1, 1)
    assert row[heads.STATISTICS["previous_token"]] == pytest.approx(0.375)
    assert table.sort_values(heads.STATISTICS["entropy_bits"]).iloc[0][heads.STATISTICS["entropy_bits"]] == 0


def _random_recomputed(n=40, heads_=4, kv_heads=2, d=8, layers=2, bias=True, seed=0) -> RecomputedAttention:
    rng = np.random.default_rng(seed)
    allowed = np.tril(np.ones((n, n), dtype=bool))
    allowed[:, :3] &= False  # the first keys padded away; no query sees them
    return RecomputedAttention(
        "self", [str(i) for i in range(n)], [str(i) for i in range(n)],
        queries=[rng.standard_normal((heads_, n, d), dtype=np.float32) for _ in range(layers)],
        keys=[rng.standard_normal((kv_heads, n, d), dtype=np.float32) for _ in range(layers)],
        scalings=[d ** -0.5] * layers, allowed_masks=[allowed], mask_index=[0] * layers,
        biases=[rng.standard_normal((heads_, n, n)).astype(np.float32) for _ in range(layers)] if bias else [])


def test_one_head_recomputed_alone_equals_the_layer():
    maps = _random_recomputed()
    alone = [maps.head(1, h).copy() for h in range(maps.num_heads)]  # before the layer is ever computed
    mean = maps.head(1, None).copy()
    summary = heads.summarize(maps)
    layer = maps.layer(1)
    for h in range(maps.num_heads):
        np.testing.assert_allclose(alone[h], layer[h], atol=1e-6)
    np.testing.assert_allclose(mean, layer.mean(axis=0), atol=1e-6)
    layerwise = heads.layer_statistics(layer)
    for name in heads.STATISTICS:
        np.testing.assert_allclose(summary.statistics[name][1], layerwise[name], atol=1e-5)
    assert np.all(layer[:, :, :3] == 0)  # masked entries exactly 0
    np.testing.assert_allclose(layer[:, 3:].sum(-1), 1, atol=1e-5)  # rows that see a key sum to 1
    assert np.all(layer[:, :3] == 0)  # a query that sees no key has an all-zero row
    with pytest.raises(ValueError, match="head 9"):
        maps.head(0, 9)


def test_results_hold_no_cache_and_the_app_cache_is_bounded_in_bytes(monkeypatch):
    """Recomputed heads are not kept on the (frozen, shared) result; the app keeps them in one LRU bounded in bytes,
    keyed by the run, and hands back exactly what the result computes."""
    from app import resources

    maps = _random_recomputed(n=64)
    before = dict(vars(maps))
    for h in range(4):
        maps.head(0, h)
    maps.layer(1)
    assert vars(maps) == before  # nothing was stored on the maps
    cache = resources._Store(10_000, held=resources._array_bytes,
                             budget=lambda device: 3 * 64 * 64 * 4)  # room for three single heads
    monkeypatch.setattr(resources, "_attention", lambda: cache)
    cached = resources.CachedMaps(maps, "run-1")
    for h in range(4):
        np.testing.assert_array_equal(cached.head(0, h), maps.head(0, h))
    assert cache.nbytes()["cpu"] <= 3 * 64 * 64 * 4
    assert ("run-1", "self", "head", 0, 0) not in cache._entries  # the oldest head went first
    cached.layer(1)  # one layer (4 heads) is larger than the budget: it is kept alone
    assert list(cache._entries) == [("run-1", "self", "layer", 1)]
    cache.purge("run-1")  # and it goes with its run
    assert not cache._entries
    np.testing.assert_array_equal(cached.head(1, 2), maps.head(1, 2))  # served from the cached layer
    assert not cached.head(1, 2).flags.writeable


# --- the image heatmap is the matrix -----------------------------------------------------------------------------

def _expected_rgb(weights, allowed, scheme="viridis"):
    lut = heatmap._colormap(scheme)
    rgb = lut[np.round(np.clip(weights / weights.max(), 0, 1) * 255).astype(int)]
    rgb[~allowed] = heatmap.MASKED_RGB
    return rgb


def test_image_pixels_match_the_matrix():
    rng = np.random.default_rng(1)
    n = 300
    weights = rng.random((n, n)).astype(np.float32)
    allowed = np.tril(np.ones((n, n), dtype=bool))
    weights[~allowed] = 0
    expected = _expected_rgb(weights, allowed)
    assert np.array_equal(heatmap.attention_rgb(weights, allowed), expected)
    image = heatmap.attention_image(weights, allowed, max_px=900)  # 3 pixels a cell
    pixels = np.asarray(Image.open(io.BytesIO(heatmap.png_bytes(image))).convert("RGB"))  # what the page sends
    assert pixels.shape == (900, 900, 3)
    assert np.array_equal(pixels[::3, ::3], expected) and np.array_equal(pixels[2::3, 1::3], expected)
    assert tuple(pixels[0, 899]) == heatmap.MASKED_RGB and tuple(pixels[899, 0]) != heatmap.MASKED_RGB


def test_image_beyond_max_px_shows_block_maxima():
    n, factor = 2050, 3  # more tokens than pixels: ceil(2050 / 900) = 3 cells per pixel, the last block partial
    weights = np.zeros((n, n), dtype=np.float32)
    allowed = np.tril(np.ones((n, n), dtype=bool))
    weights[1000, 7] = 1.0  # a single strong cell must stay visible
    weights[2049, 2049] = 0.5  # in the partial last block
    image = np.asarray(heatmap.attention_image(weights, allowed, max_px=900))
    assert image.shape == (684, 684, 3)
    lut = heatmap._colormap("viridis")
    assert tuple(image[1000 // factor, 7 // factor]) == tuple(lut[255])
    assert tuple(image[2049 // factor, 2049 // factor]) == tuple(lut[128])
    assert tuple(image[0, 683]) == heatmap.MASKED_RGB  # a block with no visible cell stays grey
    assert tuple(image[1, 0]) == tuple(lut[0])
    blocks, shown = heatmap.block_max(weights, allowed, factor)
    assert np.array_equal(heatmap.attention_rgb(blocks, shown), image)


# --- memory: the long-input path at n = 4,096 on a tiny model ----------------------------------------------------

def _peak_bytes(fn, attempts: int = 3):
    """(fn(), the peak of the process's resident memory above its level before the call): numpy and torch alike
    (tracemalloc sees numpy's allocations only). Linux's VmHWM, reset through /proc/self/clear_refs. The smallest
    peak of ``attempts`` calls: a first call pages in code, while an allocation of the call itself shows in every
    attempt. Only the call's own in a process of its own (``measured_alone``)."""
    import gc

    from bench.measure import peak_rss_bytes, reset_peak_rss, rss_bytes
    from models.core import memory

    memory.use_fixed_mmap_threshold()  # as the app sets its process up: large blocks are returned when freed
    peaks = []
    for _ in range(attempts):
        result = None
        gc.collect()
        memory.release_freed_heap()
        before = rss_bytes()
        reset_peak_rss()
        result = fn()
        peaks.append(peak_rss_bytes() - before)
    return result, min(peaks)


NOISE_BYTES = 4 * 2**20  # what the measuring process itself adds to a peak (code paged in, allocator slack)


def measured_alone(function) -> dict:
    """``function()`` (a module-level function of a test module that returns numbers) run in a new Python process.
    In a process that has run other tests, glibc serves the call's blocks from the heap's freed chunks, whose pages
    stay resident when freed again, so RSS counts every block the call touched rather than those alive at once: the
    all-heads summary at 4,096 tokens peaked at 82 MB after the app and corpus tests (in CI 82.7 and 94.4 MB) and at
    47 MB alone; a fresh process with 400 MB of freed, pinned heap reproduces it (77 MB)."""
    code = f"import json; from {function.__module__} import {function.__name__} as f; print(json.dumps(f()))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


N, LAYERS, HEADS, D = 4096, 2, 2, 8


def _long_maps() -> RecomputedAttention:
    """A tiny GPT-2 run on 4,096 tokens through capture: the long path's q/k and causal mask, as the app keeps them."""
    import transformers

    capture.register()
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=1000, n_embd=HEADS * D, n_layer=LAYERS, n_head=HEADS,
                                     n_positions=N, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel._from_config(config, attn_implementation="capture").eval()
    with torch.inference_mode(), capture.recording(model) as recorder:
        model(input_ids=torch.randint(0, 1000, (1, N)), use_cache=False, logits_to_keep=1)
    return recorder.attention_maps("self")


def long_input_peaks() -> dict:
    """The RSS peaks of one head's whole map and of the all-heads summary at 4,096 tokens, with their bounds."""
    maps = _long_maps()
    one_head, head_peak = _peak_bytes(lambda: maps.head(1, 1))
    map_bytes = one_head.nbytes
    del one_head
    summary, summary_peak = _peak_bytes(lambda: heads.summarize(maps))  # the all-heads grid: streamed
    return {"head_peak": head_peak, "head_bound": maps.head_peak_bytes(), "map_bytes": map_bytes,
            "summary_peak": summary_peak, "summary_bound": maps.reduction_peak_bytes() + summary.thumbnails.nbytes}


def test_long_input_keeps_only_its_queries_and_keys_and_a_head_is_exact():
    maps = _long_maps()
    # claimed: queries + keys in float32 (1 MB) and the causal mask as its rules (0 bytes), nothing else
    claimed = 2 * LAYERS * HEADS * N * D * 4
    assert maps.nbytes() == claimed and maps.held_bytes() == {"cpu": claimed}
    assert all(isinstance(mask, CausalMask) for mask in maps.allowed_masks) and len(maps.allowed_masks) == 1
    # q and k are compact copies (GPT-2's are views into the fused q|k|v projection, which must not stay alive)
    for tensor in maps.queries + maps.keys:
        assert tensor.is_contiguous() and tensor.untyped_storage().nbytes() == tensor.nbytes
    one_head = maps.head(1, 1)
    assert one_head.shape == (N, N)
    np.testing.assert_allclose(one_head[N - 1].sum(), 1, atol=1e-4)
    assert np.all(one_head[0, 1:] == 0)
    assert heads.summarize(maps).thumbnails.shape == (LAYERS, HEADS, 64, 64)


def test_long_input_stays_within_its_memory_bound():
    peaks = measured_alone(long_input_peaks)
    # one head: the float32 map (64 MB at 4,096 tokens) + one chunk of rows; and the measurement sees the map itself
    assert peaks["map_bytes"] * 0.9 <= peaks["head_peak"] <= peaks["head_bound"], peaks
    # the all-heads grid: one chunk of rows (64 MB on a CPU), never a (q, k) map
    assert peaks["summary_peak"] <= peaks["summary_bound"] + NOISE_BYTES, peaks


# --- token text never becomes a Vega expression ------------------------------------------------------------------

def _sorts(spec):
    """Every ``sort`` value anywhere in a Vega-Lite spec."""
    if isinstance(spec, dict):
        return [v for k, v in spec.items() if k == "sort"] + [s for v in spec.values() for s in _sorts(v)]
    if isinstance(spec, list):
        return [s for v in spec for s in _sorts(v)]
    return []


def test_charts_sort_tokens_by_position_not_by_a_token_list():
    # Vega-Lite compiles a sort list into an expression; in the browser a token "if" then broke the whole chart
    tokens = ["if", "else", "this", "if"]
    weights = np.full((4, 4), 0.25, dtype=np.float32)
    charts = [heatmap.attention_chart(weights, tokens, tokens), heatmap.token_bars(weights[0], tokens),
              heatmap.probability_bars(tokens, [0.4, 0.3, 0.2, 0.1], highlight="if")]
    for chart in charts:
        sorts = _sorts(chart.to_dict())
        assert sorts and all(isinstance(s, dict) and s.get("field") for s in sorts), sorts


def test_overview_saturates_at_the_median_row_maximum():
    weights = np.zeros((100, 100), dtype=np.float32)
    allowed = np.tril(np.ones((100, 100), dtype=bool))
    weights[np.arange(100), np.arange(100)] = np.linspace(0.1, 1.0, 100)  # row maxima 0.1 … 1.0
    image, vmax = heatmap.overview_image(weights, allowed)
    assert vmax == pytest.approx(np.median(np.linspace(0.1, 1.0, 100)))
    pixels = np.asarray(Image.open(io.BytesIO(heatmap.png_bytes(image))).convert("RGB"))
    expected = np.asarray(heatmap.attention_image(weights, allowed, vmax=vmax))
    assert np.array_equal(pixels, expected)
    assert tuple(pixels[-1, -1]) == tuple(heatmap._colormap("viridis")[255])  # above vmax: the top colour


@pytest.mark.parametrize("head, named", [(3, "layer 0, head 3"), (None, "layer 0, average of heads")])
def test_a_long_map_is_one_overview_image_named_by_its_head(head, named):
    """Past 64 tokens the head view draws the whole map as one image; its caption names the head as the page always
    has ("layer 0, head 3: all 100 × 100"), which the browser test of the 2,048-token page reads."""
    from models.core.results import ModelInfo, TextResult
    from viz import figures
    from viz.figures.attention import HeadOptions

    n = 100
    causal = np.tril(np.ones((n, n), dtype=np.float32))
    layer = np.stack([causal / causal.sum(-1, keepdims=True)] * 4)
    tokens = [f"t{i}" for i in range(n)]
    result = TextResult(model=ModelInfo("tiny", "causal_lm", "mini", "cpu", "float32", "test"), tokens=tokens,
                        attention={"self": StoredAttention("self", tokens, tokens, [layer], causal.astype(bool))})
    figure = figures.build("head", result, HeadOptions(layer=0, head=head))
    assert figure.chart is None and figure.image is not None
    assert figure.caption.startswith(f"{named}: all {n} × {n}. Colours saturate at "), figure.caption


def test_every_store_of_derived_results_is_cleared_together():
    """One mechanism (issue 40): the runs, recomputed attention, analyses, figures, PNGs and small values are all
    ``_Store``s made by one cached function, so clearing Streamlit's resource cache empties every one of them."""
    import streamlit as st

    from app import resources

    stores = resources._stores()
    assert all(isinstance(store, resources._Store) for store in stores.values())
    class Kept(np.ndarray):  # what a run holds (held_bytes) and an array's bytes, for any store
        def held_bytes(self):
            return {"cpu": self.nbytes}

    for name, store in stores.items():
        store.get((name, 1), lambda: np.zeros(3).view(Kept))
    st.cache_resource.clear()
    assert all(not store._entries for store in resources._stores().values())
