"""The step-by-step layer equals PyTorch's SDPA; every mask of the zoo equals a direct construction; the cost
calculator equals hand-computed numbers; the page runs (AppTest)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from models.core.gguf import gguf_attention_config
from models.families.swin import geometry as swin_geometry
from models.lessons import cost, mechanics
from tests.conftest import ROOT

SENTENCE = "The animal didn't cross the street because it was too tired to walk."


def _random_x(n: int, d: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, d))


def _reference(x_q, x_k, weights: mechanics.LayerWeights, config: mechanics.LayerConfig, attn_mask):
    """Independent path: separate W_Q/W_K/W_V products, heads by view/transpose, SDPA, concat, W_O."""
    H, Dh = config.heads, config.d_head
    w_q, w_k, w_v = (torch.from_numpy(w) for w in weights.split())
    xq, xk = torch.from_numpy(x_q), torch.from_numpy(x_k)

    def heads(t):  # (T, H·Dh) -> (1, H, T, Dh)
        return t.view(t.shape[0], H, Dh).transpose(0, 1).unsqueeze(0)

    q, k, v = heads(xq @ w_q), heads(xk @ w_k), heads(xk @ w_v)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=config.scale)  # (1, H, Nq, Dh)
    concatenated = out[0].transpose(0, 1).reshape(x_q.shape[0], H * Dh)
    return out[0].numpy(), (concatenated @ torch.from_numpy(weights.w_o)).numpy()


@pytest.mark.parametrize("heads,d_head,scaled", [(2, 4, True), (1, 8, True), (4, 16, False), (3, 2, True)])
@pytest.mark.parametrize("mask", ["none", "causal", "strided", "global_local"])
def test_self_attention_equals_sdpa(heads, d_head, scaled, mask):
    n, d = 11, 8
    x = _random_x(n, d)
    config = mechanics.LayerConfig(d, heads, d_head, scaled, seed=3)
    allowed = mechanics.build_mask(mask, n)
    trace = mechanics.attention_layer(x, config, allowed=allowed)
    head_out, output = _reference(x, x, trace.weights_used, config, torch.from_numpy(allowed))
    np.testing.assert_allclose(trace.head_outputs, head_out, atol=1e-12)
    np.testing.assert_allclose(trace.output, output, atol=1e-12)
    assert trace.output.shape == (n, d) and trace.qkv.shape == (n, 3 * heads * d_head)
    np.testing.assert_allclose(trace.weights.sum(-1), 1.0, atol=1e-12)
    assert (trace.weights[:, ~allowed] == 0).all()  # −∞ gives exact zeros
    assert np.isneginf(trace.masked_scores[:, ~allowed]).all()


def test_cross_attention_equals_sdpa():
    x, y = _random_x(5, 6, 1), _random_x(9, 6, 2)
    config = mechanics.LayerConfig(6, 2, 3, True, seed=1)
    trace = mechanics.attention_layer(x, config, x_key=y)
    assert trace.cross and trace.scores.shape == (2, 5, 9) and trace.qkv is None
    _, output = _reference(x, y, trace.weights_used, config, None)
    np.testing.assert_allclose(trace.output, output, atol=1e-12)
    assert [s.key for s in trace.steps()][:2] == ["x", "x_key"]


def test_swin_minus_100_matches_sdpa_with_additive_mask():
    rows, cols, window, shift = 4, 4, 2, 1
    allowed = mechanics.swin_shifted_window_mask(rows, cols, window, shift)
    x = _random_x(16, 8, 4)
    config = mechanics.LayerConfig(8, 2, 4)
    trace = mechanics.attention_layer(x, config, allowed=allowed, mask_value=-100.0)
    additive = torch.from_numpy(np.where(allowed, 0.0, -100.0))
    _, output = _reference(x, x, trace.weights_used, config, additive)
    np.testing.assert_allclose(trace.output, output, atol=1e-12)
    assert trace.weights[:, ~allowed].max() < 1e-40  # e^-100: zero to any printed precision


def test_steps_name_the_four_multiplications_with_shapes():
    trace = mechanics.attention_layer(_random_x(7, 8), mechanics.LayerConfig(8, 2, 4))
    steps = {s.key: s for s in trace.steps()}
    assert steps["qkv"].shape.startswith("[N×D]·[D×3HD_H] → [N×3HD_H]: [7×8]·[8×24] → [7×24]")
    assert steps["scores"].value.shape == (2, 7, 7) and steps["scores"].per_head
    assert steps["output"].shape.endswith("[7×8]·[8×8] → [7×8]")
    for step in steps.values():
        value = step.value[0] if step.per_head else step.value
        assert value.ndim == 2, step.key


def test_unscaled_softmax_saturates_as_d_k_grows():
    curve = mechanics.softmax_entropy_by_d_k(_random_x(16, 8, 5), d_ks=(1, 4, 64, 512), heads=2, seeds=3)
    ceiling = math.log2(16)
    assert curve["unscaled"][-1] < 1.0 < curve["unscaled"][0]  # near one-hot at d_k = 512
    assert np.all(np.diff(curve["unscaled"]) < 0)
    assert np.all(curve["scaled"] > 0.75 * ceiling)  # the scaling keeps the spread
    assert curve["max_prob_unscaled"][-1] > 0.8 and np.all(curve["ceiling"] == ceiling)


def test_entropy_of_one_hot_and_uniform_rows():
    rows = np.array([[1.0, 0, 0, 0], [0.25, 0.25, 0.25, 0.25]])
    np.testing.assert_allclose(mechanics.entropy_bits(rows), [0.0, 2.0])
    assert str(mechanics.entropy_bits(rows)[0]) == "0.0"  # no "-0.0" on a slide


def test_fully_masked_row_is_zero_not_nan():
    allowed = np.ones((3, 3), dtype=bool)
    allowed[1] = False
    trace = mechanics.attention_layer(_random_x(3, 4), mechanics.LayerConfig(4, 1, 2), allowed=allowed)
    assert np.isfinite(trace.weights).all() and (trace.weights[:, 1] == 0).all()
    assert trace.notes


# --- the mask zoo against direct constructions -------------------------------------------------------------------

def _direct(n, rule):
    return np.array([[bool(rule(i, j)) for j in range(n)] for i in range(n)])


@pytest.mark.parametrize("n", [1, 7, 16])
def test_masks_equal_direct_construction(n):
    assert (mechanics.no_mask(n) == _direct(n, lambda i, j: True)).all()
    assert (mechanics.causal_mask(n) == _direct(n, lambda i, j: j <= i)).all()
    real = max(1, n - 2)
    assert (mechanics.padding_mask(n, real) == _direct(n, lambda i, j: j < real)).all()
    prefix = n // 2
    assert (mechanics.prefix_lm_mask(n, prefix) == _direct(n, lambda i, j: j < prefix or j <= i)).all()
    for w in (1, 2, 3, 5):
        assert (mechanics.sliding_window_mask(n, w) == _direct(n, lambda i, j: i - w < j <= i)).all()
        assert (mechanics.sliding_window_mask(n, w, causal=False)
                == _direct(n, lambda i, j: abs(i - j) <= w // 2)).all()
        glob = (0, n - 1)
        assert (mechanics.global_local_mask(n, w, glob)
                == _direct(n, lambda i, j: abs(i - j) <= w // 2 or i in glob or j in glob)).all()
    for stride in (1, 2, 3, 4):
        # Child et al. 2019: A(1)_i = {t, …, i}, t = max(0, i − l);  A(2)_i = {j : (i − j) mod l = 0}, causal
        def strided(i, j, l=stride):
            return j <= i and (j >= max(0, i - l) or (i - j) % l == 0)
        assert (mechanics.strided_sparse_mask(n, stride) == _direct(n, strided)).all()


def test_sliding_window_matches_transformers_own_mask_function():
    from transformers.masking_utils import sliding_window_causal_mask_function

    rule = sliding_window_causal_mask_function(4)
    expected = _direct(12, lambda i, j: bool(rule(0, 0, torch.tensor(i), torch.tensor(j))))
    assert (mechanics.sliding_window_mask(12, 4) == expected).all()


def _swin_direct(rows, cols, window, shift):
    """Shifted windows in original coordinates: bands start s tokens in; the first s and last M − s rows/cols are
    partial windows that do not wrap around. Two tokens may attend iff they share a band on both axes."""
    r, c = np.divmod(np.arange(rows * cols), cols)
    band_r, band_c = np.floor_divide(r - shift, window), np.floor_divide(c - shift, window)
    return (band_r[:, None] == band_r[None, :]) & (band_c[:, None] == band_c[None, :])


@pytest.mark.parametrize("rows,cols,window,shift", [(4, 4, 2, 0), (4, 4, 2, 1), (8, 8, 4, 2), (6, 9, 3, 1),
                                                    (8, 4, 4, 3), (56, 56, 7, 3)])
def test_swin_mask_equals_direct_construction(rows, cols, window, shift):
    allowed = mechanics.swin_shifted_window_mask(rows, cols, window, shift)
    assert (allowed == _swin_direct(rows, cols, window, shift)).all()
    # each token sees the tokens of its (shifted) window piece; a grid wider than M on both sides has full windows
    assert allowed.sum(1).max() <= window * window
    if shift == 0 or (rows > window and cols > window):
        assert allowed.sum(1).max() == window * window


def test_swin_region_ids_and_additive_mask_as_the_model_builds_them():
    ids = mechanics.swin_region_ids(4, 4, 2, 1)
    assert ids.tolist() == [[0, 0, 1, 2], [0, 0, 1, 2], [3, 3, 4, 5], [6, 6, 7, 8]]
    additive = swin_geometry.shifted_window_mask(ids, (2, 2))  # (nW, M², M²)
    assert additive.shape == (4, 4, 4) and set(np.unique(additive)) == {0.0, -100.0}
    assert (additive[0] == 0).all()  # the first window holds one region
    # the last window glues four corners of the image together: four regions, each token alone
    assert (additive[3] == np.where(np.eye(4, dtype=bool), 0.0, -100.0)).all()
    assert (swin_geometry.shifted_window_mask(mechanics.swin_region_ids(4, 4, 2, 0), (2, 2)) == 0).all()  # W-MSA


@pytest.mark.parametrize("rows,cols,window,shift", [(4, 4, 2, 1), (6, 9, 3, 1), (8, 8, 4, 2)])
def test_swin_mask_equals_timm_block(rows, cols, window, shift):
    """The page's mask against a timm SwinTransformerBlock's own ``attn_mask`` buffer and its roll + partition."""
    from timm.models.swin_transformer import SwinTransformerBlock, window_partition

    block = SwinTransformerBlock(dim=8, input_resolution=(rows, cols), num_heads=2, window_size=window,
                                 shift_size=shift)
    regions = mechanics.swin_region_ids(rows, cols, window, shift)
    np.testing.assert_array_equal(swin_geometry.shifted_window_mask(regions, (window, window)),
                                  block.attn_mask.numpy())
    # where each original token sits after timm's roll and partition, and which pairs its buffer leaves at 0
    raster = torch.arange(rows * cols, dtype=torch.float32).reshape(1, rows, cols, 1)
    rolled = torch.roll(raster, shifts=(-shift, -shift), dims=(1, 2))
    tokens = window_partition(rolled, (window, window)).reshape(block.attn_mask.shape[0], -1).long().numpy()
    expected = np.zeros((rows * cols, rows * cols), dtype=bool)
    for window_tokens, mask in zip(tokens, block.attn_mask.numpy()):
        expected[np.ix_(window_tokens, window_tokens)] = mask == 0
    assert (mechanics.swin_shifted_window_mask(rows, cols, window, shift) == expected).all()
    assert (mechanics.build_mask("swin", rows * cols, grid_rows=rows, window=window, shift=shift) == expected).all()


def test_mask_mistakes_raise_actionable_errors():
    with pytest.raises(ValueError, match="must divide"):
        mechanics.swin_shifted_window_mask(4, 6, 4, 1)
    with pytest.raises(ValueError, match="shift"):
        mechanics.swin_shifted_window_mask(4, 4, 2, 2)
    with pytest.raises(ValueError, match="rows that divides"):
        mechanics.build_mask("swin", 7, grid_rows=2)
    with pytest.raises(ValueError, match="unknown mask"):
        mechanics.build_mask("diagonal", 4)
    with pytest.raises(ValueError, match="global token"):
        mechanics.global_local_mask(4, 3, (9,))
    with pytest.raises(ValueError, match="mask is"):
        mechanics.attention_layer(_random_x(3, 4), mechanics.LayerConfig(4, 1, 2), allowed=np.ones((2, 2), bool))


def test_zoo_draws_every_kind_when_the_length_has_a_grid():
    assert set(mechanics.zoo(16)) == set(mechanics.MASK_KINDS)
    assert "swin" not in mechanics.zoo(13)  # a prime length has no grid with a window > 1
    assert mechanics.grid_shapes(12)[0] == (4, 3) and mechanics.common_windows(4, 6) == [2]


# --- embeddings from the packaged MiniLM ------------------------------------------------------------------------

def test_minilm_embeddings_are_real_and_readable():
    tokens, x = mechanics.embed(SENTENCE, 8, "minilm", seed=0)
    assert tokens[:5] == ["the", "animal", "didn", "'", "t"] and len(tokens) == 16
    assert x.shape == (16, 8)
    np.testing.assert_allclose(x[0], x[6])  # "the" twice: same row (no positions)
    np.testing.assert_allclose(x.mean(1), 0, atol=1e-12)
    np.testing.assert_allclose(x.std(1), 1, atol=1e-9)
    tokens_r, x_r = mechanics.embed(SENTENCE, 8, "random", seed=0)
    assert tokens_r == tokens and not np.allclose(x, x_r)


def test_embedding_mistakes_raise_actionable_errors():
    with pytest.raises(ValueError, match="Type a sentence"):
        mechanics.embed("   ", 8)
    with pytest.raises(ValueError, match="Shorten it"):
        mechanics.embed("word " * 40, 8)
    with pytest.raises(ValueError, match="unknown embedding"):
        mechanics.embed("hello", 8, "glove")


# --- the cost calculator ------------------------------------------------------------------------------------------

def test_attention_cost_by_hand():
    vit = cost.attention_cost(cost.vit_tokens(224, 16), heads=16, layers=48, dtype="float32")
    assert vit.tokens == 197 and vit.entries_per_map == 38_809 and vit.bytes_per_map == 155_236
    assert vit.entries_all == 48 * 16 * 38_809 == 29_805_312 and vit.bytes_all == 119_221_248
    assert vit.flash_bytes_all == 48 * 16 * 197 * 4
    pixels = cost.attention_cost(128 * 128, 16, 48, "float32")
    assert pixels.bytes_per_map == 2**30 and pixels.bytes_all == 768 * 2**30
    long = cost.attention_cost(100_000, 64, 1, "float16")
    assert long.bytes_per_map == 20_000_000_000 and long.bytes_per_layer == 1_280_000_000_000
    assert long.flash_bytes_per_layer == 25_600_000 and long.flash_saving == 50_000
    assert cost.windowed_entries(56, 56, 7) == 64 * 49**2 == 3136 * 49 == 153_664
    batch = cost.attention_cost(10, heads=2, layers=3, dtype="bfloat16", batch=4)
    assert batch.entries_all == 4 * 3 * 2 * 100 and batch.bytes_all == 4800


def test_units_decimal_and_binary_with_separators():
    assert cost.thousands(38_809) == "38,809"
    assert cost.describe_bytes(2**30) == "1,073,741,824 B = 1.07 GB = 1 GiB"
    assert cost.decimal_bytes(20_000_000_000) == "20 GB" and cost.binary_bytes(20_000_000_000) == "18.63 GiB"
    assert cost.decimal_bytes(155_236) == "155.24 kB" and cost.binary_bytes(155_236) == "151.6 KiB"
    assert cost.decimal_bytes(999) == "999 B" and cost.binary_bytes(1_280_000_000_000) == "1.16 TiB"
    assert cost.tex_thousands(38_809) == "38{,}809"


def test_worked_examples_are_computed():
    examples = {e.title: e for e in cost.worked_examples()}
    vit = examples["ViT-B/16 on a 224×224 image"]
    assert vit.rows[2].entries == 38_809 and vit.rows[3].bytes == 119_221_248
    assert cost.example_table(vit)[3] == {"what": "all maps, 48 layers × 16 heads", "entries": "29,805,312",
                                          "bytes": "119,221,248", "decimal": "119.22 MB", "binary": "113.7 MiB"}
    swin = examples["Swin, first stage: full vs windowed"]
    assert swin.rows[0].entries == 3136**2 == 9_834_496 and swin.rows[1].entries == 153_664
    assert "64×" in swin.takeaway
    long = examples["A 100K-token sequence, 64 heads, fp16"]
    assert long.rows[0].bytes == 2 * 10**10 and "10^{10}" in long.latex


def test_kv_cache_of_published_configs_by_hand():
    specs = {s.name: s for s in cost.published_kv_specs()}
    assert specs["Llama-2-7B (MHA)"].bytes_per_token("float16") == 2 * 32 * 32 * 128 * 2 == 524_288
    assert specs["Llama-3-8B (GQA)"].kind == "GQA" and specs["Llama-3-8B (GQA)"].bytes_per_token() == 131_072
    falcon = specs["Falcon-7B (MQA)"]
    assert falcon.kind == "MQA" and falcon.kv_heads == 1 and falcon.bytes_per_token() == 2 * 32 * 64 * 2
    mla = specs["DeepSeek-V2 (MLA)"]
    assert mla.kind == "MLA" and mla.elements_per_token_per_layer == 512 + 64
    assert mla.bytes_per_token("float16") == 576 * 60 * 2 == 69_120
    assert mla.uncompressed_elements == 128 * (128 + 64 + 128)
    assert specs["GPT-2 small (MHA)"].bytes_per_sequence(1024, "float32", batch=2) == 2 * 1024 * 2 * 12 * 12 * 64 * 4


def test_kv_cache_of_the_apps_own_models():
    report = cost.app_model_kv_specs()
    specs = {s.name: s for s in report.specs}
    smol = specs["SmolLM2-135M-Instruct"]  # read from the packaged GGUF header
    assert (smol.kind, smol.layers, smol.heads, smol.kv_heads, smol.head_dim) == ("GQA", 30, 9, 3, 64)
    assert smol.bytes_per_token("float16") == 2 * 30 * 3 * 64 * 2 == 23_040
    minilm = specs["all-MiniLM-L6-v2"]
    assert (minilm.kind, minilm.layers, minilm.kv_heads, minilm.head_dim) == ("MHA", 6, 12, 32)
    assert "encoder" in minilm.note
    assert len(cost.kv_table(report.specs, 4096)) == len(report.specs)


def test_gguf_header_reader_stops_before_the_tokenizer(tmp_path):
    import gguf

    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(4)
    writer.add_embedding_length(256)
    writer.add_head_count(8)
    writer.add_head_count_kv(2)
    writer.add_key_length(32)
    writer.add_token_list([f"tok{i}" for i in range(1000)])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    config = gguf_attention_config(path)
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads, config.hidden_size,
            config.head_dim) == (4, 8, 2, 256, 32)
    spec = cost.kv_cache_spec(config, "tiny")
    assert spec.kind == "GQA" and spec.bytes_per_token("float32") == 4 * 2 * 2 * 32 * 4
    (tmp_path / "bad.gguf").write_bytes(b"NOPE" + bytes(20))
    with pytest.raises(ValueError, match="not a GGUF"):
        gguf_attention_config(tmp_path / "bad.gguf")
    (tmp_path / "cut.gguf").write_bytes(path.read_bytes()[:40])  # ends inside the first key
    with pytest.raises(ValueError, match="truncated"):
        gguf_attention_config(tmp_path / "cut.gguf")


def test_cost_mistakes_raise_actionable_errors():
    with pytest.raises(ValueError, match="tokens N must be"):
        cost.attention_cost(0)
    with pytest.raises(ValueError, match="unknown precision"):
        cost.attention_cost(10, dtype="int3")
    with pytest.raises(ValueError, match="divisor of 9"):
        cost.custom_kv_spec("GQA", 30, 9, 64, kv_heads=2)
    assert cost.custom_kv_spec("MQA", 2, 8, 16).bytes_per_token("float32") == 2 * 2 * 16 * 4
    assert cost.custom_kv_spec("MLA", 2, 8, 16, latent_dim=32, rope_dim=8).bytes_per_token("float16") == 2 * 40 * 2


# --- the page's layer: outline, mask settings, one wide head ---------------------------------------------------

@pytest.mark.parametrize("cross", [False, True])
def test_step_outline_is_the_computed_layer_before_computing(cross):
    config = mechanics.LayerConfig(8, 2, 4)
    x, y = _random_x(7, 8), _random_x(5, 8, 1)
    trace = mechanics.attention_layer(x, config, x_key=y if cross else None)
    outline = mechanics.step_outline(config, 7, 5 if cross else 7, cross)
    assert [(s.key, s.title, s.shape, s.latex) for s in outline] == [(s.key, s.title, s.shape, s.latex)
                                                                     for s in trace.steps()]
    assert all(s.value is None for s in outline) and all(s.value is not None for s in trace.steps())
    assert ("q" if cross else "qkv") in [s.key for s in outline] and ("qkv" in [s.key for s in outline]) != cross


def test_mask_parameters_fill_in_the_pages_first_choice():
    assert mechanics.mask_parameters("padding", 16) == {"real_tokens": 12}
    assert mechanics.mask_parameters("prefix_lm", 16) == {"prefix": 5}
    assert mechanics.mask_parameters("sliding_window", 2) == {"window": 2, "causal": True}
    assert mechanics.mask_parameters("global_local", 16, window=5, global_tokens=(0, 3)) == {
        "window": 5, "global_tokens": [0, 3]}
    assert mechanics.mask_parameters("swin", 16) == {"grid_rows": 4, "window": 2, "shift": 1}
    assert mechanics.mask_parameters("swin", 7) == {"grid_rows": 7, "window": 1, "shift": 0}  # a prime: no window
    assert mechanics.mask_parameters("causal", 16, window=4) == {}
    with pytest.raises(ValueError, match="rows that divides"):
        mechanics.mask_parameters("swin", 16, grid_rows=3)
    with pytest.raises(ValueError, match="unknown mask"):
        mechanics.mask_parameters("diagonal", 4)


def test_sentence_layer_is_the_layer_on_the_sentences_embeddings():
    config = mechanics.LayerConfig(8, 2, 4, True, 3)
    tokens, x = mechanics.embed(SENTENCE, 8, "minilm", 3)
    trace = mechanics.sentence_layer(SENTENCE, config, "minilm", "swin", grid_rows=4, swin_window=2, shift=1)
    expected = mechanics.attention_layer(x, config, allowed=mechanics.swin_shifted_window_mask(4, 4, 2, 1),
                                         mask_value=-100.0, query_tokens=tokens)
    np.testing.assert_array_equal(trace.output, expected.output)
    assert trace.query_tokens == tokens and trace.mask_value == -100.0
    cross = mechanics.sentence_layer(SENTENCE, config, "minilm", "causal", other="A tired dog stays at home.")
    assert cross.cross and cross.allowed.all() and cross.scores.shape == (2, 16, len(cross.key_tokens))
    wide = mechanics.one_wide_head(trace)
    assert wide.config.heads == 1 and wide.config.d_head == 8
    np.testing.assert_array_equal(wide.allowed, trace.allowed)
    np.testing.assert_allclose(wide.weights.sum(-1), 1.0, atol=1e-12)
    with pytest.raises(ValueError, match="self-attention"):
        mechanics.one_wide_head(cross)
    big = mechanics.LayerConfig(8, 8, 512)  # the page's widest: one head of 4096 must be allowed
    assert mechanics.one_wide_head(mechanics.attention_layer(x, big)).config.d_head == 4096


# --- charts ------------------------------------------------------------------------------------------------------

def test_matrix_chart_marks_masked_cells_and_checks_labels():
    from viz import mechanics_charts
    values = np.array([[1.0, -np.inf], [0.5, 0.25]])
    chart = mechanics_charts.matrix_chart(values, ["a", "b"], ["a", "b"], masked=np.isinf(values))
    data = chart.to_dict()["datasets"]
    rows = next(iter(data.values()))
    assert [r["text"] for r in rows] == ["1.00", "−∞", "0.50", "0.25"]
    assert all(math.isfinite(r["value"]) for r in rows)  # Vega drops NaN cells
    with pytest.raises(ValueError, match="labels"):
        mechanics_charts.matrix_chart(values, ["a"], ["a", "b"])
    assert mechanics_charts.unique_labels(["the", "cat", "the"]) == ["0 the", "1 cat", "2 the"]


def chart_matrix(chart) -> np.ndarray:
    """The values a ``viz.mechanics_charts.matrix_chart`` draws, read back from the chart's own data ``(rows, cols)``."""
    frame = pd.DataFrame(next(iter(chart.to_dict()["datasets"].values())))
    matrix = frame.pivot(index="row position", columns="col position", values="value").to_numpy()
    masked = frame.pivot(index="row position", columns="col position", values="masked").to_numpy().astype(bool)
    return np.where(masked, -np.inf, matrix)


