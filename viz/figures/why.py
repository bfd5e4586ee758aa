"""Why a head looks where it does (``models.analysis.why``): one cell's score split into query-side × key-side
component pairs, and for a whole head which components feed its queries and its keys.

``why``: the strongest pairs in score units (each labelled with its share of the score) with the rest summed, what made
the query and what made the key (the two marginals), why this key and not the row's runner-up, the score over RoPE's
frequency pairs (or, without RoPE, the part of the score a position embedding takes part in), and the intervention
check. The files hold every pair (``pairs``: no cut, so they sum to the score). ``why_head``: one row per component
with its mean part of the score through the key and through the query, over the head's strongest cells.
"""
from __future__ import annotations

from dataclasses import dataclass

import altair as alt
import numpy as np
import pandas as pd

from models.analysis import why
from models.core.text import with_marks
from models.lessons import induction
from viz import export, heatmap
from viz.figure import Figure, view
from viz.heatmap import PAD

BAR_HEIGHT = 18  # px per bar
FULL_WIDTH = 520  # px of a chart across the page's column
HALF_WIDTH = 300  # px of a chart beside another
LABEL_LIMIT = 260  # px of a component's name on an axis (the tooltip has all of it)
LABEL_ROOM = 40  # px either side of the bars for their share labels


@dataclass(frozen=True)
class WhyOptions:
    layer: int = 0
    head: int = 0
    query: int | None = None  # the row; None: a language model's last token, [CLS] elsewhere
    key: int | None = None  # the column; None: the row's strongest key
    check: bool = True  # take the top pairs' components out of the stream and see the score move
    top: int = 12  # pairs drawn (the files hold every pair)


@dataclass(frozen=True)
class WhyHeadOptions:
    layer: int = 0
    head: int = 0
    first: int | None = None  # the window's first row; None: the last ``rows`` rows
    rows: int = 64  # rows in the window
    cells: int = 32  # the strongest of the rows' top cells
    skip_first: bool = True  # leave the first token (where many heads park, a sink) out when picking each row's key
    top: int = 12  # components drawn (the table has every one)


def _ranked(names: list[str], values: np.ndarray, top: int, rest: str) -> pd.DataFrame:
    """The ``top`` values by size with their names, and one row summing the rest (when there is a rest)."""
    order = np.argsort(-np.abs(values), kind="stable")
    kept = order[:top]
    rows = [{"name": names[i], "contribution": float(values[i]), "rank": rank} for rank, i in enumerate(kept)]
    if len(order) > top:
        rows.append({"name": f"{rest} ({len(order) - top} more)", "contribution": float(values[order[top:]].sum()),
                     "rank": top})
    return pd.DataFrame(rows)


def _bars(frame: pd.DataFrame, title: str, total: float, width: int, axis: str = "score units") -> alt.Chart:
    """Horizontal bars in score units, red for what raises the score and blue for what lowers it, each labelled with
    its share of ``total``'s size (signed as the bar: a negative score's parts read as they push)."""
    size = abs(total) if total and np.isfinite(total) else np.nan
    frame = frame.assign(share=frame["contribution"] / size,
                         sign=np.where(frame["contribution"] >= 0, "raises", "lowers"))
    frame["label"] = [f"{s:+.0%}" if np.isfinite(s) else "" for s in frame["share"]]
    base = alt.Chart(frame).encode(
        y=alt.Y("name:N", sort=alt.EncodingSortField("rank", op="min"), title=None,
                axis=alt.Axis(labelLimit=LABEL_LIMIT)),
        x=alt.X("contribution:Q", title=axis, scale=alt.Scale(padding=LABEL_ROOM)),
        tooltip=["name", alt.Tooltip("contribution:Q", format="+.4f"), alt.Tooltip("share:Q", format="+.1%")])
    bars = base.mark_bar().encode(color=alt.Color("sign:N", scale=alt.Scale(domain=["raises", "lowers"],
                                                                             range=["#c0392b", "#2471a3"]),
                                                  legend=None))
    # each share beside its bar's outer end: right of a bar that raises the score, left of one that lowers it
    right = base.mark_text(align="left", dx=3, fontSize=10).encode(text="label:N").transform_filter(
        alt.datum.contribution >= 0)
    left = base.mark_text(align="right", dx=-3, fontSize=10).encode(text="label:N").transform_filter(
        alt.datum.contribution < 0)
    return (bars + right + left).properties(width=width, height=BAR_HEIGHT * max(len(frame), 1), title=title)


