"""The logit lens (models/analysis/lens.py, viz/figures/lens.py): its last layer is the model's own output, every other
layer is the model's final norm and unembedding applied to that layer's residual stream as an independent eager
forward computes it, the run keeps that stream without a second forward, and the files, the CLI and the page hold it.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from models import families
from models.analysis import lens
from models.core import text
from models.core.inputs import TextInput
from tests.conftest import (
    MODEL_CLASSES,
    ROOT,
    check_files,
    minilm_tokenizer,
    tiny_model,
)
from viz import figures
from viz.figures.lens import LensOptions

TEXT = "the cat sat on the mat and the dog sat on the rug"


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def tiny(request, tmp_path_factory, monkeypatch_module):
    """A tiny random causal LM of each architecture, saved as a user's folder, loaded and run through the app's path;
    and the same weights loaded by transformers with its own (sdpa) attention, as the independent reference."""
    import transformers

    folder = tmp_path_factory.mktemp("lens") / request.param
    model = tiny_model(request.param, attn_implementation="sdpa")
    norm, _ = lens.final_norm_and_unembedding(model)
    with torch.no_grad():  # a trained final norm is not the identity: applying it twice, or never, must show
        norm.weight.uniform_(0.5, 2.0)
        if getattr(norm, "bias", None) is not None:
            norm.bias.normal_(0.0, 0.5)
    model.save_pretrained(folder)
    minilm_tokenizer().save_pretrained(folder)
    monkeypatch_module.setenv("ATTN_EXPLORER_MODEL_DIRS", str(folder.parent))
    loaded = families.load(families.custom("causal_lm", str(folder)))
    result = families.run(loaded, TextInput(TEXT, 64))
    reference = getattr(transformers, MODEL_CLASSES[request.param]).from_pretrained(
        folder, attn_implementation="sdpa").eval()
    return loaded, result, reference


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def reference_probabilities(reference, ids: list[int]) -> list[np.ndarray]:
    """Per layer (0 = embeddings, last = output): softmax(unembed(final_norm(h_l))) at every position, from an eager
    forward of the reference model; the output layer is the model's logits themselves."""
    with torch.inference_mode():
        output = reference(input_ids=torch.tensor([ids]), output_hidden_states=True)
        norm, unembed = lens.final_norm_and_unembedding(reference)
        states = output.hidden_states
        layers = [torch.softmax(unembed(norm(state[0])), -1) for state in states[:-1]]
        layers.append(torch.softmax(output.logits[0], -1))
    return [layer.numpy() for layer in layers]


