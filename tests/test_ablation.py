"""Head ablation (models/analysis/ablation.py, viz/figures/ablation.py): each batched ablation equals switching that
one head off by hand in a forward of its own, the batching does not change a number, GQA groups are reported, bad
targets and modes are messages, and the CLI and the page show it."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from models import families
from models.analysis import ablation
from models.core.inputs import TextInput
from tests.conftest import ROOT, check_files, save_tiny
from viz import figures
from viz.figures.ablation import AblationOptions

TEXT = "the cat sat on the mat and the dog sat on the"


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def tiny(request, tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        folder = save_tiny(request.param, tmp_path_factory.mktemp("ablation") / request.param)
        patch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(folder.parent))
        loaded = families.load(families.custom("causal_lm", str(folder)))
        yield loaded, families.run(loaded, TextInput(TEXT, 64))


def by_hand(loaded, ids: list[int], target: int, layer: int | None, head: int, value=None) -> float:
    """log p(target) after ``ids`` with one head's slice of one layer's output-projection input replaced (by zeros,
    or ``value``): a single unbatched forward with its own hook."""
    model = loaded.model
    heads = model.config.num_attention_heads
    handle = None
    if layer is not None:
        def hook(module, args):
            hidden = args[0].clone()
            width = hidden.shape[-1] // heads
            hidden[..., head * width:(head + 1) * width] = 0 if value is None else value
            return (hidden,)

        handle = ablation.output_projections(model)[layer].register_forward_pre_hook(hook)
    try:
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
    finally:
        if handle is not None:
            handle.remove()
    return float(torch.log_softmax(logits.float(), -1)[target])


def test_every_batched_ablation_equals_that_head_off_by_hand(tiny):
    loaded, result = tiny
    found = ablation.head_ablation(loaded, result, AblationOptions())
    target = result.next_token[0].token_id
    assert found.target_id == target and found.target == result.next_token[0].token
    clean = by_hand(loaded, list(result.token_ids), target, None, 0)
    assert found.clean_logprob == pytest.approx(clean, abs=1e-5)
    config = loaded.model.config
    assert found.effect.shape == (config.num_hidden_layers, config.num_attention_heads)
    for layer in range(found.num_layers):
        for head in range(found.num_heads):
            expected = by_hand(loaded, list(result.token_ids), target, layer, head) - clean
            assert found.effect[layer, head] == pytest.approx(expected, abs=1e-4), (layer, head)
    assert np.abs(found.effect).max() > 1e-4  # switching heads off changes something


def test_mean_ablation_replaces_the_head_by_its_mean_output(tiny):
    loaded, result = tiny
    found = ablation.head_ablation(loaded, result, AblationOptions(mode="mean"))
    model, ids = loaded.model, list(result.token_ids)
    captured = {}
    projection = ablation.output_projections(model)[1]
    handle = projection.register_forward_pre_hook(lambda module, args: captured.setdefault("x", args[0].clone()))
    with torch.inference_mode():
        model(input_ids=torch.tensor([ids]), use_cache=False)
    handle.remove()
    heads = model.config.num_attention_heads
    width = captured["x"].shape[-1] // heads
    mean = captured["x"][0, :, 2 * width:3 * width].mean(0)
    expected = by_hand(loaded, ids, found.target_id, 1, 2, value=mean) - found.clean_logprob
    assert found.effect[1, 2] == pytest.approx(expected, abs=1e-4)


def test_batch_size_changes_no_number(tiny, monkeypatch):
    loaded, result = tiny
    batched = ablation.head_ablation(loaded, result, AblationOptions())
    monkeypatch.setattr(ablation, "BATCH_TOKENS", 1)  # one copy of the prompt per forward
    single = ablation.head_ablation(loaded, result, AblationOptions())
    np.testing.assert_allclose(batched.effect, single.effect, atol=1e-5)


def test_gqa_groups_are_reported(tiny):
    loaded, result = tiny
    found = ablation.head_ablation(loaded, result, AblationOptions())
    config = loaded.model.config
    kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    assert found.kv_heads == kv
    assert [found.kv_group(h) for h in range(found.num_heads)] == [h * kv // found.num_heads
                                                                  for h in range(found.num_heads)]
    cells = figures.build("ablation", found).table()
    assert list(cells["kv group"][:found.num_heads]) == [found.kv_group(h) for h in range(found.num_heads)]


@pytest.mark.parametrize("options, says", [
    (AblationOptions(target="catastrophically"), "must be one token"),
    (AblationOptions(mode="half"), "zero, mean"),
])
def test_bad_target_or_mode_is_a_message(tiny, options, says):
    loaded, result = tiny
    with pytest.raises(ValueError, match=says):
        ablation.head_ablation(loaded, result, options)


def test_a_typed_target_is_measured(tiny):
    loaded, result = tiny
    token = loaded.tokenizer.convert_ids_to_tokens(result.token_ids[2])  # a word the MiniLM tokenizer has whole
    found = ablation.head_ablation(loaded, result, AblationOptions(target=token))
    assert found.target_id == result.token_ids[2]
    assert found.clean_logprob == pytest.approx(by_hand(loaded, list(result.token_ids), found.target_id, None, 0),
                                                abs=1e-5)


def test_files_and_cli(tiny, tmp_path):
    from app import cli

    loaded, result = tiny
    found = ablation.head_ablation(loaded, result, AblationOptions())
    files = check_files(figures.build("ablation", found))
    payload = json.loads(files["json"])
    np.testing.assert_allclose(payload["effect"], found.effect, atol=1e-6)
    assert payload["target"] == found.target and payload["mode"] == "zero"
    assert cli.main(["--page", "gpt", "--model", loaded.spec.id, "--text", TEXT, "--view", "ablation", "--mode",
                     "mean", "--format", "json", "--out", str(tmp_path)]) == 0
    (written,) = tmp_path.glob("*.json")
    assert "head-ablation_mean_target" in written.name
    assert np.asarray(json.loads(written.read_text())["effect"]).shape == found.effect.shape
    assert cli.main(["--page", "gpt", "--model", loaded.spec.id, "--text", TEXT, "--view", "ablation", "--target",
                     "catastrophically", "--out", str(tmp_path)]) == 2  # a message, not a traceback


def test_the_gpt_page_ablates_heads_when_asked_and_says_what_it_costs(patched_loader):
    """Issue 28: opening the tab computed every head's ablation (~20 s on SmolLM2) before anyone asked. The tab says
    what the computation costs and runs it on a button press; a new target asks again."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app" / "views" / "gpt.py"), default_timeout=120)
    at.query_params.update({"gpt_tab": "Which heads matter"})
    at.run()
    assert not at.exception, at.exception
    assert not any("with every head on" in caption.value for caption in at.caption)  # nothing computed yet
    cost = " ".join(caption.value for caption in at.caption)
    assert "8 forward passes" in cost  # the tiny model: 2 layers × 4 heads, one forward each
    at.button(key="gpt_ablation_go").click().run()
    assert not at.exception, at.exception
    assert any("Heads in one key/value group share K and V" in caption.value for caption in at.caption)
    assert any("Computed in" in caption.value for caption in at.caption)
    at.text_input(key="gpt_ablation_target").set_value("<b>not one token</b> at all").run()
    assert not at.exception, at.exception
    assert not any("must be one token" in error.value for error in at.error)  # a new target: asked again first
    at.button(key="gpt_ablation_go").click().run()
    assert any("must be one token" in error.value for error in at.error)  # said, the page goes on


def test_a_head_switched_off_in_one_session_is_on_in_another(tiny):
    """The hooks sit on the shared, cached model: another thread's forward meanwhile must not see them."""
    import threading

    loaded, result = tiny
    model, ids = loaded.model, torch.tensor([list(result.token_ids)])
    with torch.inference_mode():
        clean = model(input_ids=ids, use_cache=False).logits
    heads = model.config.num_attention_heads
    elsewhere = {}

    def other_session():
        with torch.inference_mode():
            elsewhere["logits"] = model(input_ids=ids, use_cache=False).logits

    with ablation.heads_off(ablation.output_projections(model), heads, [(0, 1)]):
        here = model(input_ids=ids, use_cache=False).logits
        thread = threading.Thread(target=other_session)
        thread.start()
        thread.join()
    assert (here - clean).abs().max() > 1e-5  # switched off here
    torch.testing.assert_close(elsewhere["logits"], clean)  # and not in the other thread
