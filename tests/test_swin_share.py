"""Shareable links and downloads of the Swin page.

A URL's values land in the widgets, a changed widget is written back to the URL, and every download the page offers
makes a valid file holding what its name says, with the model's own numbers (tests/conftest.py: ``offered``,
``check_files``).
"""
# ruff: noqa: F811  (fixtures imported from the family's test module are redefined as test arguments)
from __future__ import annotations

import io

import numpy as np
from PIL import Image

from models.core import images
from models.families.swin import geometry
from models.families.swin import model as swin
from tests.conftest import check_files
from tests.conftest import url_param as _param
from tests.test_swin import _swin_page, patched_swin, tiny_page_swin  # noqa: F401  (a tiny random Swin, not the mini)


def _captured(sample: str) -> list[np.ndarray]:
    """Per block ``(nW, heads, N, N)``: the page's tiny Swin run on ``sample`` outside the app."""
    model = tiny_page_swin()
    pixels = images.preprocess(images.load_sample(sample).image, images.data_config(model)).tensor
    return swin.capture_windows(model, pixels)[1]


def test_swin_url_round_trip_and_downloads(patched_swin, offered):
    at = _swin_page()
    at.query_params.update({"swin_sample": "coffee", "swin_stage": "1", "swin_head": "head 3", "swin_row": "2",
                            "swin_col": "99", "swin_attn_block": "3", "swin_view": "Window attention"})
    at.run()
    assert not at.exception, at.exception
    assert at.selectbox(key="swin_stage").value == 1 and at.selectbox(key="swin_head_1").value == 3
    assert at.slider(key="swin_row_1").value == 2 and at.slider(key="swin_col_1").value != 99  # out of range: default
    assert at.radio(key="swin_attn_block_1").value == 3
    assert _param(at, "swin_view") == "Window attention" and _param(at, "swin_sample") == "coffee"
    assert offered["swin_attn"].stem.startswith("mini-swin-shapes_sample-coffee_stage-2-block-2-sw-msa_head-3_window-")
    at.slider(key="swin_col_1").set_value(1).run()
    assert _param(at, "swin_col") == "1" and _param(at, "swin_row") == "2"
    assert set(offered) == {"swin_shift", "swin_mask", "swin_bias", "swin_attn", "swin_cost"}
    for figure in offered.values():
        check_files(figure)

    # "window N" holds window N of block 3 (stage 2 · block 2), head 3, as the model computed it
    model, captured = tiny_page_swin(), _captured("coffee")
    block = swin.read_structure(model).blocks[3]
    window, slot = geometry.window_of((2, 1), block)
    figure = offered["swin_attn"]
    assert figure.stem.endswith(f"_window-{window}") and figure.metadata["window"] == str(window)
    files = check_files(figure)
    saved = np.load(io.BytesIO(files["npz"]))
    assert set(saved.files) == {"weights", "allowed", *(f"meta_{k}" for k in figure.metadata)}
    np.testing.assert_allclose(saved["weights"], captured[3][window, 3], atol=1e-6)
    np.testing.assert_allclose(figure.table().to_numpy(), captured[3][window, 3], atol=1e-6)
    np.testing.assert_array_equal(saved["allowed"], block.attn_mask[window] == 0)
    assert figure.payload()["query_slot"] == slot and figure.payload()["patch"] == [2, 1]

    # the masks, the bias and the cost are the model's own buffers and the paper's formula
    masks = np.load(io.BytesIO(check_files(offered["swin_mask"])["npz"]))
    np.testing.assert_array_equal(masks["attn_mask"], model.layers[1].blocks[1].attn_mask.numpy())
    bias = np.load(io.BytesIO(check_files(offered["swin_bias"])["npz"]))
    attn = model.layers[1].blocks[1].attn
    np.testing.assert_array_equal(bias["bias"], attn._get_rel_pos_bias()[0, 3].detach().numpy())  # head 3, as named
    assert offered["swin_bias"].stem.endswith("relative-position-bias_head-3")
    table = attn.relative_position_bias_table.detach().numpy()
    np.testing.assert_array_equal(bias["relative_position_bias_table"], table)
    cost = offered["swin_cost"].table()
    assert cost["full (hw)²"].tolist() == [(16 * 16) ** 2, (8 * 8) ** 2, (4 * 4) ** 2]
    assert cost["windowed M²hw"].tolist() == [16 * 256, 16 * 64, 16 * 16]
    shift = np.load(io.BytesIO(check_files(offered["swin_shift"])["npz"]))
    np.testing.assert_array_equal(shift["regions"], geometry.region_ids((8, 8), (4, 4), (2, 2)))


def test_swin_link_with_a_head_or_block_of_another_stage_keeps_the_page(patched_swin, offered):
    """A hand-edited link (a head the stage lacks, a block of another stage) falls back to the defaults."""
    at = _swin_page()
    at.query_params.update({"swin_stage": "0", "swin_head": "head 7", "swin_attn_block": "5",
                            "swin_view": "Window attention"})
    at.run()
    assert not at.exception, at.exception
    assert at.selectbox(key="swin_head_0").value == "mean"
    assert at.radio(key="swin_attn_block_0").value == 1  # stage 1's shifted block
    assert "_stage-1-block-2-sw-msa_average-of-heads_window-" in offered["swin_attn"].stem


class _Upload:
    """What st.file_uploader returns, for a noisy 96 × 96 PNG (AppTest cannot upload files)."""
    file_id = "upload-1"

    def getvalue(self) -> bytes:
        buffer = io.BytesIO()
        Image.fromarray(np.random.default_rng(0).integers(0, 255, (96, 96, 3), dtype=np.uint8)).save(buffer, "PNG")
        return buffer.getvalue()


def test_swin_upload_is_never_in_the_link(patched_swin, offered, monkeypatch):
    import streamlit as st

    monkeypatch.setattr(st, "file_uploader", lambda *args, **kwargs: _Upload())
    at = _swin_page().run()
    at.radio(key="swin_source").set_value("Upload").run()
    assert not at.exception, at.exception
    assert _param(at, "swin_source") == "Upload"
    assert all(len(_param(at, name)) < 100 for name in at.query_params)  # names and settings, never pixels
    assert offered["swin_attn"].stem.startswith("mini-swin-shapes_upload_stage-1-")
