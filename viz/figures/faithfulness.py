"""Explanations side by side and how faithful each is (``models.analysis.explanations``, ``models.analysis.faithfulness``):
every method's map on the input, the deletion and insertion curves against random orders with their AUCs, and on
the mini ViT shapes the pointing game and IoU against the generator's masks."""
from __future__ import annotations

from dataclasses import dataclass

import altair as alt
import numpy as np
import pandas as pd
from PIL import Image, ImageDraw, ImageFont

from models.analysis import explanations as explainable
from models.analysis.methods import METHODS, RANDOM, RANDOM_NAME, method_name
from models.analysis.faithfulness import AUC_NOTE, Faithfulness, measure_symbol
from models.core import selection
from models.core.results import ImageResult
from models.core.selection import Head, Layer
from models.core.text import with_marks
from viz import export, image_overlay
from viz.figure import NONE, Figure, view
from viz.heatmap import PAD

TILE_PIXELS = 192
LABEL_PIXELS = 24  # the method's name above each map
RANDOM_MAP = "Random map"  # the localisation's baseline


@selection.checked
@dataclass(frozen=True)
class FaithfulnessOptions:
    target: int | None = None  # the class (ViT) or vocabulary id (GPT) explained; None: the top prediction
    token: str = ""  # GPT: a target token as typed (" Paris"); "" = ``target``
    steps: int = 20  # points of each curve after the start
    seeds: int = 5  # random orders the methods are compared with
    replacement: str = "mean"  # what replaces a removed patch: "mean" (grey) or "blur"
    ig_steps: int = 32  # integrated gradients' Riemann steps
    colormap: str = "inferno"  # the maps' colours (display only)
    layer: Layer = selection.LAST  # raw attention's layer
    head: Head = selection.MEAN  # raw attention's head


ANALYSIS_OPTIONS = ("target", "token", "steps", "seeds", "replacement", "ig_steps", "layer", "head")


def _settings(found: Faithfulness) -> dict:
    return {"model": found.model, "input": found.input_name, "target": found.target_name}


def _stem(found: Faithfulness, what: str, options: FaithfulnessOptions) -> str:
    kind = "class" if isinstance(found.result, ImageResult) else "target"
    return export.file_stem(found.model.split("/")[-1], found.input_name, what, f"{kind} {found.target_name}",
                            f"{options.replacement} replacement", f"{found.steps} steps")


def curve_frame(found: Faithfulness) -> pd.DataFrame:
    rows = []
    fractions = found.fractions
    deletion_random = np.mean([c.deletion for c in found.random], 0)
    insertion_random = np.mean([c.insertion for c in found.random], 0)
    for name, curves in [*found.curves.items(), (RANDOM, None)]:
        for curve_name in ("deletion", "insertion"):
            values = (getattr(curves, curve_name) if curves is not None
                      else deletion_random if curve_name == "deletion" else insertion_random)
            rows += [{"method": method_name(name), "curve": curve_name, "fraction": float(x), "probability": float(p)}
                     for x, p in zip(fractions, values)]
    return pd.DataFrame(rows)


def table_frame(found: Faithfulness) -> pd.DataFrame:
    rows = []
    for name, curves in found.curves.items():
        rows.append({"method": method_name(name), "deletion AUC (lower better)": curves.deletion_auc,
                     "insertion AUC (higher better)": curves.insertion_auc,
                     "no better than random": "yes" if found.no_better_than_random(name) else "no",
                     "seconds": found.explanations.seconds.get(name, float("nan")),
                     "what": found.explanations.describe(name)})
    deletion_mean, deletion_std = found.random_auc("deletion")
    insertion_mean, insertion_std = found.random_auc("insertion")
    rows.append({"method": RANDOM_NAME, "deletion AUC (lower better)": deletion_mean,
                 "insertion AUC (higher better)": insertion_mean, "no better than random": NONE,
                 "seconds": float("nan"), "what": f"random order, mean ± sd of {len(found.random)} seeds "
                 f"(deletion ± {deletion_std:.3f}, insertion ± {insertion_std:.3f})"})
    return pd.DataFrame(rows)


