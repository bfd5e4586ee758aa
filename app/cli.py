"""Headless export of any attention view, for papers and batch figures, through the same functions as the pages.

    python -m app.cli --page gpt --text "The animal didn't cross the street" --layer 3 --head 5 \
        --view head --format png,svg,json,csv,npz --out figures/
    python -m app.cli --page translation --text "the black cat sees the dog" --view alignment --format png,json
    python -m app.cli --page vit --model "mini ViT shapes" --image cat --view rollout --format png,npz

Views: GPT / encoder: ``head`` (one head or ``--head mean``), ``grid`` (all layers × heads), ``focus`` (one query
token's bars, ``--query N``). Translation: ``alignment`` (cross-attention, output words × source words as on the page;
``--units tokens`` for pieces; ``--layer mean`` / ``--head mean`` average). ViT: ``cls`` ([CLS] attention over the
image) and ``rollout`` (Abnar & Zuidema 2020, ``--fusion``, ``--discard``). ``--image`` takes a sample name or a file.
Models: ``--model`` takes a registry key (default: the page's offline model), a hub id or a folder. Layer and head
default to what the page shows first. Nothing here imports Streamlit; it runs models through ``models/`` and draws
with ``viz/``.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from models import causal_lm, encoder, loading, registry
from models.analysis import heads
from viz import export, heatmap

PAGES = {"gpt": "causal_lm", "encoder": "encoder", "translation": "translation", "vit": "vit"}
VIEWS = {"gpt": ("head", "grid", "focus"), "encoder": ("head", "grid", "focus"), "translation": ("alignment",),
         "vit": ("cls", "rollout")}
FORMATS = ("png", "svg", "json", "csv", "npz")


@dataclass
class Figure:
    """What one view exports: a chart (PNG and SVG) or an image (PNG), a table (CSV), a payload (JSON), raw arrays
    (NPZ, with string metadata)."""

    stem: str
    chart: object = None
    image: object = None
    table: pd.DataFrame | None = None
    payload: dict = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    metadata: dict = field(default_factory=dict)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m app.cli", description=__doc__.split("\n\n")[0])
    parser.add_argument("--page", choices=sorted(PAGES), default="gpt")
    parser.add_argument("--model", help="registry key, hub id or local folder (default: the page's offline model)")
    parser.add_argument("--text", help="the input text (gpt, encoder, translation)")
    parser.add_argument("--image", help="a sample name (" + ", ".join(_sample_names()) + ") or an image file (vit)")
    parser.add_argument("--layer", help="a layer number, or 'mean' (translation: all layers averaged)")
    parser.add_argument("--head", help="a head number or 'mean'")
    parser.add_argument("--view", help="; ".join(f"{page}: {', '.join(views)}" for page, views in VIEWS.items())
                        + " (default: the first)")
    parser.add_argument("--query", type=int, default=-1, help="query position for --view focus (default: last)")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--units", choices=("words", "tokens"), default="words", help="translation alignment units")
    parser.add_argument("--beams", type=int, default=1, help="translation: 1 = greedy, more = beam search")
    parser.add_argument("--fusion", choices=("mean", "max", "min"), default="mean", help="rollout head fusion")
    parser.add_argument("--discard", type=float, default=0.0, help="rollout: weakest fraction dropped per layer")
    parser.add_argument("--colormap", default="inferno", help="vit overlay colormap")
    parser.add_argument("--opacity", type=float, default=0.6, help="vit overlay opacity, 0..1")
    parser.add_argument("--format", default="png,json", help=f"comma-separated: {', '.join(FORMATS)}")
    parser.add_argument("--scheme", choices=heatmap.COLOR_SCHEMES, default="viridis")
    parser.add_argument("--out", type=Path, default=Path("."), help="output folder")
    args = parser.parse_args(argv)
    args.formats = [f.strip() for f in args.format.split(",") if f.strip()]
    unknown = set(args.formats) - set(FORMATS)
    if unknown:
        parser.error(f"unknown format(s) {', '.join(sorted(unknown))}; choose from {', '.join(FORMATS)}")
    args.view = args.view or VIEWS[args.page][0]
    if args.view not in VIEWS[args.page]:
        parser.error(f"the {args.page} page has no view {args.view!r}; choose from {', '.join(VIEWS[args.page])}")
    if args.page == "vit" and not args.image:
        parser.error("--image is required for the vit page (a sample name or an image file)")
    if args.page != "vit" and args.text is None:
        parser.error(f"--text is required for the {args.page} page")
    return args


def _sample_names() -> list[str]:
    from models import images

    return images.sample_names()


def resolve_spec(page: str, model: str | None) -> registry.ModelSpec:
    family = PAGES[page]
    if not model:
        spec = registry.default(family)
    else:
        known = {spec.key: spec for spec in registry.specs(family)}
        spec = known.get(model) or registry.custom(family, model)
    return spec if family != "vit" or spec.library == "timm" else replace(spec, library="timm")  # as the ViT page


def _number(value: str | None, what: str, default: int | None) -> int | None:
    """``--layer`` / ``--head``: a number, 'mean' (None), or the page's default when not given."""
    if value is None:
        return default
    if value == "mean":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"--{what} must be a number or 'mean', not {value!r}") from None


