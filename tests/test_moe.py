"""Mixture-of-experts routing: capture proven against each family's own MoE output, statistics, views, the mini."""
from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from models import families
from models.analysis import routing as stats
from models.core.inputs import TextInput
from models.families.moe import model as moe

ROOT = Path(__file__).resolve().parents[1]
MINI = ROOT / "sample_data" / "moe"


# --- tiny random models of each family ----------------------------------------------------------------------------

def tiny_mixtral(vocab: int = 128) -> transformers.MixtralForCausalLM:
    torch.manual_seed(0)
    config = transformers.MixtralConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                        num_experts_per_tok=2, max_position_embeddings=128)
    return transformers.MixtralForCausalLM(config).eval()


def tiny_switch(capacity: int = 4) -> transformers.SwitchTransformersForConditionalGeneration:
    torch.manual_seed(0)
    config = transformers.SwitchTransformersConfig(
        vocab_size=128, d_model=32, d_kv=8, d_ff=48, num_layers=4, num_decoder_layers=2, num_heads=4, num_experts=4,
        expert_capacity=capacity, num_sparse_encoder_layers=2, num_sparse_decoder_layers=1, router_jitter_noise=0.0)
    return transformers.SwitchTransformersForConditionalGeneration(config).eval()


def tiny_qwen2_moe() -> transformers.Qwen2MoeForCausalLM:
    torch.manual_seed(0)
    config = transformers.Qwen2MoeConfig(vocab_size=128, hidden_size=32, intermediate_size=48, moe_intermediate_size=24,
                                         shared_expert_intermediate_size=40, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, num_experts=6,
                                         num_experts_per_tok=2, norm_topk_prob=False)
    return transformers.Qwen2MoeForCausalLM(config).eval()


def tiny_deepseek_v3() -> transformers.DeepseekV3ForCausalLM:
    torch.manual_seed(0)
    config = transformers.DeepseekV3Config(
        vocab_size=128, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
        first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
        num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1, routed_scaling_factor=2.5,
        q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8)
    model = transformers.DeepseekV3ForCausalLM(config).eval()
    for site in moe.router_sites(model):  # a non-zero choice bias, so choosing and weighting really differ
        site.router.e_score_correction_bias.copy_(torch.linspace(-0.2, 0.2, 8))
    return model


def capture(model, input_ids: torch.Tensor, encoder_only: bool = False):
    """Routing plus each MoE block's input and output, recorded by test-only hooks."""
    seen = {}
    hooks = [site.block.register_forward_hook(
        lambda module, args, output, name=site.block_name: seen.__setitem__(name, (args[0].detach(), output)))
        for site in moe.router_sites(model)]
    try:
        with moe.recording(model) as recorder, torch.inference_mode():
            (model.get_encoder() if encoder_only else model)(input_ids=input_ids)
    finally:
        for hook in hooks:
            hook.remove()
    ids = input_ids[0].tolist()
    routing = moe.routing_from_recorder(recorder, [f"t{i}" for i in ids], ids, None, model.config)
    return routing, seen


def swiglu_expert(experts, e: int, x: torch.Tensor) -> torch.Tensor:
    gate, up = torch.nn.functional.linear(x, experts.gate_up_proj[e]).chunk(2, dim=-1)
    return torch.nn.functional.linear(experts.act_fn(gate) * up, experts.down_proj[e])


def weights_from_probs(routing: moe.Routing, layer: int, logits_rule: moe.DispatchRule) -> np.ndarray:
    """The dispatch weights recomputed from the captured probabilities and the rule (not read from the gate)."""
    probs = torch.from_numpy(routing.probs[layer])
    if logits_rule.score_function == "sigmoid":
        raise AssertionError("use sigmoid scores directly")
    return moe.dispatch_weights(probs, torch.from_numpy(routing.top_experts[layer]), logits_rule).numpy()


# --- capture ----------------------------------------------------------------------------------------------------

def test_mixtral_probabilities_sum_to_one_and_top_k_is_the_dispatch():
    model = tiny_mixtral()
    routing, _ = capture(model, torch.randint(0, 128, (1, 24)))
    assert routing.probs.shape == (2, 24, 4) and routing.top_experts.shape == (2, 24, 2)
    np.testing.assert_allclose(routing.probs.sum(-1), 1.0, atol=1e-5)
    # top-2 of the float32 softmax is exactly what the model dispatched, highest first
    ours = np.argsort(-routing.probs, axis=-1, kind="stable")[..., :2]
    np.testing.assert_array_equal(ours, routing.top_experts)
    assert routing.score_function == "softmax" and routing.renormalized and routing.weight_scale == 1.0
    np.testing.assert_allclose(routing.top_weights.sum(-1), 1.0, atol=1e-5)
    assert routing.dispatch_rule() == "top-2 of softmax, renormalised to sum to 1"


@torch.no_grad()
def test_mixtral_layer_output_recomputed_from_captured_routing():
    model = tiny_mixtral()
    routing, seen = capture(model, torch.randint(0, 128, (1, 20)))
    rule = moe.DispatchRule("softmax", True, 1.0)
    for layer, site in enumerate(moe.router_sites(model)):
        x, y = seen[site.block_name]
        x = x.reshape(-1, x.shape[-1])
        weights = weights_from_probs(routing, layer, rule)
        recomputed = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for e, w in zip(routing.top_experts[layer, t], weights[t]):
                recomputed[t] += float(w) * swiglu_expert(site.block.experts, int(e), x[t])
        torch.testing.assert_close(recomputed, y.reshape(-1, y.shape[-1]), atol=1e-5, rtol=1e-4)