def test_the_run_keeps_the_residual_stream_of_its_one_forward(tiny):
    loaded, result, reference = tiny
    config = reference.config
    assert result.residual.shape == (config.num_hidden_layers + 1, len(result.tokens), config.hidden_size)
    assert result.residual.dtype == np.float32 and not result.residual.flags.writeable
    ids = text.tokenize(loaded.tokenizer, TEXT, 64).ids  # as the run tokenised it
    with torch.inference_mode():
        states = reference(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
    np.testing.assert_allclose(result.residual, torch.stack([s[0] for s in states]).numpy(), atol=1e-5)


def test_every_layer_equals_the_independent_unembedding_and_the_last_is_the_output(tiny):
    loaded, result, reference = tiny
    n = len(result.tokens)
    found = lens.logit_lens(loaded, result, LensOptions(positions=min(n, lens.MAX_POSITIONS)))
    assert found.positions == tuple(range(n)) and found.num_layers == reference.config.num_hidden_layers
    ids = text.tokenize(loaded.tokenizer, TEXT, 64).ids  # as the run tokenised it
    expected = reference_probabilities(reference, ids)
    for layer, probabilities in enumerate(expected):
        top = np.sort(probabilities, axis=-1)[:, ::-1][:, :lens.TOP_K]
        np.testing.assert_allclose(found.top_probs[layer], top, atol=1e-5, err_msg=f"layer {layer}")
        assert (found.top_ids[layer, :, 0] == probabilities.argmax(-1)).all()
    final = expected[-1].argmax(-1)
    np.testing.assert_array_equal(found.final_ids, final)
    for layer, probabilities in enumerate(expected):  # the final prediction's probability and rank, per layer
        chosen = probabilities[np.arange(n), final]
        np.testing.assert_allclose(found.final_probs[layer], chosen, atol=1e-5)
        np.testing.assert_array_equal(found.final_ranks[layer], (probabilities > chosen[:, None]).sum(-1))
    assert (found.final_ranks[-1] == 0).all()
    assert found.final_tokens[-1] == result.next_token[0].token  # the lens's output is the run's next token


def test_a_window_reads_only_its_positions(tiny):
    loaded, result, _ = tiny
    whole = lens.logit_lens(loaded, result, LensOptions(positions=len(result.tokens)))
    part = lens.logit_lens(loaded, result, LensOptions(positions=3, last=5))
    assert part.positions == (3, 4, 5)
    np.testing.assert_allclose(part.top_probs, whole.top_probs[:, 3:6], atol=1e-6)


@pytest.mark.parametrize("positions, last, says", [
    (0, -1, "1 to 64 positions"), (65, -1, "1 to 64 positions"), (4, 500, "outside the input's"),
    (4, -500, "outside the input's")])
def test_a_bad_window_is_a_message(tiny, positions, last, says):
    loaded, result, _ = tiny
    with pytest.raises(ValueError, match=says):
        lens.logit_lens(loaded, result, LensOptions(positions=positions, last=last))


def test_a_run_without_its_residual_stream_is_a_message(tiny):
    from models.families.causal_lm.model import GenerationSettings

    loaded, _, _ = tiny
    generated = families.run(loaded, TextInput(TEXT, 64), GenerationSettings(max_new_tokens=2))
    with pytest.raises(ValueError, match="kept no residual stream"):
        lens.logit_lens(loaded, generated, LensOptions())


def test_the_files_hold_every_layer_and_the_json_has_the_issue_s_shape(tiny):
    loaded, result, _ = tiny
    found = lens.logit_lens(loaded, result, LensOptions(positions=8))
    figure = figures.build("lens", found, LensOptions(positions=8))
    files = check_files(figure)
    assert figure.stem.endswith(f"logit-lens_positions-{len(result.tokens) - 8}-{len(result.tokens) - 1}")
    payload = json.loads(files["json"])
    layers = payload["layers"]
    assert len(layers) == found.num_layers + 1 and [entry["layer"] for entry in layers] == list(range(len(layers)))
    assert payload["tokens"] == list(result.tokens[-8:]) and payload["next_token"] == result.next_token[0].token
    for entry, layer in zip(layers, range(len(layers))):
        assert list(entry["top_token"]) == [cell[0] for cell in found.top_tokens[layer]]
        np.testing.assert_allclose(entry["top_prob"], found.top_probs[layer, :, 0], atol=1e-6)
        np.testing.assert_allclose(entry["final_token_prob"], found.final_probs[layer], atol=1e-6)
    assert layers[-1]["top_token"][-1] == payload["next_token"]


def test_cli_writes_the_lens_as_json(tiny, tmp_path, monkeypatch):
    from app import cli

    loaded, result, _ = tiny
    folder = loaded.spec.id
    assert cli.main(["--page", "gpt", "--model", folder, "--text", TEXT, "--view", "lens", "--positions", "4",
                     "--format", "json", "--out", str(tmp_path)]) == 0
    (written,) = tmp_path.glob("*.json")
    payload = json.loads(written.read_text())
    assert payload["next_token"] == result.next_token[0].token and len(payload["tokens"]) == 4
    assert {"layer", "top_token", "top_prob", "final_token_prob"} <= set(payload["layers"][0])
    assert cli.main(["--page", "gpt", "--model", folder, "--text", TEXT, "--view", "lens", "--positions", "99",
                     "--out", str(tmp_path)]) == 2  # a message, not a traceback


def test_the_gpt_page_shows_the_lens_when_its_tab_is_open(patched_loader):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app" / "views" / "gpt.py"), default_timeout=120)
    at.query_params.update({"gpt_tab": "What each layer predicts", "gpt_lens_count": "8", "gpt_lens_last": "999"})
    at.run()
    assert not at.exception, at.exception
    captions = " ".join(caption.value for caption in at.caption)
    assert "logit lens" in captions and "Layer 0 is the embeddings" in captions
    assert at.select_slider(key="gpt_lens_count").value == 8
    last = at.slider(key="gpt_lens_last")
    assert last.value == last.max  # the link's 999 was for a longer text: the last token
    at.select_slider(key="gpt_lens_count").set_value(64).run()  # every position of the short prompt at once
    assert not at.exception, at.exception
    assert not at.error
