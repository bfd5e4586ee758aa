"""Files for download and for the command-line export: figures as PNG/SVG, numbers as CSV/JSON, raw maps as .npz.

``offers(figure)`` lists the files a ``viz.figure.Figure`` can be saved as (the page's download buttons);
``write(figure, formats, folder)`` saves them (``python -m app.cli``). Pure: charts, images and arrays in, bytes
out. Altair charts are rendered by vl-convert (offline, no browser), so the PNG a lecturer downloads is the chart
the page shows, drawn at print resolution.
"""
from __future__ import annotations

import io
import json
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import altair as alt
import numpy as np
import pandas as pd
from PIL import Image

from viz.figure import Figure, combined  # noqa: F401  (combined: figures for export)

PRINT_SCALE = 4  # Vega's 72-dpi pixels × 4 ≈ 300 dpi: sharp in print and on a projector
PRINT_DPI = 300


def head_label(head: int | None) -> str:
    """How a head is named in titles and files: its number, or "mean" for the average of heads."""
    return "mean" if head is None else str(head)


def run_stem(result, *parts) -> str:
    """A file stem for a figure of one run (a ``RunResult``): its model, its input, then ``parts``."""
    return file_stem(result.model.short_name, result.input_name, *parts)


def run_metadata(result, **settings) -> dict[str, str]:
    """What a run's figure files record about it: its model and input and the view's ``settings``."""
    return {"model": result.model.key, "input": result.input_name, **{k: str(v) for k, v in settings.items()}}


def file_stem(*parts: object, max_length: int = 120) -> str:
    """A safe, readable file name from its parts: ``file_stem("gpt2", "layer 3", "head 5", "The cat…")``
    -> ``gpt2_layer-3_head-5_the-cat``. Only ASCII letters, digits, ``-`` and ``_`` survive."""
    words = []
    for part in parts:
        if part is None or part == "":
            continue
        ascii_text = unicodedata.normalize("NFKD", str(part)).encode("ascii", "ignore").decode()
        slug = re.sub(r"[^A-Za-z0-9]+", "-", ascii_text).strip("-").lower()
        if slug:
            words.append(slug[:40])
    return ("_".join(words) or "attention")[:max_length].rstrip("-_")


def chart_png(chart: alt.TopLevelMixin, scale: float = PRINT_SCALE) -> bytes:
    import vl_convert

    return vl_convert.vegalite_to_png(_spec(chart), scale=scale)


def chart_svg(chart: alt.TopLevelMixin) -> str:
    import vl_convert

    return vl_convert.vegalite_to_svg(_spec(chart))


def _spec(chart: alt.TopLevelMixin) -> str:
    """The chart's Vega-Lite JSON. Altair refuses data over 5,000 rows (a guard for notebooks); the page drew the
    chart whatever its size, so the export lifts the guard for this one conversion."""
    with alt.data_transformers.enable(max_rows=None):
        return chart.to_json()


def figure_html(figure: Figure) -> str:
    """The figure as one self-contained HTML page that opens offline: a chart with Vega, Vega-Lite and vega-embed
    inlined (vl-convert's bundle, about 0.9 MB; the chart stays interactive: tooltips, hover), or an image as an
    embedded PNG; the caption under it, as text (tokens are escaped, never markup)."""
    import base64
    import html

    chart = figure.export_chart()
    caption = f'<p style="font-family: sans-serif; font-size: 13px; max-width: 60em">{html.escape(figure.caption)}</p>'
    title = html.escape(figure.stem)
    if chart is not None:
        with alt.data_transformers.enable(max_rows=None):
            page = chart.to_html(inline=True)
        page = page.replace("<head>", f"<head>\n  <title>{title}</title>", 1)
        body, end, rest = page.rpartition("</body>")  # the last one: the inlined script holds the string too
        return body + (caption + "\n" if figure.caption else "") + end + rest
    if figure.image is None:
        raise ValueError("this view draws nothing to write as HTML")
    picture = base64.b64encode(image_png(figure.image)).decode("ascii")
    return (f'<!DOCTYPE html>\n<html>\n<head>\n  <meta charset="UTF-8">\n  <title>{title}</title>\n</head>\n<body>\n'
            f'<img src="data:image/png;base64,{picture}" style="max-width: 100%" alt="{title}">\n'
            f"{caption if figure.caption else ''}\n</body>\n</html>\n")


