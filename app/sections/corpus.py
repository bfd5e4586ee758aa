"""The corpus page's widgets: where the documents come from, the run with progress/cancel/resume, and the results
drawn through the corpus views (heads map and table, top examples, the joint query–key embedding, A→B search, MoE
expert load). The heads map needs no model: results open at once; the model loads for what reads it."""
from __future__ import annotations

import hashlib
import importlib.util
import time
from pathlib import Path

import streamlit as st

from app import display, resources, tables, widgets
from models.core import loading
from models.corpus import engine, readers, store
from models.corpus.statistics import STATISTICS
from viz.figures.corpus import (
    COLOURS,
    CONTEXT_NAMES,
    CorpusOptions,
    EmbeddingOptions,
    SearchOptions,
    TopOptions,
)

UPLOAD = "Upload .txt / .jsonl / .zip"


def ray_installed() -> bool:
    return importlib.util.find_spec("ray") is not None


def corpus_picker() -> readers.Corpus:
    """The bundled corpora or an upload, cut to the first N documents (by default the shipped results' corpus)."""
    names = list(readers.BUNDLED) + [UPLOAD]
    left, right = st.columns([3, 1])
    source = left.selectbox("Corpus", names, index=names.index(store.SHIPPED_CORPUS), key="corpus_source",
                            format_func=lambda n: readers.BUNDLED[n][0] if n in readers.BUNDLED else n)
    count = right.number_input("Documents (N)", 1, 100_000, store.SHIPPED_DOCUMENTS, step=50, key="corpus_n")
    if source == UPLOAD:
        files = st.file_uploader("Text files", type=["txt", "md", "jsonl", "zip"], accept_multiple_files=True,
                                 key="corpus_files")
        if not files:
            st.info("Upload .txt (paragraphs are documents), .jsonl (one {\"text\": …} a line) or .zip files.")
            st.stop()
        data = [(f.name, f.getvalue()) for f in files]
        digest = hashlib.sha256(b"".join(hashlib.sha256(d).digest() for _, d in data)).hexdigest()[:10]
        corpus = readers.read_files(data, f"upload-{digest}")
        if corpus.skipped:  # said now, not only in the run's table: a broken file is no surprise after Run
            shown = "; ".join(f"{item.doc_id}: {item.reason}" for item in corpus.skipped[:5])
            more = f" (and {len(corpus.skipped) - 5:,} more)" if len(corpus.skipped) > 5 else ""
            st.warning(f"{len(corpus.skipped):,} part(s) of the upload cannot be read and will be skipped: "
                       f"{widgets.plain(shown)}{more}")
    else:
        corpus = readers.bundled(source, None if source == "python-docs" else int(count))
        st.caption(f"Licence: {widgets.plain(corpus.licence)}")
    return corpus.head(int(count))


def results_folder(spec, dtype: str, corpus: readers.Corpus, max_tokens: int) -> tuple[Path, bool]:
    """(the results folder of this model, corpus, N, token limit and precision, whether it ships with the app)."""
    name = store.results_name(spec.short_name, corpus.name, len(corpus.documents), max_tokens,
                              *([] if dtype == "float32" else [dtype]))
    shipped = store.shipped(name)
    if shipped is not None and spec.source != "local":
        return shipped, True
    return loading.cache_dir() / "corpus" / name, False


