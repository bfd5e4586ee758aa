"""Swin internals: masks, windows, the roll and the bias equal independent constructions and the model's own tensors."""
import threading

import numpy as np
import pytest
import timm
import torch

from models import families
from models.core import capture_timm, loading
from models.core.inputs import ImageInput
from models.core.specs import ModelSpec
from models.families.swin import geometry
from models.families.swin import model as swin


def tiny_swin(seed: int = 0, **overrides):
    """16 × 16 tokens, M = 4: stage 1 has 4 × 4 windows, stage 2 (8 × 8 tokens) 2 × 2; both shift by 2."""
    torch.manual_seed(seed)
    args = dict(img_size=32, patch_size=2, window_size=4, embed_dim=16, depths=(2, 2), num_heads=(2, 4),
                num_classes=5)
    args.update(overrides)
    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, **args).eval()
    capture_timm.disable_fused_attention(model)
    return model


@pytest.fixture(scope="module")
def model():
    return tiny_swin()


@pytest.fixture(scope="module")
def captured(model):
    torch.manual_seed(1)
    pixels = torch.randn(1, 3, 32, 32)
    logits, windows = swin.capture_windows(model, pixels)
    return pixels, logits, windows


def original_window_mask(size, window, shift):
    """Independent construction: tokens may attend iff they lie in the same *displaced* window of the original map.

    Displaced windows start at −s, so original row r belongs to displaced window ⌊(r + s) / M⌋ … except that the
    roll makes rows [0, s) and [H − M + s, H) share a rolled window though they were not neighbours: numbering
    displaced windows without wrap-around, ⌊(r + M − s) / M⌋, keeps them apart, as the paper intends.
    """
    (height, width), (mh, mw), (sh, sw) = size, window, shift
    rows = (np.arange(height) + mh - sh) // mh
    cols = (np.arange(width) + mw - sw) // mw
    group = rows[:, None] * (width + 1) + cols[None, :]  # (H, W): displaced-window id in the original layout
    rolled = np.roll(group, (-sh, -sw), axis=(0, 1))
    ids = geometry.window_partition(rolled, window).reshape(-1, mh * mw)
    return np.where(ids[:, :, None] == ids[:, None, :], 0.0, -100.0).astype(np.float32)


# --- geometry ----------------------------------------------------------------------------------------------------

def test_partition_reverse_round_trip_and_timm_order():
    x = np.random.default_rng(0).normal(size=(12, 8, 3)).astype(np.float32)
    windows = geometry.window_partition(x, (4, 4))
    assert windows.shape == (6, 4, 4, 3)
    np.testing.assert_array_equal(windows[1], x[0:4, 4:8])  # row-major over the window grid
    np.testing.assert_array_equal(geometry.window_reverse(windows, (4, 4), 12, 8), x)
    from timm.models.swin_transformer import window_partition as timm_partition

    np.testing.assert_array_equal(timm_partition(torch.from_numpy(x)[None], (4, 4)).numpy(), windows)
    with pytest.raises(ValueError, match="pad it first"):
        geometry.window_partition(x, (5, 4))


def test_cyclic_shift_is_undone():
    x = np.arange(7 * 7).reshape(7, 7)
    rolled = geometry.cyclic_shift(x, (3, 3))
    assert rolled[0, 0] == x[3, 3]  # the token at (s, s) moves to the top-left corner
    np.testing.assert_array_equal(geometry.undo_cyclic_shift(rolled, (3, 3)), x)


def test_mask_equals_independent_construction_and_model_buffer(model):
    shifted = [b for b in model.modules() if isinstance(b, timm.models.swin_transformer.SwinTransformerBlock)
               and any(b.shift_size)]
    assert len(shifted) == 2
    for block in shifted:
        size, window, shift = tuple(block.input_resolution), tuple(block.window_size), tuple(block.shift_size)
        ours = geometry.shifted_window_mask(geometry.region_ids(size, window, shift), window)
        independent = original_window_mask(size, window, shift)
        np.testing.assert_array_equal(ours, independent)
        np.testing.assert_array_equal(ours, block.attn_mask.numpy())
    # the paper's 224-px case: 56 × 56 tokens, M = 7, s = 3 — against a freshly built swin_tiny's real buffer
    tiny224 = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, depths=(2, 2, 2, 2),
                                weight_init="skip")  # buffers are built either way; skipping weight init saves seconds
    block = tiny224.layers[0].blocks[1]
    ours = geometry.shifted_window_mask(geometry.region_ids((56, 56), (7, 7), (3, 3)), (7, 7))
    np.testing.assert_array_equal(ours, block.attn_mask.numpy())
    np.testing.assert_array_equal(ours, original_window_mask((56, 56), (7, 7), (3, 3)))


