"""The shared explanations and faithfulness curves on causal LMs (models/families/causal_lm/explain.py), on tiny random Llama (GQA,
RoPE) and GPT-2 models saved and loaded like a user's folder: the eager, differentiable attention equals the
capture's maps, Σ_j α_ij f(x_j) is the attention's own output, IG is complete, the curves start at the run's own
probability, and bad targets or a one-token text are messages."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from models import families
from models.analysis import attribution, faithfulness, relevance
from models.analysis import explanations as explainable
from models.analysis.ablation import output_projections
from models.analysis.methods import SHARED
from models.core.inputs import TextInput
from tests.conftest import save_tiny

TEXT = "the cat sat on the mat and the dog sat on the"


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def tiny(request, tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        folder = save_tiny(request.param, tmp_path_factory.mktemp("explain") / request.param)
        patch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(folder.parent))
        loaded = families.load(families.custom("causal_lm", str(folder)))
        yield loaded, families.run(loaded, TextInput(TEXT, 64)), folder


def test_eager_attention_and_values_are_the_models(tiny):
    loaded, result, _ = tiny
    ex = explainable.explainable(loaded, result, None)
    with torch.no_grad(), ex.record() as layers:
        ex.logits(ex.embeddings)
    maps = result.maps("self")
    for index, record in enumerate(layers):  # the capture's maps (recomputed from q, k) are an independent path
        np.testing.assert_allclose(record.attention[0].numpy(), maps.layer(index), atol=1e-5)
    outputs = []
    hooks = [p.register_forward_hook(lambda m, a, out: outputs.append(out[0])) for p in output_projections(loaded.model)]
    try:
        with torch.no_grad():
            loaded.model(input_ids=torch.tensor([list(result.token_ids)]), use_cache=False)  # plain SDPA forward
    finally:
        for hook in hooks:
            hook.remove()
    for record, projection, output in zip(layers, output_projections(loaded.model), outputs):
        bias = projection.bias if projection.bias is not None else 0.0
        summed = torch.einsum("hij,hjd->id", record.attention[0], record.values[0]) + bias  # Σ_h Σ_j α f(x_j) + b
        torch.testing.assert_close(summed, output, rtol=1e-4, atol=1e-5)
        last = len(result.token_ids) - 1
        norms = relevance.value_norm_row(record.attention[0], record.values[0], last)
        by_hand = torch.stack([(record.attention[0][:, -1, j, None] * record.values[0][:, j]).sum(0).norm()
                               for j in range(len(result.token_ids))])
        torch.testing.assert_close(norms, by_hand, rtol=1e-5, atol=1e-6)


def test_ig_completeness_and_curve_endpoints(tiny):
    loaded, result, _ = tiny
    ex = explainable.explainable(loaded, result, None)
    found = attribution.explain(ex, ("integrated_gradients",), ig_steps=128)
    with torch.no_grad():
        difference = float(ex.logits(ex.embeddings)[0, ex.target] - ex.logits(ex.ig_baseline())[0, ex.target])
    assert abs(found.scores["integrated_gradients"].sum() - difference) <= 0.01 * abs(difference)
    table = faithfulness.faithfulness(ex, "tiny", "text", steps=6, seeds=5, ig_steps=8)
    assert table.probability == pytest.approx(result.next_token[0].probability, rel=1e-4)
    for curves in [*table.curves.values(), *table.random]:
        assert curves.deletion[0] == pytest.approx(table.probability, rel=1e-4)
        assert curves.insertion[-1] == pytest.approx(table.probability, rel=1e-4)
    assert len(table.payload()["methods"]) == len(SHARED) + 1


def test_a_typed_target_and_bad_input(tiny):
    loaded, result, folder = tiny
    cat = loaded.tokenizer.encode("cat", add_special_tokens=False)[0]
    assert explainable.explainable(loaded, result, "cat").target == cat
    with pytest.raises(ValueError, match="one token"):
        explainable.explainable(loaded, result, "the cat")
    with pytest.raises(ValueError, match="does not exist"):
        explainable.explainable(loaded, result, 10**9)
    with pytest.raises(ValueError, match="single token"):
        explainable.explainable(loaded, replace(result, token_ids=result.token_ids[:1]), None)  # (this tokenizer
        # adds [CLS] and [SEP], so no text it makes is one token; SmolLM2's "cat" is)
    with pytest.raises(ValueError, match="replaced by"):
        explainable.explainable(loaded, result, None, "blur")


def test_cli_writes_the_json_contract(tiny, tmp_path, monkeypatch):
    from app import cli

    loaded, result, folder = tiny
    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(folder.parent))
    assert cli.main(["--page", "gpt", "--model", str(folder), "--text", TEXT, "--view", "faithfulness",
                     "--format", "json", "--out", str(tmp_path), "--steps", "5", "--ig_steps", "8"]) == 0
    written = json.loads(next(tmp_path.glob("*faithfulness*.json")).read_text())
    assert written["target"]["index"] == result.next_token[0].token_id
    assert set(written["methods"]) == {*SHARED, "random"}
    assert cli.main(["--page", "gpt", "--model", str(folder), "--text", TEXT, "--view", "explanations",
                     "--format", "csv,png", "--out", str(tmp_path), "--steps", "5", "--ig_steps", "8"]) == 0


def test_the_gpt_page_shows_the_faithfulness_tab(patched_loader):
    from streamlit.testing.v1 import AppTest

    from tests.conftest import ROOT

    at = AppTest.from_file(str(ROOT / "app" / "views" / "gpt.py"), default_timeout=180)
    at.query_params.update({"gpt_tab": "Faithfulness", "gpt_faith_steps": "5", "gpt_faith_ig_steps": "8"})
    at.run()
    assert not at.exception, at.exception
    assert any("deletion AUC (lower better)" in frame.value.columns for frame in at.dataframe)
    at.text_input(key="gpt_faith_token").set_value("<b>two tokens</b>").run()
    assert not at.exception, at.exception
    assert any("must be one token" in error.value for error in at.error)


def test_the_gpt_pages_default_integrated_gradients_pass_the_pages_completeness_check():
    """Issue 28: on SmolLM2 the page's default IG missed completeness by 400-2,000% (its own warning fired). The
    first token, the attention sink, now stays at the input along IG's path, and the GPT default takes the steps
    that pass the page's check on the sample the page opens on."""
    from app.sections.faithfulness import IG_STEPS

    opening = "The animal didn't cross the street because it was too tired."  # the GPT page's first sample
    loaded = families.load(families.default_spec("causal_lm"))
    result = families.run(loaded, TextInput(opening, 512))
    ex = explainable.explainable(loaded, result, None, "mean")
    found = attribution.explain(ex, ("integrated_gradients",), IG_STEPS["causal_lm"])
    assert found.ig_delta / abs(found.ig_difference) < attribution.COMPLETENESS_TOLERANCE
    assert found.scores["integrated_gradients"][0] == 0  # the sink kept: said in the notes
    assert any("attention sink" in note for note in ex.notes)
