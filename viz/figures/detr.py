"""Figures of the DETR page (Carion et al. 2020): each object query's decoder cross-attention over the image, drawn
with that query's box and class (the paper's Fig. 6), one query's heads, and every detection at once.

A query's map is row ``query`` of the cross-attention softmax(QKᵀ/√d) of a decoder layer, ``(h·w,)`` over the
backbone's image tokens, reshaped to the ``(h, w)`` grid and upsampled onto the crop the model saw. Files hold the
maps, boxes, classes and scores behind each picture.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from PIL import Image

from models.families.detr.model import DetrResult
from models.core import selection
from models.core.selection import Head, Layer
from viz import detr_charts, export, image_overlay
from viz.figure import Figure, view
from viz.figures.vit import OVERLAY_PIXELS, OverlayOptions

TILE_PIXELS = 256  # each query's tile in the all-queries figure


def _layer(result: DetrResult, layer: Layer) -> int:
    return selection.layer_index(layer, result.maps("cross").num_layers)


def _scale(result: DetrResult, pixels: int) -> int:
    return max(1, round(pixels / result.image.image.shape[0]))


def query_map(result: DetrResult, layer: int, head: int | None, query: int) -> np.ndarray:
    """Query ``query``'s cross-attention over the image tokens, ``(h, w)`` (head None: the mean of the heads)."""
    return np.asarray(result.maps("cross").head(layer, head)[query], dtype=np.float32).reshape(result.image.patch_grid)


def caption_of(result: DetrResult, query: int) -> str:
    return f"{result.label_names[result.labels[query]]} {result.scores[query]:.0%}"


def _query_picture(result: DetrResult, values: np.ndarray, query: int, options: OverlayOptions, pixels: int):
    scale = _scale(result, pixels)
    picture = image_overlay.attention_overlay(result.image.image, values, options.opacity, options.colormap,
                                              options.upsampling, scale, options.clip)
    return detr_charts.draw_boxes(picture, result.boxes[query], [f"q{query}: {caption_of(result, query)}"],
                           [int(result.labels[query])], scale)


def _detection_rows(result: DetrResult, queries: list[int]) -> list[dict]:
    return [{"query": q, "class": result.label_names[result.labels[q]], "class_id": int(result.labels[q]),
             "score": float(result.scores[q]), "no_object": float(result.class_probabilities[q, -1]),
             "x0": float(result.boxes[q, 0]), "y0": float(result.boxes[q, 1]), "x1": float(result.boxes[q, 2]),
             "y1": float(result.boxes[q, 3])} for q in queries]


@selection.checked
@dataclass(frozen=True)
class QueriesOptions(OverlayOptions):
    layer: Layer = selection.LAST  # the decoder layer (the paper draws the last)
    head: Head = selection.MEAN
    threshold: float = 0.5  # queries whose best class is at least this probable
    max_queries: int = 6


@view("detr_queries", "Each detected object's query: cross-attention, box and class", QueriesOptions)
def detr_queries(result: DetrResult, options: QueriesOptions) -> Figure:
    """One tile per query above ``threshold`` (most confident first, at most ``max_queries``); when none is, the
    ``max_queries`` most confident, and the caption and the JSON (``above_threshold``) say so."""
    if options.max_queries < 1:
        raise ValueError(f"max_queries must be at least 1, not {options.max_queries}")
    layer = _layer(result, options.layer)
    queries = result.detected(options.threshold)
    above = bool(queries)
    if not above:
        queries = [int(q) for q in np.argsort(-result.scores, kind="stable")]
    queries = queries[: options.max_queries]
    index = selection.head_index(options.head, result.maps("cross").heads_in(layer))
    maps = np.stack([query_map(result, layer, index, q) for q in queries])  # (n, h, w)
    tiles = [_query_picture(result, m, q, options, TILE_PIXELS) for m, q in zip(maps, queries)]
    head = options.head
    which = f"above {options.threshold:.0%}" if above else \
        f"none above {options.threshold:.0%}, so the {len(queries)} most confident"
    rows = _detection_rows(result, queries)
    return Figure(
        export.file_stem(result.model.short_name, result.input_name, "detr queries", f"layer {layer}",
                         f"head {head}", f"threshold {options.threshold:g}"),
        image=image_overlay.tile(tiles, min(3, len(tiles))),
        caption=f"Decoder layer {layer}, {selection.head_label(head)}: each query's "
                f"cross-attention over the image with its box and class ({which}).",
        table=lambda: pd.DataFrame(rows),
        payload={"model": result.model.key, "image": result.input_name, "layer": layer, "head": head,
                 "threshold": options.threshold, "above_threshold": above, "detections": rows,
                 "feature_grid": list(result.image.patch_grid), "cross_attention": maps},
        arrays=lambda: {"cross_attention": maps, "queries": np.array(queries), "boxes": result.boxes[queries],
                        "crop": result.image.image},
        metadata={"model": result.model.key, "image": result.input_name, "layer": str(layer), "head": str(head)})