def _pairs_frame(found: why.CellWhy) -> pd.DataFrame:
    """Every pair: the CSV's rows and the JSON's ``pairs``."""
    nq, nk = found.contributions.shape
    frame = pd.DataFrame({
        "query_component": np.repeat(np.array(found.query_components, dtype=object), nk),
        "key_component": np.tile(np.array(found.key_components, dtype=object), nq),
        "contribution": found.contributions.ravel()})
    if found.runner_up_contributions is not None:
        frame["minus_runner_up"] = found.runner_up_contributions.ravel()
    return frame


def _rope_chart(found: why.CellWhy) -> alt.Chart:
    bands = found.rope
    pairs = np.arange(len(bands.contributions))
    wavelengths = bands.wavelengths
    frame = pd.DataFrame({"pair": pairs, "contribution": bands.contributions,
                          "wavelength": wavelengths if wavelengths is not None else np.full(len(pairs), np.nan)})
    frame["sign"] = np.where(frame["contribution"] >= 0, "raises", "lowers")
    distance = abs(found.query - found.key)
    title = f"RoPE's frequency pairs (query and key {distance} apart)"
    return alt.Chart(frame).mark_bar().encode(
        x=alt.X("pair:O", title="frequency pair (0 turns fastest)", axis=alt.Axis(labelAngle=0, labelOverlap=True)),
        y=alt.Y("contribution:Q", title="score units"),
        color=alt.Color("sign:N", scale=alt.Scale(domain=["raises", "lowers"], range=["#c0392b", "#2471a3"]),
                        legend=None),
        tooltip=["pair", alt.Tooltip("wavelength:Q", format=",.1f", title="wavelength (tokens)"),
                 alt.Tooltip("contribution:Q", format="+.4f")],
    ).properties(width=HALF_WIDTH, height=180, title=title)


def _position_chart(found: why.CellWhy) -> alt.Chart:
    share = found.position
    total = float(found.contributions.sum())
    content = total - share.query_side - share.key_side + share.both
    frame = pd.DataFrame([
        {"name": "query's position × key's content", "contribution": share.query_side - share.both, "rank": 0},
        {"name": "query's content × key's position", "contribution": share.key_side - share.both, "rank": 1},
        {"name": "position × position", "contribution": share.both, "rank": 2},
        {"name": "content × content", "contribution": content, "rank": 3}])
    return _bars(frame, f"Position embeddings ({share.share:.0%} of the terms' size)", total, HALF_WIDTH)


def _checks_chart(found: why.CellWhy) -> alt.Chart:
    rows = []
    for rank, check in enumerate(found.checks):
        name = f"{check.side}: {check.component}"
        rows.append({"name": name, "rank": rank, "change": check.frozen, "how": "norms frozen (the term)"})
        if check.recomputed is not None:
            rows.append({"name": name, "rank": rank, "change": check.recomputed, "how": "norms recomputed"})
    frame = pd.DataFrame(rows)
    return alt.Chart(frame).mark_point(filled=True, size=80).encode(
        y=alt.Y("name:N", sort=alt.EncodingSortField("rank", op="min"), title=None,
                axis=alt.Axis(labelLimit=LABEL_LIMIT)),
        x=alt.X("change:Q", title="change of the score when the component is removed"),
        color=alt.Color("how:N", scale=alt.Scale(range=["#444444", "#e67e22"]), title=None,
                        legend=alt.Legend(orient="bottom")),
        shape=alt.Shape("how:N", legend=None),
        tooltip=["name", "how", alt.Tooltip("change:Q", format="+.4f")],
    ).properties(width=FULL_WIDTH, height=BAR_HEIGHT * max(len(found.checks), 1), title="Intervention check")


def _finite(value):
    """A float for JSON, or None where it is not finite (no runner-up, a share of a zero total)."""
    value = float(value)
    return value if np.isfinite(value) else None


def _records(frame: pd.DataFrame) -> list[dict]:
    return [{name: (_finite(value) if isinstance(value, (float, np.floating)) else
                    int(value) if isinstance(value, np.integer) else value) for name, value in row.items()}
            for row in frame.to_dict("records")]