def text_figure(args: argparse.Namespace, spec: registry.ModelSpec) -> Figure:
    """The GPT and encoder pages' views of one layer and head."""
    run = causal_lm.run if args.page == "gpt" else encoder.run
    result = run(loading.load(spec), args.text, args.max_tokens)
    maps = result.maps("self")
    layer = _number(args.layer, "layer", 0)
    if layer is None:
        raise ValueError("--layer mean is for translation; pick a layer number")
    head = _number(args.head, "head", 0)
    weights = maps.head(layer, head)  # validates layer and head with a user-facing message
    allowed = maps.allowed(layer)
    head_name = "mean" if head is None else head
    figure = Figure(export.file_stem(spec.short_name, args.text[:40], maps.kind, f"layer {layer}", f"head {head_name}",
                                     None if args.view == "head" else args.view),
                    metadata={"model": spec.key, "text": args.text, "layer": layer, "head": head_name})
    figure.payload = {"model": spec.key, "text": args.text, "kind": maps.kind, "query_tokens": maps.query_tokens,
                      "key_tokens": maps.key_tokens, "layer": layer, "head": head_name, "view": args.view}
    if args.view == "head":
        if max(weights.shape) <= heatmap.MAX_CHART_TOKENS:
            figure.chart = heatmap.attention_chart(weights, maps.query_tokens, maps.key_tokens, allowed,
                                                   f"{spec.key}: layer {layer}, head {head_name}", args.scheme)
        else:
            figure.image = heatmap.attention_image(weights, allowed, args.scheme)
        figure.table = export.matrix_frame(weights, maps.query_tokens, maps.key_tokens)
        figure.payload.update(weights=weights, allowed=allowed)
        figure.arrays = {"weights": maps.layer(layer), "allowed": allowed}
    elif args.view == "grid":
        summary = heads.summarize(maps)
        figure.image = heatmap.head_grid_image(summary.thumbnails, args.scheme)
        figure.table = heads.summary_table(summary)
        figure.payload.update(statistics=summary.statistics)
        figure.arrays = {"thumbnails": summary.thumbnails, **summary.statistics}
    else:
        query = args.query if args.query >= 0 else len(maps.query_tokens) - 1
        if query >= len(maps.query_tokens):
            raise ValueError(f"query {query} does not exist: the input has {len(maps.query_tokens)} tokens")
        figure.chart = heatmap.token_bars(weights[query], maps.key_tokens, f"where token {query} looks",
                                          allowed[query])
        figure.table = pd.DataFrame({"key": maps.key_tokens, "weight": weights[query]})
        figure.payload.update(query=query, weights=weights[query])
        figure.arrays = {"weights": weights[query]}
    return figure


def translation_figure(args: argparse.Namespace, spec: registry.ModelSpec) -> Figure:
    """The translation page's alignment: cross-attention of the decoded output over the source, as on the page."""
    import json

    from models import translation
    from models.minis.translation import grammar
    from viz import alignment as alignment_viz

    loaded = translation.load(spec)
    if args.beams < 1:
        raise ValueError("--beams must be at least 1 (1 = greedy decoding)")
    settings = translation.TranslationSettings("greedy" if args.beams == 1 else "beam search", max(args.beams, 2),
                                               args.max_tokens)
    result = translation.run(loaded, args.text, settings)
    if "cross" not in result.attention:
        raise ValueError(f"{spec.key} has no attention (one fixed context vector): pick a model with attention")
    metrics_path = loading.SAMPLE_DATA / "translation" / "metrics.json"
    metrics = json.loads(metrics_path.read_text()) if metrics_path.is_file() else None
    default_layer, default_head = translation.default_view(loaded, metrics)
    layer = _number(args.layer, "layer", default_layer)
    head = _number(args.head, "head", default_head)
    maps = result.maps("cross")
    for value, count, what in ((layer, maps.num_layers, "layer"), (head, maps.num_heads, "head")):
        if value is not None and not 0 <= value < count:
            raise ValueError(f"{what} {value} does not exist: {spec.key} has {count} decoder {what}s (0–{count - 1})")
    view = translation.alignment_view(result, layer, head, args.units == "words", grammar.showcase_pairs().values())
    out = result.extras["translation"]
    figure = Figure(export.file_stem(spec.short_name, args.text[:40], "cross",
                                     "all layers" if layer is None else f"layer {layer}",
                                     "mean" if head is None else f"head {head}", args.units),
                    metadata={"model": spec.key, "text": args.text, "translation": out.translation,
                              "layer": "mean" if layer is None else layer, "head": "mean" if head is None else head})
    if max(view.weights.shape) > heatmap.MAX_CHART_TOKENS:
        figure.image = heatmap.attention_image(view.weights, None, "greys")
    else:
        figure.chart = alignment_viz.alignment_chart(view.weights, view.row_labels, view.column_labels, view.title,
                                                     gold=view.gold, argmax=view.argmax)
    figure.table = export.matrix_frame(view.weights, view.row_labels, view.column_labels)
    figure.payload = export.alignment_payload(view, spec.key, args.text, out.translation, layer, head, args.units)
    figure.arrays = {"weights": view.weights}
    return figure


