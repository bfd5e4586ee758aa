"""The Why view (models/analysis/why.py, viz/figures/why.py, issue 37): one score split into query-side × key-side
component pairs, exact.

- On tiny models of every architecture it reads (Llama with GQA and RoPE, Qwen2's q/k biases, Qwen3's and Gemma 3's
  per-head QK-norm, OLMo 2's whole-projection QK-norm and post-norms, gpt-oss's sinks, GPT-2, BERT's post-norm, a
  timm DINOv2-shaped ViT with layer scale and registers, transformers' Dinov2Model), with padding: the pairs sum to
  the score the model's softmax saw to 1e-4 in float32 and 1e-10 in float64; RoPE's frequency pairs sum to it too.
- Taking any one component out of the stream with the norms frozen moves the score by exactly its marginal (1e-5).
- Read off a run's residual stream (no forward) it equals the forward's split.
- On the offline SmolLM2, on repeated random tokens, the keys of the heads the app labels "induction" are fed by
  previous-token heads (Olsson et al. 2022's circuit).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers

from models import families
from models.analysis import roles, why
from models.core import capture
from models.core.inputs import TextInput
from tests.conftest import check_files
from tests.test_app_vit import tiny_vits  # noqa: F401  (a fixture)
from tests.tiny_text_models import load_local, save_tiny_causal_lm, save_tiny_encoder
from viz import figures
from viz.figures.why import WhyHeadOptions, WhyOptions

VOCAB = 100
LENGTH = 12
SLIDING = ("gemma3", "gpt_oss")  # a window of 4: key 5 is out of reach of query 11


def _common(**extra):
    return dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, **extra)


def _config(kind: str):
    if kind == "llama":
        return transformers.LlamaForCausalLM, transformers.LlamaConfig(**_common())
    if kind == "qwen2":
        return transformers.Qwen2ForCausalLM, transformers.Qwen2Config(**_common())
    if kind == "qwen3":
        return transformers.Qwen3ForCausalLM, transformers.Qwen3Config(**_common(head_dim=8))
    if kind == "olmo2":
        return transformers.Olmo2ForCausalLM, transformers.Olmo2Config(**_common(), eos_token_id=1, pad_token_id=0)
    if kind == "gemma3":
        return transformers.Gemma3ForCausalLM, transformers.Gemma3TextConfig(
            **_common(head_dim=8, sliding_window=4, query_pre_attn_scalar=8))
    if kind == "gpt_oss":
        return transformers.GptOssForCausalLM, transformers.GptOssConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2,
            max_position_embeddings=64, sliding_window=4,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    if kind == "gpt2":
        return transformers.GPT2LMHeadModel, transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=3, n_head=4,
                                                                     n_positions=64, bos_token_id=1, eos_token_id=1)
    if kind == "bert":
        return transformers.BertModel, transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                                               num_hidden_layers=3, num_attention_heads=4,
                                                               max_position_embeddings=64)
    raise ValueError(kind)


def _roughened(model):
    """Random weights moved off their initial values: norms' gains and biases that are not 1 and 0."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype) * 0.05)
    return model


def _text_model(kind: str, dtype: torch.dtype):
    capture.register()
    cls, config = _config(kind)
    torch.manual_seed(0)
    model = _roughened(cls._from_config(config, attn_implementation="capture", dtype=dtype).eval())
    ids = torch.randint(2, VOCAB, (2, LENGTH))
    mask = torch.ones(2, LENGTH, dtype=torch.long)
    if kind == "bert":
        mask[1, -3:] = 0  # right padding
        inputs = dict(input_ids=ids, attention_mask=mask)
    else:
        mask[1, :3] = 0  # left padding
        inputs = dict(input_ids=ids, attention_mask=mask, use_cache=False)
    return model, (lambda: model(**inputs)), mask


def _vit(kind: str, dtype: torch.dtype):
    torch.manual_seed(0)
    pixels = torch.randn(1, 3, 28, 28, dtype=dtype)
    if kind == "timm":
        import timm

        from models.core import capture_timm

        model = timm.create_model("vit_small_patch14_dinov2", pretrained=False, img_size=28, patch_size=14,
                                  embed_dim=32, depth=3, num_heads=4, init_values=0.5, reg_tokens=2)
        capture_timm.disable_fused_attention(model)
        model = _roughened(model.eval().to(dtype))
        return model, (lambda: model.forward_features(pixels)), model.num_prefix_tokens + 4
    capture.register()
    config = transformers.Dinov2Config(hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                       intermediate_size=64, image_size=28, patch_size=14, layerscale_value=0.5)
    model = _roughened(transformers.Dinov2Model._from_config(config, attn_implementation="capture",
                                                             dtype=dtype).eval())
    return model, (lambda: model(pixel_values=pixels)), 5