# --- the figures (viz/figures/mechanics.py) against the model ---------------------------------------------------

def _figures():
    from viz import figures
    from viz.figures import mechanics as views

    return figures, views


def test_every_view_of_the_page_draws_its_defaults_and_makes_its_files():
    from tests.conftest import check_files

    figures, _ = _figures()
    names = [view.name for view in figures.page_views("mechanics")]
    assert names == ["layer_steps", "entropy_by_d_k", "multi_vs_single_head", "masked_softmax", "swin_mask_regions",
                     "mask_zoo", "attention_memory", "worked_examples", "kv_cache", "linear_attention",
                     "linear_recurrent", "linear_attention_cost", "norm_placement", "why_circuit"]
    published = cost.published_kv_specs()
    for view in figures.page_views("mechanics"):
        if view.name == "kv_cache":
            check_files(figures.build(view.name, cost.KVPresets(tuple(published), ())))
        else:
            check_files(draw(figures, view.name, view.options()))



def draw(figures, name: str, options):
    """What the page and the CLI do for a view: its analysis (the toy layer, computed in models/), then its builder."""
    view = figures.get(name)
    data = view.analysis(None, None, options) if view.data == "analysis" else None
    return figures.build(name, data, options)


@pytest.mark.parametrize("cross", [False, True])
def test_steps_figure_holds_the_layers_numbers(cross):
    figures, views = _figures()
    other = "A tired dog stays at home." if cross else None
    options = views.StepsOptions(mask="sliding_window", window=2, other=other, head=1, all_steps=True, heads=2)
    figure = draw(figures, "layer_steps", options)
    config = mechanics.LayerConfig(8, 2, 4, True, 0)
    trace = mechanics.sentence_layer(SENTENCE, config, mask="sliding_window", window=2, other=other)
    steps = trace.steps()
    assert figure.payload()["steps"] == [s.key for s in steps] and len(figure.charts) == len(steps)
    for step, chart in zip(steps, figure.charts):
        expected = step.value[1] if step.per_head else step.value
        np.testing.assert_array_equal(figure.arrays()[step.key], expected)
        np.testing.assert_allclose(chart_matrix(chart), expected, atol=1e-12)  # −∞ drawn where masked
    masked = chart_matrix(figure.charts[[s.key for s in steps].index("masked_scores")])
    assert (np.isinf(masked) == (~trace.allowed)).all() and np.isinf(masked).any() != cross
    assert figure.stem.startswith("attention-layer_d-8_h-2_dk-4_scaled_seed-0_" + ("cross" if cross else
                                                                                   "sliding-window"))
    one = draw(figures, "layer_steps", views.StepsOptions(step="scores", head=1))
    assert list(one.arrays()) == ["scores"] and "_scores_head-1_" in one.stem  # the file holds what it names
    np.testing.assert_allclose(chart_matrix(one.charts[0]), mechanics.sentence_layer(SENTENCE, config).scores[1])


