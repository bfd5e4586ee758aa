"""Export, shareable links and the command-line export: files are valid and carry the page's numbers."""
from __future__ import annotations

import io
import json

import altair as alt
import numpy as np
import pandas as pd
import pytest
from PIL import Image
from streamlit.testing.v1 import AppTest

from app import cli
from models import families
from models.core.inputs import TextInput
from models.families.causal_lm import model as causal_lm
from tests.conftest import ROOT, check_files, url_param
from viz import export


def test_file_stem_is_safe_and_readable():
    assert export.file_stem("gpt2", "The cat <sat>!", "layer 3", "head 5") == "gpt2_the-cat-sat_layer-3_head-5"
    assert export.file_stem("../../etc/passwd", "‮evil") == "etc-passwd_evil"
    assert export.file_stem("", None) == "attention"


def test_csv_defuses_spreadsheet_formulas():
    frame = pd.DataFrame({"key": ["=SUM(A1)", "+1", "ok"], "weight": [0.1, 0.2, 0.7]})
    text = export.csv_bytes(frame).decode()
    assert "'=SUM(A1)" in text and "'+1" in text and ",ok," in text


@pytest.fixture
def tiny_llama(tiny_folders, monkeypatch):
    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(tiny_folders["llama"].parent))
    return str(tiny_folders["llama"])


def test_cli_writes_valid_files_with_the_model_numbers(tiny_llama, tmp_path):
    text = "the cat sat on the mat"
    code = cli.main(["--page", "gpt", "--model", tiny_llama, "--text", text, "--layer", "1", "--head", "2",
                     "--format", "png,svg,json,csv,npz", "--out", str(tmp_path)])
    assert code == 0
    files = {p.suffix: p for p in tmp_path.iterdir()}
    assert set(files) == {".png", ".svg", ".json", ".csv", ".npz"}
    assert all("layer-1_head-2" in p.name for p in files.values())
    image = Image.open(files[".png"])
    assert image.format == "PNG" and min(image.size) > 300  # print resolution
    assert files[".svg"].read_text().lstrip().startswith("<svg")
    expected = causal_lm.run(families.load(families.custom("causal_lm", tiny_llama)), TextInput(text)).maps("self")
    payload = json.loads(files[".json"].read_text())
    np.testing.assert_allclose(payload["weights"], expected.head(1, 2), atol=1e-6)
    assert payload["query_tokens"] == expected.query_tokens
    csv = pd.read_csv(files[".csv"], index_col=0)
    np.testing.assert_allclose(csv.to_numpy(), expected.head(1, 2), atol=1e-6)
    arrays = np.load(files[".npz"])  # named for layer 1, head 2: holds that head, not the whole layer
    np.testing.assert_allclose(arrays["weights"], expected.head(1, 2), atol=1e-6)
    assert arrays["weights"].shape == (len(expected.query_tokens), len(expected.key_tokens))
    assert str(arrays["meta_input"]) == text and str(arrays["meta_head"]) == "2"


def test_cli_grid_and_focus_views(tiny_llama, tmp_path):
    assert cli.main(["--model", tiny_llama, "--text", "a b c d", "--view", "grid", "--format", "png,csv",
                     "--out", str(tmp_path)]) == 0
    assert cli.main(["--model", tiny_llama, "--text", "a b c d", "--view", "focus", "--query", "2",
                     "--format", "svg,json", "--out", str(tmp_path)]) == 0
    assert len(list(tmp_path.iterdir())) == 4


def test_cli_reports_user_mistakes_without_a_traceback(tiny_llama, tmp_path, capsys):
    assert cli.main(["--model", tiny_llama, "--text", "a b", "--layer", "9", "--out", str(tmp_path)]) == 2
    assert "layer 9 does not exist" in capsys.readouterr().err
    assert cli.main(["--model", tiny_llama, "--text", "   ", "--out", str(tmp_path)]) == 2


def _gpt_page() -> AppTest:
    return AppTest.from_file(str(ROOT / "app" / "views" / "gpt.py"), default_timeout=120)


def test_url_round_trips_to_the_same_state(patched_loader):
    at = _gpt_page()
    at.query_params.update({"gpt_text": "hello shared world", "gpt_layer": "1", "gpt_head": "head 2"})
    at.run()
    assert not at.exception, at.exception
    assert at.text_area(key="gpt_text").value == "hello shared world"
    assert at.slider(key="gpt_layer").value == 1
    assert at.selectbox(key="gpt_head").value == 2  # the link's "head 2", as the picker holds it
    at.slider(key="gpt_layer").set_value(0).run()
    assert at.query_params["gpt_layer"] == ["0"] or at.query_params["gpt_layer"] == "0"
    assert at.query_params["gpt_text"] in ("hello shared world", ["hello shared world"])


def test_page_downloads_carry_the_page_numbers(patched_loader, offered):
    at = _gpt_page()
    at.run()
    assert not at.exception, at.exception
    layer, head = at.slider(key="gpt_layer").value, at.selectbox(key="gpt_head").value
    prompt = at.text_area(key="gpt_text").value
    loaded = families.load(families.default_spec("causal_lm"))  # the patched tiny model, as the page loaded it
    expected = causal_lm.run(loaded, TextInput(prompt)).maps("self").head(layer, head)
    figure = offered["gpt"]
    files = check_files(figure)
    assert f"layer-{layer}_head-{head}" in figure.stem
    np.testing.assert_allclose(json.loads(files["json"])["weights"], expected, atol=1e-6)
    np.testing.assert_allclose(pd.read_csv(io.BytesIO(files["csv"]), index_col=0).to_numpy(), expected, atol=1e-6)
    np.testing.assert_allclose(np.load(io.BytesIO(files["npz"]))["weights"], expected, atol=1e-6)


