"""The notebook API (app/notebook.py) on tiny random models held in memory, the way a researcher holds theirs.

- ``.weights()`` equals the model's own eager ``output_attentions`` (Llama, GPT-2, BERT, Qwen3, Gemma 3 with a sliding
  window), whatever attention implementation the user loaded it with;
- the model comes back exactly as it was (attention implementation, training flags, requires_grad, gradients, the
  user's own hooks and no others, transformers' output recording still working, outputs bit for bit), also when the
  call is interrupted by an exception inside the forward;
- the figures are the app's, render as Altair's mimebundle with the Vega-Lite spec (or a PNG), and save as files;
- a query span is the mean (or sum) of its rows; what no family takes is refused in words.
"""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from tests.tiny_text_models import byte_level_tokenizer, wordpiece_tokenizer

TEXT = "the cat sat on the mat. the dog sat on the log."


@pytest.fixture(scope="module")
def tokenizers():
    return {"bpe": byte_level_tokenizer(), "wordpiece": wordpiece_tokenizer()}


def tiny(kind: str, attn_implementation: str = "sdpa", dtype=torch.float32, vocab: int = 320):
    """A tiny random model of ``kind`` as a user would hold it (``from_pretrained(..., attn_implementation=...)``)."""
    import transformers

    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                  max_position_embeddings=128)
    configs = {
        "llama": ("LlamaForCausalLM", transformers.LlamaConfig(num_hidden_layers=2, num_key_value_heads=2, **common)),
        "gpt2": ("GPT2LMHeadModel", transformers.GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4,
                                                            n_positions=128)),
        "bert": ("BertForMaskedLM", transformers.BertConfig(num_hidden_layers=2, **common)),
        "qwen3": ("Qwen3ForCausalLM", transformers.Qwen3Config(num_hidden_layers=2, num_key_value_heads=2,
                                                               head_dim=8, **common)),
        "gemma3": ("Gemma3ForCausalLM", transformers.Gemma3TextConfig(
            num_hidden_layers=3, num_key_value_heads=2, head_dim=8, sliding_window=4,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"], **common)),
    }
    name, config = configs[kind]
    torch.manual_seed(0)
    return getattr(transformers, name)._from_config(config, attn_implementation=attn_implementation, dtype=dtype)


def tokenizer_for(kind, tokenizers):
    return tokenizers["wordpiece" if kind == "bert" else "bpe"]


def outputs(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def state(model) -> dict:
    """What the user can observe of their model besides its outputs."""
    return {
        "implementations": [(name, getattr(m.config, "_attn_implementation", None)) for name, m in
                            model.named_modules() if hasattr(m, "config")],
        "training": [m.training for m in model.modules()],
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "grads": [id(p.grad) if p.grad is not None else None for p in model.parameters()],
        "hooks": [(name, table, tuple(getattr(m, table))) for name, m in model.named_modules()
                  for table in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_forward_hooks_with_kwargs")
                  if getattr(m, table)],
        "attributes": [sorted(vars(m)) for m in model.modules()],
    }


@pytest.mark.parametrize("kind", ["llama", "gpt2", "bert", "qwen3", "gemma3"])
def test_weights_equal_eager_output_attentions(kind, tokenizers):
    from app.notebook import explore

    model = tiny(kind).eval()
    tokenizer = tokenizer_for(kind, tokenizers)
    run = explore(model, tokenizer, TEXT)
    ids = torch.tensor([run.result.token_ids])
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    with torch.no_grad():
        expected = eager(ids, output_attentions=True).attentions
    assert len(run.maps) == len(expected) == model.config.num_hidden_layers
    for layer, reference in enumerate(expected):
        np.testing.assert_allclose(run.maps[layer], reference[0].numpy(), atol=1e-5)
        np.testing.assert_allclose(run.weights(layer, 1), reference[0, 1].numpy(), atol=1e-5)
    assert run.family.name == ("encoder" if kind == "bert" else "causal_lm")
    assert torch.allclose(run.weights(0, None, as_torch=True), expected[0][0].mean(0), atol=1e-5)


CASES = [("llama", "sdpa", torch.float32), ("gpt2", "eager", torch.float32), ("bert", "sdpa", torch.bfloat16),
         ("qwen3", "eager", torch.bfloat16), ("gemma3", "sdpa", torch.float32)]


@pytest.mark.parametrize("kind, implementation, dtype", CASES)
def test_a_users_model_comes_back_unchanged(kind, implementation, dtype, tokenizers):
    from app.notebook import explore

    model = tiny(kind, implementation, dtype)
    tokenizer = tokenizer_for(kind, tokenizers)
    ids = torch.tensor([tokenizer(TEXT)["input_ids"]])
    seen = []
    model.get_input_embeddings().register_forward_hook(lambda module, args, output: seen.append(1))
    first = next(model.parameters())
    first.grad = torch.ones_like(first)
    list(model.parameters())[-1].requires_grad_(False)
    model.eval()
    before = outputs(model, ids)
    with torch.no_grad():  # on a copy: transformers installs its recording hooks on a model's first such call
        attentions_before = len(copy.deepcopy(model)(ids, output_attentions=True).attentions)
    model.train()
    kept = state(model)

    run = explore(model, tokenizer, TEXT)
    run.lens() if kind != "bert" else run.grid()  # a second borrow: the views that need the model
    assert state(model) == kept
    assert model.config._attn_implementation == implementation
    model.eval()
    assert torch.equal(outputs(model, ids), before)  # bit for bit
    with torch.no_grad():  # transformers' own output recording still works after the borrow
        assert len(model(ids, output_attentions=True).attentions) == attentions_before
    assert seen  # the user's own hook stayed and fired


@pytest.mark.parametrize("interruption", [RuntimeError, KeyboardInterrupt])
def test_a_call_interrupted_inside_the_forward_leaves_the_model_as_found(interruption, tokenizers, monkeypatch):
    from app.notebook import explore
    from models.core import capture

    model = tiny("llama", "eager")
    model.train()
    kept = state(model)
    ids = torch.tensor([tokenizers["bpe"](TEXT)["input_ids"]])
    calls = []

    def failing(self, module, query, key, attention_mask, kwargs):  # after one layer ran with capture switched on
        if query.shape[2] != ids.shape[1]:  # the four-token check of the model's named sites, not the run
            return real(self, module, query, key, attention_mask, kwargs)
        calls.append(model.config._attn_implementation)
        if len(calls) == 2:
            raise interruption("stopped")
        return real(self, module, query, key, attention_mask, kwargs)

    real = capture.Recorder.record
    monkeypatch.setattr(capture.Recorder, "record", failing)
    with pytest.raises(interruption):
        explore(model, tokenizers["bpe"], TEXT)
    assert calls == ["capture", "capture"]  # it was interrupted while borrowed
    assert state(model) == kept
    monkeypatch.undo()
    model.eval()
    eager = copy.deepcopy(model)
    assert torch.equal(outputs(model, ids), outputs(eager, ids))
    assert model.config._attn_implementation == "eager"


def test_figures_render_as_vega_lite_and_save(tokenizers, tmp_path):
    from app.notebook import explore

    run = explore(tiny("llama"), tokenizers["bpe"], TEXT)
    figure = run.head(1, 2)
    data, _ = figure._repr_mimebundle_()
    spec = next(value for mime, value in data.items() if mime.startswith("application/vnd.vegalite"))
    html = data["text/html"]  # Altair's default renderer: Vega loaded with or without RequireJS (bertviz #53)
    assert "vegaEmbed" in html and "maybeLoadScript" in html and 'typeof define === "function"' in html
    assert spec["$schema"].startswith("https://vega.github.io/schema/vega-lite/")
    names = {param["name"] for param in spec.get("params", [])}
    assert any(name.startswith("hover_queries") for name in names)  # the linked token hover
    np.testing.assert_array_equal(figure.arrays()["weights"], run.weights(1, 2))
    grid = run.grid()
    assert grid.image is not None and "image/png" in grid._repr_mimebundle_()[0]
    written = figure.save(tmp_path / "all")
    assert sorted(p.suffix for p in written) == [".csv", ".html", ".json", ".npz", ".png", ".svg"]
    assert (tmp_path / "one.svg") in figure.save(tmp_path / "one.svg")
    with np.load(figure.save(tmp_path / "head.npz")[0]) as saved:
        np.testing.assert_array_equal(saved["weights"], run.weights(1, 2))
    page = (tmp_path / "all" / f"{figure.stem}.html").read_text()
    assert "vegaEmbed" in page and "cdn.jsdelivr" not in page  # opens offline
    with pytest.raises(ValueError, match="cannot be saved as .svg"):
        grid.save(tmp_path / "grid.svg")


def test_a_query_span_is_the_mean_or_sum_of_its_rows(tokenizers):
    from app.notebook import explore

    run = explore(tiny("llama"), tokenizers["bpe"], TEXT)
    first, last = run.span("dog sat")
    assert run.tokens[first:last + 1] and "dog" in "".join(run.tokens[first:last + 1])
    rows = run.weights(1, 0)[first:last + 1]
    mean = run.focus("dog sat", layer=1, head=0)
    np.testing.assert_allclose(mean.arrays()["weights"], rows.mean(0), atol=1e-7)
    assert mean.payload()["query_last"] == last
    total = run.focus((first, last), layer=1, head=0, combine="sum")
    np.testing.assert_allclose(total.arrays()["weights"], rows.sum(0), atol=1e-6)
    one = run.focus(first, layer=1, head=0)
    np.testing.assert_allclose(one.arrays()["weights"], rows[0], atol=1e-7)
    with pytest.raises(ValueError, match="combined by mean or sum"):
        run.focus((first, last), combine="max")


def test_phrase_span_joins_pieces():
    from models.core.text import phrase_span

    pieces = ["Mr", " D", "urs", "ley", " of", " number", " four", ".", " Mr", " D", "urs", "ley"]
    assert phrase_span(pieces, "Dursley") == (1, 3)
    assert phrase_span(pieces, "dursley", occurrence=2) == (9, 11)
    assert phrase_span(pieces, "ley of num") == (3, 5)  # a phrase that starts or ends inside a token takes it
    assert phrase_span(["[CLS]", "play", "##ing", "[SEP]"], "playing") == (1, 2)
    with pytest.raises(ValueError, match="appears only 2 times"):
        phrase_span(pieces, "Dursley", occurrence=3)
    with pytest.raises(ValueError, match="appears not"):
        phrase_span(pieces, "Potter")


def test_generation_keeps_each_generated_tokens_attention(tokenizers):
    from app.notebook import explore

    model = tiny("llama")
    run = explore(model, tokenizers["bpe"], TEXT)
    generated = run.generate(max_new_tokens=4)
    assert len(generated.steps) == 4 and model.config._attn_implementation == "sdpa"
    assert len(generated.tokens) == len(run.tokens) + 4
    step = generated.step(2, layer=1, head=0)
    query = generated.steps[1].query
    np.testing.assert_allclose(step.arrays()["weights"], generated.weights(1, 0)[query, :query + 1], atol=1e-7)
    with pytest.raises(ValueError, match="generate"):
        run.step(1)


def test_refusals_are_in_words(tokenizers):
    import transformers

    from app.notebook import explore

    with pytest.raises(ValueError, match="needs its tokenizer"):
        explore(tiny("llama"), TEXT)
    vision = transformers.ViTModel(transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                          intermediate_size=32, image_size=32, patch_size=16))
    with pytest.raises(ValueError, match="not one of the models the explorer takes"):
        explore(vision, None, np.zeros((32, 32, 3), np.uint8))
    with pytest.raises(ValueError, match="say which family"):
        explore("no-such-owner/no-such-model", TEXT)
    with pytest.raises(ValueError, match="stays on its device"):
        explore(tiny("llama"), tokenizers["bpe"], TEXT, device="cpu")
    run = explore(tiny("llama"), tokenizers["bpe"], TEXT)
    with pytest.raises(ValueError, match="has no view 'rollout'.*it has: head"):
        run.view("rollout")
    with pytest.raises(ValueError, match="has no option 'layers'"):
        run.head(layers=3)
    with pytest.raises(ValueError, match="layer 7 does not exist"):
        run.weights(7)
    shown = run.why(0, 0, 3, 1)  # the score split into what wrote its query and its key (issue 37)
    assert shown.figure.shown()


def test_by_id_loads_as_the_app_does(tiny_folders, allowed_dirs, tmp_path):
    """A folder by path: the family from its config, the allowed-folder check of the app, the same numbers."""
    import shutil

    from app import notebook
    from models import families
    from models.core.inputs import TextInput
    from models.core.specs import ModelSpec

    folder = shutil.copytree(tiny_folders["llama"], allowed_dirs / "llama")
    run = notebook.explore(str(folder), "a b c d e", max_tokens=64)
    assert run.family.name == "causal_lm" and run.result.model.source == "local"
    loaded = families.load(ModelSpec("causal_lm", str(folder), "local", str(folder), "", ""))
    expected = families.run(loaded, TextInput("a b c d e", 64)).maps("self")
    np.testing.assert_allclose(run.maps[1], expected.layer(1), atol=1e-6)
    assert notebook.explore(str(folder), "a b c", family="causal_lm").loaded is run.loaded  # kept loaded
    notebook.forget()
    outside = shutil.copytree(tiny_folders["llama"], tmp_path.parent / f"{tmp_path.name}-outside")
    with pytest.raises(ValueError, match="outside the folders models may be loaded from"):
        notebook.explore(str(outside), "a b", family="causal_lm")
    with pytest.raises(ValueError, match="unknown model family"):
        notebook.explore(str(folder), "a b", family="nope")
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]


