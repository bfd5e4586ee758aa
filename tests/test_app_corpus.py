"""AppTest of the corpus page with the loader patched to a tiny model: run, resume, heads, embedding, search."""
from __future__ import annotations

from streamlit.testing.v1 import AppTest

from tests.conftest import ROOT


def _page() -> AppTest:
    return AppTest.from_file(str(ROOT / "app" / "views" / "corpus.py"), default_timeout=180)


def test_corpus_page_runs_resumes_and_shows_heads_embedding_and_search(patched_loader, fresh_caches, offered,
                                                                      tmp_path, monkeypatch):
    from tests.conftest import check_files

    monkeypatch.setenv("ATTN_EXPLORER_CACHE", str(tmp_path))
    at = _page()
    at.session_state["corpus_source"] = "translation"
    at.session_state["corpus_n"] = 12
    at.run()
    assert not at.exception, at.exception
    assert at.button(key="corpus_run").label == "Run"
    at.button(key="corpus_run").click().run()
    assert not at.exception, at.exception
    assert at.button(key="corpus_run").label == "Re-run (all done)"
    assert at.metric[0].value == "12" and int(at.metric[1].value.replace(",", "")) > 12  # documents, tokens
    # the shared pickers (widgets.layer_and_head), one head at a time: corpus means are per head
    assert at.slider(key="corpus_layer").value == 0 and at.selectbox(key="corpus_head").value == 0
    assert len(at.dataframe) == 2  # top examples and every head
    assert check_files(offered["corpus_map"])["json"]
    assert "[" in at.dataframe[0].value["query in context"][0]  # the token in its context
    # the tables name their columns in words, as the charts do (the CSV keeps its field names)
    headers = [str(name) for table in at.dataframe for name in table.value.columns]
    assert "Entropy (bits)" in headers and "Entropy (bits), spread" in headers
    assert not [name for name in headers if "_" in name], headers
    at.session_state["corpus_n"] = 20  # another N is another results folder: nothing done there yet
    at.run()
    assert any("0 of 20 documents done" in c.value for c in at.caption)
    at.session_state["corpus_n"] = 12
    at.session_state["corpus_view"] = "Query–key embedding"
    at.run()
    assert not at.exception, at.exception
    assert check_files(offered["corpus_qk"])["svg"]  # the click selection exports like any chart
    # the document's map under the embedding: the first embedded document, then another one picked (a click on a
    # point sets the same selectbox); its head map is that document's, as the GPT page would draw it
    documents = at.selectbox(key="corpus_qk_doc").options
    assert len(documents) > 1 and "corpus_doc_map" in offered
    first = offered["corpus_doc_map"].table()
    at.selectbox(key="corpus_qk_doc").select(documents[1]).run()
    assert not at.exception, at.exception
    assert not offered["corpus_doc_map"].table().equals(first)
    at.session_state["corpus_view"] = "Search A → B"
    at.session_state["corpus_a"] = "the"
    at.session_state["corpus_b"] = "the"
    at.run()
    at.button(key="corpus_search").click().run()
    assert not at.exception, at.exception
    assert "corpus_search_fig" in offered


def test_corpus_page_opens_on_the_shipped_heads_map(patched_loader, fresh_caches, offered, tmp_path, monkeypatch):
    """No click: the default corpus, N and token limit are those of the results that ship with the app, so the
    page opens on their heads map (SmolLM2 on the first 100 Python documentation paragraphs), and says where they
    come from without a server path. (The map needs no model; the loader is patched for the top examples below
    it, which decode with the model's tokenizer.)"""
    from models import families
    from models.corpus import store

    monkeypatch.setenv("ATTN_EXPLORER_CACHE", str(tmp_path))
    at = _page()
    at.run()
    assert not at.exception, at.exception
    heads = offered["corpus_map"]
    spec = families.default_spec("causal_lm")
    assert heads.metadata["model"] == spec.key and heads.metadata["corpus"] == store.SHIPPED_CORPUS
    assert heads.metadata["documents"] == str(store.SHIPPED_DOCUMENTS)
    assert heads.metadata["statistic"] == "entropy_bits"
    assert at.button(key="corpus_run").label == "Re-run (all done)" and at.button(key="corpus_run").disabled
    captions = " ".join(c.value for c in at.caption)
    assert "shipped with the app" in captions
    assert str(store.SHIPPED.parent) not in captions and str(tmp_path) not in captions  # no server path
    assert at.metric[0].value == f"{store.SHIPPED_DOCUMENTS:,}"


def test_an_upload_with_unreadable_parts_says_so_before_the_run():
    """A truncated .zip among the uploads is named at once with its reason (its name shown as typed, not as
    Markdown), before any run; the readable file still counts as a document."""
    def script():
        from types import SimpleNamespace
        from unittest import mock

        import streamlit as st

        from app.sections import corpus

        class Upload(SimpleNamespace):
            def getvalue(self):
                return self.data

        uploads = [Upload(name="notes.txt", data=b"One paragraph.\n\nAnother."),
                   Upload(name="**broken**.zip", data=b"PK\x03\x04 cut short")]
        st.session_state.setdefault("corpus_source", corpus.UPLOAD)
        # patched only while the picker runs: streamlit is one module for the whole test process
        with mock.patch.object(st, "file_uploader", lambda *args, **kwargs: uploads):
            picked = corpus.corpus_picker()
        st.text(f"documents {len(picked.documents)}")

    at = AppTest.from_function(script, default_timeout=60).run()
    assert not at.exception
    assert [t.value for t in at.text] == ["documents 2"]
    (warning,) = at.warning
    assert "1 part(s) of the upload cannot be read" in warning.value
    assert r"\*\*broken\*\*\.zip\: not a valid zip archive" in warning.value


def test_the_heads_map_fills_its_column_on_a_projector():
    """The layer × head map is drawn as wide as its column (it filled a third of it at 1920 px)."""
    import numpy as np

    from models.corpus.analysis import CorpusSummary
    from models.corpus.statistics import STATISTICS
    from models.corpus.store import RunInfo
    from viz.figures.corpus import statistic_map
    from viz.screen import Screen, fitted

    means = {name: np.ones((2, 3), np.float32) for name in STATISTICS}
    summary = CorpusSummary(RunInfo("tiny", "docs", 64, 2, 3), 2, 10, [], means, means)
    figure = statistic_map(summary)
    assert figure.width == "stretch"
    assert fitted(figure.chart, Screen(presentation=True), stretch=True).width == "stretch"