def image_png(image: Image.Image, min_side: int = 1600) -> bytes:
    """A PIL figure as PNG, enlarged with nearest-neighbour (cells stay crisp) to at least ``min_side`` pixels."""
    scale = max(1, -(-min_side // max(image.size)))
    if scale > 1:
        image = image.resize((image.width * scale, image.height * scale), Image.NEAREST)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", dpi=(PRINT_DPI, PRINT_DPI))
    return buffer.getvalue()


def matrix_frame(weights: np.ndarray, query_tokens: list[str], key_tokens: list[str]) -> pd.DataFrame:
    """One ``(queries, keys)`` map as a table: one row per query, one column per key, labelled by position and token."""
    if weights.shape != (len(query_tokens), len(key_tokens)):
        raise ValueError(f"map {weights.shape} does not match {len(query_tokens)} × {len(key_tokens)} tokens")
    index = pd.Index([f"{i}:{t}" for i, t in enumerate(query_tokens)], name="query")
    columns = [f"{i}:{t}" for i, t in enumerate(key_tokens)]
    return pd.DataFrame(weights.astype(np.float64), index=index, columns=columns)


def csv_bytes(frame: pd.DataFrame) -> bytes:
    # Cells starting with = + - @ are formulas to a spreadsheet: prefix them so a token never executes in Excel
    safe = frame.copy()
    safe.index = [_defuse(v) for v in safe.index]
    safe.columns = [_defuse(v) for v in safe.columns]
    for column in safe.columns:
        if not pd.api.types.is_numeric_dtype(safe[column]):
            safe[column] = safe[column].map(_defuse)
    return safe.to_csv().encode("utf-8")


def _defuse(value):
    return "'" + value if isinstance(value, str) and value[:1] in ("=", "+", "-", "@") else value


def json_bytes(payload: dict) -> bytes:
    """JSON with numpy arrays as nested lists (floats rounded to 7 decimals; −∞ of masked scores and NaN as null,
    so the file stays strict JSON that browsers parse)."""

    def convert(value):
        if isinstance(value, np.ndarray):
            if value.dtype.kind != "f":
                return value.tolist()
            rounded = np.round(value.astype(np.float64), 7)
            finite = np.isfinite(rounded)
            return rounded.tolist() if finite.all() else np.where(finite, rounded, None).tolist()
        if isinstance(value, (np.floating, np.integer)):
            return value.item()
        raise TypeError(f"cannot write {type(value).__name__} as JSON")

    return json.dumps(payload, default=convert, ensure_ascii=False, indent=1).encode("utf-8")


def npz_bytes(arrays: dict[str, np.ndarray], **metadata: str) -> bytes:
    """The raw arrays, plus string metadata (model, input, layer, head) stored as 0-d unicode arrays."""
    buffer = io.BytesIO()
    extra = {f"meta_{k}": np.array(str(v)) for k, v in metadata.items()}
    np.savez_compressed(buffer, **arrays, **extra)
    return buffer.getvalue()


FORMATS = ("png", "svg", "csv", "json", "npz")


@dataclass(frozen=True)
class FileOffer:
    """One file a figure can be saved as; ``make()`` builds its bytes (only when asked)."""

    format: str  # one of FORMATS
    filename: str
    mime: str
    make: Callable[[], bytes]


def offers(figure: Figure) -> list[FileOffer]:
    """The files ``figure`` can be written as, in ``FORMATS`` order: PNG (and SVG for a chart) of what is drawn,
    CSV of its table, JSON of its payload, NPZ of its arrays with the metadata."""
    stem, found = figure.stem, []
    chart = figure.export_chart()
    if chart is not None:
        found.append(FileOffer("png", f"{stem}.png", "image/png", lambda: chart_png(chart)))
        found.append(FileOffer("svg", f"{stem}.svg", "image/svg+xml", lambda: chart_svg(chart).encode("utf-8")))
    elif figure.image is not None:
        found.append(FileOffer("png", f"{stem}.png", "image/png", lambda: image_png(figure.image)))
    if figure.table is not None:
        found.append(FileOffer("csv", f"{stem}.csv", "text/csv", lambda: csv_bytes(figure.table())))
    if figure.payload is not None:
        found.append(FileOffer("json", f"{stem}.json", "application/json",
                               lambda: json_bytes(figure.payload())))
    if figure.arrays is not None:
        found.append(FileOffer("npz", f"{stem}.npz", "application/octet-stream",
                               lambda: npz_bytes(figure.arrays(), **dict(figure.metadata))))
    return found


def write(figure: Figure, formats: list[str], folder: Path) -> list[Path]:
    """Write ``figure`` in each of ``formats`` into ``folder``; a format the figure cannot be (SVG of an image, CSV
    of a figure without a table) is a ``ValueError`` naming the ones it can."""
    available = {offer.format: offer for offer in offers(figure)}
    missing = [f for f in formats if f not in available]
    if missing:
        why = " (SVG needs a vector chart; this view is drawn as an image: use png)" if "svg" in missing and \
            figure.image is not None else ""
        raise ValueError(f"this view cannot be written as {', '.join(missing)}{why}; it can be: "
                         f"{', '.join(available) or 'nothing'}")
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt in formats:
        path = folder / available[fmt].filename
        path.write_bytes(available[fmt].make())
        written.append(path)
    return written
