"""Shareable links and downloads on every page beyond GPT/encoder (those are in test_share_export.py).

Per page: a URL's values land in the widgets, a changed widget is written back to the URL, and every download the
page offers makes a valid file. For translation and ViT the offered numbers equal the page's data, and the CLI writes
the same numbers to disk.
"""
from __future__ import annotations

import io
import json
import re

import numpy as np
import pytest
from PIL import Image

from app import share
from viz import export

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _param(at, name):
    """AppTest's query_params hold a list per name (or a string, depending on how they were set)."""
    value = at.query_params[name]
    return value[0] if isinstance(value, list) else value


@pytest.fixture
def offered(monkeypatch):
    """Every ``share.downloads`` call of a page run, keyed by its widget key (stem, chart, image, table, ...); contents
    given as functions (built only on click) are built here."""
    calls = {}

    def capture(stem, key, **kwargs):
        calls[key] = dict(stem=stem, **{name: share.resolve(value) for name, value in kwargs.items()})

    monkeypatch.setattr(share, "downloads", capture)
    return calls


def _check_files(call: dict) -> None:
    """Build every file the download row would offer, and check each is what its name says."""
    assert re.fullmatch(r"[a-z0-9_-]+", call["stem"]), f"unsafe file name {call['stem']!r}"
    if call.get("chart") is not None:
        assert Image.open(io.BytesIO(export.chart_png(call["chart"], scale=1))).format == "PNG"  # 1: fast, same spec
        assert export.chart_svg(call["chart"]).lstrip().startswith("<svg")
    elif call.get("image") is not None:
        assert Image.open(io.BytesIO(export.image_png(call["image"]))).format == "PNG"
    else:
        raise AssertionError(f"{call['stem']}: no figure offered")
    if call.get("table") is not None:
        assert export.csv_bytes(call["table"]).count(b"\n") == len(call["table"]) + 1
    if call.get("payload") is not None:
        json.loads(export.json_bytes(call["payload"]))
    if call.get("arrays"):
        saved = np.load(io.BytesIO(export.npz_bytes(call["arrays"], **(call.get("metadata") or {}))))
        for name, array in call["arrays"].items():
            np.testing.assert_array_equal(saved[name], array)


# --- positional --------------------------------------------------------------------------------------------------

from tests.test_positional import positional_page  # noqa: E402,F401  (the page with tiny models)


def test_positional_url_round_trip_and_downloads(positional_page, offered):
    at = positional_page
    at.query_params.update({"sin_d": "64", "sin_length": "96", "rope_base": "500000.0", "alibi_causal": "False",
                            "alibi_heads": "99", "pos_view": "RoPE",  # 99 heads: outside the slider, ignored
                            "rope_span": "1024"})  # 3 × 2,049 chart rows: over Altair's 5,000-row guard
    at.run()
    assert not at.exception, at.exception
    assert at.select_slider(key="sin_d").value == 64 and at.slider(key="sin_length").value == 96
    assert at.number_input(key="rope_base").value == 500000.0
    assert at.toggle(key="alibi_causal").value is False and at.slider(key="alibi_heads").value == 8
    assert _param(at, "pos_view") == "RoPE"
    at.slider(key="t5_length").set_value(200).run()
    assert _param(at, "t5_length") == "200" and _param(at, "sin_d") == "64"
    assert {"perm", "sin", "sin2d", "learned_text_table", "learned_grid", "rope", "alibi", "t5"} <= set(offered)
    assert "d-64_length-96" in offered["sin"]["stem"] and "base-500000" in offered["rope"]["stem"]
    np.testing.assert_allclose(offered["sin"]["arrays"]["encoding"][:, 0], np.sin(np.arange(96)), atol=1e-6)
    for call in offered.values():
        _check_files(call)


# --- Swin --------------------------------------------------------------------------------------------------------

from tests.test_swin import _swin_page, patched_swin  # noqa: E402,F401  (a tiny random Swin in place of the mini)


