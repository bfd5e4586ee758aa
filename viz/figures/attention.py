"""Figures of attention maps that every text family shares (GPT, encoder, the translator's self-attention): one head,
a zoomed region of a long input, every head at once, one token's attention, the next-token distribution and a
generated token's view.

Every builder reads the result contract only (``result.maps(kind)``, ``tokens_in``, ``allowed``), so a family whose
result carries attention can offer these views by naming them in its ``Family.views``.
"""
from __future__ import annotations

from dataclasses import dataclass

import altair as alt
import numpy as np
import pandas as pd

from models.analysis import heads
from models.core import selection
from models.core.results import STEP_CONVENTION, RunResult, TextResult
from models.core.selection import Head, Layer
from models.core.text import with_marks
from viz import export, heatmap
from viz.figure import Figure, NoOptions, view
from viz.figures.rows import RowOptions, query_row

ROWS_COLUMNS = ("Rows: the token doing the attending (query). Columns: the tokens it attends to (keys). Each row "
                "sums to 1.")
MASKED = "Grey cells are masked (the model could not look there)."
SINK_LABEL = "⟨sink⟩"
SINK_COLUMN = (f"The last column, {SINK_LABEL}, is the share of each row that went to the head's learned attention "
               "sink (a logit in every row's softmax denominator, with no token behind it): the keys' weights sum "
               "to one minus it.")


def layer_title(maps, layer: int) -> str:
    """``layer N`` with the model's own number (a hybrid's attention layers sit between layers of other kinds), and
    ``(local, 512)`` / ``(global)`` where some layers attend within a sliding window (Gemma 3)."""
    return maps.layer_label(layer)


def window_note(maps, layer: int, keys: int) -> str:
    """What a sliding-window layer's mask means on this input ("" for a layer without one)."""
    window = maps.layer_window(layer)
    if not window:
        return ""
    if keys <= window:
        return (f" A local layer: each query sees only the last {window:,} tokens (itself included); this input is "
                "shorter than that, so its mask is the plain causal one.")
    others = any(not maps.layer_window(i) for i in range(maps.num_layers))
    return (f" A local layer: each query sees only the last {window:,} tokens (itself included), so the map stops "
            f"{window:,} tokens back, a band along the diagonal"
            + ("; the global layers see every earlier token." if others else "."))


def rows_columns(allowed: np.ndarray) -> str:
    """How to read a heatmap; the grey cells explained only when the map has some (a causal or padding mask)."""
    return ROWS_COLUMNS + (" " + MASKED if not np.all(allowed) else "")


@selection.checked
@dataclass(frozen=True)
class HeadOptions:
    kind: str = ""  # "self", "encoder", "decoder", "cross"; "" = the result's first kind
    layer: Layer = 0
    head: Head = 0
    scheme: str = "viridis"
    statistic: str = "maximum"  # a long input's pixels: each block's largest weight, or its mean


FULL_EXPORT_TOKENS = 2048  # up to this a side the head's files hold every weight; beyond, the overview's tiles