def test_mask_multihead_entropy_swin_and_zoo_figures_hold_the_models_numbers():
    figures, views = _figures()
    config = mechanics.LayerConfig(8, 4, 8, False, 2)
    layer = dict(heads=4, d_head=8, scaled=False, seed=2, mask="padding", real_tokens=10)
    trace = mechanics.sentence_layer(SENTENCE, config, mask="padding", real_tokens=10)

    masks = draw(figures, "masked_softmax", views.MaskOptions(**layer, head=3))
    assert masks.stem.startswith("mask_padding_real-tokens-10_head-3")
    np.testing.assert_array_equal(masks.arrays()["allowed"], mechanics.padding_mask(16, 10))
    np.testing.assert_allclose(masks.table().to_numpy(), trace.weights[3])
    np.testing.assert_allclose(chart_matrix(masks.charts[1]), trace.weights[3], atol=1e-12)
    drawn = chart_matrix(masks.charts[0])
    np.testing.assert_allclose(drawn[trace.allowed], trace.masked_scores[3][trace.allowed], atol=1e-12)

    heads = draw(figures, "multi_vs_single_head", views.HeadsOptions(**layer))
    np.testing.assert_array_equal(heads.arrays()["heads"], trace.weights)
    np.testing.assert_array_equal(heads.arrays()["one_head"], mechanics.one_wide_head(trace).weights[0])
    assert len(heads.charts) == 4  # three heads of four, and the one wide head
    np.testing.assert_allclose(chart_matrix(heads.charts[3]), mechanics.one_wide_head(trace).weights[0])

    entropy = draw(figures, "entropy_by_d_k", views.EntropyOptions(**layer))
    curve = mechanics.softmax_entropy_by_d_k(mechanics.embed(SENTENCE, 8, "minilm", 2)[1], heads=4)
    for name, values in curve.items():
        np.testing.assert_array_equal(entropy.arrays()[name], values)
    assert f"**{trace.row_entropy_bits().mean():.2f} bits**" in entropy.caption

    swin = draw(figures, "swin_mask_regions", views.SwinOptions(grid_rows=2, swin_window=2, shift=1))
    np.testing.assert_array_equal(swin.arrays()["region_ids"], mechanics.swin_region_ids(2, 8, 2, 1))
    tokens = mechanics.tokenize(SENTENCE)[0]
    assert swin.payload()["shifted_tokens"][0][:2] == [tokens[9], tokens[10]]  # row 1 rolled up, column 1 rolled left

    zoo = figures.build("mask_zoo", None, views.ZooOptions(12))
    assert zoo.arrays().keys() == mechanics.zoo(12).keys() and len(zoo.charts) == len(mechanics.MASK_KINDS)
    for kind, pattern in mechanics.zoo(12).items():
        np.testing.assert_array_equal(zoo.arrays()[kind], pattern)