@torch.no_grad()
def test_switch_top1_with_capacity_recomputed_from_captured_routing():
    model = tiny_switch(capacity=4)
    routing, seen = capture(model, torch.randint(2, 128, (1, 16)), encoder_only=True)
    assert routing.stack == "encoder" and routing.top_k == 1 and routing.capacity == 4
    assert routing.score_function == "softmax" and not routing.renormalized
    np.testing.assert_allclose(routing.probs.sum(-1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(routing.top1, routing.probs.argmax(-1))
    assert (~routing.kept).any(), "16 tokens over 4 experts of capacity 4 must overflow somewhere"
    for layer, site in enumerate(s for s in moe.router_sites(model) if s.stack == "encoder"):
        counts = np.bincount(routing.top1[layer][routing.kept[layer, :, 0]], minlength=4)
        assert counts.max() <= 4
        x, y = seen[site.block_name]
        x, y = x.reshape(-1, x.shape[-1]), y.reshape(-1, y.shape[-1])
        for t in range(x.shape[0]):
            e = int(routing.top1[layer, t])
            expected = torch.zeros_like(x[t])
            if routing.kept[layer, t, 0]:  # a dropped token skips its expert: the layer adds nothing
                expected = float(routing.probs[layer, t, e]) * site.block.experts[f"expert_{e}"](x[t][None])[0]
            torch.testing.assert_close(y[t], expected, atol=1e-5, rtol=1e-4)


@torch.no_grad()
def test_qwen2_moe_shared_expert_and_unnormalised_top_k():
    model = tiny_qwen2_moe()
    routing, seen = capture(model, torch.randint(0, 128, (1, 12)))
    assert not routing.renormalized and routing.num_shared_experts == 1 and routing.shared_weight is not None
    for layer, site in enumerate(moe.router_sites(model)):
        x, y = seen[site.block_name]
        x = x.reshape(-1, x.shape[-1])
        recomputed = torch.from_numpy(routing.shared_weight[layer])[:, None] * site.block.shared_expert(x)
        for t in range(x.shape[0]):
            for e in routing.top_experts[layer, t]:
                recomputed[t] += float(routing.probs[layer, t, e]) * swiglu_expert(site.block.experts, int(e), x[t])
        torch.testing.assert_close(recomputed, y.reshape(-1, y.shape[-1]), atol=1e-5, rtol=1e-4)


def tiny_llama4() -> transformers.Llama4ForCausalLM:
    torch.manual_seed(0)
    config = transformers.Llama4TextConfig(
        vocab_size=128, hidden_size=32, intermediate_size=24, intermediate_size_mlp=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2,
        interleave_moe_layer_step=2, attention_chunk_size=64, max_position_embeddings=128)
    model = transformers.Llama4ForCausalLM(config).eval()
    with torch.no_grad():
        for site in moe.router_sites(model):  # a fresh router's weights are zeros: every expert ties
            site.router.weight.normal_(0, 0.3)
            site.block.experts.gate_up_proj.normal_(0, 0.2)
    return model


@torch.no_grad()
def test_llama4_routes_its_dense_scores_and_weighs_each_experts_input():
    """Llama 4's router hands back (scores, logits), scores zero where a token did not go; each chosen expert gets
    the token multiplied by sigmoid(logit), and the shared expert adds the token's own MLP."""
    model = tiny_llama4()
    routing, seen = capture(model, torch.randint(0, 128, (1, 10)))
    assert routing.layer_indices == [1] and routing.top_k == 2  # every second layer is MoE
    assert routing.score_function == "sigmoid" and not routing.renormalized and routing.weights_scale_input
    assert routing.dispatch_rule() == "top-2 of sigmoid (each weight scales the expert's input)"
    site = moe.router_sites(model)[0]
    x, y = seen[site.block_name]
    x = x.reshape(-1, x.shape[-1])
    logits = x @ site.router.weight.T
    np.testing.assert_array_equal(np.sort(routing.top_experts[0], -1), np.sort(logits.topk(2).indices.numpy(), -1))
    routed_in = torch.zeros(4, *x.shape)  # (experts, tokens, hidden): the token scaled by its weight, else 0
    for t in range(x.shape[0]):
        for e, w in zip(routing.top_experts[0, t], routing.top_weights[0, t]):
            routed_in[int(e), t] = float(w) * x[t]
    recomputed = site.block.shared_expert(x) + site.block.experts(routed_in.reshape(-1, x.shape[-1])).reshape(
        4, *x.shape).sum(0)
    torch.testing.assert_close(recomputed, y[0].reshape(x.shape), atol=1e-5, rtol=1e-4)


def test_a_router_the_page_cannot_read_is_refused_when_it_loads_naming_the_architecture(tmp_path, tiny_tokenizer,
                                                                                       monkeypatch):
    """PhiMoE's sparse mixer weighs its experts by no top-k rule of softmax or sigmoid: the load says so, naming
    phimoe, before any text is routed."""
    torch.manual_seed(0)
    config = transformers.PhimoeConfig(vocab_size=len(tiny_tokenizer), hidden_size=32, intermediate_size=48,
                                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                       num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=128)
    model = transformers.PhimoeForCausalLM(config).eval()
    with torch.no_grad():
        for site in moe.router_sites(model):
            site.router.weight.normal_(0, 1.0)
    folder = tmp_path / "tiny-phimoe"
    model.save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    with pytest.raises(ValueError, match="phimoe's router turns its logits into weights"):
        _load_local(folder, monkeypatch)


@torch.no_grad()
def test_deepseek_v3_sigmoid_scores_scaling_and_shared_experts():
    model = tiny_deepseek_v3()
    routing, seen = capture(model, torch.randint(0, 128, (1, 12)))
    assert routing.score_function == "sigmoid" and routing.renormalized
    assert routing.weight_scale == pytest.approx(2.5) and routing.num_shared_experts == 1
    assert routing.layer_indices == [1, 2]  # the first block is dense (first_k_dense_replace=1)
    for layer, site in enumerate(moe.router_sites(model)):
        x, y = seen[site.block_name]
        x = x.reshape(-1, x.shape[-1])
        logits = x.float() @ site.router.weight.float().T
        chosen = torch.from_numpy(routing.top_experts[layer])
        weights = moe.dispatch_weights(torch.sigmoid(logits), chosen, moe.DispatchRule("sigmoid", True, 2.5))
        recomputed = site.block.shared_experts(x)
        for t in range(x.shape[0]):
            for e, w in zip(chosen[t], weights[t]):
                recomputed[t] += w * swiglu_expert(site.block.experts, int(e), x[t])
        torch.testing.assert_close(recomputed, y.reshape(-1, y.shape[-1]), atol=1e-5, rtol=1e-4)


def test_hooks_are_removed_even_when_the_forward_fails():
    model = tiny_mixtral()
    routers = [site.router for site in moe.router_sites(model)]
    with pytest.raises(RuntimeError):
        with moe.recording(model):
            raise RuntimeError("boom")
    assert all(not router._forward_hooks for router in routers)
    with pytest.raises(ValueError, match="no mixture-of-experts"):
        with moe.recording(torch.nn.Linear(2, 2)):
            pass


def test_concurrent_recordings_on_one_model_do_not_mix():
    model = tiny_mixtral()
    inputs = [torch.randint(0, 128, (1, 10 + 5 * i)) for i in range(4)]
    reference = [capture(model, ids)[0].top_experts for ids in inputs]
    barrier, results, errors = threading.Barrier(4), {}, []

    def work(i):
        try:
            with moe.recording(model) as recorder, torch.inference_mode():
                barrier.wait()
                for _ in range(3):
                    model(input_ids=inputs[i])
            assert all(len(calls) == 3 for calls in recorder.calls.values())
            ids = inputs[i][0].tolist()
            results[i] = moe.routing_from_recorder(recorder, [str(t) for t in ids], ids, None, model.config)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for i in range(4):
        np.testing.assert_array_equal(results[i].top_experts, reference[i])


def test_infer_dispatch_rule_rejects_weights_no_rule_explains():
    logits = torch.randn(6, 4)
    experts = torch.topk(logits, 2).indices
    calls = [moe.RouterCall(logits, experts, torch.rand(6, 2), torch.ones(6, 2, dtype=torch.bool))]
    assert moe.infer_dispatch_rule(calls) is None


# --- running through the app's loader -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_tokenizer():
    from models.minis.moe import data, train

    return train.build_tokenizer(data.corpus(20_000, seed=3), vocab_size=128)


@pytest.fixture(scope="module")
def saved_mixtral(tmp_path_factory, tiny_tokenizer):
    folder = tmp_path_factory.mktemp("models") / "tiny-mixtral"
    tiny_mixtral(vocab=len(tiny_tokenizer)).save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    return folder


def _load_local(folder: Path, monkeypatch):
    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(folder.parent))
    return families.load(families.custom("moe", str(folder)), "cpu", "float32")


def test_run_on_a_saved_model_through_the_loader(saved_mixtral, monkeypatch):
    loaded = _load_local(saved_mixtral, monkeypatch)
    text = "def add(a, b):\n    return a + b\n\nThe cat sat on 12 mats."
    result = moe.run(loaded, TextInput(text))
    routing = result.routing
    assert isinstance(result, moe.RoutingResult) and result.attention == {} and result.input_name == text[:40]
    assert result.tokens == routing.tokens and len(routing.tokens) == routing.probs.shape[1]
    assert "".join(routing.raw_tokens) == text  # offsets cover the text exactly
    np.testing.assert_allclose(routing.probs.sum(-1), 1.0, atol=1e-5)
    assert result.model.family == "moe" and "hooks" in result.model.capture

    assert routing.text == text and routing.layer_labels == ["block 0", "block 1"]
    with pytest.raises(AttributeError):
        result.routing = routing  # frozen: cached results are shared between sessions
    assert not routing.probs.flags.writeable

    long = moe.run(loaded, TextInput("word " * 400, 32))
    assert long.routing.probs.shape[1] == 32
    assert any("only the first 32" in notice for notice in long.notices)
    for bad in ("", "   \n"):
        with pytest.raises(ValueError, match="empty"):
            families.run(loaded, TextInput(bad))
    with pytest.raises(ValueError, match="at least 2"):
        moe.run(loaded, TextInput(text, 1))
    with pytest.raises(ValueError, match="reads a TextInput"):
        families.run(loaded, text)
    odd = moe.run(loaded, TextInput("\u202e<b>bold</b>\u200b\t😀"))
    assert any("⟨U+202E⟩" in token for token in odd.tokens)  # bidi override made visible, not applied


def test_switch_loads_through_the_loader_and_routes_its_encoder(tmp_path, tiny_tokenizer, monkeypatch):
    folder = tmp_path / "tiny-switch"
    model = tiny_switch(capacity=64)
    model.resize_token_embeddings(len(tiny_tokenizer))
    model.save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    loaded = _load_local(folder, monkeypatch)
    assert loaded.model.config.is_encoder_decoder
    result = moe.run(loaded, TextInput("Numbers like 42 and words."))
    routing = result.routing
    assert routing.stack == "encoder" and routing.num_layers == 2 and routing.top_k == 1
    assert any("encoder" in notice for notice in result.notices)


# --- statistics -------------------------------------------------------------------------------------------------

def test_balance_figures_for_even_and_collapsed_routing():
    even = np.arange(16)[None, :, None] % 4  # (1, 16, 1): each of 4 experts gets 4 tokens
    load = stats.expert_load(even, 4)
    np.testing.assert_allclose(load, 0.25)
    assert stats.coefficient_of_variation(load)[0] == pytest.approx(0.0)
    uniform_probs = np.full((1, 16, 4), 0.25)
    assert stats.switch_aux_loss(load, uniform_probs)[0] == pytest.approx(1.0)
    collapsed = np.zeros((1, 16, 1), dtype=int)
    load_c = stats.expert_load(collapsed, 4)
    assert stats.coefficient_of_variation(load_c)[0] == pytest.approx(np.sqrt(3))
    certain = np.zeros((1, 16, 4))
    certain[..., 0] = 1.0
    assert stats.switch_aux_loss(load_c, certain)[0] == pytest.approx(4.0)
    assert stats.router_entropy(uniform_probs)[0, 0] == pytest.approx(np.log(4))
    assert stats.router_entropy(certain)[0, 0] == pytest.approx(0.0)


def test_coactivation_and_cross_layer_consistency():
    top = np.array([[0, 1], [0, 1], [2, 3], [1, 0]])
    matrix = stats.coactivation(top, 4)
    np.testing.assert_allclose(matrix, matrix.T)
    assert matrix[0, 1] == pytest.approx(0.75) and matrix[2, 3] == pytest.approx(0.25)
    np.testing.assert_allclose(np.diag(matrix), [0.75, 0.75, 0.25, 0.25])
    rng = np.random.default_rng(0)
    layer0 = rng.integers(0, 4, 400)
    renamed = (layer0 + 1) % 4  # the same decision under other expert numbers
    independent = rng.integers(0, 4, 400)
    nmi = stats.cross_layer_consistency(np.stack([layer0, renamed, independent]))
    assert nmi[0, 1] == pytest.approx(1.0) and nmi[0, 2] < 0.05
    observed, chance = stats.consecutive_repeat_rate(np.stack([np.repeat(np.arange(4), 100)]))
    assert observed[0] > 0.99 and chance[0] == pytest.approx(0.25)


def test_specialisation_against_shuffled_routing():
    rng = np.random.default_rng(0)
    categories = list(rng.choice(stats.CATEGORIES, 400))
    specialised = np.array([[[stats.CATEGORIES.index(c) * 2, stats.CATEGORIES.index(c) * 2 + 1]
                             for c in categories]])  # (1, 400, 2): each category owns two experts
    random_routes = rng.integers(0, 8, (1, 400, 2))
    strong = stats.specialisation(specialised, categories, shuffles=50)
    weak = stats.specialisation(random_routes, categories, shuffles=50)
    assert strong.observed[0] == pytest.approx(strong.category_entropy, rel=1e-6)
    assert strong.observed[0] > strong.shuffled_p95[0] + 1.0
    assert weak.observed[0] < weak.shuffled_p95[0] + 0.05
    assert sum(strong.counts.values()) == 400


def test_token_categories_and_code_lines():
    text = "The cat sat.\ndef f(x):\n    return x + 1\n2024-01-05 3.5"
    raw = ["The", " cat", " sat", ".", "\n", "def", " f", "(", "x", "):", "\n", "    ", "return", " x", " +", " 1",
           "\n", "2024", "-", "01", "-", "05", " 3", ".", "5"]
    assert "".join(raw) == text
    offsets, start = [], 0
    for token in raw:
        offsets.append((start, start + len(token)))
        start += len(token)
    cats = stats.token_categories(text, raw, offsets)
    assert cats[:4] == ["word", "word", "word", "punctuation"]
    assert cats[5:10] == ["code"] * 5 and cats[12:15] == ["code"] * 3 and cats[15] == "number"
    assert cats[4] == stats.OTHER and cats[11] == stats.OTHER
    assert cats[17] == "number" and cats[18] == "punctuation"


def test_code_line_heuristic_agrees_with_the_generator():
    from models.minis.moe import data

    correct = total = 0
    for segment in data.segments(60_000, seed=5):
        for line in segment.text.split("\n"):
            if line.strip():
                total += 1
                correct += stats.is_code_line(line) == (segment.kind == "code")
    assert correct / total > 0.98
    for prose in ("If you go, for example, to the market in town.", "For all we know it was there.",
                  "Return the book when you are done, please."):
        assert not stats.is_code_line(prose)


# --- the mini ---------------------------------------------------------------------------------------------------

def test_the_mini_loads_routes_and_has_its_card():
    assert (MINI / "model.safetensors").stat().st_size < 20 * 2**20
    spec = next(s for s in families.specs("moe") if s.source == "mini")
    loaded = families.load(spec, "cpu", "float32")
    config = loaded.model.config
    assert config.num_local_experts >= 4 and config.num_experts_per_tok == 2 and config.num_hidden_layers >= 3
    result = moe.run(loaded, TextInput("def mean(values):\n    return sum(values) / len(values)\n\nAnna sang 3 songs."))
    routing = result.routing
    np.testing.assert_allclose(routing.probs.sum(-1), 1.0, atol=1e-5)
    assert routing.num_layers == config.num_hidden_layers and routing.renormalized
    measured = json.loads((MINI / "metrics.json").read_text())
    assert measured["perplexity"] < 20
    assert measured["mean_mi_category_bits"] > measured["mean_mi_category_shuffled_bits"]
    card = (MINI / "card.md").read_text()
    assert "Perplexity" in card and "python -m models.minis.moe.train" in card


# --- drawing primitives (viz/moe_charts.py) --------------------------------------------------------------------------------

def test_primitives_build_and_keep_token_text_as_data():
    from viz import moe_charts as viz

    tokens = ["<b>hi</b>", "␣", "x"]
    chart = viz.routed_text(tokens, ["<b>hi</b>", " ", "x\n"], np.array([0, 1, 9]), np.array([0.6, 0.5, 0.7]),
                            num_experts=10, selected=1)
    spec = chart.to_dict()
    rows = next(iter(spec["datasets"].values()))
    assert [row["token"] for row in rows] == tokens and rows[2]["expert"] == "E9"
    with pytest.raises(ValueError):
        viz.routed_text(tokens, tokens, np.array([0, 1]), np.array([0.5, 0.5]), 4)
    probs = np.array([0.1, 0.5, 0.3, 0.1])
    bars = viz.gate_bars(probs, np.array([1, 2]), np.array([0.625, 0.375]), float(stats.router_entropy(probs)))
    marks = [row["mark"] for row in next(iter(bars.to_dict()["datasets"].values()))]
    assert marks[1].startswith("top-1") and marks[2].startswith("top-2") and marks[0] == ""
    load = np.array([[0.5, 0.25, 0.25, 0.0], [0.25] * 4])
    [chart.to_dict() for chart in viz.load_heatmap(load, ["b0", "b1"], stats.coefficient_of_variation(load),
                                                   np.ones(2))]
    viz.load_difference(load, load[::-1], ["b0", "b1"], "A", "B").to_dict()
    viz.layer_strip(tokens, np.array([[0, 1, 2], [3, 0, 1]]), ["b0", "b1"], 4, selected=2).to_dict()
    assert viz.expert_colours(12)[9] == viz.expert_colours(12)[0]  # colours repeat; the E-number tells them apart
    big = viz.coactivation_chart(np.random.default_rng(0).random((128, 128)))
    assert big.size[0] >= 128  # 16k cells: an image, not a chart


# --- figures (viz/figures/moe.py): the numbers in every file are the model's -----------------------------------------

@pytest.fixture(scope="module")
def routed(saved_mixtral):
    """The tiny Mixtral (loaded as a typed local folder) and its routing of a short mixed text."""
    mp = pytest.MonkeyPatch()
    mp.setenv("ATTN_EXPLORER_MODEL_DIRS", str(saved_mixtral.parent))
    try:
        loaded = families.load(families.custom("moe", str(saved_mixtral)))
    finally:
        mp.undo()
    return loaded, moe.run(loaded, TextInput("def add(a, b):\n    return a + b\n\nThe cat sat on 12 mats."))


def _table(figure):

    return figure.table()


def test_every_view_of_the_family_builds_and_its_files_hold_what_they_say(routed):
    from tests.conftest import check_files
    from viz import figures

    loaded, result = routed
    assert families.get("moe").views[0] == "routed_text"
    for name in families.get("moe").views:
        view = figures.get(name)
        data = view.analysis(loaded, result, view.options()) if view.data == "analysis" else result
        figure = figures.build(name, data)
        files = check_files(figure)
        assert figure.stem.startswith("tiny-mixtral"), figure.stem
        if "json" in files:
            assert json.loads(files["json"])["model"] == result.model.key


def test_routing_gate_and_strip_figures_hold_the_models_numbers(routed):
    from viz import figures
    from viz.figures.moe import GateOptions, RoutedOptions, StripOptions

    _, result = routed
    routing = result.routing
    figure = figures.build("routed_text", result, RoutedOptions(layer=1, token=3))
    assert figure.stem.endswith("_routing_block-1")
    np.testing.assert_array_equal(_table(figure)["top-1 expert"], routing.top1[1])
    np.testing.assert_allclose(_table(figure)["top-1 weight"], routing.top_weights[1, :, 0])
    np.testing.assert_array_equal(figure.arrays()["top_experts"], routing.top_experts[1])
    drawn = next(iter(figure.chart.to_dict()["datasets"].values()))
    assert [row["expert"] for row in drawn] == [f"E{e}" for e in routing.top1[1]]
    assert [row["position"] for row in drawn if row["selected"]] == [3]

    gate = figures.build("gate", result, GateOptions(layer=1, token=4))
    assert gate.stem.endswith("_gate_block-1_token-4")
    np.testing.assert_allclose(gate.arrays()["probs"], routing.probs[1, 4])
    np.testing.assert_allclose(_table(gate)["probability"], routing.probs[1, 4])
    np.testing.assert_array_equal(gate.arrays()["top_experts"], routing.top_experts[1, 4])
    bars = next(iter(gate.chart.to_dict()["datasets"].values()))
    chosen = [int(row["expert"][1:]) for row in sorted(bars, key=lambda r: r["rank"]) if row["rank"]]
    assert chosen == list(routing.top_experts[1, 4])

    count = len(routing.tokens)
    strip = figures.build("layer_strip", result, StripOptions(token=count - 1, window=8))
    assert strip.stem.endswith(f"tokens-{count - 8}-{count - 1}")  # the window ends at the text's end
    np.testing.assert_array_equal(strip.arrays()["top1"], routing.top1[:, count - 8:])
    np.testing.assert_array_equal(_table(strip).to_numpy(), routing.top1[:, count - 8:])


def test_balance_and_layer_figures_hold_the_models_numbers(routed):
    from viz import figures
    from viz.figures.moe import (
        CoactivationOptions,
        ConsistencyOptions,
        SpecialisationOptions,
    )

    loaded, result = routed
    routing = result.routing
    load = figures.build("load", result)
    expected = stats.expert_load(routing.top_experts, routing.num_experts)
    np.testing.assert_allclose(load.arrays()["load"], expected)
    np.testing.assert_allclose(_table(load).to_numpy(), expected)
    np.testing.assert_allclose(load.arrays()["load"].sum(axis=1), 1.0)
    co = figures.build("coactivation", result, CoactivationOptions(layer=1))
    np.testing.assert_allclose(co.arrays()["coactivation"], stats.coactivation(routing.top_experts[1], 4))
    assert np.trace(co.arrays()["coactivation"]) == pytest.approx(routing.top_k)  # each token picks k experts
    consistency = figures.build("consistency", result, ConsistencyOptions("cividis"))
    np.testing.assert_allclose(consistency.arrays()["nmi"], stats.cross_layer_consistency(routing.top1))
    repeat, _ = stats.consecutive_repeat_rate(routing.top1)
    assert f"{repeat[0]:.0%} (chance" in consistency.caption
    assert "cividis" in json.dumps(consistency.chart.to_dict())
    options = SpecialisationOptions(shuffles=20)
    special = figures.build("specialisation", stats.specialisation_of_run(loaded, result, options), options)
    reference = stats.specialisation(routing.top_experts, routing.categories, shuffles=20)
    np.testing.assert_allclose(special.arrays()["observed_bits"], reference.observed)
    np.testing.assert_allclose(special.arrays()["shuffled_mean_bits"], reference.shuffled_mean)
    assert "(20 times)" in special.caption


def test_specialisation_caption_counts_tokens_in_words_not_a_python_dict(routed):
    """Issue 28: the page showed "Tokens counted: {'word': 33, …}"; the caption and the card read as sentences."""
    from viz import figures

    loaded, result = routed
    view = figures.get("specialisation")
    figure = figures.build("specialisation", view.analysis(loaded, result, view.options()))
    counts = figure.payload()["category_counts"]
    assert "{'" not in figure.caption
    assert "Tokens counted per category: " + ", ".join(f"{c} {n:,}" for c, n in counts.items()) in figure.caption
    card = (MINI / "card.md").read_text()
    assert "{'" not in card and "Tokens per category: word 19,092, code 20,616" in card


def test_two_prompts_from_cached_runs_and_from_the_analysis_agree(routed):
    from viz import figures
    from viz.figures.moe import LoadDifferenceOptions

    loaded, result = routed
    options = LoadDifferenceOptions("The cat sat on 12 mats.", "def add(a, b):\n    return a + b", 64)
    analysed = figures.build("load_difference", moe.prompt_pair(loaded, result, options), options)
    pair = moe.PromptPair(*(moe.run(loaded, TextInput(t, 64)) for t in (options.prompt_a, options.prompt_b)))
    from_runs = figures.build("load_difference", pair, options)
    assert analysed.stem == from_runs.stem
    assert analysed.stem.endswith("_load-difference_the-cat-sat-on-12-ma_def-add-a-b-r")  # 20 characters each
    for name in ("load_a", "load_b", "difference"):
        np.testing.assert_allclose(analysed.arrays()[name], from_runs.arrays()[name])
    np.testing.assert_allclose(from_runs.arrays()["load_a"],
                               stats.expert_load(pair.a.routing.top_experts, pair.a.routing.num_experts))
    assert not np.allclose(from_runs.arrays()["difference"], 0)  # code and prose are routed differently
    with pytest.raises(ValueError, match="empty"):
        moe.prompt_pair(loaded, result, LoadDifferenceOptions("", "x", 64))
    with pytest.raises(ValueError, match="same model"):
        moe.PromptPair(pair.a, dataclasses.replace(pair.b, model=dataclasses.replace(pair.b.model, key="other")))


def test_a_bad_layer_or_token_is_a_message(routed):
    from viz import figures
    from viz.figures.moe import (
        CoactivationOptions,
        GateOptions,
        RoutedOptions,
        StripOptions,
    )

    _, result = routed
    with pytest.raises(ValueError, match=r"MoE layer 2 does not exist.*0\.\.1"):
        figures.build("routed_text", result, RoutedOptions(layer=2))
    with pytest.raises(ValueError, match="MoE layer -1 does not exist"):
        figures.build("coactivation", result, CoactivationOptions(layer=-1))
    with pytest.raises(ValueError, match="token 999 does not exist"):
        figures.build("gate", result, GateOptions(token=999))
    with pytest.raises(ValueError, match="token -1 does not exist"):
        figures.build("layer_strip", result, StripOptions(token=-1))


def test_a_model_without_experts_is_refused_when_it_loads(tiny_folders, monkeypatch):
    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(tiny_folders["llama"].parent))
    with pytest.raises(ValueError, match="no mixture-of-experts layers"):
        families.load(families.custom("moe", str(tiny_folders["llama"])))


