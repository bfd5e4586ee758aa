"""The shared explanations and faithfulness curves on the encoder (packaged MiniLM, target: the sentence embedding;
models/families/encoder/explain.py) and the encoder–decoder translator (the mini Transformer en→fr, target: one output token,
teacher-forced; models/families/translation/explain.py), each against an independent computation: the eager differentiable
attention equals the capture's maps, Σ_j α_ij f(x_j) + b is the attention's own output, Chefer's encoder–decoder
rollout equals a by-hand version (and its gradient form with ones equals the plain form), IG is complete, the curves
start at the run's own score, and bad targets or a one-token text are messages."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from models import families
from models.analysis import attribution, faithfulness, relevance
from models.analysis import explanations as explainable
from models.analysis.methods import METHODS, SHARED
from models.core.inputs import TextInput
from models.families.translation import explain as translation_explain

SENTENCE = "The cat sat quietly on the warm mat."
SOURCE = "The national green plan has adopted an international commission."


@pytest.fixture(scope="module")
def encoder():
    loaded = families.load(families.default_spec("encoder"))
    return loaded, families.run(loaded, TextInput(SENTENCE, 64))


@pytest.fixture(scope="module")
def translator():
    loaded = families.load(next(s for s in families.specs("translation") if s.id == "translation/transformer"))
    return loaded, families.run(loaded, TextInput(SOURCE, 64))


def _pooled(model, ids) -> torch.Tensor:
    """The sentence embedding the plain way: token ids in, mean of the last layer (not ``inputs_embeds``)."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).last_hidden_state.mean(1)[0]


# --- encoder ------------------------------------------------------------------------------------------------------

def test_encoder_records_are_the_models_attention_and_values(encoder):
    loaded, result = encoder
    ex = explainable.explainable(loaded, result, None)
    outputs = []
    dense = [layer.attention.output.dense for layer in loaded.model.encoder.layer]
    hooks = [d.register_forward_hook(lambda m, a, out: outputs.append(out[0])) for d in dense]
    try:
        with torch.no_grad(), ex.record() as layers:
            ex.logits(ex.embeddings)
    finally:
        for hook in hooks:
            hook.remove()
    maps = result.maps("self")
    assert len(layers) == maps.num_layers
    for index, (record, projection, output) in enumerate(zip(layers, dense, outputs)):
        np.testing.assert_allclose(record.attention[0].numpy(), maps.layer(index), atol=1e-5)
        summed = torch.einsum("hij,hjd->id", record.attention[0], record.values[0]) + projection.bias
        torch.testing.assert_close(summed, output, rtol=1e-4, atol=1e-5)


def test_encoder_target_is_the_sentence_embedding(encoder):
    loaded, result = encoder
    ids = list(result.token_ids)
    assert [result.tokens[i] for i in result.special_positions] == ["[CLS]", "[SEP]"]
    own = explainable.explainable(loaded, result, None)
    assert own.units == tuple(range(1, len(ids) - 1))  # [CLS] and [SEP] stay
    assert len(own.unit_names) == len(own.units)
    with torch.no_grad():
        outputs = own.logits(own.embeddings)
    torch.testing.assert_close(outputs[0], _pooled(loaded.model, ids), rtol=1e-4, atol=1e-5)
    assert float(own.probability(outputs)[0]) == pytest.approx(1.0, abs=1e-5)
    assert float(own.score(outputs)[0]) == pytest.approx(float(_pooled(loaded.model, ids).norm()), rel=1e-4)
    reference = "A dog barked at the mailman."
    other = explainable.explainable(loaded, result, reference)
    reference_embedding = _pooled(loaded.model, loaded.tokenizer(reference)["input_ids"])
    expected = torch.nn.functional.cosine_similarity(_pooled(loaded.model, ids), reference_embedding, dim=0)
    with torch.no_grad():
        assert float(other.probability(other.logits(other.embeddings))[0]) == pytest.approx(float(expected), abs=1e-4)


def test_encoder_ig_completeness_and_curve_endpoints(encoder):
    loaded, result = encoder
    ex = explainable.explainable(loaded, result, "A dog barked at the mailman.")
    found = attribution.explain(ex, ("integrated_gradients",), ig_steps=64)
    with torch.no_grad():
        difference = float(ex.score(ex.logits(ex.embeddings))[0] - ex.score(ex.logits(ex.baseline))[0])
        everything_removed = float(ex.probability(ex.logits(ex.baseline))[0])
    assert abs(found.scores["integrated_gradients"].sum() - difference) <= 0.01 * abs(difference)
    table = faithfulness.faithfulness(ex, "MiniLM", "sentence", steps=5, seeds=5, ig_steps=8)
    assert set(table.curves) == set(SHARED)
    for curves in [*table.curves.values(), *table.random]:
        assert curves.deletion[0] == pytest.approx(table.probability, abs=1e-5)
        assert curves.insertion[-1] == pytest.approx(table.probability, abs=1e-5)
        assert curves.deletion[-1] == pytest.approx(everything_removed, abs=1e-5)
    assert table.payload()["target"]["kind"].startswith("sentence embedding")


