"""Pre-LN vs Post-LN: the per-layer gradient norms equal a direct autograd computation through an independent,
written-out forward pass; the two placements behave as Xiong et al. 2020 describe; the view and the page tab work."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from models.lessons import norm_placement as npl
from viz.figures import build
from viz.figures.norm_placement import NormOptions

SMALL = npl.StackConfig(layers=3, d_model=16, heads=2, d_ff=64, vocab=50, length=6, batch=2, seed=4)


def _layer_norm(x, weight, bias, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def _direct_loss(params: dict[str, torch.Tensor], tokens: torch.Tensor, config: npl.StackConfig, placement: str):
    """The stack written out with plain tensor operations (explicit softmax and causal mask, explicit LayerNorm and
    log-softmax), reading the weights by name."""
    d, heads = config.d_model, config.heads
    hs = d // heads
    x = params["embed.weight"][tokens[:, :-1]] * math.sqrt(d)  # (B, T, d)
    T = x.shape[1]
    hidden = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    for i in range(config.layers):
        p = {name[len(f"blocks.{i}."):]: value for name, value in params.items() if name.startswith(f"blocks.{i}.")}

        def attention(h):
            qkv = h @ p["qkv.weight"].T + p["qkv.bias"]
            q, k, v = (qkv[..., j * d:(j + 1) * d].reshape(h.shape[0], T, heads, hs).permute(0, 2, 1, 3)
                       for j in range(3))
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(hs)
            weights = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
            y = (weights @ v).permute(0, 2, 1, 3).reshape(h.shape[0], T, d)
            return y @ p["out.weight"].T + p["out.bias"]

        def ffn(h):
            return torch.clamp(h @ p["w1.weight"].T + p["w1.bias"], min=0) @ p["w2.weight"].T + p["w2.bias"]

        def norm(h, which):
            return _layer_norm(h, p[f"{which}.weight"], p[f"{which}.bias"])

        if placement == "post":
            x = norm(x + attention(x), "norm_attention")
            x = norm(x + ffn(x), "norm_ffn")
        else:
            x = x + attention(norm(x, "norm_attention"))
            x = x + ffn(norm(x, "norm_ffn"))
    if placement == "pre":
        x = _layer_norm(x, params["final_norm.weight"], params["final_norm.bias"])
    logits = x @ params["head.weight"].T + params["head.bias"]
    log_probs = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    return -log_probs.gather(-1, tokens[:, 1:, None]).mean()


@pytest.mark.parametrize("placement", ["post", "pre"])
def test_gradient_norms_equal_a_direct_autograd_computation(placement):
    ours = npl.gradient_norms(SMALL, placement)
    model = npl.Stack(SMALL, placement)
    params = {name: value.detach().clone().requires_grad_(True) for name, value in model.named_parameters()}
    tokens = npl.batch(SMALL)
    loss = _direct_loss(params, tokens, SMALL, placement)
    assert float(loss.detach()) == pytest.approx(float(ours["loss"][0]), rel=1e-10)
    names = [f"blocks.{i}.{w}.weight" for i in range(SMALL.layers) for w in ("qkv", "out", "w1", "w2")]
    grads = dict(zip(names, torch.autograd.grad(loss, [params[n] for n in names])))
    for i in range(SMALL.layers):
        g = {w: grads[f"blocks.{i}.{w}.weight"] for w in ("qkv", "out", "w1", "w2")}
        assert ours["ffn_w2"][i] == pytest.approx(float(g["w2"].norm()), rel=1e-9)
        assert ours["ffn_w1"][i] == pytest.approx(float(g["w1"].norm()), rel=1e-9)
        attention = math.sqrt(float(g["qkv"].norm() ** 2 + g["out"].norm() ** 2))
        assert ours["attention"][i] == pytest.approx(attention, rel=1e-9)
        assert ours["layer"][i] == pytest.approx(math.sqrt(sum(float(t.norm() ** 2) for t in g.values())), rel=1e-9)


def test_one_weight_by_finite_differences():
    """The gradient itself, not just autograd twice: one entry of the last FFN W₂ by central differences."""
    model = npl.Stack(SMALL, "post")
    tokens = npl.batch(SMALL)
    npl.language_model_loss(model, tokens).backward()
    weight = model.blocks[-1].w2.weight
    analytic = float(weight.grad[3, 5])
    with torch.no_grad():
        weight[3, 5] += 1e-6
        up = float(npl.language_model_loss(model, tokens))
        weight[3, 5] -= 2e-6
        down = float(npl.language_model_loss(model, tokens))
    assert analytic == pytest.approx((up - down) / 2e-6, rel=1e-5, abs=1e-9)


def test_post_ln_gradients_grow_to_the_top_and_pre_ln_shrink_with_depth():
    config = npl.StackConfig(layers=12, d_model=64, d_ff=256, batch=4, length=16)
    post, pre = (npl.averaged_gradient_norms(config, p, seeds=2)["ffn_w2"] for p in ("post", "pre"))
    assert post[-3:].mean() > post[:3].mean()  # Post-LN: larger towards the output
    assert pre[-3:].mean() < post[-3:].mean()
    depth = npl.last_layer_gradient_by_depth(config, depths=(2, 16))
    assert depth["pre"][1] < 0.7 * depth["pre"][0]  # Pre-LN: ~1/√L
    assert depth["post"][1] > 0.8 * depth["post"][0]  # Post-LN: does not shrink


def test_view_and_mistakes():
    options = NormOptions(layers=4, d_model=32, seeds=1)
    figure = build("norm_placement", npl.placement_gradients(None, None, options), options)
    arrays = figure.arrays()
    assert arrays["post_ffn_w2"].shape == (4,) and np.all(arrays["pre_layer"] > 0)
    with pytest.raises(ValueError, match="parameter group"):
        npl.placement_gradients(None, None, NormOptions(group="bias"))
    with pytest.raises(ValueError, match="1..48 layers"):
        npl.StackConfig(layers=0)
    with pytest.raises(ValueError, match="placement"):
        npl.Block(SMALL, "sandwich")


def test_mechanics_page_norm_tab(monkeypatch, offered, fresh_caches):
    from streamlit.testing.v1 import AppTest

    from models.lessons import cost
    from tests.conftest import ROOT, check_files

    published = cost.published_kv_specs()
    monkeypatch.setattr(cost, "app_model_kv_specs", lambda: cost.PresetReport(published[:1], []))
    at = AppTest.from_file(str(ROOT / "app" / "views" / "mechanics.py"), default_timeout=120)
    at.query_params.update({"mech_view": "⑤ Pre-LN vs Post-LN", "ln_layers": "4", "ln_d": "32", "ln_seeds": "1"})
    at.run()
    assert not at.exception, at.exception
    figure = offered["mech_norm"]
    assert "4-layers" in figure.stem and "d-32" in figure.stem
    check_files(figure)
    assert "mech_linear" not in offered  # a closed tab computes nothing