def _payload(found: why.CellWhy) -> dict:
    pairs = _pairs_frame(found)
    runner = found.runner_up
    bands = None
    if found.rope is not None:
        wavelengths = found.rope.wavelengths
        bands = [{"pair": int(p), "contribution": float(c),
                  "frequency": None if found.rope.frequencies is None else float(found.rope.frequencies[p]),
                  "wavelength_tokens": None if wavelengths is None else float(wavelengths[p])}
                 for p, c in enumerate(found.rope.contributions)]
    return {
        "score": found.score, "weight": found.weight,
        "pairs": pairs[["query_component", "key_component", "contribution"]].to_dict("records"),
        "query_marginal": [{"component": n, "contribution": float(v)}
                           for n, v in zip(found.query_components, found.query_marginal)],
        "key_marginal": [{"component": n, "contribution": float(v)}
                         for n, v in zip(found.key_components, found.key_marginal)],
        "runner_up": None if runner is None else {
            "key": runner.position, "token": runner.token, "weight": runner.weight, "score": runner.score,
            "difference": found.score - runner.score,
            "key_side": [{"component": n, "contribution": float(v)} for n, v in
                         zip(found.key_components, found.runner_up_contributions.sum(axis=0))],
            "query_side": [{"component": n, "contribution": float(v)} for n, v in
                           zip(found.query_components, found.runner_up_contributions.sum(axis=1))]},
        "rope_bands": bands,
        "position_share": None if found.position is None else {
            "query_side": found.position.query_side, "key_side": found.position.key_side,
            "both": found.position.both, "share_of_terms": found.position.share},
        "intervention_check": [{"side": c.side, "component": c.component, "predicted": c.predicted,
                                "frozen": c.frozen, "recomputed": c.recomputed} for c in found.checks],
        "model": found.model, "input": found.input_name, "layer": found.layer, "head": found.head,
        "kv_group": found.kv_group, "query": found.query, "key": found.key, "query_token": found.query_token,
        "key_token": found.key_token, "score_bias": found.score_bias, "decomposition_error": found.error,
        "top_keys": [{"key": k.position, "token": k.token, "weight": k.weight, "score": k.score}
                     for k in found.top_keys],
        "softcap": found.softcap, "sink_weight": found.sink_weight, "read_from": found.source,
        "note": NOTE + (SOFTCAP_NOTE if found.softcap else ""),
    }


NOTE = ("score = scaling · q · k + score bias, as the softmax saw it; every norm frozen at its scale in this run, so "
        "the pairs sum to the score.")
SOFTCAP_NOTE = " The model caps scores (softcap · tanh(s / softcap)) after this: the split is of the score before it."


@view("why", "Why this head looks here: the score split into what wrote its query and its key", WhyOptions,
      analysis=why.why_cell, analysis_options=("layer", "head", "query", "key", "check"))
def why_cell(found: why.CellWhy, options: WhyOptions) -> Figure:
    """The top pairs, the marginals, the runner-up difference, RoPE bands (or the position share) and the
    intervention check. JSON: ``score``, ``weight``, ``pairs`` (every pair), the marginals, ``rope_bands``,
    ``intervention_check``."""
    top = max(1, int(options.top))
    nq, nk = found.contributions.shape
    pair_names = [f"{q}  ×  {k}" for q in found.query_components for k in found.key_components]
    charts = [_bars(_ranked(pair_names, found.contributions.ravel(), top, "the other pairs"),
                    f"The {min(top, nq * nk)} largest of {nq} × {nk} pairs (query component × key component)",
                    found.score, FULL_WIDTH),
              _bars(_ranked(list(found.query_components), found.query_marginal, 8, "the rest"),
                    f"What made the query ({found.query}: {found.query_token!r})", found.score, HALF_WIDTH),
              _bars(_ranked(list(found.key_components), found.key_marginal, 8, "the rest"),
                    f"What made the key ({found.key}: {found.key_token!r})", found.score, HALF_WIDTH)]
    layout = [(1,), (1, 1)]
    second = []
    if found.runner_up is not None:
        margin = found.score - found.runner_up.score
        second.append(_bars(_ranked(list(found.key_components), found.runner_up_contributions.sum(axis=0), 8,
                                    "the rest"),
                            f"Why key {found.key} and not {found.runner_up.position} ({found.runner_up.token!r})",
                            margin, HALF_WIDTH, "score minus the runner-up's"))
    if found.rope is not None:
        second.append(_rope_chart(found))
    elif found.position is not None:
        second.append(_position_chart(found))
    if second:
        charts += second
        layout.append(tuple(1 for _ in second))
    if found.checks:
        charts.append(_checks_chart(found))
        layout.append((1,))
    charts = [chart.properties(autosize=PAD) for chart in charts]
    strongest = int(np.argmax(np.abs(found.contributions)))
    caption = (f"Layer {found.layer}, head {found.head}: query {found.query} ({found.query_token!r}) scores key "
               f"{found.key} ({found.key_token!r}) {found.score:+.3f}, weight {found.weight:.1%} after softmax. "
               f"{nq} query components × {nk} key components; the {nq * nk:,} pairs sum to the score (off by "
               f"{found.error:.1e}): every norm is frozen at its scale in this run. Largest pair: "
               f"{pair_names[strongest]} ({found.contributions.flat[strongest]:+.3f}). Red raises the score, blue "
               "lowers it; labels are shares of the score's size.")
    if found.runner_up is not None:
        caption += (f" The runner-up key {found.runner_up.position} ({found.runner_up.token!r}) scores "
                    f"{found.runner_up.score:+.3f}: the difference is split by key component.")
    if found.rope is not None:
        caption += " RoPE: the same score over the frequency pairs that rotate q and k."
    if found.checks:
        caption += (" Intervention check: each component of the top pairs taken out of the stream that feeds this "
                    "layer's query (or key) only; with the norms frozen the score moves by exactly its term, with "
                    "them recomputed by the orange amount.")
    if found.softcap:
        caption += SOFTCAP_NOTE
    if found.sink_weight is not None:
        caption += f" The head's sink column takes {found.sink_weight:.1%} of this row."
    caption = with_marks(caption, [found.query_token, found.key_token])
    return Figure(
        export.file_stem(found.model, found.input_name, "why", f"layer {found.layer}", f"head {found.head}",
                         f"query {found.query}", f"key {found.key}"),
        charts=tuple(charts), layout=tuple(layout), caption=caption, width="content",
        table=lambda: _pairs_frame(found), payload=lambda: _payload(found),
        arrays=lambda: {"contributions": found.contributions, "query_marginal": found.query_marginal,
                        "key_marginal": found.key_marginal,
                        **({"rope_bands": found.rope.contributions} if found.rope is not None else {})},
        metadata={"model": found.model, "input": found.input_name, "layer": str(found.layer),
                  "head": str(found.head), "query": str(found.query), "key": str(found.key),
                  "query_components": "\n".join(found.query_components),
                  "key_components": "\n".join(found.key_components)})