def curves_chart(frame: pd.DataFrame, curve: str, title: str, unit: str = "patches",
                 measure: str = "target probability") -> alt.Chart:
    part = frame[frame["curve"] == curve]
    dash = alt.condition(alt.datum.method == RANDOM_NAME, alt.value([5, 4]), alt.value([1, 0]))
    return alt.Chart(part).mark_line(point=alt.OverlayMarkDef(size=14)).encode(
        x=alt.X("fraction:Q", title=f"fraction of {unit} {'removed' if curve == 'deletion' else 'revealed'}",
                scale=alt.Scale(domain=[0, 1])),
        y=alt.Y("probability:Q", title=measure, scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("method:N", sort=list(dict.fromkeys(part["method"])),
                        legend=alt.Legend(orient="bottom", columns=2, title=None, labelLimit=150)), strokeDash=dash,
        tooltip=["method", alt.Tooltip("fraction:Q", format=".2f"), alt.Tooltip("probability:Q", format=".3f")],
    ).properties(title=title, width=320, height=240, autosize=PAD)


@view("faithfulness", "Deletion and insertion curves of every explanation against random", FaithfulnessOptions,
      analysis=explainable.faithfulness, analysis_options=ANALYSIS_OPTIONS)
def faithfulness(found: Faithfulness, options: FaithfulnessOptions) -> Figure:
    """The JSON is the CLI contract: ``{"target", "methods": {m: {"deletion_auc", "insertion_auc", "deletion",
    "insertion"}, ..., "random": {...}}}`` plus what the AUCs mean and what replaced a removed unit."""
    frame = curve_frame(found)
    payload = found.payload()
    unit = "patches" if isinstance(found.result, ImageResult) else "tokens"
    return Figure(
        _stem(found, "faithfulness", options),
        charts=(curves_chart(frame, "deletion", "Deletion: most relevant removed first (lower is better)", unit,
                             found.measure),
                curves_chart(frame, "insertion", "Insertion: most relevant revealed first (higher is better)", unit,
                             found.measure)),
        caption=f"Target: {found.target_name} ({measure_symbol(found.measure)} = "
                f"{found.probability:.3f}). A removed "
                f"{'patch' if unit == 'patches' else 'token'} is replaced by "
                f"{found.replacement}. AUC: {AUC_NOTE}. {found.seconds:.1f} s.",
        table=lambda: table_frame(found), payload=payload,
        arrays=lambda: {"fractions": found.fractions,
                        **{f"{m}_deletion": c.deletion for m, c in found.curves.items()},
                        **{f"{m}_insertion": c.insertion for m, c in found.curves.items()},
                        **{f"{m}_scores": s for m, s in found.explanations.scores.items()},
                        "random_deletion": np.stack([c.deletion for c in found.random]),
                        "random_insertion": np.stack([c.insertion for c in found.random])},
        metadata=_settings(found), width="content")


def _labelled(picture: Image.Image, label: str) -> Image.Image:
    sheet = Image.new("RGB", (picture.width, picture.height + LABEL_PIXELS), (255, 255, 255))
    sheet.paste(picture, (0, LABEL_PIXELS))
    ImageDraw.Draw(sheet).text((2, 2), label, fill=(0, 0, 0), font=ImageFont.load_default(LABEL_PIXELS - 6))
    return sheet


def unit_grid(found: Faithfulness, scores: np.ndarray) -> np.ndarray:
    """A method's scores over the patches as ``(rows, cols)``."""
    return np.asarray(scores, dtype=np.float32).reshape(found.result.image.patch_grid)


def token_chart(found: Faithfulness, scheme: str = "inferno") -> alt.Chart:
    """methods × tokens, each method's scores min–max normalised over the tokens (text families)."""
    rows = []
    for method, scores in found.explanations.scores.items():
        scores = np.asarray(scores, dtype=np.float64)
        span = scores.max() - scores.min()
        shown = (scores - scores.min()) / span if span > 0 else np.zeros_like(scores)
        rows += [{"method": method_name(method), "position": i, "token": f"{i}: {token}", "relevance": float(v),
                  "score": float(raw)} for i, (token, v, raw) in enumerate(zip(found.unit_names, shown, scores))]
    frame = pd.DataFrame(rows)
    return alt.Chart(frame).mark_rect().encode(
        x=alt.X("token:N", sort=alt.EncodingSortField("position", op="min"), title=None,
                axis=alt.Axis(labelAngle=-50, labelLimit=110, labelOverlap=False)),
        y=alt.Y("method:N", sort=[method_name(m) for m in found.explanations.scores], title=None),
        color=alt.Color("relevance:Q", scale=alt.Scale(scheme=scheme, domain=[0, 1]), title="relevance (min–max)"),
        tooltip=["method", "token", alt.Tooltip("score:Q", format=".4g")],
    ).properties(width=min(900, 34 * len(found.unit_names)), height=24 * len(found.explanations.scores),
                 autosize=PAD)


@view("explanations", "Every explanation's map of one target, side by side", FaithfulnessOptions,
      analysis=explainable.faithfulness, analysis_options=ANALYSIS_OPTIONS)
def explanations(found: Faithfulness, options: FaithfulnessOptions) -> Figure:
    """Each map normalised to its own min–max (what matters for the curves is the order, not the scale)."""
    if not isinstance(found.result, ImageResult):  # text: methods × tokens
        scores = {m: np.asarray(s, dtype=np.float32) for m, s in found.explanations.scores.items()}
        return Figure(
            _stem(found, "explanations", options), chart=token_chart(found), width="stretch",
            caption=with_marks(f"Every method's relevance of each input token for {found.target_name!r} "
                               f"({found.target_kind}), each row scaled to its own range.", found.unit_names,
                               [found.target_name]),
            table=lambda: pd.DataFrame(scores, index=pd.Index(found.unit_names, name="token")),
            payload={**_settings(found), "tokens": list(found.unit_names), "maps": scores,
                     "methods": {m: found.explanations.describe(m) for m in scores}},
            arrays=lambda: dict(scores), metadata=_settings(found))
    info = found.result.image
    scale = max(1, round(TILE_PIXELS / info.image.shape[0]))
    grids = {m: unit_grid(found, s) for m, s in found.explanations.scores.items()}
    tiles = [_labelled(image_overlay.attention_overlay(info.image, grid, 0.65, options.colormap, "nearest", scale),
                       METHODS[m].short) for m, grid in grids.items()]
    return Figure(
        _stem(found, "explanations", options), image=image_overlay.tile(tiles, 4),
        caption=f"Every method's relevance for {found.target_name!r}, each scaled to its own range; brighter = more "
                "relevant (nearest upsampling: one square per patch).",
        payload={**_settings(found), "patch_grid": list(info.patch_grid),
                 "maps": {m: g for m, g in grids.items()},
                 "methods": {m: found.explanations.describe(m) for m in grids}},
        arrays=lambda: {**grids, "crop": info.image}, metadata=_settings(found))


@dataclass(frozen=True)
class LocalisationOptions:
    images: int = 32  # held-out generated shapes (the bench runs 500)
    seed: int = 31337  # the stream they are drawn from (not the training or test seeds)
    ig_steps: int = 16


@view("localisation", "Pointing game and IoU against the generator's shape masks (mini ViT)", LocalisationOptions,
      analysis=explainable.localisation, analysis_options=("images", "seed", "ig_steps"))
def localisation(found, options: LocalisationOptions) -> Figure:
    summary = found.summary()
    rows = [{"method": RANDOM_MAP if m == RANDOM else method_name(m), "pointing game": s["pointing_game"],
             "pointing game se": s["pointing_game_se"],
             "IoU": s["iou"], "IoU se": s["iou_se"]} for m, s in summary.items()]
    frame = pd.DataFrame(rows)
    long = frame.melt(id_vars=["method"], value_vars=["pointing game", "IoU"], var_name="measure", value_name="value")
    order = list(frame["method"])
    chart = alt.Chart(long).mark_bar().encode(
        y=alt.Y("method:N", sort=order, title=None), x=alt.X("value:Q", scale=alt.Scale(domain=[0, 1]), title=None),
        color=alt.condition(alt.datum.method == RANDOM_MAP, alt.value("#999999"), alt.value("steelblue")),
        column=alt.Column("measure:N", title=None, sort=["pointing game", "IoU"]),
        tooltip=["method", "measure", alt.Tooltip("value:Q", format=".3f")],
    ).properties(width=260, height=22 * len(order), autosize=PAD)
    return Figure(
        export.file_stem(found.model, "localisation", f"{found.images} images", f"seed {found.seed}"), chart=chart,
        caption=f"{found.images} held-out generated shapes (seed {found.seed}), the true class as the target; the "
                f"model got {found.correct.mean():.0%} of them right. Pointing game: the top patch touches the shape. "
                "IoU: patches above the map's mean vs patches at least half covered by the shape. "
                f"{found.seconds:.1f} s.",
        table=lambda: frame, payload={"model": found.model, "images": found.images, "seed": found.seed,
                                      "accuracy": float(found.correct.mean()), "methods": summary},
        arrays=lambda: {"hits": found.hits, "iou": found.iou, "correct": found.correct},
        metadata={"model": found.model, "images": str(found.images), "seed": str(found.seed)})
