"""Figures of the positional-encodings page, one builder per figure (registered with ``viz.figure.view``).

The formulas (sinusoidal 1-D and 2-D, RoPE, ALiBi, T5 buckets; ``models.lessons.positional.formulas``) need nothing but their
options (``data="options"``). The figures of tensors read out of a loaded model are analysis views: the analysis in
``models/positional`` reads the model named by ``family`` (MiniLM's embeddings and learned table, a ViT's patch
grid, SmolLM2's RoPE), the builder only draws. Every option's default is what the page shows first.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from models.lessons import positional as pe
from viz import export, heatmap, positional_charts
from viz.figure import Figure, NoOptions, view

PAGE = "positional"
SENTENCE = "the dog bit the man because the man shouted at the dog"


def _check_range(name: str, value: float, low: float, high: float, why: str = "") -> None:
    """The page's sliders keep options in range; the command line is told the same limits."""
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low:g} and {high:g} (got {value:g}){why}.")


# --- why positions: permutation equivariance --------------------------------------------------------------------

@dataclass(frozen=True)
class EquivarianceOptions:
    sentence: str = SENTENCE
    seed: int = 0  # the shuffle's seed (and the tiny layer's weights')


@dataclass(frozen=True)
class EquivarianceMapsOptions:
    sentence: str = SENTENCE
    seed: int = 0
    setting: str = "no positions"  # which run's maps: "no positions", "sinusoidal (X·√d + PE)", "<model>'s learned…"
    scheme: str = "viridis"


def _equivariance_stem(demo: pe.EquivarianceRuns, *parts) -> str:
    return export.file_stem(demo.short_name, "equivariance", *parts, f"seed {demo.seed}", demo.sentence[:40])


@view("equivariance", "Why positions: does the output just shuffle along?", EquivarianceOptions,
      analysis=pe.equivariance_of_model, analysis_options=("sentence", "seed"), family="encoder", page=PAGE)
def equivariance(demo: pe.EquivarianceRuns, options: EquivarianceOptions) -> Figure:
    """Per token, how much one self-attention layer's output changes when the tokens are shuffled and put back:
    nothing without positions (up to rounding), clearly with sinusoidal or learned positions added."""
    gaps = {setting: run.output_gap for setting, run in demo.runs.items()}  # each (tokens,)
    settings = list(gaps)
    return Figure(
        _equivariance_stem(demo, "output change"), chart=positional_charts.output_gap_chart(list(demo.tokens), gaps),
        table=lambda: pd.DataFrame({"token": demo.tokens, **gaps}, index=pd.RangeIndex(len(demo.tokens),
                                                                                        name="position")),
        payload=lambda: {"model": demo.model, "sentence": demo.sentence, "seed": demo.seed,
                         "tokens": list(demo.tokens), "permutation": demo.permutation,
                         "shuffled_tokens": demo.shuffled_tokens, "notices": list(demo.notices), "output_gap": gaps},
        arrays=lambda: {"output_gap": np.stack([gaps[s] for s in settings]), "permutation": demo.permutation},
        metadata={"model": demo.model, "input": demo.sentence, "seed": demo.seed, "settings": " | ".join(settings)})


@view("equivariance_maps", "Why positions: attention on X and on shuffled X, put back", EquivarianceMapsOptions,
      analysis=pe.equivariance_of_model, analysis_options=("sentence", "seed"), family="encoder", page=PAGE)