def test_cost_figures_hold_the_calculators_numbers():
    figures, views = _figures()
    memory = figures.build("attention_memory", None, views.MemoryOptions(16, 48, "float16", 2))
    table = memory.table()
    for tokens, maps, flash in table[["tokens", "attention_map_bytes", "flash_bytes"]].itertuples(index=False):
        expected = cost.attention_cost(int(tokens), 16, 48, "float16", 2)
        assert (maps, flash) == (expected.bytes_all, expected.flash_bytes_all)
    assert table["tokens"].min() == 10 and table["tokens"].max() == 1_000_000
    assert memory.stem == "attention-memory_h-16_l-48_float16_b-2"

    examples = figures.build("worked_examples", None)
    rows = examples.table().to_dict("records")
    assert rows == cost.worked_examples_table(cost.worked_examples())
    assert {"example": "ViT-B/16 on a 224×224 image", "what": "all maps, 48 layers × 16 heads",
            "entries": "29,805,312", "bytes": "119,221,248", "decimal": "119.22 MB", "binary": "113.7 MiB"} in rows

    published = tuple(cost.published_kv_specs())
    kv = figures.build("kv_cache", cost.KVPresets(published, ("x: skipped",)), views.KVOptions(1024, "float32"))
    assert kv.table().to_dict("records") == cost.kv_table(list(published), 1024, "float32")
    bars = pd.DataFrame(next(iter(kv.chart.to_dict()["datasets"].values())))
    np.testing.assert_allclose(bars["MiB"], [s.bytes_per_sequence(1024, "float32") / 2**20 for s in published])
    assert "DeepSeek-V2 (MLA)" in kv.caption and "Not read: x: skipped" in kv.caption
    assert [m.value for m in cost.calculator_metrics(cost.attention_cost(197, 12, 12))] == [
        "38,809", "21.32 MiB", "110.81 KiB"]


