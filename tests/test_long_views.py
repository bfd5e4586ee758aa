"""Long inputs end to end: capture keeps q/k where the model runs with masks described, every view is a reduction
computed from them that equals the whole map's numbers, a view at 16,384 tokens allocates far less than the map, a
run that does not fit is refused with a message (and the page keeps serving), and caches are bounded in bytes."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from streamlit.testing.v1 import AppTest

from models.analysis import heads
from models.core import capture, memory_fit, results, tiles
from models.core.inputs import TextInput
from models.core.results import CausalMask, DescribedMask, RecomputedAttention, RelativeBias
from tests.conftest import ROOT, tiny_model
from tests.test_long_inputs import _peak_bytes, measured_alone


@pytest.fixture
def streamed(monkeypatch):
    """Every RecomputedAttention of the test streams its views (what a long input or a GPU run does)."""
    monkeypatch.setattr(results, "DENSE_CELLS", 0)


@pytest.fixture(scope="module")
def padded():
    """A tiny Llama (GQA) on a left-padded batch of two prompts, captured and run eagerly."""
    model = tiny_model("llama")
    ids = torch.randint(5, 30000, (2, 23), generator=torch.Generator().manual_seed(1))
    attention_mask = torch.ones_like(ids)
    attention_mask[1, :7] = 0  # item 1: 7 padding tokens on the left
    with torch.inference_mode(), capture.recording(model) as recorder:
        model(input_ids=ids, attention_mask=attention_mask, use_cache=False)
    model.set_attn_implementation("eager")
    with torch.inference_mode():
        eager = model(input_ids=ids, attention_mask=attention_mask, use_cache=False, output_attentions=True)
    return recorder, eager.attentions


def test_a_padded_batch_is_kept_as_rules_and_its_maps_are_the_eager_models(padded, streamed):
    recorder, eager = padded
    record = recorder.records["self"][0]
    assert isinstance(record.allowed, tuple) and record.allowed[1].key_start == 7 and record.allowed[1].causal
    for item in (0, 1):
        maps = recorder.attention_maps("self", item)
        assert all(isinstance(mask, DescribedMask) for mask in maps.allowed_masks)
        for layer in range(maps.num_layers):
            expected = eager[layer][item].numpy()
            seen = maps.allowed(layer)
            np.testing.assert_allclose(maps.layer(layer)[:, seen.any(-1)], expected[:, seen.any(-1)], atol=1e-5)
            np.testing.assert_array_equal(maps.layer(layer)[:, :, ~seen.any(0)], 0)  # padded keys: exactly 0
    padded = recorder.attention_maps("self", 1)
    assert not padded.allowed(0)[:7].any()  # padding queries see nothing: all-zero rows
    np.testing.assert_array_equal(padded.row(0, 1, 3), 0)


def _dense_summary(maps: RecomputedAttention, layer: int) -> tuple[np.ndarray, dict]:
    whole = maps.layer(layer)  # (heads, q, k), the whole maps' path
    return heads.pooled(whole), heads.layer_statistics(whole)


@pytest.mark.parametrize("item", [0, 1])
def test_every_reduction_equals_the_whole_map(padded, item, monkeypatch):
    recorder, _ = padded
    maps = recorder.attention_maps("self", item)
    whole = {(layer, head): maps.head(layer, head) for layer in range(2) for head in (0, 3, None)}
    thumbnails, statistics = _dense_summary(maps, 1)
    monkeypatch.setattr(results, "DENSE_CELLS", 0)  # from here on the reductions stream
    assert maps.streams
    for (layer, head), weights in whole.items():
        allowed = maps.allowed(layer)
        found = maps.tiles(layer, head, (2, 21), (1, 23), tile=(4, 5))
        expected = results.Tiles.of(weights[2:21, 1:23], allowed[2:21, 1:23], found.query_edges, found.key_edges)
        np.testing.assert_allclose(found.maximum, expected.maximum, atol=1e-6)
        np.testing.assert_allclose(found.mean, expected.mean, atol=1e-6)
        np.testing.assert_array_equal(found.visible, expected.visible)
        np.testing.assert_allclose(found.row_max, expected.row_max, atol=1e-6)
        np.testing.assert_allclose(maps.window(layer, head, (5, 9), (0, 23)), weights[5:9], atol=1e-6)
        np.testing.assert_allclose(maps.row(layer, head, 22), weights[22], atol=1e-6)
        np.testing.assert_array_equal(maps.row_allowed(layer, 22), allowed[22])
    streamed_thumbnails, streamed_statistics = maps.layer_summary(1)
    np.testing.assert_allclose(streamed_thumbnails, thumbnails, atol=1e-6)
    for name, values in statistics.items():
        np.testing.assert_allclose(streamed_statistics[name], values, atol=2e-5, err_msg=name)


def test_a_relative_bias_is_kept_as_one_vector_per_head():
    """A T5-style bias (a function of j − i per head) is recognised and kept as (heads, q + k − 1); one that is no
    such function stays whole. Both give the maps the whole bias gives."""
    q_len, k_len, heads_ = 6, 9, 2
    buckets = torch.randn(heads_, q_len + k_len - 1)
    index = torch.arange(k_len)[None, :] - torch.arange(q_len)[:, None] + q_len - 1
    bias = buckets[:, index][None]  # (1, H, q, k)
    relative = capture._relative(bias)
    torch.testing.assert_close(relative, buckets[None])
    assert capture._relative(bias + torch.randn_like(bias) * 1e-3) is None
    generator = torch.Generator().manual_seed(0)
    query, key = torch.randn(heads_, q_len, 8, generator=generator), torch.randn(heads_, k_len, 8, generator=generator)
    common = dict(kind="self", query_tokens=list("abcdef"), key_tokens=list("abcdefghi"), queries=[query],
                  keys=[key], scalings=[0.3], allowed_masks=[DescribedMask(q_len, k_len)], mask_index=[0])
    kept = RecomputedAttention(**common, biases=[RelativeBias(buckets)])
    dense = RecomputedAttention(**common, biases=[bias[0]])
    np.testing.assert_allclose(kept.layer(0), dense.layer(0), atol=1e-6)
    assert kept.nbytes() < dense.nbytes()


def test_a_causal_mask_over_a_window_keeps_its_rules():
    mask = CausalMask(10, 10)
    window = mask.shifted((4, 8), (2, 9))
    np.testing.assert_array_equal(window.array(), mask.array()[4:8, 2:9])
    padded = DescribedMask(10, 12, True, key_start=3, key_stop=11, offset=2)
    np.testing.assert_array_equal(padded.shifted((1, 7), (4, 12)).array(), padded.array()[1:7, 4:12])
    assert capture.describe_mask(torch.from_numpy(padded.array())).rules() == padded.rules()
    odd = torch.from_numpy(mask.array())
    odd[5, 2] = False  # a hole no rule describes
    assert capture.describe_mask(odd) is None


# --- memory: a view at 16,384 tokens ---------------------------------------------------------------------------------

def view_peaks_at_16384_tokens() -> dict:
    """RSS peaks of the overview, a row and a window at 16,384 tokens, and of a 128 MB probe, with the views' checks."""
    n, d = 16_384, 16
    generator = torch.Generator().manual_seed(0)
    maps = RecomputedAttention(
        "self", [str(i) for i in range(n)], [str(i) for i in range(n)],
        queries=[torch.randn(2, n, d, generator=generator).half()],
        keys=[torch.randn(1, n, d, generator=generator).half()],
        scalings=[d ** -0.5], allowed_masks=[CausalMask(n, n)], mask_index=[0])
    _, probe = _peak_bytes(lambda: torch.ones(n * n // 8))
    overview, overview_peak = _peak_bytes(lambda: maps.tiles(0, 1, tile=tiles.pyramid_tile(n, 900)))
    row, row_peak = _peak_bytes(lambda: maps.row(0, 0, n - 1))
    window, window_peak = _peak_bytes(lambda: maps.window(0, None, (n - 64, n), (n - 64, n)))
    return {"streams": maps.streams, "probe": probe, "overview_shape": list(overview.shape),
            "overview": overview_peak, "row_sum": float(row.sum()), "row_shape": list(row.shape), "row": row_peak,
            "window_shape": list(window.shape), "window": window_peak}


def test_a_view_at_16384_tokens_allocates_far_less_than_the_map():
    peaks = measured_alone(view_peaks_at_16384_tokens)
    whole_map = 16_384 * 16_384 * 4  # 1 GiB in float32
    assert peaks["streams"]
    assert peaks["probe"] >= whole_map // 8 * 0.9, peaks  # the probe sees 128 MB: it is not blind
    assert peaks["overview_shape"] == [512, 512] and peaks["overview"] < whole_map / 8, peaks
    assert peaks["row_shape"] == [16_384] and abs(peaks["row_sum"] - 1) < 1e-3, peaks
    assert peaks["row"] < whole_map / 64, peaks
    assert peaks["window_shape"] == [64, 64] and peaks["window"] < whole_map / 8, peaks


# --- capture keeps q/k where the model is ----------------------------------------------------------------------------

def test_capture_keeps_the_models_dtype_and_copies_only_views_into_larger_storage():
    kept = capture.keep(torch.randn(1, 2, 8, 4).bfloat16(), keys=8)
    assert kept.dtype == torch.bfloat16 and kept.device.type == "cpu"
    assert capture.keep(torch.randn(1, 2, 8, 4), keys=5000).dtype == torch.float16  # long float32: half the bytes
    fused = torch.empty(1, 8, 3 * 2 * 4, device="meta")  # GPT-2's q|k|v projection, on a device that is not the CPU
    query = fused[..., :8].view(1, 8, 2, 4).transpose(1, 2)
    assert capture.keep(query, 8).untyped_storage().nbytes() == query.numel() * 4  # its own memory: v not kept
    own = torch.empty(1, 2, 8, 4, device="meta").transpose(1, 2)  # any layout the model made it in
    assert capture.keep(own, 8).stride() == own.stride()  # no copy at all: it stays where the model made it


def test_a_run_that_does_not_fit_is_refused_with_how_many_tokens_would(tiny_folders, monkeypatch):
    from models import families

    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(tiny_folders["llama"].parent))
    loaded = families.load(families.custom("causal_lm", str(tiny_folders["llama"])))
    per_token = capture.kept_bytes_per_token(loaded.model.config, "cpu", torch.float32, 100) + \
        capture.working_bytes_per_token(loaded.model.config, torch.float32)
    monkeypatch.setattr(memory_fit, "free_for_tensors", lambda device: 50 * per_token)
    with pytest.raises(capture.DoesNotFit, match=r"about 40 tokens fit\. Lower the token limit"):
        families.run(loaded, TextInput("word " * 100, 512))
    assert len(families.run(loaded, TextInput("word " * 10, 512)).tokens) < 40  # a shorter one runs


def test_the_gpt_page_refuses_a_run_that_does_not_fit_and_keeps_serving(patched_loader, monkeypatch):
    at = AppTest.from_file(str(ROOT / "app" / "views" / "gpt.py"), default_timeout=120).run()
    assert not at.exception, at.exception
    monkeypatch.setattr(memory_fit, "free_for_tensors", lambda device: 1000)
    at.text_area(key="gpt_text").set_value("a different prompt that will not fit").run()
    assert not at.exception, at.exception
    assert any("tokens fit" in error.value for error in at.error)
    monkeypatch.undo()
    at.text_area(key="gpt_text").set_value("and one that does").run()
    assert not at.exception and not at.error


def _top_keys(at: AppTest):
    return next(frame.value for frame in at.dataframe if "in context" in frame.value.columns)


def test_a_long_prompt_shows_an_overview_cells_and_a_query_rows_top_keys(patched_loader):
    at = AppTest.from_file(str(ROOT / "app" / "views" / "gpt.py"), default_timeout=120).run()
    at.text_area(key="gpt_text").set_value(" ".join(f"w{i % 50}" for i in range(400))).run()
    assert not at.exception, at.exception
    captions = " ".join(c.value for c in at.caption)
    assert "Drag a rectangle to zoom" in captions and "Click a cell to open its query's row" in captions
    top = _top_keys(at)
    assert list(top.columns) == ["rank", "key position", "key", "weight", "in context"] and len(top) == 20
    assert "⟦" in top["in context"].iloc[0]
    at.number_input(key="gpt_row").set_value(5).run()
    top = _top_keys(at)
    assert not at.exception and len(top) == 6 and set(top["key position"]) == set(range(6))  # row 5 sees 0..5
    at.radio(key="gpt_pixels").set_value("mean").run()  # each pixel a block's mean instead of its maximum
    assert not at.exception and any("99th percentile of the block means" in c.value for c in at.caption)
    at.button(key="gpt_unzoom").click().run()  # the whole map on the right: a level of the pyramid
    assert not at.exception, at.exception
    assert at.slider(key="gpt_zoom_q").value == (0, 511)
    assert any(c.value.startswith("queries 0–511, keys 0–511") for c in at.caption)


# --- caches bounded in bytes ----------------------------------------------------------------------------------------

class _Held:
    def __init__(self, run_id: str, nbytes: int, device: str = "cuda:0"):
        self.run_id, self.nbytes, self.device = run_id, nbytes, device

    def held_bytes(self):
        return {self.device: self.nbytes}


def test_the_run_cache_is_bounded_by_the_bytes_its_runs_hold_and_drops_what_came_from_them():
    from app import resources

    forgotten = []
    store = resources._Store(max_entries=32, held=lambda r: r.held_bytes(),
                             budget=lambda device: 25 if device == "cuda:0" else None,
                             on_evict=lambda key, value: forgotten.append(value.run_id))
    for name in "abc":
        store.get((name,), lambda name=name: _Held(name, 10))
    assert forgotten == ["a"] and store.nbytes() == {"cuda:0": 20}  # three runs of 10 bytes in a budget of 25
    store.get(("b",), lambda: pytest.fail("b is cached"))
    store.get(("host",), lambda: _Held("host", 1000, "cpu"))  # no bound on the host here: keeps the GPU's runs
    assert forgotten == ["a"]
    assert store.evict_one("cuda") and forgotten == ["a", "c"]  # least recently used there: c, not b ("cuda" is
    assert not store.evict_one("mps")  # any CUDA device's, as a model loaded on "cuda" holds "cuda:0")
    figures = resources._Store(max_entries=8)
    figures.get(("head", "b"), lambda: "figure of b", tag="b")
    figures.get(("head", "x"), lambda: "figure of x", tag="x")
    figures.purge("b")
    assert figures._entries.keys() == {("head", "x")}


def test_a_run_that_does_not_fit_first_drops_cached_runs_on_its_device(monkeypatch):
    from app import resources

    store = resources._Store(max_entries=8, held=lambda r: r.held_bytes())
    store.get(("old",), lambda: _Held("old", 10, "cpu"))
    monkeypatch.setattr(resources, "_runs", lambda: store)
    monkeypatch.setattr(resources, "_forget_run", lambda key, value: None)
    attempts = []

    def run(loaded, inputs, options):
        attempts.append(len(store._entries))
        if store._entries:
            raise capture.DoesNotFit("does not fit")
        return _Held("new", 5, "cpu")

    monkeypatch.setattr(resources.families, "run", run)

    class Loaded:
        spec, device, dtype = "spec", "cpu", "float32"

    found = resources.run(Loaded(), TextInput("x", 16))
    assert found.run_id == "new" and attempts == [1, 0]


def test_the_gru_translator_flattens_its_weights_after_moving(monkeypatch):
    from models import families

    calls = []
    original = torch.nn.RNNBase.flatten_parameters
    monkeypatch.setattr(torch.nn.RNNBase, "flatten_parameters", lambda self: calls.append(self) or original(self))
    loaded = families.load(families.spec("translation", "mini GRU + additive attention en→fr"))
    grus = [m for m in loaded.model.modules() if isinstance(m, torch.nn.RNNBase)]
    assert grus and all(any(gru is called for called in calls) for gru in grus)


def test_the_cli_reads_a_long_prompt_from_a_text_file(tiny_folders, monkeypatch, tmp_path):
    import json

    from app import cli

    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(tiny_folders["llama"].parent))
    text_file = tmp_path / "book.txt"
    text_file.write_text(" ".join(f"w{i % 40}" for i in range(900)), encoding="utf-8")
    out = tmp_path / "out"
    assert cli.main(["--page", "gpt", "--model", str(tiny_folders["llama"]), "--text-file", str(text_file),
                     "--view", "query_row", "--query", "700", "--format", "json", "--out", str(out)]) == 0
    payload = json.loads(next(out.glob("*.json")).read_text())
    assert payload["query"] == 700 and len(payload["top"]["key position"]) == 20
    assert cli.main(["--page", "gpt", "--model", str(tiny_folders["llama"]), "--text-file", str(tmp_path / "no.txt"),
                     "--out", str(out)]) == 2