def equivariance_maps(demo: pe.EquivarianceRuns, options: EquivarianceMapsOptions) -> Figure:
    """The attention of F on X and on σ(X) with rows and columns put back in order, for one setting: identical
    without positions."""
    run = demo.run(options.setting)
    tokens = list(demo.tokens)
    maps = {"attention": run.attention, "shuffled_attention_restored": run.shuffled_attention_restored,
            "permutation": run.permutation}
    charts = tuple(heatmap.attention_chart(maps[name], tokens, tokens, title=title, scheme=options.scheme, linked=False)
                   for name, title in (("attention", "F(X)"),
                                       ("shuffled_attention_restored", "F(σ(X)), put back in order")))
    return Figure(
        _equivariance_stem(demo, options.setting), charts=charts,
        caption=(f"One single-head attention layer (layer norm, then softmax(QKᵀ/√d)V) with fixed random weights "
                 f"(seed {demo.seed}) on {demo.model}'s token embeddings. Without positions the two maps are "
                 "identical and the outputs move with their tokens; with positions, a moved token gets another "
                 "encoding."),
        table=lambda: export.matrix_frame(run.attention, tokens, tokens),
        payload=lambda: {"model": demo.model, "sentence": demo.sentence, "tokens": tokens, "setting": options.setting,
                         "seed": demo.seed, **maps,
                         "output_gap": {name: other.output_gap for name, other in demo.runs.items()}},
        arrays=lambda: maps,
        metadata={"model": demo.model, "input": demo.sentence, "setting": options.setting})


# --- sinusoidal (Vaswani et al. 2017) ---------------------------------------------------------------------------

@dataclass(frozen=True)
class SinusoidalOptions:
    d: int = 128  # channels
    length: int = 128  # positions
    base: float = 10000.0


@view("sinusoidal", "Sinusoidal encoding: table, wavelengths, PE(p)·PE(q)", SinusoidalOptions, data="options",
      page=PAGE)
def sinusoidal(_, options: SinusoidalOptions) -> Figure:
    """The table ``PE (length, d)``, each channel's wavelength, the dot products of every pair of positions and a few
    of their rows; the page lays the four out two by two, as the PNG does."""
    dim, length, base = options.d, options.length, options.base
    _check_range("d", dim, 2, 4096)
    _check_range("The length", length, 1, 4096, " (the similarity matrix grows with its square)")
    table = pe.sinusoidal_encoding(length, dim, base)  # (length, d)
    dot, wavelengths = pe.position_similarity(table, "dot"), pe.sinusoidal_wavelengths(dim, base)
    parts = tuple(positional_charts.sinusoidal_charts(table, dot, wavelengths))
    return Figure(
        export.file_stem("sinusoidal", f"d {dim}", f"length {length}", f"base {base:g}"),
        charts=parts, layout=((1, 1),),
        caption=(f"PE(p)·PE(q) = Σₖ cos((p−q)·ωₖ): it depends only on the offset (constant diagonals), is the same "
                 f"for ±offset and peaks at d/2 = {dim // 2} for p = q — distance can be read off it, direction "
                 "cannot."),
        table=lambda: pd.DataFrame(table, index=pd.RangeIndex(length, name="position"),
                                   columns=[f"channel {k}" for k in range(dim)]),
        payload=lambda: {"d": dim, "length": length, "base": base, "encoding": table, "wavelengths": wavelengths},
        arrays=lambda: {"encoding": table, "dot": dot, "wavelengths": wavelengths},
        metadata={"d": dim, "length": length, "base": base})


@dataclass(frozen=True)
class Sinusoidal2DOptions:
    d: int = 128  # channels: half for the column, half for the row
    grid: int = 14  # patches a side
    base: float = 10000.0