@selection.checked
@dataclass(frozen=True)
class QueryOptions(OverlayOptions):
    query: int | None = None  # None: the most confident query
    layer: Layer = selection.LAST


@view("detr_query", "One query's cross-attention, head by head", QueryOptions)
def detr_query(result: DetrResult, options: QueryOptions) -> Figure:
    layer = _layer(result, options.layer)
    count = len(result.scores)
    query = int(np.argmax(result.scores)) if options.query is None else options.query
    if not 0 <= query < count:
        raise ValueError(f"query {query} is outside 0..{count - 1} (this DETR has {count} object queries)")
    heads = result.maps("cross").heads_in(layer)
    maps = np.stack([query_map(result, layer, h, query) for h in range(heads)] +
                    [query_map(result, layer, None, query)])  # (heads + 1, h, w): every head, then their mean
    tiles = [_query_picture(result, m, query, options, 192) for m in maps]
    row = _detection_rows(result, [query])
    return Figure(
        export.file_stem(result.model.short_name, result.input_name, "detr query", query, f"layer {layer}"),
        image=image_overlay.tile(tiles, min(5, len(tiles))),
        caption=f"Query {query} ({caption_of(result, query)}), decoder layer {layer}: heads 0–{heads - 1}, then their "
                f"average.",
        table=lambda: pd.DataFrame(maps.reshape(len(maps), -1),
                                   index=pd.Index([f"head {h}" for h in range(heads)] + ["mean"], name="head"),
                                   columns=result.maps("cross").key_tokens),
        payload={"model": result.model.key, "image": result.input_name, "query": query, "layer": layer,
                 "detection": row[0], "class_probabilities": result.class_probabilities[query],
                 "class_names": [*result.label_names, "no object"], "cross_attention": maps},
        arrays=lambda: {"cross_attention": maps, "box": result.boxes[query], "crop": result.image.image},
        metadata={"model": result.model.key, "image": result.input_name, "query": str(query), "layer": str(layer)})


@selection.checked
@dataclass(frozen=True)
class BoxesOptions:
    threshold: float = 0.5


@view("detr_boxes", "Every detection: boxes, classes, scores", BoxesOptions)
def detr_boxes(result: DetrResult, options: BoxesOptions) -> Figure:
    queries = result.detected(options.threshold)
    scale = _scale(result, OVERLAY_PIXELS)
    crop = result.image.image
    picture = Image.fromarray(crop).resize((crop.shape[1] * scale, crop.shape[0] * scale), Image.Resampling.NEAREST)
    picture = detr_charts.draw_boxes(picture, result.boxes[queries], [f"q{q}: {caption_of(result, q)}" for q in queries],
                              [int(result.labels[q]) for q in queries], scale)
    rows = _detection_rows(result, queries)
    return Figure(
        export.file_stem(result.model.short_name, result.input_name, "detections", f"threshold {options.threshold:g}"),
        image=picture,
        caption=f"{len(queries)} of {len(result.scores)} queries found an object with probability ≥ "
                f"{options.threshold:.0%}; the others answered 'no object'.",
        table=lambda: pd.DataFrame(rows, columns=["query", "class", "class_id", "score", "no_object", "x0", "y0", "x1",
                                                  "y1"]),
        payload={"model": result.model.key, "image": result.input_name, "threshold": options.threshold,
                 "detections": rows, "class_probabilities": result.class_probabilities, "boxes": result.boxes},
        arrays=lambda: {"boxes": result.boxes, "class_probabilities": result.class_probabilities, "crop": crop},
        metadata={"model": result.model.key, "image": result.input_name, "threshold": str(options.threshold)})