def test_four_window_types_differ():
    regions = geometry.region_ids((8, 8), (4, 4), (2, 2))
    mask = geometry.shifted_window_mask(regions, (4, 4))
    kinds = geometry.window_types((2, 2))
    assert kinds == {"interior": 0, "right edge": 1, "bottom edge": 2, "corner": 3}
    regions_per_window = [len(np.unique(w)) for w in geometry.window_partition(regions, (4, 4))]
    assert regions_per_window == [1, 2, 2, 4]
    assert (mask[0] == 0).all()  # interior: nothing masked
    blocked = [(mask[i] < 0).sum() for i in range(4)]
    assert 0 < blocked[1] == blocked[2] < blocked[3]  # edges block half-pairs, the corner most
    assert len({mask[i].tobytes() for i in range(4)}) == 4


def test_relative_position_index_and_bias_equal_model(model):
    attn = model.layers[0].blocks[0].attn
    index = geometry.relative_position_index((4, 4))
    np.testing.assert_array_equal(index, attn.relative_position_index.numpy())
    # s(Δx, Δy) = (Δx + M − 1)(2M − 1) + (Δy + M − 1): query (0, 0) vs key (3, 3) is Δ = (−3, −3) -> 0
    assert index[0, 15] == 0 and index[15, 0] == 48 and index[5, 5] == 3 * 7 + 3
    table = attn.relative_position_bias_table.detach().numpy()
    bias = geometry.relative_position_bias(table, index)
    np.testing.assert_allclose(bias, attn._get_rel_pos_bias()[0].detach().numpy(), atol=0)
    images = geometry.bias_table_images(table, (4, 4))
    assert images.shape == (2, 7, 7) and images[1, 3, 3] == table[24, 1]  # Δ = (0, 0) is the table's centre


# --- capture -----------------------------------------------------------------------------------------------------

def eager_window_attention(model, pixels):
    """softmax(q kᵀ/√d + B + mask) per block, by hand from each block's input with our own roll, partition, index
    and mask (no timm attention code, no hooks on softmax)."""
    inputs = []
    handles = [b.register_forward_pre_hook(lambda m, a: inputs.append(a[0].detach()))
               for layer in model.layers for b in layer.blocks]
    try:
        with torch.no_grad():
            model(pixels)
    finally:
        for h in handles:
            h.remove()
    maps = []
    blocks = [b for layer in model.layers for b in layer.blocks]
    for block, x in zip(blocks, inputs):
        window, shift = tuple(block.window_size), tuple(block.shift_size)
        h = block.norm1(x)[0].detach().numpy()  # (H, W, C)
        windows = geometry.window_partition(geometry.cyclic_shift(h, shift), window).reshape(-1, window[0] * window[1],
                                                                                     h.shape[-1])
        heads = block.attn.num_heads
        qkv = windows @ block.attn.qkv.weight.detach().numpy().T + block.attn.qkv.bias.detach().numpy()
        q, k, _ = np.split(qkv, 3, axis=-1)
        d = q.shape[-1] // heads
        q = q.reshape(*q.shape[:2], heads, d).transpose(0, 2, 1, 3)  # (nW, heads, N, d)
        k = k.reshape(*k.shape[:2], heads, d).transpose(0, 2, 1, 3)
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d)
        table = block.attn.relative_position_bias_table.detach().numpy()
        scores = scores + geometry.relative_position_bias(table, geometry.relative_position_index(window))[None]
        if any(shift):
            size = tuple(block.input_resolution)
            scores = scores + geometry.shifted_window_mask(geometry.region_ids(size, window, shift), window)[:, None]
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        maps.append(scores / scores.sum(-1, keepdims=True))
    return maps


