"""Figures of the captioning page: each generated word with its attention over the image (Xu et al. 2015, Fig. 2–3:
the strip of small overlays, one per word), one word large with the candidates it was chosen from (the step-through),
every layer or head of one word, raw attention beside rollout and gradient-weighted maps with their faithfulness
curves, the visual attention sinks of a decoder-only VLM, and which architecture's maps point at the right object.

A word's map is its row of ``models.families.captioning.model.word_attention``: its attention on each image token, a
layer's head (or the mean of heads / of layers), drawn through ``regions`` onto the user's picture
(viz/captioning.py), so tiles, thumbnails, crops and merged blocks land where they came from. Files hold the numbers
behind each picture: the maps ``(words, image tokens)``, every token's box, the words.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import altair as alt
import numpy as np
import pandas as pd
from PIL import Image

from models.analysis import explanations as explainable
from models.analysis.methods import METHODS
from models.families.captioning import explain as caption_explain
from models.families.captioning import model as captioning
from models.families.captioning import vlm
from models.families.captioning.model import CaptionResult
from models.core import selection
from models.core.selection import Head, Layer
from viz import captioning as draw
from viz import export
from viz.figure import Figure, NoOptions, view
from viz.figures import faithfulness as faithfulness_figures
from viz.heatmap import PAD

TILE_PIXELS = 176  # one word's tile in the strip
WORD_PIXELS = 448  # the large map of one word


@selection.checked
@dataclass(frozen=True)
class MapOptions:
    """Which map (layer and head, or their means) and how it is drawn."""

    layer: Layer = selection.ALL  # every layer averaged (Show, Attend and Tell has one)
    head: Head = selection.MEAN
    opacity: float = 0.6  # 0: only the photo
    colormap: str = "inferno"
    smooth: bool = True  # blur by half a token (the paper's soft maps); False: each token's exact region
    clip: float = 100.0  # percentile at which colours saturate
    exclude_sinks: bool = True  # a decoder-only VLM's attention sinks are left out of the colour scale


def _chosen(result: CaptionResult, options) -> tuple[int | None, int | None]:
    return captioning.chosen(result, options.layer, getattr(options, "head", selection.MEAN))


def _check(result: CaptionResult, options) -> None:
    _chosen(result, options)


def _word(result: CaptionResult, word: int) -> int:
    if not 0 <= word < len(result.words):
        raise ValueError(f"word {word} does not exist: the caption has words 0..{len(result.words) - 1}")
    return word


def overlay(result: CaptionResult, values: np.ndarray, options: MapOptions, pixels: int) -> Image.Image:
    sinks = result.sinks
    return draw.word_overlay(result.image.image, values, captioning.display_boxes(result), options.opacity, options.colormap,
                             options.smooth, options.clip, sinks, options.exclude_sinks, pixels)


def _settings(result: CaptionResult, options: MapOptions) -> dict:
    return {"model": result.model.key, "image": result.input_name, "caption": result.caption,
            "layer": options.layer,
            "head": getattr(options, "head", selection.MEAN)}


def _region_table(result: CaptionResult, maps: np.ndarray, rows: list[str]) -> pd.DataFrame:
    frames = result.regions.frames
    columns = [f"{i}: {frames[f].name} [{x0:.0f},{y0:.0f},{x1:.0f},{y1:.0f}]" for i, (f, (x0, y0, x1, y1)) in
               enumerate(zip(result.regions.frame_of, result.regions.boxes))]
    return pd.DataFrame(maps, index=pd.Index(rows, name="word"), columns=columns)


def _arrays(result: CaptionResult, maps: np.ndarray) -> dict:
    return {"word_attention": maps, "boxes": result.regions.boxes, "frame_of": result.regions.frame_of,
            "picture": result.image.image}


def _metadata(result: CaptionResult, options) -> dict:
    return {k: str(v) for k, v in _settings(result, options).items()}


@selection.checked
@dataclass(frozen=True)
class StripOptions(MapOptions):
    columns: int = 6  # tiles per row (the picture itself is the first)


@view("caption_strip", "The caption, each word under its attention over the image (Show, Attend and Tell, Fig. 2)",
      StripOptions)
def caption_strip(result: CaptionResult, options: StripOptions) -> Figure:
    _check(result, options)
    if not 1 <= options.columns <= 20:
        raise ValueError(f"columns must be between 1 and 20, not {options.columns}")
    maps = captioning.word_attention(result, *_chosen(result, options))  # (words, tokens)
    picture = Image.fromarray(result.image.image)
    scale = TILE_PIXELS / max(picture.size)
    size = (max(1, round(picture.width * scale)), max(1, round(picture.height * scale)))
    tiles = [draw.labelled(picture.resize(size, Image.Resampling.LANCZOS if scale < 1 else Image.Resampling.NEAREST),
                           "input")]
    for word, values in zip(result.words, maps):
        tiles.append(draw.labelled(overlay(result, values, options, TILE_PIXELS).resize(size), word))
    which = captioning.describe_layer(result, *_chosen(result, options))
    return Figure(
        export.file_stem(result.model.short_name, result.input_name, "caption strip",
                         f"layer {_settings(result, options)['layer']}", f"head {_settings(result, options)['head']}"),
        image=draw.strip(tiles, options.columns + 1),
        caption=f"“{result.caption}” — each word under the attention that produced it ({which}); brighter = more "
                f"attention, each map on its own scale" + (", sinks outlined and left out of the scale" if
                                                           options.exclude_sinks and len(result.sinks) else "") + ".",
        table=lambda: _region_table(result, maps, [f"{i}: {w}" for i, w in enumerate(result.words)]),
        payload={**_settings(result, options), "words": list(result.words), "word_attention": maps,
                 "image_share": maps.sum(1), "regions": result.regions.boxes,
                 "frames": [f.name for f in result.regions.frames], "geometry": result.regions.description},
        arrays=lambda: _arrays(result, maps), metadata=_metadata(result, options))


@selection.checked
@selection.checked
@dataclass(frozen=True)
class WordOptions(MapOptions):
    word: int = 0  # the word's position in the caption (0: the first)


def candidates_chart(result: CaptionResult, word: int) -> alt.Chart:
    step = result.generation[word]
    frame = pd.DataFrame([{"token": c.token, "probability": c.probability, "chosen": c.token_id ==
                           result.word_ids[word]} for c in step.candidates])
    return alt.Chart(frame).mark_bar().encode(
        y=alt.Y("token:N", sort=None, title=None, axis=alt.Axis(labelFontSize=14, labelLimit=200)),
        x=alt.X("probability:Q", scale=alt.Scale(domain=[0, 1]), title=f"p(next word) at step {word}"),
        color=alt.condition(alt.datum.chosen, alt.value("#d62728"), alt.value("steelblue")),
        tooltip=["token", alt.Tooltip("probability:Q", format=".3f")],
    ).properties(width=280, height=max(80, 28 * len(frame)), autosize=PAD)


@dataclass(frozen=True)
class CandidatesOptions:
    word: int = 0


@view("caption_candidates", "One step: the words the model could have written, and the one it chose",
      CandidatesOptions)
def caption_candidates(result: CaptionResult, options: CandidatesOptions) -> Figure:
    word = _word(result, options.word)
    step = result.generation[word]
    rows = [{"token": c.token, "id": c.token_id, "probability": c.probability,
             "chosen": c.token_id == result.word_ids[word]} for c in step.candidates]
    return Figure(
        export.file_stem(result.model.short_name, result.input_name, "caption candidates", word, result.words[word]),
        chart=candidates_chart(result, word),
        caption=f"After “{' '.join(result.words[:word])}”: the {len(rows)} most probable next tokens; "
                f"{result.strategy} chose “{result.words[word]}” (p = {step.probability:.2f}).",
        table=lambda: pd.DataFrame(rows),
        payload={"model": result.model.key, "image": result.input_name, "word": word, "token": result.words[word],
                 "probability": step.probability, "candidates": rows, "strategy": result.strategy},
        arrays=lambda: {"probability": np.array([r["probability"] for r in rows], dtype=np.float32)},
        metadata={"model": result.model.key, "image": result.input_name, "word": str(word)})


@view("caption_word", "One word: its attention over the image, large", WordOptions)
def caption_word(result: CaptionResult, options: WordOptions) -> Figure:
    _check(result, options)
    word = _word(result, options.word)
    values = captioning.word_attention(result, *_chosen(result, options))[word]
    step = result.generation[word]
    prefix = " ".join(result.words[:word])
    which = captioning.describe_layer(result, *_chosen(result, options))
    top = int(np.argmax(values))
    box = result.regions.boxes[top]
    return Figure(
        export.file_stem(result.model.short_name, result.input_name, "caption word", word, result.words[word],
                         f"layer {_settings(result, options)['layer']}", f"head {_settings(result, options)['head']}"),
        image=overlay(result, values, options, WORD_PIXELS),
        caption=f"Step {word}: after “{prefix}” the model wrote “{result.words[word]}” (p = {step.probability:.2f}) "
                f"looking here ({which}); {values.sum():.0%} of its attention went to image tokens, most to token "
                f"{top} ({result.regions.frames[result.regions.frame_of[top]].name}, pixels "
                f"{box[0]:.0f}–{box[2]:.0f} × {box[1]:.0f}–{box[3]:.0f}).",
        table=lambda: pd.DataFrame({"token": np.arange(len(values)), "attention": values,
                                    "frame": [result.regions.frames[f].name for f in result.regions.frame_of],
                                    "x0": result.regions.boxes[:, 0], "y0": result.regions.boxes[:, 1],
                                    "x1": result.regions.boxes[:, 2], "y1": result.regions.boxes[:, 3]}),
        payload={**_settings(result, options), "word": word, "token": result.words[word],
                 "probability": step.probability, "attention": values, "image_share": float(values.sum()),
                 "candidates": [{"token": c.token, "id": c.token_id, "probability": c.probability}
                                for c in step.candidates], "regions": result.regions.boxes},
        arrays=lambda: {"attention": values, "boxes": result.regions.boxes, "picture": result.image.image},
        metadata={**_metadata(result, options), "word": str(word)})


@selection.checked
@dataclass(frozen=True)
class HeadsOptions:
    word: int = 0
    layer: Layer = selection.ALL  # "all": one tile per layer (heads averaged); a layer: one tile per head, then the mean
    opacity: float = 0.6
    colormap: str = "inferno"
    smooth: bool = True
    clip: float = 100.0
    exclude_sinks: bool = True


@view("caption_heads", "One word's map in every layer, or in every head of one layer", HeadsOptions)
def caption_heads(result: CaptionResult, options: HeadsOptions) -> Figure:
    _check(result, options)
    word = _word(result, options.word)
    layers = captioning.image_layers(result)
    layer = _chosen(result, options)[0]
    if layer is None:
        labels = [f"layer {i}" for i in range(layers)] + ["all layers"]
        maps = [captioning.word_attention(result, i, None)[word] for i in range(layers)]
    else:
        heads = captioning.image_heads(result, layer)
        labels = [f"head {h}" for h in range(heads)] + [selection.LABELS[selection.MEAN]]
        maps = [captioning.word_attention(result, layer, h)[word] for h in range(heads)]
    maps.append(np.mean(maps, axis=0))
    maps = np.stack(maps)
    tiles = [draw.labelled(overlay(result, values, options, TILE_PIXELS), label) for values, label in
             zip(maps, labels)]
    where = "every layer (heads averaged)" if layer is None else f"every head of layer {layer}"
    return Figure(
        export.file_stem(result.model.short_name, result.input_name, "caption heads", word, result.words[word],
                         "layers" if layer is None else f"layer {layer}"),
        image=draw.strip(tiles, min(6, len(tiles))),
        caption=f"“{result.words[word]}” (word {word}) in {where}, then their mean.",
        table=lambda: _region_table(result, maps, labels),
        payload={"model": result.model.key, "image": result.input_name, "word": word, "token": result.words[word],
                 "maps": labels, "attention": maps},
        arrays=lambda: {"attention": maps, "boxes": result.regions.boxes, "picture": result.image.image},
        metadata={"model": result.model.key, "image": result.input_name, "word": str(word),
                  "layer": "each" if layer is None else str(layer)})


@selection.checked
@dataclass(frozen=True)
class CaptionFaithfulnessOptions:
    word: int = 0  # the word explained
    steps: int = 16  # points of each curve after the start
    seeds: int = 5  # random orders
    layer: Layer = selection.ALL  # raw attention's layer ("all": the mean over layers)
    head: Head = selection.MEAN  # raw attention's head
    colormap: str = "inferno"  # the maps' colours (display only)
    replacement: str = "mean"  # what a removed region becomes (the mean colour: grey); named in the files


def word_faithfulness(loaded, result, options: CaptionFaithfulnessOptions):
    """The faithfulness views' analysis (``models.families.captioning.explain.word_faithfulness``)."""
    layer, head = _chosen(result, options)
    return caption_explain.word_faithfulness(loaded, result, options.word, options.steps, options.seeds, layer, head,
                                             progress=explainable.report)


