"""Corpus mode: statistics against eager maps, readers that skip what they cannot read, Parquet resume, MoE routing."""
from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest
import torch

from models.corpus import engine, readers, statistics
from models.corpus.analysis import (
    query_key_embedding,
    search_heads,
    summarize,
    top_examples,
)
from models.corpus.readers import Corpus, Document
from models.corpus.store import ResultStore, stacked

TEXTS = ["the cat sat on the mat. the dog sat on the log. the cat sat on the mat.",
         "a quick brown fox jumps over the lazy dog!",
         "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b",
         "one two three four five six seven eight nine ten one two three four",
         "x", "the the the the the the the the"]


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    """A 2-layer Llama (GQA, RoPE) loaded through the app's loader, and the same weights as an eager model."""
    from transformers import LlamaForCausalLM

    from models import families
    from models.core.specs import ModelSpec
    from tests.tiny_text_models import save_tiny_causal_lm

    folder = save_tiny_causal_lm(tmp_path_factory.mktemp("corpus") / "llama")
    spec = ModelSpec("causal_lm", "tiny-llama", "hub", str(folder), "test", "random weights")
    loaded = families.get("causal_lm").load(spec, "cpu", "float32")
    eager = LlamaForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    return loaded, eager


def corpus_of(texts, name="test") -> Corpus:
    return Corpus(name, [Document(f"doc#{i}", t, "test") for i, t in enumerate(texts)], [])