def test_capture_equals_eager_reference(model, captured):
    pixels, logits, windows = captured
    reference = eager_window_attention(model, pixels)
    assert [w.shape for w in windows] == [(16, 2, 16, 16)] * 2 + [(4, 4, 16, 16)] * 2
    for got, expected in zip(windows, reference):
        np.testing.assert_allclose(got, expected, atol=1e-5)
    fused = tiny_swin()  # same seed, fused attention back on: same logits, so capture changed only the path
    for module in fused.modules():
        if hasattr(module, "fused_attn"):
            module.fused_attn = True
    with torch.no_grad():
        torch.testing.assert_close(fused(pixels), logits, atol=1e-5, rtol=1e-5)
    assert not any(m._forward_hooks for m in model.modules())  # hooks removed


def test_rows_sum_to_one_and_cross_region_weights_vanish(model, captured):
    structure = swin.read_structure(model)
    _, _, windows = captured
    for block, maps in zip(structure.blocks, windows):
        np.testing.assert_allclose(maps.sum(-1), 1.0, atol=1e-5)
        blocked = ~block.allowed()  # (nW, N, N)
        assert blocked.any() == (block.kind == "SW-MSA")
        assert np.abs(maps.transpose(1, 0, 2, 3)[:, blocked]).max(initial=0) < 1e-30


def test_reassembled_patch_attention_lands_on_the_right_pixels():
    size, window, shift = (8, 8), (4, 4), (2, 2)
    # synthetic attention: in every window, query i puts all weight on key (N − 1 − i) (point reflection in the window)
    n = 16
    reflect = np.zeros((4, n, n), dtype=np.float32)
    reflect[:, np.arange(n), n - 1 - np.arange(n)] = 1.0
    # query (2, 2) sits at rolled (0, 0): window 0 slot 0 -> key slot 15 = rolled (3, 3) -> original (5, 5)
    got = geometry.patch_attention_map(reflect, (2, 2), size, window, shift)
    assert got[5, 5] == 1.0 and got.sum() == 1.0
    # query (0, 0) is rolled to (6, 6): window 3 slot 10 -> key slot 5 = rolled (5, 5) -> original (7, 7)
    got = geometry.patch_attention_map(reflect, (0, 0), size, window, shift)
    assert got[7, 7] == 1.0
    # no shift: window of (0, 0) is window 0, key slot 15 = (3, 3)
    assert geometry.patch_attention_map(reflect, (0, 0), size, window, (0, 0))[3, 3] == 1.0
    with pytest.raises(ValueError, match="outside"):
        geometry.patch_attention_map(reflect, (8, 0), size, window, shift)


def test_shifted_block_reaches_across_the_old_window_border(model, captured):
    structure = swin.read_structure(model)
    windows = swin.WindowAttention(tuple(captured[2]), tuple(structure.blocks))
    attention = swin.SwinAttention(windows)
    # token (3, 3): in W-MSA its window is rows/cols 0..3; in SW-MSA its window is rows/cols 2..5 (displaced by 2)
    regular = windows.patch_map(0, 0, (3, 3))
    shifted = windows.patch_map(1, 0, (3, 3))
    assert regular[4:, :].sum() == 0 and regular[:, 4:].sum() == 0
    assert shifted[4:6, 4:6].sum() > 0.05 and shifted[:2].sum() < 1e-30 and shifted[6:].sum() < 1e-30
    # token (0, 0) in SW-MSA: the corner window, but only its own region [0, 2) × [0, 2) is visible
    corner = windows.patch_map(1, 1, (0, 0))
    assert abs(corner[:2, :2].sum() - 1.0) < 1e-5
    # the dense contract matrix agrees with the per-window maps, and with allowed()
    dense = attention.layer(1)
    np.testing.assert_allclose(dense[0, 3 * 16 + 3].reshape(16, 16), shifted, atol=0)
    assert not (dense[:, ~attention.allowed(1)] > 1e-30).any()
    np.testing.assert_allclose(dense.sum(-1), 1.0, atol=1e-5)


def test_capture_keeps_threads_apart(model):
    inputs = [torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(s)) for s in range(2)]
    alone = [swin.capture_windows(model, x)[1][1] for x in inputs]
    results = [None, None]

    def work(i):
        for _ in range(3):
            results[i] = swin.capture_windows(model, inputs[i])[1][1]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got, expected in zip(results, alone):
        np.testing.assert_array_equal(got, expected)