@view("head", "One head", HeadOptions)
def head(result: RunResult, options: HeadOptions) -> Figure:
    """One head (or the head average) as a heatmap; a long input as an image of the whole map, where each pixel is
    the largest (or mean) weight of its block of cells, computed where the model's q and k are (never the whole
    map), and colours saturate at the median of each query's largest weight."""
    from models.core.tiles import pyramid_tile

    maps = result.maps(options.kind)
    layer, head = selection.pick(maps, options.layer, options.head)  # a message a user can act on, before any work
    name = export.head_label(head)
    query_tokens, key_tokens = maps.tokens_in(layer)
    n_q, n_k = len(query_tokens), len(key_tokens)
    title = f"{layer_title(maps, layer)}, {selection.head_label(selection.head_choice(head))}"
    chart = image = None
    whole = max(n_q, n_k) <= FULL_EXPORT_TOKENS  # the files hold every weight (computed on click only)
    sink = maps.sink_share(layer, head)
    if max(n_q, n_k) <= heatmap.MAX_CHART_TOKENS:
        weights, allowed = maps.head(layer, head), maps.allowed(layer)
        caption = rows_columns(allowed) + window_note(maps, layer, n_k)
        shown_keys = key_tokens
        if sink is not None:  # the sink as a column of its own, so that every drawn row sums to 1
            weights = np.concatenate([weights, sink[:, None]], axis=1)
            allowed = np.concatenate([allowed, np.ones((n_q, 1), dtype=bool)], axis=1)
            shown_keys = [*key_tokens, SINK_LABEL]
            caption += " " + SINK_COLUMN
        chart = heatmap.attention_chart(weights, query_tokens, shown_keys, allowed, title, options.scheme)
        overview = None
    else:
        tile = pyramid_tile(max(n_q, n_k), heatmap.OVERVIEW_PX)
        overview = maps.tiles(layer, head, tile=tile)
        image, vmax = heatmap.tiles_image(overview, options.statistic, options.scheme, heatmap.OVERVIEW_PX)
        which = "largest" if options.statistic == "maximum" else "mean"
        caption = (f"{title}: all {n_q} × {n_k}"
                   + (f" (each pixel the {which} weight of {tile} × {tile} cells)" if tile > 1 else "")
                   + f". Colours saturate at {vmax:.3f} (the median of each query's largest weight"
                   + (", or the 99th percentile of the block means" if options.statistic == "mean" else "")
                   + "). " + ROWS_COLUMNS
                   + (" " + MASKED if float(overview.visible.sum()) < n_q * n_k else "")
                   + window_note(maps, layer, n_k)
                   + (f" The head's learned sink takes {float(sink.mean()):.0%} of a row on average (the keys' "
                      "weights sum to one minus it)." if sink is not None else ""))

    def weights_now():  # recomputed when a file is asked for: a cached figure keeps no (q, k) map
        return maps.head(layer, head)

    if whole:
        table = lambda: export.matrix_frame(weights_now(), query_tokens, key_tokens)  # noqa: E731
        payload = lambda: {"model": result.model.key, "kind": maps.kind, "layer": layer, "head": name,  # noqa: E731
                           "query_tokens": query_tokens, "key_tokens": key_tokens, "weights": weights_now(),
                           "allowed": maps.allowed(layer),
                           **({"sink_share": sink} if sink is not None else {})}
        arrays = lambda: {"weights": weights_now(), "allowed": maps.allowed(layer),  # noqa: E731
                          **({"sink_share": sink} if sink is not None else {})}
    else:  # 131,072² weights would be 68 GB: the files hold the overview's tiles
        table = lambda: _tiles_frame(overview)  # noqa: E731
        payload = lambda: {"model": result.model.key, "kind": maps.kind, "layer": layer, "head": name,  # noqa: E731
                           "tokens": n_q, "query_edges": overview.query_edges, "key_edges": overview.key_edges,
                           "maximum": overview.maximum, "mean": overview.mean, "visible": overview.visible}
        arrays = lambda: {"query_edges": overview.query_edges, "key_edges": overview.key_edges,  # noqa: E731
                          "maximum": overview.maximum, "mean": overview.mean, "visible": overview.visible,
                          "row_max": overview.row_max}
    return Figure(
        export.run_stem(result, maps.kind, f"layer {layer}", f"head {name}"), chart=chart, image=image,
        caption=with_marks(caption, query_tokens, key_tokens),
        table=table, payload=payload, arrays=arrays,  # the head named in the file, nothing more
        metadata=export.run_metadata(result, kind=maps.kind, layer=layer, head=name))


def _tiles_frame(tiles) -> pd.DataFrame:
    """One row per tile: its first and last query and key and its maximum, mean and visibility."""
    rows, cols = np.meshgrid(np.arange(tiles.shape[0]), np.arange(tiles.shape[1]), indexing="ij")
    return pd.DataFrame({"first query": tiles.query_edges[:-1][rows.ravel()],
                         "last query": tiles.query_edges[1:][rows.ravel()] - 1,
                         "first key": tiles.key_edges[:-1][cols.ravel()],
                         "last key": tiles.key_edges[1:][cols.ravel()] - 1,
                         "maximum": tiles.maximum.ravel(), "mean": tiles.mean.ravel(),
                         "visible": tiles.visible.ravel()})