# --- the command line (the page's offline mini, as a user runs it) ---------------------------------------------------

def test_cli_default_view_writes_the_minis_routing(tmp_path, capsys):
    from app import cli
    assert cli.main(["--page", "moe", "--out", str(tmp_path), "--format", "png,csv,json,npz"]) == 0
    written = sorted(p.name for p in tmp_path.iterdir())
    assert [p.rsplit(".", 1)[1] for p in written] == ["csv", "json", "npz", "png"]
    assert written[0].startswith("mini-moe-8-experts-top-2_anna-found-the-old-map-in-the-kitchen")
    assert "_routing_block-0" in written[0]
    saved = np.load(tmp_path / written[2])
    loaded = families.load(families.default_spec("moe"))
    routing = moe.run(loaded, TextInput(moe.SAMPLES["Mixed"])).routing  # the page's opening text (catalog)
    np.testing.assert_allclose(saved["probs"], routing.probs[0], atol=1e-6)
    np.testing.assert_array_equal(saved["top_experts"], routing.top_experts[0])
    assert json.loads((tmp_path / written[1]).read_text())["text"] == moe.SAMPLES["Mixed"]

    assert cli.main(["--page", "moe", "--view", "gate", "--layer", "9", "--out", str(tmp_path)]) == 2
    assert "MoE layer 9 does not exist" in capsys.readouterr().err
    assert cli.main(["--page", "moe", "--text", "  ", "--out", str(tmp_path)]) == 2
    assert "The text is empty" in capsys.readouterr().err


