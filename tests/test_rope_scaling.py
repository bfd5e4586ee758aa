"""RoPE scaling: PI, NTK-aware, dynamic NTK and YaRN frequencies against hand-computed values and against
transformers' own RoPE initialisation (``ROPE_INIT_FUNCTIONS``) for each ``rope_type``; the score and ALiBi
curves; the views and the page's tab."""
from __future__ import annotations

import math

import numpy as np
import pytest

from models.lessons.positional import scaling
from viz.figures import build
from viz.figures.rope_scaling import ScalingOptions


def test_hand_computed_frequencies_for_d_8():
    # d = 8, b = 10,000: θ = 1, 0.1, 0.01, 0.001
    np.testing.assert_allclose(scaling.pi_frequencies(8, 1e4, 4), [0.25, 0.025, 0.0025, 0.00025])
    base = scaling.ntk_base(8, 1e4, 4)
    assert base == pytest.approx(1e4 * 4 ** (8 / 6))
    ntk = scaling.ntk_frequencies(8, 1e4, 4)
    assert ntk[0] == 1.0 and ntk[-1] == pytest.approx(0.001 / 4)  # fastest untouched, slowest exactly / s
    np.testing.assert_allclose(scaling.wavelengths([1.0, 0.5]), [2 * math.pi, 4 * math.pi])
    assert np.array_equal(scaling.dynamic_ntk_frequencies(8, 1e4, 2, 100, 1000), [1, 0.1, 0.01, 0.001])


def test_hand_computed_yarn():
    # d = 64, b = 100,000, L₀ = 8,192: pair i turns L₀·b^(−2i/64)/2π times; 32 turns at i ≈ 10.9, 1 turn at i ≈ 19.9
    ramp, low, high = scaling.yarn_ramp(64, 1e5, 8192)
    assert (low, high) == (10, 20)
    theta = 1e5 ** (-np.arange(0, 64, 2) / 64)
    frequencies, attention_factor = scaling.yarn_frequencies(64, 1e5, 4, 8192)
    np.testing.assert_allclose(frequencies[:11], theta[:11])  # more than 32 turns: kept
    np.testing.assert_allclose(frequencies[20:], theta[20:] / 4)  # under one turn: interpolated
    assert frequencies[15] == pytest.approx(0.5 * theta[15] + 0.5 * theta[15] / 4)  # halfway up the ramp
    assert attention_factor == pytest.approx(0.1 * math.log(4) + 1)


def _config(parameters: dict, trained: int = 8192):
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=576, num_attention_heads=9, head_dim=64, max_position_embeddings=trained,
                       rope_parameters=parameters)


@pytest.mark.parametrize("factor", [2.0, 4.0, 8.0])
def test_against_transformers_rope_init_functions(factor):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    d, b, trained = 64, 1e5, 8192

    def theirs(parameters, **kwargs):
        inv_freq, attention = ROPE_INIT_FUNCTIONS[parameters["rope_type"]](_config(parameters), None, **kwargs)
        return inv_freq.double().numpy(), attention

    frequencies, _ = theirs({"rope_type": "linear", "rope_theta": b, "factor": factor})
    np.testing.assert_allclose(scaling.pi_frequencies(d, b, factor), frequencies, rtol=1e-6)
    # static NTK-aware at s = dynamic NTK with factor 1 at length s·L₀
    frequencies, _ = theirs({"rope_type": "dynamic", "rope_theta": b, "factor": 1.0}, seq_len=int(factor * trained))
    np.testing.assert_allclose(scaling.ntk_frequencies(d, b, factor), frequencies, rtol=1e-6)
    for length in (4096, 12000, 40000):
        frequencies, _ = theirs({"rope_type": "dynamic", "rope_theta": b, "factor": factor}, seq_len=length)
        np.testing.assert_allclose(scaling.dynamic_ntk_frequencies(d, b, factor, length, trained), frequencies,
                                   rtol=1e-6)
    frequencies, attention = theirs({"rope_type": "yarn", "rope_theta": b, "factor": factor,
                                     "original_max_position_embeddings": trained})
    ours, ours_attention = scaling.yarn_frequencies(d, b, factor, trained)
    np.testing.assert_allclose(ours, frequencies, rtol=1e-6)
    assert ours_attention == pytest.approx(attention)
    default, _ = ROPE_INIT_FUNCTIONS["linear"](_config({"rope_type": "linear", "rope_theta": b, "factor": 1.0}), None)
    np.testing.assert_allclose(scaling.scaled_frequencies("none", d, b, factor, trained)[0], default.double().numpy(),
                               rtol=1e-6)


def test_scores_and_alibi():
    theta = scaling.scaled_frequencies("none", 8, 1e4, 2, 1024)[0]
    scores = scaling.score_by_distance(theta, np.array([0, 1, 10]))
    assert scores[0] == 1.0 and scores[1] == pytest.approx(np.cos(theta).mean())
    assert scaling.score_by_distance(theta, np.array([0]), 1.3)[0] == pytest.approx(1.3)
    bias = scaling.alibi_bias_by_distance(8, np.array([0, 1, 1000]))
    np.testing.assert_allclose(bias[0], [0, -0.5, -500])  # head 1's slope 2^(−8/8) = 1/2
    with pytest.raises(ValueError, match="at least 1"):
        scaling.pi_frequencies(8, 1e4, 0.5)
    with pytest.raises(ValueError, match="unknown RoPE scaling"):
        scaling.scaled_frequencies("xpos", 8, 1e4, 2, 1024)


def test_views_hold_the_formulas_numbers_and_the_measurement():
    figure = build("rope_scaling", None, ScalingOptions(head_dim=32, base=1e4, trained=2048, factor=2))
    arrays = figure.arrays()
    np.testing.assert_allclose(arrays["theta_pi"], scaling.pi_frequencies(32, 1e4, 2))
    np.testing.assert_allclose(arrays["score_yarn"], scaling.score_by_distance(
        arrays["theta_yarn"], arrays["distances"], (0.1 * math.log(2) + 1) ** 2))
    measured = build("rope_perplexity", None)
    table = measured.table()
    assert set(table["scaling"]) == {"default", "linear", "dynamic", "yarn"}
    assert (table["prefix_perplexity"] > 1).all() and (table["prefix_perplexity"] < 1000).all()


def test_positional_page_beyond_tab(offered, fresh_caches):
    from streamlit.testing.v1 import AppTest

    from tests.conftest import ROOT, check_files

    at = AppTest.from_file(str(ROOT / "app" / "views" / "positional.py"), default_timeout=240)
    at.query_params.update({"pos_view": "Beyond the training length", "ext_factor": "2.0", "ext_d": "128"})
    at.run()
    assert not at.exception, at.exception
    assert "factor-2" in offered["rope_scaling"].stem and "d-128" in offered["rope_scaling"].stem
    check_files(offered["rope_scaling"])
    check_files(offered["rope_perplexity"])