def test_statistics_equal_a_direct_computation_from_eager_maps(tiny_lm):
    loaded, eager = tiny_lm
    runner = statistics.StatisticsRunner(loaded, max_tokens=64)
    results, skipped = runner.run(corpus_of(TEXTS).documents)  # batched with padding
    assert not skipped and len(results) == len(TEXTS)
    saw_induction = False
    for item in results:
        reference = statistics.eager_statistics(eager, item.token_ids)
        for name in statistics.STATISTICS:
            np.testing.assert_allclose(item.statistics[name], reference[name], rtol=1e-4, atol=1e-5,
                                       err_msg=f"{item.doc_id} {name}")
        np.testing.assert_allclose(item.peak_value, reference["peak_value"], rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(item.peak_query, reference["peak_query"])
        np.testing.assert_array_equal(item.peak_key, reference["peak_key"])
        saw_induction |= bool(np.isfinite(item.statistics["induction"]).all())
    assert saw_induction  # the repeated texts have induction targets
    single = results[4]  # "x": one or two tokens
    assert len(single.token_ids) <= 2


def test_batching_does_not_change_the_numbers(tiny_lm):
    loaded, _ = tiny_lm
    runner = statistics.StatisticsRunner(loaded, max_tokens=64, max_padding=100.0)  # padding allowed: real batches
    documents = corpus_of(TEXTS).documents
    lengths = sorted((len(runner.tokenize(d)) for d in documents), reverse=True)
    assert len(set(lengths)) > 1 and len(statistics.batches([(d, [0] * n) for d, n in zip(documents, lengths)],
                                                          max_padding=100.0)) < len(documents)
    batched, _ = runner.run(documents)
    for document, together in zip(corpus_of(TEXTS).documents, batched):
        (alone,), _ = runner.run([document])
        for name in statistics.STATISTICS:
            np.testing.assert_allclose(together.statistics[name], alone.statistics[name], rtol=1e-5, atol=1e-6)


def test_batches_keep_padding_within_a_tenth_of_their_own_tokens():
    documents = [(Document(str(i), "", "t"), [0] * n) for i, n in enumerate([182, 136, 125, 123, 98, 92, 90, 52, 50,
                                                                                  49, 30, 2])]
    groups = statistics.batches(documents)
    assert [len(ids) for group in groups for _, ids in group] == [len(ids) for _, ids in documents]  # order kept
    for group in groups:
        lengths = [len(ids) for _, ids in group]
        assert len(lengths) == 1 or max(lengths) * len(lengths) <= 1.1 * sum(lengths)
    assert [len(group) for group in groups] == [1, 3, 3, 3, 1, 1]
    # a corpus of alike lengths still fills the groups up to MAX_BATCH_DOCUMENTS
    alike = [(Document(str(i), "", "t"), [0] * (100 - i // 4)) for i in range(32)]
    assert [len(group) for group in statistics.batches(alike)] == [statistics.MAX_BATCH_DOCUMENTS] * 4
    assert len(statistics.batches(documents, max_padding=100.0)) < len(groups)  # padding allowed: fuller groups


def _zip_bomb() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("bomb.txt", b"a" * (50 * 2**20))  # 50 MB of one letter: ~50 kB compressed
        archive.writestr("fine.txt", "a fine paragraph inside the zip.")
    return buffer.getvalue()


def test_unreadable_files_are_skipped_with_a_reason_and_the_run_goes_on(tiny_lm, tmp_path):
    loaded, _ = tiny_lm
    folder = tmp_path / "input"
    folder.mkdir()
    (folder / "empty.txt").write_bytes(b"")
    (folder / "binary.txt").write_bytes(bytes(range(256)) * 10)
    (folder / "line.txt").write_bytes(b"word " * (2 * 2**20))  # 10 MB, one line
    (folder / "bomb.zip").write_bytes(_zip_bomb())
    (folder / "good.txt").write_text("the cat sat on the mat.\n\nthe dog sat on the log.")
    (folder / "lines.jsonl").write_text('{"text": "one two three"}\nnot json\n{"other": 1}\n')
    corpus = readers.read_folder(folder)
    reasons = {s.doc_id: s.reason for s in corpus.skipped}
    assert "empty" in reasons["empty.txt"]
    assert "binary" in reasons["binary.txt"]
    assert "limit" in reasons["line.txt#0"]
    assert "zip bomb" in reasons["bomb.zip/bomb.txt"]
    assert "not JSON" in reasons["lines.jsonl#1"] and "text" in reasons["lines.jsonl#2"]
    assert [d.doc_id for d in corpus.documents] == ["bomb.zip/fine.txt#0", "good.txt#0", "good.txt#1",
                                                    "lines.jsonl#0"]
    store = engine.run_corpus(corpus, loaded, tmp_path / "results", max_tokens=32)
    frame = store.table()
    assert set(frame[frame.status == "ok"].doc_id) == {d.doc_id for d in corpus.documents}
    recorded = dict(zip(frame[frame.status == "skipped"].doc_id, frame[frame.status == "skipped"].reason))
    assert recorded == reasons


def test_a_killed_run_resumes_to_the_numbers_of_an_uninterrupted_run(tiny_lm, tmp_path):
    loaded, _ = tiny_lm
    corpus = corpus_of(TEXTS * 3)
    whole = engine.run_corpus(corpus, loaded, tmp_path / "whole", max_tokens=64, batch_documents=4)

    class Killed(Exception):
        pass

    def kill_after_two_batches(progress):
        if progress.done >= 8:
            (tmp_path / "killed" / "part-000099.parquet.tmp").write_bytes(b"half a file")  # a write in flight
            raise Killed

    with pytest.raises(Killed):
        engine.run_corpus(corpus, loaded, tmp_path / "killed", max_tokens=64, batch_documents=4,
                          progress=kill_after_two_batches)
    assert len(ResultStore.open(tmp_path / "killed").done()) == 8  # nothing after the kill, nothing lost before it
    seen = []
    resumed = engine.run_corpus(corpus, loaded, tmp_path / "killed", max_tokens=64, batch_documents=4,
                                progress=seen.append)
    assert seen[-1].total == len(corpus.documents) - 8  # only what was missing
    a, b = whole.table().set_index("doc_id"), resumed.table().set_index("doc_id")
    assert sorted(a.index) == sorted(b.index)
    for name in statistics.STATISTICS:
        left = stacked(a.loc[sorted(a.index)].reset_index(), name, whole.info)
        right = stacked(b.loc[sorted(b.index)].reset_index(), name, resumed.info)
        np.testing.assert_allclose(left, right, rtol=1e-6, equal_nan=True)
    summary_a, summary_b = summarize(whole), summarize(resumed)
    assert summary_a.documents == summary_b.documents == len(corpus.documents)
    np.testing.assert_allclose(summary_a.mean["entropy_bits"], summary_b.mean["entropy_bits"], rtol=1e-6)


def test_cancel_keeps_what_was_written_and_a_different_model_is_refused(tiny_lm, tmp_path):
    loaded, _ = tiny_lm
    corpus = corpus_of(TEXTS * 2)
    engine.run_corpus(corpus, loaded, tmp_path / "r", max_tokens=64, batch_documents=3, should_stop=lambda: True)
    assert len(ResultStore.open(tmp_path / "r").done()) == 3
    with pytest.raises(ValueError, match="another results folder"):
        engine.run_corpus(corpus, loaded, tmp_path / "r", max_tokens=32)


def test_summary_top_examples_and_the_cli_json_shape(tiny_lm, tmp_path):
    loaded, eager = tiny_lm
    corpus = corpus_of(TEXTS)
    store = engine.run_corpus(corpus, loaded, tmp_path / "r", max_tokens=64)
    summary = summarize(store)
    table = summary.heads_table()
    assert len(table) == 2 * 4 and {"entropy_bits", "entropy_bits_std", "induction"} <= set(table.columns)
    # mean over documents of the eager numbers
    per_doc = [statistics.eager_statistics(eager, statistics.StatisticsRunner(loaded, 64).tokenize(d))
               for d in corpus.documents]
    np.testing.assert_allclose(summary.mean["first_token"], np.mean([r["first_token"] for r in per_doc], 0),
                               rtol=1e-4)
    np.testing.assert_allclose(summary.spread["mean_distance"], np.std([r["mean_distance"] for r in per_doc], 0),
                               rtol=1e-3, atol=1e-5)
    examples = top_examples(store, loaded.tokenizer, 1, 2, count=3)
    assert len(examples) == 3 and examples.peak_weight.is_monotonic_decreasing
    best = max(per_doc, key=lambda r: r["peak_value"][1, 2])
    assert examples.peak_weight[0] == pytest.approx(best["peak_value"][1, 2], rel=1e-4)


def test_search_ranks_the_head_that_attends_from_a_to_b(tiny_lm):
    loaded, eager = tiny_lm
    corpus = corpus_of(TEXTS)
    ranked, searched = search_heads(loaded, corpus.documents, "sat", "cat", regex=False, max_tokens=64)
    assert searched == 1 and len(ranked) == 8 and ranked.share.is_monotonic_decreasing
    # direct: the eager maps of the one document with both tokens
    runner = statistics.StatisticsRunner(loaded, 64)
    ids = runner.tokenize(corpus.documents[0])
    from models.core import text

    tokens = [t.strip() for t in text.display_tokens(loaded.tokenizer, ids)]
    a = [i for i, t in enumerate(tokens) if t == "sat"]
    b = [i for i, t in enumerate(tokens) if t == "cat"]
    with torch.inference_mode():
        maps = eager(input_ids=torch.tensor([ids]), output_attentions=True).attentions
    expected = np.array([[m[0, h][a][:, b].sum(-1).mean().item() for h in range(4)] for m in maps])
    top = ranked.iloc[0]
    assert top.share == pytest.approx(expected.max(), rel=1e-4)
    assert (int(top["layer"]), int(top["head"])) == np.unravel_index(expected.argmax(), expected.shape)
    with pytest.raises(ValueError, match="regular expression"):
        search_heads(loaded, corpus.documents, "(", "cat", regex=True)


def test_joint_embedding_keeps_scores_and_shares_one_space(tiny_lm):
    loaded, _ = tiny_lm
    embedding = query_key_embedding(loaded, corpus_of(TEXTS).documents, 1, 3, max_tokens=64)
    n = len(embedding.kind)
    assert embedding.points.shape == (n, 2) and embedding.method == "pca"
    assert embedding.kind.count("query") == embedding.kind.count("key")
    queries = embedding.points[np.array(embedding.kind) == "query"]
    keys = embedding.points[np.array(embedding.kind) == "key"]
    np.testing.assert_allclose(queries.mean(0), keys.mean(0), atol=1e-3)  # centroids moved together
    with pytest.raises(ValueError, match="no head"):
        query_key_embedding(loaded, corpus_of(TEXTS).documents, 5, 0)


def test_moe_expert_load_coactivation_and_entropy_equal_the_moe_page(tmp_path):
    from models import families
    from models.analysis import routing as routing_stats
    from models.core.inputs import TextInput
    from models.families.moe import model as moe

    loaded = families.load(families.default_spec("moe"))
    texts = ["The old man walked to the harbour.", "def f(x):\n    return x + 1", "3 + 4 = 7"]
    corpus = corpus_of(texts)
    store = engine.run_corpus(corpus, loaded, tmp_path / "moe", max_tokens=64)
    info = store.info
    assert info.experts == 8 and info.moe_layers == 4
    frame = store.table()
    load = stacked(frame, "expert_load", info)
    coactivation = stacked(frame, "coactivation", info)
    entropy = stacked(frame, "router_entropy", info)
    for index, text_ in enumerate(texts):
        routing = moe.run(loaded, TextInput(text_, 64)).routing
        np.testing.assert_allclose(load[index], routing_stats.expert_load(routing.top_experts, 8), atol=1e-6)
        np.testing.assert_allclose(coactivation[index, 2], routing_stats.coactivation(routing.top_experts[2], 8),
                                   atol=1e-6)
        np.testing.assert_allclose(entropy[index], routing_stats.router_entropy(routing.probs).mean(-1), rtol=1e-4)
    summary = summarize(store)
    np.testing.assert_allclose(summary.moe["expert_load"].sum(-1), 1.0, rtol=1e-5)


def test_bundled_corpora_are_offline_and_named_with_their_licence():
    docs = readers.bundled("python-docs")
    assert 1000 <= len(docs.documents) <= 1500 and "PSF" in docs.licence
    assert len({d.doc_id for d in docs.documents}) == len(docs.documents)
    assert len(readers.bundled("translation", 50).documents) == 50
    assert len(readers.bundled("moe-mix", 20).documents) == 20
    with pytest.raises(ValueError, match="no bundled corpus"):
        readers.bundled("nope")
    assert json.dumps([d.text for d in docs.documents[:3]])


def test_cli_writes_the_heads_json_and_resumes(allowed_dirs, tmp_path, capsys):
    from app import cli
    from tests.tiny_text_models import save_tiny_causal_lm

    model = save_tiny_causal_lm(allowed_dirs / "lm")
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "a.txt").write_text("\n\n".join([TEXTS[0], TEXTS[1], TEXTS[3], TEXTS[5]]))
    (inputs / "empty.txt").write_bytes(b"")
    argv = ["--page", "corpus", "--input", str(inputs), "--engine", "local", "--model", str(model), "--format",
            "json", "--out", str(tmp_path / "out"), "--max-tokens", "64"]
    assert cli.main(argv) == 0
    written = sorted((tmp_path / "out").glob("corpus_*.json"))
    data = json.loads(written[0].read_text())
    assert data["documents"] == 4 and data["tokens"] > 0 and len(data["heads"]) == 8
    assert data["skipped"] == [{"doc_id": "empty.txt", "reason": "empty file"}]
    assert {"layer", "head", "entropy_bits", "mean_distance", "first_token", "previous_token",
            "induction"} <= set(data["heads"][0])
    assert cli.main(argv) == 0  # a re-run finds everything done
    assert "0/0 documents" in capsys.readouterr().err
    assert cli.main(argv[:-4] + ["--bogus", "1"]) == 2
    results = next((tmp_path / "out").glob("results-*"))
    reopened = tmp_path / "reopened"
    assert cli.main(["--page", "corpus", "--results", str(results), "--format", "json,csv", "--out",
                     str(reopened)]) == 0
    again = json.loads(next(reopened.glob("corpus_*.json")).read_text())
    assert again["heads"] == data["heads"] and len(list(reopened.glob("*.csv"))) == 1


def test_cli_draws_every_corpus_view_and_reads_search_and_embedding_in_the_run(allowed_dirs, tmp_path):
    """Each corpus view is reachable with --view; with --input the A→B search and the query–key embedding are read
    in the statistics' own pass, and reopening the folder later (a pass of their own) gives the same numbers."""
    from app import cli
    from tests.tiny_text_models import save_tiny_causal_lm

    model = save_tiny_causal_lm(allowed_dirs / "lm")
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "a.txt").write_text("\n\n".join(TEXTS))
    run = ["--page", "corpus", "--input", str(inputs), "--model", str(model), "--max-tokens", "64"]
    out, results = tmp_path / "run", tmp_path / "results"
    search = ["--view", "corpus_search", "--a", "the", "--b", "the", "--format", "json"]
    assert cli.main([*run, "--results", str(results), *search, "--out", str(out)]) == 0
    in_pass = json.loads(next(out.glob("*.json")).read_text())
    assert in_pass["documents"] >= 2 and len(in_pass["heads"]) == 8
    assert cli.main(["--page", "corpus", "--results", str(results), *search, "--out", str(tmp_path / "again")]) == 0
    again = json.loads(next((tmp_path / "again").glob("*.json")).read_text())
    assert [h["share"] for h in again["heads"]] == pytest.approx([h["share"] for h in in_pass["heads"]], rel=1e-5)
    embedding = ["--view", "corpus_embedding", "--layer", "1", "--head", "2", "--format", "npz"]
    fresh = tmp_path / "fresh"  # a new folder: the embedding is read in this run's pass
    assert cli.main([*run, "--results", str(fresh), *embedding, "--out", str(tmp_path / "e1")]) == 0
    assert cli.main(["--page", "corpus", "--results", str(fresh), *embedding, "--out", str(tmp_path / "e2")]) == 0
    first = np.load(next((tmp_path / "e1").glob("*.npz")))["points"]
    second = np.load(next((tmp_path / "e2").glob("*.npz")))["points"]
    np.testing.assert_allclose(np.abs(first), np.abs(second), atol=1e-4)  # PCA axes may flip sign
    for view, extra in (("corpus_heads", ["--statistic", "induction"]), ("corpus_top", ["--layer", "1"])):
        folder = tmp_path / view
        assert cli.main(["--page", "corpus", "--results", str(results), "--view", view, *extra, "--format",
                         "json,csv", "--out", str(folder)]) == 0
        assert len(list(folder.glob("*.json"))) == 1 and len(list(folder.glob("*.csv"))) == 1
    assert cli.main(["--page", "corpus", "--results", str(results), "--view", "corpus_experts", "--format", "json",
                     "--out", str(tmp_path / "x")]) == 2  # not an MoE model: a message, not a traceback
    assert cli.main(["--page", "corpus", "--results", str(results), "--view", "nope"]) == 2


def test_ray_actors_take_one_gpu_each_when_the_cluster_has_gpus():
    assert engine.actor_resources(4, "cpu", 8) == ("cuda", 1, 4)  # a GPU each, no more actors than GPUs
    assert engine.actor_resources(8, "cuda", 2) == ("cuda", 1, 2)
    assert engine.actor_resources(0, "cpu", 3) == ("cpu", 0, 3)  # one core each
    with pytest.raises(ValueError, match="has none"):
        engine.actor_resources(0, "cuda", 2)


def test_gpu_batches_are_sized_to_free_memory(tiny_lm, monkeypatch):
    from models.corpus import forward

    loaded, _ = tiny_lm
    assert forward.BatchLimits.for_device(loaded.model, "cpu", 256) == forward.BatchLimits()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (8 * 2**30, 16 * 2**30))
    limits = forward.BatchLimits.for_device(loaded.model, "cuda", 256)
    per_token = forward.bytes_per_token(loaded.model, 256)
    assert limits.tile_rows is None and limits.documents == forward.GPU_MAX_DOCUMENTS
    assert limits.tokens == min(int(0.5 * 8 * 2**30 / per_token), forward.GPU_MAX_DOCUMENTS * 256)
    assert limits.tokens > forward.MAX_BATCH_TOKENS
