"""What the corpus page and the CLI read from a results folder, and the two questions that read q and k.

- ``summarize``: each statistic's mean over documents (each document counts once) and its spread (standard
  deviation over documents; the induction score over documents that have a repeated token), per (layer, head); MoE
  expert load, co-activation and router entropy averaged the same way.
- ``top_examples``: the documents where a head's peak (largest weight off the first token and the diagonal) is
  highest, with the tokens around the query and the key.
- ``search_heads``: which heads attend from tokens matching A to tokens matching B (exact token text or a regular
  expression), ranked by the mean share of an A query's attention that lands on B keys, over the corpus.
- ``query_key_embedding``: one head's queries and keys from many documents projected together (AttentionViz, Yeh et
  al., IEEE VIS 2023): keys are translated so that their centroid meets the queries' (adding one vector to every
  key changes a query's scores by a constant, which softmax ignores, so the shift keeps each query's attention),
  queries scaled by c and keys by 1/c (scores unchanged) so both clouds have the same mean norm, then PCA to 2-D
  (UMAP when ``umap-learn`` is installed).
The search and the embedding are reductions (``PatternShare``, ``QueryKeySample``) of the same forwards as the
statistics: a corpus run can read them in its pass (``engine.run_corpus(..., also=...)``), and asked later they run
one batched pass over the documents they need. The ``*_view`` functions are the corpus views' analyses
(``viz/figures/corpus.py``): results folder and options in, what the figure draws out.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np
import torch

from models.core import text
from models.corpus.forward import Batch, BatchRunner, LayerCall, Reduction
from models.corpus.readers import Document
from models.corpus.statistics import STATISTICS
from models.corpus.store import ResultStore, RunInfo, stacked


@dataclass(frozen=True)
class CorpusSummary:
    info: RunInfo
    documents: int
    tokens: int
    skipped: list[tuple[str, str]]
    mean: dict[str, np.ndarray]  # name -> (layers, heads)
    spread: dict[str, np.ndarray]  # name -> (layers, heads), std over documents
    moe: dict[str, np.ndarray] = field(default_factory=dict)  # expert_load (L, E), coactivation (L, E, E), ...

    def heads_table(self):
        """One row per head: layer, head, each statistic's mean and spread (the sortable table and the CLI's JSON)."""
        import pandas as pd

        layers, heads = self.info.layers, self.info.heads
        layer_index, head_index = np.meshgrid(np.arange(layers), np.arange(heads), indexing="ij")
        columns = {"layer": layer_index.ravel(), "head": head_index.ravel()}
        for name in STATISTICS:
            columns[name] = self.mean[name].ravel().astype(float)
            columns[f"{name}_std"] = self.spread[name].ravel().astype(float)
        return pd.DataFrame(columns)


def summarize(store: ResultStore) -> CorpusSummary:
    frame = store.table()
    info = store.info
    ok = frame[frame["status"] == "ok"]
    mean, spread = {}, {}
    for name in STATISTICS:
        values = stacked(frame, name, info)  # (documents, layers, heads)
        with np.errstate(all="ignore"):
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a head no document has a value for: NaN
                mean[name] = np.nanmean(values, axis=0) if len(values) else np.full((info.layers, info.heads), np.nan)
                spread[name] = np.nanstd(values, axis=0) if len(values) else np.full((info.layers, info.heads), np.nan)
    moe = {}
    if info.experts and len(ok):
        for name in ("expert_load", "coactivation", "router_entropy"):
            values = stacked(frame, name, info)
            moe[name] = values.mean(axis=0)
            moe[f"{name}_std"] = values.std(axis=0)
    skipped = [(row.doc_id, row.reason) for row in frame[frame["status"] == "skipped"].itertuples()]
    return CorpusSummary(info, len(ok), int(ok["n_tokens"].sum()) if len(ok) else 0, skipped, mean, spread, moe)


def corpus_summary(loaded, result, options) -> CorpusSummary:
    """The ``corpus_heads`` and ``corpus_experts`` views' analysis: the summary of the results folder
    ``options.results`` (written by the corpus page or ``python -m app.cli --page corpus``); needs no model."""
    return summarize(open_results(options.results))


def open_results(folder: str) -> ResultStore:
    if not folder:
        raise ValueError("give the results folder of a corpus run (--results DIR); python -m app.cli --page corpus "
                         "--input FOLDER writes one")
    return ResultStore.open(folder)


def _context(tokenizer, ids: list[int], position: int, width: int = 8) -> str:
    """The text around token ``position`` with that token in brackets (decoded, so spaces are where they were)."""
    def decode(part) -> str:
        return tokenizer.decode([int(i) for i in part]).replace("\n", " ⏎ ")

    left = decode(ids[max(0, position - width):position])
    right = decode(ids[position + 1:position + 1 + width])
    return f"{left}[{decode(ids[position:position + 1])}]{right}"


def top_examples(store: ResultStore, tokenizer, layer: int, head: int, count: int = 10):
    """The ``count`` documents with the highest peak of (layer, head): doc_id, peak weight, query and key positions
    and their tokens in context."""
    import pandas as pd

    info = store.info
    if not (0 <= layer < info.layers and 0 <= head < info.heads):
        raise ValueError(f"there is no head {layer}.{head}: the model has layers 0..{info.layers - 1} and heads "
                         f"0..{info.heads - 1}")
    frame = store.table()
    ok = frame[frame["status"] == "ok"]
    index = layer * info.heads + head
    rows = []
    for row in ok.itertuples():
        value = float(row.peak_value[index])
        if np.isfinite(value):
            rows.append((value, row))
    rows.sort(key=lambda item: -item[0])
    out = []
    for value, row in rows[:count]:
        tokens = text.display_tokens(tokenizer, row.token_ids)
        q, k = int(row.peak_query[index]), int(row.peak_key[index])
        out.append({"doc_id": row.doc_id, "peak_weight": value, "query": q, "key": k,
                    "query_token": tokens[q], "key_token": tokens[k],
                    "query_context": _context(tokenizer, row.token_ids, q),
                    "key_context": _context(tokenizer, row.token_ids, k)})
    return pd.DataFrame(out, columns=["doc_id", "peak_weight", "query", "key", "query_token", "key_token",
                                      "query_context", "key_context"])


# --- questions that read the model's q and k: reductions that run in the corpus pass ---------------------------

def token_matcher(pattern: str, regex: bool):
    """A predicate on a token's text (stripped of surrounding spaces): equality, or ``re.search``."""
    if not pattern.strip():
        raise ValueError("Type a token (or a regular expression) for both A and B.")
    if regex:
        try:
            compiled = re.compile(pattern)
        except re.error as error:
            raise ValueError(f"{pattern!r} is not a regular expression: {error}") from None
        return lambda token: compiled.search(token.strip()) is not None
    wanted = pattern.strip()
    return lambda token: token.strip() == wanted