@view("sinusoidal_2d", "2-D sinusoidal encoding of image patches", Sinusoidal2DOptions, data="options", page=PAGE)
def sinusoidal_2d(_, options: Sinusoidal2DOptions) -> Figure:
    """The cosine similarity of every patch's 2-D sin-cos encoding with every patch, one tile per patch."""
    dim, side, base = options.d, options.grid, options.base
    _check_range("The grid", side, 1, 64)
    encoding = pe.sinusoidal_encoding_2d(side, side, dim, base)  # (side², d), patches row-major
    similarity = pe.patch_similarity(encoding, (side, side))  # (side, side, side, side)
    low, high = positional_charts.mosaic_range(similarity)
    return Figure(
        export.file_stem("sinusoidal 2d", f"d {dim}", f"grid {side}x{side}", f"base {base:g}"),
        image=positional_charts.patch_similarity_mosaic(similarity, step=max(1, side // 14), max_px=640),
        caption=(f"Half the {dim} channels encode the row, half the column. Each tile: cosine similarity of one "
                 f"patch's encoding with every patch (dot = the patch itself; blue {low:.2f} … red {high:.2f})."),
        payload=lambda: {"d": dim, "grid": [side, side], "base": base, "encoding": encoding,
                         "similarity": similarity},
        arrays=lambda: {"encoding": encoding, "similarity": similarity},
        metadata={"d": dim, "grid": side, "base": base})


# --- learned tables read from models ----------------------------------------------------------------------------

@view("learned_text_table", "A text model's learned position table", NoOptions, analysis=pe.learned_table_of_model,
      family="encoder", page=PAGE)
def learned_text_table(found: pe.ModelPositions, options: NoOptions) -> Figure:
    """The cosine similarity of every learned position vector with every other, and two of its rows."""
    positions = found.positions
    cosine = pe.position_similarity(positions.table)  # (P, P)
    charts = (positional_charts.matrix_chart(cosine, "position q", "position p", "cosine", domain=(-1.0, 1.0),
                              title=f"{found.model}: {len(cosine)} positions × {positions.shape[1]}"),
              positional_charts.similarity_profile_chart(cosine, [0, len(cosine) // 2], "cosine",
                                          "Cosine of position p with every other position"))
    return Figure(
        export.file_stem(found.short_name, "learned positions", "cosine"), charts=charts,
        caption=(f"`{positions.parameter}`: cosine similarity of every learned position vector with every other. "
                 "Nothing forced them to be smooth or periodic: the band along the diagonal is what training found."),
        payload=lambda: {"model": found.model, "parameter": positions.parameter, "table": positions.table,
                         "cosine": cosine},
        arrays=lambda: {"table": positions.table, "cosine": cosine},
        metadata={"model": found.model, "parameter": positions.parameter})


@dataclass(frozen=True)
class GridOptions:
    source: str = "model"  # "model": the ViT's own grid; "sinusoidal": the 2-D sin-cos formula; "untrained": timm init


@dataclass(frozen=True)
class ResizedGridOptions:
    source: str = "model"
    side: int | None = None  # rows = columns of the resized grid; None: twice the original's


def _grid_mosaic(table: np.ndarray, grid: tuple[int, int], parameter: str):
    """The similarity mosaic of a grid (at most 8 tiles a side, about 440 px whatever the grid, so that two grids
    side by side match) and its caption."""
    similarity = pe.patch_similarity(table, grid)
    low, high = positional_charts.mosaic_range(similarity)
    step, gap = -(-grid[0] // 8), 5
    tile = max(grid[1], 440 // len(range(0, grid[0], step)) - gap)
    mosaic = positional_charts.patch_similarity_mosaic(similarity, step, tile=tile, gap=gap)
    caption = (f"{parameter}: {grid[0]} × {grid[1]} patches · colours {low:.2f} … {high:.2f} · adjacent patches "
               f"{pe.neighbour_similarity(table, grid):.3f}")
    return mosaic, caption


@view("position_grid", "A ViT's position grid (ViT paper, Fig. 7)", GridOptions, analysis=pe.position_grid,
      analysis_options=("source",), family="vit", page=PAGE)
def position_grid(found: pe.ModelPositions, options: GridOptions) -> Figure:
    """For every few patches, the cosine similarity of its position vector with all patches."""
    positions = found.positions
    (rows, cols), table = positions.grid, positions.table
    mosaic, caption = _grid_mosaic(table, (rows, cols), positions.parameter)
    return Figure(
        export.file_stem(found.short_name, "position grid", f"{rows}x{cols}"), image=mosaic, caption=caption,
        payload=lambda: {"model": found.model, "parameter": positions.parameter, "grid": [rows, cols],
                         "notes": list(found.notes), "table": table, "prefix": positions.prefix},
        arrays=lambda: {"table": table, "prefix": positions.prefix},
        metadata={"model": found.model, "parameter": positions.parameter, "grid": f"{rows}x{cols}"})


@view("position_grid_resized", "A ViT's position grid beside the grid resized to another size", ResizedGridOptions,
      analysis=pe.position_grid, analysis_options=("source",), family="vit", page=PAGE)
def position_grid_resized(found: pe.ModelPositions, options: ResizedGridOptions) -> Figure:
    """The grid (left) and the grid resized bicubically (right; timm's ``resample_abs_pos_embed``), as a ViT does
    for a new image size."""
    positions = found.positions
    (rows, cols), table = positions.grid, positions.table
    side = 2 * rows if options.side is None else options.side
    _check_range("The new grid's side", side, 2, 64)
    resized = pe.interpolate_grid(table, (rows, cols), (side, side))  # (side², D)
    (left, left_caption), (right, right_caption) = (_grid_mosaic(table, (rows, cols), positions.parameter),
                                                    _grid_mosaic(resized, (side, side), positions.parameter))
    return Figure(
        export.file_stem(found.short_name, "position grid", f"{rows}x{cols}", f"resized {side}x{side}"),
        image=positional_charts.side_by_side(left, right), caption=f"Left: {left_caption}. Right: {right_caption}.",
        payload=lambda: {"model": found.model, "parameter": positions.parameter, "grid": [rows, cols],
                         "resized_grid": [side, side], "table": table, "resized": resized},
        arrays=lambda: {"table": table, "resized": resized},
        metadata={"model": found.model, "parameter": positions.parameter, "grid": f"{rows}x{cols}",
                  "resized": f"{side}x{side}"})


# --- RoPE (Su et al. 2021) ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RopeOptions:
    head_dim: int = 64
    base: float = 10000.0  # rope_theta
    span: int = 512  # offsets −span … span shown


def _check_rope(options: RopeOptions) -> None:
    _check_range("The head dimension", options.head_dim, 2, 1024)
    _check_range("The offsets shown", options.span, 1, 100_000)


@view("rope", "RoPE: rotation per pair and scores against the offset", RopeOptions, data="options", page=PAGE)
def rope(_, options: RopeOptions) -> Figure:
    """``cos(m·θᵢ)`` of each pair at each position, and one q, k scored at offsets n − m from three absolute
    positions m: the curves coincide, the score depends on the offset only."""
    _check_rope(options)
    head_dim, base, span = options.head_dim, options.base, options.span
    angles = pe.rope_angles(np.arange(min(span, 1024)), head_dim, base)  # (positions, d/2)
    offsets, scores, spread = pe.rope_offset_demo(head_dim, base, span)
    charts = (positional_charts.matrix_chart(np.cos(angles), "pair i", "position m", "cos(mθᵢ)",
                              title="Rotation of each pair: cos(m·θᵢ)"), positional_charts.rope_score_chart(offsets, scores))
    return Figure(
        export.file_stem("rope", f"d {head_dim}", f"base {base:g}", f"offsets {span}"), charts=charts,
        caption=(f"Fixed random q and k = q + noise (seed 0). The three curves coincide (largest difference "
                 f"{spread:.1e}): the score depends only on n − m. Pairs with small i turn fast, large i barely "
                 "turn."),
        table=lambda: pd.DataFrame({"offset": offsets, **scores}),
        payload=lambda: {"head_dim": head_dim, "base": base, "angles": angles, "offsets": offsets, "scores": scores},
        arrays=lambda: {"angles": angles, "offsets": offsets, **{f"score {k}": v for k, v in scores.items()}},
        metadata={"head_dim": head_dim, "base": base})


@view("rope_decay", "RoPE: long-range decay bound (Su et al. §3.4.3)", RopeOptions, data="options", page=PAGE)
def rope_decay(_, options: RopeOptions) -> Figure:
    _check_rope(options)
    distances = np.arange(options.span + 1)
    bound = pe.rope_decay_bound(distances, options.head_dim, options.base)
    return Figure(
        export.file_stem("rope decay bound", f"d {options.head_dim}", f"base {options.base:g}",
                         f"offsets {options.span}"),
        chart=positional_charts.decay_bound_chart(distances, bound),
        table=lambda: pd.DataFrame({"distance": distances, "bound": bound}),
        payload=lambda: {"head_dim": options.head_dim, "base": options.base, "distance": distances, "bound": bound},
        arrays=lambda: {"distance": distances, "bound": bound},
        metadata={"head_dim": options.head_dim, "base": options.base})


@view("rope_in_model", "RoPE as a loaded language model uses it", NoOptions, analysis=pe.rope_of_model,
      family="causal_lm", page=PAGE)
def rope_in_model(found: pe.RopeInModel, options: NoOptions) -> Figure:
    """The model's RoPE settings, and the wavelength of each rotated pair from the formula and from the model's own
    ``inv_freq`` buffer (the page shows the settings and the caption)."""
    settings = found.settings
    check = "keeps no inv_freq buffer" if found.buffer_name is None else \
        f"its `{found.buffer_name}` equals b^(−2i/d) to {found.max_relative_error:.1e} (relative)"
    pairs = "(i, i + d/2) (transformers' rotate_half)" if settings.pairing == "half" else "(2i, 2i+1)"
    arrays = {"frequencies": found.frequencies} | (
        {"model_frequencies": found.model_frequencies} if found.model_frequencies is not None else {})
    chart = positional_charts.rope_wavelength_chart(found.frequencies, found.model_frequencies, found.model)
    caption = (f"{check}. It rotates channel pairs {pairs}; the paper pairs (2i, 2i+1) — the same scores up to a "
               f"fixed reordering of channels. Its slowest pair turns once every {found.slowest_wavelength:,.0f} "
               f"positions, its fastest every {found.fastest_wavelength:.1f}.")
    if found.by_layer_type:  # Gemma 3: a base per kind of layer, each drawn and checked against its own buffer
        kinds = found.by_layer_type
        chart = positional_charts.rope_wavelengths_by_layer_type_chart(
            [(f"{rope.kind}, b = {rope.theta:,.0f}", rope.frequencies, rope.model_frequencies) for rope in kinds],
            found.model)
        for rope in kinds:
            arrays[f"frequencies_{rope.layer_type}"] = rope.frequencies
            if rope.model_frequencies is not None:
                arrays[f"model_frequencies_{rope.layer_type}"] = rope.model_frequencies
        checks = "; ".join(
            f"its {len(rope.layers)} {rope.label} rotate with b = {rope.theta:,.0f}, their slowest pair "
            f"turning once every {rope.slowest_wavelength:,.0f} positions"
            + ("" if rope.max_relative_error is None else
               f" (their inv_freq buffer equals b^(−2i/d) to {rope.max_relative_error:.1e})")
            for rope in kinds)
        caption = (f"{found.model} has one base per kind of layer: {checks}. A local layer never compares tokens "
                   "further apart than its window, so a small base already tells every offset in it apart; the "
                   "global layers span the whole context, and a large base keeps their slowest pairs from wrapping "
                   "around within it. Lines: the formula; dots: the model's own buffers. It rotates channel pairs "
                   f"{pairs}.")
    return Figure(
        export.file_stem(found.short_name, "rope frequencies"),
        chart=chart, caption=caption,
        payload=lambda: {"model": found.model, "facts": found.facts(), "theta": settings.theta,
                         "head_dim": settings.head_dim, "rotary_dim": settings.rotary_dim,
                         "rope_type": settings.rope_type, "pairing": settings.pairing, "scaling": settings.scaling,
                         "max_positions": settings.max_positions, "buffer": found.buffer_name,
                         "max_relative_error": found.max_relative_error,
                         "slowest_wavelength": found.slowest_wavelength,
                         "fastest_wavelength": found.fastest_wavelength,
                         "by_layer_type": [{"layer_type": rope.layer_type, "label": rope.label, "theta": rope.theta,
                                            "layers": list(rope.layers),
                                            "max_relative_error": rope.max_relative_error}
                                           for rope in found.by_layer_type], **arrays},
        arrays=lambda: arrays, metadata={"model": found.model, "buffer": found.buffer_name or "none"})


# --- ALiBi (Press et al. 2022) and T5 buckets (Raffel et al. 2020) ----------------------------------------------

@dataclass(frozen=True)
class AlibiOptions:
    heads: int = 8
    length: int = 16
    causal: bool = True


@view("alibi", "ALiBi: slope per head and the bias it adds", AlibiOptions, data="options", page=PAGE)
def alibi(_, options: AlibiOptions) -> Figure:
    """Each head's slope, and the bias of four heads (first, second, middle, last) as small heatmaps."""
    heads, length, causal = options.heads, options.length, options.causal
    _check_range("The number of heads", heads, 1, 128)
    _check_range("The length", length, 1, 256)
    slopes, bias = pe.alibi_slopes(heads), pe.alibi_bias(heads, length, causal)  # (H,), (H, L, L)
    shown = sorted({0, 1 % heads, heads // 2, heads - 1})
    return Figure(
        export.file_stem("alibi", f"{heads} heads", f"length {length}", "causal" if causal else None),
        charts=(positional_charts.slopes_chart(slopes), *positional_charts.bias_small_multiples(bias, shown)), layout=((1,), (1, 1, 1, 1)),
        caption=(f"Slopes for H = {heads}: " + ", ".join(f"{s:.4g}" for s in slopes)
                 + ". Each head subtracts a penalty growing linearly with distance; nothing is added to the tokens, "
                   "which is why ALiBi extrapolates to inputs longer than those it was trained on."),
        table=lambda: pd.DataFrame({"head": range(heads), "slope": slopes}),
        payload=lambda: {"heads": heads, "length": length, "causal": causal, "slopes": slopes, "bias": bias},
        arrays=lambda: {"slopes": slopes, "bias": bias}, metadata={"heads": heads, "length": length})


@dataclass(frozen=True)
class T5Options:
    buckets: int = 32
    max_distance: int = 128
    length: int = 160


@view("t5_buckets", "T5 relative-position buckets", T5Options, data="options", page=PAGE)
def t5_buckets(_, options: T5Options) -> Figure:
    """The bucket of every (query, key) pair, bidirectional (encoder) and causal (decoder)."""
    _check_range("The length", options.length, 1, 2048)
    both, causal = (pe.t5_bucket_matrix(options.length, bidirectional, options.buckets, options.max_distance)
                    for bidirectional in (True, False))  # (L, L) int64 each
    return Figure(
        export.file_stem("t5 buckets", f"n {options.buckets}", f"max distance {options.max_distance}",
                         f"length {options.length}"),
        charts=(positional_charts.bucket_chart(both, "Bidirectional (encoder)"),
                positional_charts.bucket_chart(causal, "Causal (decoder): the future is bucket 0")),
        caption=("Each head learns one scalar per bucket, added to the score. Nearby offsets get their own bucket, "
                 f"far ones share logarithmically wider ones; beyond {options.max_distance} positions all offsets "
                 "look alike."),
        payload=lambda: {"buckets": options.buckets, "max_distance": options.max_distance,
                         "length": options.length, "bidirectional": both, "causal": causal},
        arrays=lambda: {"bidirectional": both, "causal": causal},
        metadata={"buckets": options.buckets, "max_distance": options.max_distance})