TEXT_KINDS = ("llama", "qwen2", "qwen3", "olmo2", "gemma3", "gpt2", "bert")
CASES = [(kind, dtype) for dtype in (torch.float64, torch.float32) for kind in TEXT_KINDS]
CASES += [("gpt_oss", torch.float32)]  # its experts' kernel takes no float64


def _cells(kind: str, item: int):
    if kind == "bert":
        return [(2, 6), (0, 8)]
    return [(11, 9 if kind in SLIDING else 5), (11, 11) if item else (4, 1)]


@pytest.mark.parametrize("kind, dtype", CASES, ids=[f"{k}-{str(d)[6:]}" for k, d in CASES])
def test_the_pairs_sum_to_the_score_the_softmax_saw(kind, dtype):
    model, forward, _ = _text_model(kind, dtype)
    labels = [f"t{i}" for i in range(LENGTH)]
    tolerance = 1e-10 if dtype == torch.float64 else 1e-4
    for layer in (0, 2):
        for item in (0, 1):  # item 1 is padded
            cap = why.capture_forward(model, forward, layer, list(range(LENGTH)), item, labels)
            for query, key in _cells(kind, item):
                found = why.cell(model, cap, layer, 3, query, key, labels, check_pairs=10**6)
                assert found.contributions.shape == (len(found.query_components), len(found.key_components))
                total = found.contributions.sum() + found.score_bias
                assert abs(total - found.score) <= tolerance * max(1.0, abs(found.score)), (layer, item, query, key)
                if found.rope is not None:  # the same score over RoPE's frequency pairs
                    assert abs(found.rope.contributions.sum() + found.score_bias - found.score) <= \
                        tolerance * max(1.0, abs(found.score))
                if dtype == torch.float64:  # any one component out, norms frozen: the score moves by its marginal
                    assert len(found.checks) == len(found.query_components) + len(found.key_components)
                    for check in found.checks:
                        assert check.frozen == pytest.approx(check.predicted, abs=1e-5)
    assert (found.rope is not None) == (kind not in ("gpt2", "bert"))
    assert (found.position is not None) == (kind in ("gpt2", "bert"))
    if kind == "gpt_oss":  # the sink is a column of its own: the keys' weights and it sum to 1
        assert 0 < found.sink_weight < 1