def test_swin_url_round_trip_and_downloads(patched_swin, offered):
    at = _swin_page()
    at.query_params.update({"swin_sample": "coffee", "swin_stage": "1", "swin_head": "head 3", "swin_row": "2",
                            "swin_col": "99", "swin_attn_block": "3", "swin_view": "Window attention"})
    at.run()
    assert not at.exception, at.exception
    assert at.selectbox(key="swin_stage").value == 1 and at.selectbox(key="swin_head_1").value == "head 3"
    assert at.slider(key="swin_row_1").value == 2 and at.slider(key="swin_col_1").value != 99  # out of range: default
    assert at.radio(key="swin_attn_block_1").value == 3
    assert _param(at, "swin_view") == "Window attention" and _param(at, "swin_sample") == "coffee"
    stem = offered["swin_attn"]["stem"]
    assert stem.startswith("mini-swin-shapes_sample-coffee_stage-2-block-2-sw-msa_head-3_window-")
    at.slider(key="swin_col_1").set_value(1).run()
    assert _param(at, "swin_col") == "1" and _param(at, "swin_row") == "2"
    assert {"swin_shift", "swin_mask", "swin_bias", "swin_attn", "swin_cost"} <= set(offered)
    call = offered["swin_attn"]
    window = call["payload"]["window"]
    np.testing.assert_allclose(call["table"].to_numpy(), call["arrays"]["windows"][window], atol=1e-7)
    for call in offered.values():
        _check_files(call)


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
    assert offered["swin_attn"]["stem"].startswith("mini-swin-shapes_upload_stage-1-")


# --- mechanics ---------------------------------------------------------------------------------------------------

from tests.test_mechanics import cost  # noqa: E402  (the page test keeps the KV presets to the published ones)


def _mechanics_page(monkeypatch):
    from streamlit.testing.v1 import AppTest

    from tests.conftest import ROOT

    published = cost.published_kv_specs()
    monkeypatch.setattr(cost, "app_model_kv_specs", lambda: cost.PresetReport(published[:1], ["x: skipped"]))
    return AppTest.from_file(str(ROOT / "app" / "views" / "mechanics.py"), default_timeout=120)


def test_mechanics_url_round_trip_and_downloads(monkeypatch, offered):
    at = _mechanics_page(monkeypatch)
    at.query_params.update({"mechanics_text": "Attention is all you need.", "mech_heads": "4", "mech_dk": "8",
                            "mech_scaled": "False", "mech_mask": "sliding_window", "mech_window": "2",
                            "mech_head": "3", "mech_step": "99", "cost_n": "4096", "mech_view": "② Masks"})
    at.run()
    assert not at.exception, at.exception
    assert at.text_area(key="mechanics_text").value == "Attention is all you need."
    assert at.select_slider(key="mech_heads").value == 4 and at.toggle(key="mech_scaled").value is False
    assert at.radio(key="mech_mask").value == "sliding_window" and at.slider(key="mech_window").value == 2
    assert at.radio(key="mech_head").value == 3 and at.number_input(key="cost_n").value == 4096
    assert _param(at, "mech_view") == "② Masks"
    at.radio(key="mech_mode").set_value("Cross-attention").run()
    assert _param(at, "mech_mode") == "Cross-attention" and _param(at, "mech_window") == "2"
    assert {"mech_steps", "mech_multihead", "mech_masks", "cost_memory", "cost_kv"} <= set(offered)
    masks = offered["mech_masks"]
    assert masks["stem"].startswith("mask_sliding-window_window-2_causal-true_head-3")
    from models import mechanics

    tokens = masks["payload"]["tokens"]
    expected = mechanics.build_mask("sliding_window", len(tokens), window=2, causal=True)
    np.testing.assert_array_equal(masks["arrays"]["allowed"], expected)
    np.testing.assert_allclose(masks["table"].to_numpy(), masks["arrays"]["weights"][3], atol=1e-7)
    assert json.loads(export.json_bytes(offered["mech_steps"]["payload"]))["masked_scores"]  # −∞ became null
    for call in offered.values():
        _check_files(call)


# --- the command-line export of the translation and ViT views ----------------------------------------------------

from app import cli  # noqa: E402

SENTENCE = "The national green plan has adopted an international commission."  # a grammar sample: gold is known


@pytest.fixture(scope="module")
def mini_translation():
    from models import registry, translation

    return translation.load(registry.get("translation", "mini Transformer en→fr"))


