"""Files for download and for the command-line export: figures as PNG/SVG, numbers as CSV/JSON, raw maps as .npz.

Pure: charts, images and arrays in, bytes out. Altair charts are rendered by vl-convert (offline, no browser), so the
PNG a lecturer downloads is the chart the page shows, drawn at print resolution.
"""
from __future__ import annotations

import io
import json
import re
import unicodedata

import altair as alt
import numpy as np
import pandas as pd
from PIL import Image

PRINT_SCALE = 4  # Vega's 72-dpi pixels × 4 ≈ 300 dpi: sharp in print and on a projector
PRINT_DPI = 300


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


def combined(*charts: alt.TopLevelMixin, vertical: bool = False) -> alt.TopLevelMixin:
    """Charts a page shows side by side (or stacked) as one figure to export. Vega-Lite allows ``autosize`` only on
    the outermost chart, so each part loses its own (they are drawn at their own width and height anyway)."""
    parts = []
    for chart in charts:
        part = chart.copy()
        part.autosize = alt.Undefined
        parts.append(part)
    joined = alt.vconcat(*parts) if vertical else alt.hconcat(*parts)
    # each part keeps its own colours and legend, as on the page (Vega-Lite would merge same-named colour fields)
    return joined.resolve_scale(color="independent").resolve_legend(color="independent").properties(
        autosize=alt.AutoSizeParams(type="pad", contains="padding"))


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


def alignment_payload(view, model: str, source: str, translation: str, layer: int | None, head: int | None,
                      units: str) -> dict:
    """A translation alignment (``models.translation.AlignmentView``) as JSON-ready data, the same from the page and
    the CLI: ``weights (output, source)``, labels, links as ``(source, output)`` index pairs, AER (None without gold)."""
    return {"model": model, "source": source, "translation": translation, "layer": "mean" if layer is None else layer,
            "head": "mean" if head is None else head, "units": units, "output_labels": view.row_labels,
            "source_labels": view.column_labels, "weights": view.weights,
            "argmax_links": sorted(view.argmax or ()), "gold_links": None if view.gold is None else sorted(view.gold),
            "alignment_error_rate": view.aer}


def npz_bytes(arrays: dict[str, np.ndarray], **metadata: str) -> bytes:
    """The raw arrays, plus string metadata (model, input, layer, head) stored as 0-d unicode arrays."""
    buffer = io.BytesIO()
    extra = {f"meta_{k}": np.array(str(v)) for k, v in metadata.items()}
    np.savez_compressed(buffer, **arrays, **extra)
    return buffer.getvalue()