@pytest.mark.parametrize("kind", ["timm", "dinov2"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_vit_cls_row_is_split_exactly(kind, dtype):
    model, forward, count = _vit(kind, dtype)
    labels = ["[CLS]"] + [f"t{i}" for i in range(1, count)]
    tolerance = 1e-10 if dtype == torch.float64 else 1e-4
    for layer in range(3):
        cap = why.capture_forward(model, forward, layer, list(range(count)), 0, labels)
        found = why.cell(model, cap, layer, 2, 0, count - 1, labels)
        assert abs(found.contributions.sum() - found.score) <= tolerance * max(1.0, abs(found.score))
        assert found.position is not None  # learned positions: their part of the score is reported
        assert found.query_components[0] == "[CLS] embedding"
        if layer:
            assert "layer 0 head 0" in found.key_components  # through the layer scale


def test_the_row_weight_is_the_pages(tmp_path, monkeypatch):
    """The weight the view reports is the page's map's; the row's strongest keys come from the same row."""
    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(tmp_path))
    loaded = load_local("causal_lm", save_tiny_causal_lm(tmp_path / "llama"))
    result = families.run(loaded, TextInput("the cat sat on the mat. the dog sat on the log.", 64))
    found = why.why_cell(loaded, result, WhyOptions(layer=1, head=2, query=9, key=3))
    assert found.weight == pytest.approx(float(result.maps("self").row(1, 2, 9)[3]), abs=1e-6)
    assert found.top_keys[0].weight == pytest.approx(float(result.maps("self").row(1, 2, 9).max()), abs=1e-6)
    assert found.runner_up is not None and found.runner_up.position != 3


def _save_decoder(kind: str, folder):
    """A tiny decoder of ``kind`` (roughened, so its norms' gains and biases matter) and a byte-level tokenizer."""
    from tests.tiny_text_models import byte_level_tokenizer

    tokenizer = byte_level_tokenizer()
    cls, config = _config(kind)
    config.vocab_size = len(tokenizer)
    torch.manual_seed(0)
    _roughened(cls._from_config(config)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("save", [save_tiny_causal_lm, "gpt2", "qwen3", "olmo2"],
                         ids=["llama", "gpt2", "qwen3", "olmo2"])
def test_read_off_the_run_equals_the_forward(save, tmp_path, monkeypatch):
    """A language-model run that kept its residual stream is split with no forward: each earlier head's output is
    rebuilt from the stream and its attention row (through OLMo 2's post-attention norm); the terms equal those of
    a forward with hooks."""
    from tests.conftest import save_tiny

    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(tmp_path))
    if callable(save):
        folder = save(tmp_path / "model")
    else:
        folder = save_tiny(save, tmp_path / "model") if save == "gpt2" else _save_decoder(save, tmp_path / "model")
    loaded = load_local("causal_lm", folder)
    result = families.run(loaded, TextInput("the cat sat on the mat. the dog sat on the log. the cat", 64))
    layer = 2 if save in ("qwen3", "olmo2") else 1  # the layers below: heads' outputs read off the stream
    assert why.from_run_possible(loaded.model, result, layer)
    positions = list(range(len(result.tokens)))
    labels = why._labels(result)
    read = why.cell(loaded.model, why._capture(loaded, result, layer, positions), layer, 1, len(positions) - 1, 2,
                    labels)
    forward = why.cell(loaded.model, why._capture(loaded, result, layer, positions, forward=True), layer, 1,
                       len(positions) - 1, 2, labels)
    assert (read.source, forward.source) == ("run", "forward")
    assert read.query_components == forward.query_components
    np.testing.assert_allclose(read.contributions, forward.contributions, atol=1e-5)
    assert read.score == pytest.approx(forward.score, abs=1e-6)


def test_files_cli_and_head_table(tmp_path, monkeypatch):
    """The CLI writes the view's JSON with ``score``, ``weight`` and every pair at its top level, then the marginals,
    the RoPE bands and the intervention check; the head's table likewise."""
    from app import cli

    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(tmp_path))
    folder = save_tiny_causal_lm(tmp_path / "llama")
    loaded = load_local("causal_lm", folder)
    text = "the cat sat on the mat. the dog sat on the log."
    result = families.run(loaded, TextInput(text, 64))
    found = why.why_cell(loaded, result, WhyOptions(layer=1, head=1))
    payload = json.loads(check_files(figures.build("why", found))["json"])
    assert list(payload)[:4] == ["score", "weight", "pairs", "query_marginal"]
    assert {"key_marginal", "rope_bands", "intervention_check", "runner_up"} <= set(payload)
    assert sum(pair["contribution"] for pair in payload["pairs"]) == pytest.approx(payload["score"], abs=1e-4)
    assert set(payload["pairs"][0]) == {"query_component", "key_component", "contribution"}
    assert sum(band["contribution"] for band in payload["rope_bands"]) == pytest.approx(payload["score"], abs=1e-4)
    assert payload["intervention_check"] and payload["query"] == len(result.tokens) - 1
    table = why.why_head(loaded, result, WhyHeadOptions(layer=1, head=1))
    head_payload = json.loads(check_files(figures.build("why_head", table))["json"])
    assert len(head_payload["components"]) == len(table.components)
    shares = np.array([row["key share"] + 0.0 for row in head_payload["components"]])
    assert shares.sum() == pytest.approx(1.0, abs=1e-4)  # every component's part of the score, biases included

    out = tmp_path / "out"
    assert cli.main(["--page", "gpt", "--model", str(folder), "--text", text, "--view", "why", "--layer", "1",
                     "--head", "1", "--query", "9", "--key", "3", "--format", "json,csv", "--out", str(out)]) == 0
    written = json.loads(next(out.glob("*why*.json")).read_text())
    assert (written["query"], written["key"]) == (9, 3)
    assert cli.main(["--page", "gpt", "--model", str(folder), "--text", text, "--view", "why_head", "--layer", "1",
                     "--format", "json", "--out", str(out)]) == 0
    assert cli.main(["--page", "gpt", "--model", str(folder), "--text", text, "--view", "why", "--layer", "7",
                     "--out", str(out)]) == 2  # a layer the model lacks: a message, not a traceback


def test_encoder_run_and_bad_cells(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(tmp_path))
    loaded = load_local("encoder", save_tiny_encoder(tmp_path / "bert"))
    result = families.run(loaded, TextInput("the cat sat on the mat", 64))
    found = why.why_cell(loaded, result, WhyOptions(layer=1, head=0, key=2))
    assert found.query == 0 and found.error < 1e-4  # [CLS] first
    assert any(name == "layer 0 attention LayerNorm β" for name in found.key_components)  # post-norm: β components
    with pytest.raises(ValueError, match="does not exist"):
        why.why_cell(loaded, result, WhyOptions(layer=0, head=0, query=99))