@pytest.fixture(scope="module")
def mini_vit():
    from models import registry, vit

    return vit.load(registry.get("vit", "mini ViT shapes"))


def test_cli_translation_alignment_is_the_models_alignment(mini_translation, tmp_path):
    from models import translation
    from models.minis.translation import grammar

    assert cli.main(["--page", "translation", "--text", SENTENCE, "--layer", "1", "--head", "mean",
                     "--format", "png,svg,json,csv,npz", "--out", str(tmp_path)]) == 0
    files = {p.suffix: p for p in tmp_path.iterdir()}
    assert set(files) == {".png", ".svg", ".json", ".csv", ".npz"}
    assert all("_cross_layer-1_mean_words." in p.name for p in files.values())
    assert min(Image.open(files[".png"]).size) > 600 and files[".svg"].read_text().lstrip().startswith("<svg")
    result = translation.run(mini_translation, SENTENCE)
    view = translation.alignment_view(result, 1, None, True, grammar.showcase_pairs().values())
    payload = json.loads(files[".json"].read_text())
    np.testing.assert_allclose(payload["weights"], view.weights, atol=1e-6)
    assert payload["output_labels"] == view.row_labels and payload["alignment_error_rate"] == view.aer
    assert payload["translation"] == result.extras["translation"].translation
    assert [tuple(link) for link in payload["gold_links"]] == sorted(view.gold)
    import pandas as pd

    np.testing.assert_allclose(pd.read_csv(files[".csv"], index_col=0).to_numpy(), view.weights, atol=1e-6)
    np.testing.assert_allclose(np.load(files[".npz"])["weights"], view.weights, atol=1e-7)


def test_cli_translation_mistakes_are_messages(mini_translation, tmp_path, capsys):
    assert cli.main(["--page", "translation", "--text", "the zebra sleeps", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "does not know" in err and "zebra: did you mean" in err
    assert cli.main(["--page", "translation", "--text", SENTENCE, "--layer", "7", "--out", str(tmp_path)]) == 2
    assert "layer 7 does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--page", "translation", "--text", SENTENCE, "--view", "rollout"])  # a ViT view


def test_cli_vit_cls_and_rollout_are_the_models_numbers(mini_vit, tmp_path):
    from models import images, vit
    from models.analysis import rollout

    assert cli.main(["--page", "vit", "--model", "mini ViT shapes", "--image", "coffee", "--layer", "2", "--head", "1",
                     "--format", "png,json,csv,npz", "--out", str(tmp_path / "cls")]) == 0
    assert cli.main(["--page", "vit", "--model", "mini ViT shapes", "--image", "coffee", "--view", "rollout",
                     "--fusion", "max", "--discard", "0.5", "--format", "png,npz", "--out", str(tmp_path / "roll")]) == 0
    result = vit.run(mini_vit, images.load_sample("coffee"))
    maps, info = result.maps("self"), result.image
    cls_files = {p.suffix: p for p in (tmp_path / "cls").iterdir()}
    assert cls_files[".png"].name == "mini-vit-shapes_sample-coffee_cls_layer-2_head-1.png"
    assert min(Image.open(cls_files[".png"]).size) >= 1600  # print resolution
    expected = vit.cls_attention_grid(maps, info, 2, 1)
    np.testing.assert_allclose(json.loads(cls_files[".json"].read_text())["values"], expected, atol=1e-6)
    arrays = np.load(cls_files[".npz"])
    np.testing.assert_allclose(arrays["cls_attention"], expected, atol=1e-7)
    np.testing.assert_allclose(arrays["attention"], maps.layer(2), atol=1e-7)
    assert str(arrays["meta_image"]) == "sample coffee"
    rolled = rollout.cls_rollout([maps.layer(i) for i in range(maps.num_layers)], info.num_prefix_tokens,
                                 info.patch_grid, "max", 0.5, 0)
    roll_files = {p.suffix: p for p in (tmp_path / "roll").iterdir()}
    assert roll_files[".npz"].name == "mini-vit-shapes_sample-coffee_rollout_max_discard-0-5.npz"
    np.testing.assert_allclose(np.load(roll_files[".npz"])["rollout"], np.asarray(rolled), atol=1e-6)


# --- ViT ---------------------------------------------------------------------------------------------------------