class PatternShare(Reduction):
    """The A→B search, read in the forward: for every head, the summed share of attention that each A query (a
    token matching A that can see a token matching B) puts on the B keys, over the documents of every batch (only
    those in ``only``, when given: ``choose`` picks them).

    ``total`` ``(layers, heads)`` float64, ``queries`` (A queries counted), ``documents`` (documents with both)."""

    def __init__(self, tokenizer, pattern_a: str, pattern_b: str, regex: bool = False, only: set[str] | None = None):
        self.tokenizer = tokenizer
        self.pattern_a, self.pattern_b = pattern_a, pattern_b
        self.match_a, self.match_b = token_matcher(pattern_a, regex), token_matcher(pattern_b, regex)
        self.only = only
        self.total: np.ndarray | None = None
        self.queries = 0
        self.documents = 0
        self.seen: set[str] = set()  # documents read

    def choose(self, tokenized: list[tuple[Document, list[int]]], count: int) -> list[tuple[Document, list[int]]]:
        """The first ``count`` documents that hold both A and B; the search then reads only those."""
        chosen = []
        for document, ids in tokenized:
            if len(chosen) >= count:
                break
            found_a, found_b = self.matches(ids)
            if any(found_a) and any(found_b):
                chosen.append((document, ids))
        self.only = {document.doc_id for document, _ in chosen}
        return chosen

    def matches(self, token_ids: list[int]) -> tuple[list[bool], list[bool]]:
        tokens = text.display_tokens(self.tokenizer, token_ids)
        return [self.match_a(t) for t in tokens], [self.match_b(t) for t in tokens]

    def start(self, batch: Batch) -> None:
        a = torch.zeros(batch.ids.shape, dtype=torch.bool)
        b = torch.zeros(batch.ids.shape, dtype=torch.bool)
        for row, (document, token_ids) in enumerate(zip(batch.documents, batch.token_ids)):
            if self.only is not None and document.doc_id not in self.only:
                continue
            self.seen.add(document.doc_id)
            found_a, found_b = self.matches(token_ids)
            a[row, :len(token_ids)] = torch.tensor(found_a)
            b[row, :len(token_ids)] = torch.tensor(found_b)
        self.documents += int((a.any(-1) & b.any(-1)).sum())
        self.a, self.b = a.to(batch.ids.device), b.to(batch.ids.device)
        self.seeing: torch.Tensor | None = None
        self.layers: list[torch.Tensor] = []

    def layer(self, call: LayerCall) -> None:
        if self.seeing is None:  # A queries that can see a B key (causal: a B token at or before them)
            self.seeing = (call.mask.allowed & self.b[:, None, :]).any(-1) & self.a  # (B, q)
            self.on_b = self.b[:, None, None, :].to(torch.float32)  # (B, 1, 1, k)
        share = 0
        for tile in call.tiles():  # the mass each query puts on B keys, summed over the A queries that count
            on_b = torch.linalg.vecdot(tile.weights, self.on_b[..., :tile.keys])  # (B, H, rows)
            share = share + (on_b * self.seeing[:, None, tile.start:tile.end]).sum(-1)  # (B, H)
        self.layers.append(share)

    def finish(self) -> None:
        if not self.layers:
            return
        share = torch.stack(self.layers, dim=1).sum(0).cpu().numpy().astype(np.float64)  # (layers, H)
        self.total = share if self.total is None else self.total + share
        self.queries += int(self.seeing.sum())
        self.layers = []

    def ranked(self):
        """(DataFrame layer, head, share, queries; best first): the mean share over the counted A queries."""
        import pandas as pd

        if self.total is None or not self.queries:
            raise ValueError(f"no document has a token matching A ({self.pattern_a!r}) that can see one matching B "
                             f"({self.pattern_b!r}); try other tokens or regex mode")
        mean = self.total / self.queries
        layers, heads = mean.shape
        layer_index, head_index = np.meshgrid(np.arange(layers), np.arange(heads), indexing="ij")
        frame = pd.DataFrame({"layer": layer_index.ravel(), "head": head_index.ravel(), "share": mean.ravel(),
                              "queries": self.queries})
        return frame.sort_values("share", ascending=False, kind="stable").reset_index(drop=True)