def run_controls(spec, corpus: readers.Corpus, folder: Path, shipped: bool, max_tokens: int) -> None:
    """Run (or resume) and cancel. A click on Cancel (or any widget) stops the script; every finished batch is
    already in the results folder, so Run resumes from there. The model loads when Run is pressed."""
    done = len(store.ResultStore.open(folder).done()) if (folder / "run.json").is_file() else 0
    total = done if shipped else len(corpus.documents) + len(corpus.skipped)  # shipped: complete, never written
    choices = ["local"] + (["ray"] if ray_installed() else [])
    a, b, c = st.columns([2, 1, 1])
    engine_name = a.radio("Engine", choices, horizontal=True, key="corpus_engine",
                          help="local: this process. ray: Ray Data actors (RAY_ADDRESS or a local cluster)"
                               + ("" if ray_installed() else " — not installed: pip install 'ray[data]'"))
    label = "Run" if done == 0 else ("Resume" if done < total else "Re-run (all done)")
    start = b.button(label, type="primary", key="corpus_run", disabled=done >= total, icon=":material/play_arrow:")
    c.button("Cancel", key="corpus_cancel", icon=":material/stop:", help="stops after the batch in flight; Resume "
             "continues from there")
    where = ("results shipped with the app for this model, corpus and settings (docs/CORPUS.md: how they were "
             "made)" if shipped else "results kept for this model, corpus and settings: a later visit resumes them")
    st.caption(f"{done:,} of {total:,} documents done · {where}")
    if not start:
        return
    loaded = widgets.load_or_stop(spec)
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


def show_results(folder: Path, spec) -> None:
    results = store.ResultStore.open(folder)
    info, revision = results.info, str(len(results.parts()))  # a growing run: each new batch redraws
    a, b, c = st.columns([2, 1, 1])
    statistic = a.selectbox("Statistic", list(STATISTICS), format_func=STATISTICS.get, key="corpus_stat")
    layer, head = widgets.layer_and_head("corpus", info.layers, info.heads, opening=(0, 0),
                                         columns=(b, c), mean=False)  # corpus means are per head
    heads = widgets.figure_or_none("corpus_heads", None, CorpusOptions(str(folder), statistic, layer, head, revision))
    if heads is None:
        return
    metadata = heads.metadata
    cols = st.columns(4)
    cols[0].metric("Documents", f"{int(metadata['documents']):,}")
    cols[1].metric("Tokens", f"{int(metadata['tokens']):,}")
    cols[2].metric("Skipped", f"{int(metadata['skipped']):,}")
    cols[3].metric("Heads", f"{info.layers} × {info.heads}")
    if int(metadata["skipped"]):
        frame = results.table()
        skipped = frame[frame["status"] == "skipped"]
        with st.expander("Skipped, with the reason"):
            tables.show({"document": list(skipped.doc_id), "reason": list(skipped.reason)})
    if not int(metadata["documents"]):
        st.info("No document has been read yet: press Run.")
        return
    tabs = ["Heads", "Query–key embedding", "Search A → B"] + (["Experts"] if info.experts else [])
    shown = st.tabs(tabs, key="corpus_view", on_change="rerun")
    with shown[0]:
        heads_tab(heads, folder, spec, layer, head, revision)
    with shown[1]:
        embedding_tab(folder, spec, info)
    with shown[2]:
        search_tab(folder, spec)
    if info.experts:
        with shown[3]:
            if (experts := widgets.figure_or_none("corpus_experts", None, CorpusOptions(str(folder),
                                                                                         revision=revision))):
                display.show(experts, "corpus_experts")


def screen_columns(frame):
    """``frame`` with its columns named as the page shows them: statistics by their labels (the
    table's, and "<label>, spread" for ``<name>_std``), the top examples' fields in words."""
    names = CONTEXT_NAMES | STATISTICS | {f"{name}_std": f"{label}, spread" for name, label in STATISTICS.items()}
    return frame.rename(columns=names)


def heads_tab(heads, folder: Path, spec, layer: int, head: int, revision: str) -> None:
    display.show(heads, "corpus_map")
    st.markdown(f"**Top examples of head {layer}.{head}**: the documents where its largest weight off the first "
                "token and the diagonal is highest; [brackets] mark the query and the key it attends to.")
    loaded = widgets.load_or_stop(spec)  # the contexts are decoded with the model's tokenizer
    top = widgets.figure_or_none("corpus_top", None, TopOptions(str(folder), layer, head, 8, revision), loaded)
    if top is not None:
        tables.show(screen_columns(top.table()[list(CONTEXT_NAMES)]))
        display.offer(top, "corpus_top")
    st.markdown("**Every head** (sortable: click a column; *spread* = standard deviation over documents)")
    tables.show(screen_columns(heads.table()), height=300, sortable=True)


