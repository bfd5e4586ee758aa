"""Decoding penalties: each processor against a hand-applied one (loops over the vocabulary), transformers' own
repetition penalty and beam scores; generation with the penalties equals a hand-written greedy loop; the
before/after views read the model's real distribution; the GPT page offers them (AppTest, tiny model)."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from models import families
from models.analysis import penalties
from models.core import decoding
from models.core.inputs import TextInput
from models.core.specs import ModelSpec
from models.families.causal_lm.model import GenerationSettings
from viz.figures import build
from viz.figures.decoding import LengthOptions, PenaltyOptions


def _ids_and_scores(vocab: int = 30, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.tensor([[3, 5, 5, 7, 1, 5, 9, 3], [2, 2, 2, 4, 6, 8, 8, 0]])
    return ids, torch.randn(2, vocab, generator=generator)


def _hand(ids, scores, prompt_length, rule):
    out = scores.clone()
    for b in range(ids.shape[0]):
        generated = ids[b, prompt_length:].tolist()
        for j in range(scores.shape[1]):
            out[b, j] = rule(float(scores[b, j]), generated.count(j), j in ids[b].tolist())
    return out


@pytest.mark.parametrize("prompt_length", [0, 3])
def test_presence_and_frequency_penalties_against_hand_applied(prompt_length):
    ids, scores = _ids_and_scores()
    presence = decoding.PresencePenalty(0.7, prompt_length)(ids, scores)
    frequency = decoding.FrequencyPenalty(0.4, prompt_length)(ids, scores)
    assert torch.allclose(presence, _hand(ids, scores, prompt_length, lambda s, c, _: s - 0.7 * (c > 0)))
    assert torch.allclose(frequency, _hand(ids, scores, prompt_length, lambda s, c, _: s - 0.4 * c))
    assert frequency[0, 5] == pytest.approx(float(scores[0, 5]) - 0.4 * (3 if prompt_length == 0 else 1))


def test_repetition_penalty_against_hand_applied_and_transformers():
    from transformers import RepetitionPenaltyLogitsProcessor

    ids, scores = _ids_and_scores(seed=1)
    ours = decoding.RepetitionPenalty(1.3)(ids, scores)
    assert torch.allclose(ours, _hand(ids, scores, 0, lambda s, c, seen: (s / 1.3 if s > 0 else s * 1.3)
                                      if seen else s))
    assert torch.allclose(ours, RepetitionPenaltyLogitsProcessor(1.3)(ids, scores.clone()))
    with pytest.raises(ValueError, match="above 0"):
        decoding.RepetitionPenalty(0)


@pytest.fixture(scope="module")
def tiny(tiny_folders):
    return families.load(ModelSpec("causal_lm", "tiny", "hub", str(tiny_folders["llama"]), "test", "random"))


@pytest.mark.parametrize("presence,frequency", [(0.8, 0.5), (-2.0, -2.0)])
def test_generation_with_presence_and_frequency_equals_a_hand_written_greedy_loop(tiny, presence, frequency):
    settings = GenerationSettings(max_new_tokens=8, presence_penalty=presence, frequency_penalty=frequency)
    result = families.run(tiny, TextInput("abcabcab", 64), settings)
    ids = list(result.token_ids[:result.prompt_length])
    for _ in range(len(result.generation)):
        with torch.inference_mode():
            logits = tiny.model(input_ids=torch.tensor([ids])).logits[0, -1].float()
        penalised = logits.clone()
        for j, count in Counter(ids[result.prompt_length:]).items():  # only generated tokens count
            penalised[j] -= presence + frequency * count
        ids.append(int(penalised.argmax()))
    assert tuple(ids) == result.token_ids
    if presence < 0:  # a negative penalty rewards what was generated: the random model starts repeating itself
        generated = result.token_ids[result.prompt_length:]
        assert len(set(generated)) < len(generated)


def test_penalty_view_reads_the_models_distribution(tiny):
    result = families.run(tiny, TextInput("abcabcab", 64), GenerationSettings(max_new_tokens=6))
    options = PenaltyOptions(step=4, presence=1.5, frequency=0.5, repetition=2.0, top=5)
    effect = penalties.penalty_effect(tiny, result, options)
    position = result.generation[3].position
    with torch.inference_mode():
        logits = tiny.model(input_ids=torch.tensor([result.token_ids[:position]])).logits[0, -1].float()
    generated = list(result.token_ids[result.prompt_length:position])
    context = list(result.token_ids[:position])
    hand = {name: logits.clone() for name in ("presence", "frequency", "repetition")}
    for j, count in Counter(generated).items():
        hand["presence"][j] -= 1.5
        hand["frequency"][j] -= 0.5 * count
    for j in set(context):
        hand["repetition"][j] = logits[j] / 2 if logits[j] > 0 else logits[j] * 2
    np.testing.assert_allclose(effect.before, torch.softmax(logits, -1)[effect.candidates].numpy(), rtol=1e-5)
    for name, values in hand.items():
        expected = torch.softmax(values, -1)[effect.candidates].numpy()
        np.testing.assert_allclose(effect.after[name], expected, rtol=1e-4, atol=1e-7)
    assert list(effect.counts) == [generated.count(int(i)) for i in effect.candidates]
    figure = build("decoding_penalties", effect, options)
    assert set(figure.table()["token"]) == set(effect.labels)
    with pytest.raises(ValueError, match="does not exist"):
        penalties.penalty_effect(tiny, result, PenaltyOptions(step=9))
    with pytest.raises(ValueError, match="Generate a continuation first"):
        penalties.penalty_effect(tiny, families.run(tiny, TextInput("abc", 64)), options)


@pytest.mark.parametrize("alpha", [0.0, 2.0])
def test_length_penalty_scores_against_hand_applied_and_transformers(tiny, alpha):
    result = families.run(tiny, TextInput("abcabcab", 64), GenerationSettings(max_new_tokens=5))
    beams = penalties.beam_hypotheses(tiny, result, LengthOptions(alpha=alpha, beams=3))
    np.testing.assert_allclose(beams.scores, beams.sum_logprobs / beams.lengths.astype(float) ** alpha)
    np.testing.assert_allclose(beams.scores, beams.library_scores, rtol=1e-4)  # transformers ranks by the same
    assert decoding.length_penalised_score(-6.0, 3, 1.0) == -2.0
    figure = build("length_penalty", beams, LengthOptions(alpha=alpha, beams=3))
    assert list(figure.table()["score"]) == list(beams.scores)


def test_gpt_page_generate_tab_offers_the_penalty_views(patched_loader, offered, fresh_caches):
    from streamlit.testing.v1 import AppTest

    from tests.conftest import ROOT

    at = AppTest.from_file(str(ROOT / "app" / "views" / "gpt.py"), default_timeout=180)
    at.query_params.update({"gpt_text": "abcabcab", "gpt_tab": "Generate and step through", "gpt_pen_step": "2"})
    at.run()
    at.button[0].click().run()  # the form's Generate button
    assert not at.exception, at.exception
    assert {"gpt_penalties", "gpt_length_penalty"} <= set(offered)
    assert "step-2" in offered["gpt_penalties"].stem


def test_generation_settings_round_trip_through_a_link(patched_loader, offered, fresh_caches):
    """The generation form's settings, the fact that it was generated and the step shown go into the URL; a fresh
    session opened from that URL generates the same continuation with the same settings, with no click."""
    from streamlit.testing.v1 import AppTest

    from app.sections import generation
    from tests.conftest import ROOT

    chosen = {"gpt_gen_strategy": "beam search", "gpt_gen_max_new": 4, "gpt_gen_beams": 3,
              "gpt_gen_repetition": 1.5, "gpt_gen_temperature": 0.6, "gpt_gen_top_k": 7, "gpt_gen_top_p": 0.85,
              "gpt_gen_seed": 11, "gpt_gen_presence": 0.4, "gpt_gen_frequency": -0.3, "gpt_gen_length": 2.5}
    at = AppTest.from_file(str(ROOT / "app" / "views" / "gpt.py"), default_timeout=180)
    at.query_params.update({"gpt_text": "abcabcab", "gpt_tab": "Generate and step through"})
    at.run()
    for key, value in chosen.items():
        widget = at.selectbox(key=key) if key.endswith("strategy") else at.number_input(key=key)
        widget.set_value(value)
    at.button[0].click().run()  # the form's Generate button
    assert not at.exception, at.exception
    at.slider(key="gpt_step").set_value(3).run()
    first = at.text[0].value
    assert first.startswith("abcabcab"), first  # the prompt and its continuation
    link = {name: at.query_params[name] for name in at.query_params}
    assert all(link[key] == str(value) for key, value in chosen.items()), link
    assert link["gpt_generated"] == "True" and link["gpt_step"] == "3"
    expected = generation.settings(chosen)
    assert (expected.strategy, expected.num_beams, expected.presence_penalty, expected.length_penalty) == \
        ("beam search", 3, 0.4, 2.5)

    again = AppTest.from_file(str(ROOT / "app" / "views" / "gpt.py"), default_timeout=180)
    again.query_params.update(link)
    again.run()  # no click: the link says it was generated
    assert not again.exception, again.exception
    assert generation.settings(again.session_state) == expected
    assert again.text[0].value == first
    assert again.slider(key="gpt_step").value == 3
    assert all(again.number_input(key=key).value == value for key, value in chosen.items() if key != "gpt_gen_strategy")
    assert again.selectbox(key="gpt_gen_strategy").value == "beam search"