def head_frame(found: why.HeadWhy) -> pd.DataFrame:
    """One row per component: its mean part of the score through the key and through the query (and against each
    row's runner-up key), with shares; the components that lift the chosen keys most first."""
    frame = pd.DataFrame({
        "component": list(found.components), "kind": list(found.kinds),
        "layer": found.component_layers, "head": found.component_heads,
        "key side": found.key_side, "key share": found.share("key_side"),
        "key side vs runner-up": found.key_vs_runner_up, "key share vs runner-up": found.share("key_vs_runner_up"),
        "query side": found.query_side, "query share": found.share("query_side"),
        "query side vs runner-up": found.query_vs_runner_up,
        "query share vs runner-up": found.share("query_vs_runner_up")})
    return frame.sort_values("key side vs runner-up", ascending=False, kind="stable").reset_index(drop=True)


@view("why_head", "What feeds a head's keys and queries (composition over its strongest cells)", WhyHeadOptions,
      analysis=why.why_head, analysis_options=("layer", "head", "first", "rows", "cells", "skip_first"))
def why_head(found: why.HeadWhy, options: WhyHeadOptions) -> Figure:
    """The components that feed the head's keys and its queries most, against each row's runner-up key. JSON:
    ``components`` (every component's columns), ``cells``."""
    frame = head_frame(found)
    top = max(1, int(options.top))
    names = list(found.components)
    charts = (
        _bars(_ranked(names, found.key_vs_runner_up, top, "the rest"), "What feeds the keys (this key vs the "
              "runner-up)", found.mean_margin, HALF_WIDTH, "mean score units"),
        _bars(_ranked(names, found.query_vs_runner_up, top, "the rest"), "What feeds the queries (vs the runner-up)",
              found.mean_margin, HALF_WIDTH, "mean score units"))
    charts = tuple(chart.properties(autosize=PAD) for chart in charts)
    best_key = names[int(np.argmax(found.key_vs_runner_up))]
    best_query = names[int(np.argmax(found.query_vs_runner_up))]
    caption = (f"Layer {found.layer}, head {found.head} over {len(found.cells)} cells ({found.selection}): mean score "
               f"{found.mean_score:+.3f}, {found.mean_margin:+.3f} above each row's runner-up key. What lifts the "
               f"chosen key above the runner-up most through the key: {best_key}; through the query: {best_query}. "
               "Shares are of the mean margin (the table also has them of the mean score); every norm frozen at its "
               "scale in this run.")
    return Figure(
        export.file_stem(found.model, found.input_name, "why head", f"layer {found.layer}", f"head {found.head}"),
        charts=charts, layout=((1, 1),), caption=caption, table=lambda: frame,
        payload=lambda: {"model": found.model, "input": found.input_name, "layer": found.layer, "head": found.head,
                         "kv_group": found.kv_group, "selection": found.selection,
                         "cells": [{"query": i, "key": j, "runner_up": r, "score": float(s), "margin": _finite(m)}
                                   for (i, j), r, s, m in zip(found.cells, found.runner_ups, found.scores,
                                                              found.margins)],
                         "mean_score": found.mean_score, "mean_margin": _finite(found.mean_margin),
                         "components": _records(frame), "decomposition_error": found.error,
                         "read_from": found.source, "note": NOTE},
        arrays=lambda: {"key_side": found.key_side, "query_side": found.query_side,
                        "key_vs_runner_up": found.key_vs_runner_up, "query_vs_runner_up": found.query_vs_runner_up,
                        "scores": found.scores, "cells": np.asarray(found.cells)},
        metadata={"model": found.model, "input": found.input_name, "layer": str(found.layer),
                  "head": str(found.head), "components": "\n".join(found.components)})


