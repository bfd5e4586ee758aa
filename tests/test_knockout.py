"""Attention knockout (models/core/capture.py ``knocked_out``, models/analysis/knockout.py, viz/figures/knockout.py): a cut
through our capture path equals an eager attention written here with the edge's score set to −∞, the sweep equals
the same cut one at a time, the captured maps show the cut, nothing leaks to other calls, and bad input is a
message."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from models import families
from models.analysis import knockout
from models.core import capture
from models.core.inputs import TextInput
from tests.conftest import check_files, save_tiny
from viz import figures
from viz.figures.knockout import KnockoutOptions, SweepOptions

TEXT = "the cat sat on the mat and the dog sat on the"
CUTS: dict = {}  # (layer -> set of (query, key)) read by the reference attention below


def reference_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Plain eager attention, causal, GQA by repeating keys, with the scores of the edges in ``CUTS`` set to −∞."""
    heads, kv_heads = query.shape[1], key.shape[1]
    key = key.repeat_interleave(heads // kv_heads, dim=1)
    value = value.repeat_interleave(heads // kv_heads, dim=1)
    scores = query @ key.transpose(-1, -2) * (scaling if scaling is not None else query.shape[-1] ** -0.5)
    n_q, n_k = scores.shape[-2:]
    future = torch.ones(n_q, n_k, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    for q, k in CUTS.get(module.layer_idx, ()):
        scores[..., q, k] = float("-inf")
    weights = scores.softmax(-1)
    return (weights @ value).transpose(1, 2).contiguous(), weights


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def tiny(request, tmp_path_factory):
    import transformers
    from transformers import AttentionInterface

    AttentionInterface.register("knockout_reference", reference_attention)
    with pytest.MonkeyPatch.context() as patch:
        folder = save_tiny(request.param, tmp_path_factory.mktemp("knockout") / request.param)
        sharpened = transformers.AutoModelForCausalLM.from_pretrained(folder)
        with torch.no_grad():  # random weights attend almost uniformly: sharper maps make each cut count
            for name, parameter in sharpened.named_parameters():
                if any(part in name for part in ("q_proj", "k_proj", "c_attn", "lm_head", "wte")):
                    parameter.mul_(6)
        sharpened.save_pretrained(folder)
        patch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(folder.parent))
        loaded = families.load(families.custom("causal_lm", str(folder)))
        reference = transformers.AutoModelForCausalLM.from_pretrained(
            folder, attn_implementation="knockout_reference").eval()
        yield loaded, families.run(loaded, TextInput(TEXT, 64)), reference


def by_hand(reference, ids, cuts: dict) -> torch.Tensor:
    """Probabilities after the last position with ``cuts`` {layer: [(query, key)]} applied by the reference."""
    CUTS.clear()
    CUTS.update(cuts)
    try:
        with torch.no_grad():
            return reference(input_ids=torch.tensor([ids])).logits[0, -1].float().softmax(-1)
    finally:
        CUTS.clear()


def test_a_cut_equals_the_edge_set_to_minus_infinity_by_hand(tiny):
    loaded, result, reference = tiny
    ids = list(result.token_ids)
    n = len(ids)
    found = knockout.attention_knockout(loaded, result, KnockoutOptions(keys="1-3", first_layer=1, last_layer=1))
    assert found.queries == (n - 1,) and found.keys == (1, 2, 3) and found.layers == (1, 1)
    clean = by_hand(reference, ids, {})
    cut = by_hand(reference, ids, {1: [(n - 1, k) for k in (1, 2, 3)]})
    assert found.target_id == int(clean.argmax())
    assert found.probability == pytest.approx(float(clean[found.target_id]), rel=1e-4)
    assert found.knocked_probability == pytest.approx(float(cut[found.target_id]), rel=1e-4)
    assert abs(found.relative_change) > 1e-3  # the cut changes something (10× the tolerance above)
    assert found.top_after[0][1] == pytest.approx(float(cut.max()), rel=1e-4)


def test_later_queries_lose_the_key_in_every_layer(tiny):
    loaded, result, reference = tiny
    ids = list(result.token_ids)
    n = len(ids)
    found = knockout.attention_knockout(loaded, result, KnockoutOptions(keys="2", queries="later"))
    assert found.queries == tuple(range(3, n)) and found.layers == (0, loaded.model.config.num_hidden_layers - 1)
    cut = by_hand(reference, ids, {layer: [(q, 2) for q in range(3, n)] for layer in range(2)})
    assert found.knocked_probability == pytest.approx(float(cut[found.target_id]), rel=1e-4)


def test_the_sweep_equals_each_cut_by_hand(tiny, monkeypatch):
    loaded, result, reference = tiny
    ids = list(result.token_ids)
    n = len(ids)
    monkeypatch.setattr(knockout, "BATCH_TOKENS", 5 * n)  # several batches: the batching changes no number
    sweep = knockout.knockout_sweep(loaded, result, SweepOptions(window=1))
    assert sweep.change.shape == (2, n)
    for layer in range(2):
        for key in (0, n // 2, n - 1):
            cut = by_hand(reference, ids, {layer: [(n - 1, key)]})
            assert sweep.knocked[layer, key] == pytest.approx(float(cut[sweep.target_id]), rel=1e-4), (layer, key)
    assert np.abs(sweep.change).max() > 1e-3
    wide = knockout.knockout_sweep(loaded, result, SweepOptions(window=9))  # wider than the model: clipped
    assert wide.window == 2 and wide.window_of(0) == (0, 0) and wide.window_of(1) == (0, 1)
    cut = by_hand(reference, ids, {0: [(n - 1, 1)], 1: [(n - 1, 1)]})
    assert wide.knocked[1, 1] == pytest.approx(float(cut[wide.target_id]), rel=1e-4)


def test_captured_maps_show_the_cut_and_nothing_leaks(tiny):
    loaded, result, _ = tiny
    model, ids = loaded.model, list(result.token_ids)
    n = len(ids)
    blocked = torch.zeros(1, n, n, dtype=torch.bool)
    blocked[0, n - 1, 2] = True
    layers = torch.tensor([[False, True]])
    with torch.inference_mode(), capture.recording(model) as recorder, \
            capture.knocked_out(knockout.attention_modules(model), blocked, layers):
        model(input_ids=torch.tensor([ids]), use_cache=False)
    maps = recorder.attention_maps("self")
    assert (maps.layer(1)[:, n - 1, 2] == 0).all()
    np.testing.assert_allclose(maps.layer(1).sum(-1), 1, atol=1e-5)
    assert (maps.layer(0)[:, n - 1, 2] > 0).all()  # layer 0 is not cut
    after = families.run(loaded, TextInput(TEXT, 64))  # outside the block: as before
    np.testing.assert_allclose(after.maps("self").layer(1), result.maps("self").layer(1), atol=1e-6)


@pytest.mark.parametrize("options, says", [
    (KnockoutOptions(keys=""), "type the positions"),
    (KnockoutOptions(keys="two"), "not a position"),
    (KnockoutOptions(keys="99"), "outside the prompt"),
    (KnockoutOptions(keys="1", first_layer=1, last_layer=0), "not such a range"),
    (KnockoutOptions(keys="1", last_layer=99), "layer 99 does not exist"),
    (KnockoutOptions(keys="1", target="catastrophically"), "must be one token"),
    (KnockoutOptions(keys="3", queries="1"), "no edge to cut"),
    (KnockoutOptions(keys="0", queries="0"), "no key to attend to"),
])
def test_bad_input_is_a_message(tiny, options, says):
    loaded, result, _ = tiny
    with pytest.raises(ValueError, match=says):
        knockout.attention_knockout(loaded, result, options)


def test_files_and_cli(tiny, tmp_path):
    from app import cli

    loaded, result, _ = tiny
    found = knockout.attention_knockout(loaded, result, KnockoutOptions(keys="1-2"))
    payload = json.loads(check_files(figures.build("knockout", found))["json"])
    assert payload["knocked_probability"] == pytest.approx(found.knocked_probability)
    sweep = knockout.knockout_sweep(loaded, result, SweepOptions(window=1))
    payload = json.loads(check_files(figures.build("knockout_sweep", sweep))["json"])
    np.testing.assert_allclose(payload["change"], sweep.change, atol=1e-6)
    assert cli.main(["--page", "gpt", "--model", loaded.spec.id, "--text", TEXT, "--view", "knockout", "--keys",
                     "1-2", "--format", "json", "--out", str(tmp_path)]) == 0
    (written,) = tmp_path.glob("*knockout*.json")
    assert json.loads(written.read_text())["keys"] == [1, 2]
    assert cli.main(["--page", "gpt", "--model", loaded.spec.id, "--text", TEXT, "--view", "knockout", "--keys",
                     "x", "--out", str(tmp_path)]) == 2


def test_the_gpt_page_shows_the_knockout_and_sweeps_when_asked(patched_loader):
    """The cut asked for runs at once (two forwards); the sweep (layers × positions forwards, ~22 s on SmolLM2) runs on
    a button press that says what it costs (issue 28)."""
    from streamlit.testing.v1 import AppTest

    from tests.conftest import ROOT

    at = AppTest.from_file(str(ROOT / "app" / "views" / "gpt.py"), default_timeout=120)
    at.query_params.update({"gpt_tab": "Knockout", "gpt_ko_keys": "1-2", "gpt_ko_window": "1"})
    at.run()
    assert not at.exception, at.exception
    assert any("with the edges from position" in caption.value for caption in at.caption)
    assert not any("The largest drop" in caption.value for caption in at.caption)  # the sweep waits to be asked
    assert any("forward passes" in caption.value for caption in at.caption)
    at.button(key="gpt_ko_sweep_go").click().run()
    assert not at.exception, at.exception
    assert any("The largest drop" in caption.value for caption in at.caption)  # the sweep
    at.text_input(key="gpt_ko_keys").set_value("<b>x</b>").run()
    assert not at.exception, at.exception
    assert any("not a position" in error.value for error in at.error)  # said, the page goes on
