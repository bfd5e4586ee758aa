"""Positional-encoding formulas against independent implementations, and tables read from tiny models."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from models.lessons import positional as pe

# --- sinusoidal --------------------------------------------------------------------------------------------------

def test_sinusoidal_matches_distilbert_and_the_formula():
    from transformers.models.distilbert.modeling_distilbert import (
        create_sinusoidal_embeddings,
    )

    reference = torch.empty(60, 32)
    create_sinusoidal_embeddings(60, 32, reference)
    table = pe.sinusoidal_encoding(60, 32)
    assert table.shape == (60, 32) and table.dtype == np.float32
    np.testing.assert_allclose(table, reference.numpy(), atol=1e-6)
    # and the paper's formula written out, with another base
    pos, k, d = 17, 5, 20
    table = pe.sinusoidal_encoding(30, d, base=500.0)
    assert table[pos, 2 * k] == pytest.approx(math.sin(pos / 500.0 ** (2 * k / d)), abs=1e-6)
    assert table[pos, 2 * k + 1] == pytest.approx(math.cos(pos / 500.0 ** (2 * k / d)), abs=1e-6)


def test_sinusoidal_wavelengths_and_offset_only_similarity():
    wavelengths = pe.sinusoidal_wavelengths(8, base=10000.0)
    np.testing.assert_allclose(wavelengths[[0, 1, 6, 7]], [2 * np.pi] * 2 + [2 * np.pi * 10000 ** 0.75] * 2)
    dot = pe.position_similarity(pe.sinusoidal_encoding(64, 32), "dot")
    # PE(p)·PE(q) = Σ cos((p − q) ω_k): same along every diagonal, symmetric, maximal (= d/2) at p = q
    assert np.allclose(np.diag(dot), 16.0, atol=1e-5)
    assert np.allclose(dot[10, 10 + 7], dot[40, 40 + 7], atol=1e-4) and np.allclose(dot, dot.T, atol=1e-6)
    assert dot[20, 21] > dot[20, 30]


def _mae_2d_sincos(rows, cols, dim, base=10000.0):
    """MAE's 2-D table rebuilt from its formula (facebookresearch/mae, util/pos_embed.py, written out here):
    ``meshgrid(grid_w, grid_h)`` makes the first coordinate the column; each coordinate gets ``dim/2`` channels,
    ``[sin(pos·ω) | cos(pos·ω)]`` with ω_k = 1 / base^(k / (dim/4)), k = 0 … dim/4 − 1; patches row-major."""
    quarter = dim // 4
    omega = np.array([1.0 / base ** (k / quarter) for k in range(quarter)])
    grid_w, grid_h = np.meshgrid(np.arange(cols, dtype=np.float64), np.arange(rows, dtype=np.float64))  # (rows, cols)
    out = np.zeros((rows * cols, dim))
    for index, (w, h) in enumerate(zip(grid_w.ravel(), grid_h.ravel())):
        for half, position in enumerate((w, h)):  # w (the column) first, as MAE's meshgrid orders them
            for k in range(quarter):
                out[index, half * dim // 2 + k] = math.sin(position * omega[k])
                out[index, half * dim // 2 + quarter + k] = math.cos(position * omega[k])
    return out


@pytest.mark.parametrize("rows,cols,dim,base", [(14, 14, 192, 10000.0), (3, 5, 16, 10000.0), (4, 2, 8, 100.0)])
def test_sinusoidal_2d_matches_mae_layout(rows, cols, dim, base):
    grid = pe.sinusoidal_encoding_2d(rows, cols, dim, base)
    assert grid.shape == (rows * cols, dim) and grid.dtype == np.float32
    np.testing.assert_allclose(grid, _mae_2d_sincos(rows, cols, dim, base), atol=1e-6)


def test_sinusoidal_2d_is_columns_then_rows():
    rows, cols, d = 3, 5, 16
    grid = pe.sinusoidal_encoding_2d(rows, cols, d).reshape(rows, cols, d)
    # the first half depends on the column only, the second half on the row only
    assert np.allclose(grid[:, :, :8], grid[:1, :, :8]) and np.allclose(grid[:, :, 8:], grid[:, :1, 8:])
    # each half is the 1-D encoding of width d/2 with its sines first, then its cosines (not interleaved)
    one_d = pe.sinusoidal_encoding(max(rows, cols), 8)
    halves = np.concatenate([one_d[:, 0::2], one_d[:, 1::2]], axis=1)  # (positions, 8): [sin | cos]
    for r in range(rows):
        for c in range(cols):
            np.testing.assert_allclose(grid[r, c, :8], halves[c], atol=1e-7)
            np.testing.assert_allclose(grid[r, c, 8:], halves[r], atol=1e-7)
    with pytest.raises(ValueError, match="divisible by 4"):
        pe.sinusoidal_encoding_2d(2, 2, 18)


@pytest.mark.parametrize("bad", [dict(length=0, dim=8), dict(length=4, dim=7), dict(length=4, dim=8, base=0.0)])
def test_sinusoidal_user_mistakes(bad):
    with pytest.raises(ValueError):
        pe.sinusoidal_encoding(**bad)


# --- RoPE --------------------------------------------------------------------------------------------------------

def test_rope_relative_property():
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=64), rng.normal(size=64)
    offsets = np.arange(-50, 200)
    for base in (10000.0, 500000.0):
        at_zero = pe.rope_scores(q, k, 0, offsets + 0, base)
        for m in (1, 123, 4096):
            np.testing.assert_allclose(pe.rope_scores(q, k, m, m + offsets, base), at_zero, atol=1e-5)
    # at offset 0 nothing turns relative to each other: the plain dot product
    assert pe.rope_scores(q, k, 77, np.array([77]))[0] == pytest.approx(q @ k)


def test_rope_half_pairing_matches_transformers_llama():
    from transformers.models.llama.modeling_llama import (
        LlamaRotaryEmbedding,
        apply_rotary_pos_emb,
    )

    config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=2,
                                      rope_parameters={"rope_type": "default", "rope_theta": 5000.0})
    x = torch.randn(1, 2, 12, 32, dtype=torch.float64)
    cos, sin = LlamaRotaryEmbedding(config)(x.float(), torch.arange(12)[None])
    reference, _ = apply_rotary_pos_emb(x, x, cos.double(), sin.double())
    ours = pe.rope_rotate(x.numpy(), np.arange(12), 5000.0, pairing="half")
    np.testing.assert_allclose(ours, reference.numpy(), atol=1e-5)


def test_rope_interleaved_is_a_complex_rotation_and_partial_rotary_leaves_the_rest():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(5, 8))
    positions = np.arange(5) * 3
    theta = 100.0 ** (-np.arange(0, 8, 2) / 8)
    as_complex = (x[:, 0::2] + 1j * x[:, 1::2]) * np.exp(1j * positions[:, None] * theta)
    rotated = pe.rope_rotate(x, positions, base=100.0)
    np.testing.assert_allclose(rotated[:, 0::2], as_complex.real, atol=1e-12)
    np.testing.assert_allclose(rotated[:, 1::2], as_complex.imag, atol=1e-12)
    partial = pe.rope_rotate(x, positions, base=100.0, rotary_dim=4)
    np.testing.assert_array_equal(partial[:, 4:], x[:, 4:])
    np.testing.assert_allclose(np.linalg.norm(partial, axis=1), np.linalg.norm(x, axis=1))  # rotations keep norms


def test_rope_offset_demo_curves_coincide_and_peak_at_zero():
    offsets, scores, spread = pe.rope_offset_demo(64, 10000.0, 300)
    assert list(scores) == ["m = 0", "m = 1000", "m = 100000"] and len(offsets) == 601
    assert spread < 1e-8
    assert int(np.argmax(scores["m = 0"])) == 300  # k = q + noise: the best match is at offset 0


def test_rope_decay_bound_starts_at_its_maximum_and_decays():
    bound = pe.rope_decay_bound(np.arange(0, 1001), 128)
    assert bound[0] == pytest.approx((64 + 1) / 2)  # |S_j| = j at offset 0: mean of 1..64
    assert bound[1000] < 0.2 * bound[0]


def test_rope_settings_from_configs():
    llama = pe.rope_settings(transformers.LlamaConfig(hidden_size=64, num_attention_heads=4,
                                                      rope_parameters={"rope_type": "default", "rope_theta": 1e5}))
    assert (llama.theta, llama.head_dim, llama.rotary_dim, llama.pairing) == (1e5, 16, 16, "half")
    neox = pe.rope_settings(transformers.GPTNeoXConfig(hidden_size=64, num_attention_heads=2))
    assert neox.head_dim == 32 and neox.rotary_dim == 8 and neox.partial_rotary_factor == 0.25
    gptj = pe.rope_settings(transformers.GPTJConfig(n_embd=64, n_head=2, rotary_dim=16))
    assert gptj.rotary_dim == 16 and gptj.pairing == "interleaved"
    gemma = pe.rope_settings(transformers.Gemma3TextConfig())
    assert gemma.theta == 1e6  # full-attention layers' base
    with pytest.raises(ValueError, match="does not use RoPE"):
        pe.rope_settings(transformers.GPT2Config())


def test_model_inv_freq_is_the_formula():
    config = transformers.LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, intermediate_size=64, vocab_size=50,
                                      rope_parameters={"rope_type": "default", "rope_theta": 12345.0})
    name, inv_freq = pe.model_inv_freq(transformers.LlamaForCausalLM(config))
    assert name.endswith("inv_freq")
    np.testing.assert_allclose(inv_freq, pe.rope_frequencies(16, 12345.0), rtol=1e-6)


# --- ALiBi and T5 ------------------------------------------------------------------------------------------------

def test_alibi_slopes_for_8_heads_are_halves_down_to_1_over_256():
    np.testing.assert_allclose(pe.alibi_slopes(8), [1 / 2 ** h for h in range(1, 9)])


@pytest.mark.parametrize("heads", [1, 3, 8, 12, 16, 24])
def test_alibi_slopes_match_bloom(heads):
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    alibi = build_alibi_tensor(torch.ones(1, 3), heads, torch.float32)  # (heads, 1, 3): slope · key position
    np.testing.assert_allclose(pe.alibi_slopes(heads), alibi[:, 0, 1].numpy(), rtol=1e-6)


def test_alibi_bias_is_linear_in_distance_and_causal():
    bias = pe.alibi_bias(4, 6, causal=True)
    assert bias.shape == (4, 6, 6)
    assert np.isneginf(bias[:, 0, 1:]).all() and np.isfinite(np.tril(bias[0])).all()
    assert bias[1, 5, 2] == pytest.approx(-pe.alibi_slopes(4)[1] * 3)
    assert (np.diagonal(bias, axis1=1, axis2=2) == 0).all()
    both_ways = pe.alibi_bias(4, 6, causal=False)
    np.testing.assert_array_equal(both_ways, both_ways.transpose(0, 2, 1))


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance",
                         [(32, 128), (16, 64), (8, 20), (64, 512), (18, 128), (108, 128)])
def test_t5_buckets_match_transformers(bidirectional, num_buckets, max_distance):
    # (18, 128) and (108, 128) put an offset exactly on a bucket boundary: only float32 logs, as T5 computes them,
    # land it in T5's bucket
    from transformers.models.t5.modeling_t5 import T5Attention

    relative = torch.arange(-1200, 1200)
    reference = T5Attention._relative_position_bucket(relative, bidirectional=bidirectional,
                                                      num_buckets=num_buckets, max_distance=max_distance)
    np.testing.assert_array_equal(pe.t5_relative_position_bucket(relative.numpy(), bidirectional, num_buckets,
                                                                 max_distance), reference.numpy())


def test_t5_bucket_matrix_layout():
    both = pe.t5_bucket_matrix(40, bidirectional=True)
    causal = pe.t5_bucket_matrix(40, bidirectional=False)
    assert both[5, 5] == 0 and both[5, 6] == 17 and both[6, 5] == 1  # key after query: upper half of buckets
    assert (causal[np.triu_indices(40, 1)] == 0).all()  # the future all shares bucket 0
    assert causal[30, 0] == causal[35, 5]  # relative: depends on j − i only


# --- learned tables from tiny models -----------------------------------------------------------------------------

def test_learned_tables_have_the_models_shapes():
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=24, n_layer=1, n_head=2, n_positions=40,
                                                                vocab_size=50))
    table = pe.learned_positions(gpt2)
    assert table.parameter == "transformer.wpe.weight" and table.shape == (40, 24) and table.grid is None
    np.testing.assert_array_equal(table.table, gpt2.transformer.wpe.weight.detach().numpy())

    bert = transformers.BertModel(transformers.BertConfig(hidden_size=24, num_hidden_layers=1, num_attention_heads=2,
                                                          intermediate_size=32, max_position_embeddings=30,
                                                          vocab_size=50))
    assert pe.learned_positions(bert).shape == (30, 24)

    dino = transformers.Dinov2Model(transformers.Dinov2Config(hidden_size=24, num_hidden_layers=1,
                                                              num_attention_heads=2, intermediate_size=32,
                                                              image_size=56, patch_size=14))
    table = pe.learned_positions(dino)
    assert table.shape == (16, 24) and table.grid == (4, 4) and table.prefix.shape == (1, 24)


def test_timm_vit_pos_embed_and_rope_models_say_what_they_use():
    import timm

    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64, depth=1)
    table = pe.learned_positions(vit)
    assert table.parameter == "pos_embed" and table.grid == (4, 4) and table.shape == (16, 192)
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(hidden_size=32, num_hidden_layers=1,
                                                                   num_attention_heads=2, num_key_value_heads=1,
                                                                   intermediate_size=64, vocab_size=50))
    with pytest.raises(ValueError, match="RoPE"):
        pe.learned_positions(llama)


def test_interpolation_matches_timm_resample():
    from timm.layers import resample_abs_pos_embed

    table = np.random.default_rng(0).normal(size=(16, 8)).astype(np.float32)
    for new_grid in [(6, 6), (2, 3), (4, 4)]:
        reference = resample_abs_pos_embed(torch.from_numpy(table)[None], list(new_grid), [4, 4],
                                           num_prefix_tokens=0, interpolation="bicubic", antialias=True)[0]
        np.testing.assert_allclose(pe.interpolate_grid(table, (4, 4), new_grid), reference.numpy(), atol=1e-5)
    np.testing.assert_allclose(pe.interpolate_grid(table, (4, 4), (4, 4)), table, atol=1e-6)
    with pytest.raises(ValueError, match="do not fill"):
        pe.interpolate_grid(table, (3, 4), (6, 6))


def test_patch_similarity_and_smoothness():
    grid = pe.sinusoidal_encoding_2d(6, 6, 32)
    similarity = pe.patch_similarity(grid, (6, 6))
    assert similarity.shape == (6, 6, 6, 6)
    np.testing.assert_allclose(similarity[2, 3, 2, 3], 1.0, atol=1e-6)
    assert similarity[2, 3, 2, 4] > similarity[2, 3, 5, 0]
    noise = np.random.default_rng(0).normal(size=(36, 32))
    assert pe.neighbour_similarity(grid, (6, 6)) > 0.8 > abs(pe.neighbour_similarity(noise, (6, 6)))


# --- permutation equivariance ------------------------------------------------------------------------------------

def test_attention_is_equivariant_only_without_positions():
    rng = np.random.default_rng(0)
    embeddings = rng.normal(size=(9, 32))
    tokens = [f"t{i}" for i in range(9)]
    plain = pe.permutation_equivariance(embeddings, tokens, seed=3)
    assert not np.array_equal(plain.permutation, np.arange(9))
    assert plain.max_gap < 1e-12
    np.testing.assert_allclose(plain.shuffled_attention_restored, plain.attention, atol=1e-6)
    positioned = pe.permutation_equivariance(embeddings, tokens, pe.sinusoidal_encoding(9, 32), seed=3)
    assert positioned.max_gap > 1e-2
    assert np.abs(positioned.shuffled_attention_restored - positioned.attention).max() > 1e-3
    np.testing.assert_allclose(positioned.attention.sum(-1), 1.0, atol=1e-6)
    with pytest.raises(ValueError, match="two tokens"):
        pe.permutation_equivariance(embeddings[:1], tokens[:1])
    with pytest.raises(ValueError, match="does not cover"):
        pe.permutation_equivariance(embeddings, tokens, pe.sinusoidal_encoding(4, 32))


def test_dynamic_size_vit_keeps_its_training_grid():
    import timm

    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64, depth=1)
    vit.pos_embed = torch.nn.Parameter(torch.zeros(1, 1 + 36, 192))  # trained at 6 × 6, created at 4 × 4
    assert pe.learned_positions(vit).grid == (6, 6)


def test_hub_cache_check_needs_config_and_weights(tmp_path):
    snapshot = tmp_path / "models--openai-community--gpt2" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (tmp_path / "models--openai-community--gpt2" / "refs").mkdir()
    (tmp_path / "models--openai-community--gpt2" / "refs" / "main").write_text("abc123")
    (snapshot / "config.json").write_text("{}")
    assert not pe.hub_model_cached("openai-community/gpt2", cache_dir=str(tmp_path))  # no weights yet
    (snapshot / "model.safetensors").write_bytes(b"")
    assert pe.hub_model_cached("openai-community/gpt2", cache_dir=str(tmp_path))
    assert not pe.hub_model_cached("someone/absent-model", cache_dir=str(tmp_path))


# --- the page's analyses and figures -------------------------------------------------------------------------------

def _loaded(model, key="tiny", family="encoder", notes=(), tokenizer=None):
    from models.core.loading import LoadedModel
    from models.core.specs import ModelSpec

    return LoadedModel(ModelSpec(family, key, "local", key, "-", "-"), model, tokenizer, "cpu", "float32",
                       notes=tuple(notes))


def test_equivariance_analysis_reads_the_models_embeddings_and_table():
    from tests.conftest import minilm_tokenizer, tiny_model
    from viz import figures
    from viz.figures.positional import EquivarianceMapsOptions

    bert = tiny_model("bert")
    loaded = _loaded(bert, tokenizer=minilm_tokenizer())
    options = EquivarianceMapsOptions("the cat saw the dog", seed=2, setting="tiny's learned table (X + P)")
    demo = pe.equivariance_of_model(loaded, None, options)
    assert demo.tokens == ("the", "cat", "saw", "the", "dog") and demo.model == "tiny"
    ids = minilm_tokenizer()("the cat saw the dog", add_special_tokens=False)["input_ids"]
    embeddings = bert.embeddings.word_embeddings.weight[ids].detach().numpy()
    table = bert.embeddings.position_embeddings.weight.detach().numpy()
    expected = pe.permutation_equivariance(embeddings, list(demo.tokens), table, seed=2)
    maps = figures.build("equivariance_maps", demo, options)
    np.testing.assert_allclose(maps.arrays()["attention"], expected.attention, atol=1e-6)
    gaps = figures.build("equivariance", demo, options)
    assert gaps.payload()["shuffled_tokens"] == [demo.tokens[i] for i in expected.permutation]
    np.testing.assert_allclose(gaps.arrays()["output_gap"][2], expected.output_gap, atol=1e-6)
    assert gaps.arrays()["output_gap"][0].max() < 1e-9  # no positions: the outputs only shuffle
    with pytest.raises(ValueError, match="unknown setting"):
        figures.build("equivariance_maps", demo, EquivarianceMapsOptions(setting="sorted"))
    with pytest.raises(ValueError, match="fewer than two tokens"):
        pe.equivariance_of_model(loaded, None, EquivarianceMapsOptions("hello"))


def test_grid_and_table_analyses_read_the_model_and_say_where_it_came_from():
    import timm

    from viz import figures
    from viz.figures.positional import GridOptions, ResizedGridOptions

    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64, depth=1)
    loaded = _loaded(vit, family="vit", notes=["created at 64 px"])
    found = pe.position_grid(loaded, None, GridOptions())
    np.testing.assert_array_equal(found.positions.table, vit.pos_embed[0, 1:].detach().numpy())
    assert found.notes == ("created at 64 px",) and found.positions.grid == (4, 4)
    grid = figures.build("position_grid", found, GridOptions())
    assert grid.payload()["grid"] == [4, 4] and grid.stem == "tiny_position-grid_4x4"
    resized = figures.build("position_grid_resized", found, ResizedGridOptions())  # default: twice the grid
    np.testing.assert_allclose(resized.arrays()["resized"], pe.interpolate_grid(found.positions.table, (4, 4),
                                                                                (8, 8)))
    assert "8 × 8 patches" in resized.caption and resized.stem.endswith("resized-8x8")
    with pytest.raises(ValueError, match="between 2 and 64"):
        figures.build("position_grid_resized", found, ResizedGridOptions(side=500))
    sinusoidal = pe.position_grid(None, None, GridOptions("sinusoidal"))
    np.testing.assert_array_equal(sinusoidal.positions.table, pe.sinusoidal_encoding_2d(14, 14, 192))
    with pytest.raises(ValueError, match="needs a loaded ViT"):
        pe.position_grid(None, None, GridOptions("model"))
    with pytest.raises(ValueError, match="unknown grid source"):
        pe.position_grid(loaded, None, GridOptions("imagenet"))
    with pytest.raises(ValueError, match="not a patch grid"):
        pe.position_grid(_loaded(transformers.GPT2Model(transformers.GPT2Config(n_embd=8, n_layer=1, n_head=2))),
                         None, GridOptions())


def test_rope_analysis_figure_holds_the_models_frequencies():
    from viz import figures

    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64,
        vocab_size=50, rope_parameters={"rope_type": "default", "rope_theta": 500.0}))
    found = pe.rope_of_model(_loaded(llama, "tiny-llama", "causal_lm"))
    figure = figures.build("rope_in_model", found)
    payload = figure.payload()
    assert payload["theta"] == 500.0 and payload["rotary_dim"] == 16 and payload["facts"]["Head dimension"] == "16"
    np.testing.assert_allclose(figure.arrays()["model_frequencies"], llama.model.rotary_emb.inv_freq.numpy())
    np.testing.assert_allclose(figure.arrays()["frequencies"], 500.0 ** (-np.arange(0, 16, 2) / 16))
    assert "equals b^(−2i/d)" in figure.caption and figure.stem == "tiny-llama_rope-frequencies"
    with pytest.raises(ValueError, match="does not use RoPE"):
        pe.rope_of_model(_loaded(transformers.GPT2Model(transformers.GPT2Config(n_embd=8, n_layer=1, n_head=2))))


@pytest.mark.parametrize("name,options", [("sinusoidal", dict(d=7)), ("sinusoidal", dict(length=100_000)),
                                          ("t5_buckets", dict(buckets=128, max_distance=16)),
                                          ("alibi", dict(heads=0)), ("rope", dict(head_dim=9)),
                                          ("sinusoidal_2d", dict(d=18))])
def test_formula_views_refuse_bad_options_with_a_message(name, options):
    from viz import figures

    view = figures.get(name)
    with pytest.raises(ValueError):
        view.build(None, view.options(**options))


def test_cli_writes_the_default_view_and_a_formula(patched_loader, tmp_path, capsys):
    import json

    from app import cli

    assert cli.main(["--page", "positional", "--out", str(tmp_path / "why"), "--format", "png,json"]) == 0
    (written,) = (tmp_path / "why").glob("*.json")  # the default view: the equivariance demo on the tiny BERT
    payload = json.loads(written.read_text())
    assert written.name.startswith("all-minilm-l6-v2_equivariance_output-change_seed-0_the-dog-bit")
    assert max(payload["output_gap"]["no positions"]) < 1e-9 < min(payload["output_gap"]["sinusoidal (X·√d + PE)"])
    assert cli.main(["--page", "positional", "--view", "sinusoidal", "--d", "256", "--length", "64", "--out",
                     str(tmp_path), "--format", "png,npz"]) == 0
    saved = np.load(tmp_path / "sinusoidal_d-256_length-64_base-10000.npz")
    assert saved["encoding"].shape == (64, 256) and str(saved["meta_d"]) == "256"
    assert saved["encoding"][17, 2 * 5] == pytest.approx(math.sin(17 / 10000 ** (10 / 256)), abs=1e-6)
    capsys.readouterr()
    assert cli.main(["--page", "positional", "--view", "t5_buckets", "--buckets", "128", "--max_distance", "16",
                     "--out", str(tmp_path)]) == 2
    assert "max_distance (16) must exceed" in capsys.readouterr().err
    assert cli.main(["--page", "positional", "--view", "rope", "--layer", "3", "--out", str(tmp_path)]) == 2
    assert "has no option --layer" in capsys.readouterr().err


# --- the page (AppTest, tiny models) -----------------------------------------------------------------------------

@pytest.fixture
def tiny_vit():
    import timm

    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64, depth=1)


@pytest.fixture
def positional_page(patched_loader, tiny_folders, tiny_vit, monkeypatch):
    """The page with tiny BERT / Llama models and a tiny untrained timm ViT in place of the registered ViTs."""
    from streamlit.testing.v1 import AppTest

    from models import families
    from models.core.loading import LoadedModel

    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(tiny_folders["bert"].parent))  # the tiny models' folder
    text_load = families.load

    def fake_load(spec, device="cpu", dtype="float32", progress=lambda step, fraction: None):
        if spec.family == "vit":
            return LoadedModel(spec, tiny_vit, None, device, dtype, notes=("created at 64 px for the test",))
        return text_load(spec, device, dtype, progress)

    monkeypatch.setattr(families, "load", fake_load)
    monkeypatch.setattr(pe, "hub_model_cached", lambda model_id, cache_dir=None: False)  # gpt2: not downloaded
    return AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app" / "views" / "positional.py"),
                             default_timeout=120)


def _page_text(app) -> str:
    parts = [e.value for e in app.markdown] + [e.value for e in app.caption] + [e.value for e in app.text]
    return "\n".join(str(p) for p in parts)


def test_page_shows_every_view_and_reads_the_models(positional_page, tiny_folders, tiny_vit, offered):
    app = positional_page.run()
    assert not app.exception, app.exception
    assert not app.error, [e.value for e in app.error]
    assert len(app.latex) == 5
    metrics = {m.label: m.value for m in app.metric}
    assert metrics["rope_theta"] == "10000" and metrics["Head dimension"] == "8"  # the tiny Llama's config
    text = _page_text(app)
    assert "inv_freq` equals b^(−2i/d)" in text
    assert "embeddings.position_embeddings.weight" in text  # the tiny BERT's learned table was read
    assert "Shuffled:" in text and "created at 64 px for the test" in text
    # the figures hold the models' own numbers
    bert = transformers.BertModel.from_pretrained(tiny_folders["bert"])
    table = bert.embeddings.position_embeddings.weight.detach().numpy()
    np.testing.assert_array_equal(offered["learned_text_table"].arrays()["table"], table)
    np.testing.assert_allclose(offered["learned_text_table"].arrays()["cosine"], pe.position_similarity(table))
    np.testing.assert_array_equal(offered["learned_grid"].arrays()["table"], tiny_vit.pos_embed[0, 1:].detach())
    assert offered["learned_grid"].arrays()["resized"].shape == (8 * 8, 192)  # twice the 4 × 4 grid
    shuffled = next(t.value for t in app.text if t.value.startswith("Shuffled:"))
    tokens = offered["perm"].payload()["tokens"]
    assert shuffled == "Shuffled: " + " ".join(tokens[i] for i in offered["perm"].arrays()["permutation"])
    np.testing.assert_allclose(offered["perm"].arrays()["attention"].sum(-1), 1.0, atol=1e-6)
    np.testing.assert_allclose(offered["perm"].arrays()["shuffled_attention_restored"],
                               offered["perm"].arrays()["attention"], atol=1e-6)  # no positions: equivariant
    app.button[0].click().run()  # "use these settings": the tiny Llama's head dimension moves into the RoPE charts
    assert app.select_slider(key="rope_d").value == 8 and app.number_input(key="rope_base").value == 10000.0
    assert offered["rope"].metadata["head_dim"] == 8


def test_page_user_mistakes_are_messages_and_the_page_keeps_working(positional_page):
    app = positional_page.run()
    app.text_input(key="perm_sentence").set_value("hello").run()
    assert not app.exception
    assert any("fewer than two tokens" in e.value for e in app.error)
    assert len(app.latex) == 5  # every other view still renders
    app.text_input(key="perm_sentence").set_value("<script>alert(1)</script> **bold** [x](http://e.com)").run()
    assert not app.exception and not app.error
    shuffled = [t.value for t in app.text if t.value.startswith("Shuffled:")]
    assert shuffled and "<" in shuffled[0]  # shown as plain text, never as HTML or markdown
    app.select_slider(key="t5_buckets").set_value(128)
    app.select_slider(key="t5_distance").set_value(16).run()  # 16 is inside T5's exact range of 32 offsets
    assert not app.exception
    assert any("must exceed the exact range" in e.value for e in app.error)
    app.select_slider(key="t5_buckets").set_value(8)
    app.toggle(key="alibi_causal").set_value(False)
    app.radio(key="learned_grid").set_value("2-D sinusoidal (formula)")
    app.slider(key="learned_resize").set_value(5).run()
    assert not app.exception and not app.error
    captions = [caption.value for caption in app.caption]  # a figure's caption is under it (app.display)
    assert any("14 × 14 patches" in c for c in captions) and any("5 × 5 patches" in c for c in captions)
    app.radio(key="learned_grid").set_value(f"timm {pe.UNTRAINED_VIT}, untrained (random init)").run()
    assert not app.exception and not app.error
    assert any("untrained model" in w.value for w in app.warning)
    app.radio(key="learned_text").set_value(app.radio(key="learned_text").options[1]).run()  # gpt2, from the hub
    assert not app.exception
    assert any("not in this machine's Hugging Face cache" in i.value for i in app.info)


def test_page_reads_the_picked_text_models_own_table(positional_page, monkeypatch):
    """Another text model's table is that model's, not the first one's from the cache (gpt2 here is the tiny Llama,
    which has no learned table: a message)."""
    monkeypatch.setattr(pe, "hub_model_cached", lambda model_id, cache_dir=None: True)
    app = positional_page.run()
    app.radio(key="learned_text").set_value(app.radio(key="learned_text").options[1]).run()
    assert not app.exception
    assert any("no learned absolute position table" in e.value for e in app.error)
