"""Figures of corpus mode, registered as the corpus page's views: a statistic over layer × head (``corpus_heads``), a
head's top examples (``corpus_top``), the joint query–key embedding (AttentionViz; ``corpus_embedding``), the A→B
search ranking (``corpus_search``) and MoE expert load (``corpus_experts``). Pure: what ``models.corpus.analysis``
read from a results folder in, a ``Figure`` out; the page, ``python -m app.cli --page corpus --view NAME`` and the
downloads all draw them through the registry."""
from __future__ import annotations

import re
from dataclasses import dataclass

import altair as alt
import numpy as np
import pandas as pd

from models.corpus.analysis import (
    CorpusSummary,
    Embedding,
    SearchResult,
    TopExamples,
    corpus_summary,
    embedding_view,
    search_view,
    top_examples_view,
)
from models.corpus.statistics import STATISTICS
from viz.figure import Figure, view
from viz.heatmap import PAD, head_statistic_chart


def _slug(*parts) -> str:
    return re.sub(r"[^a-z0-9_-]+", "-", "_".join(str(p) for p in parts).lower()).strip("-_")[:120] or "corpus"


# what the tables' columns are called on screen; the CSV, JSON and CLI keep the field names
CONTEXT_NAMES = {"doc_id": "document", "peak_weight": "peak weight", "query_context": "query in context",
                 "key_context": "key in context"}


def heads_payload(summary: CorpusSummary) -> dict:
    """The CLI's JSON: documents, tokens and one entry per head with every statistic and its spread."""
    table = summary.heads_table()
    heads = [{key: (int(value) if key in ("layer", "head") else (None if not np.isfinite(value) else float(value)))
              for key, value in row.items()} for row in table.to_dict("records")]
    return {"model": summary.info.model, "corpus": summary.info.corpus, "max_tokens": summary.info.max_tokens,
            "documents": summary.documents, "tokens": summary.tokens,
            "skipped": [{"doc_id": d, "reason": r} for d, r in summary.skipped], "heads": heads}


def statistic_map(summary: CorpusSummary, statistic: str = "entropy_bits",
                  selected: tuple[int, int] | None = None) -> Figure:
    """One statistic's corpus mean for every (layer, head); the table holds every statistic with its spread."""
    if statistic not in STATISTICS:
        raise ValueError(f"unknown statistic {statistic!r}; choose one of {', '.join(STATISTICS)}")
    values = np.nan_to_num(summary.mean[statistic], nan=0.0)
    chart = head_statistic_chart(values, STATISTICS[statistic], selected)
    info = summary.info
    return Figure(_slug("corpus", info.model, info.corpus, statistic), chart=chart, width="stretch",
                  table=summary.heads_table,
                  payload=lambda: heads_payload(summary),
                  arrays=lambda: {f"{name}_mean": summary.mean[name] for name in STATISTICS}
                  | {f"{name}_std": summary.spread[name] for name in STATISTICS},
                  metadata={"model": info.model, "corpus": info.corpus, "documents": str(summary.documents),
                            "tokens": str(summary.tokens), "skipped": str(len(summary.skipped)),
                            "statistic": statistic},
                  caption=f"{STATISTICS[statistic]}: mean over {summary.documents:,} documents ({summary.tokens:,} "
                          "tokens), each document counted once; the table adds each statistic's spread (std over "
                          "documents).")


def top_examples_figure(examples: pd.DataFrame, model: str, layer: int, head: int) -> Figure:
    """Where a head fires most: its peak weight in each of the top documents, the tokens in context beside."""
    frame = examples.reset_index(drop=True).assign(rank=lambda f: np.arange(len(f)))
    chart = alt.Chart(frame).mark_bar().encode(
        y=alt.Y("doc_id:N", sort=alt.EncodingSortField("rank"), title=None),
        x=alt.X("peak_weight:Q", title="peak weight (off first token and diagonal)", scale=alt.Scale(domain=[0, 1])),
        tooltip=[alt.Tooltip("doc_id:N", title=CONTEXT_NAMES["doc_id"]),
                 alt.Tooltip("peak_weight:Q", format=".3f", title=CONTEXT_NAMES["peak_weight"]),
                 alt.Tooltip("query_context:N", title=CONTEXT_NAMES["query_context"]),
                 alt.Tooltip("key_context:N", title=CONTEXT_NAMES["key_context"])],
    ).properties(width=360, height=22 * max(len(frame), 1), autosize=PAD)
    return Figure(_slug("corpus", model, "top", f"l{layer}", f"h{head}"), chart=chart, table=frame,
                  payload=lambda: {"layer": layer, "head": head, "examples": frame.to_dict("records")},
                  metadata={"model": model, "layer": str(layer), "head": str(head)})


