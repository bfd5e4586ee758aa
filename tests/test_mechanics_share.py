"""Shareable links and downloads of the mechanics page.

A URL's values land in the widgets, a changed widget is written back to the URL, and every download the page offers
makes a valid file holding what its name says (tests/conftest.py: ``offered``, ``check_files``).
"""
from __future__ import annotations

import json

import numpy as np

from models.lessons import cost, mechanics
from tests.conftest import ROOT, check_files
from tests.conftest import url_param as _param
from viz import export


def _mechanics_page(monkeypatch):
    from streamlit.testing.v1 import AppTest

    published = cost.published_kv_specs()  # the GGUF header read is tested in test_mechanics.py; keep this fast
    monkeypatch.setattr(cost, "app_model_kv_specs", lambda: cost.PresetReport(published[:1], ["x: skipped"]))
    return AppTest.from_file(str(ROOT / "app" / "views" / "mechanics.py"), default_timeout=120)


def test_mechanics_url_round_trip_and_downloads(monkeypatch, offered, fresh_caches):
    at = _mechanics_page(monkeypatch)
    at.query_params.update({"mechanics_text": "Attention is all you need.", "mech_heads": "4", "mech_dk": "8",
                            "mech_scaled": "False", "mech_mask": "sliding_window", "mech_window": "2",
                            "mech_head": "3", "mech_step": "99", "cost_n": "4096", "mech_view": "② Masks",
                            "kv_tokens": "1024"})
    at.run()
    assert not at.exception, at.exception
    assert at.text_area(key="mechanics_text").value == "Attention is all you need."
    assert at.select_slider(key="mech_heads").value == 4 and at.toggle(key="mech_scaled").value is False
    assert at.radio(key="mech_mask").value == "sliding_window" and at.slider(key="mech_window").value == 2
    assert at.radio(key="mech_head").value == 3 and at.number_input(key="cost_n").value == 4096
    assert _param(at, "mech_view") == "② Masks"
    at.radio(key="mech_mode").set_value("Cross-attention").run()
    assert _param(at, "mech_mode") == "Cross-attention" and _param(at, "mech_window") == "2"
    assert {"mech_steps", "mech_multihead", "mech_masks", "mech_zoo", "cost_memory", "cost_kv"} <= set(offered)

    masks = offered["mech_masks"]  # the link's mask, window and head, in the name and in the numbers
    assert masks.stem.startswith("mask_sliding-window_window-2_causal-true_head-3")
    tokens = masks.payload()["tokens"]
    config = mechanics.LayerConfig(8, 4, 8, False, 0)
    trace = mechanics.sentence_layer("Attention is all you need.", config, mask="sliding_window", window=2)
    np.testing.assert_array_equal(masks.arrays()["allowed"],
                                  mechanics.build_mask("sliding_window", len(tokens), window=2, causal=True))
    np.testing.assert_allclose(masks.table().to_numpy(), masks.arrays()["weights"], atol=1e-7)
    np.testing.assert_array_equal(masks.arrays()["weights"], trace.weights[3])
    assert json.loads(export.json_bytes(masks.payload()))["masked_scores"][0][-1] is None  # −∞ became null

    steps = offered["mech_steps"]  # cross-attention now: the other sentence's keys, no mask
    assert steps.stem.startswith("attention-layer_d-8_h-4_dk-8_unscaled_seed-0_cross_") and "_head-3_" in steps.stem
    assert steps.payload()["key_tokens"] == mechanics.tokenize("A tired dog stays at home.")[0]
    cross = {step.key: step for step in mechanics.sentence_layer(
        "Attention is all you need.", config, other="A tired dog stays at home.").steps()}
    (shown, value), = steps.arrays().items()  # one step: the one the name says
    assert f"_{export.file_stem(shown)}_head-3_" in steps.stem
    np.testing.assert_array_equal(value, cross[shown].value[3] if cross[shown].per_head else cross[shown].value)

    memory = offered["cost_memory"]
    assert memory.stem == "attention-memory_h-12_l-12_float32_b-1"
    kv = offered["cost_kv"]
    assert kv.stem == "kv-cache_1024-tokens_float16"
    assert kv.table().to_dict("records") == cost.kv_table(
        [*cost.published_kv_specs()[:1], *cost.published_kv_specs()], 1024, "float16")
    for figure in offered.values():
        check_files(figure)