def search_heads(loaded, documents: list[Document], pattern_a: str, pattern_b: str, regex: bool = False,
                 max_tokens: int = 256, max_documents: int = 200):
    """Rank heads by how much A tokens attend to B tokens: per head, the mean over every A query (that can see a B
    key) of its attention mass on B keys, over the first ``max_documents`` documents that contain both, read in
    one batched pass (``PatternShare``).

    Returns (DataFrame layer, head, share, queries; best first, documents searched)."""
    runner = BatchRunner(loaded, max_tokens)
    search = PatternShare(loaded.tokenizer, pattern_a, pattern_b, regex)
    chosen = search.choose(_readable(runner, documents), max_documents)
    for group in runner.groups(chosen):
        runner.forward(runner.padded(group), [search])
    return search.ranked(), search.documents


def _readable(runner: BatchRunner, documents: list[Document]):
    """``(document, ids)`` of the documents that tokenise, lazily (a search stops at its count)."""
    for document in documents:
        try:
            yield document, runner.tokenize(document)
        except ValueError:
            continue


@dataclass(frozen=True)
class Embedding:
    """Queries and keys of one head in 2-D: ``points (n, 2)`` with per point its kind, document, position, token."""

    layer: int
    head: int
    method: str
    points: np.ndarray
    kind: list[str]  # "query" or "key"
    doc_id: list[str]
    position: list[int]
    token: list[str]
    context: list[str]
    model: str = ""


