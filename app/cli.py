"""Headless export of any text-attention view, for papers and batch figures, through the same functions as the pages.

    python -m app.cli --page gpt --text "The animal didn't cross the street" --layer 3 --head 5 \
        --view head --format png,svg,json,csv,npz --out figures/

Views: ``head`` (one head or ``--head mean``), ``grid`` (all layers × heads), ``focus`` (one query token's bars,
``--query N``). Models: ``--model`` takes a registry key (default: the page's offline model), a hub id or a folder.
Nothing here imports Streamlit; it runs models through ``models/`` and draws with ``viz/``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from models import causal_lm, encoder, loading, registry
from models.analysis import heads
from viz import export, heatmap

PAGES = {"gpt": ("causal_lm", causal_lm.run), "encoder": ("encoder", encoder.run)}
VIEWS = ("head", "grid", "focus")
FORMATS = ("png", "svg", "json", "csv", "npz")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m app.cli", description=__doc__.split("\n\n")[0])
    parser.add_argument("--page", choices=sorted(PAGES), default="gpt")
    parser.add_argument("--model", help="registry key, hub id or local folder (default: the page's offline model)")
    parser.add_argument("--text", required=True, help="the input text")
    parser.add_argument("--layer", type=int, default=0)
    parser.add_argument("--head", default="0", help="a head number or 'mean'")
    parser.add_argument("--view", choices=VIEWS, default="head")
    parser.add_argument("--query", type=int, default=-1, help="query position for --view focus (default: last)")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--format", default="png,json", help=f"comma-separated: {', '.join(FORMATS)}")
    parser.add_argument("--scheme", choices=heatmap.COLOR_SCHEMES, default="viridis")
    parser.add_argument("--out", type=Path, default=Path("."), help="output folder")
    args = parser.parse_args(argv)
    args.formats = [f.strip() for f in args.format.split(",") if f.strip()]
    unknown = set(args.formats) - set(FORMATS)
    if unknown:
        parser.error(f"unknown format(s) {', '.join(sorted(unknown))}; choose from {', '.join(FORMATS)}")
    return args


def resolve_spec(page: str, model: str | None) -> registry.ModelSpec:
    family = PAGES[page][0]
    if not model:
        return registry.default(family)
    known = {spec.key: spec for spec in registry.specs(family)}
    return known.get(model) or registry.custom(family, model)


def render(args: argparse.Namespace) -> list[Path]:
    """Run the model and write the requested files; returns their paths."""
    family, run = PAGES[args.page]
    spec = resolve_spec(args.page, args.model)
    result = run(loading.load(spec), args.text, args.max_tokens)
    maps = result.maps("self")
    head = None if args.head == "mean" else int(args.head)
    weights = maps.head(args.layer, head)  # validates layer and head with a user-facing message
    allowed = maps.allowed(args.layer)
    head_name = "mean" if head is None else head
    stem = export.file_stem(spec.short_name, args.text[:40], maps.kind, f"layer {args.layer}", f"head {head_name}",
                            None if args.view == "head" else args.view)
    chart = image = table = None
    payload: dict = {"model": spec.key, "text": args.text, "kind": maps.kind, "query_tokens": maps.query_tokens,
                     "key_tokens": maps.key_tokens, "layer": args.layer, "head": head_name, "view": args.view}
    arrays: dict[str, np.ndarray] = {}
    if args.view == "head":
        if max(weights.shape) <= heatmap.MAX_CHART_TOKENS:
            chart = heatmap.attention_chart(weights, maps.query_tokens, maps.key_tokens, allowed,
                                            f"{spec.key}: layer {args.layer}, head {head_name}", args.scheme)
        else:
            image = heatmap.attention_image(weights, allowed, args.scheme)
        table = export.matrix_frame(weights, maps.query_tokens, maps.key_tokens)
        payload.update(weights=weights, allowed=allowed)
        arrays = {"weights": maps.layer(args.layer), "allowed": allowed}
    elif args.view == "grid":
        summary = heads.summarize(maps)
        image = heatmap.head_grid_image(summary.thumbnails, args.scheme)
        table = heads.summary_table(summary)
        payload.update(statistics=summary.statistics)
        arrays = {"thumbnails": summary.thumbnails, **summary.statistics}
    else:
        query = args.query if args.query >= 0 else len(maps.query_tokens) - 1
        if query >= len(maps.query_tokens):
            raise ValueError(f"query {query} does not exist: the input has {len(maps.query_tokens)} tokens")
        chart = heatmap.token_bars(weights[query], maps.key_tokens, f"where token {query} looks", allowed[query])
        import pandas as pd

        table = pd.DataFrame({"key": maps.key_tokens, "weight": weights[query]})
        payload.update(query=query, weights=weights[query])
        arrays = {"weights": weights[query]}
    args.out.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt in args.formats:
        path = args.out / f"{stem}.{fmt}"
        if fmt == "png":
            data = export.chart_png(chart) if chart is not None else export.image_png(image)
        elif fmt == "svg":
            if chart is None:
                raise ValueError("SVG needs a vector chart; this view is an image (long input or grid): use png")
            data = export.chart_svg(chart).encode("utf-8")
        elif fmt == "csv":
            data = export.csv_bytes(table)
        elif fmt == "json":
            data = export.json_bytes(payload)
        else:
            data = export.npz_bytes(arrays, model=spec.key, text=args.text, layer=args.layer, head=head_name)
        path.write_bytes(data)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        for path in render(args):
            print(path)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