@selection.checked
@dataclass(frozen=True)
class ZoomOptions:
    kind: str = ""
    layer: Layer = 0
    head: Head = 0
    scheme: str = "viridis"
    queries: tuple[int, int] = (0, heatmap.MAX_CHART_TOKENS - 1)  # first and last query shown, inclusive
    keys: tuple[int, int] = (0, heatmap.MAX_CHART_TOKENS - 1)


@view("head_zoom", "One head, a region cell by cell", ZoomOptions)
def head_zoom(result: RunResult, options: ZoomOptions) -> Figure:
    """A region of at most 64 × 64 cells of a long input's map, with a tooltip per cell, compact enough for half a
    laptop screen (the chart must fit its column: Vega maps the pointer in its own pixels)."""
    maps = result.maps(options.kind)
    layer, head = selection.pick(maps, options.layer, options.head)
    name = export.head_label(head)
    query_tokens, key_tokens = maps.tokens_in(layer)
    limit = heatmap.MAX_CHART_TOKENS
    (q0, q1), (k0, k1) = options.queries, options.keys
    n_q, n_k = len(query_tokens), len(key_tokens)
    if not (0 <= q0 < n_q and 0 <= k0 < n_k and q0 <= q1 and k0 <= k1):
        raise ValueError(f"the region queries {q0}–{q1}, keys {k0}–{k1} is outside the {n_q} × {n_k} map")
    # at most 64 a side, and no further than the map goes
    rows = slice(q0, min(q1, q0 + limit - 1, n_q - 1) + 1)
    cols = slice(k0, min(k1, k0 + limit - 1, n_k - 1) + 1)
    # the exact cells of the region alone, computed where q and k are (each row normalised over every key it sees)
    region = maps.window(layer, head, (rows.start, rows.stop), (cols.start, cols.stop))
    allowed = maps.window_allowed(layer, (rows.start, rows.stop), (cols.start, cols.stop))
    chart = heatmap.attention_chart(region, query_tokens[rows], key_tokens[cols], allowed,
                                    f"queries {rows.start}–{rows.stop - 1}, keys {cols.start}–{cols.stop - 1}",
                                    options.scheme, query_offset=rows.start, key_offset=cols.start, size=300,
                                    compact=True)
    # a click on a cell names its query (the page opens that row)
    chart = chart.add_params(alt.selection_point(name="cell", fields=["query position"], on="click", clear=False))
    where = f"queries {rows.start}-{rows.stop - 1}", f"keys {cols.start}-{cols.stop - 1}"
    return Figure(
        export.run_stem(result, maps.kind, f"layer {layer}", f"head {name}", *where), chart=chart,
        table=lambda: export.matrix_frame(region, query_tokens[rows], key_tokens[cols]),
        arrays=lambda: {"weights": region, "allowed": allowed,
                        "query_positions": np.arange(rows.start, rows.stop), "key_positions": np.arange(cols.start,
                                                                                                        cols.stop)},
        metadata=export.run_metadata(result, kind=maps.kind, layer=layer, head=name, region=" ".join(where)))


@selection.checked
@dataclass(frozen=True)
class GridOptions:
    kind: str = ""
    layer: Layer = 0  # the head framed in red
    head: Head = 0
    scheme: str = "viridis"


