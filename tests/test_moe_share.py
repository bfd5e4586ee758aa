"""Shareable links and downloads of the mixture-of-experts page.

A URL's values land in the widgets, a changed widget is written back to the URL, and every download the page offers
makes a valid file holding what its name says, with the model's numbers (tests/conftest.py: ``offered``,
``check_files``).
"""
# ruff: noqa: F811  (fixtures imported from the family's test module are redefined as test arguments)
from __future__ import annotations

import io
import json

import numpy as np

from models import families
from models.analysis import routing as stats
from models.core.inputs import TextInput
from models.families.moe import model as moe
from tests.conftest import check_files, url_param
from tests.test_moe import moe_page, saved_mixtral, tiny_tokenizer  # noqa: F401  (the page on a tiny Mixtral)

DOWNLOADS = {"moe_routed", "moe_gate", "moe_load", "moe_coactivation", "moe_consistency", "moe_special", "moe_two"}


def test_moe_url_round_trip_and_the_offered_numbers_are_the_pages(moe_page, offered):
    text = "the cat sat on the mat and the dog ran"
    at = moe_page
    at.query_params.update({"moe_text": text, "moe_layer": "block 1", "moe_token": "4",
                            "moe_view": "Load and balance"})
    at.run()
    assert not at.exception, at.exception
    assert at.text_area(key="moe_text").value == text and at.selectbox(key="moe_layer").value == "block 1"
    assert at.slider(key="moe_token").value == 4 and url_param(at, "moe_view") == "Load and balance"
    at.slider(key="moe_token").set_value(2).run()
    assert url_param(at, "moe_token") == "2" and url_param(at, "moe_text") == text
    assert set(offered) == DOWNLOADS  # every tab offers its figure; the legend, strip and prompt texts do not
    routing = moe.run(families.load(families.default_spec("moe")), TextInput(text, 512)).routing  # the page's tiny model
    index = routing.layer_labels.index("block 1")
    np.testing.assert_allclose(offered["moe_gate"].arrays()["probs"], routing.probs[index, 2], atol=1e-6)
    np.testing.assert_array_equal(offered["moe_routed"].table()["top-1 expert"], routing.top1[index])
    assert offered["moe_gate"].stem.endswith("_the-cat-sat-on-the-mat-and-the-dog-ran_gate_block-1_token-2")
    assert offered["moe_routed"].stem.endswith("_routing_block-1")
    np.testing.assert_allclose(offered["moe_load"].arrays()["load"],
                               stats.expert_load(routing.top_experts, routing.num_experts))
    np.testing.assert_allclose(offered["moe_coactivation"].arrays()["coactivation"],
                               stats.coactivation(routing.top_experts[index], routing.num_experts))
    np.testing.assert_allclose(offered["moe_consistency"].arrays()["nmi"], stats.cross_layer_consistency(routing.top1))
    special = stats.specialisation(routing.top_experts, routing.categories, shuffles=stats.SHUFFLES)
    np.testing.assert_allclose(offered["moe_special"].arrays()["observed_bits"], special.observed)
    np.testing.assert_allclose(offered["moe_special"].arrays()["shuffled_p95_bits"], special.shuffled_p95)
    for figure in offered.values():
        check_files(figure)


def test_two_prompt_downloads_hold_both_prompts_loads(moe_page, offered):
    at = moe_page.run()
    at.text_area(key="moe_prompt_a").set_value("the dog ran to the mat")
    at.text_area(key="moe_prompt_b").set_value("def f(x):\n    return x + 1").run()
    assert not at.exception, at.exception
    loaded = families.load(families.default_spec("moe"))
    loads = [stats.expert_load(moe.run(loaded, TextInput(t, 512)).routing.top_experts, 4)
             for t in ("the dog ran to the mat", "def f(x):\n    return x + 1")]
    figure = offered["moe_two"]
    assert figure.stem.endswith("_load-difference_the-dog-ran-to-the-m_def-f-x-return")  # 20 characters each
    files = check_files(figure)
    saved = np.load(io.BytesIO(files["npz"]))
    np.testing.assert_allclose(saved["load_a"], loads[0])
    np.testing.assert_allclose(saved["load_b"], loads[1])
    np.testing.assert_allclose(saved["difference"], loads[0] - loads[1])
    payload = json.loads(files["json"])
    assert payload["prompt_a"] == "the dog ran to the mat" and payload["prompt_b"] == "def f(x):\n    return x + 1"
    np.testing.assert_allclose(payload["load_a"], loads[0], atol=1e-7)
