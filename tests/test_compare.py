"""Two runs compared (models/analysis/compare.py, viz/figures/compare.py): a run against itself is all zero, the
per-head distances equal a direct computation from the two runs' maps, different token counts fall back to a head
statistic and say so, and bad input is a message."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon

from models import families
from models.analysis import compare, heads
from models.core.inputs import TextInput
from tests.conftest import check_files, save_tiny, tiny_model
from viz import figures
from viz.figures.compare import CompareOptions

FIRST = "the cat sat on the mat"
SAME_LENGTH = "the dog sat on the log"
LONGER = "a quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        base = tmp_path_factory.mktemp("compare")
        folder = save_tiny("llama", base / "llama")
        other = save_tiny("llama", base / "llama-other")  # the same tokenizer and shape, other weights
        for seed, path in ((0, folder), (1, other)):
            model = tiny_model("llama", "sdpa", seed=seed)
            with torch.no_grad():  # random weights attend almost uniformly: sharper maps differ measurably
                for name, parameter in model.named_parameters():
                    if "q_proj" in name or "k_proj" in name:
                        parameter.mul_(8)
            model.save_pretrained(path)
        patch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(base))
        loaded = families.load(families.custom("causal_lm", str(folder)))
        yield loaded, families.run(loaded, TextInput(FIRST, 64)), other


def test_a_run_against_itself_is_all_zero(tiny):
    loaded, result, _ = tiny
    for distance in compare.DISTANCES:
        found = compare.compare_runs(loaded, result, CompareOptions(text2=FIRST, distance=distance))
        assert found.same_length and found.per_head.shape == (2, 4)
        np.testing.assert_allclose(found.per_head, 0, atol=1e-6)


def test_distances_equal_a_direct_computation(tiny):
    loaded, result, _ = tiny
    second = families.run(loaded, TextInput(SAME_LENGTH, 64))
    assert len(second.tokens) == len(result.tokens)
    js = compare.compare_runs(loaded, result, CompareOptions(text2=SAME_LENGTH, distance="js"))
    tv = compare.compare_runs(loaded, result, CompareOptions(text2=SAME_LENGTH, distance="tv"))
    for layer in range(2):
        a, b = result.maps("self").layer(layer), second.maps("self").layer(layer)
        for head in range(4):
            # (scipy returns the square root, NaN for two equal rows: the root of a rounding error below 0)
            rows_js = [np.nan_to_num(jensenshannon(a[head, q], b[head, q], base=2)) ** 2 for q in range(a.shape[1])]
            rows_tv = [np.abs(a[head, q] - b[head, q]).sum() / 2 for q in range(a.shape[1])]
            assert js.per_head[layer, head] == pytest.approx(np.mean(rows_js), abs=1e-5)
            assert tv.per_head[layer, head] == pytest.approx(np.mean(rows_tv), abs=1e-6)
    assert js.per_head.max() > 1e-2  # 1,000 × the tolerance above
    np.testing.assert_allclose(js.per_layer, js.per_head.mean(1))


def test_different_token_counts_compare_a_statistic_and_say_so(tiny):
    loaded, result, _ = tiny
    second = families.run(loaded, TextInput(LONGER, 64))
    found = compare.compare_runs(loaded, result, CompareOptions(text2=LONGER, distance="js"))
    assert not found.same_length and found.measure == "entropy_bits"
    assert "different token counts" in found.note
    for layer in range(2):
        expected = np.abs(heads.layer_statistics(result.maps("self").layer(layer))["entropy_bits"]
                          - heads.layer_statistics(second.maps("self").layer(layer))["entropy_bits"])
        np.testing.assert_allclose(found.per_head[layer], expected, atol=1e-6)
    figure = figures.build("compare", found, CompareOptions(text2=LONGER, layer=1, head=2))
    assert "different token counts" in figure.caption
    assert len(figure.charts) == 4  # the map, the bars, the two maps side by side: no difference map


def test_two_models_with_one_tokenizer(tiny):
    loaded, result, other = tiny
    found = compare.compare_runs(loaded, result, CompareOptions(model2=str(other)))
    assert found.same_length and found.second.token_ids == result.token_ids
    assert found.per_head.min() > 0  # other weights: every head differs
    assert found.second_label != found.first_label


@pytest.mark.parametrize("options, says", [
    (CompareOptions(), "type a second prompt"),
    (CompareOptions(text2="   "), "type a second prompt"),
    (CompareOptions(text2=SAME_LENGTH, distance="cosine"), "js or tv"),
])
def test_bad_input_is_a_message(tiny, options, says):
    loaded, result, _ = tiny
    with pytest.raises(ValueError, match=says):
        compare.compare_runs(loaded, result, options)


def test_models_whose_heads_do_not_pair_are_a_message(tiny):
    from dataclasses import replace

    from models.core.results import StoredAttention

    _, result, _ = tiny
    maps = result.maps("self")
    one_layer = StoredAttention("self", maps.query_tokens, maps.key_tokens, [maps.layer(0).copy()], maps.allowed(0))
    with pytest.raises(ValueError, match="cannot be paired"):  # 2 × 4 heads against 1 × 4
        compare.compare_results(result, replace(result, attention={"self": one_layer}), "js", ("a", "b"))


def test_files_and_cli(tiny, tmp_path):
    from app import cli

    loaded, result, _ = tiny
    found = compare.compare_runs(loaded, result, CompareOptions(text2=SAME_LENGTH))
    figure = figures.build("compare", found, CompareOptions(text2=SAME_LENGTH, layer=1, head=3))
    assert len(figure.charts) == 5  # the map, the per-layer bars, the head side by side, the difference
    payload = json.loads(check_files(figure)["json"])
    np.testing.assert_allclose(payload["per_head"], found.per_head, atol=1e-6)
    assert cli.main(["--page", "gpt", "--model", loaded.spec.id, "--text", FIRST, "--view", "compare", "--text2",
                     SAME_LENGTH, "--format", "json", "--out", str(tmp_path)]) == 0
    (written,) = tmp_path.glob("*compare*.json")
    assert json.loads(written.read_text())["same_length"] is True
    assert cli.main(["--page", "gpt", "--model", loaded.spec.id, "--text", FIRST, "--view", "compare", "--out",
                     str(tmp_path)]) == 2  # no second prompt: a message


def test_the_gpt_page_compares_two_prompts_when_its_tab_is_open(patched_loader):
    from streamlit.testing.v1 import AppTest

    from tests.conftest import ROOT

    at = AppTest.from_file(str(ROOT / "app" / "views" / "gpt.py"), default_timeout=120)
    at.query_params.update({"gpt_tab": "Compare two runs", "gpt_text": FIRST})
    at.run()
    assert not at.exception, at.exception
    assert any("Type a second prompt" in info.value for info in at.info)
    at.text_input(key="gpt_cmp_text2").set_value(SAME_LENGTH).run()
    assert not at.exception, at.exception
    assert any("compared query by query" in caption.value for caption in at.caption)
    at.text_input(key="gpt_cmp_model2").set_value("no/such-model-here").run()
    assert not at.exception, at.exception
    assert at.error  # a model that cannot be loaded is a message