def search_figure(ranked: pd.DataFrame, model: str, pattern_a: str, pattern_b: str, count: int = 15,
                  searched: int | None = None) -> Figure:
    """The heads ranked by how much of an A token's attention goes to B tokens."""
    top = ranked.head(count).assign(label=lambda f: [f"L{int(r.layer)} H{int(r.head)}" for r in f.itertuples()],
                                    rank=lambda f: np.arange(len(f)))
    chart = alt.Chart(top).mark_bar().encode(
        x=alt.X("share:Q", title="share of attention from A onto B", scale=alt.Scale(domain=[0, 1])),
        y=alt.Y("label:N", sort=alt.EncodingSortField("rank"), title="head"),
        tooltip=["layer", "head", alt.Tooltip("share:Q", format=".3f"), "queries"],
    ).properties(width=420, height=20 * len(top), autosize=PAD)
    queries = int(ranked.queries.iloc[0]) if len(ranked) else 0
    caption = (f"{searched:,} documents hold both; " if searched is not None else "") + \
        f"{queries:,} A tokens could see a B token. Each head's share: the mean, over those A tokens, of the " \
        "attention they put on B tokens."
    return Figure(_slug("corpus", model, "search", pattern_a, pattern_b), chart=chart, table=ranked,
                  payload=lambda: {"a": pattern_a, "b": pattern_b, "documents": searched,
                                   "heads": ranked.to_dict("records")},
                  metadata={"model": model, "a": pattern_a, "b": pattern_b}, caption=caption)


COLOURS = ("position", "token", "document", "kind")


def embedding_figure(embedding: Embedding, model: str, colour: str = "position") -> Figure:
    """Queries (circles) and keys (crosses) of one head in one plane; hover shows the token in its context."""
    if colour not in COLOURS:
        raise ValueError(f"colour by one of {', '.join(COLOURS)}")
    frame = pd.DataFrame({"x": embedding.points[:, 0], "y": embedding.points[:, 1], "kind": embedding.kind,
                          "document": embedding.doc_id, "position": embedding.position, "token": embedding.token,
                          "context": embedding.context})
    encodings = {"position": alt.Color("position:Q", scale=alt.Scale(scheme="viridis")),
                 "token": alt.Color("token:N", legend=None), "document": alt.Color("document:N", legend=None),
                 "kind": alt.Color("kind:N", scale=alt.Scale(domain=["query", "key"], range=["#4c78a8", "#f58518"]))}
    # a click selects the point's document (the page opens that document's map; "pick" is the selection's name)
    pick = alt.selection_point(name="pick", fields=["document", "position", "kind"], on="click", clear=False,
                              nearest=True)
    chart = alt.Chart(frame).mark_point(filled=True, size=28, opacity=0.7).encode(
        x=alt.X("x:Q", title=f"{embedding.method.upper()} 1"), y=alt.Y("y:Q", title=f"{embedding.method.upper()} 2"),
        color=encodings[colour], shape=alt.Shape("kind:N", scale=alt.Scale(domain=["query", "key"],
                                                                          range=["circle", "cross"])),
        tooltip=["kind", "token", "context", "document", "position"],
    ).add_params(pick).properties(width=620, height=460, autosize=PAD).interactive()
    return Figure(_slug("corpus", model, "qk", f"l{embedding.layer}", f"h{embedding.head}", colour), chart=chart,
                  table=frame, arrays=lambda: {"points": embedding.points},
                  metadata={"model": model, "layer": str(embedding.layer), "head": str(embedding.head),
                            "method": embedding.method},
                  caption=f"{len(frame) // 2:,} queries and as many keys of head {embedding.layer}.{embedding.head} "
                          f"from {len(set(embedding.doc_id))} documents, embedded together ({embedding.method.upper()}"
                          "; keys shifted onto the queries' centroid and both scaled to one mean norm, which leaves "
                          "every attention weight unchanged: AttentionViz, Yeh et al. 2023).")