@view("grid", "All heads (model view)", GridOptions, analysis=heads.summarize_run, analysis_options=("kind",))
def grid(summary: heads.HeadSummary, options: GridOptions) -> Figure:
    """Every head of every layer as a thumbnail (block means to at most 64 × 64), the selected one framed."""
    layer = selection.layer_index(options.layer, len(summary.thumbnails))
    selected = (layer, -1 if options.head == selection.MEAN else options.head)
    image = heatmap.head_grid_image(summary.thumbnails, options.scheme, selected=selected,
                                    group_size=summary.group_size)
    groups = (f"; heads are labelled H<head>/kv<group> and spaced by key/value group ({summary.group_size} query "
              "heads share one key and value head, GQA)" if summary.group_size > 1 else "")
    return Figure(
        export.file_stem(summary.model, summary.input_name, summary.kind, "all heads"), image=image,
        caption="Every head of every layer (block-averaged to at most 64 × 64); red frame: the head shown above"
                + groups,
        table=lambda: heads.summary_table(summary),
        payload=lambda: {"model": summary.model, "kind": summary.kind, "statistics": summary.statistics},
        arrays=lambda: {"thumbnails": summary.thumbnails, **summary.statistics},
        metadata={"model": summary.model, "input": summary.input_name, "kind": summary.kind})


@selection.checked
@dataclass(frozen=True)
class StatisticsOptions:
    kind: str = ""
    statistic: str = "entropy_bits"  # one of models.analysis.heads.STATISTICS
    layer: Layer = 0  # the head framed in red; the mean of heads frames nothing
    head: Head = 0
    scheme: str = "viridis"


@view("head_statistics", "A statistic of every head", StatisticsOptions, analysis=heads.summarize_run,
      analysis_options=("kind",))
def head_statistics(summary: heads.HeadSummary, options: StatisticsOptions) -> Figure:
    """One statistic of every head as a clickable layer × head chart (the selection is named "pick"), and every
    statistic of every head as a table."""
    values = summary.values(options.statistic)  # a statistic of the input or a role score; a message if neither
    label = summary.label(options.statistic)
    selected = None if options.head == selection.MEAN else \
        (selection.layer_index(options.layer, len(values)), options.head)
    chart = heatmap.head_statistic_chart(values, label, selected, options.scheme, group_size=summary.group_size)
    caption = "Click a cell to open that head above."
    if summary.roles:
        caption += (" Role scores are measured on repeated random tokens ([BOS] + R + R, 32 tokens twice), not on "
                    "this input: induction = attention from the second copy to the token after the earlier "
                    "occurrence, duplicate-token = to the earlier occurrence itself.")
    if summary.group_size > 1:
        caption += (f" Black rules: key/value groups ({summary.group_size} query heads share one key and value "
                    "head, GQA).")
    return Figure(
        export.file_stem(summary.model, summary.input_name, summary.kind, "head statistics", options.statistic),
        chart=chart, caption=caption, table=heads.summary_table(summary),
        payload=lambda: {"model": summary.model, "kind": summary.kind, "statistics": summary.statistics,
                         "roles": summary.roles, "kv_heads": summary.kv_heads or summary.num_heads},
        arrays=lambda: {**summary.statistics, **summary.roles},
        metadata={"model": summary.model, "input": summary.input_name, "kind": summary.kind})


@selection.checked
@dataclass(frozen=True)
class FocusOptions:
    kind: str = ""
    layer: Layer = 0
    head: Head = 0
    query: int = -1  # the attending token's position; -1 = the last
    # several attending tokens at once (a word split into pieces, a phrase): queries ``query``..``query_last``
    # (inclusive) taken together; None: ``query`` alone
    query_last: int | None = None
    combine: str = "mean"  # how a span's rows are taken together: "mean" (still sums to 1) or "sum"


FOCUS_BARS = 1024  # keys drawn as bars; a longer row is shown as its top keys in context (viz/figures/rows.py)
COMBINE = ("mean", "sum")


def query_span(options: FocusOptions, queries: int) -> tuple[int, int]:
    """The first and last query (inclusive, counted from 0) the focus options name, checked against ``queries``."""
    first = options.query if options.query >= 0 else queries + options.query
    if not 0 <= first < queries:
        raise ValueError(f"query {options.query} does not exist: the input has {queries} tokens")
    if options.query_last is None:
        return first, first
    last = options.query_last if options.query_last >= 0 else queries + options.query_last
    if not first <= last < queries:
        raise ValueError(f"the query span {first}–{options.query_last} does not fit the input's {queries} tokens: "
                         "give its first and last token, first ≤ last")
    if options.combine not in COMBINE:
        raise ValueError(f"a span's rows are combined by {' or '.join(COMBINE)}, not {options.combine!r}")
    return first, last