# --- the page (AppTest, loader patched to tiny models) -------------------------------------------------------------

@pytest.fixture
def moe_page(saved_mixtral, monkeypatch):
    """The MoE page with every registered offline MoE model replaced by the tiny Mixtral (hub ids and typed folders
    load for real)."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from models.core.specs import ModelSpec

    real_load = families.load

    def fake_load(spec, device="cpu", dtype="float32", progress=lambda step, fraction: None):
        if spec.family != "moe" or spec.source == "hub" or spec not in families.specs("moe"):
            return real_load(spec, device, dtype, progress)
        tiny = ModelSpec("moe", spec.key, "mini", str(saved_mixtral), spec.licence, spec.trained_on)
        return moe.load(tiny, device, dtype, progress)

    monkeypatch.setattr(families, "load", fake_load)
    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(saved_mixtral.parent))
    st.cache_resource.clear()
    yield AppTest.from_file(str(ROOT / "app" / "views" / "moe.py"), default_timeout=120)
    st.cache_resource.clear()


def _charts(at) -> int:
    return len(at.get("vega_lite_chart")) + len(at.get("image"))


def chart_frame(at, *columns: str, where=None):
    """The data of the first chart on the page that has ``columns`` (and whose frame passes ``where``), read back
    from what the page sent to the browser."""
    import pyarrow as pa

    for chart in at.get("vega_lite_chart"):
        for dataset in chart.proto.datasets:
            frame = pa.ipc.open_stream(dataset.data.data).read_all().to_pandas()
            if set(columns) <= set(frame.columns) and (where is None or where(frame)):
                return frame
    raise AssertionError(f"no chart with {columns}")


def test_page_routes_the_default_text(moe_page):
    at = moe_page.run()
    assert not at.exception, at.exception
    assert _charts(at) >= 3
    assert any("dispatch: top-2 of softmax, renormalised" in c.value for c in at.caption)
    assert {m.label for m in at.metric} >= {"Mean load CV", "Mean Switch aux loss", "Mean router entropy"}
    loaded = families.load(families.default_spec("moe"))  # the tiny model the page was given
    routing = moe.run(loaded, TextInput(at.text_area(key="moe_text").value, 512)).routing
    assert list(chart_frame(at, "expert", "selected")["expert"]) == [f"E{e}" for e in routing.top1[0]]
    at.selectbox(key="moe_layer").set_value("block 1").run()
    assert not at.exception, at.exception
    assert list(chart_frame(at, "expert", "selected")["expert"]) == [f"E{e}" for e in routing.top1[1]]
    at.slider(key="moe_token").set_value(3).run()
    assert not at.exception, at.exception
    assert any(t.value.startswith(f"token 3: {routing.tokens[3]}") for t in at.text)
    selected = chart_frame(at, "expert", "selected", where=lambda f: f["selected"].any())
    assert list(selected["position"][selected["selected"]]) == [3]


def test_page_opens_on_words_code_and_numbers_that_the_mini_routes_apart(fresh_caches):
    """The default view teaches what an MoE router does: the real mini-moe on text in its own vocabulary that holds
    words, code and numbers, in the first tab (each token coloured by its expert) at the layer its card measured as
    most specialised; there, token category and expert share more information than shuffled routing ever gives.
    (The old default, plain prose, had no code and barely beat shuffled routing: 0.21 against 0.17 bits.)"""
    from streamlit.testing.v1 import AppTest

    from app import catalog

    at = AppTest.from_file(str(ROOT / "app" / "views" / "moe.py"), default_timeout=120).run()
    assert not at.exception, at.exception
    text = at.text_area(key="moe_text").value
    assert text == moe.SAMPLES["Mixed"] == list(moe.SAMPLES.values())[0] == catalog.get("moe").sample
    assert at.sidebar.selectbox(key="model_moe").value.startswith("mini-moe")
    assert at.tabs[0].label == "Tokens by expert"
    measured = json.loads((MINI / "metrics.json").read_text())["per_layer"]["mi_category_bits"]
    assert at.selectbox(key="moe_layer").value == f"block {int(np.argmax(measured))}"
    routing = moe.run(families.load(families.default_spec("moe")), TextInput(text, 512)).routing
    drawn = chart_frame(at, "expert", "selected")
    assert list(drawn["expert"]) == [f"E{e}" for e in routing.top1[0]]  # the coloured text is the mini's routing
    counts = {c: routing.categories.count(c) for c in ("word", "code", "number")}
    assert min(counts.values()) >= 10, counts
    found = stats.specialisation(routing.top_experts, list(routing.categories))
    assert found.observed[0] > 2 * found.shuffled_p95[0], (found.observed, found.shuffled_p95)


def test_page_draws_the_models_routing_for_the_picked_layer_and_token(moe_page):
    """The coloured text and the gate bars the page sends to the browser are the model's routing of the page's text,
    for the layer and token picked."""
    at = moe_page.run()
    loaded = families.load(families.default_spec("moe"))  # the same tiny model the page was given
    routing = moe.run(loaded, TextInput(at.text_area(key="moe_text").value, 512)).routing
    at.selectbox(key="moe_layer").set_value("block 1").run()
    at.slider(key="moe_token").set_value(5).run()
    assert not at.exception, at.exception
    text = chart_frame(at, "expert", "selected", where=lambda f: f["selected"].any())
    assert list(text["expert"]) == [f"E{e}" for e in routing.top1[1]]
    assert list(text["position"][text["selected"]]) == [5]
    np.testing.assert_allclose(text["weight"], routing.top_weights[1, :, 0], atol=1e-6)
    bars = chart_frame(at, "probability", "dispatch weight")
    np.testing.assert_allclose(bars["probability"], routing.probs[1, 5], atol=1e-6)
    assert any("token 5: " in t.value for t in at.text)


@pytest.mark.parametrize("text", ["<script>alert(1)</script>", "🙂\u202eevil\u202c", "word " * 700, "a\x00b\u200bc"])
def test_page_survives_odd_and_long_text(moe_page, text):
    at = moe_page.run()
    at.text_area(key="moe_text").set_value(text).run()
    assert not at.exception, at.exception
    assert _charts(at) >= 3
    if len(text) > 1000:
        assert any("only the first 512" in w.value for w in at.warning)


def test_page_empty_text_and_hub_model_offline(moe_page):
    at = moe_page.run()
    at.text_area(key="moe_text").set_value("  ").run()
    assert not at.exception and any("Type some text" in i.value for i in at.info)
    at.sidebar.selectbox(key="model_moe").set_value("switch-base-8 (hub download)").run()
    assert not at.exception, at.exception
    assert any("downloads from the Hugging Face hub" in i.value for i in at.info)
    assert at.error and "Could not load" in at.error[0].value  # offline: a message, not a traceback


def test_page_empty_prompt_b_is_a_hint_and_the_rest_still_draws(moe_page):
    at = moe_page.run()
    at.text_area(key="moe_prompt_b").set_value(" ").run()
    assert not at.exception, at.exception
    assert any("Type two prompts" in i.value for i in at.info)
    assert not any("A minus B" in m.value for m in at.markdown)
    assert {m.label for m in at.metric} >= {"Mean load CV"}


def test_page_on_a_typed_switch_folder(moe_page, tmp_path, tiny_tokenizer, monkeypatch):
    folder = tmp_path / "my-switch"
    model = tiny_switch(capacity=64)
    model.resize_token_embeddings(len(tiny_tokenizer))
    model.save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(tmp_path))
    at = moe_page.run()
    at.sidebar.selectbox(key="model_moe").set_value("Other: a hub id or a local folder…").run()
    at.sidebar.text_input(key="custom_model_moe").set_value(str(folder)).run()
    assert not at.exception, at.exception
    assert any("encoder" in w.value for w in at.warning)
    assert any("top-1 of softmax" in c.value for c in at.caption)


def test_trainer_balance_loss_is_per_layer():
    from models.minis.moe.train import balance_loss

    eye = torch.eye(4) * 20.0  # token t is sure of expert t % 4
    balanced = (eye.repeat(4, 1),)
    assert float(balance_loss(balanced, top_k=1)) == pytest.approx(1.0, abs=1e-3)
    # layer 0 sends everything to experts 0-1, layer 1 to experts 2-3: pooled over layers that looks balanced
    # (transformers' load_balancing_loss_func pools), per layer it is twice the balanced value
    skewed = (eye[[0, 1]].repeat(8, 1), eye[[2, 3]].repeat(8, 1))
    assert float(balance_loss(skewed, top_k=1)) == pytest.approx(2.0, abs=1e-3)
    pooled = transformers.models.mixtral.modeling_mixtral.load_balancing_loss_func(skewed, 4, top_k=1)
    assert float(pooled) == pytest.approx(1.0, abs=1e-3)


def test_deepseek_v4_runs_under_capture_as_under_its_own_eager_attention(tmp_path, monkeypatch):
    """DeepSeek-V4 appends its compressor's additive block bias to the mask it is handed: under SDPA's boolean
    masks that bias flipped (the compressed slots a query may see were hidden, the others shown), and the page's
    routing came from another forward than the model's. Capture hands it eager's additive masks."""
    from tests import matrix_moe

    folder = tmp_path / "deepseek_v4"
    matrix_moe.build("deepseek_v4", folder)
    ids = torch.tensor([[101, 1996, 4937, 2938, 2006, 1996, 13523, 102, 2000, 2001]])
    eager = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    loaded = _load_local(folder, monkeypatch)
    with torch.inference_mode():
        expected = eager(input_ids=ids, use_cache=False).logits
        drawn = loaded.model(input_ids=ids, use_cache=False).logits
    torch.testing.assert_close(drawn, expected, atol=1e-5, rtol=1e-5)