def test_bad_options_are_messages():
    figures, views = _figures()
    for name, options, message in [
            ("layer_steps", views.StepsOptions(sentence="word " * 40), "Shorten it"),
            ("layer_steps", views.StepsOptions(head=2), "outside 0..1"),
            ("layer_steps", views.StepsOptions(step="qkv", other="A dog."), "no step 'qkv'"),
            ("masked_softmax", views.MaskOptions(mask="global_local", global_tokens=(99,)), "global token"),
            ("masked_softmax", views.MaskOptions(mask="swin", grid_rows=3), "rows that divides"),
            ("swin_mask_regions", views.SwinOptions(swin_window=3), "must divide"),
            ("attention_memory", views.MemoryOptions(dtype="int3"), "unknown precision"),
            ("mask_zoo", views.ZooOptions(0), "at least one token")]:
        with pytest.raises(ValueError, match=message):
            draw(figures, name, options)


# --- the command line ----------------------------------------------------------------------------------------------

def test_cli_writes_the_default_view_and_lists_every_view(tmp_path, capsys):
    from app import cli

    assert cli.main(["--list"]) == 0
    listing = capsys.readouterr().out
    assert "--page mechanics" in listing and "--view layer_steps" in listing and "--view kv_cache" in listing
    assert cli.main(["--page", "mechanics", "--out", str(tmp_path), "--format", "png,json,npz"]) == 0
    npz = np.load(next(tmp_path.glob("attention-layer_*_qkv_head-0_*.npz")))
    tokens, x = mechanics.embed(SENTENCE, 8)
    np.testing.assert_array_equal(npz["qkv"], mechanics.attention_layer(x, mechanics.LayerConfig()).qkv)
    assert cli.main(["--page", "mechanics", "--view", "masked_softmax", "--mask", "global_local", "--global_tokens",
                     "0,5", "--head", "1", "--out", str(tmp_path), "--format", "csv"]) == 0
    assert next(tmp_path.glob("mask_global-local_window-3_global-tokens-0-5_head-1_*.csv"))


