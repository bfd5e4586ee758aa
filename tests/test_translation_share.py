"""Shareable links, downloads and the command-line export of the translation page.

A URL's values land in the widgets, a changed widget is written back to the URL, and every download the page offers
makes a valid file holding what its name says (tests/conftest.py: ``offered``, ``check_files``).
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from app import cli
from models import families
from models.core.inputs import TextInput
from models.families.translation import model as translation
from tests.conftest import check_files, url_param
from tests.test_translation import MINI, _translation_page  # the minis from sample_data

SENTENCE = "The national green plan has adopted an international commission."  # a grammar sample: gold is known


@pytest.fixture(scope="module")
def mini_result():
    loaded = families.load(families.spec("translation", "mini Transformer en→fr"))
    return families.run(loaded, TextInput(SENTENCE, translation.DEFAULT_MAX_SOURCE_TOKENS))


# --- the command line --------------------------------------------------------------------------------------------

def test_cli_translation_alignment_is_the_models_alignment(mini_result, tmp_path):
    assert cli.main(["--page", "translation", "--model", MINI, "--view", "alignment", "--text", SENTENCE, "--layer", "1", "--head",
                     "mean", "--format", "png,svg,json,csv,npz", "--out", str(tmp_path)]) == 0
    files = {p.suffix: p for p in tmp_path.iterdir()}
    assert set(files) == {".png", ".svg", ".json", ".csv", ".npz"}
    assert all("_cross_layer-1_mean_words." in p.name for p in files.values())
    assert min(Image.open(files[".png"]).size) > 600 and files[".svg"].read_text().lstrip().startswith("<svg")
    view = translation.alignment_view(mini_result, 1, None, True)
    payload = json.loads(files[".json"].read_text())
    np.testing.assert_allclose(payload["weights"], view.weights, atol=1e-6)
    assert payload["output_labels"] == view.row_labels and payload["alignment_error_rate"] == view.aer is not None
    assert payload["translation"] == mini_result.output.translation
    assert [tuple(link) for link in payload["gold_links"]] == sorted(view.gold)
    np.testing.assert_allclose(pd.read_csv(files[".csv"], index_col=0).to_numpy(), view.weights, atol=1e-6)
    np.testing.assert_allclose(np.load(files[".npz"])["weights"], view.weights, atol=1e-7)


def test_cli_translation_run_options_and_units(mini_result, tmp_path):
    """The run's options are flags too (``--strategy "beam search" --num_beams 3``), and ``--units tokens`` writes the
    pieces as computed."""
    assert cli.main(["--page", "translation", "--model", MINI, "--text", SENTENCE, "--units", "tokens", "--layer", "mean", "--head",
                     "0", "--strategy", "beam search", "--num_beams", "3", "--format", "json", "--out",
                     str(tmp_path)]) == 0
    (written,) = tmp_path.iterdir()
    assert written.name.endswith("_cross_all-layers_head-0_tokens.json")
    loaded = families.load(families.spec("translation", "mini Transformer en→fr"))
    beam = families.run(loaded, TextInput(SENTENCE), translation.TranslationSettings("beam search", 3))
    payload = json.loads(written.read_text())
    cross = beam.maps("cross")
    np.testing.assert_allclose(payload["weights"], np.mean([cross.head(i, 0) for i in range(cross.num_layers)], 0),
                               atol=1e-6)
    assert payload["output_labels"] == beam.output.output_tokens


def test_cli_translation_mistakes_are_messages(tmp_path, capsys):
    assert cli.main(["--page", "translation", "--model", MINI, "--text", "the zebra sleeps", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "does not know" in err and "zebra: did you mean" in err  # the suggestions, as on the page
    assert cli.main(["--page", "translation", "--model", MINI, "--text", SENTENCE, "--layer", "7", "--out", str(tmp_path)]) == 2
    assert "layer 7 does not exist" in capsys.readouterr().err
    assert cli.main(["--page", "translation", "--model", MINI, "--text", SENTENCE, "--view", "rollout", "--out", str(tmp_path)]) == 2
    assert "no view 'rollout'" in capsys.readouterr().err  # a ViT view
    assert not list(tmp_path.iterdir())


# --- the page: links and downloads -------------------------------------------------------------------------------

def test_translation_url_round_trip_and_the_offered_alignment_is_the_models(fresh_caches, offered, mini_result):
    at = _translation_page()
    at.query_params.update({"translation_text": SENTENCE, "tr_layer": "layer 1", "tr_head": "average of heads",
                            "tr_units": "tokens", "tr_step": "99"})
    at.run()
    assert not at.exception, at.exception
    layer_box = at.selectbox(key="tr_layer_mini Transformer en→fr")
    assert at.text_area(key="translation_text").value == SENTENCE and layer_box.value == 1
    assert at.radio(key="tr_units").value == "tokens"
    view = translation.alignment_view(mini_result, 1, None, False)
    figure = offered["tr_align"]
    assert figure.stem.endswith("_cross_layer-1_mean_tokens")
    np.testing.assert_allclose(figure.payload()["weights"], view.weights, atol=1e-6)
    np.testing.assert_allclose(figure.table().to_numpy(), view.weights, atol=1e-6)
    assert figure.payload()["output_labels"] == view.row_labels
    files = check_files(figure)
    np.testing.assert_allclose(json.loads(files["json"])["weights"], view.weights, atol=1e-6)

    at.radio(key="tr_units").set_value("words").run()
    assert url_param(at, "tr_units") == "words" and url_param(at, "tr_layer") == "1"
    words = translation.alignment_view(mini_result, 1, None, True)
    assert offered["tr_align"].payload()["alignment_error_rate"] == words.aer is not None
    at.session_state["tr_view"] = "Step through decoding"
    at.run()
    assert not at.exception, at.exception  # tr_step=99 from the link: refused, the first step is shown
    assert at.slider(key="tr_step").value == 1 and url_param(at, "tr_view") == "Step through decoding"
    np.testing.assert_allclose(offered["tr_step"].arrays()["source_attention"],
                               translation.cross_weights(mini_result.maps("cross"), 1, None)[0], atol=1e-6)
    check_files(offered["tr_step"])

    at.session_state["tr_view"] = "Measured quality"
    at.run()
    assert not at.exception, at.exception
    check_files(offered["tr_quality"])
    assert offered["tr_quality"].payload() == json.loads(translation.METRICS.read_text())