def embedding_tab(folder: Path, spec, info) -> None:
    a, b, c, d = st.columns(4)
    layer = int(a.number_input("Layer", 0, info.layers - 1, min(1, info.layers - 1), key="corpus_qk_layer"))
    head = int(b.number_input("Head", 0, info.heads - 1, 0, key="corpus_qk_head"))
    colour = c.selectbox("Colour by", COLOURS, key="corpus_qk_colour")
    methods = ["pca"] + (["umap"] if importlib.util.find_spec("umap") else [])
    method = d.selectbox("Projection", methods, key="corpus_qk_method", help="UMAP appears when umap-learn is "
                         "installed")
    count = st.slider("Documents embedded", 5, 100, EmbeddingOptions.embedded, key="corpus_qk_docs")
    loaded = widgets.load_or_stop(spec)
    figure = widgets.figure_or_none("corpus_embedding", None,
                                    EmbeddingOptions(str(folder), layer, head, count, method, colour), loaded)
    if figure is None:
        return
    display.show(figure, "corpus_qk", select="corpus_qk_pick")
    st.caption("Click a point to open its document's map below.")
    document_map(loaded, folder, list(dict.fromkeys(figure.table()["document"])), layer, head, info.max_tokens)


def document_map(loaded, folder: Path, documents: list[str], layer: int, head: int, max_tokens: int) -> None:
    """The attention map of head ``layer.head`` on one embedded document: the one whose point was clicked (the
    previous run's selection), or picked from the list; the clicked query (or key) position is named."""
    from models.core.inputs import TextInput
    from viz.figures.attention import HeadOptions

    points = ((st.session_state.get("corpus_qk_pick") or {}).get("selection", {}).get("pick")) or []
    clicked = next((p for p in points if p.get("document") in documents), None)
    if clicked is not None and st.session_state.get("corpus_qk_clicked") != clicked:
        st.session_state["corpus_qk_clicked"] = clicked
        st.session_state["corpus_qk_doc"] = clicked["document"]
    chosen = st.selectbox("Document's map", documents, key="corpus_qk_doc",
                          help="a click on a point in the embedding opens its document here")
    result = resources.run(loaded, TextInput(store.ResultStore.open(folder).text(chosen), max_tokens))
    if clicked is not None and clicked["document"] == chosen:
        position = int(clicked["position"])
        st.caption(f"Clicked: the {widgets.plain(clicked['kind'])} at position {position} "
                   f"({widgets.plain(result.tokens[position]) if position < len(result.tokens) else '?'}): its row "
                   "(query) or column (key) in the map below.")
    if (head_figure := widgets.figure_or_none("head", result, HeadOptions("", layer, head))) is not None:
        display.show(head_figure, "corpus_doc_map")


def search_tab(folder: Path, spec) -> None:
    a, b, c = st.columns([2, 2, 1])
    pattern_a = a.text_input("From tokens matching A", SearchOptions.a, key="corpus_a")
    pattern_b = b.text_input("to tokens matching B", SearchOptions.b, key="corpus_b")
    regex = c.toggle("Regex", key="corpus_regex")
    options = SearchOptions(str(folder), pattern_a, pattern_b, bool(regex))
    if st.button("Search the corpus", key="corpus_search", icon=":material/search:"):
        st.session_state["corpus_searched"] = options
    if st.session_state.get("corpus_searched") != options:
        st.caption("Ranks every head by the mean share of an A token's attention that lands on B tokens, over the "
                   f"first {options.searched} documents that hold both (read in one batched pass of the model).")
        return
    loaded = widgets.load_or_stop(spec)
    if (figure := widgets.figure_or_none("corpus_search", None, options, loaded)) is not None:
        display.show(figure, "corpus_search_fig")