def test_another_models_package_first_on_the_path_is_named(tmp_path):
    """A user's own ``models`` package beside the notebook comes first on ``sys.path``: importing the notebook API
    says so, instead of failing somewhere inside with a name that does not exist."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "__init__.py").write_text("")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    done = subprocess.run([sys.executable, "-c", "import app.notebook"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0
    assert f"'models' is imported from {tmp_path}" in done.stderr and "Rename yours" in done.stderr


def test_the_install_adds_a_command_that_starts_the_app(monkeypatch):
    import tomllib

    from streamlit.web import cli

    from app import launch
    from tests.conftest import ROOT

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["attention-explorer"] == "app.launch:main"
    assert project["tool"]["setuptools"]["dynamic"]["dependencies"]["file"] == ["requirements.txt"]
    called = {}
    monkeypatch.setattr(cli, "main", lambda args, prog_name: called.update(args=args, prog=prog_name) or 0)
    monkeypatch.chdir(ROOT.parent)
    assert launch.main(["--server.port", "8599"]) == 0
    assert called["args"] == ["run", str(ROOT / "app" / "streamlit_app.py"), "--server.port", "8599"]
    import os

    assert os.getcwd() == str(ROOT)  # where Streamlit finds .streamlit/config.toml


def test_a_model_whose_attention_does_not_reach_the_interface_is_drawn_on_its_eager_path(tokenizers):
    """BLOOM computes attention its own way: borrowed, it is switched to its eager attention and read through
    output_attentions, as the app's loader does, and handed back as found."""
    import transformers

    from app.notebook import explore
    from models.core import capture

    torch.manual_seed(0)
    config = transformers.BloomConfig(vocab_size=30522, hidden_size=32, n_layer=2, n_head=4)
    model = transformers.BloomForCausalLM._from_config(config, attn_implementation="eager").eval()
    kept = state(model)
    run = explore(model, tokenizers["bpe"], TEXT)
    assert run.loaded.capture == capture.EAGER_PATH_DESCRIPTION
    ids = torch.tensor([list(run.result.token_ids)])
    with torch.inference_mode():
        reference = model(input_ids=ids, output_attentions=True).attentions
    for layer in range(2):
        np.testing.assert_allclose(run.weights(layer, 1), reference[layer][0, 1].numpy(), atol=1e-6)
    assert state(model) == kept and model.config._attn_implementation == "eager"