@dataclass(frozen=True)
class CircuitOptions:
    block: int = 8  # letters in the block that is repeated
    seed: int = 0  # which letters, and the distractor heads' random weights
    scheme: str = "viridis"


@view("why_circuit", "An induction circuit built by hand, and the decomposition finding it again", CircuitOptions,
      analysis=induction.circuit, analysis_options=("block", "seed"), page="mechanics")
def why_circuit(found: induction.Circuit, options: CircuitOptions) -> Figure:
    """The toy's two designed heads and what feeds its induction head's keys and queries (``models/lessons/
    induction.py``). JSON: the maps, the role scores and the induction head's composition table."""
    tokens = [f"{letter}" for letter in found.tokens]
    maps = (heatmap.attention_chart(found.previous_map, tokens, tokens, np.tril(np.ones_like(found.previous_map)),
                                    "Layer 0 head 0: the previous token", options.scheme, size=260, compact=True),
            heatmap.attention_chart(found.induction_map, tokens, tokens, np.tril(np.ones_like(found.induction_map)),
                                    "Layer 1 head 0: after the earlier copy", options.scheme, size=260,
                                    compact=True))
    head = found.head
    names = list(head.components)
    bars = (_bars(_ranked(names, head.key_vs_runner_up, 5, "the rest"), "What lifts its key (vs the runner-up)",
                  head.mean_margin, HALF_WIDTH - 40, "mean score units"),
            _bars(_ranked(names, head.query_vs_runner_up, 5, "the rest"), "What lifts its query (vs the runner-up)",
                  head.mean_margin, HALF_WIDTH - 40, "mean score units"))
    charts = tuple(chart.properties(autosize=PAD) for chart in maps + bars)
    key_top = names[int(np.argmax(head.key_vs_runner_up))]
    query_top = names[int(np.argmax(head.query_vs_runner_up))]
    caption = (f"{found.block} letters, twice. Layer 1 head 0 scores each second-copy letter against the letter after "
               f"its earlier copy {head.mean_score:+.2f} on average, {head.mean_margin:+.2f} above the next strongest "
               f"key. Split exactly (every norm frozen): through the key, {key_top} carries "
               f"{head.share('key_vs_runner_up')[names.index(key_top)]:.0%} of that margin; through the query, "
               f"{query_top} {head.share('query_vs_runner_up')[names.index(query_top)]:.0%}. The heads are named by "
               "the roles the app measures (previous-token, induction) on the toy's own repeated letters. "
               + induction.SMOLLM2_FINDING)
    return Figure(
        export.file_stem("toy induction circuit", f"block {found.block}", f"seed {options.seed}"),
        charts=charts, layout=((1, 1), (1, 1)), caption=caption, table=lambda: head_frame(head),
        payload=lambda: {"tokens": tokens, "previous_token_map": found.previous_map,
                         "induction_map": found.induction_map,
                         "role_scores": {name: values for name, values in found.role_scores.items()},
                         "components": _records(head_frame(head)), "mean_score": head.mean_score,
                         "mean_margin": _finite(head.mean_margin), "smollm2": induction.SMOLLM2_FINDING},
        arrays=lambda: {"previous_token_map": found.previous_map, "induction_map": found.induction_map,
                        "key_vs_runner_up": head.key_vs_runner_up, "query_vs_runner_up": head.query_vs_runner_up},
        metadata={"block": str(found.block), "seed": str(options.seed), "tokens": " ".join(tokens)})