def expert_load_figure(summary: CorpusSummary) -> Figure:
    """MoE: mean expert load per layer over the corpus (share of top-k assignments; 1/E is balanced)."""
    load = summary.moe["expert_load"]
    layers, experts = load.shape
    layer_index, expert_index = np.meshgrid(np.arange(layers), np.arange(experts), indexing="ij")
    frame = pd.DataFrame({"layer": layer_index.ravel(), "expert": expert_index.ravel(), "load": load.ravel(),
                          "spread": summary.moe["expert_load_std"].ravel()})
    entropy = summary.moe["router_entropy"]
    chart = alt.Chart(frame).mark_rect().encode(
        x="expert:O", y="layer:O", color=alt.Color("load:Q", scale=alt.Scale(scheme="viridis"), title="load"),
        tooltip=["layer", "expert", alt.Tooltip("load:Q", format=".3f"), alt.Tooltip("spread:Q", format=".3f")],
    ).properties(width=34 * experts + 40, height=24 * layers + 20, autosize=PAD)
    info = summary.info
    return Figure(_slug("corpus", info.model, info.corpus, "expert_load"), chart=chart, table=frame,
                  arrays=lambda: {name: value for name, value in summary.moe.items()},
                  payload=lambda: {"expert_load": load.tolist(), "router_entropy_nats": entropy.tolist(),
                                   "coactivation": summary.moe["coactivation"].tolist()},
                  metadata={"model": info.model, "corpus": info.corpus},
                  caption="Mean router entropy per layer (nats): " + ", ".join(f"{e:.2f}" for e in entropy)
                          + f" (log E = {np.log(experts):.2f} is an undecided router).")


@dataclass(frozen=True)
class CorpusOptions:
    results: str = ""  # a results folder written by the corpus page or `python -m app.cli --page corpus`
    statistic: str = "entropy_bits"  # one of models.corpus.statistics.STATISTICS
    layer: int = 0  # the head outlined on the map
    head: int = 0
    revision: str = ""  # what the folder holds (the page: documents written, so a growing run redraws)


@view("corpus_heads", "Per-head statistics over a corpus (layer × head map; the table adds each spread)",
      CorpusOptions, analysis=corpus_summary, analysis_options=("results", "revision"), page="corpus")
def corpus_heads(summary: CorpusSummary, options: CorpusOptions) -> Figure:
    return statistic_map(summary, options.statistic, (options.layer, options.head))


@dataclass(frozen=True)
class TopOptions:
    results: str = ""
    layer: int = 0
    head: int = 0
    count: int = 8  # documents
    revision: str = ""


@view("corpus_top", "A head's top examples: the documents where its largest weight off the first token and the "
      "diagonal is highest", TopOptions, analysis=top_examples_view,
      analysis_options=("results", "layer", "head", "count", "revision"), page="corpus")
def corpus_top(top: TopExamples, options: TopOptions) -> Figure:
    return top_examples_figure(top.examples, top.model, top.layer, top.head)


@dataclass(frozen=True)
class EmbeddingOptions:
    results: str = ""
    layer: int = 1
    head: int = 0
    embedded: int = 30  # documents embedded (the first of the results folder)
    method: str = "pca"  # or umap (with umap-learn installed)
    colour: str = "position"  # one of COLOURS


@view("corpus_embedding", "One head's queries and keys from many documents in one plane (AttentionViz)",
      EmbeddingOptions, analysis=embedding_view, analysis_options=("results", "layer", "head", "embedded", "method"),
      page="corpus")
def corpus_embedding(embedding: Embedding, options: EmbeddingOptions) -> Figure:
    return embedding_figure(embedding, embedding.model, options.colour)


@dataclass(frozen=True)
class SearchOptions:
    results: str = ""
    a: str = "is"  # tokens the attention comes from (exact text, or a regular expression)
    b: str = "object"  # tokens it goes to
    regex: bool = False
    searched: int = 40  # documents holding both that are read


@view("corpus_search", "Which heads attend from tokens matching A to tokens matching B, over a corpus",
      SearchOptions, analysis=search_view, analysis_options=("results", "a", "b", "regex", "searched"),
      page="corpus")
def corpus_search(search: SearchResult, options: SearchOptions) -> Figure:
    return search_figure(search.ranked, search.model, search.pattern_a, search.pattern_b, searched=search.searched)


@view("corpus_experts", "MoE expert load per layer over a corpus, with the routers' entropy", CorpusOptions,
      analysis=corpus_summary, analysis_options=("results", "revision"), page="corpus")
def corpus_experts(summary: CorpusSummary, options: CorpusOptions) -> Figure:
    if not summary.moe:
        raise ValueError(f"{summary.info.model} has no mixture-of-experts layers: no expert load to show")
    return expert_load_figure(summary)