@view("focus", "Token focus", FocusOptions)
def focus(result: RunResult, options: FocusOptions) -> Figure:
    """One query token's attention over the keys, as bars in token order (masked keys left out); or a span of query
    tokens taken together (a word's pieces, a phrase): the mean of their rows (a distribution again) or their sum
    (how much attention the span sends to each key, up to the number of its tokens)."""
    maps = result.maps(options.kind)
    layer, head = selection.pick(maps, options.layer, options.head)
    name = export.head_label(head)
    query_tokens, key_tokens = maps.tokens_in(layer)
    first, last = query_span(options, len(query_tokens))
    labels = heatmap.token_labels(query_tokens)
    if first == last:
        if len(key_tokens) > FOCUS_BARS:  # a bar per key stops being readable (and sendable): the row's top keys
            return query_row(result, RowOptions(options.kind, layer, head, first))
        label = labels[first]
        row, allowed = maps.row(layer, head, first), maps.row_allowed(layer, first)
        title, where, token = f"Where '{label}' looks", f"query {first}", query_tokens[first]
    else:
        if len(key_tokens) > FOCUS_BARS:
            raise ValueError(f"a span of queries is drawn as bars over at most {FOCUS_BARS:,} keys, and this input "
                             f"has {len(key_tokens):,}: look at one query of it (its top keys in context)")
        rows = maps.window(layer, head, (first, last + 1), (0, len(key_tokens)))  # (span, keys)
        allowed = maps.window_allowed(layer, (first, last + 1), (0, len(key_tokens))).any(axis=0)
        row = (rows.mean(axis=0) if options.combine == "mean" else rows.sum(axis=0)).astype(np.float32)
        label = " ".join(labels[first:last + 1])
        title = f"Where '{label}' looks ({options.combine} of {last - first + 1} queries)"
        where, token = f"queries {first}-{last} {options.combine}", " ".join(query_tokens[first:last + 1])
    chart = heatmap.token_bars(row, key_tokens, title, allowed)
    span = {} if first == last else {"query_last": last, "combine": options.combine}
    return Figure(
        export.run_stem(result, maps.kind, f"layer {layer}", f"head {name}", where), chart=chart, width="stretch",
        caption=with_marks("", [label], key_tokens),
        table=lambda: pd.DataFrame({"key": key_tokens, "weight": row, "visible": allowed}),
        payload=lambda: {"model": result.model.key, "kind": maps.kind, "layer": layer, "head": name, "query": first,
                         **span, "query_token": token, "key_tokens": key_tokens, "weights": row},
        arrays=lambda: {"weights": row, "allowed": allowed},
        metadata=export.run_metadata(result, kind=maps.kind, layer=layer, head=name, query=first, **span))


@view("next_token", "Next token", NoOptions)
def next_token(result: TextResult, options: NoOptions) -> Figure:
    """The model's top next tokens after the last position."""
    if not result.next_token:
        raise ValueError("this model predicts no next token (it is not a language model)")
    tokens = [t.token for t in result.next_token]
    probabilities = [t.probability for t in result.next_token]
    return Figure(
        export.run_stem(result, "next token"),
        chart=heatmap.probability_bars(tokens, probabilities, f"Top {len(tokens)} after the last token"),
        width="stretch", caption=with_marks("", tokens),
        table=lambda: pd.DataFrame({"token": tokens, "token_id": [t.token_id for t in result.next_token],
                                    "probability": probabilities}),
        payload=lambda: {"model": result.model.key, "tokens": tokens, "probabilities": probabilities},
        metadata=export.run_metadata(result))


@selection.checked
@dataclass(frozen=True)
class StepOptions:
    layer: Layer = 0
    head: Head = 0
    step: int = 1  # the generated token, counted from 1