from tests.test_app_vit import _page as _vit_page, tiny_vits  # noqa: E402,F401  (tiny timm ViTs in the registry's place)


def test_vit_url_round_trip_and_the_offered_numbers_are_the_pages(tiny_vits, offered):
    from models import images, registry, vit
    from models.analysis import rollout

    at = _vit_page()
    at.query_params.update({"vit_sample": "rocket", "vit_layer": "0", "vit_head": "head 1", "vit_row": "2",
                            "vit_col": "-3", "vit_fusion": "max", "vit_discard": "0.5", "vit_opacity": "0.8",
                            "vit_view": "Rollout and attribution"})
    at.run()
    assert not at.exception, at.exception
    assert at.slider(key="vit_layer").value == 0 and at.selectbox(key="vit_head").value == "head 1"
    assert at.slider(key="vit_row").value == 2 and at.slider(key="vit_col").value >= 0  # -3: refused, default kept
    assert at.selectbox(key="vit_fusion").value == "max" and at.slider(key="vit_discard").value == 0.5
    assert _param(at, "vit_view") == "Rollout and attribution" and _param(at, "vit_sample") == "rocket"
    at.slider(key="vit_layer").set_value(1).run()
    assert _param(at, "vit_layer") == "1" and _param(at, "vit_head") == "head 1"

    spec = registry.default("vit")  # the page's default model, patched to the tiny backbone
    result = vit.run(vit.load(spec), images.load_sample("rocket"))
    maps, info = result.maps("self"), result.image
    cls = offered["vit_cls"]
    assert cls["stem"].endswith("_sample-rocket_cls_layer-1_head-1")
    np.testing.assert_allclose(cls["payload"]["values"], vit.cls_attention_grid(maps, info, 1, 1), atol=1e-6)
    np.testing.assert_allclose(cls["table"].to_numpy(), vit.cls_attention_grid(maps, info, 1, 1), atol=1e-6)
    np.testing.assert_allclose(cls["arrays"]["attention"], maps.layer(1), atol=1e-6)
    query = offered["vit_query"]
    token = vit.patch_token_index(info, 2, at.slider(key="vit_col").value)
    np.testing.assert_allclose(query["payload"]["values"], vit.query_attention_grid(maps, info, 1, 1, token),
                               atol=1e-6)
    rolled = rollout.cls_rollout([maps.layer(i) for i in range(maps.num_layers)], info.num_prefix_tokens,
                                 info.patch_grid, "max", 0.5, 0 if tuple(info.prefix_names[:1]) == ("[CLS]",) else None)
    np.testing.assert_allclose(offered["vit_rollout"]["arrays"]["rollout"], np.asarray(rolled), atol=1e-6)
    for call in offered.values():
        _check_files(call)


# --- MoE ---------------------------------------------------------------------------------------------------------

from tests.test_moe import moe_page, saved_mixtral, tiny_tokenizer  # noqa: E402,F401  (a tiny Mixtral)


def test_moe_url_round_trip_and_the_offered_numbers_are_the_pages(moe_page, offered):
    from models import loading, moe, registry

    text = "the cat sat on the mat and the dog ran"
    at = moe_page
    at.query_params.update({"moe_text": text, "moe_layer": "block 1", "moe_token": "4",
                            "moe_view": "Load and balance"})
    at.run()
    assert not at.exception, at.exception
    assert at.text_area(key="moe_text").value == text and at.selectbox(key="moe_layer").value == "block 1"
    assert at.slider(key="moe_token").value == 4 and _param(at, "moe_view") == "Load and balance"
    at.slider(key="moe_token").set_value(2).run()
    assert _param(at, "moe_token") == "2" and _param(at, "moe_text") == text
    assert {"moe_routed", "moe_gate", "moe_load", "moe_coactivation", "moe_consistency", "moe_special",
            "moe_two"} <= set(offered)
    routing = moe.run(loading.load(registry.default("moe")), text).extras["routing"]
    layer = routing.layer_label  # labels are "block N"
    index = [layer(i) for i in range(routing.num_layers)].index("block 1")
    np.testing.assert_allclose(offered["moe_gate"]["arrays"]["probs"], routing.probs[index, 2], atol=1e-6)
    np.testing.assert_array_equal(offered["moe_routed"]["table"]["top-1 expert"], routing.top1[index])
    assert "block-1_token-2" in offered["moe_gate"]["stem"]
    for call in offered.values():
        _check_files(call)