def test_encoder_bad_input(encoder):
    loaded, result = encoder
    with pytest.raises(ValueError, match="masked-LM head"):
        explainable.explainable(loaded, result, 5)
    one = families.run(loaded, TextInput("Hello", 64))  # [CLS] hello [SEP]: one unit
    with pytest.raises(ValueError, match="single token"):
        explainable.explainable(loaded, one, None)
    with pytest.raises(ValueError, match="replaced by"):
        explainable.explainable(loaded, result, None, "blur")


# --- translation --------------------------------------------------------------------------------------------------

def _normalised(relevance: np.ndarray) -> np.ndarray:
    hat = relevance - np.eye(len(relevance))
    sums = hat.sum(1, keepdims=True)
    return np.divide(hat, sums, out=np.zeros_like(hat), where=np.abs(sums) > 1e-12) + np.eye(len(relevance))


def _by_hand(encoder_maps, decoder_maps, cross_maps) -> np.ndarray:
    """Chefer et al. 2021b's encoder–decoder rules with plain attention (eqs. 6–11), written out in NumPy."""
    r_ss = np.eye(encoder_maps[0].shape[-1])
    for a in encoder_maps:
        r_ss = r_ss + a.mean(0) @ r_ss
    t, s = cross_maps[0].shape[-2:]
    r_qq, r_qs = np.eye(t), np.zeros((t, s))
    for self_a, cross_a in zip(decoder_maps, cross_maps):
        r_qq, r_qs = r_qq + self_a.mean(0) @ r_qq, r_qs + self_a.mean(0) @ r_qs
        r_qs = r_qs + _normalised(r_qq).T @ cross_a.mean(0) @ _normalised(r_ss)
    return r_qs


def test_encoder_decoder_rollout_by_hand_and_with_ones():
    rng = np.random.default_rng(0)

    def maps(q, k, layers=2, heads=3):
        return [torch.tensor(rng.dirichlet(np.ones(k), size=(heads, q)), dtype=torch.float32) for _ in range(layers)]

    encoder, decoder, cross = maps(5, 5), maps(4, 4), maps(4, 5)
    plain = relevance.encoder_decoder_rollout(encoder, decoder, cross)
    np.testing.assert_allclose(plain.numpy(), _by_hand([a.numpy() for a in encoder], [a.numpy() for a in decoder],
                                                       [a.numpy() for a in cross]), rtol=1e-5, atol=1e-6)
    ones = {"encoder": [torch.ones_like(a) for a in encoder], "decoder": [torch.ones_like(a) for a in decoder],
            "cross": [torch.ones_like(a) for a in cross]}
    with_ones = relevance.encoder_decoder_rollout(encoder, decoder, cross, ones)
    torch.testing.assert_close(with_ones, plain)


