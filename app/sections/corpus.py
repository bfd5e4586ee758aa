"""The corpus page's widgets: where the documents come from, the run with progress/cancel/resume, and the results
(heads table and maps, top examples, the joint query–key embedding, A→B search, MoE expert load)."""
from __future__ import annotations

import hashlib
import importlib.util
import time

import streamlit as st

from app import display, resources, widgets
from models.core import loading
from models.corpus import analysis, engine, readers
from models.corpus.statistics import STATISTICS
from models.corpus.store import ResultStore
from viz.figures import corpus as figures

UPLOAD = "Upload .txt / .jsonl / .zip"
SEARCH_DOCUMENTS = 40  # documents holding both A and B that a search runs through the model (the CLI has no cap)


def ray_installed() -> bool:
    return importlib.util.find_spec("ray") is not None


def corpus_picker() -> readers.Corpus:
    """The bundled corpora or an upload, cut to the first N documents."""
    names = list(readers.BUNDLED) + [UPLOAD]
    left, right = st.columns([3, 1])
    source = left.selectbox("Corpus", names, key="corpus_source",
                            format_func=lambda n: readers.BUNDLED[n][0] if n in readers.BUNDLED else n)
    count = right.number_input("Documents (N)", 1, 100_000, 200, step=50, key="corpus_n")
    if source == UPLOAD:
        files = st.file_uploader("Text files", type=["txt", "md", "jsonl", "zip"], accept_multiple_files=True,
                                 key="corpus_files")
        if not files:
            st.info("Upload .txt (paragraphs are documents), .jsonl (one {\"text\": …} a line) or .zip files.")
            st.stop()
        data = [(f.name, f.getvalue()) for f in files]
        digest = hashlib.sha256(b"".join(hashlib.sha256(d).digest() for _, d in data)).hexdigest()[:10]
        corpus = readers.read_files(data, f"upload-{digest}")
    else:
        corpus = readers.bundled(source, None if source == "python-docs" else int(count))
        st.caption(f"Licence: {widgets.plain(corpus.licence)}")
    return corpus.head(int(count))


def results_folder(loaded, corpus: readers.Corpus, max_tokens: int):
    name = figures._slug(loaded.spec.short_name, corpus.name, len(corpus.documents), max_tokens,
                         *([] if loaded.dtype == "float32" else [loaded.dtype]))
    return loading.cache_dir() / "corpus" / name


def run_controls(loaded, corpus: readers.Corpus, folder, max_tokens: int) -> None:
    """Run (or resume) and cancel. A click on Cancel (or any widget) stops the script; every finished batch is
    already in the results folder, so Run resumes from there."""
    done = len(ResultStore.open(folder).done()) if (folder / "run.json").is_file() else 0
    total = len(corpus.documents) + len(corpus.skipped)
    choices = ["local"] + (["ray"] if ray_installed() else [])
    a, b, c = st.columns([2, 1, 1])
    engine_name = a.radio("Engine", choices, horizontal=True, key="corpus_engine",
                          help="local: this process. ray: Ray Data actors (RAY_ADDRESS or a local cluster)"
                               + ("" if ray_installed() else " — not installed: pip install 'ray[data]'"))
    label = "Run" if done == 0 else ("Resume" if done < total else "Re-run (all done)")
    start = b.button(label, type="primary", key="corpus_run", disabled=done >= total, icon=":material/play_arrow:")
    c.button("Cancel", key="corpus_cancel", icon=":material/stop:", help="stops after the batch in flight; Resume "
             "continues from there")
    st.caption(f"{done:,} of {total:,} documents done · results in {widgets.plain(str(folder))}")
    if not start:
        return
    bar = st.progress(0.0, text="starting…")

    def progress(p: engine.Progress) -> None:
        eta = f" · ETA {p.eta_s:,.0f} s" if p.eta_s is not None else ""
        bar.progress(p.done / max(p.total, 1), text=f"{p.done:,}/{p.total:,} documents · "
                                                    f"{p.tokens_per_s:,.0f} tokens/s{eta}")

    try:
        engine.run_corpus(corpus, loaded, folder, engine_name, max_tokens, progress)
    except ValueError as error:
        widgets.show_error(error)
        st.stop()
    time.sleep(0.1)
    st.rerun()


def _remember(key: str, params: tuple, compute):
    """A result computed on request, kept for this browser session while its parameters stay the same."""
    held = st.session_state.get(key)
    if held is not None and held[0] == params:
        return held[1]
    value = compute()
    st.session_state[key] = (params, value)
    return value


def show_results(store: ResultStore, loaded, corpus: readers.Corpus) -> None:
    summary = analysis.summarize(store)
    cols = st.columns(4)
    cols[0].metric("Documents", f"{summary.documents:,}")
    cols[1].metric("Tokens", f"{summary.tokens:,}")
    cols[2].metric("Skipped", f"{len(summary.skipped):,}")
    cols[3].metric("Heads", f"{summary.info.layers} × {summary.info.heads}")
    if summary.skipped:
        with st.expander("Skipped, with the reason"):
            st.dataframe({"document": [d for d, _ in summary.skipped], "reason": [r for _, r in summary.skipped]},
                         hide_index=True)
    if not summary.documents:
        st.info("No document has been read yet: press Run.")
        return
    tabs = ["Heads", "Query–key embedding", "Search A → B"] + (["Experts"] if summary.moe else [])
    shown = st.tabs(tabs, key="corpus_view", on_change="rerun")
    with shown[0]:
        heads_tab(summary, store, loaded)
    with shown[1]:
        embedding_tab(summary, loaded, corpus)
    with shown[2]:
        search_tab(loaded, corpus, store.info.max_tokens)
    if summary.moe:
        with shown[3]:
            display.show(figures.expert_load_figure(summary), "corpus_experts")