# --- presentation mode -------------------------------------------------------------------------------------------

def _presentation_script():
    import streamlit as st

    from app import share

    share.presentation_toggle()
    st.text(share.color_scheme())


def test_presentation_mode_is_part_of_the_link():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(_presentation_script)
    at.query_params["presentation"] = "True"
    at.run()
    assert not at.exception, at.exception
    assert at.toggle(key="presentation").value is True and at.text[0].value == "cividis"
    assert any("zoom" in m.value for m in at.markdown)  # the presentation stylesheet is on the page
    at.toggle(key="presentation").set_value(False).run()
    assert "presentation" not in at.query_params and at.text[0].value == "viridis"
    at.toggle(key="presentation").set_value(True).run()
    assert _param(at, "presentation") == "True"


# --- translation -------------------------------------------------------------------------------------------------

from tests.test_translation import _translation_page, fresh_caches  # noqa: E402,F401  (the minis from sample_data)


def test_translation_url_round_trip_and_the_offered_alignment_is_the_models(fresh_caches, offered, mini_translation):
    from models import translation
    from models.minis.translation import grammar

    at = _translation_page()
    at.query_params.update({"translation_text": SENTENCE, "tr_layer": "layer 1", "tr_head": "average of heads",
                            "tr_units": "tokens", "tr_step": "99"})
    at.run()
    assert not at.exception, at.exception
    layer_box = at.selectbox(key="tr_layer_mini Transformer en→fr")
    assert at.text_area(key="translation_text").value == SENTENCE and layer_box.value == "layer 1"
    assert at.radio(key="tr_units").value == "tokens"
    result = translation.run(mini_translation, SENTENCE)
    view = translation.alignment_view(result, 1, None, False, grammar.showcase_pairs().values())
    offered_view = offered["tr_align"]
    assert offered_view["stem"].endswith("_cross_layer-1_mean_tokens")
    np.testing.assert_allclose(offered_view["payload"]["weights"], view.weights, atol=1e-6)
    np.testing.assert_allclose(offered_view["table"].to_numpy(), view.weights, atol=1e-6)
    assert offered_view["payload"]["output_labels"] == view.row_labels
    _check_files(offered_view)

    at.radio(key="tr_units").set_value("words").run()
    assert _param(at, "tr_units") == "words" and _param(at, "tr_layer") == "layer 1"
    words = translation.alignment_view(result, 1, None, True, grammar.showcase_pairs().values())
    assert offered["tr_align"]["payload"]["alignment_error_rate"] == words.aer is not None
    at.session_state["tr_view"] = "Step through decoding"
    at.run()
    assert not at.exception, at.exception  # tr_step=99 from the link: refused, the first step is shown
    assert at.slider(key="tr_step").value == 1 and _param(at, "tr_view") == "Step through decoding"
    np.testing.assert_allclose(offered["tr_step"]["arrays"]["source_attention"],
                               translation.cross_weights(result.maps("cross"), 1, None)[0], atol=1e-6)
    _check_files(offered["tr_step"])


def test_combined_figure_keeps_each_charts_colours():
    """Two heatmaps joined for export keep their own colour scales and legends, as the page shows them (Vega-Lite
    merges same-named colour fields by default: softmax weights were drawn in the scores' red-blue)."""
    import vl_convert

    from viz import mechanics as charts

    labels = ["a", "b", "c"]
    scores = charts.matrix_chart(np.array([[-3.0, 0, 3], [1, 2, -1], [0, 0, 0]]), labels, labels, "scores")
    weights = charts.matrix_chart(np.full((3, 3), 1 / 3), labels, labels, "softmax", probabilities=True,
                                  scheme="cividis")
    vega = vl_convert.vegalite_to_vega(export.combined(scores, weights).to_json())
    color_scales = [s for s in vega["scales"] if s.get("type") != "band" and "scheme" in json.dumps(s)]
    assert len(color_scales) >= 2, [s["name"] for s in vega["scales"]]