# --- presentation mode -------------------------------------------------------------------------------------------

def _presentation_script():
    import streamlit as st

    from app import presentation

    presentation.toggle()
    st.text(presentation.color_scheme())


def test_presentation_mode_is_part_of_the_link():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(_presentation_script)
    at.query_params["presentation"] = "True"
    at.run()
    assert not at.exception, at.exception
    assert at.toggle(key="presentation").value is True and at.text[0].value == "cividis"
    assert at.session_state["scheme"] == "cividis"  # what the sidebar's colour scale shows is what figures use
    assert any("stMainBlockContainer" in m.value for m in at.markdown)  # the presentation stylesheet is on the page
    at.toggle(key="presentation").set_value(False).run()
    assert "presentation" not in at.query_params and at.text[0].value == "viridis"
    assert not any("stMainBlockContainer" in m.value for m in at.markdown)
    at.toggle(key="presentation").set_value(True).run()
    assert url_param(at, "presentation") == "True" and at.text[0].value == "cividis"


def _sidebar_script():
    import streamlit as st

    from app import presentation, sidebar

    sidebar.render()
    st.text(presentation.color_scheme())


def test_the_sidebar_colour_scale_is_the_one_figures_use():
    """The sidebar said "viridis" while presentation mode drew cividis (issue 28): they agree in both modes, and a
    scale picked during the lecture is used and given back when presentation mode ends."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(_sidebar_script)
    at.query_params["presentation"] = "True"
    at.run()
    assert not at.exception, at.exception
    assert at.selectbox(key="scheme").value == "cividis" == at.text[0].value
    at.selectbox(key="scheme").set_value("magma").run()
    assert at.selectbox(key="scheme").value == "magma" == at.text[0].value
    at.toggle(key="presentation").set_value(False).run()
    assert at.selectbox(key="scheme").value == "viridis" == at.text[0].value
    at.selectbox(key="scheme").set_value("blues").run()
    at.toggle(key="presentation").set_value(True).run()
    assert at.selectbox(key="scheme").value == "cividis" == at.text[0].value
    at.toggle(key="presentation").set_value(False).run()
    assert at.selectbox(key="scheme").value == "blues" == at.text[0].value



def test_combined_figure_keeps_each_charts_colours():
    """Two heatmaps joined for export keep their own colour scales and legends, as the page shows them (Vega-Lite
    merges same-named colour fields by default: softmax weights were drawn in the scores' red-blue)."""
    import vl_convert

    from viz import mechanics_charts
    labels = ["a", "b", "c"]
    scores = mechanics_charts.matrix_chart(np.array([[-3.0, 0, 3], [1, 2, -1], [0, 0, 0]]), labels, labels, "scores")
    weights = mechanics_charts.matrix_chart(np.full((3, 3), 1 / 3), labels, labels, "softmax", probabilities=True,
                                  scheme="cividis")
    vega = vl_convert.vegalite_to_vega(export.combined(scores, weights).to_json())
    color_scales = [s for s in vega["scales"] if s.get("type") != "band" and "scheme" in json.dumps(s)]
    assert len(color_scales) >= 2, [s["name"] for s in vega["scales"]]


def test_a_linked_heatmap_joins_other_charts_in_one_export():
    """A heatmap with linked token hover (selections on its layers) drawn beside another chart: the export compiles
    (Altair gave each hover selection every layer of the heatmap as its view: "Duplicate signal name") and each
    selection still listens to the marks of its own layer."""
    import vl_convert

    from viz import heatmap

    tokens = list("ABCAB")
    weights = np.tril(np.ones((5, 5))) / np.arange(1, 6)[:, None]
    linked = heatmap.attention_chart(weights, tokens, tokens, np.tril(np.ones((5, 5), bool)), "previous token",
                                     size=260, compact=True)
    bars = alt.Chart(pd.DataFrame({"x": [1.0, 2.0]})).mark_bar().encode(x="x:Q")
    for joined in (export.combined(linked, bars), export.combined(export.combined(linked, bars), bars,
                                                                    vertical=True)):
        assert export.chart_png(joined, scale=1)[:4] == b"\x89PNG"
        spec = json.loads(joined.to_json())
        names = {layer["name"] for part in spec.get("hconcat", spec.get("vconcat", [])) for layer in
                 part.get("layer", []) + [layer for inner in part.get("hconcat", []) for layer in
                                           inner.get("layer", [])] if "name" in layer}
        hover = [p for p in spec["params"] if p["name"].startswith(heatmap.HOVER)]
        assert hover and all(len(p["views"]) == 1 and p["views"][0] in names for p in hover), hover
        assert all(p["select"]["on"].split(":")[0] == f"@{p['select']['on'][1:].split('_marks')[0]}_marks"
                   and p["select"]["on"][1:].split("_marks")[0] in names for p in hover), hover