FAITHFULNESS_OPTIONS = ("word", "steps", "seeds", "layer", "head")


@view("caption_faithfulness", "Is a word's map faithful? Deletion and insertion curves against random orders",
      CaptionFaithfulnessOptions, analysis=word_faithfulness, analysis_options=FAITHFULNESS_OPTIONS)
def caption_faithfulness(found, options: CaptionFaithfulnessOptions) -> Figure:
    """The curves and the table of the shared faithfulness figure, named for a caption word."""
    figure = faithfulness_figures.faithfulness(found, options)
    return dataclasses.replace(figure, stem=export.file_stem(found.result.model.short_name, found.input_name,
                                                             "caption faithfulness", options.word, found.target_name,
                                                             f"{found.steps} steps"))


@view("caption_explanations", "One word: raw attention beside rollout, gradient-weighted attention and input × "
                              "gradient", CaptionFaithfulnessOptions, analysis=word_faithfulness,
      analysis_options=FAITHFULNESS_OPTIONS)
def caption_explanations(found, options: CaptionFaithfulnessOptions) -> Figure:
    result: CaptionResult = found.result
    shown = MapOptions(opacity=0.65, colormap=options.colormap, smooth=False, exclude_sinks=False)
    scores = found.explanations.scores
    tiles = [draw.labelled(overlay(result, np.clip(values, 0, None) if method != "input_x_gradient" else
                                   np.abs(values), shown, TILE_PIXELS), METHODS[method].short)
             for method, values in scores.items()]
    return Figure(
        export.file_stem(result.model.short_name, result.input_name, "caption explanations", options.word,
                         found.target_name),
        image=draw.strip(tiles, len(tiles)),
        caption=f"Every explanation of “{found.target_name}”, each on its own scale (input × gradient: its size); "
                "one square per image token.",
        table=lambda: pd.DataFrame(scores, index=pd.Index(found.unit_names, name="image token")),
        payload={"model": found.model, "image": found.input_name, "target": found.target_name,
                 "maps": scores, "methods": {m: found.explanations.describe(m) for m in scores}},
        arrays=lambda: {**scores, "picture": result.image.image, "boxes": result.regions.boxes},
        metadata={"model": found.model, "image": found.input_name, "target": found.target_name})


