"""The Swin page takes the Swins users bring (issue 36): timm Swin v2 (cosine attention, continuous position bias) and
transformers' Swin, Swin v2, Donut's and MaskFormer's Swins saved to a folder and typed into the page. Every
block's window maps equal an independent eager computation, and the structure the views draw (windows, shifts,
masks, bias tables, merges) is the model's own; what is no Swin is refused in words.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from models import families
from models.core import images, vision_checkpoints
from models.core.inputs import ImageInput
from models.families.swin import model as swin
from tests import matrix_vision, support_matrix

TOLERANCE = 1e-5


@pytest.fixture()
def model_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(tmp_path))
    support_matrix.quiet()
    return tmp_path


@pytest.fixture(scope="module")
def cat():
    return images.load_sample("cat")


def _page(folder, picture):
    loaded = families.load(families.custom("swin", str(folder)))
    return loaded, families.run(loaded, ImageInput(picture, "sample cat"))


def test_timm_swin_v2_windows_equal_its_cosine_attention_recomputed_by_hand(model_dir, cat):
    folder = model_dir / "swinv2"
    matrix_vision.build_timm("swin", "swinv2_tiny_window8_256", folder)
    loaded, result = _page(folder, cat)
    assert "Swin v2" in loaded.capture and result.structure.version == 2
    pixels = images.preprocess(cat, images.data_config(loaded.model)).tensor
    reference = matrix_vision.timm_reference(folder, pixels)
    assert len(reference) == len(result.windows.windows) == 4
    for captured, expected in zip(result.windows.windows, reference):
        np.testing.assert_allclose(captured, expected, atol=TOLERANCE, rtol=0)
    # the bias table drawn is the one its forward gathers: 16·sigmoid of the MLP over the window's offsets
    attention = loaded.model.layers[0].blocks[0].attn
    with torch.no_grad():
        table = 16 * torch.sigmoid(attention.cpb_mlp(attention.relative_coords_table).view(-1, attention.num_heads))
    np.testing.assert_allclose(result.structure.blocks[0].bias_table, table.numpy(), atol=1e-6)
    assert any(block.kind == "SW-MSA" for block in result.structure.blocks)
    dense = result.attention["self"].layer(1)  # the contract's map, rebuilt from the windows: rows sum to 1
    np.testing.assert_allclose(dense.sum(-1), 1.0, atol=1e-5)


def test_a_transformers_swin_is_captured_and_its_structure_is_the_models(model_dir, cat):
    folder = model_dir / "swin"
    matrix_vision.build_transformers("swin", "swin", folder)
    loaded, result = _page(folder, cat)
    assert loaded.capture.startswith("AttentionInterface 'capture'")
    pixels, crop, _ = vision_checkpoints.pixels_of(loaded.processor, cat.image, "cpu", torch.float32)
    np.testing.assert_array_equal(result.image.image, crop)
    reference = matrix_vision.transformers_reference(folder, loaded, {"pixel_values": pixels}, swin=True)
    assert len(reference) == len(result.windows.windows) == 4
    for captured, expected in zip(result.windows.windows, reference):
        np.testing.assert_allclose(captured, expected, atol=TOLERANCE, rtol=0)
    structure = result.structure
    assert [s.resolution for s in structure.stages] == [(16, 16), (8, 8)]
    assert [(b.window, b.shift) for b in structure.blocks] == [((4, 4), (0, 0)), ((4, 4), (2, 2))] * 2
    assert structure.stages[0].merge is None and structure.stages[1].merge == (64, 32)  # 4C → 2C, C = 16
    block = loaded.model.swin.encoder.layers[0].blocks[1]
    np.testing.assert_array_equal(structure.blocks[1].attn_mask,
                                  block.get_attn_mask(16, 16, torch.float32, "cpu").numpy())
    bias = block.attention.relative_position_bias
    np.testing.assert_array_equal(structure.blocks[1].bias_table, bias.relative_position_bias_table.detach().numpy())
    expected_bias = bias().detach()[0].numpy()  # (heads, N, N): what the block adds to its scores
    np.testing.assert_allclose(structure.blocks[1].bias(), expected_bias, atol=1e-6)
    assert result.predictions and result.predictions[0].token.startswith("LABEL_")


@pytest.mark.parametrize("model_type", ["swinv2", "maskformer-swin"])
def test_swins_that_compute_attention_their_own_way_are_drawn_by_their_eager_path(model_dir, cat, model_type):
    from models.core import capture

    folder = model_dir / model_type
    matrix_vision.build_transformers("swin", model_type, folder)
    loaded, result = _page(folder, cat)
    assert loaded.capture == capture.EAGER_PATH_DESCRIPTION
    assert any("computes attention its own way" in notice for notice in result.notices)
    pixels, _, _ = vision_checkpoints.pixels_of(loaded.processor, cat.image, "cpu", torch.float32)
    reference = matrix_vision.transformers_reference(folder, loaded, {"pixel_values": pixels}, swin=True)
    for captured, expected in zip(result.windows.windows, reference):
        np.testing.assert_allclose(captured, expected, atol=TOLERANCE, rtol=0)
    assert result.structure.version == (2 if model_type == "swinv2" else 1)


def test_what_is_no_swin_is_refused_in_words(model_dir, cat):
    folder = model_dir / "vit"
    matrix_vision.build_transformers("swin", "vit", folder)
    with pytest.raises(ValueError, match="model of type vit, not a Swin Transformer.*ViT page"):
        _page(folder, cat)
    folder = model_dir / "cr"
    matrix_vision.build_timm("swin", "swinv2_cr_tiny_ns_224", folder)
    with pytest.raises(ValueError, match="swinv2_cr"):
        _page(folder, cat)


def test_explanations_are_refused_in_words_where_the_adapter_does_not_fit(model_dir, cat):
    from models.families.swin import explain

    folder = model_dir / "swinv2"
    matrix_vision.build_timm("swin", "swinv2_tiny_window8_256", folder)
    loaded, result = _page(folder, cat)
    with pytest.raises(ValueError, match="post-norm"):
        explain.from_result(loaded, result, None)
    folder = model_dir / "hf"
    matrix_vision.build_transformers("swin", "swin", folder)
    loaded, result = _page(folder, cat)
    with pytest.raises(ValueError, match="swin model was loaded by transformers"):
        explain.from_result(loaded, result, None)
    assert swin.read_structure(loaded.model).version == 1


def test_the_page_draws_a_typed_transformers_swin(model_dir):
    """The Swin page with a transformers Swin v2 folder typed into its picker: every tab drawn, the eager path
    said, no exception."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from tests.conftest import ROOT

    folder = model_dir / "swinv2"
    matrix_vision.build_transformers("swin", "swinv2", folder)
    st.cache_resource.clear()
    at = AppTest.from_file(str(ROOT / "app" / "views" / "swin.py"), default_timeout=120).run()
    box = at.sidebar.selectbox(key="model_swin")
    box.set_value(box.options[-1]).run()
    at.sidebar.text_input(key="custom_model_swin").set_value(str(folder)).run()
    st.cache_resource.clear()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert any("computes attention its own way" in c.value for c in at.caption)
    assert any("Swin v2" in m.value for m in at.markdown)  # the bias view says where its table comes from
