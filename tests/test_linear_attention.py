"""Linear attention (Katharopoulos et al. 2020) equals its implicit matrix and its recurrent form; flow attention
(Wu et al. 2022) equals a direct, loop-by-loop implementation of the paper's equations; softmax equals SDPA; the
views draw the page's sentence and refuse a bad step."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from models.lessons import linear_attention as la
from viz.figures import build
from viz.figures.linear_attention import RecurrentOptions


def _qkv(n: int = 7, m: int | None = None, d: int = 5, seed: int = 0):
    rng = np.random.default_rng(seed)
    m = n if m is None else m
    return rng.standard_normal((n, d)), rng.standard_normal((m, d)), rng.standard_normal((m, d + 1))


def test_feature_map_is_elu_plus_one():
    x = torch.linspace(-5, 5, 101, dtype=torch.float64)
    assert np.allclose(la.elu_plus_one(x.numpy()), (F.elu(x) + 1).numpy(), atol=1e-15)


def test_softmax_attention_equals_sdpa():
    q, k, v = _qkv(6, 9)
    weights, out = la.softmax_attention(q, k, v)
    reference = F.scaled_dot_product_attention(*(torch.from_numpy(t)[None] for t in (q, k, v)))[0]
    assert np.allclose(out, reference.numpy(), atol=1e-12)
    assert np.allclose(weights.sum(axis=1), 1.0)


def test_linear_attention_in_linear_order_equals_its_implicit_matrix():
    q, k, v = _qkv(8, 11)
    matrix = la.linear_attention_matrix(q, k)
    assert np.allclose(matrix.sum(axis=1), 1.0) and (matrix > 0).all()
    assert np.allclose(la.linear_attention(q, k, v), matrix @ v, atol=1e-12)


def test_causal_linear_attention_equals_its_recurrent_form():
    q, k, v = _qkv(9)
    rnn = la.causal_linear_recurrent(q, k, v)
    # direct: for each i, the weighted mean of v_j (j ≤ i) with weights φ(q_i)·φ(k_j), φ from torch
    phi_q, phi_k = (F.elu(torch.from_numpy(t)) + 1 for t in (q, k))
    for i in range(len(q)):
        w = phi_k[: i + 1] @ phi_q[i]  # (i+1,)
        assert np.allclose(rnn.outputs[i], (w @ torch.from_numpy(v[: i + 1]) / w.sum()).numpy(), atol=1e-12)
        assert np.allclose(rnn.states[i], (phi_k[: i + 1].T @ torch.from_numpy(v[: i + 1])).numpy(), atol=1e-12)
    masked = la.linear_attention_matrix(q, k, causal=True)
    assert np.allclose(np.triu(masked, 1), 0) and np.allclose(masked @ v, rnn.outputs, atol=1e-12)
    # the last step of the causal form is the non-causal attention of the last query
    assert np.allclose(rnn.outputs[-1], la.linear_attention(q, k, v)[-1])


def _flow_by_the_paper(q, k, v):
    """Flowformer §3.2, eq. 5–9, one sum at a time over the explicit flow capacities F_ij = φ(q_i)·φ(k_j)."""
    sig = torch.sigmoid
    phi_q, phi_k = sig(torch.from_numpy(q)), sig(torch.from_numpy(k))
    n, m = len(q), len(k)
    capacity = [[float(phi_q[i] @ phi_k[j]) for j in range(m)] for i in range(n)]
    incoming = [sum(capacity[i][j] for j in range(m)) for i in range(n)]  # I_i
    outgoing = [sum(capacity[i][j] for i in range(n)) for j in range(m)]  # O_j
    conserved_in = [sum(capacity[i][j] / outgoing[j] for j in range(m)) for i in range(n)]  # Î_i
    conserved_out = [sum(capacity[i][j] / incoming[i] for i in range(n)) for j in range(m)]  # Ô_j
    competition = torch.softmax(torch.tensor(conserved_out, dtype=torch.float64), 0) * m
    allocation = sig(torch.tensor(conserved_in, dtype=torch.float64) * n / m)
    out = np.zeros((n, v.shape[1]))
    for i in range(n):
        for j in range(m):
            out[i] += capacity[i][j] / incoming[i] * float(competition[j]) * v[j]
        out[i] *= float(allocation[i])
    return np.array(incoming), np.array(outgoing), np.array(conserved_in), np.array(conserved_out), out


@pytest.mark.parametrize("n,m", [(7, 7), (5, 9)])
def test_flow_attention_equals_the_papers_equations(n, m):
    q, k, v = _qkv(n, m, seed=3)
    flow = la.flow_attention(q, k, v)
    incoming, outgoing, conserved_in, conserved_out, out = _flow_by_the_paper(q, k, v)
    for ours, theirs in ((flow.incoming, incoming), (flow.outgoing, outgoing),
                         (flow.conserved_incoming, conserved_in), (flow.conserved_outgoing, conserved_out),
                         (flow.output, out)):
        assert np.allclose(ours, theirs, atol=1e-12)
    assert np.isclose(flow.conserved_outgoing.sum(), n)  # every sink's inflow fixed to 1: n units leave the sources
    assert np.allclose(flow.matrix(q, k) @ v, flow.output, atol=1e-12)


def _drawn(name: str, options=None):
    """The view's analysis (the toy layer, in models/), then its builder: what the page and the CLI do."""
    from viz.figures import get

    view = get(name)
    options = options if options is not None else view.options()
    return build(name, view.analysis(None, None, options), options)


