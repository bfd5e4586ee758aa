"""What the corpus page and the CLI read from a results folder, and the two questions that need the model again.

- ``summarize``: each statistic's mean over documents (each document counts once) and its spread (standard
  deviation over documents; the induction score over documents that have a repeated token), per (layer, head); MoE
  expert load, co-activation and router entropy averaged the same way.
- ``top_examples``: the documents where a head's peak (largest weight off the first token and the diagonal) is
  highest, with the tokens around the query and the key.
- ``search_heads``: which heads attend from tokens matching A to tokens matching B (exact token text or a regular
  expression), ranked by the mean share of an A query's attention that lands on B keys, over the corpus.
- ``query_key_embedding``: one head's queries and keys from many documents projected together (AttentionViz, Yeh et
  al., IEEE VIS 2023): keys are translated so that their centroid meets the queries' (softmax is invariant to adding
  one vector to every key changes a query's scores by a constant, so the shift keeps each query's attention), queries
  scaled by c and keys by 1/c (scores unchanged) so both clouds have the same mean norm, then PCA to 2-D (UMAP when ``umap-learn`` is installed).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import torch

from models.core import capture, text
from models.corpus.readers import Document
from models.corpus.statistics import STATISTICS, attention_weights
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
    """The ``corpus_heads`` view's analysis: the summary of the results folder ``options.results`` (written by the
    corpus page or ``python -m app.cli --page corpus``); ``loaded`` and ``result`` are not used."""
    if not options.results:
        raise ValueError("give the results folder of a corpus run (--results DIR); python -m app.cli --page corpus "
                         "--input FOLDER writes one")
    return summarize(ResultStore.open(options.results))


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


# --- questions that run the model again ------------------------------------------------------------------------

class _LayerObserver(capture.Recorder):
    """Calls ``reduce(layer_index, query, key, scaling, allowed, bias)`` for each self-attention layer."""

    def __init__(self, module_names, reduce):
        super().__init__(module_names=module_names)
        self.reduce = reduce
        self.index = 0

    def record(self, module, query, key, attention_mask, kwargs) -> None:
        name = self.module_names.get(id(module), "")
        if self.kind_of(module, name) == "cross":
            return
        q_len, k_len = query.shape[2], key.shape[2]
        scaling = kwargs.get("scaling")
        scaling = float(scaling) if scaling is not None else float(query.shape[-1]) ** -0.5
        allowed, bias = self._mask(module, attention_mask, kwargs, q_len, k_len)
        self.reduce(self.index, query, key, scaling, allowed, bias)
        self.index += 1


def _forward(loaded, ids: list[int], reduce) -> None:
    model = loaded.model
    base = getattr(model, "base_model", model) or model
    observer = _LayerObserver({id(m): name for name, m in model.named_modules()}, reduce)
    extra = {"use_cache": False} if "use_cache" in __import__("inspect").signature(base.forward).parameters else {}
    with torch.inference_mode(), capture.observing(model, observer):
        base(input_ids=torch.tensor([ids], device=loaded.device), **extra)


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


def search_heads(loaded, documents: list[Document], pattern_a: str, pattern_b: str, regex: bool = False,
                 max_tokens: int = 256, max_documents: int = 200):
    """Rank heads by how much A tokens attend to B tokens: per head, the mean over every A query (that can see a B
    key) of its attention mass on B keys, over the first ``max_documents`` documents that contain both.

    Returns (DataFrame layer, head, share, queries; best first, documents searched)."""
    import pandas as pd

    match_a, match_b = token_matcher(pattern_a, regex), token_matcher(pattern_b, regex)
    total, counts, searched = None, 0, 0
    for document in documents:
        if searched >= max_documents:
            break
        try:
            ids = text.tokenize(loaded.tokenizer, document.text, max_tokens).ids
        except ValueError:
            continue
        tokens = text.display_tokens(loaded.tokenizer, ids)
        a_rows = [i for i, t in enumerate(tokens) if match_a(t)]
        b_cols = [i for i, t in enumerate(tokens) if match_b(t)]
        if not a_rows or not b_cols:
            continue
        searched += 1
        layers_share: list[torch.Tensor] = []
        rows, cols = torch.tensor(a_rows), torch.tensor(b_cols)

        def reduce(index, query, key, scaling, allowed, bias):
            weights = attention_weights(query[:, :, rows.to(query.device)], key, scaling,
                                        allowed[:, rows], None if bias is None else bias[..., rows, :])
            layers_share.append(weights[0][:, :, cols.to(weights.device)].sum(-1).cpu())  # (H, a)

        _forward(loaded, ids, reduce)
        share = torch.stack(layers_share)  # (layers, H, a)
        visible = allowed_any(loaded, a_rows, b_cols)
        if not visible.any():
            continue
        share = share[:, :, torch.tensor(visible)]
        total = share.sum(-1) if total is None else total + share.sum(-1)
        counts += int(visible.sum())
    if total is None:
        raise ValueError(f"no document has a token matching A ({pattern_a!r}) that can see one matching B "
                         f"({pattern_b!r}); try other tokens or regex mode")
    mean = (total / counts).numpy()
    layers, heads = mean.shape
    layer_index, head_index = np.meshgrid(np.arange(layers), np.arange(heads), indexing="ij")
    frame = pd.DataFrame({"layer": layer_index.ravel(), "head": head_index.ravel(), "share": mean.ravel(),
                          "queries": counts})
    return frame.sort_values("share", ascending=False).reset_index(drop=True), searched


def allowed_any(loaded, a_rows: list[int], b_cols: list[int]) -> np.ndarray:
    """Which A queries can see at least one B key (a causal model: a B token at or before it)."""
    causal = not getattr(loaded.model.config, "is_encoder_decoder", False) and loaded.spec.family != "encoder"
    if not causal:
        return np.ones(len(a_rows), dtype=bool)
    first_b = min(b_cols)
    return np.asarray([row >= first_b for row in a_rows])


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


def query_key_embedding(loaded, documents: list[Document], layer: int, head: int, max_documents: int = 40,
                        max_tokens: int = 128, method: str = "pca") -> Embedding:
    """AttentionViz's joint embedding of one head's queries and keys over ``max_documents`` documents."""
    queries, keys, meta = [], [], []
    shape = _heads(loaded)
    if not (0 <= layer < shape[0] and 0 <= head < shape[1]):
        raise ValueError(f"there is no head {layer}.{head}: the model has layers 0..{shape[0] - 1} and heads "
                         f"0..{shape[1] - 1}")
    for document in documents[:max_documents]:
        try:
            ids = text.tokenize(loaded.tokenizer, document.text, max_tokens).ids
        except ValueError:
            continue
        tokens = text.display_tokens(loaded.tokenizer, ids)
        kept = {}

        def reduce(index, query, key, scaling, allowed, bias):
            if index == layer:
                group = query.shape[1] // key.shape[1]
                kept["q"] = query[0, head].float().cpu().numpy() * np.sqrt(scaling)
                kept["k"] = key[0, head // group].float().cpu().numpy() * np.sqrt(scaling)

        _forward(loaded, ids, reduce)
        queries.append(kept["q"])
        keys.append(kept["k"])
        for kind in ("query", "key"):
            for position, token in enumerate(tokens):
                meta.append((kind, document.doc_id, position, token, _context(loaded.tokenizer, ids, position)))
        # meta order must match stacking below: per document, its queries then its keys
    if not queries:
        raise ValueError("none of these documents could be read")
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
            import umap  # noqa: F401
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
    return Embedding(layer, head, method, points.astype(np.float32), kind, doc_id, [int(p) for p in position],
                     token, context)


def _heads(loaded) -> tuple[int, int]:
    from models.corpus.statistics import _shape

    return _shape(loaded.model)