def test_cli_bad_input_is_a_message(tmp_path, capsys):
    from app import cli

    assert cli.main(["--page", "mechanics", "--sentence", "word " * 40, "--out", str(tmp_path)]) == 2
    assert "Shorten it" in capsys.readouterr().err
    assert cli.main(["--page", "mechanics", "--view", "attention_memory", "--heads", "many",
                     "--out", str(tmp_path)]) == 2
    assert "--heads must be int" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


# --- the page (AppTest) --------------------------------------------------------------------------------------------

@pytest.fixture
def page(monkeypatch, offered):
    from streamlit.testing.v1 import AppTest

    published = cost.published_kv_specs()  # the GGUF header read is tested above; keep the page test fast
    monkeypatch.setattr(cost, "app_model_kv_specs", lambda: cost.PresetReport(published[:1], ["x: skipped"]))
    app = AppTest.from_file(str(ROOT / "app" / "views" / "mechanics.py"), default_timeout=120)
    app.run()
    return app


def test_page_walks_through_steps_masks_and_cost(page, offered):
    assert not page.exception, page.exception
    text = " ".join(m.value for m in page.markdown) + " ".join(str(m.value) for m in page.metric)
    assert "38,809" in text  # the calculator's default: one ViT-B/16 map
    tokens, x = mechanics.embed(SENTENCE, 8)
    trace = mechanics.attention_layer(x, mechanics.LayerConfig(), query_tokens=tokens)
    np.testing.assert_array_equal(offered["mech_steps"].arrays()["qkv"], trace.qkv)  # the page's figure, the model's
    np.testing.assert_array_equal(offered["mech_multihead"].arrays()["heads"], trace.weights)
    page.radio(key="mech_mask").set_value("swin").run()
    assert not page.exception and not page.error
    assert "swin" in offered["mech_masks"].stem
    np.testing.assert_array_equal(offered["mech_masks"].arrays()["allowed"],
                                  mechanics.swin_shifted_window_mask(4, 4, 2, 1))
    page.toggle(key="mech_all_steps").set_value(True).run()
    page.toggle(key="mech_scaled").set_value(False).run()
    page.select_slider(key="mech_dk").set_value(512).run()
    assert not page.exception and not page.error
    page.radio(key="mech_mode").set_value("Cross-attention").run()
    assert not page.exception and not page.error
    assert offered["mech_steps"].payload()["mask"] == "none (cross-attention)"


def test_page_shows_user_mistakes_as_errors(page):
    page.text_area(key="mechanics_text").set_value("word " * 40).run()
    assert not page.exception and "Shorten it" in page.error[0].value
    page.text_area(key="mechanics_text").set_value("   ").run()
    assert not page.exception and "Type a sentence" in page.error[0].value
    page.text_area(key="mechanics_text").set_value("Attention is all you need.").run()
    assert not page.exception and not page.error
    page.radio(key="mech_mode").set_value("Cross-attention").run()
    page.text_input(key="mech_other").set_value("   ").run()
    assert not page.exception and "Type a sentence" in page.error[0].value
