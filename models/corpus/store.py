"""Per-document results in Parquet (pyarrow), so runs resume after a crash and reopen without recomputation.

A results folder holds ``run.json`` (model, corpus, token limit, layers × heads: what the numbers are of) and one
``part-NNNNNN.parquet`` per finished batch, each written to a temporary name and renamed into place: a kill loses at
most the batch in flight, and a half-written file is never read. One row per document: ``doc_id``, ``source``,
``text``, ``status`` ("ok" or "skipped"), ``reason``, ``n_tokens``, ``token_ids`` and every statistic flattened
row-major from ``(layers, heads)`` (MoE fields from ``(moe layers, experts[, experts])``).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from models.corpus.statistics import PEAK_FIELDS, STATISTICS, DocumentStatistics

MOE_FIELDS = ("expert_load", "coactivation", "router_entropy")


@dataclass(frozen=True)
class RunInfo:
    """What a results folder holds numbers of; a resume must match it."""

    model: str
    corpus: str
    max_tokens: int
    layers: int
    heads: int
    licence: str = ""
    experts: int = 0  # MoE models: experts per layer
    moe_layers: int = 0
    dtype: str = "float32"  # the precision the model ran in (bfloat16 statistics differ from float32 by ~1e-2)

    def key(self) -> tuple:
        return (self.model, self.corpus, self.max_tokens, self.layers, self.heads, self.dtype)


SHIPPED = Path(__file__).resolve().parents[2] / "sample_data" / "corpus"  # results that ship with the app
# what they are of (docs/CORPUS.md: the one command that writes them): the page opens on them
SHIPPED_CORPUS, SHIPPED_DOCUMENTS, SHIPPED_TOKENS = "python-docs", 100, 256


def shipped(name: str) -> Path | None:
    """The results folder ``name`` that ships with the app (``sample_data/corpus/``), or None."""
    folder = SHIPPED / name
    return folder if (folder / "run.json").is_file() else None


def results_name(*parts) -> str:
    """A results folder's name from what its numbers are of (model, corpus, counts, precision): lower-case letters,
    digits, ``-`` and ``_`` only."""
    import re

    name = re.sub(r"[^a-z0-9_-]+", "-", "_".join(str(p) for p in parts).lower()).strip("-_")
    return name[:120] or "corpus"


def _schema():
    import pyarrow as pa

    fields = [("doc_id", pa.string()), ("source", pa.string()), ("text", pa.string()), ("status", pa.string()),
              ("reason", pa.string()), ("n_tokens", pa.int32()), ("token_ids", pa.list_(pa.int32()))]
    fields += [(name, pa.list_(pa.float32())) for name in (*STATISTICS, "peak_value", *MOE_FIELDS)]
    fields += [(name, pa.list_(pa.int32())) for name in ("peak_query", "peak_key")]
    return pa.schema(fields)


def document_row(item: DocumentStatistics, source: str, text: str) -> dict:
    row = {"doc_id": item.doc_id, "source": source, "text": text, "status": "ok", "reason": "",
           "n_tokens": len(item.token_ids), "token_ids": list(map(int, item.token_ids))}
    for name in STATISTICS:
        row[name] = item.statistics[name].ravel().tolist()
    for name in PEAK_FIELDS:
        row[name] = getattr(item, name).ravel().tolist()
    for name in MOE_FIELDS:
        value = getattr(item, name)
        row[name] = [] if value is None else value.ravel().tolist()
    return row


def skipped_row(doc_id: str, reason: str, source: str = "") -> dict:
    row = {"doc_id": doc_id, "source": source, "text": "", "status": "skipped", "reason": reason, "n_tokens": 0,
           "token_ids": []}
    row.update({name: [] for name in (*STATISTICS, *PEAK_FIELDS, *MOE_FIELDS)})
    return row


class ResultStore:
    """One results folder. ``append(rows)`` is atomic per call; ``done()`` is what a resume skips."""

    def __init__(self, folder: str | Path, info: RunInfo):
        self.folder = Path(folder).expanduser()
        self.folder.mkdir(parents=True, exist_ok=True)
        meta = self.folder / "run.json"
        if meta.is_file():
            existing = RunInfo(**json.loads(meta.read_text()))
            if existing.key() != info.key():
                raise ValueError(f"{self.folder} holds results of {existing.model} on {existing.corpus} "
                                 f"({existing.max_tokens} tokens, {existing.dtype}); choose another results folder "
                                 f"for {info.model} on {info.corpus} ({info.max_tokens} tokens, {info.dtype}), or "
                                 "delete it")
        else:
            temporary = meta.with_suffix(".tmp")
            temporary.write_text(json.dumps(asdict(info), indent=1))
            os.replace(temporary, meta)
        self.info = info
        for leftover in self.folder.glob("*.parquet.tmp"):  # a batch that was being written when killed
            leftover.unlink()

    @classmethod
    def open(cls, folder: str | Path) -> "ResultStore":
        """An existing results folder (to reopen and export without recomputing)."""
        meta = Path(folder).expanduser() / "run.json"
        if not meta.is_file():
            raise ValueError(f"{folder} is not a corpus results folder (it has no run.json)")
        return cls(folder, RunInfo(**json.loads(meta.read_text())))

    def parts(self) -> list[Path]:
        return sorted(self.folder.glob("part-*.parquet"))

    def append(self, rows: list[dict]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not rows:
            return
        parts = self.parts()
        number = int(parts[-1].stem.split("-")[1]) + 1 if parts else 0
        path = self.folder / f"part-{number:06d}.parquet"
        temporary = path.with_suffix(".parquet.tmp")
        pq.write_table(pa.Table.from_pylist(rows, schema=_schema()), temporary)
        os.replace(temporary, path)

    def table(self):
        """Every row as a pandas DataFrame (one per document; a document written twice counts once)."""
        import pandas as pd
        import pyarrow as pa
        import pyarrow.parquet as pq

        parts = self.parts()
        if not parts:
            return _schema().empty_table().to_pandas()
        frame = pa.concat_tables([pq.read_table(p, schema=_schema()) for p in parts]).to_pandas()
        return pd.DataFrame(frame).drop_duplicates("doc_id", keep="first").reset_index(drop=True)

    def text(self, doc_id: str) -> str:
        """One document's text, read from the parts without loading every row."""
        import pyarrow.parquet as pq

        for part in self.parts():
            found = pq.read_table(part, columns=["doc_id", "text"], filters=[("doc_id", "==", doc_id)])
            if found.num_rows:
                return found.column("text")[0].as_py()
        raise ValueError(f"no document {doc_id!r} in these results")

    def done(self) -> set[str]:
        import pyarrow.parquet as pq

        ids: set[str] = set()
        for part in self.parts():
            ids.update(pq.read_table(part, columns=["doc_id"]).column("doc_id").to_pylist())
        return ids


def stacked(frame, name: str, info: RunInfo) -> np.ndarray:
    """One statistic of every "ok" document as ``(documents, layers, heads)`` (MoE: ``(documents, moe layers, ...)``)."""
    ok = frame[frame["status"] == "ok"]
    if name in MOE_FIELDS:
        shape = {"expert_load": (info.moe_layers, info.experts), "coactivation": (info.moe_layers, info.experts,
                                                                                  info.experts),
                 "router_entropy": (info.moe_layers,)}[name]
    else:
        shape = (info.layers, info.heads)
    if ok.empty:
        return np.zeros((0, *shape), dtype=np.float32)
    return np.stack([np.asarray(v, dtype=np.float32).reshape(shape) for v in ok[name]])
