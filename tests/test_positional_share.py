"""Shareable links and downloads of the positional-encodings page.

A URL's values land in the widgets, a changed widget is written back to the URL, and every download the page offers
makes a valid file holding what its name says (tests/conftest.py: ``offered``, ``check_files``).
"""
from __future__ import annotations

import io
import json

import numpy as np

from models.lessons import positional as pe
from tests.conftest import check_files, url_param
from tests.test_positional import positional_page, tiny_vit  # noqa: F401  (the page with tiny models)


def test_positional_url_round_trip_and_downloads(positional_page, offered):  # noqa: F811
    at = positional_page
    at.query_params.update({"sin_d": "64", "sin_length": "96", "rope_base": "500000.0", "alibi_causal": "False",
                            "alibi_heads": "99", "pos_view": "RoPE",  # 99 heads: outside the slider, ignored
                            "rope_span": "1024"})  # 3 × 2,049 chart rows: over Altair's 5,000-row guard
    at.run()
    assert not at.exception, at.exception
    assert at.select_slider(key="sin_d").value == 64 and at.slider(key="sin_length").value == 96
    assert at.number_input(key="rope_base").value == 500000.0
    assert at.toggle(key="alibi_causal").value is False and at.slider(key="alibi_heads").value == 8
    assert url_param(at, "pos_view") == "RoPE"
    at.slider(key="t5_length").set_value(200).run()
    assert url_param(at, "t5_length") == "200" and url_param(at, "sin_d") == "64"
    assert {"perm", "perm_gap", "sin", "sin2d", "learned_text_table", "learned_grid", "rope", "rope_decay", "alibi",
            "t5"} == set(offered)  # every figure shown offers its files (display.show)
    assert offered["sin"].stem == "sinusoidal_d-64_length-96_base-10000"
    assert "base-500000" in offered["rope"].stem and offered["t5"].stem.endswith("length-200")
    assert offered["alibi"].stem == "alibi_8-heads_length-16"  # not causal: the name says so by leaving it out
    files = {key: check_files(figure) for key, figure in offered.items()}
    # what the files hold is what their names say, computed independently of the page
    sin = np.load(io.BytesIO(files["sin"]["npz"]))
    np.testing.assert_allclose(sin["encoding"][:, 0], np.sin(np.arange(96)), atol=1e-6)
    np.testing.assert_allclose(sin["encoding"][:, 63], np.cos(np.arange(96) / 10000 ** (62 / 64)), atol=1e-6)
    assert str(sin["meta_d"]) == "64"
    rope = json.loads(files["rope"]["json"])
    assert rope["base"] == 500000.0 and len(rope["offsets"]) == 2 * 1024 + 1
    curves = np.array(list(rope["scores"].values()))
    np.testing.assert_allclose(curves, np.broadcast_to(curves[0], curves.shape), atol=1e-5)  # offset only
    alibi = json.loads(files["alibi"]["json"])
    np.testing.assert_allclose(alibi["slopes"], [2.0 ** -h for h in range(1, 9)], atol=1e-7)  # JSON: 7 decimals
    assert alibi["causal"] is False and alibi["bias"][0][3][5] == -0.5 * 2  # −m·|i − j|, both ways
    t5 = np.load(io.BytesIO(files["t5"]["npz"]))
    relative = np.arange(200)[None, :] - np.arange(200)[:, None]
    import torch
    from transformers.models.t5.modeling_t5 import T5Attention

    np.testing.assert_array_equal(t5["bidirectional"], T5Attention._relative_position_bucket(
        torch.from_numpy(relative), bidirectional=True, num_buckets=32, max_distance=128).numpy())
    grid = np.load(io.BytesIO(files["learned_grid"]["npz"]))
    np.testing.assert_allclose(grid["resized"], pe.interpolate_grid(grid["table"], (4, 4), (8, 8)), atol=1e-6)
    perm = json.loads(files["perm"]["json"])
    assert perm["setting"] == "no positions" and perm["sentence"].startswith("the dog bit the man")
    assert files["perm"]["csv"].decode().splitlines()[0].startswith(",0:the,1:dog,2:bit")