class QueryKeySample(Reduction):
    """One head's queries and keys of the documents in ``only`` (every document when None), read in the forward at
    its layer: ``queries[doc_id]`` and ``keys[doc_id]`` float32 ``(tokens, d)`` (the first ``positions`` tokens when
    given), each scaled by √scaling (so q·k is the score)."""

    def __init__(self, layer: int, head: int, only: set[str] | None = None, positions: int | None = None):
        self.layer_index, self.head = layer, head
        self.only = only
        self.positions = positions
        self.queries: dict[str, np.ndarray] = {}
        self.keys: dict[str, np.ndarray] = {}

    @property
    def seen(self) -> set[str]:
        return set(self.queries)

    def start(self, batch: Batch) -> None:
        self.batch = batch

    def layer(self, call: LayerCall) -> None:
        if call.index != self.layer_index or (self.only is not None and not any(
                document.doc_id in self.only for document in self.batch.documents)):
            return
        root = math.sqrt(call.scaling)
        queries = (call.query[:, self.head].to(torch.float32) * root).cpu().numpy()  # (B, S, d): one host copy
        keys = (call.key[:, self.head // call.group].to(torch.float32) * root).cpu().numpy()
        for row, (document, token_ids) in enumerate(zip(self.batch.documents, self.batch.token_ids)):
            if self.only is not None and document.doc_id not in self.only:
                continue
            kept = min(len(token_ids), self.positions or len(token_ids))
            self.queries[document.doc_id] = queries[row, :kept]
            self.keys[document.doc_id] = keys[row, :kept]


def query_key_embedding(loaded, documents: list[Document], layer: int, head: int, max_documents: int = 40,
                        max_tokens: int = 128, method: str = "pca", positions: int | None = None) -> Embedding:
    """AttentionViz's joint embedding of one head's queries and keys over ``max_documents`` documents (each read
    to ``max_tokens`` tokens, of which the first ``positions`` are embedded), in one batched pass
    (``QueryKeySample``)."""
    shape = _heads(loaded)
    if not (0 <= layer < shape[0] and 0 <= head < shape[1]):
        raise ValueError(f"there is no head {layer}.{head}: the model has layers 0..{shape[0] - 1} and heads "
                         f"0..{shape[1] - 1}")
    runner = BatchRunner(loaded, max_tokens)
    tokenized, _ = runner.tokenized(documents[:max_documents])
    if not tokenized:
        raise ValueError("none of these documents could be read")
    sample = QueryKeySample(layer, head, {document.doc_id for document, _ in tokenized}, positions)
    for group in runner.groups(tokenized):
        runner.forward(runner.padded(group), [sample])
    return embed(sample, tokenized, loaded.tokenizer, method, loaded.spec.key)


def embed(sample: QueryKeySample, tokenized: list[tuple[Document, list[int]]], tokenizer,
          method: str = "pca", model: str = "") -> Embedding:
    """The joint 2-D embedding of a ``QueryKeySample`` (documents in ``tokenized``'s order)."""
    queries = [sample.queries[document.doc_id] for document, _ in tokenized]
    keys = [sample.keys[document.doc_id] for document, _ in tokenized]
    meta = []
    for document, ids in tokenized:  # per document, its queries then its keys: the stacking order below
        ids = ids[:len(sample.queries[document.doc_id])]
        tokens = text.display_tokens(tokenizer, ids)
        contexts = [_context(tokenizer, ids, position) for position in range(len(ids))]
        for kind in ("query", "key"):
            for position, token in enumerate(tokens):
                meta.append((kind, document.doc_id, position, token, contexts[position]))
    all_q, all_k = np.concatenate(queries), np.concatenate(keys)
    # q·c and k/c leave every score q·k unchanged; c makes the two clouds' mean norms equal
    factor = np.sqrt(np.linalg.norm(all_k, axis=1).mean() / max(np.linalg.norm(all_q, axis=1).mean(), 1e-12))
    shift = all_q.mean(0) * factor - all_k.mean(0) / factor  # then the key centroid moves onto the query centroid
    vectors = []
    for q, k in zip(queries, keys):
        vectors += [q * factor, k / factor + shift]
    data = np.concatenate(vectors).astype(np.float64)
    method = method if method in ("pca", "umap") else "pca"
    if method == "umap":
        try:
            import umap
        except ImportError:
            method = "pca"
    if method == "umap":
        import umap

        points = umap.UMAP(n_components=2, random_state=0).fit_transform(data)
    else:
        centred = data - data.mean(0)
        _, _, vt = np.linalg.svd(centred, full_matrices=False)
        points = centred @ vt[:2].T
    kind, doc_id, position, token, context = (list(column) for column in zip(*meta))
    return Embedding(sample.layer_index, sample.head, method, points.astype(np.float32), kind, doc_id,
                     [int(p) for p in position], token, context, model)


def _heads(loaded) -> tuple[int, int]:
    from models.corpus.statistics import _shape

    return _shape(loaded.model)


# --- the corpus views' analyses: (loaded, result, options) -> what the figure draws --------------------------

def stored_documents(store: ResultStore) -> list[Document]:
    """The documents a results folder read, in the order they were written."""
    frame = store.table()
    ok = frame[frame["status"] == "ok"]
    return [Document(row.doc_id, row.text, row.source) for row in ok.itertuples()]


def _model_for(loaded, info: RunInfo, what: str) -> None:
    """``loaded`` must be the model the results are of: a search or an embedding reads its q and k."""
    if loaded is None:
        raise ValueError(f"{what} needs the model these results are of ({info.model}); give it with --model")
    if loaded.spec.key != info.model:
        raise ValueError(f"these results are of {info.model}; {what} needs that model, not {loaded.spec.key}")


@dataclass(frozen=True)
class TopExamples:
    model: str
    layer: int
    head: int
    examples: object  # DataFrame: doc_id, peak_weight, query, key, their tokens and contexts


def top_examples_view(loaded, result, options) -> TopExamples:
    """``corpus_top``: the documents where head ``options.layer``.``options.head`` peaks highest (the tokenizer of
    the results' model decodes their contexts)."""
    store = open_results(options.results)
    _model_for(loaded, store.info, "the top examples' contexts")
    examples = top_examples(store, loaded.tokenizer, options.layer, options.head, options.count)
    return TopExamples(store.info.model, options.layer, options.head, examples)


def embedding_view(loaded, result, options) -> Embedding:
    """``corpus_embedding``: the joint query–key embedding of one head over the first ``options.embedded``
    documents of the results folder."""
    store = open_results(options.results)
    _model_for(loaded, store.info, "the query–key embedding")
    return query_key_embedding(loaded, stored_documents(store), options.layer, options.head, options.embedded,
                               store.info.max_tokens, options.method, EMBEDDING_TOKENS)


# positions embedded per document (its first ones, read as the run read it): 30 documents of 128 tokens are
# ~7,700 points to draw
EMBEDDING_TOKENS = 128


@dataclass(frozen=True)
class SearchResult:
    model: str
    pattern_a: str
    pattern_b: str
    ranked: object  # DataFrame layer, head, share, queries; best first
    searched: int  # documents that hold both


def search_view(loaded, result, options) -> SearchResult:
    """``corpus_search``: the heads ranked by the share of attention from A tokens to B tokens over the first
    ``options.searched`` documents of the results folder that hold both."""
    store = open_results(options.results)
    _model_for(loaded, store.info, "the A→B search")
    ranked, searched = search_heads(loaded, stored_documents(store), options.a, options.b, options.regex,
                                    store.info.max_tokens, options.searched)
    return SearchResult(store.info.model, options.a, options.b, ranked, searched)