# --- structure, cost, loading ------------------------------------------------------------------------------------

def test_structure_of_swin_tiny_224():
    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, weight_init="skip")
    structure = swin.read_structure(model)
    assert [s.resolution for s in structure.stages] == [(56, 56), (28, 28), (14, 14), (7, 7)]
    assert [s.merge for s in structure.stages] == [None, (384, 192), (768, 384), (1536, 768)]  # 4C -> 2C
    assert [s.token_px for s in structure.stages] == [4, 8, 16, 32]
    kinds = [b.kind for b in structure.blocks]
    assert kinds[:2] == ["W-MSA", "SW-MSA"] and kinds[-2:] == ["W-MSA", "W-MSA"]  # 7 × 7 = one window: no shift
    cost = structure.costs()[0]
    assert cost.full_entries == 56 ** 4 == 9_834_496
    assert cost.window_entries == 49 * 56 * 56 and cost.saving == 64
    assert cost.full_flops == 4 * 3136 * 96 ** 2 + 2 * 3136 ** 2 * 96


def test_run_local_checkpoint_through_the_load_path(tmp_path, monkeypatch):
    model = tiny_swin(seed=3)
    model.pretrained_cfg = {**model.pretrained_cfg, "input_size": (3, 32, 32), "crop_pct": 1.0,
                            "interpolation": "bilinear", "hf_hub_id": None, "url": None}
    timm.models.save_for_hf(model, str(tmp_path / "tiny"), model_config={"label_names": list("abcde")},
                            model_args=dict(img_size=32, patch_size=2, window_size=4, embed_dim=16, depths=[2, 2],
                                            num_heads=[2, 4], num_classes=5), safe_serialization=True)
    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(tmp_path))
    loaded = swin.load(ModelSpec("swin", str(tmp_path / "tiny"), "local", str(tmp_path / "tiny"), "", "",
                                 library="timm"))
    from PIL import Image

    photo = Image.fromarray(np.random.default_rng(0).integers(0, 255, (50, 70, 3), dtype=np.uint8))
    result = swin.run(loaded, ImageInput(photo, "photo"))
    assert result.image.image.shape == (32, 32, 3) and result.image.patch_grid == (16, 16)
    assert [p.token for p in result.predictions][:1] and {p.token for p in result.predictions} <= set("abcde")
    assert result.label_source == "the checkpoint's label_names" and result.input_name == "photo"
    from models.core import images

    pixels = images.preprocess(photo, images.data_config(loaded.model)).tensor
    _, windows = swin.capture_windows(model, pixels)  # the in-memory model before saving
    np.testing.assert_allclose(result.windows.windows[1], windows[1], atol=1e-6)
    maps = result.maps("self")  # the contract: not uniform, heads and tokens per stage
    assert not maps.uniform and [maps.heads_in(b) for b in range(4)] == [2, 2, 4, 4]
    assert len(maps.tokens_in(2)[0]) == 8 * 8
    with pytest.raises(ValueError, match="outside the folders"):
        swin.load(ModelSpec("swin", "/etc", "local", "/etc", "", "", library="timm"))


def test_unknown_or_non_swin_names_give_actionable_errors():
    with pytest.raises(ValueError, match="not a timm Swin"):
        swin.load(ModelSpec("swin", "vit_base_patch16_224", "hub", "vit_base_patch16_224", "", ""))
    with pytest.raises(ValueError, match="not a timm Swin"):
        swin.load(ModelSpec("swin", "swin_tinyy", "hub", "swin_tinyy", "", ""))
    with pytest.raises(ValueError, match="not a Swin"):
        swin.read_structure(torch.nn.Linear(2, 2))


# --- pictures ----------------------------------------------------------------------------------------------------

