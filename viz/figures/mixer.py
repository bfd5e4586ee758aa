"""Figures of the MLP-Mixer page (Tolstikhin et al. 2021): a Mixer's token-mixing MLP drawn as a tokens × tokens map
(models/families/mixer/model.py: its Jacobian at 0, ``W₂ · diag(GELU′(b₁)) · W₁``, or at this image), one patch's row of it over the
crop — the picture a ViT's attention row gives, but fixed by the weights — and the whole signed map.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from models.families.mixer.model import MixerResult
from models.core import selection
from models.core.selection import Layer
from viz import export, image_overlay, mixer_charts
from viz.figure import Figure, view
from viz.figures.vit import OVERLAY_PIXELS, QUERY_COLOUR, OverlayOptions

MAPS = {"fixed": "fixed (Jacobian at 0: the weights alone)", "input": "at this image (Jacobian, mean over channels)"}


def _layer(result: MixerResult, layer: Layer) -> int:
    return selection.layer_index(layer, len(result.fixed_mixing))


def _map(result: MixerResult, layer: int, which: str) -> np.ndarray:
    if which not in MAPS:
        raise ValueError(f"unknown map {which!r}; use one of {', '.join(MAPS)}")
    return (result.fixed_mixing if which == "fixed" else result.input_mixing)[layer]  # (P, P)


def input_dependence(result: MixerResult) -> np.ndarray:
    """Per layer, ‖M(this image) − M(0)‖_F / ‖M(0)‖_F: how far the nonlinearity moves the mixing from the fixed map."""
    layers = len(result.fixed_mixing)
    difference = np.linalg.norm((result.input_mixing - result.fixed_mixing).reshape(layers, -1), axis=1)
    return difference / np.maximum(np.linalg.norm(result.fixed_mixing.reshape(layers, -1), axis=1), 1e-12)


@selection.checked
@dataclass(frozen=True)
class MixingOptions(OverlayOptions):
    layer: Layer = selection.LAST
    row: int | None = None  # the query patch; None: the middle of the grid
    col: int | None = None
    map: str = "fixed"  # "fixed": the same for every image; "input": the Jacobian at this image


@view("mixing", "One patch's token mixing over the image", MixingOptions)
def mixing(result: MixerResult, options: MixingOptions) -> Figure:
    """Row ``i`` (the query patch) of the mixing map, drawn over the crop as |M[i, j]| / Σⱼ|M[i, j]|; the files hold
    the signed row too."""
    info, layer = result.image, _layer(result, options.layer)
    rows, cols = info.patch_grid
    row = rows // 2 if options.row is None else options.row
    col = cols // 2 if options.col is None else options.col
    if not (0 <= row < rows and 0 <= col < cols):
        raise ValueError(f"patch ({row}, {col}) is outside the {rows} × {cols} grid")
    signed = _map(result, layer, options.map)[row * cols + col].reshape(rows, cols)
    share = np.abs(signed) / max(float(np.abs(signed).sum()), 1e-12)
    settings = {"patch": [row, col], "layer": layer, "map": options.map}
    return Figure(
        export.file_stem(result.model.short_name, *([result.input_name] if options.map == "input" else []),
                         "token mixing", options.map, f"patch {row} {col}", f"layer {layer}"),
        image=image_overlay.outline_patches(
            image_overlay.attention_overlay(info.image, share, options.opacity, options.colormap, options.upsampling,
                                            max(1, round(OVERLAY_PIXELS / info.image.shape[0])), options.clip),
            info.patch_grid, np.arange(rows * cols).reshape(rows, cols) == row * cols + col, QUERY_COLOUR),
        caption=f"patch ({row}, {col}) (outlined in red) mixes from: |row| of the {MAPS[options.map]} map, "
                f"block {layer}",
        table=lambda: pd.DataFrame(signed, index=pd.Index(range(rows), name="patch row"),
                                   columns=[f"col {c}" for c in range(cols)]),
        payload={"model": result.model.key, "image": result.input_name, "view": "mixing", **settings,
                 "patch_grid": [rows, cols], "signed_row": signed, "abs_share": share,
                 "input_dependence": float(input_dependence(result)[layer])},
        arrays=lambda: {"signed_row": signed, "abs_share": share, "crop": info.image},
        metadata={"model": result.model.key, "image": result.input_name, **{k: str(v) for k, v in settings.items()}})


@selection.checked
@dataclass(frozen=True)
class MatrixOptions:
    layer: Layer = selection.LAST
    map: str = "fixed"


@view("mixing_matrix", "The whole token-mixing map (patches × patches)", MatrixOptions)
def mixing_matrix(result: MixerResult, options: MatrixOptions) -> Figure:
    """``M`` ``(P, P)`` of one block, signed, rows = output patches, columns = input patches, in reading order."""
    layer = _layer(result, options.layer)
    values = _map(result, layer, options.map)
    image, limit = mixer_charts.signed_matrix_image(values)
    tokens = result.tokens
    return Figure(
        export.file_stem(result.model.short_name, *([result.input_name] if options.map == "input" else []),
                         "token mixing matrix", options.map, f"layer {layer}"),
        image=image,
        caption=f"block {layer}, {MAPS[options.map]}: row i = output patch i, column j = input patch j (reading "
                f"order); red > 0 > blue, ±{limit:.3g}; rank ≤ {result.token_hidden} (the token MLP's width)",
        table=lambda: export.matrix_frame(values, tokens, tokens),
        payload=lambda: {"model": result.model.key, "image": result.input_name, "layer": layer, "map": options.map,
                         "tokens": tokens, "mixing": values, "input_dependence": input_dependence(result)},
        arrays=lambda: {"mixing": values}, metadata={"model": result.model.key, "layer": str(layer),
                                                     "map": options.map})