@view("generation_step", "Generate and step through", StepOptions, run_options=True)
def generation_step(result: TextResult, options: StepOptions) -> Figure:
    """A generated token: the attention of the position that chose it (the position before it, over the prompt and
    the tokens generated before it; STEP_CONVENTION) and the candidates it was chosen from, that position's raw
    distribution before temperature, top-k, top-p and repetition penalty."""
    if not result.generation:
        raise ValueError("nothing was generated: the model ended the text at once")
    if not 1 <= options.step <= len(result.generation):
        raise ValueError(f"step {options.step} does not exist: {len(result.generation)} tokens were generated")
    chosen = result.generation[options.step - 1]
    maps = result.maps("self")
    layer, head = selection.pick(maps, options.layer, options.head)
    _, key_tokens = maps.tokens_in(layer)
    weights = maps.row(layer, head, chosen.query)  # one row, computed where q and k are
    visible = slice(0, chosen.query + 1)  # the choosing position sees the prompt and the tokens before the chosen one
    candidates = [c.token for c in chosen.candidates]
    probabilities = [c.probability for c in chosen.candidates]
    charts = (heatmap.token_bars(weights[visible], key_tokens[visible],
                                 f"Step {options.step}: where the model looked to choose '{chosen.token}'"),
              heatmap.probability_bars(candidates, probabilities, f"Candidates at step {options.step}",
                                       highlight=chosen.token))
    name = export.head_label(head)
    return Figure(
        export.run_stem(result, "generation", f"step {options.step}", f"layer {layer}", f"head {name}"),
        charts=charts, layout=((3, 2),), width="stretch",  # where it looked, wider than its candidates
        caption=with_marks(f"{STEP_CONVENTION} Attention and probabilities come from one teacher-forced forward "
                           "over the final text; probabilities are the model's raw distribution, before temperature, "
                           "top-k, top-p and repetition penalty.", key_tokens[visible], candidates),
        table=lambda: pd.DataFrame({"key": key_tokens[visible], "weight": weights[visible]}),
        payload=lambda: {"model": result.model.key, "step": options.step, "token": chosen.token,
                         "probability": chosen.probability, "layer": layer, "head": name,
                         "query_position": chosen.query, "key_tokens": key_tokens[visible],
                         "weights": weights[visible], "candidates": candidates,
                         "candidate_probabilities": probabilities},
        arrays=lambda: {"weights": weights[visible], "candidate_probabilities": np.asarray(probabilities)},
        metadata=export.run_metadata(result, step=options.step, layer=layer, head=name))


@dataclass(frozen=True)
class ShareOptions:
    scheme: str = "viridis"


@view("special_tokens", "Attention absorbed by special tokens", ShareOptions)
def special_tokens(result: TextResult, options: ShareOptions) -> Figure:
    """A layer × head map of the mean share of attention that lands on [CLS], [SEP] and other special tokens."""
    if not result.special_positions:
        raise ValueError("this input has no special tokens ([CLS], [SEP]) to measure")
    maps = result.maps("self")
    share = heads.special_token_share(maps, result.special_positions)
    names = ", ".join(sorted({result.tokens[i] for i in result.special_positions}))
    return Figure(
        export.run_stem(result, "special token share"),
        chart=heatmap.head_statistic_chart(share, f"share on {names}", scheme=options.scheme),
        caption=f"Mean share of each head's attention that lands on the special tokens ({names}). Clark et al. "
                "(2019) found many BERT heads park their attention there when they have nothing better to do: here "
                f"{float((share > 0.5).mean()):.0%} of heads put more than half of it there.",
        table=lambda: pd.DataFrame(share, index=pd.Index(range(share.shape[0]), name="layer"),
                                   columns=[f"head {h}" for h in range(share.shape[1])]),
        payload=lambda: {"model": result.model.key, "special_tokens": names, "share": share},
        arrays=lambda: {"share": share}, metadata=export.run_metadata(result, special_tokens=names))