def test_shift_steps_draw_the_model_geometry(model):
    from viz import swin_charts
    block = swin.read_structure(model).blocks[1]  # 16 × 16 tokens of 2 px, M = 4, s = 2
    crop = np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)
    pictures = {step: swin_charts.shift_step(crop, block, step, scale=3) for step in swin_charts.SHIFT_STEPS}
    assert all(pictures[s].size == (96, 96) for s in swin_charts.SHIFT_STEPS[:4])
    assert pictures["regrouped windows"].size[0] > 96  # exploded: gaps between the 4 × 4 windows
    # the rolled picture is the crop rolled by −s tokens = −4 px (checked away from drawn lines and tint)
    rolled = np.asarray(swin_charts._scaled(geometry.cyclic_shift(crop, (4, 4)), 3))
    plain = np.asarray(pictures["original layout"])
    assert (plain[1, 1] == np.asarray(swin_charts._scaled(crop, 3))[1, 1]).all()
    assert rolled[1, 1].tolist() == np.asarray(swin_charts._scaled(crop, 3))[13, 13].tolist()
    with pytest.raises(ValueError, match="does not shift"):
        swin_charts.shift_step(crop, swin.read_structure(model).blocks[0], "region ids", 3)


def test_patch_picture_lights_the_query_token_pixels(model):
    from viz import swin_charts
    block = swin.read_structure(model).blocks[1]
    crop = np.zeros((32, 32, 3), dtype=np.uint8)
    values = np.zeros((16, 16), dtype=np.float32)
    values[5, 9] = 1.0  # token (5, 9) = pixels rows 10–11, cols 18–19 at 2 px per token
    picture = np.asarray(swin_charts.patch_attention_picture(crop, values, block, (0, 0), scale=1, opacity=1.0))
    lit = picture.sum(-1) > 600  # inferno's top is near white; 0 is black; window lines and the query box are
    assert lit[10:12, 18:20].all() and lit.sum() == 4  # coloured (yellow, red, cyan: channel sums below 600)


# --- figures (viz/figures/swin.py) and the command line -------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_result(model):
    """The tiny Swin run through the family's ``run`` on a photo, with the pixels it saw."""
    from PIL import Image

    from models.core import images, loading

    photo = Image.fromarray(np.random.default_rng(2).integers(0, 255, (40, 52, 3), dtype=np.uint8))
    loaded = loading.LoadedModel(ModelSpec("swin", "tiny", "local", "tiny", "", "", library="timm"), model, None,
                                 "cpu", "float32", capture=swin.CAPTURE_DESCRIPTION)
    model.pretrained_cfg = {**model.pretrained_cfg, "input_size": (3, 32, 32), "crop_pct": 1.0,
                            "interpolation": "bilinear", "label_names": list("abcde")}
    pixels = images.preprocess(photo, images.data_config(model)).tensor
    return swin.run(loaded, ImageInput(photo, "photo")), pixels


def test_every_view_draws_the_models_numbers(model, tiny_result):
    """Every view the family declares builds with its defaults and writes valid files; the window maps in them are
    the eager reference's, the predictions the model's softmax."""
    from tests.conftest import check_files
    from viz import figures

    result, pixels = tiny_result
    built = {name: figures.build(name, result) for name in families.get("swin").views
             if figures.get(name).data != "analysis"}  # explanations: tests/test_faithfulness_swin.py
    for figure in built.values():
        assert "json" in check_files(figure)  # python -m app.cli --format png,json works for every view
    reference = eager_window_attention(model, pixels)[1].mean(axis=1)  # block 1 (SW-MSA), mean of heads
    block = result.structure.blocks[1]
    window, _ = geometry.window_of((7, 7), block)  # the default patch: left of and above the centre of 16 × 16
    np.testing.assert_allclose(built["window_attention"].arrays()["weights"], reference[window], atol=1e-5)
    assert built["window_attention"].stem == f"tiny_photo_stage-1-block-2-sw-msa_average-of-heads_window-{window}"
    np.testing.assert_allclose(built["block_windows"].arrays()["windows"], reference, atol=1e-5)
    patch = built["patch_attention"].arrays()["attention"]
    np.testing.assert_allclose(patch, geometry.patch_attention_map(reference, (7, 7), (16, 16), (4, 4), (2, 2)),
                               atol=1e-5)
    assert abs(patch.sum() - 1) < 1e-5
    probabilities = torch.softmax(model(pixels)[0], -1).detach().numpy()
    table = built["swin_predictions"].table()
    np.testing.assert_allclose(table["probability"], np.sort(probabilities)[::-1][:5], atol=1e-6)
    assert list(built["hierarchy"].table()["tokens"]) == ["16 × 16", "8 × 8"]
    np.testing.assert_array_equal(built["shifted_window_masks"].arrays()["attn_mask"],
                                  model.layers[0].blocks[1].attn_mask.numpy())