def vit_figure(args: argparse.Namespace, spec: registry.ModelSpec) -> Figure:
    """The ViT page's [CLS] overlay (one layer, one head or their mean) or its attention rollout."""
    from models import images, vit
    from models.analysis import rollout
    from viz import image_overlay

    picture = images.load_sample(args.image) if args.image in images.SAMPLES else \
        images.decode_image(_read_image(Path(args.image)), f"the file {Path(args.image).name!r}")
    result = vit.run(vit.load(spec), picture)
    info, maps = result.image, result.maps("self")
    scale = max(1, round(400 / info.image.shape[0]))  # as the page: pixel for pixel, enlarged
    input_name = f"sample {args.image}" if args.image in images.SAMPLES else Path(args.image).stem
    if args.view == "cls":
        layer = _number(args.layer, "layer", maps.num_layers - 1)
        head = _number(args.head, "head", None)
        if layer is None:
            raise ValueError("--layer mean is for translation; pick a layer number")
        values = vit.cls_attention_grid(maps, info, layer, head)  # validates layer and head
        head_name = "mean" if head is None else head
        stem = export.file_stem(spec.short_name, input_name, "cls", f"layer {layer}", f"head {head_name}")
        settings = {"layer": layer, "head": head_name}
        arrays = {"cls_attention": values, "attention": maps.layer(layer)}
    else:
        query = 0 if info.num_prefix_tokens and info.prefix_names[0] == "[CLS]" else None  # as app.resources
        values = rollout.cls_rollout([maps.layer(i) for i in range(maps.num_layers)], info.num_prefix_tokens,
                                     info.patch_grid, args.fusion, args.discard, query)
        stem = export.file_stem(spec.short_name, input_name, "rollout", args.fusion, f"discard {args.discard:g}")
        settings = {"fusion": args.fusion, "discard": args.discard}
        arrays = {"rollout": values}
    values = np.asarray(values, dtype=np.float32)
    rows, cols = info.patch_grid
    return Figure(stem, image=image_overlay.attention_overlay(info.image, values, args.opacity, args.colormap,
                                                               "bilinear", scale),
                  table=pd.DataFrame(values, index=pd.Index(range(rows), name="patch row"),
                                     columns=[f"col {c}" for c in range(cols)]),
                  payload={"model": spec.key, "image": input_name, "view": args.view, **settings,
                           "patch_grid": [rows, cols], "prefix_tokens": list(info.prefix_names), "values": values},
                  arrays={**arrays, "crop": info.image}, metadata={"model": spec.key, "image": input_name,
                                                                   **{k: str(v) for k, v in settings.items()}})


def _read_image(path: Path) -> bytes:
    if not path.is_file():
        raise ValueError(f"--image {str(path)!r} is neither a sample name nor a file")
    return path.read_bytes()


def render(args: argparse.Namespace) -> list[Path]:
    """Run the model and write the requested files; returns their paths."""
    spec = resolve_spec(args.page, args.model)
    make = {"translation": translation_figure, "vit": vit_figure}.get(args.page, text_figure)
    figure = make(args, spec)
    args.out.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt in args.formats:
        path = args.out / f"{figure.stem}.{fmt}"
        if fmt == "png":
            data = export.chart_png(figure.chart) if figure.chart is not None else export.image_png(figure.image)
        elif fmt == "svg":
            if figure.chart is None:
                raise ValueError("SVG needs a vector chart; this view is an image (long input, grid, image overlay): "
                                 "use png")
            data = export.chart_svg(figure.chart).encode("utf-8")
        elif fmt == "csv":
            data = export.csv_bytes(figure.table)
        elif fmt == "json":
            data = export.json_bytes(figure.payload)
        else:
            data = export.npz_bytes(figure.arrays, **figure.metadata)
        path.write_bytes(data)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    from models import memory

    args = parse(argv)
    memory.use_fixed_mmap_threshold()  # as the app does: long inputs do not pin freed activations
    try:
        for path in render(args):
            print(path)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        for word, options in (getattr(error, "suggestions", None) or {}).items():  # translation's unknown words
            print(f"  {word}: did you mean {', '.join(options) or '(no close word)'}?", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