def heads_tab(summary, store, loaded) -> None:
    info = summary.info
    a, b, c = st.columns([2, 1, 1])
    statistic = a.selectbox("Statistic", list(STATISTICS), format_func=STATISTICS.get, key="corpus_stat")
    layer = int(b.number_input("Layer", 0, info.layers - 1, 0, key="corpus_layer"))
    head = int(c.number_input("Head", 0, info.heads - 1, 0, key="corpus_head"))
    display.show(figures.statistic_map(summary, statistic, (layer, head)), "corpus_map")
    st.markdown(f"**Top examples of head {layer}.{head}**: the documents where its largest weight off the first "
                "token and the diagonal is highest; [brackets] mark the query and the key it attends to.")
    examples = analysis.top_examples(store, loaded.tokenizer, layer, head, count=8)
    st.dataframe(examples[["doc_id", "peak_weight", "query_context", "key_context"]], hide_index=True)
    display.offer(figures.top_examples_figure(examples, info.model, layer, head), "corpus_top")
    st.markdown("**Every head** (sortable: click a column; `_std` = spread over documents)")
    st.dataframe(summary.heads_table(), hide_index=True, height=300)


def embedding_tab(summary, loaded, corpus) -> None:
    info = summary.info
    a, b, c, d = st.columns(4)
    layer = int(a.number_input("Layer", 0, info.layers - 1, min(1, info.layers - 1), key="corpus_qk_layer"))
    head = int(b.number_input("Head", 0, info.heads - 1, 0, key="corpus_qk_head"))
    colour = c.selectbox("Colour by", figures.COLOURS, key="corpus_qk_colour")
    methods = ["pca"] + (["umap"] if importlib.util.find_spec("umap") else [])
    method = d.selectbox("Projection", methods, key="corpus_qk_method", help="UMAP appears when umap-learn is "
                         "installed")
    count = st.slider("Documents embedded", 5, 100, 30, key="corpus_qk_docs")
    try:
        embedding = _remember("corpus_qk", (info.model, corpus.name, layer, head, method, count), lambda: (
            analysis.query_key_embedding(loaded, corpus.documents, layer, head, count, min(info.max_tokens, 128),
                                         method)))
        figure = figures.embedding_figure(embedding, info.model, colour)
    except ValueError as error:
        widgets.show_error(error)
        return
    display.show(figure, "corpus_qk", select="corpus_qk_pick")
    st.caption("Click a point to open its document's map below.")
    document_map(loaded, corpus, embedding, layer, head, min(info.max_tokens, 128))


def document_map(loaded, corpus, embedding, layer: int, head: int, max_tokens: int) -> None:
    """The attention map of head ``layer.head`` on one embedded document: the one whose point was clicked (the
    previous run's selection), or picked from the list; the clicked query (or key) position is named."""
    from models.core.inputs import TextInput
    from viz.figures.attention import HeadOptions

    documents = list(dict.fromkeys(embedding.doc_id))
    points = ((st.session_state.get("corpus_qk_pick") or {}).get("selection", {}).get("pick")) or []
    clicked = next((p for p in points if p.get("document") in documents), None)
    if clicked is not None and st.session_state.get("corpus_qk_clicked") != clicked:
        st.session_state["corpus_qk_clicked"] = clicked
        st.session_state["corpus_qk_doc"] = clicked["document"]
    chosen = st.selectbox("Document's map", documents, key="corpus_qk_doc",
                          help="a click on a point in the embedding opens its document here")
    text = next(d.text for d in corpus.documents if d.doc_id == chosen)
    result = resources.run(loaded, TextInput(text, max_tokens))
    if clicked is not None and clicked["document"] == chosen:
        position = int(clicked["position"])
        st.caption(f"Clicked: the {widgets.plain(clicked['kind'])} at position {position} "
                   f"({widgets.plain(result.tokens[position]) if position < len(result.tokens) else '?'}): its row "
                   "(query) or column (key) in the map below.")
    if (head_figure := widgets.figure_or_none("head", result, HeadOptions("", layer, head))) is not None:
        display.show(head_figure, "corpus_doc_map")


def search_tab(loaded, corpus, max_tokens: int) -> None:
    a, b, c = st.columns([2, 2, 1])
    pattern_a = a.text_input("From tokens matching A", "is", key="corpus_a")
    pattern_b = b.text_input("to tokens matching B", "object", key="corpus_b")
    regex = c.toggle("Regex", key="corpus_regex")
    if not st.button("Search the corpus", key="corpus_search", icon=":material/search:") and \
            st.session_state.get("corpus_ranked") is None:
        st.caption("Ranks every head by the mean share of an A token's attention that lands on B tokens, over the "
                   f"first {SEARCH_DOCUMENTS} documents that hold both (each runs through the model once more).")
        return
    try:
        ranked, searched = _remember("corpus_ranked", (loaded.spec.key, corpus.name, pattern_a, pattern_b, regex),
                                     lambda: analysis.search_heads(loaded, corpus.documents, pattern_a, pattern_b,
                                                                   regex, max_tokens, SEARCH_DOCUMENTS))
    except ValueError as error:
        widgets.show_error(error)
        return
    st.caption(f"{searched} documents contain both; {int(ranked.queries.iloc[0]):,} A tokens could see a B token.")
    display.show(figures.search_figure(ranked, loaded.spec.short_name, pattern_a, pattern_b), "corpus_search_fig")