def test_other_architectures_are_refused_in_words():
    capture.register()
    config = transformers.PhiConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                    num_attention_heads=4)
    model = transformers.PhiForCausalLM._from_config(config, attn_implementation="capture")
    with pytest.raises(ValueError, match="'phi' architecture"):
        why.architecture(model)


def test_role_names():
    scores = {name: np.zeros((2, 2), dtype=np.float32) for name in roles.ROLES}
    scores["previous_token_role"][0, 1] = 0.8
    scores["induction"][1, 0] = 0.5
    scores["sink"][1, 1] = 0.95
    named = why.role_names(scores)
    assert named == {(0, 1): "previous-token head", (1, 0): "induction head", (1, 1): "first-token sink"}


@pytest.fixture(scope="module")
def smollm2():
    return families.load(families.default_spec("causal_lm"))


def test_smollm2_induction_heads_read_previous_token_heads_through_their_keys(smollm2):
    """On [BOS] + R + R (the roles' repeated random tokens), each of SmolLM2's three strongest induction heads (18/6,
    17/4, 17/3) attends from the second copy to the token after the earlier occurrence; what lifts that key above
    the row's runner-up through the key side is, first of all, a head the app labels previous-token (16/0: 95–144%
    of the margin; measured, see docs/pages/mechanics.md)."""
    found = roles.head_roles(smollm2)
    named = why.role_names(found.scores)
    induction = found.scores["induction"]
    strongest = [(int(i) // induction.shape[1], int(i) % induction.shape[1])
                 for i in np.argsort(induction, axis=None)[::-1][:3]]
    ids = torch.from_numpy(found.sequence_ids[:1])
    n, count = roles.REPEAT_LENGTH, ids.shape[1]
    labels = [str(i) for i in range(count)]
    cells = [(i, i - n + 1) for i in range(n + 1, count)]  # the token after the earlier occurrence

    def forward():
        return smollm2.model(input_ids=ids, use_cache=False, logits_to_keep=1)

    arch = why.architecture(smollm2.model)
    for layer in sorted({layer for layer, _ in strongest}):
        cap = why.capture_forward(smollm2.model, forward, layer, list(range(count)), 0, labels)
        for head in [h for lay, h in strongest if lay == layer]:
            runners = []
            for i, j in cells:
                _, allowed, _, weights, _ = why._row(cap, arch.blocks[layer], head, i, arch.group)
                runners.append(why._runner_up(weights, allowed, j, skip=(0,)))
            table = why.head_table(smollm2.model, cap, layer, head, cells, runners, named)
            assert table.error < 1e-4
            top = table.components[int(np.argmax(table.key_vs_runner_up))]
            assert top.endswith("(previous-token head)"), (layer, head, top)
            assert table.share("key_vs_runner_up")[int(np.argmax(table.key_vs_runner_up))] > 0.5


def _page(name: str):
    from streamlit.testing.v1 import AppTest

    from tests.conftest import ROOT

    return AppTest.from_file(str(ROOT / "app" / "views" / f"{name}.py"), default_timeout=180)


def test_the_gpt_page_splits_a_clicked_cell_and_checks_on_a_button(patched_loader, offered):
    at = _page("gpt")
    at.query_params.update({"gpt_tab": "Why this head looks here", "gpt_why_layer": "1", "gpt_why_head": "2",
                            "gpt_why_query": "5", "gpt_why_key": "1"})
    at.run()
    assert not at.exception, at.exception
    figure = offered["gpt_why"]
    found = figure.payload()
    assert (found["layer"], found["head"], found["query"], found["key"]) == (1, 2, 5, 1)
    assert not found["intervention_check"]  # only on the button
    next(b for b in at.button if b.key == "gpt_why_check").click().run()
    assert not at.exception, at.exception
    assert offered["gpt_why"].payload()["intervention_check"]
    at.toggle(key="gpt_why_table").set_value(True).run()
    assert not at.exception, at.exception
    assert offered["gpt_why_head"].payload()["layer"] == 1


def test_the_encoder_page_splits_a_cell(patched_loader, offered):
    at = _page("encoder")
    at.query_params.update({"encoder_why": "True", "encoder_why_layer": "1"})
    at.run()
    assert not at.exception, at.exception
    assert offered["encoder_why"].payload()["query"] == 0  # [CLS]


def test_the_vit_page_splits_the_cls_row(tiny_vits, offered):
    at = _page("vit")
    at.query_params.update({"vit_view": "Why [CLS] looks here"})
    at.run()
    assert not at.exception, at.exception
    payload = offered["vit_why"].payload()
    assert payload["query"] == 0 and payload["query_token"] == "[CLS]"
    assert abs(sum(p["contribution"] for p in payload["pairs"]) - payload["score"]) < 1e-4


def test_the_hand_built_induction_circuit_is_found_again():
    """The mechanics lesson: the toy's induction head attends to the letter after the earlier copy, and its scores'
    split names the previous-token head on the key side and the token embedding on the query side."""
    from models.lessons import induction

    found = induction.circuit(None, None, WhyHeadOptions())  # defaults: block 8, seed 0
    block = found.block
    assert np.diag(found.previous_map, -1).min() > 0.99
    assert min(found.induction_map[i, i - block + 1] for i in range(block + 1, 2 * block)) > 0.9
    head = found.head
    assert head.error < 1e-10
    key_top = head.components[int(np.argmax(head.key_vs_runner_up))]
    query_top = head.components[int(np.argmax(head.query_vs_runner_up))]
    assert key_top == "layer 0 head 0 (previous-token head)" and query_top == "token embedding"
    assert head.share("key_vs_runner_up")[head.components.index(key_top)] > 0.9
    check_files(figures.build("why_circuit", found))


def test_the_mechanics_page_teaches_the_circuit(monkeypatch, offered):
    from models.lessons import cost

    published = cost.published_kv_specs()
    monkeypatch.setattr(cost, "app_model_kv_specs", lambda: cost.PresetReport(published[:1], ["x: skipped"]))
    at = _page("mechanics")
    at.query_params.update({"mech_view": "⑥ Why a head looks there", "mech_why_block": "6"})
    at.run()
    assert not at.exception, at.exception
    assert offered["mech_why"].payload()["tokens"].__len__() == 12


def test_a_soft_cap_and_a_sink_change_the_weights_not_the_split():
    """Gemma 2 caps scores after the split (softcap · tanh(s / softcap)); gpt-oss adds a sink logit per head as a
    softmax column of its own. The split is of the score before the cap; the weights are what the softmax gives."""
    import dataclasses

    model, forward, _ = _text_model("llama", torch.float64)
    labels = [f"t{i}" for i in range(LENGTH)]
    cap = why.capture_forward(model, forward, 1, list(range(LENGTH)), 0, labels)
    arch = why.architecture(model)
    plain = why._row(cap, arch.blocks[1], 3, 11, arch.group)
    capped_block = dataclasses.replace(arch.blocks[1], softcap=0.05, sinks=torch.full((4,), 0.01, dtype=torch.float64))
    scores, allowed, _, weights, sink = why._row(cap, capped_block, 3, 11, arch.group)
    assert torch.equal(scores, plain[0])
    expected = torch.softmax(torch.cat([0.05 * torch.tanh(scores / 0.05), torch.tensor([0.01], dtype=torch.float64)]),
                             0)
    torch.testing.assert_close(weights, expected[:-1])
    assert sink == pytest.approx(float(expected[-1])) and plain[4] is None


def test_two_splits_at_once_each_equal_their_solo_run(tmp_path, monkeypatch):
    """Two sessions splitting cells of one cached model at once, through the forward with hooks (the page's path
    for runs that kept no residual stream): each equals its solo run (tests/test_hook_isolation.py's harness)."""
    from tests.test_hook_isolation import at_once

    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(tmp_path))
    loaded = load_local("causal_lm", save_tiny_causal_lm(tmp_path / "llama"))
    monkeypatch.setattr(why, "from_run_possible", lambda *args: False)
    runs = [families.run(loaded, TextInput(text, 64)) for text in ("the cat sat on the mat. the dog",
                                                                    "one two three four five six seven")]
    jobs = [lambda run=run: why.why_cell(loaded, run, WhyOptions(layer=1, head=1)).contributions for run in runs]
    alone = [job() for job in jobs]
    for index, rounds in enumerate(at_once(jobs, loaded.model, rounds=3)):
        for got in rounds:
            assert not isinstance(got, Exception), f"session {index} failed: {got!r}"
            assert np.array_equal(got, alone[index]), f"session {index} differs from its solo run"


def test_the_why_tab_opens_on_the_head_the_attention_views_show(patched_loader, offered):
    at = _page("gpt")
    at.query_params.update({"gpt_tab": "Why this head looks here", "gpt_layer": "1", "gpt_head": "head 3"})
    at.run()
    assert not at.exception, at.exception
    payload = offered["gpt_why"].payload()
    assert (payload["layer"], payload["head"]) == (1, 3)
