"""One query's exact weights over every key, at any length: its top keys in context and the whole row as a
profile, computed where the model's q and k are (``AttentionMaps.row``; a row at 131,072 tokens is 0.5 MB, its
head's map 68 GB). The focus view hands a row longer than it can draw as bars to this one.
"""
from __future__ import annotations

from dataclasses import dataclass

import altair as alt
import numpy as np
import pandas as pd

from models.core import selection
from models.core.results import RunResult, TextResult
from models.core.selection import Head, Layer
from models.core.text import visible_text
from viz import export, heatmap
from viz.figure import Figure, view

PROFILE_BINS = 600  # a long row's weights over the key positions, drawn as this many bins' maxima


@selection.checked
@dataclass(frozen=True)
class RowOptions:
    kind: str = ""
    layer: Layer = 0
    head: Head = 0
    query: int = -1  # the attending token's position; -1 = the last
    top: int = 20  # keys listed, strongest first
    context: int = 6  # tokens shown on each side of a key


def in_context(tokens: list[str], position: int, context: int, pieces: tuple[str, ...] = ()) -> str:
    """Key ``position`` among its neighbours, marked: ``… the cat ⟦sat⟧ on the …``. With ``pieces`` (each token's
    decoded text, leading spaces kept) they are joined as the text was; else the labels are joined by spaces.
    Plain text either way (line breaks and invisible characters shown as markers)."""
    first, last = max(0, position - context), min(len(tokens), position + context + 1)
    if len(pieces) == len(tokens):
        key = pieces[position]
        lead = key[:len(key) - len(key.lstrip(" "))]
        text = "".join(pieces[first:position]) + lead + f"⟦{key.strip(' ')}⟧" + "".join(pieces[position + 1:last])
        text = visible_text(text.strip(" "))
    else:
        text = " ".join(f"⟦{tokens[i]}⟧" if i == position else tokens[i] for i in range(first, last))
    return ("… " if first > 0 else "") + text + (" …" if last < len(tokens) else "")


@view("query_row", "One query: its top keys in context", RowOptions)
def query_row(result: RunResult, options: RowOptions) -> Figure:
    """One query's exact weights over every key, computed alone where q and k are (a row at 131,072 tokens is 0.5
    MB, its head's map 68 GB): the ``top`` keys with their tokens in context, and the whole row as a profile over
    the key positions (each bin's largest weight)."""
    maps = result.maps(options.kind)
    layer, head = selection.pick(maps, options.layer, options.head)
    name = export.head_label(head)
    query_tokens, key_tokens = maps.tokens_in(layer)
    query = options.query if options.query >= 0 else len(query_tokens) + options.query
    if not 0 <= query < len(query_tokens):
        raise ValueError(f"query {options.query} does not exist: the input has {len(query_tokens)} tokens")
    if not 1 <= options.top <= 1000:
        raise ValueError(f"top must be between 1 and 1,000 keys, not {options.top}")
    row, allowed = maps.row(layer, head, query), maps.row_allowed(layer, query)
    pieces = result.pieces if isinstance(result, TextResult) and maps.kind == "self" else ()  # the keys are the result's tokens
    order = np.argsort(-np.where(allowed, row, -1.0), kind="stable")[:min(options.top, int(allowed.sum()))]
    top = pd.DataFrame({
        "rank": np.arange(1, len(order) + 1), "key position": order, "key": [key_tokens[i] for i in order],
        "weight": row[order].astype(float),
        "in context": [in_context(key_tokens, int(i), options.context, pieces) for i in order]})
    label = heatmap.token_labels(query_tokens)[query]
    bars = alt.Chart(top).mark_bar().encode(
        y=alt.Y("rank:O", title=None, axis=alt.Axis(labelExpr="''")),  # the key's text is data, never an expression
        x=alt.X("weight:Q", title="attention weight"),
        color=alt.Color("weight:Q", scale=alt.Scale(scheme="blues"), legend=None),
        tooltip=["rank", "key position", "key", alt.Tooltip("weight:Q", format=".4f"), "in context"],
    )
    text = alt.Chart(top).mark_text(align="left", dx=4).encode(y=alt.Y("rank:O"), x=alt.X("weight:Q"),
                                                                text="key:N")
    top_chart = (bars + text).properties(title=f"Top {len(top)} keys of '{label}' (query {query:,})",
                                         width=360, height=max(120, 18 * len(top)), autosize=heatmap.PAD)
    profile = _profile(row, allowed)
    profile_chart = alt.Chart(profile).mark_area(line=True, opacity=0.4).encode(
        x=alt.X("first key:Q", title="key position"), y=alt.Y("weight:Q", title="largest weight in the bin"),
        tooltip=["first key", "last key", alt.Tooltip("weight:Q", format=".4f")],
    ).properties(title="The whole row", width=360, height=180, autosize=heatmap.PAD)
    stem = export.run_stem(result, maps.kind, f"layer {layer}", f"head {name}", f"query {query}")
    return Figure(
        stem, charts=(top_chart, profile_chart), caption=(
            f"Layer {layer}, {selection.head_label(selection.head_choice(head))}: the exact "
            f"weights of query {query:,} ('{label}') over its {int(allowed.sum()):,} visible keys, computed for this "
            "row alone. ⟦ ⟧ marks the key among its neighbours."),
        table=top, width="stretch",
        payload=lambda: {"model": result.model.key, "kind": maps.kind, "layer": layer, "head": name, "query": query,
                         "query_token": query_tokens[query], "top": top.to_dict("list")},
        arrays=lambda: {"weights": row, "allowed": allowed},
        metadata=export.run_metadata(result, kind=maps.kind, layer=layer, head=name, query=query))


def _profile(row: np.ndarray, allowed: np.ndarray) -> pd.DataFrame:
    """The row's largest visible weight per bin of key positions (every key when there are few)."""
    shown = np.where(allowed, row, 0.0)
    edges = np.linspace(0, len(row), min(len(row), PROFILE_BINS) + 1).round().astype(int)
    starts = edges[:-1]
    return pd.DataFrame({"first key": starts, "last key": edges[1:] - 1,
                         "weight": np.maximum.reduceat(shown, starts).astype(float)})