@pytest.mark.parametrize("name, options, message", [
    ("window_attention", dict(row=99), "outside stage 1"),
    ("window_attention", dict(head=5), "head 5 does not exist"),
    ("relative_position_bias", dict(stage=1, block=0), "not in stage 2"),
    ("relative_position_bias", dict(head=9), "head 9 does not exist"),
    ("cyclic_shift", dict(step="sideways"), "unknown step"),
    ("stage_windows", dict(stage=4), "stage 4 does not exist"),
    ("patch_merging", dict(stage=0), "no patch merging"),
])
def test_bad_view_options_are_messages(tiny_result, name, options, message):
    from viz import figures

    view = figures.get(name)
    with pytest.raises(ValueError, match=message):
        figures.build(name, tiny_result[0], view.options(**options))


def test_cli_writes_the_default_view_and_refuses_a_stage_without_shift(tmp_path, capsys):
    """``python -m app.cli --page swin`` on the shipped mini: the hierarchy's files; a bad option is one line."""
    import json

    from app import cli
    assert cli.main(["--page", "swin", "--out", str(tmp_path), "--format", "png,json"]) == 0
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ["mini-swin-shapes_sample-cat_stages.json", "mini-swin-shapes_sample-cat_stages.png"]
    stages = json.loads((tmp_path / written[0]).read_text())["stages"]
    mini = swin.read_structure(swin.load(families.default_spec("swin")).model)
    assert stages == json.loads(json.dumps(mini.stage_rows()))
    assert cli.main(["--page", "swin", "--view", "cyclic_shift", "--stage", "2", "--out", str(tmp_path)]) == 2
    assert "Stage 3 has no shifted block" in capsys.readouterr().err


# --- the page (AppTest, loader patched to a tiny Swin) -----------------------------------------------------------

def tiny_page_swin():
    """The tiny Swin the page gets in place of the mini: 32 px, 16 × 16 tokens, three stages (the last without a
    shift), five named classes."""
    model = tiny_swin(seed=5, depths=(2, 2, 2), num_heads=(2, 4, 8))  # stage 3: 4 × 4 tokens, no shift
    model.pretrained_cfg = {**model.pretrained_cfg, "input_size": (3, 32, 32), "crop_pct": 1.0,
                            "interpolation": "bilinear", "label_names": list("abcde")}
    return model


@pytest.fixture
def patched_swin(monkeypatch):
    """Every mini Swin the page loads is ``tiny_page_swin()``; typed names still go through the real checks."""
    import streamlit as st

    from models import families
    from models.core import loading

    real_load = families.load

    def fake_load(spec, device="cpu", dtype="float32", progress=lambda step, fraction: None):
        if spec.family != "swin" or spec.source != "mini":
            return real_load(spec, device, dtype, progress)
        return loading.LoadedModel(spec, tiny_page_swin(), None, device, dtype, capture=swin.CAPTURE_DESCRIPTION)

    monkeypatch.setattr(families, "load", fake_load)
    st.cache_resource.clear()
    yield fake_load
    st.cache_resource.clear()


def _swin_page():
    from streamlit.testing.v1 import AppTest

    from tests.conftest import ROOT

    return AppTest.from_file(str(ROOT / "app" / "views" / "swin.py"), default_timeout=120)


def _image_captions(at) -> list[str]:
    """Pictures' captions: display.show writes a figure's caption under it (st.caption), others on the image."""
    return [image.caption for element in at.get("image") for image in element.proto.imgs] + \
        [caption.value for caption in at.caption]


def _captions(at) -> str:
    return "\n".join(c.value for c in at.caption)