def frame_table(result: CaptionResult) -> pd.DataFrame:
    """One row per frame the processor made: its tokens, their grid, the pixels it covers."""
    return pd.DataFrame([{"frame": f.name, "tokens": f.grid[0] * f.grid[1],
                          "grid": f"{f.grid[0]} × {f.grid[1]}",
                          "covers (pixels)": f"x {f.box[0]:.0f}–{f.box[2]:.0f}, "
                                             f"y {f.box[1]:.0f}–{f.box[3]:.0f}"}
                         for f in result.regions.frames])


@view("caption_regions", "Where every image token came from: its region of the picture, one "
                         "colour per frame", NoOptions)
def caption_regions(result: CaptionResult, options: NoOptions) -> Figure:
    """The picture with every image token's region outlined (tiles, thumbnails, merged blocks
    where the processor put them); the table holds one row per frame, the arrays every token's
    box."""
    regions = result.regions
    boxes = captioning.display_boxes(result)
    return Figure(
        export.file_stem(result.model.short_name, result.input_name, "caption regions"),
        image=draw.outline_regions(result.image.image, boxes, regions.frame_of, WORD_PIXELS),
        caption="every image token's region of your picture (one colour per frame)",
        table=lambda: frame_table(result),
        payload={"model": result.model.key, "image": result.input_name,
                 "geometry": regions.description, "frames": [f.name for f in regions.frames],
                 "frame_of": regions.frame_of, "boxes": boxes},
        arrays=lambda: {"boxes": boxes, "frame_of": regions.frame_of,
                        "picture": result.image.image},
        metadata={"model": result.model.key, "image": result.input_name})