def test_translation_records_kinds_and_rollout_on_the_model(translator):
    loaded, result = translator
    ex = explainable.explainable(loaded, result, 1)
    with torch.no_grad(), ex.record() as layers:
        ex.logits(ex.embeddings)
    kinds = [record.kind for record in layers]
    config = loaded.model.config
    assert kinds == ["encoder"] * config.encoder_layers + ["decoder", "cross"] * config.decoder_layers
    by_kind = {kind: [r.attention[0].float() for r in layers if r.kind == kind] for kind in ("encoder", "decoder",
                                                                                             "cross")}
    for kind in by_kind:  # the capture engine's maps (recomputed from q, k and the mask): an independent path
        for index, attention in enumerate(by_kind[kind]):
            np.testing.assert_allclose(attention.numpy(), result.maps(kind).layer(index), atol=1e-5)
    found = attribution.explain(ex, ("rollout", "raw_attention", "value_norms"))
    expected = _by_hand(*[[a.numpy() for a in by_kind[k]] for k in ("encoder", "decoder", "cross")])
    np.testing.assert_allclose(found.scores["rollout"], expected[ex.query, list(ex.units)], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(found.scores["raw_attention"],
                               by_kind["cross"][-1].mean(0)[ex.query, list(ex.units)].numpy(), atol=1e-6)
    chosen = attribution.explain(ex, ("raw_attention",), layer=0, head=1)  # the page's layer and head pickers
    np.testing.assert_allclose(chosen.scores["raw_attention"], by_kind["cross"][0][1, ex.query, list(ex.units)].numpy(),
                               atol=1e-6)
    assert chosen.raw_attention.as_dict() == {"layer": 0, "head": 1, "attention": "decoder cross-attention"}
    cross = [r for r in layers if r.kind == "cross"][-1]
    by_hand = [float((cross.attention[0][:, ex.query, j, None] * cross.values[0][:, j]).sum(0).norm())
               for j in ex.units]
    np.testing.assert_allclose(found.scores["value_norms"], by_hand, rtol=1e-4)


def test_translation_ig_completeness_and_curve_endpoints(translator):
    loaded, result = translator
    position = translation_explain.output_choices(result)[1][0]
    ex = explainable.explainable(loaded, result, position)
    assert ex.target == result.output.output_ids[position]
    found = attribution.explain(ex, ("integrated_gradients",), ig_steps=128)
    with torch.no_grad():
        difference = float(ex.logits(ex.embeddings)[0, ex.target] - ex.logits(ex.baseline)[0, ex.target])
    assert abs(found.scores["integrated_gradients"].sum() - difference) <= 0.01 * abs(difference)
    table = faithfulness.faithfulness(ex, "mini", "sentence", steps=5, seeds=5, ig_steps=8)
    assert table.probability == pytest.approx(result.generation[position].probability, rel=1e-4)
    assert set(table.curves) == set(SHARED) - {"alti"} | {"value_zeroing"}
    for curves in [*table.curves.values(), *table.random]:
        assert curves.deletion[0] == pytest.approx(table.probability, rel=1e-4)
        assert curves.insertion[-1] == pytest.approx(table.probability, rel=1e-4)


def test_translation_bad_input(translator):
    loaded, result = translator
    with pytest.raises(ValueError, match="does not exist"):
        explainable.explainable(loaded, result, len(result.output.output_ids))
    with pytest.raises(ValueError, match="output position"):
        explainable.explainable(loaded, result, "sur")
    with pytest.raises(ValueError, match="not available"):
        attribution.explain(explainable.explainable(loaded, result, 0), ("alti",))
    one = replace(result, output=replace(result.output, source_ids=result.output.source_ids[:1] +
                                         [loaded.tokenizer.eos_token_id]))
    with pytest.raises(ValueError, match="single token"):
        explainable.explainable(loaded, one, 0)
    gru = families.load(next(s for s in families.specs("translation") if s.id == "translation/gru-attention"))
    with pytest.raises(ValueError, match="GRU"):
        explainable.explainable(gru, families.run(gru, TextInput(SOURCE, 64)), 0)


# --- the CLI contract ---------------------------------------------------------------------------------------------

def test_cli_attribution_and_faithfulness(tmp_path):
    from app import cli

    assert cli.main(["--page", "encoder", "--text", SENTENCE, "--view", "faithfulness", "--format", "json",
                     "--out", str(tmp_path), "--steps", "5", "--ig_steps", "8"]) == 0
    written = json.loads(next(tmp_path.glob("*faithfulness*.json")).read_text())
    assert set(written["methods"]) == {*SHARED, "random"}
    assert all(0 <= m["deletion_auc"] <= 1 and 0 <= m["insertion_auc"] <= 1 for m in written["methods"].values())
    assert cli.main(["--page", "translation", "--model", "mini Transformer en→fr", "--text", SOURCE, "--view",
                     "attribution", "--method", "gradient_rollout", "--target", "1", "--format", "json,png",
                     "--out", str(tmp_path / "tr")]) == 0
    written = json.loads(next((tmp_path / "tr").glob("*.json")).read_text())
    assert written["method"] == "gradient_rollout" and len(written["scores"]) == len(written["tokens"])
    assert cli.main(["--page", "translation", "--model", "mini Transformer en→fr", "--text", SOURCE, "--view",
                     "attribution", "--method", "alti", "--out", str(tmp_path / "bad")]) != 0
    assert cli.main(["--page", "translation", "--model", "mini Transformer en→fr", "--text", SOURCE, "--view",
                     "attribution", "--method", "value_zeroing", "--target", "1", "--format", "json",
                     "--out", str(tmp_path / "vz")]) == 0
    written = json.loads(next((tmp_path / "vz").glob("*.json")).read_text())
    assert written["what"] == METHODS["value_zeroing"].what
    assert sum(written["scores"]) == pytest.approx(1)
    assert cli.main(["--page", "translation", "--model", "mini Transformer en→fr", "--text", SOURCE, "--view",
                     "faithfulness", "--format", "json", "--target", "1", "--steps", "5", "--ig_steps", "8",
                     "--out", str(tmp_path / "trf")]) == 0
    written = json.loads(next((tmp_path / "trf").glob("*faithfulness*.json")).read_text())
    assert set(written["methods"]) == {*translation_explain.ENCODER_DECODER_METHODS, "random"}
    assert "value_zeroing" in written["methods"] and "alti" not in written["methods"]


# --- the pages ----------------------------------------------------------------------------------------------------

def test_the_encoder_and_translation_pages_show_the_section(patched_loader):
    from streamlit.testing.v1 import AppTest

    from tests.conftest import ROOT

    at = AppTest.from_file(str(ROOT / "app" / "views" / "encoder.py"), default_timeout=180)
    at.query_params.update({"encoder_faith": "True", "enc_faith_steps": "5", "enc_faith_ig_steps": "8"})
    at.run()
    assert not at.exception, at.exception
    assert any("deletion AUC (lower better)" in frame.value.columns for frame in at.dataframe)
    assert any("masked-LM head" in caption.value for caption in at.caption)
    at.radio(key="enc_faith_target").set_value("the embedding of another sentence").run()
    assert not at.exception, at.exception
    at.slider(key="enc_faith_raw_layer").set_value(1).run()
    at.selectbox(key="enc_faith_raw_head").set_value(2).run()
    assert not at.exception, at.exception
    table = next(f.value for f in at.dataframe if "what" in f.value.columns)
    assert dict(zip(table["method"], table["what"]))["Raw attention"] == "raw attention (layer 1, head 2)"
    assert any("deletion AUC (lower better)" in frame.value.columns for frame in at.dataframe)

    at = AppTest.from_file(str(ROOT / "app" / "views" / "translation.py"), default_timeout=180)
    at.query_params.update({"tr_view": "Faithfulness", "tr_faith_steps": "5", "tr_faith_ig_steps": "8"})
    at.run()
    assert not at.exception, at.exception
    assert any("deletion AUC (lower better)" in frame.value.columns for frame in at.dataframe)
    assert at.selectbox(key="tr_faith_target").value == 0
    # raw attention's layer and head, kept in the URL, name the decoder's cross-attention in the table
    at = AppTest.from_file(str(ROOT / "app" / "views" / "translation.py"), default_timeout=180)
    at.query_params.update({"tr_view": "Faithfulness", "tr_faith_steps": "5", "tr_faith_ig_steps": "8",
                            "tr_faith_raw_layer": "0", "tr_faith_raw_head": "1"})
    at.run()
    assert not at.exception, at.exception
    assert at.select_slider(key="tr_faith_raw_layer").value == 0 and at.selectbox(key="tr_faith_raw_head").value == 1
    table = next(f.value for f in at.dataframe if "what" in f.value.columns)
    what = dict(zip(table["method"], table["what"]))
    assert what["Raw attention"] == "raw attention (decoder cross-attention layer 0, head 1)"
    assert what["Value zeroing"] == METHODS["value_zeroing"].what and "ALTI" not in what


def test_translation_value_zeroing_against_hooks_one_token_at_a_time(translator):
    """Value zeroing against a brute-force loop: for each source token, a forward hook zeroes its row of every
    cross-attention's v_proj output (SDPA path, not the eager override), and the LM head's input is read."""
    loaded, result = translator
    model, output = loaded.model, result.output
    position = translation_explain.output_choices(result)[1][0]
    ex = explainable.explainable(loaded, result, position)
    found = attribution.explain(ex, ("value_zeroing", "raw_attention"))
    source = torch.tensor([output.source_ids])
    decoder_ids = torch.tensor([[model.config.decoder_start_token_id, *output.output_ids[:-1]]])
    zero_at: list[int] = []

    def zero(module, args, out):
        if zero_at:
            out = out.clone()
            out[:, zero_at[0]] = 0
        return out

    def head_input(module, args):
        kept.append(args[0][0, position].clone())

    kept: list[torch.Tensor] = []
    handles = [layer.encoder_attn.v_proj.register_forward_hook(zero) for layer in model.get_decoder().layers]
    handles.append(model.lm_head.register_forward_pre_hook(head_input))
    try:
        with torch.no_grad():
            for j in [None, *ex.units]:
                zero_at[:] = [] if j is None else [j]
                model(input_ids=source, attention_mask=torch.ones_like(source), decoder_input_ids=decoder_ids,
                      use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    reference, rest = kept[0], torch.stack(kept[1:])
    distance = (1 - torch.nn.functional.cosine_similarity(rest, reference[None], dim=-1)).clamp(min=0).numpy()
    expected = distance / distance.sum()
    np.testing.assert_allclose(found.scores["value_zeroing"], expected, rtol=1e-3, atol=1e-6)
    assert found.scores["value_zeroing"].sum() == pytest.approx(1.0, abs=1e-5)
    assert not np.allclose(found.scores["value_zeroing"], found.scores["raw_attention"], atol=1e-3)
    shared = replace(ex, methods=tuple(SHARED), zeroed=None)  # what the other families offer
    with pytest.raises(ValueError, match="not available"):
        attribution.explain(shared, ("value_zeroing",))