def test_views_draw_the_sentence_and_refuse_a_bad_step():
    figure = _drawn("linear_attention")
    arrays = figure.arrays()
    assert arrays["softmax_matrix"].shape == arrays["linear_matrix"].shape == arrays["flow_matrix"].shape
    assert np.allclose(arrays["linear_matrix"].sum(axis=1), 1.0)
    recurrent = _drawn("linear_recurrent", RecurrentOptions(step=2)).arrays()
    assert np.allclose(recurrent["outputs_recurrent"], recurrent["outputs_matrix"], atol=1e-12)
    with pytest.raises(ValueError, match="outside"):
        _drawn("linear_recurrent", RecurrentOptions(step=99))


def test_shipped_measurement_grows_like_n_squared_and_n():
    rows = la.measured_cost()["rows"]
    peak = {(r["method"], r["tokens"]): r["peak_bytes"] for r in rows}
    assert 3.5 < peak["softmax", 8192] / peak["softmax", 4096] < 4.5  # N²
    assert 1.7 < peak["linear", 8192] / peak["linear", 4096] < 2.3  # N
    assert peak["softmax", 8192] > 20 * peak["linear", 8192]


def test_mechanics_page_linear_tab_offers_the_figures_and_keeps_its_step_in_the_url(monkeypatch, offered,
                                                                                    fresh_caches):
    from streamlit.testing.v1 import AppTest

    from models.lessons import cost, mechanics
    from tests.conftest import ROOT, check_files, url_param

    published = cost.published_kv_specs()
    monkeypatch.setattr(cost, "app_model_kv_specs", lambda: cost.PresetReport(published[:1], []))
    at = AppTest.from_file(str(ROOT / "app" / "views" / "mechanics.py"), default_timeout=120)
    at.query_params.update({"mechanics_text": "Attention is all you need.", "mech_lin_step": "2", "mech_head": "1",
                            "mech_view": "④ Linear attention"})  # the lazy tab computes only when open
    at.run()
    assert not at.exception, at.exception
    assert at.slider(key="mech_lin_step").value == 2
    figure = offered["mech_linear_rnn"]
    assert "step-2" in figure.stem and "head-1" in figure.stem
    trace = mechanics.sentence_layer("Attention is all you need.", mechanics.LayerConfig())
    rnn = la.causal_linear_recurrent(trace.q[1], trace.k[1], trace.v[1])
    np.testing.assert_allclose(figure.arrays()["outputs_recurrent"], rnn.outputs)
    for key in ("mech_linear", "mech_linear_rnn", "mech_linear_cost"):
        check_files(offered[key])
    at.slider(key="mech_lin_step").set_value(0).run()
    assert url_param(at, "mech_lin_step") == "0"