@dataclass(frozen=True)
class SinkOptions:
    opacity: float = 0.0  # the picture with the sinks outlined; raise it to see the attention they soak up
    colormap: str = "inferno"


@view("caption_sinks", "Visual attention sinks: image tokens with massive activations that soak up attention",
      SinkOptions)
def caption_sinks(result: CaptionResult, options: SinkOptions) -> Figure:
    if result.sink_scores is None:
        raise ValueError("attention sinks are measured for decoder-only VLMs (image tokens in the language model); "
                         f"this is a {result.architecture} model")
    scores = np.asarray(result.sink_scores)
    sinks = result.sinks
    share = captioning.word_attention(result).mean(0)  # each token's attention, averaged over words
    picture = overlay(result, share, MapOptions(opacity=options.opacity, colormap=options.colormap, smooth=False,
                                                exclude_sinks=False), WORD_PIXELS)
    frame = pd.DataFrame({"token": np.arange(len(scores)), "activation ratio": scores,
                          "mean attention": share, "sink": scores >= vlm.SINK_RATIO,
                          "frame": [result.regions.frames[f].name for f in result.regions.frame_of]})
    chart = alt.Chart(frame).mark_circle(size=40).encode(
        x=alt.X("activation ratio:Q", scale=alt.Scale(type="log"), title="largest |activation| / image tokens' median"),
        y=alt.Y("mean attention:Q", title="attention from the words (mean)"),
        color=alt.condition(alt.datum.sink, alt.value("#d62728"), alt.value("steelblue")),
        tooltip=["token", "frame", alt.Tooltip("activation ratio:Q", format=".1f"),
                 alt.Tooltip("mean attention:Q", format=".4f")],
    ).properties(width=320, height=240, autosize=PAD)
    share_on_sinks = float(share[sinks].sum() / max(share.sum(), 1e-12)) if len(sinks) else 0.0
    return Figure(
        export.file_stem(result.model.short_name, result.input_name, "caption sinks"),
        image=picture, chart=chart,
        caption=f"{len(sinks)} of {len(scores)} image tokens have an activation at least {vlm.SINK_RATIO:g}× the "
                f"median at the language model's middle layer (outlined); they hold {share_on_sinks:.0%} of the "
                "attention the words give the image.",
        table=lambda: frame, payload={"model": result.model.key, "image": result.input_name,
                                      "sink_ratio": vlm.SINK_RATIO, "sinks": sinks, "activation_ratio": scores,
                                      "mean_attention": share, "share_on_sinks": share_on_sinks},
        arrays=lambda: {"activation_ratio": scores, "mean_attention": share, "boxes": result.regions.boxes},
        metadata={"model": result.model.key, "image": result.input_name})