def test_page_opens_on_the_shifted_block_beside_the_regular_one(patched_swin):
    """The default view teaches Swin's idea: stage 1, the hierarchy first, and wherever a block is picked the shifted
    one (SW-MSA) preselected, its window attention beside the regular block's for a token next to a window border, so
    the shifted block's reach across the old border is in view."""
    at = _swin_page().run()
    assert not at.exception, at.exception
    assert [t.label for t in at.tabs][0] == "Hierarchy" and at.selectbox(key="swin_stage").value == 0
    assert at.radio(key="swin_attn_block_0").value == 1 and at.radio(key="swin_bias_block_0").value == 1
    captions = _image_captions(at)
    assert sum(c.startswith("stage ") and "tokens of" in c for c in captions) == 3  # every stage's windows
    assert "stage 1 · block 1 (W-MSA): where token (7, 7) attends (average of heads), roll undone" in captions
    assert "stage 1 · block 2 (SW-MSA): where token (7, 7) attends (average of heads), roll undone" in captions
    assert any(c.startswith("All 16 windows of stage 1 · block 2 (SW-MSA)") for c in captions)
    assert (7 + 1) % 4 == 0  # token 7 is the last row/column of its regular window: its neighbour is across a border


def test_page_renders_every_view(patched_swin, offered):
    at = _swin_page().run()
    assert not at.exception, at.exception
    assert len(at.get("image")) >= 6 and len(at.get("vega_lite_chart")) >= 8
    assert any("identical" in c.value for c in at.caption)  # the buffer equals the region-id construction
    before = _captions(at)
    at.select_slider(key="swin_shift_step").set_value("regrouped windows").run()  # the others: test_shift_steps_draw
    assert _captions(at) != before and not at.exception
    at.selectbox(key="swin_head_0").set_value(1).run()
    assert "stage 1 · block 2 (SW-MSA): where token (7, 7) attends (head 1), roll undone" in _image_captions(at)
    at.radio(key="swin_attn_block_0").set_value(0).run()  # stage 1 · block 1 (W-MSA)
    assert any(c.startswith("All 16 windows of stage 1 · block 1 (W-MSA)") for c in _image_captions(at))
    at.slider(key="swin_row_0").set_value(0).run()
    assert "stage 1 · block 1 (W-MSA): where token (0, 7) attends (head 1), roll undone" in _image_captions(at)
    assert offered["swin_bias"].metadata["block"] == "stage 1 · block 2 (SW-MSA)"
    at.radio(key="swin_bias_block_0").set_value(0).run()
    assert offered["swin_bias"].metadata["block"] == "stage 1 · block 1 (W-MSA)"
    assert not at.exception, at.exception


def test_page_last_stage_without_shift_explains_itself(patched_swin):
    at = _swin_page().run()
    at.selectbox(key="swin_stage").set_value(2).run()  # 4 × 4 tokens = one window: timm sets the shift to 0
    assert not at.exception, at.exception
    assert sum("no shifted block" in i.value for i in at.info) == 2  # the shift and mask tabs say why


def test_page_typed_non_swin_name_is_a_message(patched_swin):
    at = _swin_page().run()
    at.selectbox(key="model_swin").set_value("Other: a hub id or a local folder…").run()
    at.text_input(key="custom_model_swin").set_value("vit_base_patch16_224").run()
    assert not at.exception
    assert at.error and "not a timm Swin" in at.error[0].value
    at.text_input(key="custom_model_swin").set_value("../../etc").run()
    assert not at.exception and at.error and "outside the folders" in at.error[0].value


def test_shipped_mini_swin_reproduces_its_measured_accuracy():
    """The weights in sample_data load through the registry path, and the accuracy the page shows is what they do."""
    from models.minis.swin_shapes import train

    spec = families.default_spec("swin")
    assert spec.source == "mini"
    loaded = swin.load(spec)
    card, metrics = loading.mini_card(spec)
    assert f"{metrics['accuracy']:.1%}" in card
    config = train.Config(**{k: tuple(v) if isinstance(v, list) else v for k, v in metrics["config"].items()})
    measured = train.evaluate(loaded.model, config)
    assert abs(measured["accuracy"] - metrics["accuracy"]) <= 0.005
    structure = swin.read_structure(loaded.model)
    assert [b.kind for b in structure.blocks] == ["W-MSA", "SW-MSA"] * 2 + ["W-MSA"] * 2  # shifts in two stages
    assert [b.num_windows for b in structure.blocks[::2]] == [16, 4, 1]