def _architectures(loaded=None, result=None, options=None) -> dict:
    found = captioning.mini_metrics()
    if not found:
        raise ValueError("No measurements yet: train the minis with `python -m models.minis.captioning.train`.")
    return found


@dataclass(frozen=True)
class ArchitecturesOptions:
    role: str = "nouns"  # "nouns" or "colours"


@view("caption_architectures", "Which architecture's maps point at the right object? (pointing game, held-out scenes)",
      ArchitecturesOptions, analysis=_architectures, analysis_options=())
def caption_architectures(metrics: dict, options: ArchitecturesOptions) -> Figure:
    if options.role not in ("nouns", "colours"):
        raise ValueError(f"role is 'nouns' or 'colours', not {options.role!r}")
    rows = []
    for name, m in metrics.items():
        found = m["pointing"][options.role]
        rows.append({"architecture": captioning.short_title(name), "measure": "pointing game",
                     "value": found["default"], "random": found["random"], "se": found["default_se"]})
        if "right_object" in found:
            rows.append({"architecture": captioning.short_title(name), "measure": "right object (2–3 objects)",
                         "value": found["right_object"], "random": found["right_object_random"], "se": float("nan")})
        rows.append({"architecture": captioning.short_title(name), "measure": "caption exact match",
                     "value": m["exact_match"], "random": float("nan"), "se": float("nan")})
    frame = pd.DataFrame(rows)
    base = alt.Chart(frame)  # one data set for both layers: a facet of layers needs it at the top
    bars = base.mark_bar().encode(
        y=alt.Y("architecture:N", title=None, axis=alt.Axis(labelFontSize=13, labelLimit=240)),
        x=alt.X("value:Q", scale=alt.Scale(domain=[0, 1]), title=None, axis=alt.Axis(format="%")),
        color=alt.Color("architecture:N", legend=None),
        tooltip=["architecture", "measure", alt.Tooltip("value:Q", format=".1%"), alt.Tooltip("random:Q",
                                                                                             format=".1%")])
    ticks = base.mark_tick(color="black", thickness=2, size=22).encode(y="architecture:N", x=alt.X("random:Q")
                                                                       ).transform_filter("isValid(datum.random)")
    chart = alt.layer(bars, ticks, data=frame).properties(width=180, height=120).facet(  # three facets in 820 px
        column=alt.Column("measure:N", title=None, header=alt.Header(labelFontSize=13),
                          sort=["pointing game", "right object (2–3 objects)", "caption exact match"])
    ).properties(autosize=PAD)
    _, sentence = captioning.closest_to_truth(metrics)
    return Figure(
        export.file_stem("captioning minis", "architectures", options.role),
        chart=chart,
        caption=f"{options.role.capitalize()} on held-out generated scenes (black tick: a random cell). " +
                sentence.replace("**", ""),
        table=lambda: frame,
        payload={"role": options.role, "rows": rows, "closest": captioning.closest_to_truth(metrics)[0]},
        arrays=lambda: {"value": frame["value"].to_numpy(), "random": frame["random"].to_numpy()},
        metadata={"role": options.role})
